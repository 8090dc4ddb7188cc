"""int8 inference: ``model.quantize("int8")`` (Keras 3's name).

A quantized layer keeps its kernels as int8 with one float32 scale per output unit (symmetric:
``scale = max|w| / 127``, ``q = round(w / scale)`` in [-127, 127]; an Embedding's table per row),
quantizes its inputs per row at run time the same way, and multiplies on int8 register tiles with
int32 accumulation (``cpp/include/attnx/quantized.hpp``: AVX-512 VNNI, AVX2 or baseline, the same
integers on each); biases, activations, the recurrent gate math and the state stay float32. An input
row that one large value leaves coarse (its rounding error, weighted by how much each feature reaches
the output, above 1/16 of its weighted magnitude: an outlier feature the output does not use) is
quantized twice, its residual in a second int8 pass (`kernels.quantize_activations`).

What a layer quantizes is its own public statement, `Layer.quantizable_weights()` ({weight name:
"columns", "head_columns" or "rows"}): Dense, Embedding, SimpleRNN / GRU / LSTM (every level, and
their cells) and MultiHeadAttention (its query, key, value, gate and output kernels) name their
kernels; FeedForward and the transformer layers and stacks quantize through their sublayers (each
product then runs `kernels.dense_forward_int8`, the scales, bias and activation in its epilogue;
FeedForward's two in one `kernels.feed_forward_forward_int8` call), and
a quantized decoder's cached step and search run the one C++ step on the packed kernels (`step_product`). A layer that
cannot run in int8 says why in `Layer.quantize_refusal()` (LSTMN; a Transformer with tie_output), and
`quantize` then raises naming it before changing anything; a layer without int8 weights stays
float32 (LayerNormalization, the attention layers, Conv2D). A quantized weight ``w``
becomes ``w`` (int8) followed by ``w_scale`` (float32) in the layer and in every layer that holds it
(`Layer.replace_weights`: a Bidirectional, a model, a ``call`` layer); the layer's config gains
``"quantization_mode": "int8"`` (not FeedForward's and the transformer layers': their build makes their
sublayers) and a saved model's header says so, so that ``attnx.load_model``
builds the model, quantizes it and reads the int8 weights. A quantized layer runs inference only.
Weights that reach an int8 parameter (``set_weights``, loading) must be int8 in [-127, 127]
(`check_weights`): the AVX2 tiles cannot take -128 (the bindings refuse it too), and another integer
dtype would wrap. A kernel is packed for the products once (`packed`: its range checked there) and
the packed form is reused by every call until `check_weights` lets new values in; meanwhile the
int8 kernel and its scale are read-only, so that no other write leaves the packed form stale.

The error bound (``docs/guides/int8.md``): for ``y = x . w`` of one input row x (K,) and one kernel
column w (K,), with ``|w - sw qw| <= dw = max|w| / 254`` and ``|x - x_int8| <= dx`` (``dx = max|x| / 254``,
or ``max|e| / 254 <= max|x| / 64516`` for a row quantized twice)::

    |y_int8 - y| <= dx * (sum|w| + K * dw) + sum|x| * dw

(`dense_error_bound`), plus float32 rounding. It is relative to the terms' magnitudes, not to |y|: a
sum that cancels (|y| much smaller than sum|x w|) keeps the weights' rounding error, however small
|y| is. A recurrent layer's step has the bound on its pre-activations, given the same state.
"""
import contextlib
import weakref

import numpy as np

from . import kernels

MODES = ("int8",)
INT8_LIMIT = 127  # symmetric: -128 never reaches the int8 tiles


def check_mode(owner, mode):
    """`mode` if it names a quantization mode or is None (a layer's `quantization_mode` argument: not
    quantized); ValueError naming `owner` otherwise."""
    if mode is None or mode in MODES:
        return mode
    raise ValueError(f"{owner}: unknown quantization mode {mode!r}; expected one of {MODES}")


def check_quantize_mode(owner, mode):
    """The mode `quantize(mode)` was asked for: one of MODES (None is not a way back to float32)."""
    if mode is None:
        raise ValueError(f"{owner}: quantize(None) does not make a model float32 again; the float weights are gone "
                         f"once quantized. Pass one of {MODES}, or load or rebuild the float model")
    return check_mode(owner, mode)


def config(layer):
    """The config entry of a quantized layer ({} for a float one)."""
    return {"quantization_mode": layer.quantization_mode} if layer.quantization_mode else {}


def inference_only(layer, training):
    """Raises when a quantized layer is asked to train."""
    if training:
        raise ValueError(f"Layer '{layer.name}': is quantized ({layer.quantization_mode}) and runs inference only; "
                         "train the float model, then call model.quantize")


# the kernel axes that are its input, per spec of `Layer.quantizable_weights` ("rows": an Embedding's table)
INPUT_AXES = {"columns": 1, "head_columns": 2}


