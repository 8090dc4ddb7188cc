"""keras/src/layers/merging/merging_test.py, ported (the Dot cases): the same inputs, NumPy reference,
expected shapes and tolerances. Not ported: the other merge layers' cases and the mask error messages
of Keras' Merge base class (attnx's Dot makes no mask, as Keras' Dot)."""
import numpy as np
import pytest

import attnx
from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


def np_dot(a, b, axes):
    if isinstance(axes, int):
        axes = (axes, axes)
    axes = [axis if axis < 0 else axis - 1 for axis in axes]
    res = np.stack([np.tensordot(a[i], b[i], axes) for i in range(a.shape[0])])
    if len(res.shape) == 1:
        res = np.expand_dims(res, axis=1)
    return res


CASES = [((2, 4), (2, 1)), ((2, 4, 5), (2, 4, 4))]


@pytest.mark.parametrize("input_shape, expected_output_shape", CASES)
def test_basic(input_shape, expected_output_shape):
    run_layer_test(layers.Dot, init_kwargs={"axes": -1}, input_shape=[input_shape, input_shape],
                   expected_output_shape=expected_output_shape, expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0, supports_masking=True)


@pytest.mark.parametrize("input_shape, expected_output_shape", CASES)
@pytest.mark.parametrize("static_batch", [True, False])
def test_correctness(input_shape, expected_output_shape, static_batch):
    x1, x2 = np.random.rand(*input_shape), np.random.rand(*input_shape)
    x3 = np_dot(x1, x2, -1)
    batch = input_shape[0] if static_batch else None
    input_1 = attnx.Input(input_shape[1:], batch_size=batch)
    input_2 = attnx.Input(input_shape[1:], batch_size=batch)
    layer = layers.Dot(axes=-1)
    model = attnx.Model([input_1, input_2], layer([input_1, input_2]))
    res = model([x1, x2])
    assert res.shape == expected_output_shape
    assert_all_close(res, x3, atol=1e-4)
    assert layer.compute_mask([x1, x2], [None, None]) is None


def test_dot_higher_dim():
    a_shape, b_shape = (1, 3, 2), (1, 1, 2, 3)
    a = attnx.Input(a_shape[1:], batch_size=1)
    b = attnx.Input(b_shape[1:], batch_size=1)
    assert layers.Dot(axes=(-2, -1))([a, b]).shape == (1, 2, 1, 2)
    c = layers.Dot(axes=(-2, -1))([np.random.random(a_shape), np.random.random(b_shape)])
    assert c.shape == (1, 2, 1, 2)
