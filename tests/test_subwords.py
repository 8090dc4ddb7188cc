"""attnx.text.SubwordTokenizer: SentencePiece's BPE and unigram vocabularies inside attnx's files.

Round trips of any text (cased, punctuated, unsegmented scripts, emoji, control characters) with byte
fallback, the stated policy without it, the model carried in the JSON config and read back without a
pickle, bad configs as ValueError, and bounds: work linear in the input (a 1 MB word)."""
import base64
import json

import numpy as np
import pytest

import attnx
from attnx.text import SubwordTokenizer, tokenizer_from_json

CORPUS = ["The cat sat on the mat.", "The dog sat on the log!", "A cat and a dog?", "The cats sat.",
          "मी घरी जातो.", "तो घरी जातो.", "ती शाळेत जाते."]
ODD_TEXTS = ["  the   dogs sat\ton a cat  ", "Hello, World! 42", "東京都に住んでいます", "emoji 😀🎉 ok",
             "control \x01\x7f chars", "Ünïcödé naïve café", "zzzqqq xyzzy"]


@pytest.fixture(scope="module")
def marathi_texts():
    splits = attnx.datasets.load_anki_pairs(max_words=6, num_examples=3000)
    strip = (lambda s: " ".join(s.split()[1:-1]))  # the loader's <start> / <end> markers
    return [strip(s) for s in splits.train.source + splits.train.target], \
        [strip(s) for s in splits.test.source + splits.test.target]


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_byte_fallback_round_trips_every_text(model_type):
    tok = SubwordTokenizer(300, model_type=model_type, byte_fallback=True).fit_on_texts(CORPUS * 20)
    assert tok.vocab_size <= 300
    for text in CORPUS + ODD_TEXTS:
        ids = tok.encode(text)
        assert tok.unk_id not in ids, text
        assert tok.decode(ids) == " ".join(text.split()), text
    # case and punctuation are kept: "The" and "the" differ
    assert tok.encode("The") != tok.encode("the")
    assert tok.tokenize("The cat")[0].startswith(SubwordTokenizer.MARKER)


def test_without_byte_fallback_unseen_characters_are_unk_and_the_rest_is_spelt():
    tok = SubwordTokenizer(60).fit_on_texts(CORPUS)  # below 1024: byte fallback off by default
    assert not tok.byte_fallback
    for text in CORPUS + ["  The   dog sat  on a cat  "]:
        assert tok.decode(tok.encode(text)) == " ".join(text.split())
    unseen = tok.encode("dogcat tac")  # a word never seen, made of seen characters
    assert tok.unk_id not in unseen and tok.decode(unseen) == "dogcat tac"
    ids = tok.encode("The zoo")  # z never seen
    assert tok.unk_id in ids
    assert SubwordTokenizer(1024).byte_fallback and not SubwordTokenizer(1023).byte_fallback


def test_json_round_trip_carries_the_model_and_gives_the_same_ids():
    tok = SubwordTokenizer(300, byte_fallback=True).fit_on_texts(CORPUS * 10)
    again = tokenizer_from_json(tok.to_json())
    assert isinstance(again, SubwordTokenizer)
    assert again.word_index == tok.word_index and again.vocab_size == tok.vocab_size
    for text in CORPUS + ODD_TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert again.texts_to_sequences(CORPUS) == [tok.encode(t) for t in CORPUS]
    assert again.sequences_to_texts(again.texts_to_sequences(CORPUS)) == CORPUS
    # an unfitted tokenizer round-trips too, and says what to do when used
    empty = tokenizer_from_json(SubwordTokenizer(100).to_json())
    with pytest.raises(RuntimeError, match="fit_on_texts"):
        empty.encode("the")


def test_decode_drops_padding_and_markers_and_refuses_ids_outside_the_vocabulary():
    tok = SubwordTokenizer(100).fit_on_texts(CORPUS)
    ids = tok.encode("The cat sat.")
    start, end = tok.word_index["<start>"], tok.word_index["<end>"]
    assert tok.decode([start] + ids + [end, 0, 0]) == "The cat sat."
    assert tok.decode(np.array(ids, dtype=np.int64)) == "The cat sat."
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="integer ids"):
        tok.decode([1.5])
    with pytest.raises(TypeError, match="integer ids"):
        tok.decode([[1, 2]])
    with pytest.raises(TypeError, match="str"):
        tok.encode(b"bytes")


@pytest.mark.parametrize("kwargs, match", [
    ({"vocab_size": 3}, "vocab_size"), ({"vocab_size": 2.5}, "vocab_size"), ({"vocab_size": True}, "vocab_size"),
    ({"vocab_size": 100, "byte_fallback": True}, "byte_fallback"), ({"byte_fallback": "yes"}, "byte_fallback"),
    ({"model_type": "wordpiece"}, "model_type"), ({"character_coverage": 0.5}, "character_coverage"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SubwordTokenizer(**kwargs)


def test_bad_configs_are_value_errors():
    tok = SubwordTokenizer(100).fit_on_texts(CORPUS)
    config = tok.get_config()
    with pytest.raises(ValueError, match="pure-Python BPE"):   # a file of attnx 0.1's tokenizer
        SubwordTokenizer.from_config({"vocab_size": 100, "merges": [["a", "b"]], "symbols": []})
    with pytest.raises(ValueError, match="base64"):
        SubwordTokenizer.from_config({**config, "model": "not base64!!"})
    with pytest.raises(ValueError, match="base64"):
        SubwordTokenizer.from_config({**config, "model": 7})
    with pytest.raises(ValueError, match="SentencePiece model"):
        SubwordTokenizer.from_config({**config, "model": base64.b64encode(b"\x00garbage" * 50).decode()})
    # a truncated model
    truncated = base64.b64encode(base64.b64decode(config["model"])[:100]).decode()
    with pytest.raises(ValueError, match="SentencePiece model"):
        SubwordTokenizer.from_config({**config, "model": truncated})
    with pytest.raises(ValueError):
        tokenizer_from_json(json.dumps({"class_name": "SubwordTokenizer", "config": {**config, "vocab_size": -1}}))
    with pytest.raises(ValueError, match="non-blank"):
        SubwordTokenizer(100).fit_on_texts(["   ", ""])


def test_a_one_megabyte_word_and_unsegmented_text_encode_and_round_trip():
    tok = SubwordTokenizer(1100).fit_on_texts(CORPUS * 50)  # byte fallback on
    word = "abcdefghij" * 100_000
    ids = tok.encode(word)
    assert len(ids) <= len(word) + 1 and tok.decode(ids) == word
    cjk = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(50_000))
    assert tok.decode(tok.encode(cjk)) == cjk


def test_marathi_pairs_round_trip_with_few_unknowns(marathi_texts):
    train, held_out = marathi_texts
    tok = SubwordTokenizer(1500).fit_on_texts(train)
    for text in held_out:
        assert tok.decode(tok.encode(text)) == text  # byte fallback: every held-out text round-trips
    bytes_used = sum(any(tok.index_word[i].startswith("<0x") for i in tok.encode(t)) for t in held_out)
    assert bytes_used <= len(held_out) // 50  # only texts with characters never seen in training
