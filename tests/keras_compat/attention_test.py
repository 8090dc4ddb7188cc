"""keras/src/layers/attention/attention_test.py, ported: the same inputs, expected values and tolerances.

Adapted: Keras' private helpers `_calculate_scores` and `_calculate_score_mask` are asserted through
the call (the weights the layer returns), the scalar `scale` read from `layer.params`."""
import numpy as np
import pytest

import attnx
from attnx import layers
from _keras_testing import assert_all_close, assert_not_all_close, run_layer_test


def test_attention_basics():
    run_layer_test(layers.Attention, init_kwargs={"score_mode": "dot", "dropout": 0.5},
                   input_shape=[(2, 3, 4), (2, 4, 4)], expected_output_shape=(2, 3, 4),
                   expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                   expected_num_seed_generators=1, expected_num_losses=0, supports_masking=True)
    run_layer_test(layers.Attention, init_kwargs={"use_scale": True, "score_mode": "concat", "dropout": 0.5},
                   input_shape=[(2, 3, 4), (2, 4, 4)], expected_output_shape=(2, 3, 4),
                   expected_num_trainable_weights=2, expected_num_non_trainable_weights=0,
                   expected_num_seed_generators=1, expected_num_losses=0, supports_masking=True)


def test_attention_seed_preserved_in_config():
    layer = layers.Attention(dropout=0.5, seed=1337)
    config = layer.get_config()
    assert config["seed"] == 1337
    restored = layers.Attention.from_config(config)
    assert restored.seed == 1337


def test_attention_correctness():
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    key = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    value = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    layer = layers.Attention(score_mode="dot")
    output, scores = layer([query, value, key], return_attention_scores=True)
    assert_all_close(output, [[[2.462, 3.462], [1.538, 2.538]]], atol=1e-3)
    assert_all_close(scores, [[[0.269, 0.731], [0.731, 0.269]]], atol=1e-3)
    layer = layers.Attention(score_mode="concat")
    output, scores = layer([query, value, key], return_attention_scores=True)
    assert_all_close(output, [[[1.727, 2.727], [2.272, 3.272]]], atol=1e-3)
    assert_all_close(scores, [[[0.636, 0.363], [0.363, 0.636]]], atol=1e-3)


def test_attention_with_mask():
    layer = layers.Attention()
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    value = np.array([[[1.0, 1.0], [1.0, 1.0]]])
    query_mask = np.array([[True, False]])
    value_mask = np.array([[True, False]])
    output, scores = layer([query, value], mask=[query_mask, value_mask], return_attention_scores=True)
    assert_all_close(output, [[[1.0, 1.0], [0.0, 0.0]]])
    assert_all_close(scores, [[[1.0, 0.0], [1.0, 0.0]]])


def test_attention_2D_mask_shape_mismatch():
    layer = layers.Attention()
    batch_size, Tq, Tv, dim = 2, 3, 4, 5
    query = np.random.random((batch_size, Tq, dim)).astype(np.float32)
    value = np.random.random((batch_size, Tv, dim)).astype(np.float32)
    query_mask = np.array([[True, False, True], [True, False, True]])
    value_mask = np.array([[True, False, True, True], [True, False, True, True]])
    output, scores = layer([query, value], mask=[query_mask, value_mask], return_attention_scores=True)
    assert output.shape == (batch_size, Tq, dim)
    assert scores.shape == (batch_size, Tq, Tv)


def test_attention_errors():
    layer = layers.Attention()
    tensor = np.array([[[1.0, 1.0], [1.0, 1.0]]])
    with pytest.raises(ValueError, match="must be called on a list"):
        layer(tensor)
    with pytest.raises(ValueError, match="length 2 or 3"):
        layer([tensor, tensor, tensor, tensor])
    with pytest.raises(ValueError, match="layer mask must be a list"):
        layer([tensor, tensor], mask=tensor)
    with pytest.raises(ValueError, match="length 2 or 3"):
        layer([tensor, tensor], mask=[tensor])


def test_attention_with_dropout():
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    value = np.array([[[1.0, 1.0], [1.0, 1.0]]])
    layer_with_dropout = layers.Attention(dropout=0.2)
    layer_without_dropout = layers.Attention()
    output1, scores1 = layer_with_dropout([query, value], return_attention_scores=True, training=True)
    output2, scores2 = layer_without_dropout([query, value], return_attention_scores=True, training=True)
    assert_not_all_close(output1, output2)
    assert_not_all_close(scores1, scores2)


def test_attention_invalid_score_mode():
    with pytest.raises(ValueError, match="Invalid value for argument score_mode. Expected one of {'dot', 'concat'}"):
        layers.Attention(score_mode="invalid_mode")


