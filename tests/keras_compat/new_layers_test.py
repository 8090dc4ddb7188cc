"""Layers a Keras user reaches for in a first hour (Masking, RepeatVector, Multiply, SpatialDropout1D),
against Keras 3 itself (PyTorch backend): a Keras model loaded with `from_keras` predicts what Keras
predicts, masks included; gradients by float64 central differences (attnx.testing.gradcheck)."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported

from attnx import layers  # noqa: E402
from attnx.interop import from_keras, to_keras  # noqa: E402
from attnx.testing import gradcheck  # noqa: E402
from _keras_testing import assert_all_close  # noqa: E402

keras = pytest.importorskip("keras")


def _keras_model():
    keras.utils.set_random_seed(0)
    x = keras.Input((5, 3))
    masked = keras.layers.Masking(0.0)(x)
    h = keras.layers.SpatialDropout1D(0.3)(masked)
    h = keras.layers.LSTM(4, return_sequences=True)(h)  # the mask reaches the LSTM
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    repeated = keras.layers.RepeatVector(2)(pooled)
    product = keras.layers.Multiply()([repeated, repeated])
    return keras.Model(x, keras.layers.Flatten()(product))


def test_keras_model_with_masking_repeat_multiply_loads_and_predicts_alike(tmp_path):
    keras_model = _keras_model()
    keras_model.save(tmp_path / "m.keras")
    model = from_keras(tmp_path / "m.keras")
    x = np.random.default_rng(0).standard_normal((3, 5, 3)).astype("float32")
    x[0, 3:] = 0.0  # masked steps
    x[2, :2] = 0.0
    assert_all_close(model.predict(x, verbose=0), keras.ops.convert_to_numpy(keras_model(x)), atol=1e-5, rtol=1e-5)
    back = to_keras(model)
    assert_all_close(keras.ops.convert_to_numpy(back(x)), model.predict(x, verbose=0), atol=1e-5, rtol=1e-5)


def test_masking_mask_and_outputs():
    x = np.array([[[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]])
    layer = layers.Masking()
    assert np.array_equal(layer.compute_mask(x), [[True, False, True]])
    assert_all_close(layer(x), x)
    layer = layers.Masking(mask_value=3.0)
    assert_all_close(layer(np.array([[[3.0, 3.0], [1.0, 3.0]]])), [[[0.0, 0.0], [1.0, 3.0]]])


@pytest.mark.parametrize("make, inputs", [
    (lambda: layers.Masking(dtype="float64"), lambda r: np.where(r.random((2, 4, 3)) > 0.3, r.standard_normal((2, 4, 3)), 0)),
    (lambda: layers.RepeatVector(3, dtype="float64"), lambda r: r.standard_normal((2, 4))),
    (lambda: layers.Multiply(dtype="float64"), lambda r: [r.standard_normal((2, 3)) for _ in range(3)]),
])
def test_gradients(make, inputs):
    gradcheck(make(), inputs(np.random.default_rng(0)))


def test_spatial_dropout_drops_whole_features():
    layer = layers.SpatialDropout1D(0.5, seed=3)
    y = layer(np.ones((4, 6, 8)), training=True)
    dropped = y == 0
    assert dropped.any() and (dropped == dropped[:, :1]).all()  # the same features at every step
    with pytest.raises(ValueError, match="rank 3"):
        layer(np.ones((4, 6)), training=True)


def test_to_categorical_matches_keras():
    import attnx
    for labels, n in (([0, 2, 1, 2], None), ([[1], [0], [3]], 5), (np.array([[0, 1], [2, 0]]), 3)):
        ours = attnx.utils.to_categorical(labels, n)
        theirs = keras.utils.to_categorical(np.asarray(labels), n)
        assert ours.shape == theirs.shape
        assert_all_close(ours, theirs)
    with pytest.raises(ValueError, match="out of range"):
        attnx.utils.to_categorical([3], 2)
