"""Core layers: float64 gradient checks, regularizer gradients, PyTorch parity, initializers,
configs and weight handling."""
import math

import numpy as np
import pytest

import attnx
from attnx import layers, regularizers
from attnx.testing import assert_close, gradcheck, torch_parity

ACTIVATIONS = ["linear", "relu", "tanh", "sigmoid", "softmax", "gelu"]


def f64(x):
    return np.asarray(x, dtype=np.float64)


# --------------------------------------------------------------------------- gradchecks
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_gradcheck(activation, use_bias, rng):
    layer = layers.Dense(4, activation=activation, use_bias=use_bias, dtype="float64")
    x = rng.standard_normal((3, 5))
    if activation == "relu":  # keep away from the kink
        x = x + np.sign(x) * 0.1
    layer(x)
    if use_bias:
        layer.params["bias"][:] = rng.standard_normal(4) * 0.1
    report = gradcheck(layer, x)
    assert set(report) == {"inputs[0]", "kernel"} | ({"bias"} if use_bias else set())


@pytest.mark.parametrize("activation", ["linear", "tanh", "softmax", "gelu"])
def test_dense_gradcheck_rank3(activation, rng):
    layer = layers.Dense(3, activation=activation, dtype="float64")
    x = rng.standard_normal((2, 4, 5))
    y = layer(x)
    assert y.shape == (2, 4, 3)
    gradcheck(layer, x)


def test_dense_gradient_accumulates(rng):
    layer = layers.Dense(3, dtype="float64")
    x = rng.standard_normal((4, 2))
    layer(x, training=True)
    dy = rng.standard_normal((4, 3))
    layer.backward(dy)
    once = layer.grads["kernel"].copy()
    layer.backward(dy)
    assert_close(layer.grads["kernel"], 2 * once, atol=1e-12)
    layer.zero_grad()
    assert not layer.grads["kernel"].any()


def test_embedding_gradcheck_repeated_ids(rng):
    layer = layers.Embedding(6, 3, dtype="float64")
    ids = np.array([[1, 2, 1, 5], [1, 1, 0, 2]])
    report = gradcheck(layer, ids)
    assert "embeddings" in report
    # repeated ids accumulate: row 1 appears 4 times
    layer.zero_grad()
    layer(ids, training=True)
    dy = np.ones((2, 4, 3))
    layer.backward(dy)
    assert_close(layer.grads["embeddings"][:, 0], [1, 4, 2, 0, 0, 1], atol=0)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_gradcheck(activation, rng):
    layer = layers.Activation(activation, dtype="float64")
    x = rng.standard_normal((3, 2, 5))
    if activation == "relu":
        x = x + np.sign(x) * 0.1
    gradcheck(layer, x)


class _FixedMaskDropout(layers.Dropout):
    """Dropout whose generator restarts from `seed` at every call, so every call draws one mask."""

    def forward(self, inputs, training=False):
        self.seed_generator = attnx.random.SeedGenerator(self.seed)
        return super().forward(inputs, training=training)


def test_dropout_gradcheck_fixed_mask(rng):
    layer = _FixedMaskDropout(0.4, seed=7, dtype="float64")
    x = rng.standard_normal((4, 6))
    y = layer(x, training=True)
    dropped = y == 0
    assert dropped.any() and (~dropped).any()
    assert_close(y[~dropped], x[~dropped] / 0.6, atol=1e-12)
    gradcheck(layer, x)


def test_dropout_backward_uses_forward_mask(rng):
    layer = layers.Dropout(0.5, seed=3)
    x = rng.standard_normal((8, 10)).astype(np.float32) + 5  # never zero
    y = layer(x, training=True)
    keep = y != 0
    dy = rng.standard_normal((8, 10)).astype(np.float32)
    dx = layer.backward(dy)
    assert_close(dx, np.where(keep, dy * 2.0, 0.0), atol=1e-6)
    # inference is the identity
    assert_close(layer(x, training=False), x, atol=0)


