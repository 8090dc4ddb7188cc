"""ONNX export of the layers of issue 41 (BatchNormalization, Conv1D, GlobalMaxPooling1D,
GlobalAveragePooling2D, Permute, Dot, TimeDistributed) against `predict`, run by ONNX Runtime, on every
option the converters take; Lambda's refusal names the layer. A layer loop checks each of the eight has a
converter or a named refusal."""
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import attnx  # noqa: E402
from attnx import export, layers  # noqa: E402

TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _check(model, batches, tmp_path):
    path = export.to_onnx(model, tmp_path / "model.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for batch in batches:
        arrays = batch if isinstance(batch, list) else [batch]
        (got,) = sess.run(None, dict(zip(names, arrays)))
        want = model.predict(batch, batch_size=len(arrays[0]), verbose=0)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, **TOLERANCE)


def _model(shape, *body, steps_open=False):
    inputs = attnx.Input((None,) + shape[1:] if steps_open else shape)
    x = inputs
    for layer in body:
        x = layer(x)
    return attnx.Model(inputs, x)


rng = np.random.default_rng(0)


@pytest.mark.parametrize("kwargs", [{}, {"center": False}, {"scale": False}, {"axis": 1}])
def test_batch_normalization(kwargs, tmp_path):
    bn = layers.BatchNormalization(**kwargs)
    model = _model((5, 4), bn)
    x = rng.standard_normal((16, 5, 4)).astype("float32")
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, x, epochs=1, batch_size=8, verbose=0)  # moving statistics away from 0 and 1
    for name, p in bn.params.items():
        p += rng.uniform(0.1, 0.5, p.shape).astype(p.dtype)  # gamma, beta, statistics all non-trivial
    _check(model, [x[:3], x[3:10]], tmp_path)


@pytest.mark.parametrize("kwargs", [{}, {"padding": "same"}, {"padding": "causal", "dilation_rate": 2},
                                    {"strides": 2, "padding": "same"}, {"groups": 2, "activation": "relu"},
                                    {"use_bias": False, "kernel_size": 1}])
@pytest.mark.parametrize("steps_open", [False, True])
def test_conv1d(kwargs, steps_open, tmp_path):
    kwargs = {"kernel_size": 3, **kwargs}
    model = _model((9, 4), layers.Conv1D(6, **kwargs), steps_open=steps_open)
    batches = [rng.standard_normal((2, 9, 4)).astype("float32")]
    if steps_open and kwargs.get("strides", 1) > 1 and kwargs.get("padding") == "same":
        with pytest.raises(export.UnsupportedLayerError, match="needs the number of steps fixed"):
            export.to_onnx(model, tmp_path / "m.onnx")
        return
    if steps_open:
        batches.append(rng.standard_normal((3, 12, 4)).astype("float32"))
    _check(model, batches, tmp_path)


def test_conv1d_and_max_pooling_with_a_mask(tmp_path):
    ids = attnx.Input((7,), dtype="int64")
    x = layers.Embedding(11, 4, mask_zero=True)(ids)
    x = layers.Conv1D(5, 3, padding="same")(x)
    pooled = layers.GlobalMaxPooling1D()(layers.Embedding(11, 5, mask_zero=True)(ids))
    model = attnx.Model(ids, layers.Concatenate()([layers.GlobalAveragePooling1D()(x), pooled]))
    batch = rng.integers(1, 11, (4, 7))
    batch[1, 3:] = 0
    batch[2, :] = 0  # a fully masked row pools to zeros
    _check(model, [batch], tmp_path)


@pytest.mark.parametrize("kwargs", [{}, {"keepdims": True}, {"data_format": "channels_first"}])
def test_global_max_pooling1d(kwargs, tmp_path):
    _check(_model((6, 3), layers.GlobalMaxPooling1D(**kwargs)), [rng.standard_normal((4, 6, 3)).astype("float32")],
           tmp_path)


@pytest.mark.parametrize("kwargs", [{}, {"keepdims": True}, {"data_format": "channels_first"}])
def test_global_average_pooling2d(kwargs, tmp_path):
    _check(_model((4, 5, 3), layers.GlobalAveragePooling2D(**kwargs)),
           [rng.standard_normal((2, 4, 5, 3)).astype("float32")], tmp_path)


@pytest.mark.parametrize("dims", [(2, 1), (3, 1, 2)])
def test_permute(dims, tmp_path):
    shape = (4, 5) if len(dims) == 2 else (4, 5, 3)
    _check(_model(shape, layers.Permute(dims)), [rng.standard_normal((2,) + shape).astype("float32")], tmp_path)


@pytest.mark.parametrize("shapes, axes, normalize", [(((6,), (6,)), 1, False), (((6,), (6,)), -1, True),
                                                     (((3, 4), (5, 4)), (2, 2), False),
                                                     (((3, 4), (3, 5)), (1, 1), True),
                                                     (((4, 3), (4,)), (1, 1), False),
                                                     (((4,), (4, 3)), (1, 1), False)])
def test_dot(shapes, axes, normalize, tmp_path):
    a, b = attnx.Input(shapes[0]), attnx.Input(shapes[1])
    model = attnx.Model([a, b], layers.Dot(axes, normalize=normalize)([a, b]))
    batch = [rng.standard_normal((3,) + s).astype("float32") for s in shapes]
    _check(model, [batch], tmp_path)


@pytest.mark.parametrize("inner", [lambda: layers.Dense(3, activation="tanh"),
                                   lambda: layers.Conv1D(2, 2, padding="same")])
def test_time_distributed(inner, tmp_path):
    shape = (5, 4) if isinstance(inner(), layers.Dense) else (5, 6, 4)
    model = _model(shape, layers.TimeDistributed(inner()))
    _check(model, [rng.standard_normal((2,) + shape).astype("float32"),
                   rng.standard_normal((3,) + shape).astype("float32")], tmp_path)


def test_lambda_is_refused_by_name(tmp_path):
    model = _model((4,), layers.Lambda(lambda x: x * 2, name="doubling"))
    with pytest.raises(export.UnsupportedLayerError, match="'doubling' \\(Lambda\\)"):
        export.to_onnx(model, tmp_path / "m.onnx")


def test_every_new_layer_has_a_converter_or_a_named_refusal():
    from attnx.export.registry import _CONVERTERS
    new = [layers.TimeDistributed, layers.BatchNormalization, layers.Conv1D, layers.GlobalMaxPooling1D,
           layers.GlobalAveragePooling2D, layers.Dot, layers.Permute]
    assert all(cls in _CONVERTERS for cls in new)
    assert layers.Lambda not in _CONVERTERS  # Python code: no ONNX form
