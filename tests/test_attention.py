"""Attention pipeline: scores, masked softmax, context, local and hard attention, pooling.

Float64 gradient checks on tiny shapes, the papers' equations in NumPy, masks (fully masked rows
never give NaN), bad input, and REINFORCE hard attention on a synthetic task."""
import math
import os
from pathlib import Path

import numpy as np
import pytest

import attnx
from attnx import _core, layers
from attnx.layers import attention as A
from attnx.testing import assert_close, gradcheck

B, TQ, S, D = 2, 3, 4, 4


@pytest.fixture(autouse=True)
def _seed():
    attnx.set_random_seed(0)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def softmax_np(x, mask=None):
    x = np.where(mask, x, -np.inf) if mask is not None else x
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0))
    s = e.sum(-1, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


# ----------------------------------------------------------------------------- scaled dot-product core
def test_sdpa_matches_numpy_with_heads_mask_and_causal():
    H, dk, dv = 2, 3, 2
    q, k, v = rand(B, TQ, H * dk, seed=1), rand(B, S, H * dk, seed=2), rand(B, S, H * dv, seed=3)
    lengths = np.array([4, 2])
    ctx, w = A.scaled_dot_product_attention(q, k, v, mask=lengths, causal=True, heads=H)
    qh = q.reshape(B, TQ, H, dk).transpose(0, 2, 1, 3)
    kh = k.reshape(B, S, H, dk).transpose(0, 2, 1, 3)
    vh = v.reshape(B, S, H, dv).transpose(0, 2, 1, 3)
    allowed = (np.arange(S)[None, None, None, :] < lengths[:, None, None, None]) & \
              (np.arange(S)[None, None, None, :] <= np.arange(TQ)[None, None, :, None])
    want_w = softmax_np(qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(dk), allowed)
    assert_close(w, want_w, atol=1e-12, what="weights")
    assert_close(ctx, (want_w @ vh).transpose(0, 2, 1, 3).reshape(B, TQ, H * dv), atol=1e-12, what="context")


def test_sdpa_backward_with_dropout_dweights_and_dscale_matches_finite_differences():
    H, dk, dv = 2, 2, 3
    q, k, v = rand(B, TQ, H * dk, seed=1), rand(B, S, H * dk, seed=2), rand(B, S, H * dv, seed=3)
    mask = np.array([[1, 1, 0, 1], [0, 0, 0, 0]], bool)  # second row fully masked
    keep = (np.random.default_rng(4).random((B, H, TQ, S)) > 0.3) / 0.7
    rc, rw = rand(B, TQ, H * dv, seed=5), rand(B, H, TQ, S, seed=6)
    scale = 0.7

    def loss(q, k, v, scale):
        c, w = A.scaled_dot_product_attention(q, k, v, mask=mask, heads=H, scale=scale, dropout_keep=keep)
        assert np.all(np.isfinite(c)) and np.all(np.isfinite(w))
        return np.sum(c * rc) + np.sum(w * rw)

    _, w = A.scaled_dot_product_attention(q, k, v, mask=mask, heads=H, scale=scale, dropout_keep=keep)
    assert np.all(w[1] == 0)
    dscale = np.zeros(1)
    dq, dk_, dv_ = A.scaled_dot_product_attention_backward(rc, w, q, k, v, scale=scale, heads=H, dweights=rw,
                                                           dropout_keep=keep, dscale=dscale)
    eps = 1e-6
    for x, g, i in ((q, dq, 0), (k, dk_, 1), (v, dv_, 2)):
        num = np.zeros_like(x)
        for j in range(x.size):
            args = [q.copy(), k.copy(), v.copy()]
            args[i].reshape(-1)[j] += eps
            plus = loss(*args, scale)
            args[i].reshape(-1)[j] -= 2 * eps
            num.reshape(-1)[j] = (plus - loss(*args, scale)) / (2 * eps)
        assert_close(g, num, atol=1e-7, what=f"d input {i}")
    num_scale = (loss(q, k, v, scale + eps) - loss(q, k, v, scale - eps)) / (2 * eps)
    assert abs(dscale[0] - num_scale) < 1e-7


def test_sdpa_parallel_path_matches_serial_numpy():
    # large enough that the kernel splits the batch over threads
    Bb, T, H, d = 8, 32, 4, 16
    q, k, v = (rand(Bb, T, H * d, seed=s).astype(np.float32) for s in (1, 2, 3))
    ctx, w = A.scaled_dot_product_attention(q, k, v, heads=H, causal=True)
    qh, kh, vh = (x.astype(np.float64).reshape(Bb, T, H, d).transpose(0, 2, 1, 3) for x in (q, k, v))
    allowed = np.tril(np.ones((T, T), bool))
    want_w = softmax_np(qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d), allowed)
    assert_close(w, want_w, atol=1e-5, what="weights")
    assert_close(ctx, (want_w @ vh).transpose(0, 2, 1, 3).reshape(Bb, T, H * d), atol=1e-5, what="context")
    dq, dk, dv = A.scaled_dot_product_attention_backward(np.ones_like(ctx), w, q, k, v, heads=H)
    assert dq.dtype == np.float32 and np.all(np.isfinite(dq)) and np.all(np.isfinite(dk))
    assert_close(dv, np.einsum("bhts->bsh", want_w)[..., None].repeat(d, -1).reshape(Bb, T, H * d), atol=1e-4,
                 what="dvalue")


def _sdpa_masks(Bb, T, Sn):
    rng = np.random.default_rng(9)
    full = rng.random((Bb, T, Sn)) > 0.4
    full[0, 1] = False  # a query with nothing to attend to
    return {"none": None, "lengths": np.array([Sn, 0, 3][:Bb]), "padding": rng.random((Bb, Sn)) > 0.3,
            "full": full, "shared": np.tril(np.ones((1, T, Sn), bool))}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True], ids=["all", "causal"])
@pytest.mark.parametrize("mask_kind", ["none", "lengths", "padding", "full", "shared"])
@pytest.mark.parametrize("Sn", [5, 1200], ids=["one-block", "row-blocks"])
def test_sdpa_without_weights_matches_the_weights_path_and_numpy(dtype, causal, mask_kind, Sn):
    # return_weights=False never writes the weights and normalizes on the context; S = 1200 makes
    # the kernel work in several blocks of query rows (the last one partial)
    Bb, T, H, d = 3, 70, 2, 3
    q, k, v = rand(Bb, T, H * d, seed=1), rand(Bb, Sn, H * d, seed=2), rand(Bb, Sn, H * d, seed=3)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    mask = _sdpa_masks(Bb, T, Sn)[mask_kind]
    ctx, w = A.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, heads=H)
    ctx_fast, none = A.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, heads=H, return_weights=False)
    assert none is None and ctx_fast.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert_close(ctx_fast, ctx, atol=tol, what="context without weights")
    allowed = np.ones((Bb, 1, T, Sn), bool)
    if mask is not None:
        m = np.arange(Sn)[None, :] < mask[:, None] if mask.ndim == 1 else mask
        allowed &= m[:, None, None, :] if m.ndim == 2 else m[:, None]
    if causal:
        allowed &= np.arange(Sn)[None, :] <= np.arange(T)[:, None]
    qh, kh, vh = (x.astype(np.float64).reshape(Bb, -1, H, d).transpose(0, 2, 1, 3) for x in (q, k, v))
    want_w = softmax_np(qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d), allowed)
    assert_close(w, want_w, atol=tol, what="weights")
    assert_close(ctx_fast, (want_w @ vh).transpose(0, 2, 1, 3).reshape(Bb, T, H * d), atol=10 * tol,
                 what="context")


