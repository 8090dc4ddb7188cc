"""The one C++ search (`cpp/include/attnx/search.hpp`, through `attnx.decoding`) against the Python
search it replaced (the previous release's `decoding.greedy_search` / `beam_search`, kept below as
the reference, run over the models' Python `step`): the same tokens, scores to float32 noise and the
same attention for the Transformer (its compiled decoder stack, and its Python step called back) and
Seq2Seq's attention decoders, greedy and beam widths 1 to 4, batches whose rows finish at different
steps, with and without a length penalty; and the bad arguments that still raise the same errors."""
import re

import numpy as np
import pytest

import attnx
from attnx import decoding
from attnx.decoding import Hypothesis


# ----------------------------------------------------------------------------- the reference (previous release)
def top_k(total, k):
    """The indices of the k largest entries of each row, largest first, ties to the smaller index
    (``np.argsort(-total, kind="stable")[:, :k]``) without sorting whole rows: the entries at least
    as large as each row's k-th largest are the only candidates."""
    kth = np.partition(total, total.shape[1] - k, axis=1)[:, total.shape[1] - k]
    rows, cols = np.nonzero(total >= kth[:, None])
    order = np.lexsort((cols, -total[rows, cols], rows))
    starts = np.cumsum(np.bincount(rows, minlength=len(total))) - np.bincount(rows, minlength=len(total))
    return cols[order][starts[:, None] + np.arange(k)]


def _step_attention_array(batch, weights, steps):
    """Zeros for the attention of `batch` rows over `steps` steps, shaped as one step's `weights`
    (N, ..., S) with the step axis before the source axis: (batch, ..., steps, S)."""
    return np.zeros((batch,) + weights.shape[1:-1] + (steps, weights.shape[-1]), dtype=weights.dtype)


def old_greedy_search(decoder, state, batch, start_id, end_id, max_length):
    """The most likely next token at every step; a row leaves the batch at its end token.

    Args:
        decoder: has the step protocol (module docstring); state: its start state for `batch` rows.
        start_id, end_id: the first input token and the token that ends a row; max_length: most steps.
    Returns:
        (tokens (B, L) with the end token and 0 after it, scores (B,) the summed log probabilities,
        attention (B, ..., L, S), zero after a row's end), L <= max_length.
    """
    tokens = np.zeros((batch, max_length), dtype=np.int64)
    scores = np.zeros(batch)
    attention = None
    active = np.arange(batch)
    prev = np.full(batch, start_id, dtype=np.int64)
    steps = 0
    for t in range(max_length):
        logits, state, weights = decoder.step(prev, t, state, return_attention=True)
        if attention is None:
            attention = _step_attention_array(batch, weights, max_length)
        word = logits.argmax(axis=1)  # the first maximum: ties to the lowest id
        logp = decoding.log_softmax(logits.astype(np.float64))
        scores[active] += logp[np.arange(len(word)), word]
        tokens[active, t] = word
        attention[active, ..., t, :] = weights
        steps = t + 1
        going = word != end_id
        if not going.all():
            active, state = active[going], state.select(going)
        if not active.size:
            break
        prev = word[going]
    return tokens[:, :steps], scores, attention[..., :steps, :]


