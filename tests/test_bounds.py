"""Every public loader and translator entry point at its bound + 1 (issue 43): one table, a row per bound,
each naming the entry point whose docstring states the bound (checked too) and the call one past it,
which must raise a ValueError naming the argument (or, for a documented truncation, give what the bound
gives).

Bounds that other test files already drive past (the Transformer's constructor sizes, DRAW's constructor,
the loader fuzzer's header mutations) are here once more only where this table needs the entry point.
"""
import io
import json
import re
import sys
import zipfile
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

import attnx
import test_fuzz_loaders
from attnx import datasets, saving, text


@pytest.fixture(scope="module")
def models():
    """One small model of each translator (and DRAW), built once."""
    attnx.set_random_seed(0)
    built = {name: test_fuzz_loaders.MODELS[name]() for name in ("Transformer", "Seq2Seq", "ImageCaptioner", "DRAW")}
    return {name: model for name, (model, _) in built.items()} | {
        f"{name} input": x for name, (_, x) in built.items()}


def _saved(models, tmp_path):
    path = tmp_path / "m.attnx"
    models["Seq2Seq"].save(path)
    return path


def _rewritten(path, edit):
    """The archive at `path` with its header's text replaced by edit(text) (members kept, stored)."""
    src = zipfile.ZipFile(path)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            blob = src.read(info.filename)
            zf.writestr(info.filename, edit(blob.decode()).encode() if info.filename == "attnx.json" else blob)
    path.write_bytes(out.getvalue())
    return path


