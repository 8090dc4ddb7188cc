"""Conv2D, MaxPooling2D, AveragePooling2D: parity with PyTorch (outputs and every gradient, float32,
1e-5) over random shapes, strides, paddings and windows, TensorFlow's 'same' padding (the odd pixel
at the bottom and right) built with F.pad; float64 gradient checks; shapes, configs, models; bad
input, in the layers and in the raw bindings."""
import math
import os

import numpy as np
import pytest

import attnx
from attnx import _core, layers
from attnx.testing import assert_close, gradcheck

f32 = np.float32
ACTIVATIONS = ["linear", "relu", "tanh", "sigmoid", "softmax", "gelu"]


def tf_padding(size, window, stride):
    """(before, after) padding of one axis under TensorFlow's 'same'."""
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return total // 2, total - total // 2


def torch_nchw(torch, x, window, strides, padding, value=0.0):
    """x (B, H, W, C) as an NCHW tensor, padded as TensorFlow pads it for these windows."""
    t = x.permute(0, 3, 1, 2)
    if padding == "same":
        top, bottom = tf_padding(x.shape[1], window[0], strides[0])
        left, right = tf_padding(x.shape[2], window[1], strides[1])
        t = torch.nn.functional.pad(t, (left, right, top, bottom), value=value)
    return t


def torch_activation(torch, name, t):
    return {"linear": lambda: t, "relu": lambda: torch.relu(t), "tanh": lambda: torch.tanh(t),
            "sigmoid": lambda: torch.sigmoid(t), "softmax": lambda: torch.softmax(t, dim=-1),
            "gelu": lambda: torch.nn.functional.gelu(t)}[name]()


def random_geometry(rng):
    """Batch, image, window, strides and padding, drawn so that 'valid' always has a window."""
    window = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
    strides = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    image = (int(rng.integers(window[0], 12)), int(rng.integers(window[1], 12)))
    return int(rng.integers(1, 4)), image, window, strides, str(rng.choice(["same", "valid"]))


def _parity(torch, layer, x, torch_forward, params):
    """Runs the layer and torch_forward(x_tensor, *param_tensors) -> (B, OH, OW, C) on the same
    input and upstream gradient; compares the output and the gradients of x and every parameter."""
    rng = np.random.default_rng(1)
    y = layer(x, training=True)
    dy = rng.standard_normal(y.shape).astype(y.dtype)
    layer.zero_grad()
    dx = layer.backward(dy)
    tx = torch.tensor(x, requires_grad=True)
    tparams = [torch.tensor(layer.params[name], requires_grad=True) for name in params]
    ty = torch_forward(tx, *tparams)
    ty.backward(torch.from_numpy(dy))
    assert_close(y, ty.detach().numpy(), atol=1e-5, rtol=1e-5, what="output")
    assert_close(dx, tx.grad.numpy(), atol=1e-5, rtol=1e-5, what="d inputs")
    for name, t in zip(params, tparams):
        assert_close(layer.grads[name], t.grad.numpy(), atol=1e-5, rtol=1e-5, what=f"d {name}")


@pytest.mark.parametrize("seed", range(16))
def test_conv2d_torch_parity_random_geometry(seed, torch):
    rng = np.random.default_rng(seed)
    B, image, window, strides, padding = random_geometry(rng)
    C, F = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    activation = ACTIVATIONS[seed % len(ACTIVATIONS)]
    use_bias = seed % 4 != 3
    layer = layers.Conv2D(F, window, strides=strides, padding=padding, activation=activation, use_bias=use_bias,
                          bias_initializer="glorot_uniform")
    x = rng.standard_normal((B,) + image + (C,)).astype(f32)
    layer(x)

    def forward(tx, kernel, bias=None):
        # the kernel (KH, KW, C, F) as PyTorch's (F, C, KH, KW)
        z = torch.nn.functional.conv2d(torch_nchw(torch, tx, window, strides, padding),
                                       kernel.permute(3, 2, 0, 1).contiguous(), bias, stride=strides)
        return torch_activation(torch, activation, z.permute(0, 2, 3, 1))
    _parity(torch, layer, x, forward, ["kernel", "bias"] if use_bias else ["kernel"])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["max", "average"])