def old_beam_search(decoder, state, batch, start_id, end_id, width, alpha, max_length):
    """Batched beam search: the `batch` inputs' `width` hypotheses run as rows of one step; an input
    leaves the batch once all its beams have ended, so the remaining steps run on fewer rows.

    The rule: every step extends each live hypothesis by every word and keeps, per input, the
    `width` best totals (the summed log probabilities), ties to the earliest beam, then the lowest
    id; a finished hypothesis stays in its beam, extended by padding at no cost. The final scores
    are divided by GNMT's length penalty ((5 + len) / 6) ** alpha, len counting the end token.

    Args:
        decoder: has the step protocol (module docstring); state: its start state for `batch` rows.
        start_id, end_id: the first input token and the token that ends a hypothesis.
        width: beams per input, checked by the caller (`beam_width`: 1 to the vocabulary size;
            1 gives greedy decoding); alpha: the length penalty's, >= 0.
        max_length: most tokens per hypothesis.
    Returns:
        For each input, its `width` `Hypothesis`es, best first.
    """
    B, W = batch, width
    state = state.select(np.repeat(np.arange(B), W))
    scores = np.full((B, W), -np.inf)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    lengths = np.zeros((B, W), dtype=np.int64)
    done = np.zeros((B, W), dtype=bool)
    # per step, for every input: each beam's parent, its token (0 once finished) and attention; the
    # histories are read back through the parents at the end instead of gathered at every step
    parents, words, step_weights = [], [], []
    active = np.arange(B)
    prev = np.full(B * W, start_id, dtype=np.int64)
    for t in range(max_length):
        logits, state, weights = decoder.step(prev, t, state, return_attention=True)
        A = len(active)
        logp = decoding.log_softmax(logits.astype(np.float64)).reshape(A, W, -1)
        V = logp.shape[-1]
        finished = done[active]
        logp[finished] = -np.inf  # a finished hypothesis extends only with padding, at no cost
        logp[finished, 0] = 0.0
        total = (scores[active][:, :, None] + logp).reshape(A, W * V)
        best = top_k(total, W)  # flat index beam * V + word: ties to the earliest beam, then the lowest id
        beam, word = best // V, best % V
        pick = (np.arange(A)[:, None] * W + beam).reshape(-1)
        state = state.select(pick)
        was_done = np.take_along_axis(finished, beam, axis=1)
        scores[active] = np.take_along_axis(total, best, axis=1)
        lengths[active] = np.take_along_axis(lengths[active], beam, axis=1) + ~was_done
        parent = np.tile(np.arange(W), (B, 1))  # an input that has left keeps its beams in place
        parent[active] = beam
        word = np.where(was_done, 0, word)
        step_words = np.zeros((B, W), dtype=np.int64)
        step_words[active] = word
        picked = weights[pick].reshape((A, W) + weights.shape[1:])
        step_attention = np.zeros((B, W) + weights.shape[1:], dtype=weights.dtype)
        step_attention[active] = np.where(was_done.reshape((A, W) + (1,) * (weights.ndim - 1)), 0, picked)
        parents.append(parent)
        words.append(step_words)
        step_weights.append(step_attention)
        done[active] = was_done | (word == end_id)
        going = ~done[active].all(axis=1)
        if not going.all():
            active, state = active[going], state.select(np.repeat(going, W))
        if not active.size:
            break
        prev = step_words[active].reshape(-1)
    return old_backtrack(parents, words, step_weights, scores, lengths, alpha, end_id)


def old_backtrack(parents, words, step_weights, scores, lengths, alpha, end_id):
    """The hypotheses of `beam_search`, read back through the parents."""
    B, W = scores.shape
    steps = len(words)
    tokens = np.zeros((B, W, steps), dtype=np.int64)
    attention = np.zeros((B, W, steps) + step_weights[0].shape[2:], dtype=step_weights[0].dtype)
    beam = np.broadcast_to(np.arange(W), (B, W))
    for t in reversed(range(steps)):
        tokens[:, :, t] = np.take_along_axis(words[t], beam, axis=1)
        picked = beam.reshape((B, W) + (1,) * (step_weights[t].ndim - 2))
        attention[:, :, t] = np.take_along_axis(step_weights[t], picked, axis=1)
        beam = np.take_along_axis(parents[t], beam, axis=1)
    attention = np.moveaxis(attention, 2, -2)  # the step axis before the source axis, as greedy_search's
    results = []
    for b in range(B):
        hyps = []
        for w in range(W):
            n = int(lengths[b, w])
            seq = tokens[b, w, :n].tolist()
            if seq and seq[-1] == end_id:
                seq = seq[:-1]
            hyps.append(Hypothesis(seq, float(scores[b, w]) / decoding.length_penalty(n, alpha),
                                   np.ascontiguousarray(attention[b, w, ..., :n, :])))
        hyps.sort(key=lambda h: -h.score)
        results.append(hyps)
    return results