def test_sdpa_without_weights_dropout_and_nan_rows():
    H, dk = 2, 2
    q, k, v = rand(B, TQ, H * dk, seed=1), rand(B, S, H * dk, seed=2), rand(B, S, H * dk, seed=3)
    keep = (np.random.default_rng(4).random((B, H, TQ, S)) > 0.3) / 0.7
    ctx, _ = A.scaled_dot_product_attention(q, k, v, heads=H, dropout_keep=keep)
    ctx_fast, _ = A.scaled_dot_product_attention(q, k, v, heads=H, dropout_keep=keep, return_weights=False)
    assert_close(ctx_fast, ctx, atol=1e-12, what="context with dropout")
    q[0, 1] = np.nan  # NaN in, NaN out: that query's context is NaN, the others untouched
    ctx, w = A.scaled_dot_product_attention(q, k, v, heads=H)
    ctx_fast, _ = A.scaled_dot_product_attention(q, k, v, heads=H, return_weights=False)
    assert np.all(np.isnan(w[0, :, 1])) and np.all(np.isnan(ctx_fast[0, 1]))
    assert_close(np.delete(ctx_fast, 1, axis=1), np.delete(ctx, 1, axis=1), atol=1e-12, what="other queries")


@pytest.mark.parametrize("dtype,bf16", [(np.float32, False), (np.float32, True), (np.float64, False)])
def test_sdpa_draws_random_keeps_mask_itself(dtype, bf16):
    """dropout_stream (rate, key, first_row): the kernel draws the keep mask random_keep gives for the weights'
    shape (B, H, Tq, S) as it uses it, so forward and backward equal theirs on that mask bit for bit."""
    Bb, H, T, Sn, d = 3, 2, 5, 9, 4  # rows of 9 entries start mid-word of the stream
    q, k, v = (rand(Bb, n, H * d, seed=s).astype(dtype) for s, n in ((1, T), (2, Sn), (3, Sn)))
    dc = rand(Bb, T, H * d, seed=4).astype(dtype)
    keep = _core.random_keep(shape=[Bb, H, T, Sn], rate=0.25, key=99, first_row=4, dtype=np.dtype(dtype))
    given = _core.sdpa_forward(q, k, v, heads=H, dropout_keep=keep, bf16=bf16)
    drawn = _core.sdpa_forward(q, k, v, heads=H, dropout_stream=(0.25, 99, 4), bf16=bf16)
    assert np.array_equal(given[0], drawn[0]) and np.array_equal(given[1], drawn[1])
    plain, _ = _core.sdpa_forward(q, k, v, heads=H, bf16=bf16)
    assert not np.array_equal(plain, drawn[0])  # the mask drops something
    grads = [_core.sdpa_backward(dc, given[1], q, k, v, heads=H, bf16=bf16, **how)
             for how in ({"dropout_keep": keep}, {"dropout_stream": (0.25, 99, 4)})]
    assert all(np.array_equal(a, b) for a, b in zip(*grads))
    with pytest.raises(ValueError, match="sdpa_forward: give a keep mask or dropout_stream, not both"):
        _core.sdpa_forward(q, k, v, heads=H, dropout_keep=keep, dropout_stream=(0.25, 99, 4))
    with pytest.raises(ValueError, match=r"sdpa_backward: dropout_stream: rate must be in \[0, 1\), got 1"):
        _core.sdpa_backward(dc, given[1], q, k, v, heads=H, dropout_stream=(1.0, 99, 4))
    for bad in ((0.25, -1, 4), (0.25, 99), "stream", (0.25, 99.5, 4)):
        with pytest.raises(TypeError, match="sdpa_forward: dropout_stream must be a tuple"):
            _core.sdpa_forward(q, k, v, heads=H, dropout_stream=bad)


def test_float32_softmax_exp_is_accurate_over_the_whole_range():
    # the vectorized float exp (activations.hpp): ~1 ulp; exp(-inf) = 0 and exp of very negative
    # differences underflow to 0, so a huge spread gives exact one-hot weights
    x = np.linspace(-87, 0, 7 * 1000).reshape(1, 1, 7, 1000).astype(np.float32)  # row maxima near 0
    got = A.masked_softmax(x)
    want = softmax_np(x.astype(np.float64))
    assert np.max(np.abs(got - want) / np.maximum(want, 1e-30) * (want > 1e-30)) < 1e-6
    spread = np.array([[[0.0, -200.0, -np.inf, 1e4]]], np.float32)
    assert_close(A.masked_softmax(spread), np.array([[[0, 0, 0, 1.0]]]), atol=0)
    extreme = np.array([[[80.0, 88.0, 88.5]]], np.float32)  # exp of each alone would nearly overflow
    assert_close(A.masked_softmax(extreme), softmax_np(extreme.astype(np.float64)), atol=1e-6)


def test_functional_softmax_context_and_masked_softmax():
    scores, value = rand(B, TQ, S, seed=1), rand(B, S, 2, seed=2)
    mask = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], bool)
    ctx, w = A.softmax_context(scores, value, mask=mask)
    want = softmax_np(scores, mask[:, None, :])
    assert_close(w, want, atol=1e-12, what="weights")
    assert_close(ctx, want @ value, atol=1e-12, what="context")
    assert_close(A.masked_softmax(scores, mask), want, atol=1e-12, what="masked_softmax")
    shared = np.tril(np.ones((1, TQ, S), bool))  # one mask for the whole batch
    assert_close(A.masked_softmax(scores, shared), softmax_np(scores, shared), atol=1e-12, what="shared mask")
    dctx = rand(B, TQ, 2, seed=3)
    dscores, dvalue = A.softmax_context_backward(dctx, w, value)
    assert_close(dvalue, w.transpose(0, 2, 1) @ dctx, atol=1e-12, what="dvalue")
    dw = dctx @ value.transpose(0, 2, 1)
    assert_close(dscores, w * (dw - (dw * w).sum(-1, keepdims=True)), atol=1e-12, what="dscores")


