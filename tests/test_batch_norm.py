"""BatchNormalization's C++ kernel (`batch_norm.hpp` through `attnx.kernels`): float64 gradient checks at
random shapes and axes (batch and moving statistics, with and without masks), parity with PyTorch's
nn.BatchNorm1d / nn.BatchNorm2d in train and eval mode over several steps (running statistics included,
momentum translated), and bad input as typed errors naming the layer or the binding. Keras parity, the
layer contract and the Keras file / ONNX round trips are in test_keras_layers_parity.py,
test_layer_contract.py, test_keras_interop.py and test_export_keras_layers.py."""
import numpy as np
import pytest

from attnx import backend, kernels, layers


def _random_case(rng):
    """x of rank 2 to 5 with a random feature axis, and maybe a mask (B, T)."""
    ndim = int(rng.integers(2, 6))
    shape = tuple(int(s) for s in rng.integers(1, 5, size=ndim))
    shape = (shape[0] + 1,) + shape[1:]  # two samples at least, so the batch has a variance
    axis = int(rng.integers(1, ndim))
    axis = axis - ndim if rng.random() < 0.5 else axis  # a negative axis half the time
    mask = None
    if ndim >= 3 and rng.random() < 0.6:
        mask = rng.random(shape[:2]) < 0.7
        mask[0, 0] = True
    return rng.standard_normal(shape) * 2 + 1, axis, mask


def _loss_and_gradients(x, axis, gamma, beta, mask, training, dy):
    """sum(y dy) and the kernel's dx, dgamma, dbeta (float64), the moving statistics left as they were."""
    C = x.shape[axis]
    moving_mean, moving_variance = np.linspace(-0.5, 0.5, C), np.linspace(0.5, 2.0, C)
    y, mean, rstd, count = kernels.batch_norm_forward(
        x=x, axis=axis, gamma=gamma, beta=beta, moving_mean=moving_mean.copy(), moving_variance=moving_variance.copy(),
        mask=mask, training=training, momentum=0.9, epsilon=1e-3)
    dgamma, dbeta = np.zeros(C), np.zeros(C)
    dx = kernels.batch_norm_backward(dy=dy, x=x, axis=axis, mean=mean, rstd=rstd, count=count, gamma=gamma, mask=mask,
                                     dgamma=dgamma, dbeta=dbeta)
    return float(np.sum(y * dy)), dx, dgamma, dbeta


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("training", [True, False])
def test_kernel_float64_gradients_at_random_shapes_and_axes(seed, training):
    rng = np.random.default_rng(seed)
    x, axis, mask = _random_case(rng)
    C = x.shape[axis]
    gamma, beta, dy = rng.standard_normal(C), rng.standard_normal(C), rng.standard_normal(x.shape)
    _, dx, dgamma, dbeta = _loss_and_gradients(x, axis, gamma, beta, mask, training, dy)
    h = 1e-6
    for name, value, got in (("x", x, dx), ("gamma", gamma, dgamma), ("beta", beta, dbeta)):
        numeric = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            keep = value[i]
            value[i] = keep + h
            up = _loss_and_gradients(x, axis, gamma, beta, mask, training, dy)[0]
            value[i] = keep - h
            down = _loss_and_gradients(x, axis, gamma, beta, mask, training, dy)[0]
            value[i] = keep
            numeric[i] = (up - down) / (2 * h)
        np.testing.assert_allclose(got, numeric, atol=1e-6, rtol=1e-5,
                                   err_msg=f"d{name}: shape {x.shape}, axis {axis}, masked {mask is not None}")


