"""The layers a Keras user meets in the first week (issue 41) against Keras 3 itself on its PyTorch backend:
the same outputs on the same weights (float32 noise), and the same input and weight gradients (torch
autograd through the Keras layer), for TimeDistributed, Lambda, BatchNormalization, Conv1D,
GlobalMaxPooling1D, GlobalAveragePooling2D, Dot and Permute. Also their float64 gradient checks."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")

from attnx import backend, layers, ops  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch", reason="Keras on its torch backend")


def _keras_run(layer, inputs, dy, training=False, **kwargs):
    """Keras' outputs, and the gradients of sum(outputs * dy) for its inputs and trainable weights."""
    xs = [torch.tensor(x, requires_grad=np.asarray(x).dtype.kind == "f") for x in
          (inputs if isinstance(inputs, list) else [inputs])]
    out = layer(xs if isinstance(inputs, list) else xs[0], training=training, **kwargs)
    (out * torch.tensor(dy)).sum().backward()
    grads = [None if x.grad is None else x.grad.numpy() for x in xs]
    weights = [None if w.value.grad is None else w.value.grad.numpy() for w in layer.trainable_weights]
    return out.detach().numpy(), grads if isinstance(inputs, list) else grads[0], weights


def _attnx_run(layer, inputs, dy, training=False, **kwargs):
    """attnx's outputs, input gradients and trainable weights' gradients; an inference call's gradients are
    those of the inference path (a training-path call without training's behaviour, as a tape records it)."""
    layer.zero_grad()
    if training:
        out, cache = layer.apply(inputs, training=True, **kwargs)
    else:
        with backend.without_training_randomness():
            out, cache = layer.apply(inputs, training=True, **kwargs)
        np.testing.assert_array_equal(layer(inputs, **kwargs), out)
    dx = layer.backprop(cache, dy)
    return out, dx, [layer.grads[name] for name, _, _ in layer.trainable_params]


def _close(a, b, atol=2e-5, rtol=2e-4):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=atol, rtol=rtol)


def _compare(ours, theirs, inputs, dy, training=False, kwargs=None, keras_kwargs=None):
    ours.build([np.shape(x) for x in inputs] if isinstance(inputs, list) else np.shape(inputs))
    ours.built = True
    if not theirs.built:
        theirs.build([np.shape(x) for x in inputs] if isinstance(inputs, list) else np.shape(inputs))
    ours.set_weights([np.asarray(w) for w in theirs.get_weights()])
    y_k, dx_k, dw_k = _keras_run(theirs, inputs, dy, training, **(keras_kwargs or {}))
    y_a, dx_a, dw_a = _attnx_run(ours, inputs, dy, training, **(kwargs or {}))
    _close(y_a, y_k)
    for a, k in zip(dx_a if isinstance(inputs, list) else [dx_a], dx_k if isinstance(inputs, list) else [dx_k]):
        if k is not None:
            _close(a, k)
    assert len(dw_a) == len(dw_k)
    for a, k in zip(dw_a, dw_k):
        _close(a, k)
    return ours, theirs


RNG = np.random.default_rng(7)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("padding", ["valid", "same", "causal"])
@pytest.mark.parametrize("strides,dilation", [(1, 1), (2, 1), (1, 2), (3, 1)])
def test_conv1d_matches_keras(padding, strides, dilation):
    x = _f32(2, 9, 3)
    if padding == "causal" and strides > 1:
        # Keras' torch backend pads these differently from its TensorFlow one; attnx keeps the definition
        # both share: (kernel - 1) * dilation zeros before the sequence, then the valid convolution
        ours = layers.Conv1D(4, 3, strides=strides, padding="causal", dilation_rate=dilation, activation="tanh")
        valid = layers.Conv1D(4, 3, strides=strides, padding="valid", dilation_rate=dilation, activation="tanh")
        y = ours(x)
        valid(x)
        valid.set_weights(ours.get_weights())
        padded = np.concatenate([np.zeros((2, 2 * dilation, 3), np.float32), x], axis=1)
        np.testing.assert_allclose(y, valid(padded), rtol=1e-6, atol=1e-6)
        return
    ours = layers.Conv1D(4, 3, strides=strides, padding=padding, dilation_rate=dilation, activation="tanh")
    theirs = keras.layers.Conv1D(4, 3, strides=strides, padding=padding, dilation_rate=dilation, activation="tanh")
    out_shape = theirs.compute_output_shape(x.shape)
    assert ours.compute_output_shape((None,) + x.shape[1:])[1:] == tuple(out_shape)[1:]
    _compare(ours, theirs, x, _f32(*out_shape))