def test_dropout_noise_shape(rng):
    layer = layers.Dropout(0.5, noise_shape=(None, 1, None), seed=1)
    x = np.ones((3, 5, 4), dtype=np.float32)
    y = layer(x, training=True)
    # the same features are dropped for every time step
    assert (y == y[:, :1, :]).all()


def test_dropout_seeded_masks_reproducible():
    x = np.ones((5, 7), dtype=np.float32)
    a = layers.Dropout(0.3, seed=11)(x, training=True)
    b = layers.Dropout(0.3, seed=11)(x, training=True)
    assert np.array_equal(a, b)


def test_flatten_reshape_gradcheck(rng):
    x = rng.standard_normal((2, 3, 4))
    flat = layers.Flatten(dtype="float64")
    assert flat(x).shape == (2, 12)
    gradcheck(flat, x)
    reshape = layers.Reshape((4, -1), dtype="float64")
    assert reshape(x).shape == (2, 4, 3)
    gradcheck(reshape, x)
    assert layers.Reshape((6, 2)).compute_output_shape((None, 3, 4)) == (None, 6, 2)
    assert layers.Reshape((-1, 2)).compute_output_shape((None, 3, 4)) == (None, 6, 2)


def test_concatenate_add_gradcheck(rng):
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 2))
    cat = layers.Concatenate(dtype="float64")
    assert cat([a, b]).shape == (2, 3, 6)
    gradcheck(cat, [a, b])
    cat1 = layers.Concatenate(axis=1, dtype="float64")
    c = rng.standard_normal((2, 5, 4))
    assert cat1([a, c]).shape == (2, 8, 4)
    gradcheck(cat1, [a, c])
    add = layers.Add(dtype="float64")
    c2 = rng.standard_normal((2, 3, 4))
    assert_close(add([a, c2, a]), 2 * a + c2, atol=1e-12)
    gradcheck(add, [a, c2, a])


def test_global_average_pooling_gradcheck(rng):
    layer = layers.GlobalAveragePooling1D(dtype="float64")
    x = rng.standard_normal((3, 4, 2))
    assert_close(layer(x), x.mean(axis=1), atol=1e-12)
    gradcheck(layer, x)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
    out = layer(x, mask=mask)
    assert_close(out[0], x[0, :2].mean(axis=0), atol=1e-12)
    assert_close(out[1], x[1].mean(axis=0), atol=1e-12)
    assert np.all(out[2] == 0) and np.all(np.isfinite(out))
    gradcheck(layer, x, call_kwargs={"mask": mask})
    layer(x, training=True, mask=mask)
    dx = layer.backward(np.ones((3, 2)))
    assert np.all(np.isfinite(dx)) and np.all(dx[2] == 0) and np.all(dx[0, 2:] == 0)
    # lengths (B,) are accepted wherever masks are
    assert np.array_equal(layer(x, mask=np.array([2, 4, 0])), out)
    with pytest.raises(ValueError, match="lengths"):
        layer(x, mask=np.array([2, 5, 0]))


def test_activations_extreme_values_finite():
    x = np.array([[-1e4, -100.0, 0.0, 100.0, 1e4]], dtype=np.float32)
    for name in ACTIVATIONS:
        layer = layers.Activation(name)
        y = layer(x, training=True)
        dx = layer.backward(np.ones_like(x))
        assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx)), name
    assert_close(layers.Activation("sigmoid")(x), [[0, 0, 0.5, 1, 1]], atol=1e-7)
    assert_close(layers.Activation("softmax")(x), [[0, 0, 0, 0, 1]], atol=1e-7)
    assert_close(layers.Activation("gelu")(x), [[0, 0, 0, 100, 1e4]], atol=1e-5)


# --------------------------------------------------------------------------- regularizers
@pytest.mark.parametrize("reg", [regularizers.L1(0.03), regularizers.L2(0.05), regularizers.L1L2(0.02, 0.07)],
                         ids=["l1", "l2", "l1l2"])
