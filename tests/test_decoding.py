"""attnx.decoding: the one greedy search and beam search over the step protocol, used by Seq2Seq,
Transformer, ImageCaptioner and OnnxSeq2Seq; the one Hypothesis. A plain decoder written here (a
table of logits per previous token and position) lets the searches be checked against brute force,
with ties; source scans keep a second search or Hypothesis from appearing."""
import ast
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

import attnx
from attnx import decoding
from attnx.decoding import Hypothesis, beam_search, greedy_search

PACKAGE = Path(attnx.__file__).resolve().parent


class TableState:
    """The state of `TableDecoder` for N rows: the row's sentence index (what it decodes)."""

    def __init__(self, sentence):
        self.sentence = np.asarray(sentence)

    def select(self, rows):
        return TableState(self.sentence[rows])


class TableDecoder:
    """logits = table[sentence, position, previous token]: a decoder with the step protocol whose
    every probability is known, recording the rows of each step."""

    def __init__(self, table):
        self.table = table  # (sentences, positions, V, V)
        self.rows_per_step = []

    def start_state(self):
        return TableState(np.arange(len(self.table)))

    def step(self, ids, position, state, return_attention=False):
        self.rows_per_step.append(len(ids))
        logits = self.table[state.sentence, position, ids]
        # the attention of a row: one-hot on its previous token over "source" positions 0..V-1
        attention = np.eye(self.table.shape[-1], dtype=np.float32)[ids] if return_attention else None
        return logits, state, attention


def logp_table(table):
    return decoding.log_softmax(table.astype(np.float64))


def brute_force_beams(table, sentence, start, end, width, alpha, max_length):
    """The plain beam search of one sentence: keep the `width` best extensions in (beam, token)
    order (a stable sort), a finished hypothesis extended by padding at no cost."""
    logp = logp_table(table)[sentence]
    beams = [([start], 0.0, False)]
    for t in range(max_length):
        candidates = []
        for tokens, score, done in beams:
            if done:
                candidates.append((tokens + [0], score, True))
                continue
            candidates += [(tokens + [v], score + logp[t, tokens[-1], v], v == end) for v in range(logp.shape[-1])]
        beams = sorted(candidates, key=lambda c: -c[1])[:width]  # sorted is stable
        if all(done for _, _, done in beams):
            break
    out = []
    for tokens, score, _ in beams:
        seq = tokens[1:]  # word 0 is a word here; the padding is what follows the end token
        n = seq.index(end) + 1 if end in seq else len(seq)
        out.append((seq[:n - 1] if end in seq else seq, score / decoding.length_penalty(n, alpha)))
    return sorted(out, key=lambda h: -h[1])


def random_table(seed, sentences=4, positions=6, V=5, integer=False):
    rng = np.random.default_rng(seed)
    if integer:  # many exact ties
        return rng.integers(0, 3, (sentences, positions, V, V)).astype(np.float64)
    return rng.standard_normal((sentences, positions, V, V)) * 2.0


