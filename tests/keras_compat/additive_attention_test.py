"""keras/src/layers/attention/additive_attention_test.py, ported: the same inputs, expected values and
tolerances. attnx's AdditiveAttention is Keras' (no projections); the Bahdanau form with W1, W2 and v is
`BahdanauAdditiveAttention`."""
import numpy as np
import pytest

from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


def test_attention_basics():
    run_layer_test(layers.AdditiveAttention, init_kwargs={"use_scale": True, "dropout": 0.5},
                   input_shape=[(2, 3, 4), (2, 4, 4)], expected_output_shape=(2, 3, 4),
                   expected_num_trainable_weights=1, expected_num_non_trainable_weights=0,
                   expected_num_seed_generators=1, expected_num_losses=0, supports_masking=True)
    run_layer_test(layers.AdditiveAttention, init_kwargs={"use_scale": False, "dropout": 0.5},
                   input_shape=[(2, 3, 4), (2, 4, 4)], expected_output_shape=(2, 3, 4),
                   expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                   expected_num_seed_generators=1, expected_num_losses=0, supports_masking=True)


def test_attention_correctness():
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    key = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    value = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    layer = layers.AdditiveAttention(use_scale=False)
    output, scores = layer([query, value, key], return_attention_scores=True)
    assert_all_close(output, [[[1.727, 2.727], [2.272, 3.272]]], atol=1e-3)
    assert_all_close(scores, [[[0.636, 0.363], [0.363, 0.636]]], atol=1e-3)


def test_attention_with_mask():
    layer = layers.AdditiveAttention(use_scale=False)
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    value = np.array([[[1.0, 1.0], [1.0, 1.0]]])
    query_mask = np.array([[True, False]])
    value_mask = np.array([[True, False]])
    output, scores = layer([query, value], mask=[query_mask, value_mask], return_attention_scores=True)
    assert_all_close(output, [[[1.0, 1.0], [0.0, 0.0]]])
    assert_all_close(scores, [[[1.0, 0.0], [1.0, 0.0]]])


def test_attention_errors():
    layer = layers.AdditiveAttention()
    tensor = np.array([[[1.0, 1.0], [1.0, 1.0]]])
    with pytest.raises(ValueError, match="must be called on a list"):
        layer(tensor)
    with pytest.raises(ValueError, match="length 2 or 3"):
        layer([tensor, tensor, tensor, tensor])
    with pytest.raises(ValueError, match="layer mask must be a list"):
        layer([tensor, tensor], mask=tensor)
    with pytest.raises(ValueError, match="length 2 or 3"):
        layer([tensor, tensor], mask=[tensor])
