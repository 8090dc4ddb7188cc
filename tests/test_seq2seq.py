"""Seq2seq: fused Bahdanau / Luong decoders against a step-by-step PyTorch implementation of the
same equations, float64 gradient checks, layers applied twice against fresh twins, training on a
reversal task through Model.fit (callbacks, validation, check_numerics, save / load), greedy and
beam decoding, BLEU, the mask rule and bad input."""
import re
import threading

import numpy as np
import pytest
import torch

import attnx
from attnx import kernels, metrics
from attnx.masking import as_mask
from attnx.seq2seq import BahdanauDecoder, Encoder, LuongDecoder, Seq2Seq
from attnx.testing import assert_close, gradcheck

B, T, S, E, K, H, U, V = 3, 4, 5, 6, 7, 8, 5, 11

DECODERS = [
    ("bahdanau", "additive", "gru", None),
    ("bahdanau", "additive", "lstm", None),
    ("luong", "dot", "gru", None),
    ("luong", "general", "gru", None),
    ("luong", "concat", "lstm", None),
    ("luong", "general", "gru", 1),
    ("luong", "general", "gru", (2, "p")),
    ("luong", "concat", "lstm", (1, "p")),
]


def local_options(local):
    """A DECODERS entry's local attention: None (global), D (local-m) or (D, "p") (local-p)."""
    if local is None or isinstance(local, int):
        return {"local_window": local, "local_mode": "m"}
    return {"local_window": local[0], "local_mode": local[1]}


def make_decoder(kind, score, cell, local_window, dtype="float32", K=K, H=H, E=E, U=U, B=B, S=S):
    attnx.set_random_seed(0)
    if kind == "bahdanau":
        dec = BahdanauDecoder(V, E, H, cell=cell, attention_units=U, dtype=dtype)
    else:
        dec = LuongDecoder(V, E, H, score=score, cell=cell, attention_units=U, dtype=dtype,
                           **local_options(local_window))
    n = 2 if cell == "lstm" else 1
    dec.build([(B, T), (B, S, H if score == "dot" else K)] + [(B, H)] * n)
    dec.built = True
    rng = np.random.default_rng(1)
    for p in dec.params.values():  # larger than the initializers' so every path matters
        p[...] = rng.uniform(-0.6, 0.6, p.shape)
    return dec


def make_inputs(score, cell, dtype=np.float32, seed=2, B=B, S=S, K=K, H=H):
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
    window, mode = local_options(local_window).values()

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
        if window is not None:
            if mode == "p":  # p_t = L sigmoid(v_p . tanh(h_t W_p)), L the real source length
                lengths = smask.sum(1).to(torch.float64)
                p = lengths * torch.sigmoid(torch.tanh(q @ P["position_kernel"]) @ P["position_vector"])
            else:
                p = torch.full((q.shape[0],), float(min(t, Sn - 1)), dtype=torch.float64)
            dist = torch.arange(Sn, dtype=torch.float64)[None, :] - p[:, None]
            inside = dist.abs() <= window
            allowed = allowed & inside
            gauss = torch.where(inside, torch.exp(-dist ** 2 * 2 / window ** 2), torch.zeros(()))
        a = torch.softmax(scores.masked_fill(~allowed, -torch.inf), dim=-1)
        a = torch.nan_to_num(a)
        if gauss is not None:
            a_used = a * gauss
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
def test_decoder_matches_step_by_step_torch(kind, score, cell, local_window, units=H):
    dec = make_decoder(kind, score, cell, local_window, H=units)
    ids, enc, states, smask, tmask = make_inputs(score, cell, H=units)
    (logits, weights), cache = dec.apply([ids, enc] + states, training=True, mask=tmask, source_mask=smask,
                                         return_attention_scores=True)
    R = np.random.default_rng(3).standard_normal(logits.shape).astype(np.float32)
    dec.zero_grad()
    _, denc, *dstates = dec.backprop(cache, [R, None])

    ref_logits, ref_w, P, enc_t, st = torch_decoder(kind, score, cell, local_window, dec.params, ids, enc, states,
                                                     smask, tmask)
    (ref_logits * torch.tensor(R, dtype=torch.float64)).sum().backward()
    assert_close(logits, ref_logits.detach().numpy(), atol=1e-4, what="logits")
    assert_close(weights, ref_w.detach().numpy(), atol=1e-4, what="attention weights")
    assert_close(denc, enc_t.grad.numpy(), atol=1e-4, what="d encoder outputs")
    for d, s in zip(dstates, st):
        assert_close(d, s.grad.numpy(), atol=1e-4, what="d initial state")
    for name, g in dec.grads.items():
        assert_close(g, P[name].grad.numpy(), atol=1e-4, what=f"d {name}")
    # masked source positions get no weight, and every real row sums to one
    assert np.all(weights[1, :, 3:] == 0) and np.all(weights[2, :, 1:] == 0)


@pytest.mark.parametrize("units", [17, 20])
@pytest.mark.parametrize("kind,score,cell,local_window", [d for d in DECODERS if d[2] == "lstm"])
def test_lstm_decoder_tail_units_match_torch_on_every_level(kind, score, cell, local_window, units, level):
    """The decoders' LSTM steps with units past the last whole vector (rnn.hpp, lstm_tail_units;
    the gates' input terms come from the step's projection, not the fused product)."""
    test_decoder_matches_step_by_step_torch(kind, score, cell, local_window, units)


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_decoder_gradcheck_float64(kind, score, cell, local_window):
    dec = make_decoder(kind, score, cell, local_window, dtype="float64")
    ids, enc, states, smask, tmask = make_inputs(score, cell, dtype=np.float64)
    report = gradcheck(dec, [ids, enc] + states, call_kwargs={"mask": tmask, "source_mask": smask}, max_elements=12,
                       atol=1e-6)
    assert "inputs[1]" in report and "output_kernel" in report


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_step_api_equals_fused_teacher_forcing(kind, score, cell, local_window):
    dec = make_decoder(kind, score, cell, local_window)
    ids, enc, states, smask, _ = make_inputs(score, cell)
    logits, weights = dec([ids, enc] + states, source_mask=smask, return_attention_scores=True)
    state = dec.start_state(enc, states, smask)
    for t in range(T):
        step_logits, state, step_w = dec.step(ids[:, t], t, state, return_attention=True)
        assert_close(step_logits, logits[:, t], atol=1e-5, what=f"step {t} logits")
        assert_close(step_w, weights[:, t], atol=1e-6, what=f"step {t} weights")
    assert state.keys is not None or score == "dot"


