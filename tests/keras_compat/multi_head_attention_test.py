"""keras/src/layers/attention/multi_head_attention_test.py, ported: the same inputs, expected values and
tolerances.

Adapted: Keras' eager tensors carry a mask (`_keras_mask`); attnx's arrays do not, so the mask tests run
the same layers in a functional model (where the masks propagate), and test_correctness runs in float32
(attnx computes in float32 or float64, not float16).
Adapted too: Keras' sublayers' kernels (`layer._query_dense.kernel`) are attnx's weights
(`layer.params["query_kernel"]`), and a weight's constraint is `attnx.constraints.constraint_of(weight)`.
Not ported (attnx lacks the feature): the masks of test_high_dim_attention's cases (attnx takes masks with
rank-3 inputs only; the Keras test passes none either), flash attention, sliding windows and the fused causal
fast path, LoRA, dtype policies, int8 quantization.
"""
import numpy as np
import pytest

import attnx
from attnx import layers
from _keras_testing import assert_all_close, run_layer_test


@pytest.mark.parametrize("init_kwargs, trainable, seeds", [
    ({"num_heads": 2, "key_dim": 2}, 8, 0),
    ({"num_heads": 2, "key_dim": 2, "value_dim": 4, "use_bias": False, "dropout": 0.5}, 4, 1),
    ({"num_heads": 2, "key_dim": 2, "use_gate": True}, 10, 0),
    ({"num_heads": 2, "key_dim": 2, "value_dim": 4, "use_bias": False, "dropout": 0.5, "use_gate": True}, 5, 1),
])
def test_basics(init_kwargs, trainable, seeds):
    run_layer_test(layers.MultiHeadAttention, init_kwargs=init_kwargs,
                   input_shape={"query_shape": (2, 8, 16), "value_shape": (2, 4, 16)},
                   expected_output_shape=(2, 8, 16), expected_num_trainable_weights=trainable,
                   expected_num_non_trainable_weights=0, expected_num_seed_generators=seeds,
                   expected_num_losses=0, supports_masking=True)


@pytest.mark.parametrize("query_dims, value_dims, key_dims, output_shape", [
    ((4, 8), (2, 8), None, None),
    ((4, 8), (2, 8), (2, 3), None),
    ((4, 8), (2, 8), None, (3, 4)),
    ((4, 8), (2, 8), (2, 3), (1, 5)),
    ((4, 2, 3, 8), (1, 1, 5, 8), (1, 1, 5, 2), None),
    ((4, 2, 3, 8), (1, 1, 5, 8), (1, 1, 5, 2), (3, 2)),
    ((4, 2, 3, 8), (4, 2, 3, 7), (4, 2, 3, 8), None),
], ids=["without_key_same_proj", "with_key_same_proj", "without_key_different_proj", "with_key_different_proj",
        "high_dim_same_proj", "high_dim_different_proj", "different_qv_last_dims"])
def test_compute_output_shape(query_dims, value_dims, key_dims, output_shape):
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=2, value_dim=2, output_shape=output_shape)
    batch_size = 7
    query_shape = (batch_size,) + query_dims
    value_shape = (batch_size,) + value_dims
    key_shape = (batch_size,) + key_dims if key_dims else None
    query = np.ones(query_shape)
    value = np.ones(value_shape)
    key = np.ones(key_shape) if key_shape else None
    output = layer(query=query, value=value, key=key)
    assert output.shape == layer.compute_output_shape(query_shape, value_shape, key_shape)
    assert output.shape == layer.compute_output_shape(list(query_shape), list(value_shape),
                                                      list(key_shape) if key_shape is not None else None)


@pytest.mark.parametrize("query_shape, value_shape, key_shape", [
    ((2, 4, 8), (2, 2, 7), (2,)),
    ((2, 4, 8), (2, 2, 8), (2, 1, 7)),
    ((2, 4, 2, 3, 8), (2, 1, 1, 5, 8), (2, 1, 15, 5, 2)),
], ids=["query_value_dim_mismatch", "key_value_dim_mismatch", "key_value_dim_mismatch_high_dim"])
def test_shape_mismatch_error(query_shape, value_shape, key_shape):
    layer = layers.MultiHeadAttention(num_heads=4, key_dim=2, value_dim=2)
    with pytest.raises(ValueError, match=r"must be equal"):
        layer.compute_output_shape(query_shape, value_shape, key_shape)
    with pytest.raises(ValueError, match=r"must be equal"):
        layer(np.ones(query_shape), np.ones(value_shape), np.ones(key_shape))


def test_invalid_scalar_args_rejected():
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="argument `num_heads`"):
            layers.MultiHeadAttention(num_heads=bad, key_dim=4)
        with pytest.raises(ValueError, match="argument `key_dim`"):
            layers.MultiHeadAttention(num_heads=4, key_dim=bad)
        with pytest.raises(ValueError, match="argument `value_dim`"):
            layers.MultiHeadAttention(num_heads=4, key_dim=4, value_dim=bad)
    layers.MultiHeadAttention(num_heads=4, key_dim=4, value_dim=None)