def test_conv1d_mask_reads_masked_steps_as_zeros():
    x, mask = _f32(2, 6, 3), np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    ours, theirs = layers.Conv1D(2, 3, padding="same"), keras.layers.Conv1D(2, 3, padding="same")
    dy = _f32(2, 6, 2)
    ours.build(x.shape)
    ours.built = True
    theirs.build(x.shape)
    ours.set_weights([np.asarray(w) for w in theirs.get_weights()])
    y_k, dx_k, _ = _keras_run(theirs, x * mask[:, :, None], dy)
    y_a, dx_a, _ = _attnx_run(ours, x, dy, mask=mask)
    _close(y_a, y_k)
    _close(dx_a, dx_k * mask[:, :, None])


@pytest.mark.parametrize("kwargs", [{}, {"axis": 1}, {"center": False}, {"scale": False, "epsilon": 0.1},
                                    {"momentum": 0.5, "axis": -2}])
@pytest.mark.parametrize("training", [False, True])
def test_batch_normalization_matches_keras(kwargs, training):
    x = _f32(4, 3, 5) * 2 + 1
    ours, theirs = layers.BatchNormalization(**kwargs), keras.layers.BatchNormalization(**kwargs)
    theirs.build(x.shape)
    # moving statistics away from their initial values, so that inference reads them
    for w in theirs.non_trainable_weights:
        w.assign(np.abs(_f32(*w.shape)) + 0.5)
    for w in theirs.trainable_weights:
        w.assign(_f32(*w.shape))
    _compare(ours, theirs, x, _f32(*x.shape), training=training)
    # the moving statistics moved the same way
    for a, k in zip(ours.get_weights(), theirs.get_weights()):
        _close(a, np.asarray(k))


def test_batch_normalization_mask_matches_keras():
    x, mask = _f32(3, 5, 4), RNG.random((3, 5)) < 0.6
    mask[:, 0] = True
    ours, theirs = layers.BatchNormalization(), keras.layers.BatchNormalization()
    _compare(ours, theirs, x, _f32(*x.shape), training=True, kwargs={"mask": mask},
             keras_kwargs={"mask": torch.tensor(mask)})
    for a, k in zip(ours.get_weights(), theirs.get_weights()):
        _close(a, np.asarray(k))


def test_batch_normalization_weights_and_trainable():
    layer = layers.BatchNormalization()
    layer.build((None, 3))
    assert [n for n, _, _ in layer.trainable_params] == ["gamma", "beta"]
    assert len(layer.non_trainable_weights) == 2
    layer.trainable = False  # Keras: a frozen layer normalizes with the moving statistics, even training
    x = _f32(5, 3)
    y, _ = layer.apply(x, training=True)
    _close(y, x / np.sqrt(1 + 1e-3))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pooling_matches_keras(data_format, keepdims):
    x = _f32(2, 4, 5)
    ours = layers.GlobalMaxPooling1D(data_format=data_format, keepdims=keepdims)
    theirs = keras.layers.GlobalMaxPooling1D(data_format=data_format, keepdims=keepdims)
    _compare(ours, theirs, x, _f32(*theirs.compute_output_shape(x.shape)))
    image = _f32(2, 3, 4, 5)
    ours = layers.GlobalAveragePooling2D(data_format=data_format, keepdims=keepdims)
    theirs = keras.layers.GlobalAveragePooling2D(data_format=data_format, keepdims=keepdims)
    _compare(ours, theirs, image, _f32(*theirs.compute_output_shape(image.shape)))


