"""The Transformer's compiled search on 2 threads gives one thread's translations bit for bit: a few rows
(batch 1, a beam of one sentence, a batch's last rows) run each step on a team of two threads that split
every product's columns and the attention's heads (decoder_step.hpp's decoder_stack_run), more rows
split by rows; float32 and int8 kernels, post- and pre-norm."""
import numpy as np
import pytest

import attnx
from attnx import backend
from attnx.seq2seq import Transformer

SOURCE = np.array([[3, 4, 5, 6, 7, 8, 9], [10, 11, 0, 0, 0, 0, 0], [12, 13, 14, 15, 0, 0, 0],
                   [16, 17, 18, 19, 20, 21, 0]] * 4)


def _transformer(norm_first, quantized):
    attnx.set_random_seed(3)
    # model_dim 128 in 4 heads: each of two threads' heads start at a whole vector (the team's condition)
    model = Transformer(97, 96, model_dim=128, num_heads=4, intermediate_dim=208, num_encoder_layers=1,
                        num_decoder_layers=2, norm_first=norm_first, dropout=0.0, start_token=1, end_token=2,
                        max_length=12)
    model.predict(SOURCE[:2])  # builds the weights
    return model.quantize("int8") if quantized else model


def _decode(model, threads):
    previous = backend.get_num_threads()
    attnx.set_num_threads(threads)
    try:
        greedy_one = [model.greedy_decode(row[None]) for row in SOURCE[:4]]
        greedy_all = model.greedy_decode(SOURCE)
        beams_one = [model.beam_search(row[None], 3, 0.6)[0] for row in SOURCE[:4]]
        beams_all = model.beam_search(SOURCE, 4, 0.0)
    finally:
        attnx.set_num_threads(previous)
    return greedy_one, greedy_all, beams_one, beams_all


@pytest.mark.parametrize("quantized", [False, True], ids=["float32", "int8"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_two_threads_translate_as_one(norm_first, quantized):
    model = _transformer(norm_first, quantized)
    one, two = _decode(model, 1), _decode(model, 2)
    for (tokens1, scores1, attention1), (tokens2, scores2, attention2) in zip(one[0] + [one[1]], two[0] + [two[1]]):
        np.testing.assert_array_equal(tokens1, tokens2)
        np.testing.assert_array_equal(scores1, scores2)
        np.testing.assert_array_equal(attention1, attention2)
    for hyps1, hyps2 in zip(one[2] + one[3], two[2] + two[3]):
        assert [h.tokens for h in hyps1] == [h.tokens for h in hyps2]
        assert [h.score for h in hyps1] == [h.score for h in hyps2]
        for h1, h2 in zip(hyps1, hyps2):
            np.testing.assert_array_equal(h1.attention, h2.attention)
