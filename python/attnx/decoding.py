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

from . import kernels

__all__ = ["Hypothesis", "greedy_search", "beam_search", "MAX_DECODING_LENGTH", "MAX_SOURCE_LENGTH"]

# The longest decoding of every translator (CTranslate2's max_decoding_length default): a saved file
# or a call can set max_length, and a search runs that many steps, so it is bounded (search.hpp).
MAX_DECODING_LENGTH = kernels.MAX_DECODING_LENGTH
# The longest source of every translator, in ids (CTranslate2's max_input_length): longer ids are a
# ValueError, longer sentences are cut to it by the translators' `encode_sources`.
MAX_SOURCE_LENGTH = 1024


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


def until_end(row, end_id):
    """(the tokens of a decoded row before its end token, the steps it took: those tokens and the end
    token, or the whole row when it was cut at max_length)."""
    row = list(row)
    if end_id in row:
        steps = row.index(end_id) + 1
        return row[:steps - 1], steps
    return row, len(row)


def _search(decoder, state, batch, start_id, end_id, width, alpha, max_length, return_attention, batch_size=None,
            select=None):
    """The one search (`cpp/include/attnx/search.hpp`) of `batch` inputs, `batch_size` at a time (each
    batch a search of its own; default all at once): over the decoder's step compiled in C++ when it
    offers one (``decoder.compiled_step(state, max_length)``: a search kernel of `attnx.kernels` and its
    arguments, or None), every batch in one C++ call; else over its Python step, which the C++ search
    calls back, a call per batch on ``select(first, count)`` (default ``state.select(rows)``).
    Returns (tokens (B, W, steps), lengths (B, W), scores (B, W), normalized scores (B, W),
    attention (B, W, ..., steps, S) or None; 0 past a batch's steps), each input's beams best first."""
    search = {"start_id": int(start_id), "end_id": int(end_id), "width": int(width), "length_penalty": float(alpha),
              "max_length": int(max_length), "return_attention": bool(return_attention)}
    size = batch if batch_size is None else min(int(batch_size), batch)
    compiled = getattr(decoder, "compiled_step", None)
    plan = None if compiled is None else compiled(state, max_length)
    if plan is not None:
        kernel, arguments = plan  # (a kernel that runs batches takes batch_size: search_decoder_stack)
        return kernel(**arguments, **search, **({"batch_size": size} if size < batch else {}))
    parts = []
    for first in range(0, batch, size):
        count = min(size, batch - first)
        part = state if count == batch else \
            select(first, count) if select else state.select(np.arange(first, first + count))
        parts.append(kernels.search_python_step(decoder=decoder, state=part, batch=count, **search))
    return parts[0] if len(parts) == 1 else _concatenated(parts)


def _concatenated(parts):
    """The results of searches of consecutive batches as one, their steps (and the attention's keys) padded
    with 0 to the longest."""
    steps = max(p[0].shape[2] for p in parts)
    tokens = np.concatenate([np.pad(p[0], [(0, 0), (0, 0), (0, steps - p[0].shape[2])]) for p in parts])
    attention = None
    if parts[0][4] is not None:
        keys = max(p[4].shape[-1] for p in parts)
        attention = np.concatenate([np.pad(p[4], [(0, 0)] * (p[4].ndim - 2) + [(0, steps - p[4].shape[-2]),
                                                                                (0, keys - p[4].shape[-1])])
                                    for p in parts])
    return (tokens,) + tuple(np.concatenate([p[i] for p in parts]) for i in (1, 2, 3)) + (attention,)


def greedy_search(decoder, state, batch, start_id, end_id, max_length, return_attention=True):
    """The most likely next token at every step; a row leaves the batch at its end token.

    Args:
        decoder: has the step protocol (module docstring); state: its start state for `batch` rows.
        start_id, end_id: the first input token and the token that ends a row; max_length: most steps.
        return_attention: keep the attention (else None is returned for it).
    Returns:
        (tokens (B, L) with the end token and 0 after it, scores (B,) the summed log probabilities,
        attention (B, ..., L, S), zero after a row's end), L <= max_length.
    """
    tokens, _, scores, _, attention = _search(decoder, state, batch, start_id, end_id, 1, 0.0, max_length,
                                              return_attention)
    return tokens[:, 0], scores[:, 0], None if attention is None else attention[:, 0]


def beam_search(decoder, state, batch, start_id, end_id, width, alpha, max_length, return_attention=True,
                batch_size=None, select=None):
    """Batched beam search: the `batch` inputs' `width` hypotheses run as rows of one step; an input
    leaves the batch once all its beams have ended, so the remaining steps run on fewer rows.

    The rule: every step extends each live hypothesis by every word and keeps, per input, the
    `width` best totals (the summed log probabilities), ties to the earliest beam, then the lowest
    id; a finished hypothesis stays in its beam, extended by padding at no cost. The final scores
    are divided by GNMT's length penalty ((5 + len) / 6) ** alpha, len counting the end token.
    Width 1 is `greedy_search`.

    Args:
        decoder: has the step protocol (module docstring); state: its start state for `batch` rows.
        start_id, end_id: the first input token and the token that ends a hypothesis.
        width: beams per input, checked by the caller (`beam_width`: 1 to the vocabulary size;
            1 gives greedy decoding); alpha: the length penalty's, >= 0.
        max_length: most tokens per hypothesis.
        return_attention: keep each hypothesis' attention (else its ``attention`` is None).
        batch_size: search the inputs this many at a time, each batch on its own (`translate_batch`'s
            batches), as separate calls would; a compiled step runs them all in one C++ call, cutting
            each batch's memory after its last real position; a Python step's batch runs on
            ``select(first, count)``, the state of inputs first..first + count - 1 (default
            ``state.select``). Default: all at once.
    Returns:
        For each input, its `width` `Hypothesis`es, best first.
    """
    tokens, lengths, _, normalized, attention = _search(decoder, state, batch, start_id, end_id, width, alpha,
                                                        max_length, return_attention, batch_size, select)
    results = []
    for b, (rows, row_lengths, row_scores) in enumerate(zip(tokens.tolist(), lengths.tolist(), normalized.tolist())):
        hyps = []
        for w, (row, n, score) in enumerate(zip(rows, row_lengths, row_scores)):
            seq = row[:n - 1] if n and row[n - 1] == end_id else row[:n]
            hyps.append(Hypothesis(seq, score, None if attention is None else attention[b, w, ..., :n, :]))
        results.append(hyps)
    return results
