"""The passes a training step makes besides the layers' own (issue 40, the main job's fit): the
regularization's penalty and gradient in one pass (`regularize`), Adam over all of a step's parameters in
one parallel region, an evaluation's penalty taken once per pass, and the AttentionPooling kernels on
single-threaded OpenBLAS. Each gives the numbers of the way it replaced, bit for bit."""
import numpy as np
import pytest

import attnx
from attnx import _core, kernels, layers, regularizers


class HalfSquares(regularizers.Regularizer):
    """A user's regularizer: only __call__ and gradient (the base class adds and combines them)."""

    def __call__(self, w):
        return 0.5 * float(np.sum(np.square(w, dtype=np.float64)))

    def gradient(self, w):
        return np.asarray(w).copy()


def _regularized_model(dtype):
    return attnx.Sequential([
        layers.Embedding(50, 8, input_shape=(6,), embeddings_regularizer=regularizers.L2(1e-3), dtype=dtype),
        layers.LSTM(5, return_sequences=True, kernel_regularizer=regularizers.L1L2(0.01, 0.02), dtype=dtype),
        layers.AttentionPooling(dtype=dtype),
        layers.Dense(1, activation="sigmoid", kernel_regularizer=HalfSquares(), bias_regularizer="l1", dtype=dtype),
    ])


class ClassModel(attnx.Model):
    def __init__(self):
        super().__init__()
        self.dense = layers.Dense(3, kernel_regularizer=regularizers.L1L2(0.1, 0.2))
        self.out = layers.Dense(1, kernel_regularizer=HalfSquares())

    def call(self, x):
        return self.out(self.dense(x))


def _models():
    ids = np.random.default_rng(1).integers(0, 50, (4, 6))
    for dtype in ("float32", "float64", "mixed_bfloat16"):
        model = _regularized_model(dtype)
        model(ids)
        yield f"sequential {dtype}", model
    model = ClassModel()
    model(np.ones((2, 4), np.float32))
    yield "class model", model