@pytest.mark.parametrize("integer", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("width,alpha", [(1, 0.0), (2, 0.0), (3, 0.6), (5, 1.0)])
def test_beam_search_equals_brute_force(width, alpha, integer):
    for seed in range(6):
        table = random_table(seed, integer=integer)
        decoder = TableDecoder(table)
        found = beam_search(decoder, decoder.start_state(), len(table), 1, 2, width, alpha, 6)
        for s in range(len(table)):
            want = brute_force_beams(table, s, 1, 2, width, alpha, 6)
            assert [h.tokens for h in found[s]] == [w[0] for w in want], (seed, s)
            np.testing.assert_allclose([h.score for h in found[s]], [w[1] for w in want], rtol=1e-12, atol=1e-12)


def test_beam_hypotheses_carry_the_attention_of_their_own_history():
    table = random_table(3)
    decoder = TableDecoder(table)
    for hyps in beam_search(decoder, decoder.start_state(), len(table), 1, 2, 3, 0.0, 6):
        for h in hyps:
            history = [1] + h.tokens  # the previous token of each step taken
            steps = len(h.tokens) + (len(h.tokens) < 6)  # the end token's step unless cut at max_length
            np.testing.assert_array_equal(h.attention, np.eye(5, dtype=np.float32)[history[:steps]])


def test_ties_go_to_the_earliest_beam_then_the_lowest_id():
    V = 4
    table = np.zeros((1, 3, V, V))  # every word equally likely everywhere
    decoder = TableDecoder(table)
    [hyps] = beam_search(decoder, decoder.start_state(), 1, 1, 3, 3, 0.0, 2)
    # first step: the lowest ids 0, 1, 2 (beam 0 only); second step: all twelve candidates are
    # equal, and the first three are the earliest beam's lowest ids; the final sort keeps that order
    assert [h.tokens for h in hyps] == [[0, 0], [0, 1], [0, 2]]
    tokens, scores, _ = greedy_search(TableDecoder(table), decoder.start_state(), 1, 1, 3, 2)
    assert tokens.tolist() == [[0, 0]]


def test_greedy_search_equals_the_first_beam_of_width_one_and_rows_leave_the_batch():
    table = random_table(7, sentences=6)
    table[:3, 1, :, 2] += 50  # sentences 0-2 end at their second step
    decoder = TableDecoder(table)
    tokens, scores, attention = greedy_search(decoder, decoder.start_state(), 6, 1, 2, 6)
    assert decoder.rows_per_step[0] == 6 and decoder.rows_per_step[2] <= 3
    assert decoder.rows_per_step == sorted(decoder.rows_per_step, reverse=True)
    beams = beam_search(TableDecoder(table), decoder.start_state(), 6, 1, 2, 1, 0.0, 6)
    for b, hyps in enumerate(beams):
        seq, steps = decoding.until_end(tokens[b].tolist(), 2)
        assert hyps[0].tokens == seq and abs(hyps[0].score - scores[b]) < 1e-12
        np.testing.assert_array_equal(hyps[0].attention, attention[b, :steps])
        assert not attention[b, steps:].any() and not tokens[b, steps:].any()


def test_beam_search_drops_finished_sentences_from_the_batch():
    table = random_table(8, sentences=4)
    table[:2, 0, 1, 2] += 100  # sentences 0 and 1: the best beam ends at the first step,
    table[:2, 1:, :, 2] += 100  # the other at the second
    decoder = TableDecoder(table)
    beam_search(decoder, decoder.start_state(), 4, 1, 2, 2, 0.0, 6)
    # the first step runs one row per sentence (its beams start identical), then two per sentence
    assert decoder.rows_per_step[:3] == [4, 8, 4]


def test_one_hypothesis_type_exported_where_the_old_ones_were():
    import attnx.seq2seq
    import attnx.translation
    assert attnx.seq2seq.Hypothesis is attnx.translation.Hypothesis is Hypothesis
    assert Hypothesis._fields == ("tokens", "score", "attention")


# ----------------------------------------------------------------------------- one home (source scans)
def _sources():
    return {path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text())
            for path in sorted(PACKAGE.rglob("*.py"))}


def test_one_hypothesis_class_in_the_sources():
    homes = [name for name, tree in _sources().items() for node in ast.walk(tree)
             if isinstance(node, ast.ClassDef) and node.name == "Hypothesis"]
    assert homes == ["decoding.py"], homes


def _calls_step_in_a_loop(function):
    for loop in ast.walk(function):
        if isinstance(loop, (ast.For, ast.While)):
            for node in ast.walk(loop):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
                    return True
    return False


def test_one_decoding_loop_in_the_sources():
    """A decoding loop (a loop calling some decoder's `step`) lives in attnx.decoding only: every
    searcher calls its greedy_search / beam_search."""
    loops = [f"{name}:{node.name}" for name, tree in _sources().items() if name != "decoding.py"
             for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _calls_step_in_a_loop(node)]
    assert not loops, f"decoding loops outside attnx.decoding: {loops}"


