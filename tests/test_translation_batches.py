"""`Transformer.translate_batch` searches each group of sentences in one call (`decoding.beam_search` with
`batch_size`: the compiled step runs every batch in one C++ call, search_decoder_stack's batch_size),
and gives what a search per batch gives on the batch's own rows, cut to its real source positions:
the same tokens, scores and attention, bit for bit, at every batch size, over the compiled step and
over the Python step alike."""
import numpy as np
import pytest

import attnx
from attnx import decoding
from attnx.seq2seq import Transformer

SENTENCES = ["the cat sat on the mat .", "a dog", "the bird sang a song in the tree today .", "cats", "a dog ran",
             "the mat is red and the cat is black .", "birds sing", "the tree ."]


@pytest.fixture(scope="module")
def model():
    attnx.set_random_seed(4)
    model = Transformer.from_texts(SENTENCES, SENTENCES[::-1], vocab_size=60, model_dim=16, num_heads=2,
                                   intermediate_dim=24, num_encoder_layers=1, num_decoder_layers=2, max_length=7,
                                   norm_first=True)
    model.output_projection.params["bias"][model.end_id] += 0.5  # translations end at different steps
    return model


def per_batch(model, sentences, width, batch_size):
    """translate_batch as a search per batch: each batch's rows of its group's state, cut to their
    longest source (the loop translate_batch ran before its group calls)."""
    source = model._source(model.encode_sources(sentences))
    lengths = (source != 0).sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    group = max(batch_size, model.ENCODE_BATCH)
    results = [None] * len(sentences)
    for lo in range(0, len(order), group):
        rows = order[lo:lo + group]
        state = model._start(source[rows][:, :lengths[rows].max()])
        for first in range(0, len(rows), batch_size):
            batch = rows[first:first + batch_size]
            batch_state = state if len(batch) == len(rows) else \
                state.select(np.arange(first, first + len(batch)), sources=int(lengths[batch].max()))
            for row, hyps in zip(batch, decoding.beam_search(model, batch_state, len(batch), model.start_id,
                                                              model.end_id, width, 0.0, model.max_length)):
                results[row] = hyps[0]
    return results


@pytest.mark.parametrize("path", ["compiled", "python step"])
@pytest.mark.parametrize("width", [1, 3])
def test_translate_batch_gives_a_search_per_batch_bit_for_bit(model, path, width, monkeypatch):
    if path == "python step":
        monkeypatch.setattr(model, "compiled_step", lambda state, max_length: None)
    ended = set()
    for batch_size in (1, 2, 3, 32):
        found = model.translate_batch(SENTENCES, width=width, batch_size=batch_size)
        want = per_batch(model, SENTENCES, width, batch_size)
        for f, w in zip(found, want):
            assert f.tokens == w.tokens and f.score == w.score
            assert f.attention.shape == w.attention.shape and f.attention.dtype == w.attention.dtype
            np.testing.assert_array_equal(f.attention, w.attention)
            ended.add(len(f.tokens) < model.max_length)
        without = model.translate_batch(SENTENCES, width=width, batch_size=batch_size, return_attention=False)
        assert [h.tokens for h in without] == [h.tokens for h in found] and all(h.attention is None for h in without)
        assert [h.score for h in without] == [h.score for h in found]
    assert ended == {True, False}  # some translations end before max_length, some do not


def test_search_decoder_stack_batches_cut_each_batch_to_its_real_positions(model):
    """The kernel's batches (batch_size) on memory padded past every row's length: each batch's rows equal
    the batch searched alone on its rows' real positions; batch_size 0 or past the batch is one batch."""
    source = model._source(model.encode_sources(SENTENCES))
    lengths = (source != 0).sum(axis=1)
    padded = np.pad(source, [(0, 0), (0, 3)])  # three positions of padding past the longest
    state = model._start(padded)
    kernel, arguments = model.compiled_step(state, model.max_length)
    search = {"start_id": model.start_id, "end_id": model.end_id, "width": 2, "length_penalty": 0.3,
              "max_length": model.max_length, "return_attention": True}
    whole = kernel(**arguments, **search)
    for size in (0, len(SENTENCES), 100):
        again = kernel(**arguments, **search, batch_size=size)
        for a, b in zip(again, whole):
            np.testing.assert_array_equal(a, b)
    for size in (1, 3):
        tokens, lengths_found, scores, normalized, attention = kernel(**arguments, **search, batch_size=size)
        assert attention.shape[-1] == padded.shape[1]
        for first in range(0, len(SENTENCES), size):
            rows = np.arange(first, min(first + size, len(SENTENCES)))
            cut = int(lengths[rows].max())
            alone = kernel(**model.compiled_step(state.select(rows, sources=cut), model.max_length)[1], **search)
            steps = alone[0].shape[2]
            np.testing.assert_array_equal(tokens[rows, :, :steps], alone[0])
            assert not tokens[rows, :, steps:].any()
            for got, want in zip((lengths_found, scores, normalized), alone[1:4]):
                np.testing.assert_array_equal(got[rows], want)
            np.testing.assert_array_equal(attention[rows, ..., :steps, :cut], alone[4])
            assert not attention[rows, ..., steps:, :].any() and not attention[rows, ..., cut:].any()


def test_search_decoder_stack_refuses_a_negative_batch_size(model):
    source = model._source(model.encode_sources(SENTENCES[:2]))
    kernel, arguments = model.compiled_step(model._start(source), model.max_length)
    with pytest.raises(ValueError, match="batch_size"):
        kernel(**arguments, start_id=model.start_id, end_id=model.end_id, width=1, length_penalty=0.0,
               max_length=model.max_length, return_attention=False, batch_size=-1)
