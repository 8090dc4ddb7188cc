"""Attention pipeline: scores, masked softmax, context, local and hard attention, pooling.

Float64 gradient checks on tiny shapes, the papers' equations in NumPy, masks (fully masked rows
never give NaN), bad input, and REINFORCE hard attention on a synthetic task."""
import math

import numpy as np
import pytest

import attnx
from attnx import layers
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


# ----------------------------------------------------------------------------- Attention layer scores
@pytest.mark.parametrize("kwargs", [dict(score="dot"), dict(score="scaled_dot"), dict(score="dot", use_scale=True),
                                    dict(score="general"), dict(score="concat", units=3),
                                    dict(score="additive", units=3), dict(score="additive", normalize=True)])
def test_attention_scores_gradcheck_with_masks(kwargs):
    dq = 4 if kwargs["score"] in ("dot", "scaled_dot") else 5
    layer = layers.Attention(dtype="float64", **kwargs)
    inputs = [rand(B, TQ, dq, seed=1), rand(B, S, 3, seed=2), rand(B, S, 4, seed=3) if dq == 4 else rand(B, S, 2, seed=3)]
    if dq == 4:
        inputs[2] = rand(B, S, 4, seed=3)
    value_mask = np.array([[1, 1, 0, 1], [0, 0, 0, 0]], bool)
    query_mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    report = gradcheck(layer, inputs, call_kwargs=dict(mask=[query_mask, value_mask], return_attention_scores=True))
    assert set(report) >= {"inputs[0]", "inputs[1]", "inputs[2]"}
    assert set(report) >= set(layer.params)
    ctx, w = layer(inputs, mask=[query_mask, value_mask], return_attention_scores=True)
    assert np.all(w[1] == 0) and np.all(ctx[1] == 0) and np.all(ctx[0, 2] == 0)
    assert np.allclose(w[0].sum(-1), 1)