def test_regularizer_gradient_central_difference(reg, rng):
    w = rng.standard_normal((4, 3))
    w[np.abs(w) < 0.05] = 0.3  # away from |w|'s kink
    analytic = reg.gradient(w)
    eps = 1e-6
    numeric = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        wp, wm = w.copy(), w.copy()
        wp[i] += eps
        wm[i] -= eps
        numeric[i] = (reg(wp) - reg(wm)) / (2 * eps)
    assert_close(analytic, numeric, atol=1e-7)
    expected = reg.l1 * np.abs(w).sum() + reg.l2 * np.square(w).sum()  # Keras: no 1/2 factor
    assert reg(w) == pytest.approx(expected, rel=1e-12)


def test_layer_regularization_loss_and_grads(rng):
    layer = layers.Dense(3, kernel_regularizer=regularizers.L2(0.1), bias_regularizer=regularizers.L1(0.2),
                         dtype="float64")
    layer(rng.standard_normal((2, 4)))
    layer.params["bias"][:] = [0.5, -1.0, 2.0]
    k = layer.params["kernel"]
    assert layer.regularization_loss() == pytest.approx(0.1 * np.sum(k ** 2) + 0.2 * 3.5)
    layer.zero_grad()
    layer.add_regularization_grads()
    assert_close(layer.grads["kernel"], 0.2 * k, atol=1e-12)
    assert_close(layer.grads["bias"], [0.2, -0.2, 0.2], atol=1e-12)
    emb = layers.Embedding(5, 2, embeddings_regularizer=regularizers.L2(0.01), dtype="float64")
    emb(np.array([[1]]))
    assert emb.regularization_loss() == pytest.approx(0.01 * np.sum(emb.params["embeddings"] ** 2))


# --------------------------------------------------------------------------- torch parity
def _torch_act(torch, name):
    return {"linear": lambda t: t, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
            "softmax": lambda t: torch.softmax(t, dim=-1),
            "gelu": lambda t: torch.nn.functional.gelu(t)}[name]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_dense_torch_parity(activation, torch, rng):
    from attnx.interop import from_torch
    linear = torch.nn.Linear(6, 4)
    layer = from_torch(linear)
    assert layer.params["kernel"].dtype == np.float32
    assert_close(layer.params["kernel"], linear.weight.detach().numpy().T, atol=0)
    layer.activation = activation
    act = _torch_act(torch, activation)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    report = torch_parity(layer, linear, x, torch_call=lambda m, t: act(m(*t)), atol=1e-5)
    assert {"output[0]", "d inputs[0]", "d kernel", "d bias"} <= set(report)


def test_dense_torch_parity_rank3_no_bias(torch, rng):
    from attnx.interop import from_torch
    linear = torch.nn.Linear(5, 3, bias=False)
    layer = from_torch(linear)
    assert "bias" not in layer.params
    x = rng.standard_normal((2, 7, 5)).astype(np.float32)
    torch_parity(layer, linear, x, atol=1e-5)


def test_dense_torch_parity_medium_size(torch, rng):
    from attnx.interop import from_torch
    linear = torch.nn.Linear(64, 32)
    layer = from_torch(linear)
    layer.activation = "tanh"
    x = rng.standard_normal((32, 64)).astype(np.float32)
    torch_parity(layer, linear, x, torch_call=lambda m, t: torch.tanh(m(*t)), atol=1e-5)


