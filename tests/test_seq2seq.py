"""Seq2seq: fused Bahdanau / Luong decoders against a step-by-step PyTorch implementation of the
same equations, float64 gradient checks, training on a reversal task, greedy and beam decoding,
BLEU, and bad input."""
import numpy as np
import pytest
import torch

import attnx
from attnx import metrics
from attnx.seq2seq import BahdanauDecoder, DecoderState, Encoder, LuongDecoder, Seq2Seq
from attnx.testing import assert_close, gradcheck

B, T, S, E, K, H, U, V = 3, 4, 5, 6, 7, 8, 5, 11

DECODERS = [
    ("bahdanau", "additive", "gru", None),
    ("bahdanau", "additive", "lstm", None),
    ("luong", "dot", "gru", None),
    ("luong", "general", "gru", None),
    ("luong", "concat", "lstm", None),
    ("luong", "general", "gru", 1),
]


def make_decoder(kind, score, cell, local_window, dtype="float32", K=K):
    attnx.set_random_seed(0)
    if kind == "bahdanau":
        dec = BahdanauDecoder(V, E, H, cell=cell, attention_units=U, dtype=dtype)
    else:
        dec = LuongDecoder(V, E, H, score=score, cell=cell, attention_units=U, local_window=local_window, dtype=dtype)
    n = 2 if cell == "lstm" else 1
    dec.build([(B, T), (B, S, H if score == "dot" else K)] + [(B, H)] * n)
    dec.built = True
    rng = np.random.default_rng(1)
    for p in dec.params.values():  # larger than the initializers' so every path matters
        p[...] = rng.uniform(-0.6, 0.6, p.shape)
    return dec


def make_inputs(score, cell, dtype=np.float32, seed=2):
    rng = np.random.default_rng(seed)
    Kx = H if score == "dot" else K
    ids = rng.integers(1, V, (B, T))
    enc = rng.standard_normal((B, S, Kx)).astype(dtype)
    states = [rng.standard_normal((B, H)).astype(dtype) for _ in range(2 if cell == "lstm" else 1)]
    source_mask = np.ones((B, S), dtype=bool)
    source_mask[1, 3:] = False
    source_mask[2, 1:] = False
    target_mask = np.ones((B, T), dtype=bool)
    target_mask[0, 2:] = False
    return ids, enc, states, source_mask, target_mask


