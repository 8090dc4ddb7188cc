"""keras/src/layers/normalization/batch_normalization_test.py, ported: the same data, arguments and
expectations. Masks are given as `mask=` (Keras attaches Masking's to its eager output; attnx passes it in
a graph). Not ported: test_input_fully_masked (a (batch,) float mask of 2-D inputs: attnx's mask rule
takes (batch, steps) bool masks), synchronized, renorm, autocast / float16 and the jit cases."""
import numpy as np
import pytest

import attnx
from attnx import layers
from _keras_testing import assert_all_close, assert_not_all_close, run_layer_test


@pytest.mark.parametrize("kwargs, input_shape, losses, trainable", [
    ({"center": True, "scale": True}, (2, 3), 0, 2),
    ({"center": False, "scale": False}, (2, 3), 0, 0),
    ({"center": True, "scale": True, "beta_regularizer": "l2", "gamma_regularizer": "l2"}, (2, 4, 4, 3), 2, 2),
])
def test_bn_basics(kwargs, input_shape, losses, trainable):
    run_layer_test(layers.BatchNormalization, init_kwargs=kwargs, call_kwargs={"training": True},
                   input_shape=input_shape, expected_output_shape=input_shape,
                   expected_num_trainable_weights=trainable, expected_num_non_trainable_weights=2,
                   expected_num_losses=losses, supports_masking=True)


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("input_shape", [(5, 2, 3), (5, 3, 3, 2)])
@pytest.mark.parametrize("moving_mean_initializer", ["zeros", "ones"])
@pytest.mark.parametrize("moving_variance_initializer", ["zeros", "ones"])
def test_correctness(axis, input_shape, moving_mean_initializer, moving_variance_initializer):
    layer = layers.BatchNormalization(axis=axis, momentum=0, moving_mean_initializer=moving_mean_initializer,
                                      moving_variance_initializer=moving_variance_initializer)
    x = np.random.normal(loc=5.0, scale=10.0, size=input_shape)
    out = x
    for _ in range(3):
        out = layer(out, training=True)
    broadcast_shape = [1] * len(input_shape)
    broadcast_shape[axis] = input_shape[axis]
    out = (out - np.reshape(layer.params["beta"], broadcast_shape)) / np.reshape(layer.params["gamma"],
                                                                                  broadcast_shape)
    reduction_axes = list(range(len(input_shape)))
    del reduction_axes[axis]
    reduction_axes = tuple(reduction_axes)
    assert_all_close(np.mean(out, axis=reduction_axes), 0.0, atol=1e-3)
    assert_all_close(np.std(out, axis=reduction_axes), 1.0, atol=1e-3)
    assert_all_close(layer.params["moving_mean"], 0.0, atol=1e-3)
    assert_all_close(layer.params["moving_variance"], 1.0, atol=1e-3)
    inference_out = layer(x, training=False)
    training_out = layer(x, training=True)
    assert_not_all_close(inference_out, training_out)
    training_out = layer(x, training=True)
    inference_out = layer(x, training=False)
    assert_all_close(inference_out, training_out)
    # masked result with no training does not differ
    x[:, 1, :] = 0.0
    mask = np.any(x != 0, axis=tuple(range(2, x.ndim)))
    assert_all_close(layer(x, training=False), layer(x, mask=mask, training=False))
    # masked result differs from unmasked in training
    assert_not_all_close(layer(x, training=False), layer(x, mask=mask, training=True))


@pytest.mark.parametrize("mask_value", [0.0, 0.1, 1])
def test_bachnorm_ignore_masked_values(mask_value):
    padded_data = np.array([[[1, 5], [2, 5], [mask_value, mask_value], [mask_value, mask_value]]
                            for _ in range(10)], dtype="float32")
    inputs = attnx.Input((None, 2))
    masked = layers.Masking(mask_value=mask_value)(inputs)
    norm = layers.BatchNormalization(momentum=0.0)
    model = attnx.Model(inputs, norm(masked))
    model.compile("rmsprop", loss="mse")
    model.fit(x=padded_data, y=padded_data, batch_size=10, epochs=5, verbose=0)
    assert_all_close(norm.params["moving_mean"], [1.5, 5.0])
    assert_all_close(norm.params["moving_variance"], [0.25, 0.0])


def test_trainable_behavior():
    layer = layers.BatchNormalization(axis=-1, momentum=0.8, epsilon=1e-7)
    layer.build((1, 4, 4, 3))
    layer.built = True
    layer.trainable = False
    assert len(layer.weights) == 4 and len(layer.trainable_weights) == 0 and len(layer.non_trainable_weights) == 4
    x = np.random.normal(loc=5.0, scale=10.0, size=(200, 4, 4, 3))
    assert_all_close(layer(x, training=True), x)
    layer.trainable = True
    assert len(layer.weights) == 4 and len(layer.trainable_weights) == 2 and len(layer.non_trainable_weights) == 2
    for _ in range(10):
        out = layer(x, training=True)
    out = (out - layer.params["beta"].reshape(1, 1, 1, 3)) / layer.params["gamma"].reshape(1, 1, 1, 3)
    assert_all_close(np.mean(out, axis=(0, 1, 2)), 0.0, atol=1e-3)
    assert_all_close(np.std(out, axis=(0, 1, 2)), 1.0, atol=1e-3)
