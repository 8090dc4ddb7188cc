"""attnx.export.to_ctranslate2: a pre-norm Transformer written as a CTranslate2 folder translates as attnx
does (greedy and beam, the same pieces), int8 too on a trained model; what cannot convert says why."""
import numpy as np
import pytest

import attnx
from attnx.seq2seq import Seq2Seq, Transformer

ctranslate2 = pytest.importorskip("ctranslate2")
from attnx.export.ctranslate2 import to_ctranslate2  # noqa: E402

CORPUS = ["The cat sat on the mat.", "The dog sat on the log!", "A cat and a dog?", "The cats sat.",
          "मी घरी जातो.", "तो घरी जातो.", "ती शाळेत जाते."]


@pytest.fixture(scope="module")
def trained():
    attnx.set_random_seed(0)
    model = Transformer.from_texts(CORPUS, CORPUS[::-1], vocab_size=90, model_dim=16, num_heads=2,
                                   intermediate_dim=32, num_encoder_layers=2, num_decoder_layers=2, max_length=12,
                                   norm_first=True, dropout=0.0)
    model.compile(warmup_steps=10)
    model.fit_texts(CORPUS, CORPUS[::-1], epochs=30, batch_size=4, verbose=0)
    return model


def _ct2_translations(model, directory, width):
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    pieces = [model.source_tokenizer.tokenize(s) for s in CORPUS]
    results = translator.translate_batch(pieces, beam_size=width, max_decoding_length=model.max_length,
                                         length_penalty=0.0)  # attnx's default: no length normalization
    return [[model.target_tokenizer.word_index[p] for p in r.hypotheses[0]] for r in results]


@pytest.mark.parametrize("width", [1, 3])
def test_ctranslate2_translates_as_attnx(trained, tmp_path, width):
    to_ctranslate2(trained, tmp_path / "ct2")
    ours = [h.tokens for h in trained.translate_batch(CORPUS, width=width)]
    assert _ct2_translations(trained, tmp_path / "ct2", width) == [list(t) for t in ours]


def test_int8_folder_translates_the_trained_pairs_as_float32(trained, tmp_path):
    before = {name: p.copy() for name, p in trained.params.items()}
    to_ctranslate2(trained, tmp_path / "ct2-int8", quantization="int8")
    assert all(np.array_equal(before[name], p) for name, p in trained.params.items())  # the model is untouched
    ours = [list(h.tokens) for h in trained.translate_batch(CORPUS)]
    theirs = _ct2_translations(trained, tmp_path / "ct2-int8", 1)
    assert sum(a == b for a, b in zip(ours, theirs)) >= len(CORPUS) - 1


def test_what_cannot_convert_says_why(trained, tmp_path):
    post_norm = Transformer(20, 20, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=1,
                            num_decoder_layers=1, start_token=1, end_token=2)
    with pytest.raises(ValueError, match="norm_first=True"):
        to_ctranslate2(post_norm, tmp_path / "a")
    no_tokenizers = Transformer(20, 20, model_dim=8, num_heads=2, intermediate_dim=16, num_encoder_layers=1,
                                num_decoder_layers=1, start_token=1, end_token=2, norm_first=True)
    with pytest.raises(ValueError, match="tokenizers"):
        to_ctranslate2(no_tokenizers, tmp_path / "b")
    seq2seq = Seq2Seq(13, 13, embedding_dim=8, units=8, start_token=1, end_token=2)
    with pytest.raises(TypeError, match="transformer models only"):
        to_ctranslate2(seq2seq, tmp_path / "c")
    with pytest.raises(ValueError, match="quantization"):
        to_ctranslate2(trained, tmp_path / "d", quantization="int4")
    to_ctranslate2(trained, tmp_path / "e")
    with pytest.raises(RuntimeError):  # CTranslate2's own refusal to overwrite without force
        to_ctranslate2(trained, tmp_path / "e")
    to_ctranslate2(trained, tmp_path / "e", force=True)