@pytest.mark.parametrize("rows, C, OC", [(32, 64, 100), (80, 70, 100), (700, 90, 130)],
                         ids=["blas", "tiles-one-thread", "tiles-split"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_dense_torch_parity_on_every_product_path(rows, C, OC, activation, torch, rng):
    """Below 2^18 multiply-adds OpenBLAS runs the product; from there the register tiles on one
    thread, from 2^20 split across threads (relu fused into the tiles' stores, gelu after them)."""
    from attnx.interop import from_torch
    linear = torch.nn.Linear(C, OC)
    layer = from_torch(linear)
    layer.activation = activation
    x = rng.standard_normal((rows, C)).astype(np.float32)
    # atol 1e-4: the kernel gradient sums 700 rows, to values near 70
    torch_parity(layer, linear, x, torch_call=lambda m, t: _torch_act(torch, activation)(m(*t)), atol=1e-4)


def test_embedding_torch_parity(torch, rng):
    from attnx.interop import from_torch
    emb = torch.nn.Embedding(10, 4)
    layer = from_torch(emb)
    ids = np.array([[1, 2, 3, 1], [9, 0, 1, 1]], dtype=np.int64)
    report = torch_parity(layer, emb, ids, torch_inputs=[torch.from_numpy(ids)], atol=1e-5)
    assert "d embeddings" in report


def test_to_torch_round_trip(torch, rng):
    from attnx.interop import from_torch, to_torch
    dense = layers.Dense(3)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = dense(x)
    module = to_torch(dense)
    assert isinstance(module, torch.nn.Linear)
    assert_close(module(torch.from_numpy(x)).detach().numpy(), y, atol=1e-6)
    back = from_torch(module)
    for a, b in zip(back.get_weights(), dense.get_weights()):
        assert np.array_equal(a, b)
    emb = layers.Embedding(7, 2)
    emb(np.array([[1]]))
    tm = to_torch(emb)
    assert isinstance(tm, torch.nn.Embedding)
    assert np.array_equal(tm.weight.detach().numpy(), emb.params["embeddings"])
    assert np.array_equal(from_torch(tm).params["embeddings"], emb.params["embeddings"])
    with pytest.raises(ValueError, match="activation"):
        to_torch(_built(layers.Dense(2, activation="relu")))
    with pytest.raises(ValueError, match="no weights"):
        to_torch(layers.Dense(2))


def _built(layer):
    layer(np.zeros((1, 3), dtype=np.float32))
    return layer


# --------------------------------------------------------------------------- initializers
def test_default_initializers():
    attnx.set_random_seed(0)
    dense = layers.Dense(300)
    dense(np.zeros((1, 200), dtype=np.float32))
    k = dense.params["kernel"]
    limit = math.sqrt(6.0 / (200 + 300))
    assert k.shape == (200, 300) and k.dtype == np.float32
    assert np.abs(k).max() <= limit and np.abs(k).max() > 0.98 * limit
    assert abs(k.mean()) < 0.01 * limit and k.std() == pytest.approx(limit / math.sqrt(3), rel=0.02)
    assert not dense.params["bias"].any()
    emb = layers.Embedding(1000, 64)
    emb(np.array([[0]]))
    e = emb.params["embeddings"]
    assert np.abs(e).max() <= 0.05 and np.abs(e).max() > 0.049
    assert e.std() == pytest.approx(0.05 / math.sqrt(3), rel=0.02)


def test_seed_gives_identical_weights():
    attnx.set_random_seed(5)
    a = _built(layers.Dense(4)).get_weights()[0]
    attnx.set_random_seed(5)
    b = _built(layers.Dense(4)).get_weights()[0]
    c = _built(layers.Dense(4)).get_weights()[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# --------------------------------------------------------------------------- configs, weights
@pytest.mark.parametrize("make", [
    lambda: layers.Dense(3, activation="gelu", use_bias=False, kernel_regularizer=regularizers.L2(0.1)),
    lambda: layers.Embedding(9, 3, mask_zero=True, embeddings_regularizer=regularizers.L1L2(0.1, 0.2)),
    lambda: layers.Activation("tanh"),
    lambda: layers.Dropout(0.25, noise_shape=(None, 1), seed=3),
    lambda: layers.Flatten(),
    lambda: layers.Reshape((2, -1)),
    lambda: layers.Concatenate(axis=1),
    lambda: layers.Add(),
    lambda: layers.GlobalAveragePooling1D(),
])
def test_config_round_trip(make):
    layer = make()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    assert type(clone) is type(layer)


def test_config_round_trip_same_output(rng):
    layer = layers.Dense(3, activation="sigmoid")
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y = layer(x)
    clone = layers.Dense.from_config({**layer.get_config(), "name": "dense_clone"})
    clone(x)
    clone.set_weights(layer.get_weights())
    assert np.array_equal(clone(x), y)


def test_set_weights_errors():
    layer = _built(layers.Dense(2))
    with pytest.raises(ValueError, match=r"expected shape \(3, 2\), got \(2, 3\)"):
        layer.set_weights([np.zeros((2, 3)), np.zeros(2)])
    with pytest.raises(ValueError, match="expected 2 arrays"):
        layer.set_weights([np.zeros((3, 2))])
    kernel = layer.params["kernel"]
    layer.set_weights([np.ones((3, 2)), np.full(2, 0.5)])
    assert layer.params["kernel"] is kernel and np.all(kernel == 1)  # copied into the same buffer
    assert_close(layer(np.ones((1, 3))), [[3.5, 3.5]], atol=1e-6)


# --------------------------------------------------------------------------- the harnesses catch bugs
class _WrongBackwardDense(layers.Dense):
    def backprop(self, cache, dy):
        dx = super().backprop(cache, dy)
        self.grads["kernel"][0, 0] += 1e-3  # a wrong parameter gradient
        return dx


def test_gradcheck_detects_wrong_gradients(rng):
    layer = _WrongBackwardDense(2, dtype="float64")
    x = rng.standard_normal((3, 4))
    with pytest.raises(AssertionError, match=r"kernel\[\(0, 0\)\]"):
        gradcheck(layer, x)
    with pytest.raises(ValueError, match="float64"):
        gradcheck(layers.Dense(2), x)


def test_torch_parity_detects_mismatch(torch, rng):
    from attnx.interop import from_torch
    linear = torch.nn.Linear(3, 2)
    layer = from_torch(linear)
    layer.params["bias"][0] += 1e-3
    with pytest.raises(AssertionError, match="output"):
        torch_parity(layer, linear, rng.standard_normal((4, 3)).astype(np.float32))
    with pytest.raises(TypeError, match="no converter"):
        from_torch(torch.nn.Conv1d(2, 2, 3))
    with pytest.raises(ValueError, match="max_norm"):
        from_torch(torch.nn.Embedding(5, 2, max_norm=1.0))


def test_from_torch_float64(torch):
    from attnx.interop import from_torch
    linear = torch.nn.Linear(3, 2).double()
    layer = from_torch(linear, dtype="float64")
    assert layer.params["kernel"].dtype == np.float64
    assert np.array_equal(layer.params["kernel"], linear.weight.detach().numpy().T)
    x = np.random.default_rng(0).standard_normal((2, 3))
    assert_close(layer(x), linear(torch.from_numpy(x)).detach().numpy(), atol=1e-12)


def test_masking_output_and_mask_agree_on_values_the_layer_dtype_rounds_to_the_mask_value():
    """A float64 step of 1e-50 is 0 in the float32 layer: masked in the mask that travels on and zero in the
    output, as Keras (which casts the inputs to the layer's dtype before comparing)."""
    x = np.zeros((2, 3, 4))
    x[0, 0, 1] = 1e-50      # rounds to 0 in float32
    x[0, 1, 2] = 0.5        # real
    x[1, 2, 0] = -1e-30     # a normal float32: real
    layer = layers.Masking(0.0)
    out = layer(x)
    mask = layer.compute_mask(x)
    assert mask.tolist() == [[False, True, False], [False, False, True]]
    assert np.array_equal(np.any(out != 0, axis=-1), mask)
    inputs = attnx.Input((3, 4))
    model = attnx.Model(inputs, layers.LSTM(2)(layers.Masking(0.0)(inputs)))
    # the fully masked first row's step 0 must not change the state: equal to the same row without it
    y = model.predict(x, verbose=0)
    x_clean = x.copy()
    x_clean[0, 0, 1] = 0.0
    np.testing.assert_array_equal(y, model.predict(x_clean, verbose=0))