def test_attention_calculate_scores_with_scale():
    # Keras reads layer._calculate_scores(query, key); here the scores are the log of the weights up to a
    # per-row constant: softmax(scale * q.k^T)
    query = np.random.random((2, 3, 4))
    key = np.random.random((2, 4, 4))
    layer = layers.Attention(use_scale=True, score_mode="dot", dtype="float64")
    layer.build([(2, 3, 4), (2, 4, 4)])
    layer.built = True
    layer.params["scale"][0] = 1.7
    expected_scores = np.matmul(query, key.transpose((0, 2, 1))) * layer.params["scale"][0]
    expected = np.exp(expected_scores) / np.exp(expected_scores).sum(-1, keepdims=True)
    _, weights = layer([query, key], return_attention_scores=True)
    assert_all_close(weights, expected)


def test_attention_calculate_score_mask_no_causal_no_vmask():
    scores_shape = (2, 3, 4)
    layer = layers.Attention()
    q, v = np.random.random(scores_shape[:2] + (2,)), np.random.random((2, 4, 2))
    _, weights = layer([q, v], return_attention_scores=True)
    assert np.all(weights > 0)  # no mask: every position has weight


def test_attention_calculate_score_mask_with_causal_no_vmask():
    layer = layers.Attention()
    q, v = np.random.random((2, 3, 2)), np.random.random((2, 4, 2))
    _, weights = layer([q, v], return_attention_scores=True, use_causal_mask=True)
    expected_causal_mask = np.tril(np.ones((1, 3, 4)), k=0)
    assert_all_close(weights > 0, np.broadcast_to(expected_causal_mask, weights.shape), atol=1e-6)


def test_attention_calculate_score_mask_with_causal_and_vmask():
    layer = layers.Attention()
    q, v = np.random.random((2, 3, 2)), np.random.random((2, 4, 2))
    v_mask = np.array([[True, False, True, False]])
    _, weights = layer([q, v], mask=[None, np.repeat(v_mask, 2, axis=0)], return_attention_scores=True,
                       use_causal_mask=True)
    expected_causal_mask = np.tril(np.ones((1, 3, 4)), k=0)
    expected_combined_mask = np.logical_and(expected_causal_mask, v_mask[:, np.newaxis, :])
    assert_all_close(weights > 0, np.broadcast_to(expected_combined_mask, weights.shape), atol=1e-6)


def _dummy():
    return [np.random.random((2, 3, 4)), np.random.random((2, 4, 4))]


def test_attention_compute_mask_with_no_mask():
    assert layers.Attention().compute_mask(inputs=_dummy(), mask=None) is None


def test_attention_compute_mask_with_first_element_none():
    mask = [None, np.array([True, False, True])]
    assert layers.Attention().compute_mask(inputs=_dummy(), mask=mask) is None


def test_attention_compute_mask_does_not_return_none_with_valid_mask():
    mask = [np.array([True, False, True]), np.array([False, True, False])]
    assert layers.Attention().compute_mask(inputs=_dummy(), mask=mask) is not None


def test_attention_compute_mask_returns_correct_tensor_with_valid_mask():
    valid_mask = np.array([True, False, True])
    computed = layers.Attention().compute_mask(inputs=_dummy(), mask=[valid_mask, np.array([False, True, False])])
    assert np.array_equal(computed, valid_mask)


def test_attention_compute_mask_returns_correct_tensor_with_all_true_mask():
    valid_mask = np.array([True, True, True])
    computed = layers.Attention().compute_mask(inputs=[np.ones((2, 3, 4)), np.ones((2, 4, 4))],
                                               mask=[valid_mask, np.array([True, True, True])])
    assert np.array_equal(computed, np.array([True, True, True]))


def test_attention_compute_mask_returns_correct_tensor_with_all_false_mask():
    valid_mask = np.array([False, False, False])
    computed = layers.Attention().compute_mask(inputs=[np.ones((2, 3, 4)), np.ones((2, 4, 4))],
                                               mask=[valid_mask, np.array([False, False, False])])
    assert np.array_equal(computed, np.array([False, False, False]))


@pytest.mark.parametrize("atol", [1e-3, 1e-5, 1e-7])
def test_attention_compute_mask_with_tolerance(atol):
    valid_mask = np.array([1.0, 0.0, 1.0], dtype=float)
    computed = layers.Attention().compute_mask(inputs=[np.ones((2, 3, 4)), np.ones((2, 4, 4))],
                                               mask=[valid_mask, np.array([0.0, 1.0, 0.0], dtype=float)])
    assert np.allclose(computed, valid_mask, atol=atol)


def test_attention_compute_mask_with_single_element_masks():
    computed = layers.Attention().compute_mask(inputs=[np.ones((2, 3, 4)), np.ones((2, 4, 4))],
                                               mask=[np.array([True]), np.array([False])])
    assert computed.shape == (1,)


