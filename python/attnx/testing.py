"""Test harnesses later work reuses: a float64 gradient checker for any layer, and comparison
helpers for PyTorch parity tests."""
import numpy as np

from .backend import set_random_seed


def _structure(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _restructure(like, items):
    return items if isinstance(like, (list, tuple)) else items[0]


def gradcheck(layer, inputs, call_kwargs=None, eps=1e-6, atol=1e-7, rtol=1e-5, seed=0, check_inputs=True,
              check_params=True, max_elements=None, random_seed=None):
    """Checks `layer.backward` against central differences, in float64.

    Runs ``out = layer(inputs, training=True, **call_kwargs)``, takes a random upstream gradient
    ``R`` of every (float) output, and compares the gradients of ``L = sum(out * R)`` with respect
    to every float input element and every parameter element with ``(L(x + eps) - L(x - eps)) / 2eps``.
    Integer inputs (token ids) are not perturbed. `max_elements` samples at most that many
    elements per array (all by default). A layer that draws noise in training (dropout, DRAW's latent
    samples) needs `random_seed`: the global generator (`attnx.set_random_seed`) is reseeded with it
    before every forward pass, so that each draws the same noise. Raises AssertionError naming the
    worst entry.

    Returns a dict {"inputs[i]" or param name: max abs error} for reporting.
    """
    call_kwargs = dict(call_kwargs or {})
    if np.dtype(layer.dtype) != np.float64:
        raise ValueError(f"gradcheck: layer '{layer.name}' must be float64, got {layer.dtype}")
    rng = np.random.default_rng(seed)
    xs = [np.array(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x)
          for x in _structure(inputs)]

    def run(training):
        if random_seed is not None:
            set_random_seed(random_seed)
        return _structure(layer(_restructure(inputs, xs), training=training, **call_kwargs))

    outs = run(True)
    upstream = [None if o is None or np.asarray(o).dtype.kind != "f" else rng.standard_normal(np.shape(o))
                for o in outs]
    layer.zero_grad()
    dxs = _structure(layer.backward(_restructure(outs, upstream) if len(outs) > 1 else upstream[0]))

    def objective():
        return sum(float(np.sum(np.asarray(o, dtype=np.float64) * r))
                   for o, r in zip(run(True), upstream) if r is not None)

    def numeric(array, flat_index):
        flat = array.reshape(-1)
        old = flat[flat_index]
        flat[flat_index] = old + eps
        plus = objective()
        flat[flat_index] = old - eps
        minus = objective()
        flat[flat_index] = old
        return (plus - minus) / (2 * eps)

    def compare(label, array, analytic):
        if analytic is None:
            raise AssertionError(f"gradcheck {layer.name}: no gradient returned for {label}")
        analytic = np.asarray(analytic).reshape(-1)
        if analytic.size != array.size:
            raise AssertionError(f"gradcheck {layer.name}: gradient for {label} has {analytic.size} entries, "
                                 f"expected {array.size}")
        idx = np.arange(array.size)
        if max_elements is not None and array.size > max_elements:
            idx = rng.choice(array.size, max_elements, replace=False)
        worst = 0.0
        for i in idx:
            num = numeric(array, i)
            err = abs(num - analytic[i])
            if err > atol + rtol * abs(num):
                where = tuple(int(k) for k in np.unravel_index(i, array.shape))
                raise AssertionError(f"gradcheck {layer.name}: {label}[{where}] "
                                     f"analytic {analytic[i]:.10g} vs numeric {num:.10g}")
            worst = max(worst, err)
        return worst

    report = {}
    if check_inputs:
        for i, (x, dx) in enumerate(zip(xs, dxs)):
            if x.dtype.kind == "f":
                report[f"inputs[{i}]"] = compare(f"inputs[{i}]", x, dx)
    if check_params:
        grads = {k: g.copy() for k, g in layer.grads.items()}
        for name, p in layer.params.items():
            report[name] = compare(name, p, grads[name])
    return report


def assert_close(actual, expected, atol=1e-5, rtol=0.0, what="value"):
    """Asserts |actual - expected| <= atol + rtol |expected| everywhere, naming the worst entry."""
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {a.shape} != expected {e.shape}")
    if a.size == 0:
        return 0.0
    err = np.abs(a - e)
    bad = err > atol + rtol * np.abs(e)
    if bad.any() or not np.all(np.isfinite(a) == np.isfinite(e)):
        i = tuple(int(k) for k in np.unravel_index(np.argmax(err), err.shape))
        raise AssertionError(f"{what}: max abs error {err.max():.3g} at {i} ({float(a[i])!r} vs {float(e[i])!r}), "
                             f"atol {atol}")
    return float(err.max())


def torch_parity(layer, module, inputs, torch_inputs=None, atol=1e-5, seed=0, call=None, torch_call=None):
    """Runs `layer` and the PyTorch `module` (same weights) on the same inputs and a same random
    upstream gradient; asserts outputs, input gradients and parameter gradients agree.

    `call(layer, inputs)` / `torch_call(module, torch_inputs)` override how each is called
    (default: ``layer(inputs, training=True)`` and ``module(*torch_inputs)``); both must return
    the output(s) to compare. Returns a dict of max abs errors.
    """
    import torch
    from .interop import torch_grads
    rng = np.random.default_rng(seed)
    xs = _structure(inputs)
    if torch_inputs is None:
        torch_inputs = [torch.tensor(x, requires_grad=np.asarray(x).dtype.kind == "f") for x in xs]
    out = _structure(call(layer, inputs) if call else layer(inputs, training=True))
    tout = _structure(torch_call(module, torch_inputs) if torch_call else module(*torch_inputs))
    report = {}
    for i, (o, t) in enumerate(zip(out, tout)):
        report[f"output[{i}]"] = assert_close(o, t.detach().numpy(), atol, what=f"output[{i}]")
    upstream = [rng.standard_normal(np.shape(o)).astype(np.asarray(o).dtype) for o in out]
    layer.zero_grad()
    module.zero_grad()
    dxs = _structure(layer.backward(upstream if len(out) > 1 else upstream[0]))
    torch.autograd.backward([t for t in tout], [torch.from_numpy(u) for u in upstream])
    for i, (dx, t) in enumerate(zip(dxs, torch_inputs)):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            report[f"d inputs[{i}]"] = assert_close(dx, t.grad.numpy(), atol, what=f"d inputs[{i}]")
    for name, g in torch_grads(module, layer).items():
        report[f"d {name}"] = assert_close(layer.grads[name], g, atol, what=f"d {name}")
    return report