def test_pooling_torch_parity_random_geometry(seed, kind, torch):
    rng = np.random.default_rng(100 + seed)
    B, image, window, strides, padding = random_geometry(rng)
    x = rng.standard_normal((B,) + image + (int(rng.integers(1, 6)),)).astype(f32)
    F = torch.nn.functional
    if kind == "max":
        layer = layers.MaxPooling2D(window, strides=strides, padding=padding)

        def forward(tx):  # padding never wins a maximum
            return F.max_pool2d(torch_nchw(torch, tx, window, strides, padding, -math.inf), window,
                                strides).permute(0, 2, 3, 1)
    else:
        layer = layers.AveragePooling2D(window, strides=strides, padding=padding)

        def forward(tx):  # the mean of each window's pixels inside the image, as TensorFlow takes it
            total = F.avg_pool2d(torch_nchw(torch, tx, window, strides, padding), window, strides, divisor_override=1)
            count = F.avg_pool2d(torch_nchw(torch, torch.ones_like(tx), window, strides, padding), window, strides,
                                 divisor_override=1)
            return (total / count).permute(0, 2, 3, 1)
    _parity(torch, layer, x, forward, [])


def test_same_padding_with_stride_puts_the_odd_pixel_bottom_right(torch):
    """6x6 image, 3x3 window, stride 2: TensorFlow pads 0 rows on top and 1 below (PyTorch's
    symmetric padding=1 would shift every window)."""
    x = np.arange(36, dtype=f32).reshape(1, 6, 6, 1)
    conv = layers.Conv2D(1, 3, strides=2, padding="same", kernel_initializer="ones", use_bias=False)
    y = conv(x)
    assert y.shape == (1, 3, 3, 1)
    assert y[0, 0, 0, 0] == x[0, :3, :3, 0].sum()
    assert y[0, 2, 2, 0] == x[0, 4:, 4:, 0].sum()  # the last window reaches past the image
    pooled = layers.MaxPooling2D(3, strides=2, padding="same")(-x)
    assert pooled[0, 2, 2, 0] == -x[0, 4, 4, 0]


@pytest.mark.parametrize("seed", range(3))
def test_conv2d_large_channels_torch_parity(seed, torch):
    """Wide patches on many channels (Winograd, and the threads' kernel sums), in float64: float32
    sums of 1275 products differ from PyTorch's by more than 1e-5."""
    rng = np.random.default_rng(seed)
    layer = layers.Conv2D(24, 3, padding="same", activation="relu", bias_initializer="glorot_uniform",
                          dtype="float64")
    x = rng.standard_normal((5, 17, 15, 20))
    layer(x)

    def forward(tx, kernel, bias):
        z = torch.nn.functional.conv2d(torch_nchw(torch, tx, (3, 3), (1, 1), "same"),
                                       kernel.permute(3, 2, 0, 1).contiguous(), bias)
        return torch.relu(z.permute(0, 2, 3, 1))
    _parity(torch, layer, x, forward, ["kernel", "bias"])