# ----------------------------------------------------------------------------- Attention layer scores
@pytest.mark.parametrize("kwargs", [dict(score="dot"), dict(score="scaled_dot"), dict(score="dot", use_scale=True),
                                    dict(score="general"), dict(score="concat", units=3),
                                    dict(score="additive", units=3), dict(score="additive", normalize=True)])
def test_attention_scores_gradcheck_with_masks(kwargs):
    same_size = kwargs["score"] in ("dot", "scaled_dot")  # the others combine different query and key sizes
    layer = layers.Attention(dtype="float64", **kwargs)
    inputs = [rand(B, TQ, 4 if same_size else 5, seed=1), rand(B, S, 3, seed=2), rand(B, S, 4, seed=3)]
    value_mask = np.array([[1, 1, 0, 1], [0, 0, 0, 0]], bool)
    query_mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    report = gradcheck(layer, inputs, call_kwargs=dict(mask=[query_mask, value_mask], return_attention_scores=True))
    assert set(report) >= {"inputs[0]", "inputs[1]", "inputs[2]"}
    assert set(report) >= set(layer.params)
    ctx, w = layer(inputs, mask=[query_mask, value_mask], return_attention_scores=True)
    assert np.all(w[1] == 0) and np.all(ctx[1] == 0) and np.all(ctx[0, 2] == 0)
    assert np.allclose(w[0].sum(-1), 1)


@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_luong_attentional_state_gradcheck(score):
    layer = layers.LuongAttention(score=score, attentional_units=3, units=2, dtype="float64")
    inputs = [rand(B, TQ, 4, seed=1), rand(B, S, 4, seed=2)]
    report = gradcheck(layer, inputs, call_kwargs=dict(mask=[None, np.array([3, 0])], return_attention_scores=True))
    assert "attentional_kernel" in report
    state = layer(inputs)
    assert state.shape == (B, TQ, 3) and layer.compute_output_shape([(None, TQ, 4), (None, S, 4)]) == (None, TQ, 3)
    step = gradcheck(layer, [inputs[0][:, 0], inputs[1]], call_kwargs=dict(mask=[np.array([True, False]), None]))
    assert step["inputs[0]"] < 1e-6
    # h~ = tanh(W_c [c; h]) with the context from the plain attention
    ctx, _ = layers.Attention.forward(layer, inputs)
    want = np.tanh(np.concatenate([ctx, inputs[0]], -1) @ layer.params["attentional_kernel"])
    assert_close(state, want, atol=1e-12, what="attentional state")


def test_single_step_query_and_additive_attention_layer():
    layer = layers.BahdanauAdditiveAttention(units=3, dtype="float64")
    report = gradcheck(layer, [rand(B, 5, seed=1), rand(B, S, 2, seed=2)],
                       call_kwargs=dict(mask=[None, np.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)],
                                        return_attention_scores=True))
    assert set(report) == {"inputs[0]", "inputs[1]", "query_kernel", "key_kernel", "bias", "v"}
    ctx, w = layer([rand(B, 5, seed=1), rand(B, S, 2, seed=2)], return_attention_scores=True)
    assert ctx.shape == (B, 2) and w.shape == (B, S)


# ----------------------------------------------------------------------------- local attention
@pytest.mark.parametrize("mode,score", [("local-m", "general"), ("local-p", "general"), ("local-p", "dot"),
                                        ("local-p", "concat")])
def test_local_attention_gradcheck(mode, score):
    layer = layers.LocalAttention(window=2, mode=mode, score=score, units=3, dtype="float64")
    src = 6
    inputs = [rand(B, TQ, 4, seed=1), rand(B, src, 4, seed=2)]
    lengths = np.array([6, 4])
    report = gradcheck(layer, inputs, call_kwargs=dict(mask=[None, lengths], return_attention_scores=True))
    if mode == "local-p":
        assert {"position_kernel", "position_v"} <= set(report)
    ctx, w = layer(inputs, mask=[None, lengths], return_attention_scores=True)
    assert np.all(w[1, :, 4:] == 0)  # padded source positions
    assert np.all(w.sum(-1) <= 1 + 1e-12)


def test_local_m_matches_paper_equation():
    D, src = 2, 7
    layer = layers.LocalAttention(window=D, mode="local-m", score="general", dtype="float64")
    q, h = rand(B, 5, 3, seed=1), rand(B, src, 3, seed=2)
    ctx, w = layer([q, h], return_attention_scores=True)
    Wa = layer.params["kernel"]
    sigma = D / 2
    for b in range(B):
        for t in range(5):
            window = np.arange(max(0, t - D), min(src, t + D + 1))
            score = np.array([q[b, t] @ Wa @ h[b, s] for s in window])
            align = np.exp(score - score.max()) / np.exp(score - score.max()).sum()
            a = align * np.exp(-(window - t) ** 2 / (2 * sigma ** 2))
            want = np.zeros(src)
            want[window] = a
            assert_close(w[b, t], want, atol=1e-12, what="local-m weights")
            assert_close(ctx[b, t], a @ h[b, window], atol=1e-12, what="local-m context")


def test_local_p_position_and_window():
    layer = layers.LocalAttention(window=1, mode="local-p", score="dot", dtype="float64")
    q, h = rand(B, 2, 3, seed=1), rand(B, 8, 3, seed=2)
    lengths = np.array([8, 5])
    _, w = layer([q, h], mask=[None, lengths], return_attention_scores=True)
    gate = 1 / (1 + np.exp(-(np.tanh(q @ layer.params["position_kernel"]) @ layer.params["position_v"])[..., 0]))
    p = lengths[:, None] * gate
    s = np.arange(8)
    outside = np.abs(s[None, None, :] - p[:, :, None]) > 1
    assert np.all(w[outside] == 0) and np.all(w[~outside & (s[None, None, :] < lengths[:, None, None])] > 0)


def test_local_attention_negative_window_raises():
    with pytest.raises(ValueError, match="window D must be an integer >= 0"):
        layers.LocalAttention(window=-1)
    with pytest.raises(ValueError, match="window D must be >= 0"):
        attnx._core.local_window_forward(np.zeros((1, 1)), 4, -2)


# ----------------------------------------------------------------------------- attention pooling
@pytest.mark.parametrize("kwargs", [dict(), dict(length_agnostic=True), dict(return_sequences=True)])
def test_attention_pooling_gradcheck_with_mask(kwargs):
    layer = layers.AttentionPooling(dtype="float64", **kwargs)
    x = rand(B, 4, 3, seed=1)
    mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0]], bool)
    report = gradcheck(layer, x, call_kwargs=dict(mask=mask, return_attention_scores=True))
    assert set(report) == {"inputs[0]", "kernel", "bias"}
    out, a = layer(x, mask=mask, return_attention_scores=True)
    assert np.all(np.isfinite(out)) and np.all(out[1] == 0) and np.all(a[1] == 0)
    assert a[0, 3] == 0 and abs(a[0].sum() - 1) < 1e-12