def test_attention_compute_mask_with_non_boolean_masks():
    valid_mask = np.array([1, 0, 1])
    computed = layers.Attention().compute_mask(inputs=[np.ones((2, 3, 4)), np.ones((2, 4, 4))],
                                               mask=[valid_mask, np.array([0, 1, 0])])
    assert np.array_equal(computed, valid_mask)


def test_attention_compute_mask_with_edge_case_masks():
    layer = layers.Attention()
    for mask in [np.array([True, True, True]), np.array([False, False, False]), np.array([True, False, True])]:
        computed = layer.compute_mask(inputs=[np.ones((2, 3, 4)), np.ones((2, 4, 4))], mask=[mask, mask])
        assert np.array_equal(computed, mask)


def test_attention_compute_mask_with_different_input_shapes():
    layer = layers.Attention()
    valid_mask = np.array([True, False, True])
    for shape in [(2, 3, 4), (3, 2, 5), (4, 1, 6)]:
        computed = layer.compute_mask(inputs=[np.ones(shape), np.ones(shape)],
                                      mask=[valid_mask, np.array([False, True, False])])
        assert np.array_equal(computed, valid_mask)


def test_attention_compute_output_shape():
    query = np.random.random((2, 3, 4))
    value = np.random.random((2, 3, 5))
    key = np.random.random((2, 3, 4))
    layer = layers.Attention()
    output = layer([query, value, key])
    assert output.shape == value.shape
    assert layer.compute_output_shape(input_shape=[query.shape, value.shape, key.shape]) == output.shape


def test_attention_nd_inputs():
    layer = layers.Attention()
    query = np.random.random((2, 8, 6, 4)).astype(np.float32)
    value = np.random.random((2, 8, 6, 4)).astype(np.float32)
    output = layer([query, value])
    assert output.shape == (2, 8, 6, 4)
    output, scores = layer([query, value], return_attention_scores=True)
    assert output.shape == (2, 8, 6, 4)
    assert scores.shape == (2, 8, 6, 6)


def test_return_attention_scores_true():
    query = np.random.random((2, 8, 16)).astype(np.float32)
    value = np.random.random((2, 4, 16)).astype(np.float32)
    output, attention_scores = layers.Attention()([query, value], return_attention_scores=True)
    assert output.shape == (2, 8, 16)
    assert attention_scores.shape == (2, 8, 4)


def test_return_attention_scores_true_and_tuple():
    query = np.random.random((2, 8, 16)).astype(np.float32)
    value = np.random.random((2, 4, 16)).astype(np.float32)
    outputs = layers.Attention()([query, value], return_attention_scores=True)
    assert isinstance(outputs, tuple), "Expected the outputs to be a tuple"


def test_return_attention_scores_true_tuple_then_unpack():
    query = np.random.random((2, 8, 16)).astype(np.float32)
    value = np.random.random((2, 4, 16)).astype(np.float32)
    output, attention_scores = layers.Attention()([query, value], return_attention_scores=True)
    assert output.shape == (2, 8, 16)
    assert attention_scores.shape == (2, 8, 4)


def test_return_attention_scores_with_symbolic_tensors():
    attention = layers.Attention()
    x = attnx.Input(shape=(3, 5))
    y = attnx.Input(shape=(4, 5))
    output, attention_scores = attention([x, y], return_attention_scores=True)
    assert output.shape == (None, 3, 5)
    assert attention_scores.shape == (None, 3, 4)


def test_symbolic_call_does_not_leak_return_attention_scores():
    attention = layers.Attention()
    attention([np.random.rand(2, 3, 5).astype("float32"), np.random.rand(2, 4, 5).astype("float32")],
              return_attention_scores=True)
    x = attnx.Input(shape=(3, 5))
    y = attnx.Input(shape=(4, 5))
    output = attention([x, y])
    assert not isinstance(output, (tuple, list))
    assert output.shape == (None, 3, 5)
    assert attention.compute_output_shape([x.shape, y.shape]) == (None, 3, 5)


def test_attnx_weights_returned_are_after_dropout():
    # Keras returns the weights after dropout: the context is exactly those weights times the value
    rng = np.random.default_rng(3)
    query, value = rng.random((2, 5, 4)), rng.random((2, 7, 4))
    layer = layers.Attention(dropout=0.5, seed=7, dtype="float64")
    output, weights = layer([query, value], return_attention_scores=True, training=True)
    assert np.any(weights == 0.0)
    assert_all_close(output, weights @ value, atol=1e-12)


def test_attnx_gradients_of_the_concat_score_mode():
    # float64 central differences for Keras' concat score, with its scale and concat_score_weight
    from attnx.testing import gradcheck
    rng = np.random.default_rng(0)
    layer = layers.Attention(use_scale=True, score_mode="concat", dtype="float64")
    layer.build([(2, 3, 4), (2, 5, 4)])
    layer.built = True
    layer.params["scale"][0], layer.params["concat_score_weight"][0] = 0.7, 1.3
    gradcheck(layer, [rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))])