def test_the_source_scan_finds_a_decoding_loop():
    tree = ast.parse("def search(model, state):\n    for t in range(3):\n        model.step(1, t, state)\n")
    assert _calls_step_in_a_loop(tree.body[0])
    assert not _calls_step_in_a_loop(ast.parse("def f(m):\n    m.step(1)\n").body[0])


def test_every_searcher_calls_the_one_search():
    searchers = {"seq2seq.py": ("Seq2Seq.beam_search",), "translation.py": ("Transformer.greedy_decode",
                                                                             "Transformer.beam_search"),
                 "vision.py": ("ImageCaptioner.beam_caption",), "export/seq2seq.py": ("OnnxSeq2Seq.greedy_decode",)}
    sources = _sources()
    for module, methods in searchers.items():
        for qualified in methods:
            cls, method = qualified.split(".")
            [class_node] = [n for n in ast.walk(sources[module]) if isinstance(n, ast.ClassDef) and n.name == cls]
            [function] = [n for n in class_node.body if isinstance(n, ast.FunctionDef) and n.name == method]
            called = {n.func.attr for n in ast.walk(function)
                      if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and isinstance(n.func.value, ast.Name) and n.func.value.id == "decoding"}
            assert called & {"beam_search", "greedy_search"}, f"{qualified} does not call attnx.decoding"


# ----------------------------------------------------------------------------- the models' entry points
def _seq2seq():
    attnx.set_random_seed(0)
    return attnx.seq2seq.Seq2Seq(9, 7, embedding_dim=4, units=6, start_token=1, end_token=2, max_length=5)


def _transformer():
    attnx.set_random_seed(0)
    return attnx.seq2seq.Transformer(9, 7, model_dim=8, num_heads=2, intermediate_dim=8, num_encoder_layers=1,
                                     num_decoder_layers=1, dropout=0.0, start_token=1, end_token=2, max_length=5)


@pytest.mark.parametrize("make", [_seq2seq, _transformer], ids=["Seq2Seq", "Transformer"])
def test_width_beyond_the_vocabulary_is_a_clear_error(make):
    model = make()
    source = np.array([[3, 4, 5]])
    with pytest.raises(ValueError, match=re.escape("`width` must be an integer in [1, 7] (the target vocabulary")):
        model.beam_search(source, width=8)
    assert len(model.beam_search(source, width=7)[0]) == 7  # the vocabulary itself is fine
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number >= 0"):
        model.beam_search(source, width=2, length_penalty=float("nan"))


@pytest.mark.parametrize("end_token", [7, -1, True])
def test_seq2seq_token_ids_are_checked_at_construction(end_token):
    with pytest.raises(ValueError, match=re.escape("Seq2Seq: `end_token` must be a token id in [0, 7)")):
        attnx.seq2seq.Seq2Seq(9, 7, embedding_dim=4, units=6, start_token=1, end_token=end_token)


def test_all_beams_of_every_width_are_distinct_and_ranked():
    model = _seq2seq()
    source = np.array([[3, 4, 5, 0], [6, 7, 0, 0]])
    for width in range(1, 8):
        for hyps in model.beam_search(source, width=width, length_penalty=0.3):
            assert len(hyps) == width
            assert len({tuple(h.tokens) for h in hyps}) == width
            assert all(np.isfinite(h.score) for h in hyps)
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_itertools_reference_agrees_on_a_tiny_vocabulary():
    """With width = V^2 after two steps every two-token history survives: beam search is then exhaustive."""
    V = 3
    table = random_table(11, sentences=1, positions=2, V=V)
    decoder = TableDecoder(table)
    [hyps] = beam_search(decoder, decoder.start_state(), 1, 1, V + 5, V, 0.0, 2)  # no end token in range
    logp = logp_table(table)[0]
    totals = {(a, b): logp[0, 1, a] + logp[1, a, b] for a, b in itertools.product(range(V), repeat=2)}
    best = sorted(totals.items(), key=lambda kv: -kv[1])[:V]
    assert [tuple(h.tokens) for h in hyps] == [k for k, _ in best]
