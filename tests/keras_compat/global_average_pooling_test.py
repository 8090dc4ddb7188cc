"""keras/src/layers/pooling/global_average_pooling_test.py, ported (the 1-D cases): the same inputs,
expected values and tolerances. Not ported: GlobalAveragePooling2D / 3D (attnx has no such layers yet)."""
import numpy as np
import pytest

from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


@pytest.mark.parametrize("data_format, keepdims, input_shape, output_shape", [
    ("channels_last", False, (3, 5, 4), (3, 4)),
    ("channels_last", True, (3, 5, 4), (3, 1, 4)),
    ("channels_first", False, (3, 5, 4), (3, 5)),
])
def test_global_average_pooling1d_basics(data_format, keepdims, input_shape, output_shape):
    run_layer_test(layers.GlobalAveragePooling1D, init_kwargs={"data_format": data_format, "keepdims": keepdims},
                   input_shape=input_shape, expected_output_shape=output_shape, expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0, supports_masking=True)


def np_gap1d(x, data_format, keepdims, mask=None):
    steps_axis = 1 if data_format == "channels_last" else 2
    if mask is not None:
        mask = np.expand_dims(mask, 2 if data_format == "channels_last" else 1)
        x = x * mask
        res = np.sum(x, axis=steps_axis) / np.sum(mask, axis=steps_axis)
    else:
        res = np.mean(x, axis=steps_axis)
    if keepdims:
        res = np.expand_dims(res, axis=steps_axis)
    return res


@pytest.mark.parametrize("data_format, keepdims", [("channels_last", False), ("channels_last", True),
                                                   ("channels_first", False), ("channels_first", True)])
def test_global_average_pooling1d_correctness(data_format, keepdims):
    inputs = np.arange(24, dtype="float32").reshape((2, 3, 4))
    layer = layers.GlobalAveragePooling1D(data_format=data_format, keepdims=keepdims)
    assert_all_close(layer(inputs), np_gap1d(inputs, data_format, keepdims))
    if data_format == "channels_last":
        mask = np.array([[1, 1, 0], [0, 1, 0]], dtype="int32")
    else:
        mask = np.array([[1, 1, 0, 0], [0, 1, 0, 1]], dtype="int32")
    assert_all_close(layer(inputs, mask), np_gap1d(inputs, data_format, keepdims, mask))


@pytest.mark.parametrize("data_format, keepdims", [("channels_first", True), ("channels_last", True)])
def test_attnx_gradient_with_options(data_format, keepdims):
    # float64 central differences of the pooled sum against backprop
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    mask = np.array([[1, 1, 0, 0], [0, 1, 0, 1]]) if data_format == "channels_first" else np.array([[1, 1, 0],
                                                                                                   [0, 1, 1]])
    layer = layers.GlobalAveragePooling1D(data_format=data_format, keepdims=keepdims, dtype="float64")
    out, cache = layer.apply(x, mask=mask, training=True)
    dy = rng.standard_normal(out.shape)
    dx = layer.backprop(cache, dy)
    eps, numeric = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        numeric[i] = ((layer.apply(xp, mask=mask)[0] - layer.apply(xm, mask=mask)[0]) * dy).sum() / (2 * eps)
    assert_all_close(dx, numeric, atol=1e-8)