# ----------------------------------------------------------------------------- gradient checks
@pytest.mark.parametrize("B, image, C, F, window, strides, padding, dtype", [
    # one channel, stride 1 along rows (SW = 1): the kernel gradient from the patches transposed; and
    # one channel with SW = 2, where it is not
    (3, (9, 7), 1, 5, (3, 3), (1, 1), "same", "float32"),
    (2, (10, 8), 1, 20, (5, 3), (2, 1), "valid", "float32"),
    (2, (8, 9), 1, 4, (2, 3), (1, 2), "same", "float32"),
    # windows evenly spaced over the whole image (SH * padded columns = OW * SW: one product per
    # image): 1x1, and windows as wide as their stride; windows that tile the image with SH = 2 are not
    (2, (5, 6), 7, 3, (1, 1), (1, 1), "same", "float32"),
    (2, (6, 8), 3, 4, (3, 2), (1, 2), "valid", "float32"),
    (2, (6, 8), 3, 4, (2, 2), (2, 2), "valid", "float32"),
    # 3x3, stride 1, 8 channels or more: Winograd F(2x2, 3x3) (odd sizes, 'valid', an image smaller than
    # the window, several blocks of tile rows (float64: the kernel gradient sums 1600 pixels)); dx, a
    # stride-1 convolution of dz, through it too
    (2, (9, 7), 8, 8, (3, 3), (1, 1), "same", "float32"),
    (2, (10, 11), 9, 12, (3, 3), (1, 1), "valid", "float32"),
    (1, (2, 1), 8, 3, (3, 3), (1, 1), "same", "float32"),
    (1, (40, 40), 16, 16, (3, 3), (1, 1), "same", "float64"),
    (2, (7, 6), 5, 16, (3, 3), (1, 1), "same", "float64"),
    # dx as a convolution of dz with the kernel turned around: even windows, asymmetric 'same' padding
    (2, (8, 9), 3, 5, (2, 4), (1, 1), "same", "float32"),
    (2, (8, 9), 3, 5, (5, 3), (1, 1), "valid", "float32"),
    # several blocks of output rows per image (float64: the float32 sums drift past 1e-5): the im2col
    # kernel gradient, the transposed patches, col2im with stride 2
    (1, (40, 40), 4, 6, (3, 3), (1, 1), "same", "float64"),
    (1, (64, 61), 1, 18, (3, 3), (1, 1), "same", "float64"),
    (1, (80, 80), 4, 6, (3, 3), (2, 2), "same", "float64"),
])
def test_conv2d_torch_parity_on_every_path(B, image, C, F, window, strides, padding, dtype, torch):
    rng = np.random.default_rng(7)
    layer = layers.Conv2D(F, window, strides=strides, padding=padding, activation="relu",
                          bias_initializer="glorot_uniform", dtype=dtype)
    x = rng.standard_normal((B,) + image + (C,)).astype(dtype)
    layer(x)

    def forward(tx, kernel, bias):
        z = torch.nn.functional.conv2d(torch_nchw(torch, tx, window, strides, padding),
                                       kernel.permute(3, 2, 0, 1).contiguous(), bias, stride=strides)
        return torch.relu(z.permute(0, 2, 3, 1))
    _parity(torch, layer, x, forward, ["kernel", "bias"])