def test_global_max_pooling_mask_takes_real_steps_only():
    x = _f32(3, 4, 2)
    x[0, 3] = 100.0  # a padded step holding the largest value
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
    layer = layers.GlobalMaxPooling1D(dtype="float64")
    y = layer(x, mask=mask)
    _close(y[0], x[0, :3].max(axis=0))
    _close(y[1], x[1].max(axis=0))
    _close(y[2], np.zeros(2))  # a fully masked row pools to zeros
    _, cache = layer.apply(x, mask=mask, training=True)
    dx = layer.backprop(cache, np.ones((3, 2)))
    assert dx[0, 3].sum() == 0 and dx[2].sum() == 0 and dx[1].sum() == 2


@pytest.mark.parametrize("axes,shapes", [(1, [(3, 4), (3, 4)]), (-1, [(3, 2, 4), (3, 5, 4)]),
                                         ([2, 1], [(3, 2, 4), (3, 4, 5)]), ([1, 1], [(3, 4, 2), (3, 4)])])
@pytest.mark.parametrize("normalize", [False, True])
def test_dot_matches_keras(axes, shapes, normalize):
    xs = [_f32(*s) for s in shapes]
    ours, theirs = layers.Dot(axes, normalize=normalize), keras.layers.Dot(axes, normalize=normalize)
    out_shape = theirs.compute_output_shape(shapes)
    assert ours.compute_output_shape(shapes) == tuple(out_shape)
    _compare(ours, theirs, xs, _f32(*out_shape))


def test_permute_matches_keras():
    x = _f32(2, 3, 4, 5)
    _compare(layers.Permute((3, 1, 2)), keras.layers.Permute((3, 1, 2)), x, _f32(2, 5, 3, 4))


def test_time_distributed_matches_keras():
    x = _f32(2, 3, 4)
    ours = layers.TimeDistributed(layers.Dense(5, activation="tanh"))
    theirs = keras.layers.TimeDistributed(keras.layers.Dense(5, activation="tanh"))
    _compare(ours, theirs, x, _f32(2, 3, 5))
    assert [w.shape for w in ours.get_weights()] == [(4, 5), (5,)]


def test_time_distributed_conv_over_frames_matches_keras():
    frames = _f32(2, 3, 5, 6, 2)  # (batch, time, rows, cols, channels)
    ours = layers.TimeDistributed(layers.Conv2D(3, 2))
    theirs = keras.layers.TimeDistributed(keras.layers.Conv2D(3, 2))
    _compare(ours, theirs, frames, _f32(2, 3, 4, 5, 3))


def test_lambda_matches_keras():
    x = _f32(3, 4)
    ours = layers.Lambda(lambda t: ops.tanh(t) * t)
    theirs = keras.layers.Lambda(lambda t: keras.ops.tanh(t) * t)
    _compare(ours, theirs, x, _f32(3, 4))