def test_attention_pooling_matches_tutorial_equation():
    layer = layers.AttentionPooling(dtype="float64", bias_initializer="random_normal")
    x = rand(B, 5, 3, seed=1)
    out, a = layer(x, return_attention_scores=True)
    e = np.tanh(x @ layer.params["kernel"] + layer.params["bias"])[..., 0]  # W (d, 1), b (T, 1)
    want_a = np.exp(e) / np.exp(e).sum(1, keepdims=True)
    assert layer.params["bias"].shape == (5, 1)
    assert_close(a, want_a, atol=1e-12, what="weights")
    assert_close(out, np.sum(x * want_a[..., None], axis=1), atol=1e-12, what="output")
    seq = layers.AttentionPooling(return_sequences=True, dtype="float64")
    seq(x)
    seq.set_weights(layer.get_weights())
    assert_close(seq(x), x * want_a[..., None], atol=1e-12, what="return_sequences")


def test_attention_pooling_fixed_T_error_points_to_length_agnostic():
    layer = layers.AttentionPooling()
    layer(np.zeros((2, 5, 3)))
    with pytest.raises(ValueError, match=r"built for T=5.*got inputs of shape \(2, 7, 3\).*length_agnostic=True"):
        layer(np.zeros((2, 7, 3)))
    agnostic = layers.AttentionPooling(length_agnostic=True)
    assert agnostic(np.zeros((2, 5, 3))).shape == (2, 3) and agnostic(np.zeros((2, 7, 3))).shape == (2, 3)


# ----------------------------------------------------------------------------- hard attention
def _marker_task(rng, n, length=8, classes=4):
    """Each sequence has one marked position; the label is the class of the item there."""
    item_class = rng.integers(0, classes, size=(n, length))
    marked = rng.integers(0, length, size=n)
    x = np.zeros((n, length, 1 + classes))
    x[np.arange(n), marked, 0] = 1.0
    x[:, :, 1:] = np.eye(classes)[item_class]
    x += 0.05 * rng.standard_normal(x.shape)
    return x, item_class[np.arange(n), marked]


def test_hard_attention_reinforce_learns_the_marked_position():
    rng = np.random.default_rng(0)
    classes, batch = 4, 64
    attend = layers.HardAttention(score="general", baseline_decay=0.9)
    classify = layers.Dense(classes)
    query = np.ones((batch, 3), np.float32)  # a fixed query: what to look for is learned in W_a
    opt = attnx.optimizers.Adam(learning_rate=0.05)
    for step in range(200):
        x, y = _marker_task(rng, batch)
        context = attend([query, x], training=True)
        logits = classify(context, training=True)
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        attend.set_reward((probs.argmax(1) == y).astype(np.float64))
        dlogits = (probs - np.eye(classes)[y]) / batch
        attend.zero_grad()
        classify.zero_grad()
        dcontext = classify.backward(dlogits)
        attend.backward(dcontext)
        opt.apply([(p, g) for layer in (attend, classify) for p, g in zip(layer.params.values(),
                                                                          layer.grads.values())])
    x, y = _marker_task(np.random.default_rng(1), 1000)
    query = np.ones((1000, 3), np.float32)
    context, positions = attend([query, x], return_positions=True)
    accuracy = np.mean(classify(context).argmax(1) == y)
    assert accuracy >= 0.95, accuracy
    marked = x[:, :, 0].argmax(1)
    assert np.mean(positions == marked) >= 0.95
    assert attend.baseline is not None and attend.baseline > 0.5


def test_hard_attention_requires_reward_and_masks_rows():
    layer = layers.HardAttention(dtype="float64")
    q, v = rand(B, 4, seed=1), rand(B, S, 4, seed=2)
    with pytest.raises(RuntimeError, match="set_reward.*training=True first"):
        layer.set_reward(np.ones(B))
    ctx, positions = layer([q, v], mask=[None, np.array([[0, 1, 0, 0], [0, 0, 0, 0]], bool)], training=True,
                           return_positions=True)
    assert positions[0] == 1 and np.all(ctx[0] == v[0, 1]) and np.all(ctx[1] == 0)
    with pytest.raises(RuntimeError, match="set_reward"):
        layer.backward([np.ones_like(ctx), None])
    with pytest.raises(ValueError, match="rewards expected shape"):
        layer.set_reward(np.ones(3))
    layer.set_reward(np.ones(B))
    dq, dv = layer.backward([np.ones_like(ctx), None])
    assert np.all(dv[0, 1] == 1) and np.all(dv[1] == 0) and np.all(np.isfinite(dq))


# ----------------------------------------------------------------------------- the papers' equations
def test_scores_match_paper_equations_in_numpy():
    """float32 layers against a direct float64 NumPy transcription of each score, within 1e-5."""
    q, h = rand(B, TQ, 4, seed=1), rand(B, S, 4, seed=2)
    lengths = np.array([4, 3])
    allowed = np.arange(S)[None, None, :] < lengths[:, None, None]

    def expected(score_fn):
        scores = np.array([[[score_fn(q[b, t], h[b, s]) for s in range(S)] for t in range(TQ)] for b in range(B)])
        w = softmax_np(scores, allowed)
        return w @ h, w

    checks = {}
    for name, kwargs in (("dot", {}), ("general", {}), ("concat", dict(units=3)), ("additive", dict(units=3))):
        layer = layers.Attention(score=name, **kwargs)
        ctx, w = layer([q, h], mask=[None, lengths], return_attention_scores=True)
        p = {k: v.astype(np.float64) for k, v in layer.params.items()}
        fn = {
            "dot": lambda ht, hs: ht @ hs,                                                     # h_t^T h_s
            "general": lambda ht, hs: ht @ p["kernel"] @ hs,                                   # h_t^T W_a h_s
            # v_a^T tanh(W_a [h_t; h_s]) with W_a = [W_q; W_k] stacked on the input axis
            "concat": lambda ht, hs: p["v"][:, 0] @ np.tanh(np.concatenate([ht, hs]) @ np.concatenate(
                [p["query_kernel"], p["key_kernel"]])),
            "additive": lambda ht, hs: p["v"][:, 0] @ np.tanh(hs @ p["key_kernel"] + ht @ p["query_kernel"] +
                                                              p["bias"]),              # v^T tanh(W1 h_s + W2 s + b)
        }[name]
        want_ctx, want_w = expected(fn)
        checks[name] = (assert_close(w, want_w, atol=1e-5, what=f"{name} weights"),
                        assert_close(ctx, want_ctx, atol=1e-5, what=f"{name} context"))
    assert set(checks) == {"dot", "general", "concat", "additive"}