@pytest.mark.parametrize("channels", [4, 8], ids=["direct", "winograd"])
def test_an_infinite_pixel_reaches_exactly_the_outputs_whose_windows_hold_it(channels, torch):
    """The direct product gives +-Inf there; Winograd's transforms subtract, so it may give NaN,
    but at the same outputs and nowhere else."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 8, channels)).astype(f32)
    x[0, 3, 4, 1] = np.inf
    layer = layers.Conv2D(5, 3, padding="same")
    y = layer(x)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                                          torch.from_numpy(layer.params["kernel"]).permute(3, 2, 0, 1), padding=1)
    expected = expected.permute(0, 2, 3, 1).numpy() + layer.params["bias"]
    assert np.array_equal(np.isfinite(y), np.isfinite(expected))
    assert not np.isfinite(y[0, 2:5, 3:6]).any() and np.isfinite(y).sum() == y.size - 9 * 5
    assert_close(y[np.isfinite(y)], expected[np.isfinite(expected)], atol=1e-5, rtol=1e-5, what="finite outputs")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("padding, strides, window", [("same", (2, 1), (3, 2)), ("valid", (1, 2), (2, 3)),
                                                      ("same", (1, 1), (1, 1))])
def test_conv2d_gradcheck(activation, padding, strides, window, rng):
    layer = layers.Conv2D(3, window, strides=strides, padding=padding, activation=activation, dtype="float64",
                          bias_initializer="glorot_uniform")
    gradcheck(layer, rng.standard_normal((2, 5, 6, 2)))


@pytest.mark.parametrize("cls", [layers.MaxPooling2D, layers.AveragePooling2D])
@pytest.mark.parametrize("padding, strides, window", [("same", (2, 2), (3, 3)), ("valid", (1, 2), (2, 2)),
                                                      ("same", None, (2, 3))])
def test_pooling_gradcheck(cls, padding, strides, window, rng):
    layer = cls(window, strides=strides, padding=padding, dtype="float64")
    gradcheck(layer, rng.standard_normal((2, 5, 7, 3)))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs")
def test_conv2d_threads_give_the_one_thread_gradients(rng):
    """Images split across threads, each summing its own kernel gradient: the one-thread results."""
    layer = layers.Conv2D(8, 3, padding="same", dtype="float64")
    x = rng.standard_normal((8, 20, 20, 6))
    dy = rng.standard_normal(layer(x, training=True).shape)
    before, results = _core.get_num_threads(), []
    try:
        for threads in (1, 2):
            attnx.set_num_threads(threads)
            layer.zero_grad()
            y = layer(x, training=True)
            results.append((y, layer.backward(dy), layer.grads["kernel"].copy(), layer.grads["bias"].copy()))
    finally:
        attnx.set_num_threads(before)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- shapes, configs, models
@pytest.mark.parametrize("make", [
    lambda: layers.Conv2D(5, (3, 2), strides=(2, 3), padding="same"),
    lambda: layers.Conv2D(2, 3, strides=2),
    lambda: layers.MaxPooling2D((3, 2), padding="same"),
    lambda: layers.AveragePooling2D(2, strides=1),
])
def test_compute_output_shape_and_config(make, rng):
    layer = make()
    x = rng.standard_normal((2, 9, 8, 3)).astype(f32)
    y = layer(x)
    assert layer.compute_output_shape((None, 9, 8, 3)) == (None,) + y.shape[1:]
    twin = type(layer).from_config(layer.get_config())
    for name in ("strides", "padding", "pool_size", "kernel_size", "filters"):
        assert getattr(twin, name, None) == getattr(layer, name, None)
    twin(x)
    twin.set_weights(layer.get_weights())
    np.testing.assert_array_equal(twin(x), y)


def test_keras_weight_layout_and_initializers():
    conv = layers.Conv2D(7, (3, 2), kernel_initializer="ones", bias_initializer="zeros")
    conv(np.zeros((1, 4, 4, 5), f32))
    assert [w.shape for w in conv.get_weights()] == [(3, 2, 5, 7), (7,)]
    assert (conv.params["kernel"] == 1).all() and (conv.params["bias"] == 0).all()
    assert list(layers.Conv2D(4, 3, use_bias=False).apply(np.zeros((1, 3, 3, 2), f32))[0].shape) == [1, 1, 1, 4]


def test_cnn_trains_and_feature_map_becomes_regions(tmp_path):
    """A small CNN learns to tell two patterns apart; its last feature map, reshaped to (B, L, D)
    regions, feeds an attention layer; the model saves and loads."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.3, (64, 12, 12, 1)).astype(f32)
    y = rng.integers(0, 2, 64)
    x[y == 1, 3:9, 5:7, 0] += 2.0  # a vertical bar
    x[y == 0, 5:7, 3:9, 0] += 2.0  # a horizontal one
    inp = attnx.Input((12, 12, 1))
    h = layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    h = layers.MaxPooling2D(2)(h)
    h = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(h)
    h = layers.AveragePooling2D(1)(h)
    regions = layers.Reshape((-1, 8))(h)  # (B, 9, 8): one annotation vector per region
    pooled = layers.AttentionPooling()(regions)
    model = attnx.Model(inp, layers.Dense(2)(pooled))
    model.compile("adam", attnx.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(x, y, epochs=30, batch_size=16, verbose=0)
    assert history.history["accuracy"][-1] > 0.95
    path = tmp_path / "cnn.attnx"
    model.save(path)
    np.testing.assert_array_equal(attnx.load_model(path).predict(x), model.predict(x))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make, error, pattern", [
    (lambda: layers.Conv2D(0, 3), ValueError, "filters must be positive"),
    (lambda: layers.Conv2D(-2, 3), ValueError, "filters must be positive"),
    (lambda: layers.Conv2D(4, 0), ValueError, "kernel_size must be positive"),
    (lambda: layers.Conv2D(4, (3, -1)), ValueError, "kernel_size must be positive"),
    (lambda: layers.Conv2D(4, (3, 3, 3)), ValueError, "kernel_size must be an integer or a pair"),
    (lambda: layers.Conv2D(4, float("nan")), TypeError, "kernel_size must be an integer"),
    (lambda: layers.Conv2D(4, 2.5), TypeError, "kernel_size must be an integer"),
    (lambda: layers.Conv2D(float("nan"), 3), TypeError, "filters must be an integer"),
    (lambda: layers.Conv2D(4, 3, strides=0), ValueError, "strides must be positive"),
    (lambda: layers.Conv2D(4, 3, strides=(1, True)), TypeError, "strides must be an integer"),
    (lambda: layers.Conv2D(4, 3, padding="causal"), ValueError, "padding must be 'same' or 'valid'"),
    (lambda: layers.Conv2D(4, 3, activation="swishy"), ValueError, "swishy"),
    (lambda: layers.MaxPooling2D(0), ValueError, "MaxPooling2D: pool_size must be positive"),
    (lambda: layers.MaxPooling2D(2, strides=-1), ValueError, "MaxPooling2D: strides must be positive"),
    (lambda: layers.AveragePooling2D((2, float("nan"))), TypeError, "AveragePooling2D: pool_size must be an integer"),
    (lambda: layers.AveragePooling2D(2, padding=None), ValueError, "padding must be 'same' or 'valid'"),
])
def test_bad_hyperparameters(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


@pytest.mark.parametrize("make", [lambda: layers.Conv2D(2, 3, name="bad_conv"),
                                  lambda: layers.MaxPooling2D(3, name="bad_conv"),
                                  lambda: layers.AveragePooling2D(3, name="bad_conv")])
def test_bad_inputs_name_the_layer(make):
    layer = make()
    layer(np.zeros((1, 4, 4, 2), f32))
    cases = [
        (np.zeros((4, 4, 2), f32), ValueError, r"expected rank 4, got shape \(4, 4, 2\)"),
        (np.zeros((1, 1, 4, 4, 2), f32), ValueError, "expected rank 4"),
        (np.float32(1), ValueError, "expected rank 4"),
        (np.zeros((0, 4, 4, 2), f32), ValueError, "empty batch"),
        (np.zeros((1, 2, 4, 2), f32), ValueError, r"window 3x3 is larger than the input's 2x4 pixels"),
        (np.zeros((1, 4, 4, 2), bool), TypeError, "numeric array"),
        (np.array([[[["a", "b"]]]]), TypeError, "numeric array"),
        (np.zeros((1, 4, 4, 2), np.complex64), TypeError, "numeric array"),
    ]
    if isinstance(layer, layers.Conv2D):
        cases.append((np.zeros((1, 4, 4, 3), f32), ValueError, r"last axis of size 2"))
    for x, error, pattern in cases:
        with pytest.raises(error, match=pattern) as info:
            layer(x)
        assert "bad_conv" in str(info.value)
    y = layer(np.zeros((1, 4, 4, 2), f32), training=True)
    with pytest.raises(ValueError, match="bad_conv.*dy"):
        layer.backward(np.zeros(y.shape[:-1] + (y.shape[-1] + 1,), f32))


def test_same_padding_accepts_images_smaller_than_the_window():
    y = layers.Conv2D(2, 5, padding="same")(np.ones((1, 2, 3, 1), f32))
    assert y.shape == (1, 2, 3, 2)
    assert layers.MaxPooling2D(4, padding="same")(np.ones((2, 1, 1, 3), f32)).shape == (2, 1, 1, 3)


def test_zero_sizes():
    """No channels, no filters' inputs, an image with no rows under 'same': results of the right
    shape, no crash."""
    conv = layers.Conv2D(3, 2, padding="same", bias_initializer="ones")
    np.testing.assert_array_equal(conv(np.zeros((2, 3, 3, 0), f32)), np.ones((2, 3, 3, 3), f32))
    y = conv(np.zeros((2, 0, 3, 0), f32), training=True)
    assert y.shape == (2, 0, 3, 3) and conv.backward(np.zeros_like(y)).shape == (2, 0, 3, 0)
    assert layers.MaxPooling2D(2, padding="same")(np.zeros((1, 0, 5, 2), f32)).shape == (1, 0, 3, 2)


# ----------------------------------------------------------------------------- raw bindings
# (sizes past int: tests/test_hostile_core.py)
def _conv(**kwargs):
    """conv2d_forward on a (1, 3, 3, 2) image and a 1x1 kernel of one filter, but for `kwargs`."""
    args = dict(x=np.zeros((1, 3, 3, 2), f32), kernel=np.zeros((1, 1, 2, 1), f32), bias=None, strides=(1, 1))
    return _core.conv2d_forward(**{**args, **kwargs})


def _pool(fn, **kwargs):
    """A pooling binding on a (1, 3, 3, 2) image with 2x2 windows every pixel, but for `kwargs`
    (max_pool2d_backward also gets the forward's output y)."""
    args = dict(x=np.zeros((1, 3, 3, 2), f32), pool_size=(2, 2), strides=(1, 1))
    if fn is _core.max_pool2d_backward:
        args["y"] = np.zeros((1, 2, 2, 2), f32)
    return fn(**{**args, **kwargs})


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: _conv(kernel=np.zeros((1, 1, 3, 1), f32)), ValueError,
     r"conv2d_forward: kernel .*expected shape \(1, 1, 2, \*\)"),
    (lambda: _conv(kernel=np.zeros((4, 1, 2, 1), f32)), ValueError,
     "conv2d_forward: window 4x1 is larger than the input"),
    (lambda: _conv(kernel=np.zeros((1, 1, 2, 1))), TypeError, "conv2d_forward: kernel: expected dtype float32"),
    (lambda: _conv(kernel=np.zeros((1, 2, 1), f32)), ValueError, "conv2d_forward: kernel: expected rank 4"),
    (lambda: _conv(bias=np.zeros(2, f32)), ValueError, r"conv2d_forward: bias: expected shape \(1,\)"),
    (lambda: _conv(strides=(0, 1)), ValueError, "conv2d_forward: strides must be positive"),
    (lambda: _conv(strides=(1, 2, 3)), TypeError, "incompatible function arguments"),
    (lambda: _conv(padding="full"), ValueError, "padding must be 'same' or 'valid'"),
    (lambda: _conv(x=np.zeros((3, 3, 2), f32)), ValueError, "conv2d_forward: x: expected rank 4"),
    (lambda: _conv(x=np.zeros((1, 3, 3, 2), np.int32)), TypeError, "conv2d_forward: x: expected float32 or float64"),
    (lambda: _conv(activation="swish"), ValueError, "swish"),
    (lambda: _core.conv2d_backward(dy=np.zeros((1, 3, 3, 2), f32), x=np.zeros((1, 3, 3, 2), f32),
                                   kernel=np.zeros((1, 1, 2, 1), f32), y=np.zeros((1, 3, 3, 1), f32),
                                   z=np.zeros((1, 3, 3, 1), f32), strides=(1, 1), padding="valid", activation="relu",
                                   dkernel=np.zeros((1, 1, 2, 1), f32), dbias=None), ValueError,
     r"conv2d_backward: dy: expected shape \(1, 3, 3, 1\)"),
    (lambda: _core.conv2d_backward(dy=np.zeros((1, 3, 3, 1), f32), x=np.zeros((1, 3, 3, 2), f32),
                                   kernel=np.zeros((1, 1, 2, 1), f32), y=np.zeros((1, 3, 3, 1), f32),
                                   z=np.zeros((1, 3, 3, 1), f32), strides=(1, 1), padding="valid", activation="relu",
                                   dkernel=np.zeros((1, 1, 2, 2), f32)[..., :1], dbias=None), ValueError,
     "conv2d_backward: dkernel: expected a C-contiguous array"),
    (lambda: _pool(_core.max_pool2d_forward, pool_size=(4, 1)), ValueError, "max_pool2d_forward: window 4x1 is larger"),
    (lambda: _pool(_core.avg_pool2d_forward, strides=(1, -3)), ValueError,
     "avg_pool2d_forward: strides must be positive"),
    (lambda: _pool(_core.avg_pool2d_backward, dy=np.zeros((1, 3, 3, 2), f32)), ValueError,
     r"avg_pool2d_backward: dy: expected shape \(1, 2, 2, 2\), got \(1, 3, 3, 2\)"),
    (lambda: _pool(_core.max_pool2d_backward, dy=np.zeros((1, 1, 1, 2), f32), strides=(2, 2), padding="same"),
     ValueError, r"max_pool2d_backward: dy: expected shape \(1, 2, 2, 2\)"),
    (lambda: _pool(_core.max_pool2d_backward, dy=np.zeros((1, 2, 2, 2), f32), y=np.zeros((1, 3, 3, 2), f32)),
     ValueError, r"max_pool2d_backward: y: expected shape \(1, 2, 2, 2\), got \(1, 3, 3, 2\)"),
    (lambda: _pool(_core.max_pool2d_backward, dy=np.zeros((1, 2, 2, 2), f32), y=np.zeros((1, 2, 2, 2))), TypeError,
     "max_pool2d_backward: y: expected dtype float32"),
    (lambda: _pool(_core.max_pool2d_backward, dy=np.zeros((1, 2, 2, 2), f32), y=[[0.0]]), TypeError,
     "max_pool2d_backward: y: expected a NumPy array, got list"),
    (lambda: _pool(_core.max_pool2d_backward, dy=np.zeros((1, 2, 2, 2), f32), y=None), TypeError,
     "max_pool2d_backward: y: expected a NumPy array, got NoneType"),
    (lambda: _pool(_core.max_pool2d_backward, dy=np.zeros((1, 1, 1, 2)), strides=(2, 2)), TypeError,
     "max_pool2d_backward: dy: expected dtype float32"),
], ids=["kernel_channels", "kernel_too_large", "kernel_dtype", "kernel_rank", "bias_shape", "zero_stride",
        "three_strides", "bad_padding", "rank", "int_x", "activation", "conv_dy_shape", "dkernel_strided",
        "pool_too_large", "negative_stride", "avg_dy_shape", "max_dy_shape_same", "max_y_shape", "max_y_dtype", "max_y_list", "max_y_none",
        "max_dy_dtype"])
