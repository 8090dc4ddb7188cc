"""BLEU against the reference implementations: `attnx.metrics.corpus_bleu` equals NLTK's
`corpus_bleu` on random corpora (several references, short hypotheses, each smoothing), and
`Seq2Seq.evaluate_bleu` reports sacreBLEU's score, saying so."""
import numpy as np
import pytest

import attnx
from attnx import metrics
from attnx.seq2seq import Seq2Seq

bleu_score = pytest.importorskip("nltk.translate.bleu_score")
sacrebleu = pytest.importorskip("sacrebleu")
SMOOTHING = {None: None, "floor": bleu_score.SmoothingFunction().method1,
             "exp": bleu_score.SmoothingFunction().method3}


def _random_corpus(rng, sentences, vocabulary, max_refs, max_len):
    """References and hypotheses over a small vocabulary (so n-grams match), lengths from 0 to
    `max_len`, 1 to `max_refs` references each."""
    words = [f"w{i}" for i in range(vocabulary)]

    def sentence(low=0):
        return list(rng.choice(words, size=rng.integers(low, max_len + 1)))
    references = [[sentence(1) for _ in range(rng.integers(1, max_refs + 1))] for _ in range(sentences)]
    hypotheses = [sentence() for _ in range(sentences)]
    return references, hypotheses


@pytest.mark.parametrize("smoothing", [None, "floor", "exp"])
@pytest.mark.parametrize("seed", range(12))
def test_corpus_bleu_equals_nltk(seed, smoothing):
    rng = np.random.default_rng(seed)
    sentences, vocabulary, max_refs, max_len = [(30, 6, 3, 12), (5, 4, 4, 5), (1, 3, 2, 3), (60, 20, 2, 25)][seed % 4]
    references, hypotheses = _random_corpus(rng, sentences, vocabulary, max_refs, max_len)
    for max_n in (1, 2, 4):
        weights = (1 / max_n,) * max_n
        expected = bleu_score.corpus_bleu(references, hypotheses, weights=weights,
                                          smoothing_function=SMOOTHING[smoothing])
        got = metrics.corpus_bleu(references, hypotheses, max_n=max_n, smoothing=smoothing)
        # NLTK gives ~1e-77 (float_info.min ** weight) where attnx gives 0: absolute tolerance
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-60)


@pytest.mark.filterwarnings("ignore::UserWarning")  # NLTK warns of the zero counts this test is about
def test_short_hypotheses_count_one_ngram_each_as_nltk():
    references = [["a b c d".split()], ["a b c d e f".split()]]
    hypotheses = [["a"], "a b c d e f".split()]  # the first has no 2-, 3- or 4-gram at all
    for smoothing in SMOOTHING:
        expected = bleu_score.corpus_bleu(references, hypotheses, smoothing_function=SMOOTHING[smoothing])
        assert metrics.corpus_bleu(references, hypotheses, smoothing=smoothing) == pytest.approx(expected, abs=1e-60)


def test_corpus_bleu_bad_smoothing():
    with pytest.raises(ValueError, match="smoothing"):
        metrics.corpus_bleu([[["a"]]], [["a"]], smoothing="method1")


def test_bleu_score_scorers():
    rng = np.random.default_rng(0)
    references, hypotheses = _random_corpus(rng, 40, 8, 2, 10)
    references = [refs[:1] + refs[:1] for refs in references]  # two references each, as sacreBLEU needs
    score = metrics.bleu_score(references, hypotheses)
    expected = sacrebleu.corpus_bleu([" ".join(h) for h in hypotheses],
                                     [[" ".join(refs[i]) for refs in references] for i in range(2)])
    assert score.scorer == "sacrebleu" and "nrefs:2" in score.signature
    assert score == pytest.approx(expected.score / 100, rel=1e-12)
    assert "sacrebleu" in str(score) and "BLEU" in str(score)
    own = metrics.bleu_score(references, hypotheses, scorer="attnx")
    assert own.scorer == "attnx" and own == pytest.approx(metrics.corpus_bleu(references, hypotheses))
    with pytest.raises(ValueError, match="same number of references"):
        metrics.bleu_score([[["a"]], [["a"], ["b"]]], [["a"], ["a"]], scorer="sacrebleu")
    with pytest.raises(ValueError, match="scorer"):
        metrics.bleu_score(references, hypotheses, scorer="nltk")


@pytest.fixture(scope="module")
def half_trained():
    """A Seq2Seq trained briefly on a toy corpus: its translations are partly right."""
    words = {"one": "un", "two": "deux", "three": "trois", "cat": "chat", "dog": "chien", "red": "rouge"}
    rng = np.random.default_rng(0)
    src, tgt = [], []
    for _ in range(200):
        chosen = list(rng.choice(list(words), rng.integers(2, 6)))
        src.append("<start> " + " ".join(chosen) + " . <end>")
        tgt.append("<start> " + " ".join(words[w] for w in chosen) + " . <end>")
    attnx.set_random_seed(0)
    model = Seq2Seq.from_texts(src, tgt, embedding_dim=8, units=16, max_length=10)
    model.compile(attnx.optimizers.Adam(0.01))
    model.fit_texts(src, tgt, batch_size=32, epochs=3, verbose=0)
    return model, src[:60], tgt[:60]


def test_evaluate_bleu_reports_sacrebleu(half_trained):
    model, src, tgt = half_trained
    score = model.evaluate_bleu(src, tgt)
    hypotheses = [model.translate(s)[0] for s in src]
    references = [" ".join(w for w in t.split() if w not in ("<start>", "<end>")) for t in tgt]
    expected = sacrebleu.corpus_bleu(hypotheses, [references])
    assert 0 < expected.score < 100
    assert score.scorer == "sacrebleu" and score.signature.startswith("nrefs:1")
    assert score == pytest.approx(expected.score / 100, rel=1e-12)
    own = model.evaluate_bleu(src, tgt, scorer="attnx")
    assert own.scorer == "attnx"
    assert own == pytest.approx(metrics.corpus_bleu([[r.split()] for r in references], [h.split() for h in hypotheses]))