@pytest.mark.parametrize("cell,bidirectional", [("gru", True), ("lstm", False)])
def test_encoder_gradcheck_float64(cell, bidirectional):
    attnx.set_random_seed(0)
    encoder = Encoder(9, 4, 3, cell=cell, bidirectional=bidirectional, dtype="float64")
    ids = np.array([[1, 5, 2, 0], [3, 8, 0, 0]])
    outs = encoder(ids, training=True)
    assert outs[0].shape == (2, 4, encoder.output_dim) and outs[1].tolist() == (ids != 0).tolist()
    rng = np.random.default_rng(0)
    R = [rng.standard_normal(outs[0].shape), None] + [rng.standard_normal(s.shape) for s in outs[2:]]

    def objective():
        o = encoder(ids, training=True)
        return sum(float(np.sum(a * r)) for a, r in zip(o, R) if r is not None)
    encoder.zero_grad()
    objective()
    encoder.backward(R)
    for name, p in encoder.params.items():
        flat, g = p.reshape(-1), encoder.grads[name].reshape(-1)
        for i in rng.choice(flat.size, min(6, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + 1e-6
            plus = objective()
            flat[i] = old - 1e-6
            minus = objective()
            flat[i] = old
            assert abs((plus - minus) / 2e-6 - g[i]) < 1e-6, name


# ------------------------------------------------------------------ a layer applied twice
def assert_grads_equal(grads, expected, what):
    for name, g in grads.items():
        assert_close(g, expected[name], atol=1e-10, rtol=1e-10, what=f"{what}: d {name}")


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_decoder_applied_twice_gets_both_calls_gradients(kind, score, cell, local_window):
    """Two training calls (different batches and source lengths), then backprop of the second call's
    cache before the first's: each call's input gradients and the sum of their parameter gradients
    equal those of two fresh twins called once each (float64, so only a real difference shows)."""
    shared = make_decoder(kind, score, cell, local_window, dtype="float64")
    calls = [make_inputs(score, cell, np.float64, seed=2), make_inputs(score, cell, np.float64, seed=7, S=6)]
    outputs, caches = zip(*(shared.apply([ids, enc] + states, training=True, mask=tmask, source_mask=smask)
                            for ids, enc, states, smask, tmask in calls))
    rng = np.random.default_rng(8)
    dys = [rng.standard_normal(out.shape) for out in outputs]
    shared.zero_grad()
    d_inputs = [shared.backprop(caches[i], dys[i]) for i in (1, 0)][::-1]
    summed = {name: np.zeros_like(g) for name, g in shared.grads.items()}
    for (ids, enc, states, smask, tmask), out, dy, d_in in zip(calls, outputs, dys, d_inputs):
        twin = make_decoder(kind, score, cell, local_window, dtype="float64")  # the same weights
        twin_out, cache = twin.apply([ids, enc] + states, training=True, mask=tmask, source_mask=smask)
        assert_close(out, twin_out, atol=1e-12, what="logits")
        for d, twin_d in zip(d_in[1:], twin.backprop(cache, dy)[1:]):
            assert_close(d, twin_d, atol=1e-12, what="input gradient")
        for name, g in twin.grads.items():
            summed[name] += g
    assert_grads_equal(shared.grads, summed, "shared decoder")


@pytest.mark.parametrize("cell,bidirectional", [("gru", True), ("lstm", False), ("lstm", True)])
def test_encoder_applied_twice_gets_both_calls_gradients(cell, bidirectional):
    attnx.set_random_seed(0)
    shared = Encoder(9, 4, 3, cell=cell, bidirectional=bidirectional, dtype="float64")
    calls = [np.array([[1, 5, 2, 0], [3, 8, 0, 0]]), np.array([[4, 4, 7, 1, 6], [2, 0, 0, 0, 0], [8, 3, 0, 0, 0]])]
    outputs, caches = zip(*(shared.apply(ids, training=True) for ids in calls))
    rng = np.random.default_rng(1)
    dys = [[rng.standard_normal(out[0].shape), None] + [rng.standard_normal(s.shape) for s in out[2:]]
           for out in outputs]
    shared.zero_grad()
    for i in (1, 0):
        assert shared.backprop(caches[i], dys[i]) is None
    summed = {name: np.zeros_like(g) for name, g in shared.grads.items()}
    for ids, out, dy in zip(calls, outputs, dys):
        twin = Encoder.from_config(shared.get_config())
        twin.build(ids.shape)
        twin.built = True
        twin.set_weights(shared.get_weights())
        twin_out, cache = twin.apply(ids, training=True)
        for a, b in zip(out, twin_out):
            assert_close(a, b, atol=1e-12, what="encoder outputs")
        twin.backprop(cache, dy)
        for name, g in twin.grads.items():
            summed[name] += g
    assert_grads_equal(shared.grads, summed, "shared encoder")


# ------------------------------------------------------------------ a small model end to end
def reversal_data(n, seed, vocab=13, max_len=6):
    """Sequences of ids 3..vocab-1 and their reversal as targets (<start> = 1, <end> = 2)."""
    rng = np.random.default_rng(seed)
    src = np.zeros((n, max_len), np.int64)
    tgt = np.zeros((n, max_len + 2), np.int64)
    for i, length in enumerate(rng.integers(3, max_len + 1, n)):
        s = rng.integers(3, vocab, length)
        src[i, :length] = s
        tgt[i, 0], tgt[i, 1:length + 1], tgt[i, length + 1] = 1, s[::-1], 2
    return src, tgt


def exact_match(tokens, targets):
    hits = 0
    for hyp, ref in zip(tokens.tolist(), targets[:, 1:].tolist()):
        ref = ref[:ref.index(2) + 1]
        hits += hyp[:len(ref)] == ref
    return hits / len(targets)


@pytest.fixture(scope="module")
def reversal_model():
    attnx.set_random_seed(0)
    src, tgt = reversal_data(3000, seed=0)
    model = Seq2Seq(13, 13, embedding_dim=16, units=32, attention="bahdanau", start_token=1, end_token=2,
                    max_length=8)
    model.compile(attnx.optimizers.Adam(0.01))
    model.fit(src, tgt, batch_size=64, epochs=5, verbose=0)
    return model


def test_reversal_trains_to_exact_match(reversal_model):
    src, tgt = reversal_data(300, seed=1)
    tokens, attention = reversal_model.greedy_decode(src)
    assert exact_match(tokens, tgt) >= 0.95
    losses = reversal_model.history.history["loss"]
    assert losses[-1] < losses[0] / 10
    # attention rows of real steps are distributions over the real source tokens
    lengths = (src != 0).sum(1)
    np.testing.assert_allclose(attention[:, 0].sum(-1), 1.0, atol=1e-5)
    # the first output looks at the last input (in nearly every row: one run of training, not a proof)
    assert np.mean(attention[:, 0].argmax(-1) == lengths - 1) >= 0.95


def test_beam_width_one_equals_greedy(reversal_model):
    src, _ = reversal_data(40, seed=2)
    tokens, attention = reversal_model.greedy_decode(src)
    beams = reversal_model.beam_search(src, width=1)
    for row, hyps in enumerate(beams):
        seq = tokens[row].tolist()
        n = seq.index(2)
        assert hyps[0].tokens == seq[:n]
        np.testing.assert_allclose(hyps[0].attention, attention[row, :n + 1], atol=1e-6)


def test_beam_search_returns_ranked_hypotheses_with_attention(reversal_model):
    src, tgt = reversal_data(20, seed=3)
    beams = reversal_model.beam_search(src, width=3, length_penalty=0.6)
    assert len(beams) == 20 and all(len(h) == 3 for h in beams)
    for row, hyps in enumerate(beams):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        ref = tgt[row, 1:].tolist()
        assert hyps[0].tokens == ref[:ref.index(2)]
        for h in hyps:
            assert h.attention.shape[1] == src.shape[1] and h.attention.shape[0] >= len(h.tokens)
            assert len(set(map(tuple, (h.tokens for h in hyps)))) == 3  # distinct hypotheses


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_decoder_state_select_equals_indexing_every_array(cell):
    """`DecoderState.select` keeps the source-only arrays in place when rows move among rows of one
    source (a beam step) and copies them otherwise; either way each row is the indexed row."""
    dec = make_decoder("luong", "general", cell, None)
    _, enc, states, smask, _ = make_inputs("general", cell)
    state = dec.start_state(enc, states, smask).select(np.repeat(np.arange(B), 2))
    _, state, _ = dec.step(np.ones(2 * B, np.int64), 0, state)
    for rows in (np.array([1, 1, 2, 3, 4, 4]), np.array([5, 4, 0, 1, 2, 2]), np.array([0, 1, 4, 5]),
                 np.array([True, False, True, True, False, True])):
        picked = state.select(rows)
        for name, array in state._asdict().items():
            if array is not None:
                np.testing.assert_array_equal(getattr(picked, name), array[rows], err_msg=name)
    assert state.select(np.array([1, 0, 3, 2, 5, 4])).encoder_outputs is state.encoder_outputs  # no copy


def fixed_batch_beam_search(decoder, state, start_id, end_id, width, alpha, max_length):
    """The beam search Seq2Seq had before attnx.decoding (kept here as the reference): a stable
    argsort over all W * V candidates and a fixed batch, every sentence stepping until all have ended."""
    B, W = len(state.h), width
    state = state.select(np.repeat(np.arange(B), W))
    scores = np.full((B, W), -np.inf)
    scores[:, 0] = 0.0
    history = [[[] for _ in range(W)] for _ in range(B)]
    lengths, done = np.zeros((B, W), dtype=np.int64), np.zeros((B, W), dtype=bool)
    prev = np.full(B * W, start_id, dtype=np.int64)
    for t in range(max_length):
        logits, state, _ = decoder.step(prev, t, state)
        z = logits.astype(np.float64)
        logp = (z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)))
        logp = logp.reshape(B, W, -1)
        V = logp.shape[-1]
        logp[done] = -np.inf
        logp[done, 0] = 0.0
        total = (scores[:, :, None] + logp).reshape(B, W * V)
        best = np.argsort(-total, axis=1, kind="stable")[:, :W]
        beam, word = best // V, best % V
        scores = np.take_along_axis(total, best, axis=1)
        state = state.select((np.arange(B)[:, None] * W + beam).reshape(-1))
        was_done = np.take_along_axis(done, beam, axis=1)
        lengths = np.take_along_axis(lengths, beam, axis=1) + ~was_done
        word = np.where(was_done, 0, word)
        history = [[history[b][beam[b, w]] + [int(word[b, w])] for w in range(W)] for b in range(B)]
        done = was_done | (word == end_id)
        prev = word.reshape(-1)
        if done.all():
            break
    results = []
    for b in range(B):
        hyps = []
        for w in range(W):
            seq = history[b][w][:lengths[b, w]]
            score = scores[b, w] / ((5.0 + lengths[b, w]) / 6.0) ** alpha
            hyps.append((seq[:-1] if seq and seq[-1] == end_id else seq, score))
        results.append(sorted(hyps, key=lambda h: -h[1]))
    return results