@pytest.mark.parametrize("name, model", list(_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_regularize_is_the_penalty_then_the_gradients_bit_for_bit(name, model, rng):
    for _, p, g in model.trainable_params:
        p[...] = rng.standard_normal(p.shape)
        g[...] = rng.standard_normal(g.shape)
    start = {n: g.copy() for n, g in model.grads.items()}
    penalty = model.regularization_loss()
    model.add_regularization_grads()
    apart = {n: g.copy() for n, g in model.grads.items()}
    for n, g in model.grads.items():
        g[...] = start[n]
    fused = model.regularize()
    assert type(fused) is float and fused > 0
    assert fused.hex() == penalty.hex(), name
    for n, g in model.grads.items():
        assert g.tobytes() == apart[n].tobytes(), f"{name}: {n}"
    assert any(g.tobytes() != start[n].tobytes() for n, g in model.grads.items())  # the gradients were added


def test_a_regularizer_takes_any_gradient_buffer_the_kernel_cannot(rng):
    w = rng.standard_normal((6, 4)).astype(np.float32)
    reg = regularizers.L1L2(0.01, 0.03)
    for grad in (np.zeros((4, 6), np.float32).T, np.zeros((6, 4), np.float64)):  # not C-contiguous; another dtype
        expected = grad + reg.gradient(w)
        assert reg.penalty_and_add_gradient(w, grad) == reg(w)
        np.testing.assert_array_equal(grad, expected)


@pytest.mark.parametrize("l1", [0.0, 0.02])
def test_the_fused_kernel_is_the_two_kernels_at_every_level(level, l1, rng):
    for n in (1, 37, 5000 * 32 + 3):
        w = rng.standard_normal(n).astype(np.float32)
        g = rng.standard_normal(n).astype(np.float32)
        apart = g.copy()
        kernels.l1l2_add_gradient(grad=apart, weights=w, l1=l1, l2=1e-3)
        penalty = kernels.l1l2_penalty_add_gradient(grad=g, weights=w, l1=l1, l2=1e-3)
        assert penalty.hex() == kernels.l1l2_penalty(weights=w, l1=l1, l2=1e-3).hex()
        assert g.tobytes() == apart.tobytes()


def test_the_fused_kernel_refuses_a_mismatched_buffer():
    w = np.ones(6, np.float32)
    with pytest.raises(ValueError, match="l1l2_penalty_add_gradient: grad"):
        kernels.l1l2_penalty_add_gradient(grad=np.zeros(5, np.float32), weights=w, l1=0.0, l2=0.1)
    with pytest.raises((TypeError, ValueError), match="l1l2_penalty_add_gradient"):
        kernels.l1l2_penalty_add_gradient(grad=np.zeros(6, np.float64), weights=w, l1=0.0, l2=0.1)


@pytest.mark.parametrize("threads", [1, 2])
def test_adam_over_many_arrays_is_each_arrays_own_update(threads, rng):
    # sizes below and above one thread's share, so that the one region cuts inside arrays the
    # per-array calls never cut (and one array of one element)
    sizes = [(5000, 32), (132, 400), (400,), (1,), (100, 1), (40003,)]
    before = attnx.backend.get_num_threads()
    attnx.set_num_threads(threads)
    try:
        state = [[rng.standard_normal(s).astype(np.float32) for s in sizes] for _ in range(3)]
        state[2] = [np.abs(v) for v in state[2]]  # second moments
        grads = [rng.standard_normal(s).astype(np.float32) for s in sizes]
        together = [[a.copy() for a in arrays] for arrays in state]
        alone = [[a.copy() for a in arrays] for arrays in state]
        settings = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-7, step=3, weight_decay=0.01, decoupled=False)
        _core.adam_update(params=together[0], grads=grads, ms=together[1], vs=together[2], **settings)
        for i in range(len(sizes)):
            _core.adam_update(params=[alone[0][i]], grads=[grads[i]], ms=[alone[1][i]], vs=[alone[2][i]], **settings)
    finally:
        attnx.set_num_threads(before)
    for got, want in zip(together, alone):
        for a, b in zip(got, want):
            assert a.tobytes() == b.tobytes()


def _compiled_regularized(dtype="float32"):
    model = _regularized_model(dtype)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def _data(rng, n=70):
    return rng.integers(0, 50, (n, 6)), (rng.uniform(size=n) > 0.5).astype(np.float32)


def test_evaluate_takes_the_penalty_once_and_reports_what_test_step_reports(rng):
    x, y = _data(rng)
    model = _compiled_regularized()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    calls = []
    penalty = model.regularization_loss

    def counted():
        calls.append(1)
        return penalty()
    model.regularization_loss = counted
    logs = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert len(calls) == 1  # five batches, one pass over the weights
    mean = attnx.metrics.Mean()
    model._reset_metrics()
    for start in range(0, len(x), 16):  # what the loop of test_step calls makes of it
        mean.update_state(model.test_step(x[start:start + 16], y[start:start + 16]), len(x[start:start + 16]))
    assert float(logs["loss"]).hex() == float(mean.result()).hex()
    assert logs["accuracy"] == model._metric_results()["accuracy"]


def test_evaluate_runs_an_overridden_test_step_and_a_batch_hook_sees_fresh_penalties(rng):
    x, y = _data(rng, 48)

    class Counting(attnx.Sequential):
        steps = 0

        def test_step(self, x, y, sample_weight=None):
            Counting.steps += 1
            return super().test_step(x, y, sample_weight)
    model = Counting(_regularized_model("float32").layers)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    model.evaluate(x, y, batch_size=16, verbose=0)
    assert Counting.steps == 3

    # a batch hook may change the weights between batches: each batch then takes the penalty of its weights
    model = _compiled_regularized()
    model(x[:1])
    table = model.layers[0].params["embeddings"]

    class Grow(attnx.callbacks.Callback):
        def on_test_batch_begin(self, batch, logs=None):
            table[...] *= 2.0
    losses = []

    class Record(attnx.callbacks.Callback):
        def on_test_batch_end(self, batch, logs=None):
            losses.append(logs["loss"])
    model.evaluate(x, y, batch_size=16, verbose=0, callbacks=[Grow(), Record()])
    # the running mean's growth: each batch's penalty four times the last's dominates
    assert losses[2] > losses[1] > losses[0]


def test_attention_pooling_at_two_threads_is_one_threads_result(rng):
    x = rng.standard_normal((32, 32, 100)).astype(np.float32)
    layer = layers.AttentionPooling()
    layer(x)
    dy = rng.standard_normal((32, 100)).astype(np.float32)
    results = []
    before = attnx.backend.get_num_threads()
    try:
        for threads in (1, 2):
            attnx.set_num_threads(threads)
            layer.zero_grad()
            out, cache = layer.apply(x, training=True)
            dx = layer.backprop(cache, dy)
            results.append([out, dx] + [g.copy() for g in layer.grads.values()])
    finally:
        attnx.set_num_threads(before)
    for one, two in zip(*results):
        assert one.tobytes() == two.tobytes()