def test_scaled_dot_and_learned_scale():
    q, h = rand(B, TQ, 4, seed=1), rand(B, S, 4, seed=2)
    _, w = layers.Attention(score="scaled_dot")([q, h], return_attention_scores=True)
    assert_close(w, softmax_np(q @ h.transpose(0, 2, 1) / 2.0), atol=1e-6, what="scaled_dot")
    layer = layers.Attention(score="dot", use_scale=True)
    layer([q, h])
    layer.set_weights([np.array([0.3])])
    _, w = layer([q, h], return_attention_scores=True)
    assert_close(w, softmax_np(0.3 * q @ h.transpose(0, 2, 1)), atol=1e-6, what="use_scale")


def test_additive_normalize_is_tfa_weight_norm():
    layer = layers.BahdanauAdditiveAttention(units=3, normalize=True, dtype="float64")
    q, h = rand(B, TQ, 2, seed=1), rand(B, S, 4, seed=2)
    _, w = layer([q, h], return_attention_scores=True)
    p = layer.params
    assert abs(p["g"][0] - math.sqrt(1 / 3)) < 1e-12
    v = p["g"][0] * p["v"][:, 0] / np.linalg.norm(p["v"][:, 0])
    scores = np.tanh((h @ p["key_kernel"])[:, None] + (q @ p["query_kernel"] + p["bias"])[:, :, None]) @ v
    assert_close(w, softmax_np(scores), atol=1e-12, what="normalized additive")


# ----------------------------------------------------------------------------- masks
@pytest.mark.parametrize("score", ["dot", "general", "additive"])
def test_fully_masked_rows_give_zero_weights_context_and_finite_gradients(score):
    layer = layers.Attention(score=score, dtype="float32")
    q, h = rand(B, TQ, 4, seed=1), rand(B, S, 4, seed=2)
    full = np.ones((B, TQ, S), bool)
    full[0, 1] = False  # one query row of batch 0 sees nothing
    full[1] = False     # batch 1 sees nothing at all
    ctx, w = layer([q, h], mask=[None, full], return_attention_scores=True, training=True)
    assert np.all(w[0, 1] == 0) and np.all(ctx[0, 1] == 0) and np.all(w[1] == 0) and np.all(ctx[1] == 0)
    dq, dh = layer.backward([np.ones_like(ctx), np.ones_like(w)])
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dh)) and np.all(dq[1] == 0)
    assert all(np.all(np.isfinite(g)) for g in layer.grads.values())


def test_lengths_and_masks_are_equivalent_and_causal_mask():
    layer = layers.Attention(score="dot")
    q, h = rand(B, S, 4, seed=1), rand(B, S, 4, seed=2)
    a = layer([q, h], mask=[None, np.array([2, 4])])
    b = layer([q, h], mask=[None, np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)])
    assert_close(a, b, atol=0, what="lengths vs mask")
    _, w = layer([q, h], use_causal_mask=True, return_attention_scores=True)
    assert np.all(np.triu(np.ones((S, S)), 1)[None] * w == 0)


# ----------------------------------------------------------------------------- bad input
def test_bad_inputs_raise_clear_errors():
    dot = layers.Attention(score="dot", name="att")
    with pytest.raises(ValueError, match=r"query \(\.\.\., 3\) and key \(\.\.\., 4\).*score='general'"):
        dot([np.zeros((B, TQ, 3)), np.zeros((B, S, 4))])
    general = layers.Attention(score="general", name="gen")
    general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4))])
    with pytest.raises(ValueError, match=r"Layer 'gen': built for query \(\.\.\., 3\).*got query \(2, 3, 5\)"):
        general([np.zeros((B, TQ, 5)), np.zeros((B, S, 4))])
    with pytest.raises(ValueError, match=r"`value_mask`: expected a mask of shape \(2, 4\) or \(2, 3, 4\).*got shape "
                                         r"\(2, 5\)"):
        general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4))], mask=[None, np.ones((B, 5), bool)])
    with pytest.raises(ValueError, match=r"`query_mask`: expected a mask of shape \(2, 3\).*got shape \(3, 2\)"):
        general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4))], mask=[np.ones((3, 2), bool), None])
    with pytest.raises(ValueError, match=r"expected lengths of shape \(2,\), got shape \(3,\)"):
        general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4))], mask=[None, np.array([1, 2, 3])])
    with pytest.raises(ValueError, match=r"`key` expected batch size 2"):
        general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4)), np.zeros((3, S, 4))])
    with pytest.raises(ValueError, match=r"`key` expected length 4"):
        general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4)), np.zeros((B, 5, 4))])
    with pytest.raises(TypeError, match="bool mask .* or integer lengths"):
        general([np.zeros((B, TQ, 3)), np.zeros((B, S, 4))], mask=[None, np.ones((B, S)) * 0.5])
    with pytest.raises(ValueError, match="must be called on a list of inputs, namely \\[query, value\\]"):
        layers.Attention()(np.zeros((B, TQ, 4)))
    with pytest.raises(ValueError, match="score must be one of"):
        layers.Attention(score="cosine")
    pooling = layers.AttentionPooling(name="pool")
    with pytest.raises(ValueError, match=r"Layer 'pool': `mask`: expected a mask of shape \(2, 4\)"):
        pooling(np.zeros((B, 4, 3)), mask=np.ones((B, 5), bool))
    with pytest.raises(ValueError, match=r"sdpa_forward: key.*expected shape \(2, \*, 6\), got \(2, 4, 4\)"):
        A.scaled_dot_product_attention(np.zeros((B, TQ, 6)), np.zeros((B, S, 4)), np.zeros((B, S, 4)))
    with pytest.raises(ValueError, match="divisible by heads=4"):
        A.scaled_dot_product_attention(np.zeros((B, TQ, 6)), np.zeros((B, S, 6)), np.zeros((B, S, 6)), heads=4)
    with pytest.raises(TypeError, match="expected dtype float32, got float64"):
        attnx._core.sdpa_forward(np.zeros((B, TQ, 4), np.float32), np.zeros((B, S, 4)), np.zeros((B, S, 4)))
    with pytest.raises(ValueError, match=r"sdpa_forward: mask: expected shape \(2, 4\) or \(2, 3, 4\).*got \(4,\)"):
        attnx._core.sdpa_forward(np.zeros((B, TQ, 4)), np.zeros((B, S, 4)), np.zeros((B, S, 4)), np.ones(4, bool))