@pytest.mark.parametrize("cell, attention", [("gru", "bahdanau"), ("lstm", "luong")])
@pytest.mark.parametrize("width, alpha", [(1, 0.0), (3, 0.0), (5, 0.6), (13, 1.0)])
def test_beam_search_translates_as_the_fixed_batch_search_did(cell, attention, width, alpha):
    """The one beam search (finished sentences leave the batch, a partial top-k) gives Seq2Seq the
    translations of its former search for every width up to the vocabulary (beyond it the former
    search kept impossible hypotheses; now that is a ValueError)."""
    attnx.set_random_seed(5)  # barely trained: beams diverge, some end early, some run to max_length
    model = Seq2Seq(13, 13, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8, cell=cell,
                    attention=attention)
    src, tgt = reversal_data(64, seed=6)
    model.compile(attnx.optimizers.Adam(0.01))
    for _ in range(30):
        model.train_on_batch(src, tgt)
    src = src[:8]
    enc, smask, states = model._encode(src)
    want = fixed_batch_beam_search(model.decoder, model.decoder.start_state(enc, states, smask), 1, 2, width, alpha, 6)
    found = model.beam_search(src, width=width, length_penalty=alpha, max_length=6)
    for b in range(len(src)):
        assert [h.tokens for h in found[b]] == [w[0] for w in want[b]]
        np.testing.assert_allclose([h.score for h in found[b]], [w[1] for w in want[b]], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=re.escape("`width` must be an integer in [1, 13]")):
        model.beam_search(src, width=14)


def test_greedy_search_over_the_decoder_step_equals_the_fused_greedy_loop(reversal_model):
    """Seq2Seq's greedy decoding runs in one C++ call (`decoder_greedy`); over the decoder's step it is
    attnx.decoding.greedy_search, and both give the same words and attention."""
    from attnx import decoding
    src, _ = reversal_data(40, seed=8)
    tokens, attention = reversal_model.greedy_decode(src)
    enc, smask, states = reversal_model._encode(src)
    decoder = reversal_model.decoder
    found, _, found_attention = decoding.greedy_search(decoder, decoder.start_state(enc, states, smask), len(src),
                                                       reversal_model.start_id, reversal_model.end_id,
                                                       reversal_model.max_length)
    np.testing.assert_array_equal(found, tokens)
    np.testing.assert_allclose(found_attention, attention, atol=1e-6)