def test_initializer_truncated_normal():
    # the part of test_initializer attnx has: TruncatedNormal kernels, each projection its own draw
    layer = layers.MultiHeadAttention(num_heads=12, key_dim=64,
                                      kernel_initializer=attnx.initializers.TruncatedNormal(stddev=0.02))
    layer.build([(2, 4, 8), (2, 4, 8)])
    p = layer.params
    for other in ("key_kernel", "value_kernel"):
        assert not np.allclose(p["query_kernel"], p[other])
    assert not np.allclose(p["query_kernel"].reshape(-1)[:100], p["output_kernel"].reshape(-1)[:100])
    assert np.abs(p["query_kernel"]).max() <= 0.04 + 1e-7


def _masked_inputs():
    q_in, v_in = attnx.Input((5,), dtype="int32"), attnx.Input((3,), dtype="int32")
    masked_query = layers.Embedding(4, 8, mask_zero=True)(q_in)
    masked_value = layers.Embedding(6, 8, mask_zero=True)(v_in)
    query = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 0, 0, 0, 0]])
    value = np.array([[5, 4, 0], [3, 0, 0], [2, 1, 1]])
    return q_in, v_in, masked_query, masked_value, query, value


def test_query_mask_propagation():
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=2)
    assert layer.supports_masking
    q_in, v_in, masked_query, _, query, _ = _masked_inputs()
    value = np.random.normal(size=(3, 3, 8))
    v_float = attnx.Input((3, 8))
    model = attnx.Model([q_in, v_float], layer(query=masked_query, value=v_float))
    assert np.array_equal(model.compute_mask([query, value]), query != 0)


@pytest.mark.parametrize("use_causal_mask", [True, False], ids=["causal", "not_causal"])
def test_masking(use_causal_mask):
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=2)
    q_in, v_in, masked_query, masked_value, query, value = _masked_inputs()
    auto = attnx.Model([q_in, v_in], layer(query=masked_query, value=masked_value, use_causal_mask=use_causal_mask))
    output = auto.predict([query, value], verbose=0)
    mask = np.array([[[1, 1, 0]] * 3 + [[0, 0, 0]] * 2] + [[[1, 0, 0]] * 5] + [[[1, 1, 1]] + [[0, 0, 0]] * 4])
    if use_causal_mask:
        mask = mask & np.array([[[1, 0, 0], [1, 1, 0]] + [[1, 1, 1]] * 3])
    q_vectors = attnx.Model(q_in, masked_query).predict(query, verbose=0)
    v_vectors = attnx.Model(v_in, masked_value).predict(value, verbose=0)
    output_with_manual_mask = layer(query=q_vectors, value=v_vectors, attention_mask=mask)
    assert_all_close(output, output_with_manual_mask)


def test_masking_with_different_shapes():
    x = np.random.uniform(size=(2, 5, 8)).astype("float32")
    mask = np.tril(np.ones((5, 5), dtype="float32"))
    layer = layers.MultiHeadAttention(num_heads=2, key_dim=4)
    output_1 = layer(query=x, value=x, attention_mask=mask)
    mask = np.tile(mask[None, ...], (2, 1, 1))
    output_2 = layer(query=x, value=x, attention_mask=mask)
    mask = np.tile(mask[:, None, ...], (1, 2, 1, 1))
    output_3 = layer(query=x, value=x, attention_mask=mask)
    assert_all_close(output_1, output_2)
    assert_all_close(output_1, output_3)


def test_correctness():
    num_heads, key_dim = 8, 8
    query = np.identity(key_dim)[np.newaxis, ...]
    key = np.identity(key_dim)[np.newaxis, ...]
    value = np.reshape(np.arange(key_dim * key_dim), (1, key_dim, key_dim)) / 100.0
    layer = layers.MultiHeadAttention(num_heads=num_heads, key_dim=key_dim, dtype="float32")
    layer.build([query.shape, value.shape, key.shape])
    layer.built = True
    kernel = np.repeat(np.identity(key_dim)[:, np.newaxis, :], num_heads, axis=1)
    bias = np.zeros((num_heads, key_dim))
    output_bias = np.zeros((key_dim,))
    layer.set_weights([kernel, bias] * 3 + [kernel, output_bias])
    expected_output = np.array([2.406, 2.440, 2.473, 2.504, 2.535, 2.568, 2.602, 2.633])
    expected_output = np.tile(expected_output[np.newaxis, :, np.newaxis], (1, 1, key_dim))
    expected_score = np.array([[0.1187] * i + [0.1691] + [0.1187] * (7 - i) for i in range(8)])
    expected_score = np.tile(expected_score[np.newaxis, np.newaxis, ...], (1, key_dim, 1, 1))
    output, scores = layer(query=query, value=value, key=key, return_attention_scores=True)
    assert_all_close(output, expected_output, atol=1e-2)
    assert_all_close(scores, expected_score, atol=1e-2)


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 3, 5)])
def test_symbolic_return_attention_scores(shape):
    mha = layers.MultiHeadAttention(num_heads=4, key_dim=2)
    x = attnx.Input(shape=shape[1:], batch_size=shape[0])
    y = attnx.Input(shape=shape[1:], batch_size=shape[0])
    symbolic_out = mha(x, y, return_attention_scores=True)
    assert len(symbolic_out) == 2
    out = mha(np.random.random(shape), np.random.random(shape), return_attention_scores=True)
    assert len(out) == 2
    assert symbolic_out[0].shape == out[0].shape
    assert symbolic_out[1].shape == out[1].shape