# ----------------------------------------------------------------------------- PyTorch parity, config
def test_sdpa_parity_with_torch():
    import torch
    H, d = 2, 4
    q, k, v = (rand(3, 5, H * d, seed=s).astype(np.float32) for s in (1, 2, 3))
    mask = np.random.default_rng(4).random((3, 6)) > 0.3
    k, v = rand(3, 6, H * d, seed=2).astype(np.float32), rand(3, 6, H * d, seed=3).astype(np.float32)
    mask[:, 0] = True
    ctx, w = A.scaled_dot_product_attention(q, k, v, mask=mask, heads=H)
    tq, tk, tv = (torch.tensor(x.reshape(3, -1, H, d).transpose(0, 2, 1, 3), requires_grad=True) for x in (q, k, v))
    tctx = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(mask)[:, None, None])
    dctx = rand(3, 5, H * d, seed=5).astype(np.float32)
    tctx.backward(torch.tensor(dctx.reshape(3, 5, H, d).transpose(0, 2, 1, 3)))
    err = assert_close(ctx, tctx.detach().numpy().transpose(0, 2, 1, 3).reshape(3, 5, H * d), atol=1e-5,
                       what="context")
    grads = A.scaled_dot_product_attention_backward(dctx, w, q, k, v, heads=H)
    for g, t, name in zip(grads, (tq, tk, tv), "qkv"):
        err = max(err, assert_close(g, t.grad.numpy().transpose(0, 2, 1, 3).reshape(g.shape), atol=1e-5,
                                    what=f"d{name}"))
    assert err < 1e-5


def test_get_config_round_trip():
    for layer in (layers.Attention(score="general", use_scale=True, dropout=0.1),
                  layers.BahdanauAdditiveAttention(units=5, normalize=True), layers.LuongAttention(attentional_units=3),
                  layers.LocalAttention(window=3, mode="local-m"), layers.HardAttention(inference="sample"),
                  layers.AttentionPooling(return_sequences=True, length_agnostic=True)):
        config = layer.get_config()
        clone = type(layer).from_config(config)
        assert clone.get_config() == config


# ----------------------------------------------------------------------------- in a model
def _uci_dir():
    env = os.environ.get("ATTNX_DATA_DIR")
    for candidate in ([Path(env), Path(env) / "uci-sentiment"] if env else []):
        if (candidate / "amazon_cells_labelled.txt").is_file():
            return candidate
    return Path(__file__).resolve().parents[1].parent / "shared" / "data" / "uci-sentiment"