@pytest.mark.parametrize("cell, attention", [("gru", "bahdanau"), ("lstm", "luong")])
def test_every_beam_hypothesis_rescores_to_its_score_and_attention(cell, attention):
    """Each of the `width` hypotheses, fed back to the decoder word by word, gives its own score
    (sum of log-probabilities over the GNMT length penalty) and attention rows: the beams' histories
    follow their parents through the reorderings, for the lower-ranked hypotheses too."""
    attnx.set_random_seed(5)  # barely trained: beams diverge, some end early, some run to max_length
    model = Seq2Seq(13, 13, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8, cell=cell,
                    attention=attention)
    src, tgt = reversal_data(64, seed=6)
    model.compile(attnx.optimizers.Adam(0.01))
    for _ in range(30):
        model.train_on_batch(src, tgt)
    src = src[:6]
    alpha = 0.6
    beams = model.beam_search(src, width=4, length_penalty=alpha, max_length=6)
    enc, smask, states = model._encode(src)
    lengths_seen = set()
    for row, hyps in enumerate(beams):
        for hyp in hyps:
            full = list(hyp.tokens) + ([2] if len(hyp.attention) > len(hyp.tokens) else [])
            lengths_seen.add(len(full))
            state = model.decoder.start_state(enc[row:row + 1], [st[row:row + 1] for st in states],
                                              None if smask is None else smask[row:row + 1])
            prev, total, rows = np.array([1]), 0.0, []
            for position, word in enumerate(full):
                logits, state, weights = model.decoder.step(prev, position, state, return_attention=True)
                z = logits[0].astype(np.float64)
                total += (z - z.max() - np.log(np.exp(z - z.max()).sum()))[word]
                rows.append(weights[0])
                prev = np.array([word])
            # float32 to its rounding, not to the last bit: OpenBLAS' product of one row (the rescoring
            # here) and of a batch of beams may add in another order (2e-7 apart with its Haswell
            # kernels on Zen 5); a beam that followed a wrong parent is off by far more
            assert hyp.score == pytest.approx(total / ((5.0 + len(full)) / 6.0) ** alpha, rel=1e-5, abs=1e-6)
            np.testing.assert_allclose(hyp.attention, np.array(rows), atol=1e-6)
    assert len(lengths_seen) > 1, lengths_seen  # the check covered hypotheses of several lengths


def test_luong_bidirectional_lstm_trains():
    attnx.set_random_seed(0)
    src, tgt = reversal_data(2000, seed=4)
    model = Seq2Seq(13, 13, embedding_dim=16, units=32, attention="luong", score="concat", cell="lstm",
                    bidirectional=True, start_token=1, end_token=2, max_length=8)
    model.compile(attnx.optimizers.Adam(0.01))
    losses = model.fit(src, tgt, batch_size=64, epochs=4, verbose=0).history["loss"]
    assert losses[-1] < 0.2 * losses[0]


def small_model(**kwargs):
    attnx.set_random_seed(0)
    model = Seq2Seq(13, 13, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8, **kwargs)
    model.compile(attnx.optimizers.Adam(0.01))
    return model


def test_train_data_is_teacher_forcing_and_evaluate_its_masked_cross_entropy():
    model = small_model()
    src, tgt = reversal_data(16, seed=6)
    (source, decoder_input), targets = model.train_data(src, tgt)
    longest = int((tgt != 0).sum(1).max())  # the columns every row pads are cut
    np.testing.assert_array_equal(decoder_input, tgt[:, :longest - 1])
    np.testing.assert_array_equal(targets, tgt[:, 1:longest])
    logits = model([src, tgt[:, :-1]])
    loss = attnx.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0)(tgt[:, 1:], logits)
    assert model.evaluate(src, tgt, batch_size=16, verbose=0) == pytest.approx(float(loss), rel=1e-5)


def test_fit_takes_callbacks_and_validation_data(tmp_path):
    model = small_model()
    src, tgt = reversal_data(256, seed=6)
    val = reversal_data(64, seed=7)
    path = tmp_path / "checkpoint.attnx"
    # a min_delta no change reaches: the second epoch does not improve, and training stops there
    stop = attnx.callbacks.EarlyStopping(monitor="val_loss", min_delta=1e9, patience=1)
    history = model.fit(src, tgt, batch_size=32, epochs=10, validation_data=val, verbose=0,
                        callbacks=[stop, attnx.callbacks.ModelCheckpoint(path)])
    assert stop.stopped_epoch == 1 and history.epoch == [0, 1] and model.history is history
    assert len(history.history["val_loss"]) == 2 and history.history["loss"][1] < history.history["loss"][0]
    assert history.history["val_loss"][1] == pytest.approx(model.evaluate(*val, batch_size=32, verbose=0))
    loaded = attnx.load_model(path)  # saved after the last epoch
    assert isinstance(loaded, Seq2Seq)
    for name, p in model.params.items():
        np.testing.assert_array_equal(loaded.params[name], p)
    for a, b in zip(model.greedy_decode(val[0]), loaded.greedy_decode(val[0])):
        np.testing.assert_array_equal(a, b)


def test_fit_with_check_numerics():
    model = small_model()
    src, tgt = reversal_data(64, seed=6)
    history = model.fit(src, tgt, batch_size=32, epochs=1, verbose=0, check_numerics=True)
    assert np.isfinite(history.history["loss"][0])
    model.decoder.params["output_bias"][3] = np.nan
    with pytest.raises(attnx.models.NonFiniteError, match="output 0 of model .* in the forward pass"):
        model.fit(src, tgt, batch_size=32, epochs=1, verbose=0, check_numerics=True)