# ------------------------------------------------------------------ step-by-step PyTorch reference
def torch_decoder(kind, score, cell, local_window, params, ids, enc, states, source_mask, target_mask):
    """The decoders' equations one step at a time in PyTorch (float64, autograd)."""
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    enc_t = torch.tensor(enc, dtype=torch.float64, requires_grad=True)
    st = [torch.tensor(s, dtype=torch.float64, requires_grad=True) for s in states]
    smask = torch.tensor(source_mask)
    tmask = torch.tensor(target_mask)
    Hn = P["recurrent_kernel"].shape[0]
    En = P["embeddings"].shape[1]
    emb = P["embeddings"][torch.tensor(ids)]
    W, Urec = P["kernel"], P["recurrent_kernel"]
    b_in, b_rec = (P["bias"][0], P["bias"][1]) if cell == "gru" else (P["bias"], None)
    if score in ("additive", "concat"):
        keys = enc_t @ P["key_kernel"]
    elif score == "general":
        keys = enc_t @ P["key_kernel"]
    else:
        keys = enc_t
    Sn = enc.shape[1]

    def rnn(x, h, c):
        g = x @ W + b_in
        if cell == "gru":
            u = h @ Urec + b_rec
            r = torch.sigmoid(g[:, :Hn] + u[:, :Hn])
            z = torch.sigmoid(g[:, Hn:2 * Hn] + u[:, Hn:2 * Hn])
            n = torch.tanh(g[:, 2 * Hn:] + r * u[:, 2 * Hn:])
            return z * h + (1 - z) * n, None
        u = h @ Urec
        i, f, gg, o = [(g + u)[:, k * Hn:(k + 1) * Hn] for k in range(4)]
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        return torch.sigmoid(o) * torch.tanh(c2), c2

    def attend(q, t):
        if score in ("additive", "concat"):
            pq = q @ P["query_kernel"] + P["query_bias"]
            scores = torch.tanh(pq[:, None, :] + keys) @ P["score_vector"]
        else:
            scores = torch.einsum("bd,bsd->bs", q, keys)
        allowed = smask
        gauss = None
        if local_window is not None:
            p = min(t, Sn - 1)
            dist = torch.arange(Sn, dtype=torch.float64) - p
            inside = dist.abs() <= local_window
            allowed = allowed & inside[None, :]
            gauss = torch.where(inside, torch.exp(-dist ** 2 * 2 / local_window ** 2), torch.zeros(()))
        a = torch.softmax(scores.masked_fill(~allowed, -torch.inf), dim=-1)
        a = torch.nan_to_num(a)
        if gauss is not None:
            a_used = a * gauss[None, :]
        else:
            a_used = a
        return torch.einsum("bs,bsk->bk", a_used, enc_t), a

    h = st[0]
    c = st[1] if cell == "lstm" else None
    feed = torch.zeros(enc.shape[0], Hn, dtype=torch.float64)
    outs, weights = [], []
    for t in range(ids.shape[1]):
        m = tmask[:, t:t + 1]
        if kind == "bahdanau":
            ctx, a = attend(h, t)
            h2, c2 = rnn(torch.cat([emb[:, t], ctx], dim=1), h, c)
            y = torch.where(m, h2, torch.zeros(()))
            out = y
        else:
            h2, c2 = rnn(torch.cat([emb[:, t], feed], dim=1), h, c)
            y = torch.where(m, h2, torch.zeros(()))
            ctx, a = attend(y, t)
            feed = torch.tanh(torch.cat([ctx, y], dim=1) @ P["attentional_kernel"])
            out = feed
        h = torch.where(m, h2, h)
        if c is not None:
            c = torch.where(m, c2, c)
        outs.append(out)
        weights.append(a)
    logits = torch.stack(outs, 1) @ P["output_kernel"] + P["output_bias"]
    return logits, torch.stack(weights, 1), P, enc_t, st


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_decoder_matches_step_by_step_torch(kind, score, cell, local_window):
    dec = make_decoder(kind, score, cell, local_window)
    ids, enc, states, smask, tmask = make_inputs(score, cell)
    logits = dec([ids, enc] + states, training=True, mask=tmask, source_mask=smask)
    R = np.random.default_rng(3).standard_normal(logits.shape).astype(np.float32)
    dec.zero_grad()
    _, denc, *dstates = dec.backward(R)

    ref_logits, ref_w, P, enc_t, st = torch_decoder(kind, score, cell, local_window, dec.params, ids, enc, states,
                                                     smask, tmask)
    (ref_logits * torch.tensor(R, dtype=torch.float64)).sum().backward()
    assert_close(logits, ref_logits.detach().numpy(), atol=1e-4, what="logits")
    assert_close(dec.attention_weights, ref_w.detach().numpy(), atol=1e-4, what="attention weights")
    assert_close(denc, enc_t.grad.numpy(), atol=1e-4, what="d encoder outputs")
    for d, s in zip(dstates, st):
        assert_close(d, s.grad.numpy(), atol=1e-4, what="d initial state")
    for name, g in dec.grads.items():
        assert_close(g, P[name].grad.numpy(), atol=1e-4, what=f"d {name}")
    # masked source positions get no weight, and every real row sums to one
    assert np.all(dec.attention_weights[1, :, 3:] == 0) and np.all(dec.attention_weights[2, :, 1:] == 0)


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_decoder_gradcheck_float64(kind, score, cell, local_window):
    dec = make_decoder(kind, score, cell, local_window, dtype="float64")
    ids, enc, states, smask, tmask = make_inputs(score, cell, dtype=np.float64)
    report = gradcheck(dec, [ids, enc] + states, call_kwargs={"mask": tmask, "source_mask": smask}, max_elements=12,
                       atol=1e-6)
    assert "inputs[1]" in report and "output_kernel" in report