def test_attention_pooling_in_a_sequential_model_learns_uci_sentiment():
    """Embedding(mask_zero) -> AttentionPooling -> Dense(sigmoid), the tutorial's model without the
    LSTM, fit on amazon + yelp (maxlen 32 post-padded, 20% validation): the masks flow through
    Sequential and the layer trains (seeds 0-3 reach 0.80-0.835 after 10 epochs)."""
    sentences, labels = attnx.datasets.load_uci_sentiment(sources=("amazon", "yelp"), data_dir=_uci_dir())
    order = np.random.default_rng(0).permutation(len(sentences))
    sentences, labels = [sentences[i] for i in order], labels[order].astype(np.float32)
    tokenizer = attnx.text.Tokenizer()
    tokenizer.fit_on_texts(sentences)
    x = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=32, padding="post")
    model = attnx.Sequential([layers.Embedding(len(tokenizer.word_index) + 1, 32, mask_zero=True, input_length=32),
                              layers.AttentionPooling(), layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, labels, epochs=10, batch_size=32, validation_split=0.2, verbose=0)
    assert history.history["val_accuracy"][-1] >= 0.78, history.history["val_accuracy"]
    pooling = model.layers[1]
    _, weights = pooling(model.layers[0](x[:4]), mask=x[:4] != 0, return_attention_scores=True)
    assert np.all(weights[x[:4] == 0] == 0) and np.allclose(weights.sum(1), 1, atol=1e-5)


def test_attention_dropout_drops_weights_in_training_only():
    layer = layers.Attention(score="dot", dropout=0.5, dtype="float64")
    q, h = rand(B, TQ, 4, seed=1), rand(B, S, 4, seed=2)
    ctx_eval, w = layer([q, h], return_attention_scores=True)
    ctx_train, cache = layer.apply([q, h], training=True)
    keep = cache["attend"]["keep"][:, 0]
    assert set(np.unique(keep)) <= {0.0, 2.0} and 0 < np.mean(keep == 0) < 1
    assert_close(ctx_eval, w @ h, atol=1e-12, what="inference context")
    assert_close(ctx_train, (w * keep) @ h, atol=1e-12, what="training context")
    dq, dh = layer.backprop(cache, np.ones_like(ctx_train))
    # NumPy backward of sum((softmax(q h^T) * keep) h): key and value are both h
    dP = keep * (np.ones_like(ctx_train) @ h.transpose(0, 2, 1))
    dS = w * (dP - (dP * w).sum(-1, keepdims=True))
    assert_close(dq, dS @ h, atol=1e-12, what="dquery")
    assert_close(dh, (w * keep).transpose(0, 2, 1) @ np.ones_like(ctx_train) + dS.transpose(0, 2, 1) @ q, atol=1e-12,
                 what="dvalue + dkey")


def test_hard_attention_inference_argmax_and_sampling_follow_the_weights():
    layer = layers.HardAttention(score="dot", inference="sample", dtype="float64")
    h = np.zeros((1, 3, 2))
    h[0, :, 0] = [0.0, 1.0, 2.0]
    q = np.tile([[np.log(2.0), 0.0]], (4000, 1))  # weights proportional to 1, 2, 4
    values = np.repeat(h, 4000, axis=0)
    _, w, positions = layer([q, values], return_attention_scores=True, return_positions=True)
    assert positions.shape == (4000,) and positions.dtype.kind == "i"
    counts = np.bincount(positions, minlength=3) / 4000
    assert_close(w[0], [1 / 7, 2 / 7, 4 / 7], atol=1e-12, what="weights")
    assert_close(counts, w[0], atol=0.03, what="sample frequencies")
    argmax = layers.HardAttention(score="dot", inference="argmax", dtype="float64")
    ctx, positions = argmax([q[:2], values[:2]], return_positions=True)
    assert np.all(positions == 2) and np.all(ctx == h[0, 2])


def test_functional_model_with_attention_weights_as_outputs_gradchecks():
    qi, vi = attnx.models.Input((3, 4), dtype="float64"), attnx.models.Input((5, 4), dtype="float64")
    state, w = layers.LuongAttention(attentional_units=3, dtype="float64")([qi, vi], return_attention_scores=True)
    pooled, a = layers.AttentionPooling(dtype="float64")(state, return_attention_scores=True)
    model = attnx.models.Model([qi, vi], [pooled, w, a], dtype="float64")
    assert [t.shape for t in model.outputs] == [(None, 3), (None, 3, 5), (None, 3)]
    report = gradcheck(model, [rand(B, 3, 4, seed=1), rand(B, 5, 4, seed=2)])
    assert report["inputs[0]"] < 1e-6 and report["inputs[1]"] < 1e-6


# ----------------------------------------------------------------------------- per-call state
# Every attention layer, as a factory of a fresh float64 layer and its family (what it is called on).
LAYER_CASES = {
    "dot": (lambda: layers.Attention(score="dot", dtype="float64"), "attention"),
    "scaled_dot_use_scale": (lambda: layers.Attention(score="scaled_dot", use_scale=True, dtype="float64"),
                             "attention"),
    "general_dropout": (lambda: layers.Attention(score="general", dropout=0.3, dtype="float64"), "attention"),
    "concat": (lambda: layers.Attention(score="concat", units=3, dtype="float64"), "attention"),
    "additive_normalize": (lambda: layers.BahdanauAdditiveAttention(units=3, normalize=True, dtype="float64"), "attention"),
    "luong_state": (lambda: layers.LuongAttention(attentional_units=3, dtype="float64"), "attention"),
    "luong_context": (lambda: layers.LuongAttention(score="dot", dtype="float64"), "attention"),
    "local_m": (lambda: layers.LocalAttention(window=1, mode="local-m", dtype="float64"), "attention"),
    "local_p": (lambda: layers.LocalAttention(window=2, score="concat", units=3, dtype="float64"), "attention"),
    "hard": (lambda: layers.HardAttention(score="general", dtype="float64"), "attention"),
    "pooling": (lambda: layers.AttentionPooling(length_agnostic=True, dtype="float64"), "pooling"),
    "pooling_sequences": (lambda: layers.AttentionPooling(return_sequences=True, dtype="float64"), "pooling"),
}


def _structure(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _random_mask(rng, B, S, Tq=None):
    """None, lengths (B,) or a bool mask (B, S) (or (B, Tq, S) when Tq is given); with few positions
    some rows come out fully masked."""
    kind = int(rng.integers(4 if Tq else 3))
    if kind == 0:
        return None
    if kind == 1:
        return rng.integers(0, S + 1, size=B)
    return rng.random((B, S) if kind == 2 else (B, Tq, S)) < 0.6


def _fixed_sizes(rng, layer, family):
    """The sizes every call of a built layer must keep: (Dq, Dv, Dk, key given) or (features, T)."""
    if family == "pooling":
        return int(rng.integers(1, 4)), int(rng.integers(1, 5))
    dk = int(rng.integers(1, 5))
    dq = dk if layer.score in ("dot", "scaled_dot") else int(rng.integers(1, 5))
    key_given = bool(rng.integers(2))
    return dq, int(rng.integers(1, 4)) if key_given else dk, dk, key_given


def _random_call(rng, layer, family, sizes):
    """Random inputs and call arguments (masks, return_attention_scores) within the fixed sizes."""
    B = int(rng.integers(1, 4))
    if family == "pooling":
        features, T = sizes
        T = int(rng.integers(1, 6)) if layer.length_agnostic else T
        return rng.standard_normal((B, T, features)), {"mask": _random_mask(rng, B, T),
                                                       "return_attention_scores": bool(rng.integers(2))}
    dq, dv, dk, key_given = sizes
    S, single_step = int(rng.integers(1, 6)), rng.random() < 0.3
    Tq = 1 if single_step else int(rng.integers(1, 4))
    inputs = [rng.standard_normal((B, dq) if single_step else (B, Tq, dq)), rng.standard_normal((B, S, dv))]
    if key_given:
        inputs.append(rng.standard_normal((B, S, dk)))
    query_mask = None if rng.random() < 0.5 else rng.random((B,) if single_step else (B, Tq)) < 0.7
    value_mask = _random_mask(rng, B, S, Tq if layer.per_query_mask else None)
    return inputs, {"mask": [query_mask, value_mask], "return_attention_scores": bool(rng.integers(2))}


def _train_calls(callees, calls, seed):
    """``callee.apply`` of each call in turn, in training mode, from one random state: the same draws
    (dropout, sampled positions) for the same call order."""
    attnx.set_random_seed(seed)
    return [callee.apply(x, training=True, **kwargs) for callee, (x, kwargs) in zip(callees, calls)]


def _set_rewards(layer, runs, rewards):
    if isinstance(layer, layers.HardAttention):
        for (_, cache), reward in zip(runs, rewards):
            layer.set_reward(reward, cache)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_a_layer_applied_twice_gets_the_sum_of_its_calls_gradients(case, seed):
    """Two calls of one layer, backpropagated in reverse order, against two fresh twins with the same
    weights: parameter gradients add up, and each call gets its own input gradients."""
    make, family = LAYER_CASES[case]
    rng = np.random.default_rng(seed)
    shared, twins = make(), [make(), make()]
    sizes = _fixed_sizes(rng, shared, family)
    calls = [_random_call(rng, shared, family, sizes) for _ in twins]
    for layer in (shared, *twins):
        layer.apply(calls[0][0])  # builds it (an inference call draws no random numbers)
    for twin in twins:
        twin.set_weights(shared.get_weights())
    shared_runs = _train_calls([shared, shared], calls, seed)
    twin_runs = _train_calls(twins, calls, seed)
    for i, ((shared_out, _), (twin_out, _)) in enumerate(zip(shared_runs, twin_runs)):
        for a, b in zip(_structure(shared_out), _structure(twin_out)):
            assert_close(a, b, atol=0, what=f"call {i} output")
    upstream = [[rng.standard_normal(np.shape(o)) for o in _structure(out)] for out, _ in shared_runs]
    upstream = [dy if len(dy) > 1 else dy[0] for dy in upstream]
    rewards = [rng.random(np.shape(_structure(x)[0])[0]) for x, _ in calls]
    _set_rewards(shared, shared_runs, rewards)
    for twin, run, reward in zip(twins, twin_runs, rewards):
        _set_rewards(twin, [run], [reward])
    shared_dx = [shared.backprop(cache, dy) for (_, cache), dy in reversed(list(zip(shared_runs, upstream)))][::-1]
    twin_dx = [twin.backprop(cache, dy) for twin, (_, cache), dy in zip(twins, twin_runs, upstream)]
    for i, (got, want) in enumerate(zip(shared_dx, twin_dx)):
        for j, (g, w) in enumerate(zip(_structure(got), _structure(want))):
            assert_close(g, w, atol=1e-12, what=f"call {i} d inputs[{j}]")
    for name, grad in shared.grads.items():
        assert_close(grad, twins[0].grads[name] + twins[1].grads[name], atol=1e-12, what=f"d {name}")


# ----------------------------------------------------------------------------- every layer, one mask rule
def _masked_call(family, mask, query_mask=None):
    """Fixed inputs of batch 2 over 4 positions (Dq = Dk, as the dot scores need) with `mask` on them
    (and `query_mask` on the 3 queries), returning the weights too."""
    rng = np.random.default_rng(1)
    if family == "pooling":
        return rng.standard_normal((2, 4, 3)), {"mask": mask, "return_attention_scores": True}
    inputs = [rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 4))]
    return inputs, {"mask": [query_mask, mask], "return_attention_scores": True}