def test_multi_head_attention_output_shape_as_int():
    mha = layers.MultiHeadAttention(num_heads=2, key_dim=16, output_shape=8)
    output = mha(query=np.random.uniform(size=(2, 4, 16)), value=np.random.uniform(size=(2, 4, 16)))
    assert output.shape == (2, 4, 8)


def test_multi_head_attention_output_shape_as_tuple():
    mha = layers.MultiHeadAttention(num_heads=2, key_dim=16, output_shape=(8, 8))
    output = mha(query=np.random.uniform(size=(2, 4, 16)), value=np.random.uniform(size=(2, 4, 16)))
    assert output.shape == (2, 4, 8, 8)


def test_multi_head_attention_output_shape_error():
    with pytest.raises(ValueError, match=r"Invalid `output_shape`"):
        layers.MultiHeadAttention(num_heads=2, key_dim=16, output_shape=8.0)


@pytest.mark.parametrize("q_dims, v_dims, attention_axes", [
    ((3, 4), (3, 2), (2,)),
    ((3, 4), (3, 2), (1, 2)),
    ((5, 3, 4), (5, 3, 2), (2, 3)),
], ids=["4d_inputs_1freebatch", "4d_inputs_2d_attention", "5d_inputs_2d_attention"])
@pytest.mark.parametrize("use_gate, trainable", [(False, 8), (True, 10)])
def test_high_dim_attention(q_dims, v_dims, attention_axes, use_gate, trainable):
    batch_size, hidden_size = 3, 8
    query_shape = (batch_size,) + q_dims + (hidden_size,)
    value_shape = (batch_size,) + v_dims + (hidden_size,)
    run_layer_test(layers.MultiHeadAttention,
                   init_kwargs={"num_heads": 2, "key_dim": 2, "attention_axes": attention_axes, "use_gate": use_gate},
                   input_shape={"query_shape": query_shape, "value_shape": value_shape},
                   expected_output_shape=query_shape, expected_num_trainable_weights=trainable,
                   expected_num_non_trainable_weights=0, expected_num_seed_generators=0, expected_num_losses=0,
                   supports_masking=True)


@pytest.mark.parametrize("use_gate", [False, True])
def test_attention_axes_negative_indexing(use_gate):
    x = np.random.normal(size=(2, 3, 8, 4))
    mha_pos = layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=2, use_gate=use_gate)
    mha_neg = layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=-2, use_gate=use_gate)
    _ = mha_pos(x, x)
    _ = mha_neg(x, x)
    mha_neg.set_weights(mha_pos.get_weights())
    z_pos, a_pos = mha_pos(x, x, return_attention_scores=True)
    z_neg, a_neg = mha_neg(x, x, return_attention_scores=True)
    assert z_pos.shape == z_neg.shape
    assert a_pos.shape == a_neg.shape
    assert_all_close(z_pos, z_neg, rtol=1e-5, atol=1e-5)
    assert_all_close(a_pos, a_neg, rtol=1e-5, atol=1e-5)


def test_initializer():
    layer = layers.MultiHeadAttention(num_heads=12, key_dim=64, use_gate=True,
                                      kernel_initializer=attnx.initializers.TruncatedNormal(stddev=0.02))
    layer.build([(2, 4, 8), (2, 4, 8)])
    p = layer.params
    for other in ("key_kernel", "value_kernel", "output_kernel", "gate_kernel"):
        assert not np.allclose(p["query_kernel"].reshape(-1)[:32], p[other].reshape(-1)[:32])


def test_mha_constraints():
    from attnx import constraints
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    key = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    value = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    for argument, weight in (("kernel_constraint", "kernel"), ("bias_constraint", "bias")):
        layer = layers.MultiHeadAttention(num_heads=2, key_dim=2, use_gate=True, **{argument: "non_neg"})
        layer.build([query.shape, value.shape, key.shape])
        for name in ("query", "value", "key", "gate"):
            assert isinstance(constraints.constraint_of(layer.params[f"{name}_{weight}"]), constraints.NonNeg)