def quantize_matrix(w, axis):
    """(q int8 in [-127, 127], scale float32) of a float weight: one scale per row ("rows", an
    Embedding's tokens), or per output unit of a kernel whose first axis ("columns": (K, N), or
    MultiHeadAttention's (K, heads, head_dim)) or first two axes ("head_columns": its output kernel
    (heads, value_dim, N)) are the input. q has w's shape, the scale the output axes'."""
    w = np.asarray(w, np.float32)
    if axis == "rows":
        return kernels.quantize_rows(x=np.ascontiguousarray(w))
    inputs = INPUT_AXES[axis]
    q, scale = kernels.quantize_rows(x=np.ascontiguousarray(w.reshape(int(np.prod(w.shape[:inputs])), -1).T))
    return np.ascontiguousarray(q.T).reshape(w.shape), scale.reshape(w.shape[inputs:])


# The packed form of each int8 kernel in use: id(kernel) -> {split: kernels.Int8Kernel, and the
# attention projections packed side by side (`packed_projections`)}, emptied by check_weights when new
# values are let in, the entry dropped with its kernel
_PACKED = {}


def _entry(kernel):
    """The packed forms of int8 `kernel` (a dict in `_PACKED`, dropped with the kernel)."""
    entry = _PACKED.get(id(kernel))
    if entry is None:
        entry = _PACKED[id(kernel)] = {}
        weakref.finalize(kernel, _PACKED.pop, id(kernel), None)
    return entry


def packed(layer, name, split=0):
    """`layer`'s int8 weight `name` with its per-unit scale ``name + "_scale"`` packed for the int8
    products as the matrix (input axes, output axes: the scale's) (`kernels.pack_int8`, which checks
    the range; `split` as there), made at the first call after the weight was quantized or set, then
    reused. Both arrays stay read-only while packed (`check_weights` opens them again)."""
    kernel, scale = layer.params[name], layer.params[name + "_scale"]
    entry = _entry(kernel)
    if split not in entry:
        try:
            entry[split] = kernels.pack_int8(kernel=kernel.reshape(-1, scale.size), kernel_scale=scale.reshape(-1),
                                             split=split)
        except ValueError as exc:
            raise ValueError(f"Layer '{layer.name}': weight '{name}': {exc}") from None
        kernel.flags.writeable = scale.flags.writeable = False
    return entry[split]


def is_packed(kernel, key, form):
    """Whether `form` is still int8 `kernel`'s packed form under `key` (a split, or the projections'
    names): `check_weights` drops the packed forms before new values are written in."""
    return _PACKED.get(id(kernel), {}).get(key) is form


def _unpack(param):
    """Forgets the packed forms of `param` (an int8 kernel or its scale) and lets it be written."""
    _PACKED.get(id(param), {}).clear()
    param.flags.writeable = True


def check_weights(names, params, values, what):
    """`values` checked for the parameters `params` (named `names`) they are about to be copied into:
    an int8 parameter takes int8 values in [-127, 127] only (another integer dtype would wrap, a float
    one would be cast), and the float32 scale after it finite values >= 0. `what(i)` names entry i in
    the errors. Once all are checked, the int8 kernels and their scales are unpacked (`packed`) and
    writable for the copy."""
    opened = []
    for i, (name, p, value) in enumerate(zip(names, params, values)):
        value = np.asarray(value)
        if p.dtype == np.int8:
            opened.append(p)
            if value.dtype != np.int8:
                raise ValueError(f"{what(i)} is an int8 quantized weight; got dtype {value.dtype} (its values would "
                                 "be cast or wrap): pass the int8 array model.quantize made, or set the float weights "
                                 "before quantizing")
            if value.size and int(value.min()) < -INT8_LIMIT:
                raise ValueError(f"{what(i)} holds -128; attnx's int8 weights are symmetric, in [-{INT8_LIMIT}, "
                                 f"{INT8_LIMIT}] (quantize with attnx.quantization.quantize_matrix)")
        elif i > 0 and params[i - 1].dtype == np.int8 and name == names[i - 1] + "_scale":
            opened += [params[i - 1], p]
            if value.dtype.kind != "f" or not np.all(np.isfinite(value)) or np.any(value < 0):
                raise ValueError(f"{what(i)} is the scale of an int8 weight: finite floats >= 0, got "
                                 f"{value.dtype} values in [{np.min(value) if value.size else 0}, "
                                 f"{np.max(value) if value.size else 0}]")
    for p in opened:
        _unpack(p)