@pytest.mark.parametrize("mask", [np.array([0, 3]), np.array([[0, 0, 0, 0], [1, 1, 0, 1]], bool)],
                         ids=["lengths", "bool"])
@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_a_fully_masked_row_gives_zero_weights_and_context_and_finite_gradients(case, mask):
    make, family = LAYER_CASES[case]
    layer = make()
    inputs, kwargs = _masked_call(family, mask)
    (output, weights), cache = layer.apply(inputs, training=True, **kwargs)
    assert np.all(weights[0] == 0) and np.all(np.isfinite(weights))
    if getattr(layer, "attentional_units", None):  # h~ = tanh(W_c [c; h]) with a zero context c
        value_size = inputs[1].shape[2]
        assert_close(output[0], np.tanh(inputs[0][0] @ layer.params["attentional_kernel"][value_size:]), atol=1e-12,
                     what="attentional state of the masked row")
    else:
        assert np.all(output[0] == 0)
    _set_rewards(layer, [(output, cache)], [np.ones(2)])
    rng = np.random.default_rng(2)
    dinputs = layer.backprop(cache, [rng.standard_normal(output.shape), rng.standard_normal(weights.shape)])
    dvalue = dinputs if family == "pooling" else dinputs[1]
    assert np.all(dvalue[0] == 0)  # the row attended to nothing: nothing flows back into it
    assert all(np.all(np.isfinite(g)) for g in _structure(dinputs) + list(layer.grads.values()))


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_a_01_integer_mask_is_the_bool_mask(case):
    make, family = LAYER_CASES[case]
    layer = make()
    value_mask, query_mask = np.array([[0, 0, 0, 0], [1, 1, 0, 1]], bool), np.array([[1, 0, 1], [1, 1, 1]], bool)
    layer(_masked_call(family, None)[0])  # builds it first, so each call below starts from the same random state
    results = []
    for dtype in (bool, np.int64, np.uint8):
        inputs, kwargs = _masked_call(family, value_mask.astype(dtype), query_mask.astype(dtype))
        (output, weights), cache = _train_calls([layer], [(inputs, kwargs)], seed=0)[0]
        _set_rewards(layer, [(output, cache)], [np.ones(2)])
        layer.zero_grad()
        dinputs = layer.backprop(cache, [np.ones_like(output), np.ones_like(weights)])
        results.append([output, weights, *_structure(dinputs), *(g.copy() for g in layer.grads.values())])
    for integer_result in results[1:]:
        for got, want in zip(integer_result, results[0]):
            assert_close(got, want, atol=0, what="integer mask against bool mask")


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_an_integer_mask_holding_a_2_raises(case):
    make, family = LAYER_CASES[case]
    layer = make()
    inputs, kwargs = _masked_call(family, np.array([[1, 2, 0, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"mask`: an integer mask must hold only 0 and 1, got values 0\.\.2"):
        layer(inputs, **kwargs)
    if family == "attention":
        inputs, kwargs = _masked_call(family, None, query_mask=np.array([[1, 2, 0], [1, 1, 1]]))
        with pytest.raises(ValueError, match=r"`query_mask`: an integer mask must hold only 0 and 1"):
            layer(inputs, **kwargs)


@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_without_input_gradients_the_parameter_gradients_are_unchanged(case):
    """``need_dx=False`` (a layer fed only by model inputs) skips the query and key
    projections' dx where the kernels can (pooling always computes dx: its kernel has no flag)."""
    make, family = LAYER_CASES[case]
    layer = make()
    inputs, kwargs = _masked_call(family, np.array([3, 4]))
    layer(inputs)  # builds it first, so both calls below start from the same random state
    grads = {}
    for needed in (True, False):
        (output, weights), cache = _train_calls([layer], [(inputs, kwargs)], seed=0)[0]
        _set_rewards(layer, [(output, cache)], [np.ones(2)])
        layer.zero_grad()
        dinputs = layer.backprop(cache, [np.ones_like(output), np.ones_like(weights)], need_dx=needed)
        assert (dinputs is None) == (not needed and family == "attention")
        grads[needed] = {name: g.copy() for name, g in layer.grads.items()}
    for name in grads[True]:
        assert_close(grads[False][name], grads[True][name], atol=0, what=f"d {name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_kernels_draw_random_keeps_mask_themselves(dtype):
    """apply_keep and residual_add with dropout_stream (rate, key, first_row): the mask random_keep gives
    for x's shape (first axis the batch's rows), drawn as it is used: the results on that mask, bit for
    bit (rows of 1100 entries: several blocks of the stream per row, one that starts mid-word)."""
    x, sub = rand(3, 2, 550, seed=1).astype(dtype), rand(3, 2, 550, seed=2).astype(dtype)
    keep = _core.random_keep(shape=[3, 2, 550], rate=0.2, key=7, first_row=5, dtype=np.dtype(dtype))
    stream = (0.2, 7, 5)
    assert np.array_equal(_core.apply_keep(x, keep=keep), _core.apply_keep(x, dropout_stream=stream))
    assert np.array_equal(_core.residual_add(x, sub, keep=keep), _core.residual_add(x, sub, dropout_stream=stream))
    assert not np.array_equal(_core.apply_keep(x, keep=keep), x)  # the mask drops something
    np.testing.assert_allclose(_core.apply_keep(x, dropout_stream=stream), x * keep, rtol=0, atol=0)
    # (a fused multiply-add rounds once: near cancellations differ from NumPy's two roundings)
    np.testing.assert_allclose(_core.residual_add(x, sub, dropout_stream=stream), x + keep * sub, rtol=1e-6,
                               atol=1e-6)
    with pytest.raises(ValueError, match="apply_keep: give a keep mask or dropout_stream, not both"):
        _core.apply_keep(x, keep=keep, dropout_stream=stream)
    with pytest.raises(ValueError, match="apply_keep: give keep or dropout_stream"):
        _core.apply_keep(x)
    with pytest.raises(ValueError, match="residual_add: x: a dropout_stream needs an array with a batch axis"):
        _core.residual_add(np.array(1.0, dtype), np.array(2.0, dtype), dropout_stream=stream)
    with pytest.raises(ValueError, match=r"residual_add: dropout_stream: rate must be in \[0, 1\), got 1"):
        _core.residual_add(x, sub, dropout_stream=(1.0, 7, 5))
    for bad in ((0.2, -1, 5), (0.2, 7), "stream"):
        with pytest.raises(TypeError, match="apply_keep: dropout_stream must be a tuple"):
            _core.apply_keep(x, dropout_stream=bad)
    with pytest.raises(ValueError, match=r"apply_keep: keep: expected shape"):
        _core.apply_keep(x, keep=keep[:, :, :10])
