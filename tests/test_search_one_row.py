"""The searches of one sentence: Seq2Seq's compiled attention decoder at one row packs no weights and
streams them in place (seq2seq.hpp's DecoderPanels::in_place, rnn.hpp's one-row recurrent step), where
more rows multiply packed copies. Each sentence decoded alone gives the same tokens, scores and attention
as its row of the batch and as the search over the decoder's Python step, for every attention decoder
and cell."""
import numpy as np
import pytest

import attnx

SOURCE = np.array([[3, 4, 5, 6, 7, 8], [9, 10, 0, 0, 0, 0], [11, 12, 13, 0, 0, 0], [14, 0, 0, 0, 0, 0],
                   [15, 16, 17, 18, 19, 0]])

DECODERS = {
    "bahdanau gru": dict(attention="bahdanau", cell="gru"),
    "bahdanau lstm": dict(attention="bahdanau", cell="lstm"),
    "luong lstm general": dict(attention="luong", cell="lstm", score="general"),
    "luong gru dot local": dict(attention="luong", cell="gru", score="dot", local_window=2),
}


def _seq2seq(options):
    attnx.set_random_seed(5)
    model = attnx.seq2seq.Seq2Seq(23, 19, embedding_dim=8, units=12, start_token=1, end_token=2, max_length=9,
                                  **options)
    model.predict(SOURCE)  # builds the weights
    return model


@pytest.mark.parametrize("kind", list(DECODERS))
def test_one_sentence_equals_its_row_of_the_batch_and_the_python_step(kind):
    model = _seq2seq(DECODERS[kind])
    tokens, attention = model.greedy_decode(SOURCE)
    beams = model.beam_search(SOURCE, 3, 0.6)
    python = _seq2seq(DECODERS[kind])
    python.decoder.compiled_step = lambda state, max_length: None  # the C++ search calls the Python step back
    for i, row in enumerate(SOURCE):
        one = row[None]  # padded as in the batch
        alone_tokens, alone_attention = model.greedy_decode(one)
        length = alone_tokens.shape[1]
        np.testing.assert_array_equal(alone_tokens[0], tokens[i, :length])
        assert not tokens[i, length:].any()
        np.testing.assert_allclose(alone_attention[0], attention[i, ..., :length, :], rtol=2e-5,
                                   atol=2e-6)
        python_tokens, python_attention = python.greedy_decode(one)
        np.testing.assert_array_equal(alone_tokens, python_tokens)
        np.testing.assert_allclose(alone_attention, python_attention, rtol=2e-5, atol=2e-6)
        # beam search of one sentence runs width rows (packed): the same best beams as the batch's
        alone = model.beam_search(one, 3, 0.6)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in beams[i]]
        np.testing.assert_allclose([h.score for h in alone], [h.score for h in beams[i]], rtol=2e-5, atol=2e-6)
