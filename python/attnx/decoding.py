"""Decoding, one home for every translator (`attnx.seq2seq`, `attnx.translation`, `attnx.vision`):
the greedy search and the batched beam search over one step protocol, the `Hypothesis` they return,
and what the translators share besides (argument and target checks, the log-softmax of decoding,
GNMT's length penalty).

The step protocol (CTranslate2's idea: one decoder step, every search over it). A decoder offers

    step(ids, position, state, return_attention=False) -> (logits (N, V), next state, attention or None)

for N rows: `ids` (N,) the previous tokens (the start token at position 0), `position` the target
position of `ids`, the attention ``(N, ..., S)`` (one row over the S source positions, or one per
head: ``(N, heads, S)``) when asked. Its state is made by the model (``start_state``) and can
select rows: ``state.select(rows)`` is the state of those rows (an index or bool array), in that
order. `attnx.translation.Transformer`, and the attention decoders of `attnx.seq2seq` (for
`Seq2Seq` and `attnx.vision.ImageCaptioner`), are such decoders. A search checks nothing that its
public caller has checked (source ids, token ids, sizes): the models validate at their entry points.
"""
from typing import NamedTuple

import numpy as np

__all__ = ["Hypothesis", "greedy_search", "beam_search"]


class Hypothesis(NamedTuple):
    """One translation: its target ids (without the start and end tokens), its score (the sum of
    the log probabilities of its tokens and of the end token, divided by GNMT's length penalty), and
    the decoder's attention with one step per token and one for the end token (none when cut at
    max_length) on the axis before the source axis: ``(steps, S)``, or ``(heads, steps, S)`` for a
    decoder that attends per head (the Transformer's last layer)."""

    tokens: list
    score: float
    attention: np.ndarray


def positive_int(owner, arg, value, maximum=None):
    """`value` as an int in [1, maximum]: sizes a file can set are bounded, so that work and memory stay
    linear in what the caller gave."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: `{arg}` must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{owner}: `{arg}` must be <= {maximum}, got {value}")
    return int(value)


def token_id(owner, arg, value, vocab_size):
    """An integer token id in [0, vocab_size), or a ValueError naming `owner` and `arg`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < vocab_size:
        raise ValueError(f"{owner}: `{arg}` must be a token id in [0, {vocab_size}), got {value!r}")
    return int(value)


def beam_width(owner, width, vocab_size):
    """`width` checked against the vocabulary: a step keeps `width` hypotheses out of the `vocab_size`
    words of one beam at the first step, so a wider beam would keep impossible ones."""
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or not 1 <= width <= vocab_size:
        raise ValueError(f"{owner}: `width` must be an integer in [1, {vocab_size}] (the target vocabulary size), "
                         f"got {width!r}")
    return int(width)


def length_penalty_alpha(owner, alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) or \
            not 0 <= alpha < np.inf:
        raise ValueError(f"{owner}: `length_penalty` must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


def log_softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def length_penalty(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha (1 for alpha = 0)."""
    return ((5.0 + length) / 6.0) ** alpha


def without_trailing_padding(ids):
    """ids without the columns at the end that are padding in every row (ids has a real token)."""
    return ids[:, :np.flatnonzero((ids != 0).any(axis=0))[-1] + 1]


def check_target_ids(target, owner, what, start_id, max_length):
    """Teacher-forcing targets (B, steps) as integer ids, each row the start token, 1 to `max_length`
    tokens, then padding; a ValueError naming `owner` and `what` otherwise."""
    ids = np.asarray(target)
    if ids.dtype.kind not in "iu" or ids.ndim != 2:
        raise ValueError(f"{owner}: `{what}` expected integer ids of shape (batch, steps), got {ids.dtype} {ids.shape}")
    lengths = (ids != 0).sum(axis=1) - 1  # tokens after the start token
    if ids.shape[1] < 2 or lengths.min() < 1:
        raise ValueError(f"{owner}: every {what} needs the start token and at least one more token")
    if lengths.max() > max_length:
        raise ValueError(f"{owner}: a {what} has {lengths.max()} tokens after the start token, longer than "
                         f"max_length={max_length}")
    if not (ids[:, 0] == start_id).all():
        raise ValueError(f"{owner}: {what}s must begin with the start token id {start_id}")
    return ids


def top_k(total, k):
    """The indices of the k largest entries of each row, largest first, ties to the smaller index
    (``np.argsort(-total, kind="stable")[:, :k]``) without sorting whole rows: the entries at least
    as large as each row's k-th largest are the only candidates."""
    kth = np.partition(total, total.shape[1] - k, axis=1)[:, total.shape[1] - k]
    rows, cols = np.nonzero(total >= kth[:, None])
    order = np.lexsort((cols, -total[rows, cols], rows))
    starts = np.cumsum(np.bincount(rows, minlength=len(total))) - np.bincount(rows, minlength=len(total))
    return cols[order][starts[:, None] + np.arange(k)]


def until_end(row, end_id):
    """(the tokens of a decoded row before its end token, the steps it took: those tokens and the end
    token, or the whole row when it was cut at max_length)."""
    row = list(row)
    if end_id in row:
        steps = row.index(end_id) + 1
        return row[:steps - 1], steps
    return row, len(row)


def greedy_hypotheses(tokens, scores, attention, end_id, alpha):
    """The rows of `greedy_search`'s result as `Hypothesis`es (scores divided by the length penalty)."""
    hyps = []
    for row, score, weights in zip(tokens.tolist(), scores, attention):
        seq, steps = until_end(row, end_id)
        hyps.append(Hypothesis(seq, float(score) / length_penalty(steps, alpha), weights[..., :steps, :]))
    return hyps


def _step_attention_array(batch, weights, steps):
    """Zeros for the attention of `batch` rows over `steps` steps, shaped as one step's `weights`
    (N, ..., S) with the step axis before the source axis: (batch, ..., steps, S)."""
    return np.zeros((batch,) + weights.shape[1:-1] + (steps, weights.shape[-1]), dtype=weights.dtype)


def greedy_search(decoder, state, batch, start_id, end_id, max_length):
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
        logp = log_softmax(logits.astype(np.float64))
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


def beam_search(decoder, state, batch, start_id, end_id, width, alpha, max_length):
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
        logp = log_softmax(logits.astype(np.float64)).reshape(A, W, -1)
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
    return _backtrack(parents, words, step_weights, scores, lengths, alpha, end_id)


def _backtrack(parents, words, step_weights, scores, lengths, alpha, end_id):
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
            hyps.append(Hypothesis(seq, float(scores[b, w]) / length_penalty(n, alpha),
                                   np.ascontiguousarray(attention[b, w, ..., :n, :])))
        hyps.sort(key=lambda h: -h.score)
        results.append(hyps)
    return results
