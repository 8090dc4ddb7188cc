"""keras/src/layers/normalization/layer_normalization_test.py, ported: the same inputs, expected values and
tolerances. Adapted: `layer.gamma` / `layer.beta` are `layer.params["gamma"]` / `["beta"]`.
Not ported: test_large_value_within_autocast_scope (float16 autocast; attnx computes in float32/64)."""
import numpy as np
import pytest

from attnx import layers, regularizers
from _keras_testing import assert_all_close, run_layer_test


@pytest.mark.parametrize("init_kwargs, input_shape, trainable, losses", [
    ({"gamma_regularizer": regularizers.L2(0.01), "beta_regularizer": regularizers.L2(0.01)}, (3, 4, 2), 2, 2),
    ({"gamma_initializer": "ones", "beta_initializer": "ones"}, (3, 4, 2), 2, 0),
    ({"scale": False, "center": False}, (3, 3), 0, 0),
    ({"rms_scaling": True}, (3, 3), 1, 0),
    ({"axis": (-3, -2, -1)}, (2, 8, 8, 3), 2, 0),
    ({}, (1, 0, 10), 2, 0),
])
def test_ln_basics(init_kwargs, input_shape, trainable, losses):
    layer = run_layer_test(layers.LayerNormalization, init_kwargs=init_kwargs, input_shape=input_shape,
                           expected_output_shape=input_shape, expected_num_trainable_weights=trainable,
                           expected_num_non_trainable_weights=0, expected_num_seed_generators=0,
                           supports_masking=True)
    # Keras counts one loss per regularized weight; attnx's `losses` is their sum as one float
    assert (len(layer.losses) > 0) == (losses > 0)
    if losses:
        p = layer.params
        assert_all_close(layer.losses[0], 0.01 * (np.sum(p["gamma"] ** 2) + np.sum(p["beta"] ** 2)), rtol=1e-5)


def test_invalid_axis():
    with pytest.raises(TypeError, match="Expected an int or a list/tuple of ints for the argument 'axis'"):
        layers.LayerNormalization(axis={"axis": -1})


def test_correctness():
    layer = layers.LayerNormalization(dtype="float32")
    layer.build((2, 2, 2))
    layer.built = True
    inputs = np.random.normal(loc=5.0, scale=10.0, size=(1000, 2, 2, 2)).astype("float32")
    out = layer(inputs)
    out = (out - layer.params["beta"]) / layer.params["gamma"]
    assert_all_close(np.mean(out), 0.0, atol=1e-1)
    assert_all_close(np.std(out), 1.0, atol=1e-1)


def test_output():
    layer = layers.LayerNormalization(dtype="float32", beta_initializer="ones", gamma_initializer="ones")
    inputs = np.arange(5).astype("float32")[None, :]
    assert_all_close(layer(inputs), [[-0.41386, 0.29307, 1.0, 1.70693, 2.41386]], atol=1e-6, rtol=1e-6)


def test_output_with_rms_scaling():
    layer = layers.LayerNormalization(dtype="float32", rms_scaling=True, gamma_initializer="ones")
    inputs = np.arange(5).astype("float32")[None, :]
    assert_all_close(layer(inputs), [[0.0, 0.70693, 1.41386, 2.12079, 2.82772]], atol=1e-6, rtol=1e-6)


def test_unsorted_axis():
    x = np.random.randn(2, 3, 4).astype("float32")
    out_sorted = layers.LayerNormalization(axis=[-2, -1])(x)
    out_unsorted = layers.LayerNormalization(axis=[-1, -2])(x)
    assert out_sorted.shape == (2, 3, 4)
    assert out_unsorted.shape == (2, 3, 4)
    assert_all_close(out_sorted, out_unsorted)


def test_attnx_gradients_of_the_new_options():
    # float64 central differences (attnx.testing.gradcheck) for rms_scaling and several axes
    from attnx.testing import gradcheck
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    gradcheck(layers.LayerNormalization(rms_scaling=True, gamma_initializer="glorot_uniform", dtype="float64"), x)
    gradcheck(layers.LayerNormalization(axis=(-2, -1), beta_initializer="glorot_uniform",
                                        gamma_initializer="glorot_uniform", dtype="float64"), x)
