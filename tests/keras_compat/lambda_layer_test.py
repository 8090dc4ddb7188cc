"""keras/src/layers/core/lambda_layer_test.py, ported: the same functions, shapes and expectations, written
with attnx.ops. Keras' `custom_objects` of the round trip: attnx keeps a function of attnx.ops by name, and
a lambda or local function as bytecode loaded with safe_mode=False only, as Keras."""
import numpy as np
import pytest

from attnx import layers, ops
from _keras_testing import assert_all_close, run_layer_test


def stacker(x):
    return ops.concatenate([x, x], axis=1)


def stacker_shape(s):
    return (s[0], s[1] * 2)


def _lambda_from_config(config):
    return layers.Lambda.from_config(config, safe_mode=False)


class _UnsafeLambda(layers.Lambda):
    """Lambda whose from_config loads bytecode (Keras' run_layer_test does the round trip with safe_mode off)."""

    @classmethod
    def from_config(cls, config, safe_mode=False):
        return super().from_config(config, safe_mode=safe_mode)


def test_lambda_basics():
    run_layer_test(layers.Lambda, init_kwargs={"function": ops.square}, input_shape=(2, 3),
                   expected_output_shape=(2, 3), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0, supports_masking=False)
    run_layer_test(layers.Lambda, init_kwargs={"function": ops.square, "mask": ops.ones((2, 3))},
                   input_shape=(2, 3, 4), expected_output_shape=(2, 3, 4), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0, supports_masking=True)
    run_layer_test(_UnsafeLambda, init_kwargs={"function": stacker, "output_shape": (6,)}, input_shape=(2, 3),
                   expected_output_shape=(2, 6), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0, supports_masking=False)
    run_layer_test(_UnsafeLambda, init_kwargs={"function": stacker, "output_shape": stacker_shape},
                   input_shape=(2, 3), expected_output_shape=(2, 6), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, expected_num_losses=0, supports_masking=False)


def test_correctness():
    layer = layers.Lambda(lambda x: x ** 2)
    output = layer(2 * np.ones((2, 3)))
    assert_all_close(4 * np.ones((2, 3)), output)
    layer = layers.Lambda.from_config(layer.get_config(), safe_mode=False)
    assert_all_close(4 * np.ones((2, 3)), layer(2 * np.ones((2, 3))))


def test_from_config_fails_closed_without_safe_mode_scope():
    config = layers.Lambda(lambda x: x ** 2).get_config()
    with pytest.raises(ValueError, match="Lambda"):
        layers.Lambda.from_config(config)


def test_correctness_lambda_shape():
    layer = layers.Lambda(lambda x: x ** 2, output_shape=lambda x: x)
    assert_all_close(4 * np.ones((2, 3)), layer(2 * np.ones((2, 3))))
    layer = layers.Lambda.from_config(layer.get_config(), safe_mode=False)
    assert_all_close(4 * np.ones((2, 3)), layer(2 * np.ones((2, 3))))