def test_kernel_float32_matches_float64_on_the_threaded_channel_last_path():
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((64, 50, 96)) * 3 + 5, rng.standard_normal((64, 50, 96))
    mask = rng.random((64, 50)) < 0.8
    results = {}
    for dtype in (np.float32, np.float64):
        mm, mv = np.zeros(96, dtype), np.ones(96, dtype)
        y, mean, rstd, count = kernels.batch_norm_forward(
            x=x.astype(dtype), axis=-1, gamma=None, beta=None, moving_mean=mm, moving_variance=mv, mask=mask,
            training=True, momentum=0.5, epsilon=1e-3)
        dx = kernels.batch_norm_backward(dy=dy.astype(dtype), x=x.astype(dtype), axis=-1, mean=mean, rstd=rstd,
                                         count=count, gamma=None, mask=mask, dgamma=None, dbeta=None)
        results[dtype] = (y, mean, rstd, count, mm, mv, dx)
    # the double-precision formula, NumPy's
    w = mask[:, :, None].astype(np.float64)
    n = w.sum(axis=(0, 1)) + 1e-7
    mean = (w * x).sum(axis=(0, 1)) / n
    var = (w * (x - mean) ** 2).sum(axis=(0, 1)) / n
    np.testing.assert_allclose(results[np.float64][1], mean, rtol=1e-12)
    np.testing.assert_allclose(results[np.float64][5], 0.5 + 0.5 * var, rtol=1e-12)
    for got, want in zip(results[np.float32], results[np.float64]):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("shape,axis,masked", [((64, 64, 16, 16), 1, False), ((64, 64, 16, 16), 1, True),
                                               ((1024, 1024), -1, False), ((8, 3, 224, 224), 1, False),
                                               ((256, 50, 96), -1, True)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_numpy_at_benchmark_sizes_in_both_layouts(shape, axis, masked, threads):
    """Channels first (each channel's runs reduced on their own) and wide channels last (rows added into
    per-channel accumulators), at sizes whose passes split across threads (2^20 elements and more): the
    one-pass statistics and the gradients against NumPy's double-precision formulas (a mean far from zero
    against the spread, and a drift along the batch so that the first blocks' means are not the
    channel's), float32 against float64."""
    rng = np.random.default_rng(5)
    drift = np.linspace(-40, 40, shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    x, dy = rng.standard_normal(shape) * 3 + 100 + drift, rng.standard_normal(shape)
    C = shape[axis]
    gamma, beta = rng.standard_normal(C), rng.standard_normal(C)
    mask = rng.random(shape[:2]) < 0.7 if masked else None
    reduce = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    w = np.ones_like(x) if mask is None else np.broadcast_to(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x.shape)
    n = w.sum(axis=reduce, keepdims=True) + (1e-7 if masked else 0)
    mean = (w * x).sum(axis=reduce, keepdims=True) / n
    var = (w * (x - mean) ** 2).sum(axis=reduce, keepdims=True) / n
    shaped = [1] * x.ndim
    shaped[axis] = C
    rstd = 1 / np.sqrt(var + 1e-3)
    want_y = (x - mean) * rstd * gamma.reshape(shaped) + beta.reshape(shaped)
    dxhat = dy * gamma.reshape(shaped)
    dvar = -0.5 * rstd ** 3 * (dxhat * (x - mean)).sum(axis=reduce, keepdims=True)
    dmean = -rstd * dxhat.sum(axis=reduce, keepdims=True) + dvar * -2 * (w * (x - mean)).sum(axis=reduce, keepdims=True) / n
    want_dx = rstd * dxhat + w * (dmean + 2 * (x - mean) * dvar) / n
    results = {}
    before = backend.get_num_threads()
    backend.set_num_threads(threads)
    try:
        for dtype in (np.float64, np.float32):
            mm, mv = np.zeros(C, dtype), np.ones(C, dtype)
            y, got_mean, got_rstd, count = kernels.batch_norm_forward(
                x=x.astype(dtype), axis=axis, gamma=gamma.astype(dtype), beta=beta.astype(dtype), moving_mean=mm,
                moving_variance=mv, mask=mask, training=True, momentum=0.5, epsilon=1e-3)
            dgamma, dbeta = np.zeros(C, dtype), np.zeros(C, dtype)
            dx = kernels.batch_norm_backward(dy=dy.astype(dtype), x=x.astype(dtype), axis=axis, mean=got_mean,
                                             rstd=got_rstd, count=count, gamma=gamma.astype(dtype), mask=mask,
                                             dgamma=dgamma, dbeta=dbeta)
            results[dtype] = (y, got_mean, got_rstd, mv, dx, dgamma, dbeta)
    finally:
        backend.set_num_threads(before)
    y, got_mean, got_rstd, mv, dx, dgamma, dbeta = results[np.float64]
    np.testing.assert_allclose(got_mean, mean.reshape(-1), rtol=1e-12)
    np.testing.assert_allclose(got_rstd, rstd.reshape(-1), rtol=1e-9)
    np.testing.assert_allclose(mv, 0.5 + 0.5 * var.reshape(-1), rtol=1e-9)
    np.testing.assert_allclose(y, want_y, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(dgamma, (dy * (x - mean) * rstd).sum(axis=reduce), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dbeta, dy.sum(axis=reduce), rtol=1e-9, atol=1e-9)
    for got, want in zip(results[np.float32], results[np.float64]):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------------------ PyTorch parity
@pytest.mark.parametrize("shape,module", [((6, 5), "BatchNorm1d"), ((4, 5, 7), "BatchNorm1d"),
                                          ((3, 5, 4, 6), "BatchNorm2d")])
@pytest.mark.parametrize("affine", [True, False])
def test_matches_torch_batch_norm_in_train_and_eval_mode(shape, module, affine):
    """PyTorch's channel axis is 1; its `momentum` is Keras' 1 - momentum; its running variance moves with
    the unbiased batch variance (n / (n - 1) times Keras'), which the check translates back."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    C, momentum, eps = shape[1], 0.9, 1e-3
    theirs = getattr(torch.nn, module)(C, eps=eps, momentum=1 - momentum, affine=affine).double()
    ours = layers.BatchNormalization(axis=1, momentum=momentum, epsilon=eps, center=affine, scale=affine,
                                     dtype="float64")
    ours.build(shape)
    ours.built = True
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(rng.standard_normal(C)))
            theirs.bias.copy_(torch.tensor(rng.standard_normal(C)))
        ours.set_weights([theirs.weight.detach().numpy(), theirs.bias.detach().numpy(), np.zeros(C), np.ones(C)])
    n = int(np.prod(shape)) // C
    expected_variance = np.ones(C)  # ours, derived from PyTorch's unbiased running variance
    for step in range(3):
        x, dy = rng.standard_normal(shape) * 2 + step, rng.standard_normal(shape)
        for training in (True, False):
            theirs.train(training)
            if not training:  # PyTorch's running variance is the unbiased one's: read ours, as translated
                with torch.no_grad():
                    theirs.running_var.copy_(torch.tensor(ours.params["moving_variance"]))
            xt = torch.tensor(x, requires_grad=True)
            before = theirs.running_var.detach().numpy().copy()
            theirs.zero_grad()
            out = theirs(xt)
            (out * torch.tensor(dy)).sum().backward()
            ours.zero_grad()
            y, cache = ours.apply(x, training=training)
            np.testing.assert_allclose(y, out.detach().numpy(), rtol=1e-10, atol=1e-10)
            if training:
                dx = ours.backprop(cache, dy)
                np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-10)
                if affine:
                    np.testing.assert_allclose(ours.grads["gamma"], theirs.weight.grad.numpy(), rtol=1e-9, atol=1e-10)
                    np.testing.assert_allclose(ours.grads["beta"], theirs.bias.grad.numpy(), rtol=1e-9, atol=1e-10)
                unbiased_step = (theirs.running_var.detach().numpy() - momentum * before) / (1 - momentum)
                expected_variance = momentum * expected_variance + (1 - momentum) * unbiased_step * (n - 1) / n
            np.testing.assert_allclose(ours.params["moving_mean"], theirs.running_mean.numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(ours.params["moving_variance"], expected_variance, rtol=1e-10)


def test_eval_mode_gradients_match_torch():
    """In eval mode the statistics are constants: dx = gamma rstd dy, as PyTorch's autograd gives."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    theirs = torch.nn.BatchNorm2d(3, eps=1e-3).double().eval()
    with torch.no_grad():
        theirs.running_mean.copy_(torch.tensor(rng.standard_normal(3)))
        theirs.running_var.copy_(torch.tensor(rng.random(3) + 0.5))
        theirs.weight.copy_(torch.tensor(rng.standard_normal(3)))
    ours = layers.BatchNormalization(axis=1, epsilon=1e-3, dtype="float64")
    ours.build((2, 3, 4, 5))
    ours.built = True
    ours.set_weights([p.detach().numpy().copy() for p in (theirs.weight, theirs.bias, theirs.running_mean,
                                                           theirs.running_var)])
    x, dy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    xt = torch.tensor(x, requires_grad=True)
    (theirs(xt) * torch.tensor(dy)).sum().backward()
    with backend.without_training_randomness():
        y, cache = ours.apply(x, training=True)
    np.testing.assert_allclose(y, theirs(torch.tensor(x)).detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.backprop(cache, dy), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.grads["gamma"], theirs.weight.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_an_empty_batch_moves_nothing():
    """No elements per channel (a sequence of no steps): no batch statistics, so the moving ones are read and
    stay; the gradients are empty or zero."""
    layer = layers.BatchNormalization(momentum=0.5, dtype="float64")
    layer.build((None, None, 3))
    layer.built = True
    layer.set_weights([np.full(3, 2.0), np.full(3, 1.0), np.full(3, 0.5), np.full(3, 4.0)])
    y, cache = layer.apply(np.zeros((2, 0, 3)), training=True)
    assert y.shape == (2, 0, 3)
    np.testing.assert_array_equal(layer.params["moving_mean"], 0.5)
    np.testing.assert_array_equal(layer.params["moving_variance"], 4.0)
    assert layer.backprop(cache, np.zeros((2, 0, 3))).shape == (2, 0, 3)
    np.testing.assert_array_equal(layer.grads["gamma"], 0.0)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("inputs,error,match", [
    (np.zeros((4, 5), np.float32), ValueError, "was built for 3 features on axis -1"),
    (np.zeros((4, 2, 5), np.float32), ValueError, "was built for 3 features"),
    (np.zeros(3, np.float32), ValueError, "expected rank >= 2"),
    (np.array([["a", "b", "c"]]), TypeError, "must be a numeric array"),
    (np.zeros((2, 3), np.complex64), TypeError, "must be a numeric array"),
])
def test_layer_bad_input_is_a_typed_error_naming_the_layer(inputs, error, match):
    layer = layers.BatchNormalization(name="bn")
    layer.build((None, 3))
    layer.built = True
    with pytest.raises(error, match=match) as info:
        layer(inputs, training=True)
    assert "'bn'" in str(info.value)


def test_layer_bad_mask_is_a_typed_error():
    layer = layers.BatchNormalization(name="bn")
    with pytest.raises(ValueError, match="'bn'.*a mask needs inputs"):
        layer(np.zeros((2, 3), np.float32), mask=np.ones((2, 3), bool), training=True)
    with pytest.raises(ValueError, match="'bn'.*mask"):
        layer(np.zeros((2, 4, 3), np.float32), mask=np.ones((2, 5), bool), training=True)
    with pytest.raises(TypeError, match="'bn'.*mask"):
        layer(np.zeros((2, 4, 3), np.float32), mask=np.ones((2, 4), np.float32), training=True)


def _forward_args(**changes):
    args = dict(x=np.zeros((4, 3), np.float32), axis=-1, gamma=None, beta=None, moving_mean=np.zeros(3, np.float32),
                moving_variance=np.ones(3, np.float32), mask=None, training=True, momentum=0.9, epsilon=1e-3)
    return {**args, **changes}


@pytest.mark.parametrize("changes,error,match", [
    ({"x": np.zeros(3, np.float32)}, ValueError, "rank 2 or more"),
    ({"x": np.zeros((4, 3), np.int32)}, TypeError, "expected float32 or float64"),
    ({"moving_mean": np.zeros(3)}, TypeError, "moving_mean: expected dtype float32"),
    ({"moving_variance": np.ones(4, np.float32)}, ValueError, "moving_variance"),
    ({"gamma": np.ones(2, np.float32)}, ValueError, "gamma"),
    ({"axis": 0}, ValueError, "not a feature axis"),
    ({"axis": 2}, ValueError, "not a feature axis"),
    ({"mask": np.ones((4, 3), bool)}, ValueError, "rank 3 or more"),
    ({"x": np.zeros((4, 2, 3), np.float32), "mask": np.ones((4, 3), bool)}, ValueError, "mask: expected shape"),
    ({"epsilon": 0.0}, ValueError, "epsilon must be positive"),
    ({"momentum": 1.5}, ValueError, "momentum must be in"),
    ({"moving_mean": np.zeros(3, np.float32)[::-1]}, ValueError, "C-contiguous"),
])
def test_binding_bad_input_is_a_typed_error(changes, error, match):
    with pytest.raises(error, match=match):
        kernels.batch_norm_forward(**_forward_args(**changes))


def test_binding_reads_read_only_moving_statistics_in_inference_only():
    mm, mv = np.zeros(3, np.float32), np.ones(3, np.float32)
    mm.flags.writeable = mv.flags.writeable = False
    y = kernels.batch_norm_forward(**_forward_args(moving_mean=mm, moving_variance=mv, training=False))[0]
    np.testing.assert_allclose(y, 0.0)
    with pytest.raises(ValueError, match="read-only"):
        kernels.batch_norm_forward(**_forward_args(moving_mean=mm, moving_variance=mv))


@pytest.mark.parametrize("changes,error,match", [
    ({"dy": np.zeros((4, 2), np.float32)}, ValueError, "dy"),
    ({"dy": np.zeros((4, 3))}, TypeError, "expected dtype float64"),
    ({"count": np.ones(2, np.float32)}, ValueError, "count"),
    ({"dgamma": np.zeros(3)}, TypeError, "dgamma"),
    ({"mean": np.zeros(4, np.float32)}, ValueError, "mean"),
])
def test_backward_binding_bad_input_is_a_typed_error(changes, error, match):
    x = np.zeros((4, 3), np.float32)
    args = dict(dy=np.zeros((4, 3), np.float32), x=x, axis=1, mean=np.zeros(3, np.float32),
                rstd=np.ones(3, np.float32), count=np.full(3, 4, np.float32), gamma=None, mask=None, dgamma=None,
                dbeta=None)
    with pytest.raises(error, match=match):
        kernels.batch_norm_backward(**{**args, **changes})
