"""keras/src/layers/core/embedding_test.py, ported (the tests of masks, shapes and arguments): the same
inputs and expected values. Adapted: `layer.embeddings` is `layer.params["embeddings"]`; Keras'
`from_config` wraps the constructor's error in a TypeError, attnx's passes its ValueError on.
Not ported: sparse and ragged inputs, constraints, LoRA and quantization (attnx lacks them)."""
import numpy as np
import pytest

from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


def test_embedding_basics():
    run_layer_test(layers.Embedding, {"input_dim": 4, "output_dim": 3}, input_shape=(2,), input_dtype="int32",
                   expected_output_shape=(2, 3), expected_num_trainable_weights=1,
                   expected_num_non_trainable_weights=0, expected_num_seed_generators=0, expected_num_losses=0,
                   supports_masking=False)
    run_layer_test(layers.Embedding, {"input_dim": 5, "output_dim": 4, "mask_zero": True}, input_shape=(2, 3),
                   input_dtype="int64", expected_output_shape=(2, 3, 4), expected_num_trainable_weights=1,
                   expected_num_non_trainable_weights=0, expected_num_seed_generators=0, expected_num_losses=0,
                   supports_masking=True)


def test_correctness():
    layer = layers.Embedding(input_dim=3, output_dim=2)
    layer.build((None,))
    layer.built = True
    layer.params["embeddings"][:] = np.array([[0.0, 0.0], [2.0, 2.0], [3.0, 3.0]])
    out = layer(np.array([2, 1, 0]))
    assert_all_close(out, np.array([[3.0, 3.0], [2.0, 2.0], [0.0, 0.0]]))


def test_masking():
    layer = layers.Embedding(input_dim=3, output_dim=2, mask_zero=True)
    out = layer.compute_mask(np.array(([2, 1, 0])))
    assert_all_close(out, np.array([True, True, False]))


def test_compute_mask_no_masking():
    layer = layers.Embedding(input_dim=3, output_dim=2, mask_zero=False)
    assert layer.compute_mask(np.array([2, 1, 0])) is None


@pytest.mark.parametrize("arg", ["input_dim", "output_dim"])
def test_invalid_dims(arg):
    for bad_value in (3.7, 4.0, "3", None, True, False, -1, 0):
        with pytest.raises(ValueError, match=f"`{arg}` must be a positive integer"):
            layers.Embedding(**{"input_dim": 10, "output_dim": 8, arg: bad_value})
    with pytest.raises((TypeError, ValueError), match=f"`{arg}` must be a positive integer"):
        layers.Embedding.from_config({"input_dim": 10, "output_dim": 8, arg: 3.7})


def test_weights_constructor_arg():
    layer = layers.Embedding(3, 4, weights=np.ones((3, 4)))
    layer(np.array([0]))
    assert_all_close(layer.params["embeddings"], np.ones((3, 4)))
    layer = layers.Embedding(3, 4, weights=[np.ones((3, 4))])
    layer(np.array([0]))
    assert_all_close(layer.params["embeddings"], np.ones((3, 4)))