def _layer_tree(root):
    """Every layer under `root` that Model.quantize looks at: itself, then depth first its sublayers,
    each once."""
    seen, order = set(), []

    def visit(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        order.append(layer)
        for sub in layer.sublayers:
            visit(sub)

    visit(root)
    return order


def _quantize_tree(tree, mode):
    """Quantizes the float weights the layers of `tree` name (`quantizable_weights`), in every layer of
    `tree` that holds them (`replace_weights`)."""
    replaced = {}  # id(float weight) -> [(name suffix, new array, its gradient buffer)]
    targets = [layer for layer in tree if layer.quantizable_weights()]
    for layer in targets:
        for name, axis in layer.quantizable_weights().items():
            p = layer.params[name]
            if p.dtype != np.int8:  # not yet quantized
                q, scale = quantize_matrix(p, axis)
                replaced[id(p)] = [("", q, np.zeros(q.shape, np.float32)),
                                   ("_scale", scale, np.zeros(scale.shape, np.float32))]
    for layer in tree:
        layer.replace_weights(replaced)
    for layer in targets:
        layer.quantization_mode = mode


def quantize(root, mode):
    """`Layer.quantize` / `Model.quantize`: quantizes every quantizable layer under `root` (built) in
    place, and the weights of every layer that holds theirs. Raises, before changing anything, for a
    layer that refuses (`quantize_refusal`). Returns `root`."""
    owner = f"{type(root).__name__} '{root.name}'.quantize"
    check_quantize_mode(owner, mode)
    if not root.built:
        raise ValueError(f"{owner}: not built; build it (call it on a batch, fit it, or give it an input shape) "
                         "before quantizing")
    tree = _layer_tree(root)
    for layer in tree:
        reason = layer.quantize_refusal()
        if reason:
            raise ValueError(f"{owner}: layer '{layer.name}' ({type(layer).__name__}) cannot be quantized: {reason}. "
                             "Nothing was changed")
    _quantize_tree(tree, mode)
    return root


def quantize_model(model, mode):
    """`Model.quantize`: `quantize`, and the model records its mode (its saved header says so, and
    `attnx.load_model` quantizes the model it builds before reading the int8 weights)."""
    quantize(model, mode)
    model.quantization_mode = mode
    return model


@contextlib.contextmanager
def building(layer):
    """Around the weight creation of a layer's build: a layer built with ``quantization_mode`` (from
    a config) creates its weights as float32, then quantizes them on leaving (`attnx.load_model`
    budgets an int8 weight at 4 bytes per value for this)."""
    yield
    if layer.quantization_mode:
        _quantize_tree([layer], layer.quantization_mode)


def dense_error_bound(x, kernel):
    """The bound on |int8 - float32| of ``x (R, K) . kernel (K, N)`` (R, N) stated in the module's
    docstring, each row's activation step as the layers quantize it (`kernels.quantize_activations`).
    Before the bias and the
    activation, which add nothing: relu, tanh, sigmoid and (in the max norm) softmax are 1-Lipschitz."""
    x = np.require(x, np.float32, "CA")
    _, scale, _, residual_scale = kernels.quantize_activations(x=x, kernel=quantize_matrix(kernel, "columns")[0])
    # a row quantized twice is within residual_scale / 2 (0 when not: then, or for an exact residual, scale / 2)
    x_step = np.where(residual_scale > 0, residual_scale, scale).astype(np.float64)[:, None] / 2
    w = np.abs(np.asarray(kernel, np.float64))
    w_step = w.max(axis=0, keepdims=True) / (2 * INT8_LIMIT)
    K = x.shape[1]
    return x_step * (w.sum(axis=0, keepdims=True) + K * w_step) + \
        np.abs(x.astype(np.float64)).sum(axis=1, keepdims=True) * w_step


def packed_projections(attention, names):
    """The int8 kernels of MultiHeadAttention `attention`'s projections `names` side by side, packed as
    one product, and their biases: a query, key and value read the same rows once. Kept with the
    first kernel's packed forms (`packed`; the layer's set_weights lets all its weights in at once),
    the kernels and scales read-only meanwhile."""
    weights = [(attention.params[f"{name}_kernel"], attention.params[f"{name}_kernel_scale"]) for name in names]
    entry = _entry(weights[0][0])
    if names not in entry:
        entry[names] = kernels.pack_int8(kernel=np.concatenate([attention.matrix(name) for name in names], axis=1),
                                         kernel_scale=np.concatenate([scale.reshape(-1) for _, scale in weights]))
        for kernel, scale in weights:
            kernel.flags.writeable = scale.flags.writeable = False
    biases = [attention.params.get(f"{name}_bias") for name in names]
    bias = None if biases[0] is None else np.concatenate([b.reshape(-1) for b in biases])
    return entry[names], bias


def step_product(layer, name="kernel", fused=False):
    """(kernel, bias) of one product of the cached decoder step (`decoder_step.hpp`'s StepLinear, in the
    slots of `TransformerDecoderLayer.step_weights`): Dense `layer`'s kernel (name "kernel") or
    MultiHeadAttention `layer`'s projection `name`, the kernel as the (in, out) matrix (float: a view of
    the weight) or, for a quantized layer, its packed int8 kernel (`packed`), the bias flat or None.
    `fused`: a quantized self-attention projects query, key and value in one product, as its forward
    does (`packed_projections`): the query's place holds it, the key's and value's are None."""
    if name == "kernel":
        kernel = packed(layer, "kernel") if layer.quantization_mode else layer.params["kernel"]
        return kernel, layer.params.get("bias")
    if layer.quantization_mode and fused and name != "output":
        return packed_projections(layer, ("query", "key", "value")) if name == "query" else (None, None)
    bias = layer.params.get(f"{name}_bias")
    bias = None if bias is None else bias.reshape(-1)
    return (packed(layer, f"{name}_kernel") if layer.quantization_mode else layer.matrix(name)), bias