def _one_byte_past_its_member(models, tmp_path):
    """A weight whose header shape needs more bytes than its member holds."""
    path = _saved(models, tmp_path)
    member = zipfile.ZipFile(path).getinfo("weights/00000.npy").file_size

    def edit(header_text):
        header = json.loads(header_text)
        header["weights"][0]["shape"] = [member // 4 + 1]  # float32: (member + 1..4) bytes
        return json.dumps(header)
    return lambda: attnx.load_model(_rewritten(path, edit))


def _nested_past_the_recursion_limit(models, tmp_path):
    path = _saved(models, tmp_path)
    depth = sys.getrecursionlimit() + 1
    return lambda: attnx.load_model(_rewritten(path, lambda h: h.replace('"model":', f'"x": {"[" * depth}{"]" * depth}, '
                                                                                     '"model":', 1)))


def _tokenizer_json(nest_field):
    tokenizer = text.Tokenizer()
    tokenizer.fit_on_texts(["a b c"])
    payload = json.loads(tokenizer.to_json())
    depth = sys.getrecursionlimit() + 1
    deep = "[" * depth + "]" * depth
    if nest_field:  # inside one of Keras' JSON-in-JSON fields
        payload["config"]["word_counts"] = deep
        return json.dumps(payload)
    return json.dumps(payload).replace('"config":', f'"x": {deep}, "config":', 1)


@dataclass
class Row:
    entry: Callable            # the entry point whose docstring states the bound
    doc: str                   # a regex its docstring must match
    past: Optional[Callable]   # (models, tmp_path) -> a call one past the bound; None: the file's size bounds it
    error: str = ""            # the ValueError's message must match this regex
    exception: type = ValueError
    at: Optional[Callable] = None  # (models, tmp_path) -> a call at the bound, which must succeed
    marks: tuple = ()


def _transformer():
    from attnx.translation import Transformer
    return Transformer


def _seq2seq():
    from attnx.seq2seq import Seq2Seq
    return Seq2Seq


def _captioner():
    from attnx.vision import ImageCaptioner
    return ImageCaptioner


def _draw():
    from attnx.draw import DRAW
    return DRAW


def _ids(steps, vocab=13):
    return np.arange(steps).reshape(1, steps) % (vocab - 3) + 3  # no padding, no start / end id


def _small_captioner(**kwargs):
    x = attnx.Input((5, 4))
    encoder = attnx.Model(x, attnx.layers.Dense(3)(x))
    return _captioner()(encoder, (5, 4), vocab_size=9, embedding_dim=4, units=5, **kwargs)


ROWS = {
    # ---------------------------------------------------------------- files
    "load_model: a weight one byte past its member": Row(
        lambda: saving.read_model, r"one byte more than the member", _one_byte_past_its_member, "declares shape"),
    "load_model: the bounds of read_model": Row(
        lambda: attnx.load_model, r"Bounds: those of `attnx.saving.read_model`", _one_byte_past_its_member,
        "declares shape"),
    "load_model: a header nested past the recursion limit": Row(
        lambda: saving.read_model, r"recursion limit", _nested_past_the_recursion_limit, "corrupted|nested"),
    "tokenizer_from_json: nested past the recursion limit": Row(
        lambda: text.tokenizer_from_json, r"recursion limit",
        lambda m, t: lambda: text.tokenizer_from_json(_tokenizer_json(False)), "nested too deeply"),
    "tokenizer_from_json: a field nested past the recursion limit": Row(
        lambda: text.tokenizer_from_json, r"recursion limit",
        lambda m, t: lambda: text.tokenizer_from_json(_tokenizer_json(True)), "nested too deeply"),
    # ---------------------------------------------------------------- data sets
    "load_digit_captions: a canvas side": Row(
        lambda: datasets.load_digit_captions, r"MAX_CANVAS_SIDE` = 4096",
        lambda m, t: lambda: datasets.load_digit_captions(1, canvas=(datasets.MAX_CANVAS_SIDE + 1, 48)), "4096"),
    "load_digit_captions: the pixels": Row(
        lambda: datasets.load_digit_captions, r"MAX_PIXELS` = 2\*\*31 - 1",
        lambda m, t: lambda: datasets.load_digit_captions(datasets.MAX_PIXELS // (16 * 48) + 1), "MAX_PIXELS",
        at=lambda m, t: lambda: datasets.load_digit_captions(2, canvas=(datasets.MAX_CANVAS_SIDE, 48))),
    "load_anki_pairs: the file": Row(
        lambda: datasets.load_anki_pairs, r"linear in its\s+size", None),
    "load_uci_sentiment: the files": Row(
        lambda: datasets.load_uci_sentiment, r"linear in its size", None),
    # ---------------------------------------------------------------- DRAW
    "DRAW: steps (a file sets it)": Row(
        lambda: _draw(), r"``steps`` <= 1024",
        lambda m, t: lambda: _draw()(8, 8, read_n=2, write_n=3, steps=1025), "steps"),
    "DRAW.generate: n": Row(
        lambda: _draw().generate, r"`n` <= `MAX_GENERATE` = 65536",
        lambda m, t: lambda: m["DRAW"].generate(65537), "`n`"),
    "DRAW.generate: steps": Row(
        lambda: _draw().generate, r"`steps`.*<= `MAX_STEPS` = 1024",
        lambda m, t: lambda: m["DRAW"].generate(1, steps=1025), "`steps`",
        at=lambda m, t: lambda: m["DRAW"].generate(1, steps=1024)),
    "DRAW.generate: the canvases' size": Row(
        lambda: _draw().generate, r"MAX_CANVAS_VALUES` = 2\*\*31 - 1",
        lambda m, t: lambda: m["DRAW"].generate(2 ** 31 // (1024 * 64) + 1, steps=1024), "MAX_CANVAS_VALUES"),
    # ---------------------------------------------------------------- the Transformer
    "Transformer: max_length (a file sets it)": Row(
        lambda: _transformer(), r"max_length \(the longest decoding\) <= 1024",
        lambda m, t: lambda: _transformer()(20, 20, model_dim=8, num_heads=2, intermediate_dim=8, max_length=1025),
        "max_length"),
    "Transformer.greedy_decode: source ids": Row(
        lambda: _transformer(), r"MAX_SOURCE_LENGTH` = 1024",
        lambda m, t: lambda: m["Transformer"].greedy_decode(_ids(1025)), "MAX_SOURCE_LENGTH",
        at=lambda m, t: lambda: m["Transformer"].greedy_decode(_ids(1024), max_length=2)),
    "Transformer.beam_search: source ids": Row(
        lambda: _transformer(), r"MAX_SOURCE_LENGTH` = 1024",
        lambda m, t: lambda: m["Transformer"].beam_search(_ids(1025), width=2), "MAX_SOURCE_LENGTH"),
    "Seq2Seq.greedy_decode: source ids": Row(
        lambda: _seq2seq(), r"MAX_SOURCE_LENGTH` = 1024",
        lambda m, t: lambda: m["Seq2Seq"].greedy_decode(_ids(1025)), "MAX_SOURCE_LENGTH",
        at=lambda m, t: lambda: m["Seq2Seq"].greedy_decode(_ids(1024), max_length=2)),
    "Seq2Seq.beam_search: source ids": Row(
        lambda: _seq2seq(), r"MAX_SOURCE_LENGTH` = 1024",
        lambda m, t: lambda: m["Seq2Seq"].beam_search(_ids(1025), width=2), "MAX_SOURCE_LENGTH"),
    "Transformer.beam_search: width": Row(
        lambda: _transformer().beam_search, r"width: beams per sentence \(1 to the target vocabulary size",
        lambda m, t: lambda: m["Transformer"].beam_search(_ids(3), width=m["Transformer"].target_vocab_size + 1),
        "width"),
    "Transformer.greedy_decode: max_length": Row(
        lambda: _transformer().greedy_decode, r"1024",
        lambda m, t: lambda: m["Transformer"].greedy_decode(_ids(3), max_length=1025), "max_length"),
    # ---------------------------------------------------------------- Seq2Seq
    "Seq2Seq.beam_search: width": Row(
        lambda: _seq2seq().beam_search, r"width: beams per sentence \(1 to the target vocabulary size",
        lambda m, t: lambda: m["Seq2Seq"].beam_search(_ids(3), width=14), "width"),
    "Seq2Seq: max_length (a file sets it)": Row(
        lambda: _seq2seq(), r"max_length.*<= 1024",
        lambda m, t: lambda: _seq2seq()(13, 13, embedding_dim=8, units=8, start_token=1, end_token=2,
                                        max_length=1025), "max_length"),
    "Seq2Seq.greedy_decode: max_length": Row(
        lambda: _seq2seq().greedy_decode, r"1024",
        lambda m, t: lambda: m["Seq2Seq"].greedy_decode(_ids(3), max_length=1025), "max_length"),
    "Seq2Seq.beam_search: max_length": Row(
        lambda: _seq2seq().beam_search, r"1024",
        lambda m, t: lambda: m["Seq2Seq"].beam_search(_ids(3), width=2, max_length=1025), "max_length"),
    # ---------------------------------------------------------------- the captioner
    "ImageCaptioner: max_length (a file sets it)": Row(
        lambda: _captioner(), r"`MAX_LENGTH` = 1024",
        lambda m, t: lambda: _small_captioner(max_length=1025), "max_length",
        at=lambda m, t: lambda: _small_captioner(max_length=1024)),
    "ImageCaptioner.caption: max_length": Row(
        lambda: _captioner().caption, r"`max_length`.*<= `MAX_LENGTH` = 1024",
        lambda m, t: lambda: m["ImageCaptioner"].caption(m["ImageCaptioner input"], max_length=1025), "max_length"),
    "ImageCaptioner.caption: width": Row(
        lambda: _captioner().caption, r"`width` in\s+\[1, vocab_size\]",
        lambda m, t: lambda: m["ImageCaptioner"].caption(m["ImageCaptioner input"], width=10), "width",
        at=lambda m, t: lambda: m["ImageCaptioner"].caption(m["ImageCaptioner input"], width=9, max_length=2)),
    "ImageCaptioner.beam_caption: max_length": Row(
        lambda: _captioner().beam_caption, r"`max_length`.*<= `MAX_LENGTH` = 1024",
        lambda m, t: lambda: m["ImageCaptioner"].beam_caption(m["ImageCaptioner input"], max_length=1025),
        "max_length"),
    "ImageCaptioner.greedy_caption: max_length": Row(
        lambda: _captioner().greedy_caption, r"`MAX_LENGTH` = 1024",
        lambda m, t: lambda: m["ImageCaptioner"].greedy_caption(m["ImageCaptioner input"], max_length=1025),
        "max_length"),
}


def _params(calls_only=False):
    return [pytest.param(name, marks=row.marks, id=name) for name, row in ROWS.items()
            if row.past is not None or not calls_only]


@pytest.mark.parametrize("name", _params())
def test_the_bound_is_in_the_entry_points_docstring(name):
    row = ROWS[name]
    doc = " ".join((row.entry().__doc__ or "").split())
    assert re.search(row.doc, doc), f"{name}: the docstring does not state the bound ({row.doc!r})"


@pytest.mark.parametrize("name", _params(calls_only=True))  # rows without a call: bounded by the file's size
def test_one_past_the_bound_is_a_value_error_naming_it(name, models, tmp_path):
    row = ROWS[name]
    call = row.past(models, tmp_path)
    try:
        call()
    except row.exception as exc:
        assert re.search(row.error, str(exc)), f"{name}: {type(exc).__name__} without {row.error!r}: {exc}"
    else:
        raise AssertionError(f"{name}: one past the bound was accepted")
    if row.at is not None:
        row.at(models, tmp_path)()  # the bound itself is accepted


def test_a_sentence_past_max_source_length_is_cut_to_it(models):
    """The Transformer's documented truncation (CTranslate2's max_input_length): a sentence of more than
    MAX_SOURCE_LENGTH subwords translates as its first MAX_SOURCE_LENGTH."""
    model = models["Transformer"]
    bound = model.MAX_SOURCE_LENGTH
    words = ("the cat sat on the mat . " * 400).split()
    pieces = len(model.source_tokenizer.tokenize(" ".join(words)))
    assert pieces > bound + 1
    ids = model.encode_sources([" ".join(words)])
    assert ids.shape[1] == bound
    from attnx.decoding import until_end
    tokens, _ = until_end(model.greedy_decode(ids, max_length=3)[0][0].tolist(), model.end_id)
    assert model.translate_batch([" ".join(words)], max_length=3)[0].tokens == tokens


def test_a_seq2seq_source_past_max_source_length_is_cut_to_it():
    """Seq2Seq's documented truncation: a sentence of more than MAX_SOURCE_LENGTH words encodes (so
    translates) as its first MAX_SOURCE_LENGTH; a max_length given still sets the width."""
    from attnx.seq2seq import Seq2Seq
    attnx.set_random_seed(0)
    model = Seq2Seq.from_texts(["<start> a b c <end>", "<start> b c <end>"], ["<start> x y <end>", "<start> y <end>"],
                               embedding_dim=4, units=4, max_length=5)
    bound = model.MAX_SOURCE_LENGTH
    long = "<start> " + "a b c " * 700 + "<end>"
    ids = model.encode_sources([long, "<start> a b <end>"])
    assert ids.shape == (2, bound)
    np.testing.assert_array_equal(ids[0], model.encode_sources([long[:-len("<end>")]])[0][:bound])
    assert model.encode_sources(["<start> a b <end>"]).shape == (1, 4)  # the longest row, not the bound
    assert model.encode_sources(["<start> a b <end>"], max_length=7).shape == (1, 7)
    model.translate(long)