def test_loaded_model_continues_training_like_the_original(tmp_path):
    model = small_model(attention="luong", cell="lstm", bidirectional=True)
    src, tgt = reversal_data(96, seed=6)
    model.fit(src, tgt, batch_size=32, epochs=1, verbose=0)
    model.save(tmp_path / "model.attnx")
    loaded = attnx.load_model(tmp_path / "model.attnx")
    assert loaded.optimizer.iterations == model.optimizer.iterations == 3
    for m in (model, loaded):
        m.fit(src, tgt, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert loaded.history.history == model.history.history
    for name, p in model.params.items():
        np.testing.assert_array_equal(loaded.params[name], p)


def test_predicting_in_another_thread_does_not_disturb_training():
    src, tgt = reversal_data(128, seed=9)

    def trained_weights(predict_meanwhile):
        model = small_model()
        done = threading.Event()

        def predict_until_done():
            while not done.is_set():
                model.predict(src[:8])
        predictor = threading.Thread(target=predict_until_done)
        if predict_meanwhile:
            predictor.start()
        try:
            model.fit(src, tgt, batch_size=16, epochs=2, shuffle=False, verbose=0)
        finally:
            done.set()
            if predict_meanwhile:
                predictor.join()
        return model.get_weights()
    for alone, shared in zip(trained_weights(False), trained_weights(True)):
        np.testing.assert_array_equal(shared, alone)


def test_predict_gives_greedy_translations_padded_to_max_length(reversal_model):
    src, _ = reversal_data(40, seed=8)
    tokens, _ = reversal_model.greedy_decode(src)
    predicted = reversal_model.predict(src, batch_size=16)
    assert predicted.shape == (40, reversal_model.max_length)
    np.testing.assert_array_equal(predicted[:, :tokens.shape[1]], tokens)
    assert not predicted[:, tokens.shape[1]:].any()
    np.testing.assert_array_equal(reversal_model.predict_on_batch(src[:5]), predicted[:5])


# ------------------------------------------------------------------ texts, translate, BLEU
def tiny_corpus():
    words = {"one": "un", "two": "deux", "three": "trois", "cat": "chat", "dog": "chien"}
    rng = np.random.default_rng(0)
    keys = list(words)
    src, tgt = [], []
    for _ in range(400):
        chosen = list(rng.choice(keys, rng.integers(1, 4)))
        src.append("<start> " + " ".join(chosen) + " . <end>")
        tgt.append("<start> " + " ".join(words[w] for w in chosen) + " . <end>")
    return src, tgt


@pytest.fixture(scope="module")
def text_model():
    attnx.set_random_seed(0)
    src, tgt = tiny_corpus()
    model = Seq2Seq.from_texts(src, tgt, embedding_dim=16, units=32, max_length=8)
    model.compile(attnx.optimizers.Adam(0.01))
    model.fit_texts(src, tgt, batch_size=32, epochs=20, verbose=0)
    return model


def test_translate_returns_words_and_attention(text_model):
    translation, attention = text_model.translate("<start> cat two . <end>")
    assert translation == "chat deux ."
    assert attention.shape == (4, 5)  # 3 words + <end> by 5 source tokens
    np.testing.assert_allclose(attention.sum(1), 1.0, atol=1e-5)
    beam_translation, beam_attention = text_model.translate("<start> cat two . <end>", width=3)
    assert beam_translation == translation and beam_attention.shape == attention.shape
    src, tgt = tiny_corpus()
    assert text_model.evaluate_bleu(src[:50], tgt[:50]) > 0.9


def test_save_load_round_trip_translates_identically(text_model, tmp_path):
    path = tmp_path / "nmt.attnx"
    text_model.save(path)
    loaded = attnx.load_model(path)
    assert isinstance(loaded, Seq2Seq) and loaded.name == text_model.name
    for name, p in text_model.params.items():
        np.testing.assert_array_equal(loaded.params[name], p)
    assert loaded.source_tokenizer.word_index == text_model.source_tokenizer.word_index
    assert loaded.target_tokenizer.index_word == text_model.target_tokenizer.index_word
    for sentence in ("<start> cat two . <end>", "<start> one dog three . <end>"):
        words, attention = text_model.translate(sentence)
        loaded_words, loaded_attention = loaded.translate(sentence)
        assert loaded_words == words
        np.testing.assert_array_equal(loaded_attention, attention)
        assert loaded.translate(sentence, width=3)[0] == text_model.translate(sentence, width=3)[0]
    # the optimizer state came along: one more step gives the same loss and weights on both
    src = text_model.encode_sources(["<start> cat two . <end>", "<start> one . <end>"])
    tgt = text_model.encode_targets(["<start> chat deux . <end>", "<start> un . <end>"])
    assert loaded.optimizer.iterations == text_model.optimizer.iterations
    copy = attnx.load_model(path)
    assert copy.train_on_batch(src, tgt) == loaded.train_on_batch(src, tgt)
    for name, p in copy.params.items():
        np.testing.assert_array_equal(loaded.params[name], p)


def test_seq2seq_save_load_luong_local_p_and_corrupted_file(tmp_path):
    src, tgt = reversal_data(64, seed=5)
    attnx.set_random_seed(0)
    model = Seq2Seq(13, 13, embedding_dim=8, units=16, attention="luong", score="concat", cell="lstm",
                    bidirectional=True, local_window=2, local_mode="p", start_token=1, end_token=2, max_length=8)
    path = tmp_path / "luong.attnx"
    model.save(path)  # uncompiled, no tokenizers
    loaded = attnx.load_model(path)
    assert loaded.decoder.local_mode == "p" and not loaded.compiled
    tokens, attention = model.greedy_decode(src)
    loaded_tokens, loaded_attention = loaded.greedy_decode(src)
    np.testing.assert_array_equal(loaded_tokens, tokens)
    np.testing.assert_array_equal(loaded_attention, attention)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (tmp_path / "flipped.attnx").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupted"):
        attnx.load_model(tmp_path / "flipped.attnx")
    (tmp_path / "cut.attnx").write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        attnx.load_model(tmp_path / "cut.attnx")


def test_attention_heatmap_draws_translation(text_model):
    import matplotlib
    matplotlib.use("Agg")
    from attnx.plot import attention_heatmap
    sentence = "<start> one dog . <end>"
    translation, attention = text_model.translate(sentence)
    ax = attention_heatmap(attention, sentence.split(), translation.split() + ["<end>"])
    assert [t.get_text() for t in ax.get_xticklabels()] == sentence.split()


def test_corpus_bleu_hand_computed():
    hyp = "the cat sat on the mat".split()
    ref = "the cat sat on a mat".split()
    # p1 = 5/6 (the second "the" is clipped), p2 = 3/5, p3 = 2/4, p4 = 1/3; equal lengths: BP = 1
    assert metrics.corpus_bleu([[ref]], [hyp]) == pytest.approx((5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    # no 4-gram in common -> 0 without smoothing
    assert metrics.corpus_bleu([["a b c e".split()]], ["a b c d".split()]) == 0.0
    assert metrics.corpus_bleu([[ref]], [ref]) == pytest.approx(1.0)
    # two sentences: counts add over the corpus before the precisions are taken
    h1, r1 = "a b c d e".split(), "a b c d e".split()
    h2, r2 = "a b c d".split(), "a b c x y z".split()
    # p1 = 8/9, p2 = 6/7, p3 = 4/5, p4 = 2/3; c = 9, r = 11 -> BP = exp(1 - 11/9)
    expected = np.exp(1 - 11 / 9) * np.exp((np.log(8 / 9) + np.log(6 / 7) + np.log(4 / 5) + np.log(2 / 3)) / 4)
    assert metrics.corpus_bleu([[r1], [r2]], [h1, h2]) == pytest.approx(expected)
    # the closest reference length sets r (ties: the shorter); clipping by the max count in one reference
    assert metrics.corpus_bleu([["a b c".split(), "a b c d q".split()]], [h2], max_n=1) == pytest.approx(1.0)
    assert metrics.corpus_bleu([[r2, "a b c d q".split()]], [h2], max_n=1) == pytest.approx(np.exp(1 - 5 / 4))
    assert metrics.corpus_bleu([["the cat".split()]], ["the the the".split()], max_n=1) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="2 reference lists but 1"):
        metrics.corpus_bleu([[r1], [r2]], [h1])


# ------------------------------------------------------------------ bad input
def test_bad_input_raises_clear_errors(text_model):
    with pytest.raises(ValueError, match="empty sentence"):
        text_model.translate("")
    with pytest.raises(ValueError, match="empty sentence"):
        text_model.translate("<start> <end>")
    with pytest.raises(ValueError, match=r"unknown source word\(s\) \['zebra'\]"):
        text_model.translate("<start> cat zebra . <end>")
    source = text_model.encode_sources(["<start> cat . <end>"])
    V = text_model.decoder.vocab_size
    for width in (0, V + 1, 2.0, True):
        with pytest.raises(ValueError, match=re.escape(f"Seq2Seq.beam_search: `width` must be an integer in [1, {V}]")):
            text_model.beam_search(source, width=width)
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number >= 0"):
        text_model.beam_search(source, length_penalty=-0.5)
    with pytest.raises(ValueError, match=re.escape(f"`end_token` must be a token id in [0, {V})")):
        text_model.beam_search(source, end_token=V)
    src = text_model.encode_sources(["<start> cat . <end>"])
    long_target = np.array([[text_model.start_id] + [3] * 12])
    with pytest.raises(ValueError, match="longer than max_length=8"):
        text_model.train_on_batch(src, long_target)
    with pytest.raises(TypeError, match="expected a str sentence"):
        text_model.translate(["cat"])


def test_decoder_bad_input():
    dec = make_decoder("bahdanau", "additive", "gru", None)
    ids, enc, states, smask, tmask = make_inputs("additive", "gru")
    with pytest.raises(ValueError, match=r"`encoder_outputs` expected last axis of size 7"):
        dec([ids, enc[..., :5]] + states)
    with pytest.raises(IndexError, match=r"target token id 11 out of range \[0, 11\)"):
        dec([np.full_like(ids, V), enc] + states)
    with pytest.raises(ValueError, match=r"`initial_state\[0\]` expected shape \(3, 8\), got \(3, 7\)"):
        dec([ids, enc, states[0][:, :7]])
    with pytest.raises(ValueError, match="expected 1 initial state"):
        dec([ids, enc] + states * 2)
    with pytest.raises(RuntimeError, match="forward pass with training=True"):
        dec([ids, enc] + states)
        dec.backward(np.zeros((B, T, V)))
    with pytest.raises(ValueError, match="score"):
        LuongDecoder(V, E, H, score="bilinear")
    with pytest.raises(ValueError, match="dot score needs encoder outputs of size units=8"):
        make_decoder("luong", "dot", "gru", None, K=K).build([(B, T), (B, S, K), (B, H)])


BAD_MASKS = {
    "float": lambda batch, steps: np.ones((batch, steps), np.float32),
    "wrong steps": lambda batch, steps: np.ones((batch, steps - 1), bool),
    "one row for the batch": lambda batch, steps: np.ones((1, steps), bool),
    "integers other than 0 and 1": lambda batch, steps: np.full((batch, steps), 2),
    "lengths too long": lambda batch, steps: np.full(batch, steps + 1),
    "negative lengths": lambda batch, steps: np.full(batch, -1),
    "lengths of another batch": lambda batch, steps: np.full(batch + 1, 1),
}


@pytest.mark.parametrize("arg", ["mask", "source_mask"])
@pytest.mark.parametrize("bad", list(BAD_MASKS))
def test_bad_masks_raise_the_mask_rule_errors(arg, bad):
    """Every decoder entry point words a bad mask as `attnx.masking.as_mask` does for every layer."""
    dec = make_decoder("luong", "general", "gru", None)
    ids, enc, states, _, _ = make_inputs("general", "gru")
    steps = T if arg == "mask" else S
    mask = BAD_MASKS[bad](B, steps)
    with pytest.raises((TypeError, ValueError)) as expected:
        as_mask(mask, B, steps, f"Layer '{dec.name}': `{arg}`")
    calls = [lambda: dec([ids, enc] + states, **{arg: mask})]
    if arg == "source_mask":
        calls += [lambda: dec.start_state(enc, states, mask),
                  lambda: dec.greedy(enc, states, 1, 2, 4, mask)]
    for call in calls:
        with pytest.raises(expected.type, match=re.escape(str(expected.value))):
            call()


def test_integer_masks_and_lengths_equal_bool_masks():
    dec = make_decoder("bahdanau", "additive", "lstm", None)
    ids, enc, states, smask, tmask = make_inputs("additive", "lstm")
    expected = dec([ids, enc] + states, mask=tmask, source_mask=smask)
    np.testing.assert_array_equal(dec([ids, enc] + states, mask=tmask.astype(np.int32),
                                      source_mask=smask.astype(np.uint8)), expected)
    np.testing.assert_array_equal(dec([ids, enc] + states, mask=tmask.sum(1), source_mask=smask.sum(1)), expected)
    # a target row of length 0 is allowed (the mask rule) and gives finite logits
    logits = dec([ids, enc] + states, mask=np.array([0, T, T]), source_mask=smask)
    assert np.all(np.isfinite(logits))


def test_fully_masked_source_gives_zero_context_not_nan():
    dec = make_decoder("luong", "general", "gru", None)
    ids, enc, states, smask, _ = make_inputs("general", "gru")
    smask[0] = False
    (logits, weights), cache = dec.apply([ids, enc] + states, training=True, source_mask=smask,
                                         return_attention_scores=True)
    assert np.all(np.isfinite(logits)) and np.all(weights[0] == 0)
    _, denc, dh = dec.backprop(cache, [np.ones_like(logits), None])
    assert np.all(np.isfinite(denc)) and np.all(denc[0] == 0) and np.all(np.isfinite(dh))


def test_local_p_gradient_reaches_the_position_predictor():
    dec = make_decoder("luong", "general", "gru", (2, "p"))
    ids, enc, states, smask, tmask = make_inputs("general", "gru")
    logits = dec([ids, enc] + states, training=True, mask=tmask, source_mask=smask)
    dec.zero_grad()
    dec.backward(np.random.default_rng(3).standard_normal(logits.shape).astype(np.float32))
    assert np.abs(dec.grads["position_kernel"]).max() > 1e-4 and np.abs(dec.grads["position_vector"]).max() > 1e-4
    with pytest.raises(ValueError, match="local_mode"):
        LuongDecoder(V, E, H, local_window=2, local_mode="q")


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_decoder_rows_split_across_threads_match_one_thread(kind, score, cell, local_window):
    """Large enough that the time loop's batch rows run on two threads: same results as on one
    (float64, so that only a real difference in the math shows)."""
    sizes = dict(B=16, S=7, K=24, H=32)
    dec = make_decoder(kind, score, cell, local_window, dtype="float64", E=16, U=16, **sizes)
    ids, enc, states, smask, tmask = make_inputs(score, cell, dtype=np.float64, **sizes)
    ids = np.random.default_rng(4).integers(1, V, (16, 6))
    tmask = np.ones(ids.shape, bool)
    tmask[0, 3:] = False
    R = np.random.default_rng(5).standard_normal((16, 6, V))
    results = []
    for threads in (1, 2):
        attnx.set_num_threads(threads)
        try:
            (logits, weights), cache = dec.apply([ids, enc] + states, training=True, mask=tmask,
                                                 source_mask=smask, return_attention_scores=True)
            dec.zero_grad()
            grads = dec.backprop(cache, [R, None])
            results.append([logits, weights] + grads[1:] + [g.copy() for g in dec.grads.values()])
        finally:
            attnx.set_num_threads(2)
    for one, two in zip(*results):
        assert_close(two, one, atol=1e-9, rtol=1e-9, what="two threads vs one")


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
def test_greedy_equals_step_loop(kind, score, cell, local_window):
    dec = make_decoder(kind, score, cell, local_window)
    _, enc, states, smask, _ = make_inputs(score, cell)
    end_id = 4
    tokens, attention = dec.greedy(enc, states, 1, end_id, 7, smask)
    state, prev, done = dec.start_state(enc, states, smask), np.ones(B, np.int64), np.zeros(B, bool)
    for t in range(tokens.shape[1]):
        logits, state, weights = dec.step(prev, t, state, return_attention=True)
        prev = np.where(done, 0, logits.argmax(-1))
        np.testing.assert_array_equal(tokens[:, t], prev)
        assert_close(attention[:, t], np.where(done[:, None], 0, weights), atol=1e-6, what=f"step {t} weights")
        done |= prev == end_id
    assert tokens.shape[1] == 7 or done.all()


@pytest.mark.parametrize("variant", range(len(DECODERS)))
def test_mixed_bfloat16_rows_do_not_depend_on_their_batch(variant):
    """Under mixed_bfloat16 every product, the steps' too, rounds each row's operands alone and sums them
    in the same order: a row's logits and state are the same alone (one row: no streamed float32 path) as
    in the batch, and its weights' gradients add up to the batch's."""
    kind, score, cell, local_window = DECODERS[variant]
    dec = make_decoder(kind, score, cell, local_window, dtype="mixed_bfloat16")
    ids, enc, states, source_mask, target_mask = make_inputs(score, cell)
    dy = np.random.default_rng(4).standard_normal((B, T, V)).astype(np.float32)

    def run(rows):
        logits, cache = dec.apply([ids[rows], enc[rows]] + [s[rows] for s in states], training=True,
                                  mask=target_mask[rows], source_mask=source_mask[rows])
        dec.zero_grad()
        dec.backprop(cache, dy[rows])
        return logits, {k: g.copy() for k, g in dec.grads.items()}

    logits, grads = run(slice(None))
    summed = {k: np.zeros_like(g) for k, g in grads.items()}
    for b in range(B):
        row_logits, row_grads = run(slice(b, b + 1))
        np.testing.assert_array_equal(row_logits[0], logits[b])
        for k in summed:
            summed[k] += row_grads[k]
    for k, g in grads.items():
        np.testing.assert_allclose(summed[k], g, rtol=1e-4, atol=1e-5, err_msg=k)


# ------------------------------------------------------------------ greedy decoding at one row
def eager_greedy(dec, enc, states, smask, start_id, end_id, max_length):
    """Greedy decoding of one row over the decoder's Python step (float32 logits from the eager kernel):
    its words and their summed log probabilities (float64 log-softmax of the step's logits)."""
    state, prev, words, score = dec.start_state(enc, states, smask), np.array([start_id]), [], 0.0
    for t in range(max_length):
        logits, state, _ = dec.step(prev, t, state)
        row = logits[0].astype(np.float64)
        word = int(np.argmax(logits[0]))
        score += row[word] - row.max() - np.log(np.exp(row - row.max()).sum())
        words.append(word)
        prev = np.array([word])
        if word == end_id:
            break
    return words, score


def assert_greedy_is_eager(dec, enc, states, smask, start_id=1, end_id=2, max_length=12):
    """The decoder's greedy decoding of one row (its output layer screened in int8: seq2seq.hpp's
    OutputScreen) picks the eager step's words; `decoding.greedy_search`, which returns the scores,
    keeps them float32's (its logits unscreened)."""
    from attnx import decoding
    tokens, _ = dec.greedy(enc, states, start_id, end_id, max_length, smask)
    words, score = eager_greedy(dec, enc, states, smask, start_id, end_id, max_length)
    assert tokens[0, :len(words)].tolist() == words
    assert not tokens[0, len(words):].any()
    found, scores, _ = decoding.greedy_search(dec, dec.start_state(enc, states, smask), 1, start_id, end_id,
                                              max_length)
    np.testing.assert_array_equal(found, tokens)
    np.testing.assert_allclose(scores[0], score, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,score,cell,local_window", DECODERS)
@pytest.mark.parametrize("ties", [False, True])
def test_greedy_at_one_row_picks_the_eager_words(kind, score, cell, local_window, ties):
    """At one row the compiled greedy search screens the output layer with an int8 copy of it and computes
    again in float32 the words that can win: its words are the eager step's, for every decoder, with a
    vocabulary of 600 words and with ties (equal and nearly equal output columns) at the top."""
    vocab, h = 600, 24
    attnx.set_random_seed(0)
    options = {"attention_units": U} if kind == "bahdanau" else {"score": score, "attention_units": U,
                                                                  **local_options(local_window)}
    dec = (BahdanauDecoder if kind == "bahdanau" else LuongDecoder)(vocab, E, h, cell=cell, **options)
    n = 2 if cell == "lstm" else 1
    dec.build([(1, T), (1, S, h if score == "dot" else K)] + [(1, h)] * n)
    dec.built = True
    rng = np.random.default_rng(3)
    for p in dec.params.values():
        p[...] = rng.uniform(-0.6, 0.6, p.shape)
    if ties:  # every word's column equal to one of four, biases equal: ties everywhere, near ties by 2^-12
        W, b = dec.params["output_kernel"], dec.params["output_bias"]
        W[:] = W[:, rng.integers(0, 4, vocab)] * (1 + np.float32(2 ** -12) * rng.integers(0, 2, vocab))
        b[:] = 0.25
    _, enc, states, smask, _ = make_inputs(score, cell, H=h)
    for row in range(B):
        assert_greedy_is_eager(dec, enc[row:row + 1], [s[row:row + 1] for s in states], smask[row:row + 1])


def test_greedy_at_one_row_follows_every_weight_change(tmp_path):
    """The int8 screen of the output layer is kept between calls and checked against the weights at
    every call: after optimizer steps, writes into the weight's own array (a word's column turned
    towards the first step's state, so that the word wins only if the screen sees the write; then the
    whole array), set_weights and load_weights (the arrays written in place) and load_model, the
    words are the eager step's."""
    attnx.set_random_seed(1)
    model = Seq2Seq(13, 40, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8)
    src, tgt = reversal_data(32, seed=3)
    source = src[:1]

    def check(model=model):
        enc, smask, states = model._encode(source)
        tokens, _ = model.greedy_decode(source)
        words, _ = eager_greedy(model.decoder, enc, states, smask, 1, 2, model.max_length)
        assert tokens[0, :len(words)].tolist() == words
        assert_greedy_is_eager(model.decoder, enc, states, smask, max_length=model.max_length)
        return words

    check()
    model.compile(attnx.optimizers.Adam(0.05))
    for _ in range(3):
        model.train_on_batch(src, tgt)
        check()
    enc, smask, states = model._encode(source)
    dec = model.decoder
    _, state, _ = dec.step(np.array([1]), 0, dec.start_state(enc, states, smask))
    W = dec.params["output_kernel"]
    assert check()[0] != 37
    W[:, 37] = 10 * state.h[0] / np.linalg.norm(state.h[0])
    assert check()[0] == 37
    W[...] = np.random.default_rng(0).uniform(-1, 1, W.shape)
    assert check()[0] != 37
    weights = model.get_weights()
    other = Seq2Seq(13, 40, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8)
    model.set_weights(other.get_weights())
    assert check() == check(other)
    model.set_weights(weights)
    check()
    other.save_weights(tmp_path / "other.attnx")
    model.load_weights(tmp_path / "other.attnx")
    assert check() == check(other)
    model.set_weights(weights)
    model.save(tmp_path / "model.attnx")
    loaded = attnx.load_model(tmp_path / "model.attnx")
    assert check(loaded) == check()


# ------------------------------------------------------------------ greedy_decode in one C++ call
def _random_weights(model, seed):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()])


@pytest.mark.parametrize("attention,cell", [("bahdanau", "gru"), ("bahdanau", "lstm"), ("luong", "gru"),
                                            ("luong", "lstm")])
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16", "float64"])
def test_greedy_decode_in_one_call_is_the_eager_encoder_and_search(attention, cell, dtype):
    """greedy_decode runs the encoder and the search in one C++ call (kernels.seq2seq_greedy): its tokens and
    attention are, bit for bit, those of the layers' eager encoder followed by the decoder's search, at one
    row and over a batch of sources padded after their words, in the middle, or to a single word."""
    attnx.set_random_seed(2)
    model = Seq2Seq(50, 60, embedding_dim=8, units=16, attention=attention, cell=cell, start_token=1, end_token=2,
                    max_length=10, dtype=dtype)
    _random_weights(model, 4)
    assert model._one_call_encoder() is not None
    source = np.random.default_rng(0).integers(1, 50, (5, 9))
    source[1, 6:] = 0
    source[2, 3] = 0
    source[3, 1:] = 0
    calls = []
    one_call = kernels.seq2seq_greedy
    try:
        kernels.seq2seq_greedy = lambda **kw: calls.append(1) or one_call(**kw)
        for rows in (source[:1], source[1:2], source[3:4], source):
            tokens, weights = model.greedy_decode(rows)
            enc, smask, states = model._encode(rows)
            want_tokens, want_weights = model.decoder.greedy(enc, states, 1, 2, 10, smask)
            np.testing.assert_array_equal(tokens, want_tokens)
            np.testing.assert_array_equal(weights, want_weights)
    finally:
        kernels.seq2seq_greedy = one_call
    assert len(calls) == 4


def test_greedy_decode_in_one_call_follows_encoder_writes_and_refuses_bad_ids():
    """The one-call path reads the encoder's arrays as they are at each call (a write in place into the
    embedding or the recurrent kernel changes the translation exactly as it changes the eager encoder's);
    a source id past the vocabulary is an IndexError naming the call and the id; an encoder it does not
    compute (bidirectional, quantized) decodes through the layers, as before."""
    attnx.set_random_seed(3)
    model = Seq2Seq(30, 40, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8)
    _random_weights(model, 5)
    source = np.array([[4, 9, 17, 3, 0]])

    def eager():
        enc, smask, states = model._encode(source)
        return model.decoder.greedy(enc, states, 1, 2, 8, smask)[0]
    np.testing.assert_array_equal(model.greedy_decode(source)[0], eager())
    before = model.greedy_decode(source)[0]
    model.encoder.embedding.params["embeddings"][[4, 9, 17]] *= -3.0
    model.encoder.rnn.params["recurrent_kernel"][:] = np.random.default_rng(1).uniform(-1, 1, (16, 48))
    after = model.greedy_decode(source)[0]
    np.testing.assert_array_equal(after, eager())
    assert not np.array_equal(after, before)
    with pytest.raises(IndexError, match=r"seq2seq_greedy: source: token id 30 out of range \[0, 30\)"):
        model.greedy_decode(np.array([[4, 30]]))
    bidirectional = Seq2Seq(30, 40, embedding_dim=8, units=16, bidirectional=True, start_token=1, end_token=2,
                            max_length=8)
    assert bidirectional._one_call_encoder() is None
    assert bidirectional.greedy_decode(source)[0].shape[0] == 1
    model.quantize("int8")
    assert model._one_call_encoder() is None
    assert model.greedy_decode(source)[0].shape[0] == 1