# ----------------------------------------------------------------------------- models
def _transformer(norm_first=False, activation="relu", tie_output=False, positions="sinusoidal", dtype="float32",
                 end_bias=-0.3):
    attnx.set_random_seed(3)
    model = attnx.seq2seq.Transformer(23, 19, model_dim=16, num_heads=4, intermediate_dim=24, num_encoder_layers=1,
                                      num_decoder_layers=2, dropout=0.0, norm_first=norm_first, activation=activation,
                                      tie_output=tie_output, positions=positions, max_positions=16, start_token=1,
                                      end_token=2, max_length=9, dtype=dtype)
    if not tie_output:  # rows end at different steps
        model.output_projection.params["bias"][2] += end_bias
    return model


TRANSFORMERS = {
    "post-norm": lambda: _transformer(),
    "pre-norm gelu": lambda: _transformer(norm_first=True, activation="gelu", end_bias=-0.1),
    "tied learned": lambda: _transformer(tie_output=True, positions="learned"),
    "float64": lambda: _transformer(dtype="float64"),
}

SOURCE = np.array([[3, 4, 5, 6, 7, 8], [9, 10, 0, 0, 0, 0], [11, 12, 13, 0, 0, 0], [14, 0, 0, 0, 0, 0],
                   [15, 16, 17, 18, 19, 0]])


def _tolerance(model):
    return 1e-10 if model.dtype.name == "float64" else 2e-5


def _python_step(model):
    """`model` searched over its Python step (the C++ search calling it back)."""
    model.compiled_step = lambda state, max_length: None
    return model