# ------------------------------------------------------------------------ float64 gradient checks
def _numeric_check(layer, inputs, mask=None):
    rng = np.random.default_rng(0)
    kwargs = {} if mask is None else {"mask": mask}
    out, cache = layer.apply(inputs, training=True, **kwargs)
    dy = rng.standard_normal(np.shape(out))
    layer.zero_grad()
    dx = layer.backprop(cache, dy)
    xs = inputs if isinstance(inputs, list) else [inputs]
    dxs = dx if isinstance(inputs, list) else [dx]
    eps = 1e-6
    state = [w.copy() for w in layer.get_weights()]

    def loss():
        layer.set_weights(state)  # the moving statistics a training call moves
        return float((layer.apply(inputs, training=True, **kwargs)[0] * dy).sum())
    for x, d in zip(xs, dxs):
        numeric = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            keep = x[i]
            x[i] = keep + eps
            up = loss()
            x[i] = keep - eps
            down = loss()
            x[i] = keep
            numeric[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(d, numeric, atol=1e-7, rtol=1e-6)
    for name, p, g in layer.trainable_params:
        numeric = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            keep = p[i]
            p[i] = keep + eps
            state = [w.copy() for w in layer.get_weights()]
            up = loss()
            p[i] = keep - eps
            state = [w.copy() for w in layer.get_weights()]
            down = loss()
            p[i] = keep
            state = [w.copy() for w in layer.get_weights()]
            numeric[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(g, numeric, atol=1e-7, rtol=1e-6, err_msg=name)


F64_CASES = {
    "Conv1D causal dilated": (lambda: layers.Conv1D(2, 2, padding="causal", dilation_rate=2, activation="tanh",
                                                    dtype="float64"), lambda r: r.standard_normal((2, 5, 3)), True),
    "Conv1D same strided": (lambda: layers.Conv1D(2, 3, strides=2, padding="same", dtype="float64"),
                            lambda r: r.standard_normal((2, 6, 2)), True),
    "BatchNormalization": (lambda: layers.BatchNormalization(dtype="float64"),
                           lambda r: r.standard_normal((3, 4, 2)), False),
    "BatchNormalization masked": (lambda: layers.BatchNormalization(axis=1, dtype="float64"),
                                  lambda r: r.standard_normal((3, 4, 2)), True),
    "GlobalMaxPooling1D": (lambda: layers.GlobalMaxPooling1D(dtype="float64"), lambda r: r.standard_normal((2, 4, 3)),
                           True),
    "GlobalAveragePooling2D": (lambda: layers.GlobalAveragePooling2D(keepdims=True, dtype="float64"),
                               lambda r: r.standard_normal((2, 3, 2, 3)), False),
    "Dot normalized": (lambda: layers.Dot([2, 2], normalize=True, dtype="float64"),
                       lambda r: [r.standard_normal((2, 3, 4)), r.standard_normal((2, 5, 4))], False),
    "Permute": (lambda: layers.Permute((2, 3, 1), dtype="float64"), lambda r: r.standard_normal((2, 3, 4, 2)), False),
    "TimeDistributed": (lambda: layers.TimeDistributed(layers.Dense(2, activation="tanh", dtype="float64")),
                        lambda r: r.standard_normal((2, 3, 4)), False),
    "Lambda": (lambda: layers.Lambda(lambda t: ops.sum(ops.tanh(t) * t, axis=-1), dtype="float64"),
               lambda r: r.standard_normal((2, 3)), False),
}


@pytest.mark.parametrize("name", sorted(F64_CASES))
def test_float64_gradients(name):
    make, data, masked = F64_CASES[name]
    rng = np.random.default_rng(1)
    inputs = data(rng)
    mask = None
    if masked:
        first = inputs[0] if isinstance(inputs, list) else inputs
        mask = rng.random(first.shape[:2]) < 0.7
        mask[:, 0] = True
    _numeric_check(make(), inputs, mask)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("make,error,match", [
    (lambda: layers.Conv1D(2, 3, padding="full"), ValueError, "padding must be one of"),
    (lambda: layers.Conv1D(2, 3, strides=2, dilation_rate=2), ValueError, "one of them must be 1"),
    (lambda: layers.Conv1D(2, 3, data_format="channels_first"), ValueError, "channels_last"),
    (lambda: layers.Conv1D(2, 0), ValueError, "kernel_size must be positive"),
    (lambda: layers.BatchNormalization(axis="x"), TypeError, "axis must be an integer"),
    (lambda: layers.BatchNormalization(axis=[1, 2]), TypeError, "axis must be an integer"),
    (lambda: layers.BatchNormalization(momentum=2), ValueError, "momentum must be in"),
    (lambda: layers.Permute((0, 1)), ValueError, "Invalid permutation"),
    (lambda: layers.Dot([1, 2, 3]), ValueError, "a pair of integers"),
    (lambda: layers.Dot(1.5), TypeError, "axes must be"),
    (lambda: layers.TimeDistributed("dense"), TypeError, "expects an attnx layer"),
    (lambda: layers.Lambda(3), TypeError, "must be callable"),
    (lambda: layers.GlobalAveragePooling2D(data_format="nchw"), ValueError, "data_format"),
])
def test_bad_arguments_name_the_layer(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("layer,inputs,match", [
    (layers.Conv1D(2, 5), np.zeros((2, 3, 2), np.float32), "longer than the input"),
    (layers.BatchNormalization(axis=3), np.zeros((2, 3), np.float32), "out of range"),
    (layers.Dot(1), [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)], "do not match"),
    (layers.Dot(0), [np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)], "batch axis"),
    (layers.Permute((2, 1)), np.zeros((2, 3), np.float32), "permute inputs of rank 3"),
    (layers.TimeDistributed(layers.Dense(2)), np.zeros((2, 3), np.float32), "rank >= 3"),
    (layers.GlobalMaxPooling1D(), np.zeros((2, 3), np.float32), "expected rank 3"),
])
def test_bad_inputs_name_the_layer(layer, inputs, match):
    with pytest.raises(ValueError, match=match):
        layer(inputs)


def test_lambda_config_round_trip_and_safe_mode():
    layer = layers.Lambda(ops.square)
    assert layers.Lambda.from_config(layer.get_config()).function is ops.square
    lam = layers.Lambda(lambda t: t * 2)
    with pytest.raises(ValueError, match="safe_mode=False"):
        layers.Lambda.from_config(lam.get_config())
    again = layers.Lambda.from_config(lam.get_config(), safe_mode=False)
    _close(again(np.ones((2, 2), np.float32)), 2 * np.ones((2, 2)))
    scale = 3.0
    with pytest.raises(ValueError, match="enclosing function"):
        layers.Lambda(lambda t: t * scale).get_config()


# ------------------------------------------------------------------------------- Keras files
def test_keras_file_with_the_new_layers_loads_with_the_same_predictions(tmp_path):
    pytest.importorskip("h5py")
    from attnx.interop import from_keras, to_keras
    inp = keras.Input((10, 3))
    h = keras.layers.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu")(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Permute((2, 1))(h)
    h = keras.layers.Permute((2, 1))(h)
    a = keras.layers.GlobalMaxPooling1D()(h)
    b = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h))
    out = keras.layers.Dot(1, normalize=True)([a, b])
    model = keras.Model(inp, out)
    model.compile("adam", "mse")
    x = _f32(6, 10, 3)
    model.fit(x, _f32(6, 1), epochs=1, verbose=0)  # moving statistics away from their initial values
    model.save(tmp_path / "m.keras")
    ours = from_keras(tmp_path / "m.keras")
    _close(ours.predict(x), model.predict(x, verbose=0), atol=1e-5, rtol=1e-4)
    to_keras(ours, tmp_path / "back.keras")
    again = keras.saving.load_model(tmp_path / "back.keras")
    _close(again.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-5, rtol=1e-4)


def test_keras_file_with_global_average_pooling_2d(tmp_path):
    pytest.importorskip("h5py")
    from attnx.interop import from_keras
    inp = keras.Input((5, 6, 2))
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 2)(inp)))
    model = keras.Model(inp, out)
    model.save(tmp_path / "g.keras")
    x = _f32(2, 5, 6, 2)
    _close(from_keras(tmp_path / "g.keras").predict(x), model.predict(x, verbose=0), atol=1e-5, rtol=1e-4)