def test_raw_bindings_refuse_bad_arguments(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# ----------------------------------------------------------------------------- PyTorch interop
def _nhwc(module, inputs):
    """A (B, C, H, W) torch module called on (B, H, W, C) inputs, as the attnx layer takes them."""
    return module(inputs[0].permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


@pytest.mark.parametrize("make", [
    lambda nn: nn.Conv2d(3, 5, (3, 2), stride=(2, 1)),
    lambda nn: nn.Conv2d(3, 4, 3, padding=1, bias=False),
    lambda nn: nn.Conv2d(3, 4, (2, 4), padding="same"),
    lambda nn: nn.MaxPool2d(2),
    lambda nn: nn.MaxPool2d((3, 2), stride=1),
])
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # (a copy inside torch)
def test_from_torch_parity_and_back(make, torch, rng):
    from attnx.interop import from_torch, to_torch
    from attnx.testing import torch_parity
    module = make(torch.nn)
    layer = from_torch(module)
    x = rng.standard_normal((2, 7, 6, 3)).astype(f32)
    torch_parity(layer, module, x, torch_call=_nhwc, atol=1e-5)
    back = to_torch(layer)
    t = torch.from_numpy(x).permute(0, 3, 1, 2)
    np.testing.assert_allclose(back(t).detach().numpy(), module(t).detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make, pattern", [
    (lambda nn: nn.Conv2d(3, 4, 3, padding=1, stride=2), "pads otherwise than TensorFlow's"),
    (lambda nn: nn.Conv2d(3, 4, 3, dilation=2), "dilation"),
    (lambda nn: nn.Conv2d(4, 4, 3, groups=2), "groups"),
    (lambda nn: nn.MaxPool2d(3, padding=1), "pads with -inf on both sides"),
    (lambda nn: nn.MaxPool2d(2, ceil_mode=True), "ceil_mode"),
])
def test_from_torch_refuses_what_attnx_computes_otherwise(make, pattern, torch):
    from attnx.interop import from_torch
    with pytest.raises(ValueError, match=pattern):
        from_torch(make(torch.nn))


def test_to_torch_refuses_what_torch_computes_otherwise(torch):
    from attnx.interop import to_torch
    for layer, pattern in [(layers.Conv2D(2, 3, activation="relu"), "activation"),
                           (layers.Conv2D(2, 3, strides=2, padding="same"), "stride 1 only"),
                           (layers.MaxPooling2D(2, padding="same"), "pads 'same'")]:
        layer(np.zeros((1, 4, 4, 1), f32))
        with pytest.raises(ValueError, match=pattern):
            to_torch(layer)