def _assert_same_beams(found, want, tol):
    assert len(found) == len(want)
    for f_hyps, w_hyps in zip(found, want):
        assert [h.tokens for h in f_hyps] == [h.tokens for h in w_hyps]
        np.testing.assert_allclose([h.score for h in f_hyps], [h.score for h in w_hyps], rtol=tol, atol=tol)
        for f, w in zip(f_hyps, w_hyps):
            assert f.attention.shape == w.attention.shape and f.attention.dtype == w.attention.dtype
            np.testing.assert_allclose(f.attention, w.attention, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", list(TRANSFORMERS))
@pytest.mark.parametrize("path", ["compiled", "python step"])
def test_transformer_search_equals_the_python_search(kind, path):
    model = TRANSFORMERS[kind]()
    if path == "python step":
        _python_step(model)
    source = model._source(SOURCE)
    tol = _tolerance(model)
    tokens, scores, attention = model.greedy_decode(SOURCE)
    want = old_greedy_search(model, model._start(source), len(source), 1, 2, 9)
    np.testing.assert_array_equal(tokens, want[0])
    np.testing.assert_allclose(scores, want[1], rtol=tol, atol=tol)
    np.testing.assert_allclose(attention, want[2], rtol=tol, atol=tol)
    assert attention.shape[1] == model.num_heads and attention.dtype == want[2].dtype
    ended = (tokens == 2).any(axis=1)
    assert 0 < ended.sum() < len(ended) or kind == "tied learned"  # rows leave the batch while others decode
    for width in (1, 2, 3, 4):
        for alpha in (0.0, 0.6):
            found = model.beam_search(SOURCE, width, alpha)
            _assert_same_beams(found, old_beam_search(model, model._start(source), len(source), 1, 2, width, alpha, 9),
                               tol)


def test_transformer_translate_batch_is_the_best_beam_and_attention_is_optional():
    model = TRANSFORMERS["post-norm"]()
    found = model.beam_search(SOURCE, 3, 0.6, return_attention=False)
    with_attention = model.beam_search(SOURCE, 3, 0.6)
    assert all(h.attention is None for hyps in found for h in hyps)
    assert [[h.tokens for h in hyps] for hyps in found] == [[h.tokens for h in hyps] for hyps in with_attention]
    tokens, scores, attention = model.greedy_decode(SOURCE, return_attention=False)
    assert attention is None and (tokens == model.greedy_decode(SOURCE)[0]).all()


def test_transformer_search_of_one_sentence_and_of_the_batch_agree():
    """Rows never interact: each sentence searched alone gives its row of the batch (odd row counts
    reach every tile of the step's products)."""
    model = TRANSFORMERS["pre-norm gelu"]()
    batch = model.beam_search(SOURCE, 4, 0.3)
    for row, hyps in zip(SOURCE, batch):
        alone = model.beam_search(row[None, :(row != 0).sum()], 4, 0.3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        np.testing.assert_allclose([h.score for h in alone], [h.score for h in hyps], rtol=1e-5)


def _seq2seq(attention, cell, score=None, local_window=None):
    attnx.set_random_seed(5)
    model = attnx.seq2seq.Seq2Seq(23, 19, embedding_dim=8, units=12, attention=attention, cell=cell, score=score,
                                  local_window=local_window, start_token=1, end_token=2, max_length=9)
    model.predict(SOURCE)  # builds the weights (these seeds: rows end at different steps, others run to max_length)
    return model


SEQ2SEQS = {
    "bahdanau gru": lambda: _seq2seq("bahdanau", "gru"),
    "luong lstm general": lambda: _seq2seq("luong", "lstm", "general"),
    "luong gru dot local": lambda: _seq2seq("luong", "gru", "dot", local_window=2),
}


def _seq2seq_start(model):
    source = model._source(SOURCE)
    enc, smask, states = model._encode(source)
    return model.decoder.start_state(enc, states, smask)


@pytest.mark.parametrize("kind", list(SEQ2SEQS))
@pytest.mark.parametrize("path", ["compiled", "python step"])
def test_seq2seq_search_equals_the_python_search(kind, path):
    model = SEQ2SEQS[kind]()
    if path == "python step":
        _python_step(model.decoder)
    tokens, attention = model.greedy_decode(SOURCE)
    want_tokens, _, want_attention = old_greedy_search(model.decoder, _seq2seq_start(model), len(SOURCE), 1, 2, 9)
    np.testing.assert_array_equal(tokens, want_tokens)
    steps = {decoding.until_end(row, 2)[1] for row in tokens.tolist()}
    assert len(steps) > 1  # rows leave the batch while others decode
    np.testing.assert_allclose(attention, want_attention, rtol=2e-5, atol=2e-5)
    for width in (1, 2, 3, 4):
        for alpha in (0.0, 0.6):
            want = old_beam_search(model.decoder, _seq2seq_start(model), len(SOURCE), 1, 2, width, alpha, 9)
            _assert_same_beams(model.beam_search(SOURCE, width, alpha), want, 2e-5)


@pytest.mark.parametrize("make", [TRANSFORMERS["post-norm"], SEQ2SEQS["bahdanau gru"]], ids=["Transformer", "Seq2Seq"])
def test_bad_search_arguments_raise_the_same_errors(make):
    model = make()
    for width in (0, 20, 2.5, True):
        with pytest.raises(ValueError, match=re.escape("`width` must be an integer in [1, 19]")):
            model.beam_search(SOURCE, width=width)
    for max_length in (0, -1, 1.5):
        with pytest.raises(ValueError, match="`max_length` must be a positive integer"):
            model.beam_search(SOURCE, width=2, max_length=max_length)
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number >= 0"):
        model.beam_search(SOURCE, width=2, length_penalty=-1.0)


def test_transformer_decoding_length_is_bounded():
    model = TRANSFORMERS["post-norm"]()
    with pytest.raises(ValueError, match=re.escape("`max_length` must be <= 1024, got 1025")):
        model.beam_search(SOURCE, width=2, max_length=1025)
    learned = TRANSFORMERS["tied learned"]()
    with pytest.raises(ValueError, match=re.escape("`max_length` must be <= 16, got 17")):
        learned.greedy_decode(SOURCE, max_length=17)


def test_a_python_step_of_the_wrong_shape_is_a_clear_error():
    class Broken:
        def step(self, ids, position, state, return_attention=False):
            return np.zeros((len(ids) + 1, 5)), state, None

    with pytest.raises(ValueError, match=re.escape("decoding: the decoder's step returned logits of shape (3, 5), "
                                                   "expected (2, 5)")):
        decoding.greedy_search(Broken(), None, 2, 1, 2, 4, return_attention=False)

    class Narrow:
        def step(self, ids, position, state, return_attention=False):
            return np.zeros((len(ids), 3)), state, None

    with pytest.raises(ValueError, match="width 4 is more than the decoder's 3 words"):
        decoding.beam_search(Narrow(), None, 2, 1, 2, 4, 0.0, 4, return_attention=False)
