"""Keras parity of attnx.text.Tokenizer and attnx.text.pad_sequences.

Every expected value below is derived by hand from Keras' source
(keras_preprocessing/text.py and keras/src/legacy/preprocessing/text.py for the
Tokenizer, keras/src/utils/sequence_utils.py for pad_sequences); the comments
give the derivation.
"""

import json
import math

import numpy as np
import pytest

from attnx.text import Tokenizer, pad_sequences, text_to_word_sequence, tokenizer_from_json

CORPUS = ["The cat sat on the mat.", "The dog ate my homework!", "Cat and dog?"]
# Counts in first-seen order: the 3, cat 2, sat 1, on 1, mat 1, dog 2, ate 1,
# my 1, homework 1, and 1. Keras sorts by count with a stable sort, so ties
# keep first-seen order: the, cat, dog, sat, on, mat, ate, my, homework, and.
CORPUS_INDEX = {
    "the": 1, "cat": 2, "dog": 3, "sat": 4, "on": 5,
    "mat": 6, "ate": 7, "my": 8, "homework": 9, "and": 10,
}  # fmt: skip
QUERY = ["The cat ate the unknown homework"]


def fitted(**kwargs):
    tokenizer = Tokenizer(**kwargs)
    tokenizer.fit_on_texts(CORPUS)
    return tokenizer


# --------------------------------------------------------------------------- #
# Tokenizer: vocabulary
# --------------------------------------------------------------------------- #


def test_word_index_sorted_by_count_with_ties_in_first_seen_order():
    tokenizer = fitted()
    assert tokenizer.word_index == CORPUS_INDEX
    assert list(tokenizer.word_index) == list(CORPUS_INDEX)
    assert tokenizer.index_word == {index: word for word, index in CORPUS_INDEX.items()}
    assert list(tokenizer.word_counts.items())[:3] == [("the", 3), ("cat", 2), ("sat", 1)]
    assert tokenizer.document_count == 3
    # word_docs counts texts, not occurrences: "the" occurs 3 times in 2 texts.
    assert tokenizer.word_docs["the"] == 2 and tokenizer.word_docs["and"] == 1
    assert tokenizer.index_docs[1] == 2 and tokenizer.index_docs[10] == 1


def test_counts_accumulate_over_several_fits():
    # fit 1: b 1, a 1; fit 2: a 2, c 1 -> sorted a(2), b(1), c(1).
    tokenizer = Tokenizer()
    tokenizer.fit_on_texts(["b a"])
    assert tokenizer.word_index == {"b": 1, "a": 2}
    tokenizer.fit_on_texts(["a c"])
    assert tokenizer.word_index == {"a": 1, "b": 2, "c": 3}
    assert tokenizer.document_count == 2


def test_default_filters_keep_apostrophes_and_lowercase():
    assert text_to_word_sequence("Don't STOP -- me now!\tOK") == ["don't", "stop", "me", "now", "ok"]


def test_empty_filters_and_no_lowercasing():
    tokenizer = Tokenizer(filters="", lower=False)
    tokenizer.fit_on_texts(["Hello, hello, world hello, HELLO"])
    # Punctuation stays attached and case is kept: "hello," occurs 3 times,
    # "Hello,", "world" and "HELLO" once each (in that first-seen order).
    assert tokenizer.word_index == {"hello,": 1, "Hello,": 2, "world": 3, "HELLO": 4}


def test_custom_split_also_replaces_filters():
    # Keras maps every filter character to `split`, so ';' separates words too.
    tokenizer = Tokenizer(split=",")
    tokenizer.fit_on_texts(["red,green;blue"])
    assert tokenizer.word_index == {"red": 1, "green": 2, "blue": 3}


def test_char_level_ignores_filters():
    # Characters: a 2, b 2, c 1, '!' 1 ('B' lowercased); filters are not applied.
    tokenizer = Tokenizer(char_level=True)
    tokenizer.fit_on_texts(["abca", "B!"])
    assert tokenizer.word_index == {"a": 1, "b": 2, "c": 3, "!": 4}
    assert tokenizer.texts_to_sequences(["cab!?"]) == [[3, 1, 2, 4]]


def test_lists_of_tokens_are_taken_as_tokens():
    tokenizer = Tokenizer()
    tokenizer.fit_on_texts([["Hello", "New York"], ["new york"]])
    assert tokenizer.word_index == {"new york": 1, "hello": 2}
    assert tokenizer.texts_to_sequences([["NEW YORK", "hello", "paris"]]) == [[1, 2]]


def test_oov_token_gets_index_one():
    tokenizer = fitted(oov_token="<OOV>")
    assert tokenizer.word_index == {"<OOV>": 1, **{word: index + 1 for word, index in CORPUS_INDEX.items()}}


# --------------------------------------------------------------------------- #
# Tokenizer: conversions and num_words
# --------------------------------------------------------------------------- #


def test_texts_to_sequences_drops_unknown_words_without_oov():
    # the 1, cat 2, ate 7, the 1, "unknown" dropped, homework 9.
    assert fitted().texts_to_sequences(QUERY) == [[1, 2, 7, 1, 9]]


def test_texts_to_sequences_maps_unknown_words_to_oov():
    # Indices shift by one: the 2, cat 3, ate 8, unknown -> 1, homework 10.
    assert fitted(oov_token="<OOV>").texts_to_sequences(QUERY) == [[2, 3, 8, 2, 1, 10]]


def test_num_words_keeps_indices_below_num_words():
    # num_words=4 keeps indices 1..3 (the, cat, dog): ate and homework vanish.
    tokenizer = fitted(num_words=4)
    assert tokenizer.texts_to_sequences(QUERY) == [[1, 2, 1]]
    # The vocabulary itself stays complete.
    assert len(tokenizer.word_index) == 10


def test_num_words_with_oov_maps_cut_words_to_oov():
    # Kept: <OOV> 1, the 2, cat 3; ate (8), unknown, homework (10) -> 1.
    assert fitted(num_words=4, oov_token="<OOV>").texts_to_sequences(QUERY) == [[2, 3, 1, 2, 1, 1]]


def test_num_words_zero_means_no_limit():
    # Keras tests `if num_words and ...`, so 0 behaves like None.
    assert fitted(num_words=0).texts_to_sequences(QUERY) == [[1, 2, 7, 1, 9]]


def test_sequences_to_texts():
    assert fitted().sequences_to_texts([[1, 2, 7, 0, 99]]) == ["the cat ate"]
    # With an OOV token, unknown indices (0 and 99 here) become the token.
    assert fitted(oov_token="<OOV>").sequences_to_texts([[2, 3, 8, 0, 99]]) == ["the cat ate <OOV> <OOV>"]
    assert fitted(num_words=4, oov_token="<OOV>").sequences_to_texts([[2, 3, 8]]) == ["the cat <OOV>"]
    assert fitted(num_words=4).sequences_to_texts([[1, 2, 7]]) == ["the cat"]


def test_oov_token_occurring_in_texts_keeps_keras_quirk():
    # Keras builds word_index with dict(zip(...)) over [oov] + sorted words,
    # so an OOV token that also occurs in the texts ends up at its later index.
    tokenizer = Tokenizer(oov_token="unk")
    tokenizer.fit_on_texts(["a a unk"])
    assert tokenizer.word_index == {"unk": 3, "a": 2}
    assert tokenizer.texts_to_sequences(["a zzz"]) == [[2, 3]]


# --------------------------------------------------------------------------- #
# Tokenizer: matrices
# --------------------------------------------------------------------------- #


@pytest.fixture
def abc_tokenizer():
    # a 2, b 2, c 1 -> a 1, b 2, c 3; width len(word_index) + 1 = 4.
    # Documents containing: a 1, b 2, c 1; document_count 2.
    tokenizer = Tokenizer()
    tokenizer.fit_on_texts(["a a b", "b c"])
    return tokenizer


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("binary", [[0, 1, 1, 0], [0, 0, 0, 1]]),
        ("count", [[0, 2, 1, 0], [0, 0, 0, 1]]),
        ("freq", [[0, 2 / 3, 1 / 3, 0], [0, 0, 0, 1]]),
        # tf = 1 + log(count), idf = log(1 + document_count / (1 + docs(j))).
        (
            "tfidf",
            [
                [0, (1 + math.log(2)) * math.log(1 + 2 / 2), math.log(1 + 2 / 3), 0],
                [0, 0, 0, math.log(1 + 2 / 2)],
            ],
        ),
    ],
)
def test_texts_to_matrix_modes(abc_tokenizer, mode, expected):
    # "d" is unknown and dropped, so the second text is [3].
    matrix = abc_tokenizer.texts_to_matrix(["a a b", "c d"], mode=mode)
    assert matrix.dtype == np.float64
    np.testing.assert_allclose(matrix, expected, rtol=1e-12)


def test_texts_to_matrix_width_follows_num_words():
    tokenizer = Tokenizer(num_words=3)
    tokenizer.fit_on_texts(["a a b", "b c"])
    # c has index 3 >= num_words: dropped, the second row is empty.
    np.testing.assert_array_equal(tokenizer.texts_to_matrix(["a a b", "c"]), [[0, 1, 1], [0, 0, 0]])


def test_freq_divides_by_full_sequence_length(abc_tokenizer):
    # Keras ignores indices >= width when counting but not in len(seq).
    abc_tokenizer.num_words = 3
    np.testing.assert_allclose(abc_tokenizer.sequences_to_matrix([[1, 5]], mode="freq"), [[0, 0.5, 0]])


def test_matrix_errors(abc_tokenizer):
    with pytest.raises(ValueError, match="vectorization mode"):
        abc_tokenizer.texts_to_matrix(["a"], mode="onehot")
    with pytest.raises(ValueError, match="num_words"):
        Tokenizer().texts_to_matrix(["a"])
    with pytest.raises(ValueError, match="tfidf"):
        Tokenizer(num_words=5).sequences_to_matrix([[1]], mode="tfidf")
    # fit_on_sequences provides the document counts tfidf needs.
    tokenizer = Tokenizer(num_words=3)
    tokenizer.fit_on_sequences([[1, 1], [2]])
    np.testing.assert_allclose(
        tokenizer.sequences_to_matrix([[1]], mode="tfidf"), [[0, math.log(1 + 2 / 2), 0]]
    )


# --------------------------------------------------------------------------- #
# Tokenizer: JSON
# --------------------------------------------------------------------------- #

# Written by keras_preprocessing 1.1.2:
# Tokenizer(num_words=3, oov_token="<unk>").fit_on_texts(["b a b", "c"]).to_json()
KERAS_JSON = (
    '{"class_name": "Tokenizer", "config": {"num_words": 3, "filters": '
    '"!\\"#$%&()*+,-./:;<=>?@[\\\\]^_`{|}~\\t\\n", "lower": true, "split": " ", '
    '"char_level": false, "oov_token": "<unk>", "document_count": 2, '
    '"word_counts": "{\\"b\\": 2, \\"a\\": 1, \\"c\\": 1}", '
    '"word_docs": "{\\"b\\": 1, \\"a\\": 1, \\"c\\": 1}", '
    '"index_docs": "{\\"2\\": 1, \\"3\\": 1, \\"4\\": 1}", '
    '"index_word": "{\\"1\\": \\"<unk>\\", \\"2\\": \\"b\\", \\"3\\": \\"a\\", \\"4\\": \\"c\\"}", '
    '"word_index": "{\\"<unk>\\": 1, \\"b\\": 2, \\"a\\": 3, \\"c\\": 4}"}}'
)


def test_to_json_matches_keras_format():
    tokenizer = Tokenizer(num_words=3, oov_token="<unk>")
    tokenizer.fit_on_texts(["b a b", "c"])
    ours, keras = json.loads(tokenizer.to_json()), json.loads(KERAS_JSON)
    assert ours["class_name"] == keras["class_name"] == "Tokenizer"
    # word_docs and index_docs are filled while iterating over a set, whose
    # order varies between runs: compare them decoded.
    for field in ("word_docs", "index_docs"):
        assert json.loads(ours["config"].pop(field)) == json.loads(keras["config"].pop(field))
    assert ours == keras


def test_tokenizer_from_keras_json():
    tokenizer = tokenizer_from_json(KERAS_JSON)
    assert tokenizer.word_index == {"<unk>": 1, "b": 2, "a": 3, "c": 4}
    assert tokenizer.index_word == {1: "<unk>", 2: "b", 3: "a", 4: "c"}
    assert tokenizer.num_words == 3 and tokenizer.document_count == 2
    # num_words=3 keeps <unk> and b; a is cut to <unk>, z is unknown.
    assert tokenizer.texts_to_sequences(["b a z"]) == [[2, 1, 1]]


def test_json_round_trip_preserves_behaviour():
    tokenizer = fitted(num_words=6, oov_token="<OOV>", char_level=False)
    restored = tokenizer_from_json(tokenizer.to_json(indent=2))
    assert restored.get_config() == tokenizer.get_config()
    assert restored.texts_to_sequences(QUERY) == tokenizer.texts_to_sequences(QUERY) == [[2, 3, 1, 2, 1, 1]]
    np.testing.assert_array_equal(
        restored.texts_to_matrix(CORPUS, mode="tfidf"), tokenizer.texts_to_matrix(CORPUS, mode="tfidf")
    )
    # Unlike Keras (whose restored word_docs is a plain dict), it can keep fitting.
    restored.fit_on_texts(["brand new words"])
    assert restored.word_index["brand"] == 12 and restored.document_count == 4


def test_tokenizer_from_json_rejects_other_json():
    with pytest.raises(ValueError, match="Tokenizer"):
        tokenizer_from_json('{"class_name": "Dense"}')
    with pytest.raises(ValueError, match="word_counts"):
        tokenizer_from_json('{"class_name": "Tokenizer", "config": {"num_words": null}}')


@pytest.mark.parametrize("field, value, words", [
    ("index_docs", "[]", "index_docs.*object"),
    ("index_docs", '{"x": 1}', "index_docs.*integer"),
    ("word_index", '{"a": "1"}', "word_index.*int"),
    ("word_index", '{"a": true}', "word_index.*int"),
    ("index_word", '{"1": 2}', "index_word.*str"),
    ("word_counts", "not json", "word_counts.*not valid JSON"),
    ("word_counts", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("word_docs", 7, "JSON string"),
    ("document_count", -1, "document_count"),
    ("unknown_option", 1, "unknown_option"),
])
def test_tokenizer_json_with_bad_fields_is_a_clear_error(field, value, words):
    payload = json.loads(KERAS_JSON)
    payload["config"][field] = value
    with pytest.raises((ValueError, TypeError), match=words):
        tokenizer_from_json(json.dumps(payload))


def test_tokenizer_json_nested_too_deeply_is_a_value_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        tokenizer_from_json("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match="not valid JSON"):
        tokenizer_from_json("{")


# --------------------------------------------------------------------------- #
# pad_sequences (the first four cases are the examples of Keras' docstring)
# --------------------------------------------------------------------------- #

SEQUENCES = [[1], [2, 3], [4, 5, 6]]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, [[0, 0, 1], [0, 2, 3], [4, 5, 6]]),
        ({"value": -1}, [[-1, -1, 1], [-1, 2, 3], [4, 5, 6]]),
        ({"padding": "post"}, [[1, 0, 0], [2, 3, 0], [4, 5, 6]]),
        ({"maxlen": 2}, [[0, 1], [2, 3], [5, 6]]),
        ({"maxlen": 2, "truncating": "post"}, [[0, 1], [2, 3], [4, 5]]),
        ({"maxlen": 2, "padding": "post", "truncating": "post"}, [[1, 0], [2, 3], [4, 5]]),
        ({"maxlen": 5}, [[0, 0, 0, 0, 1], [0, 0, 0, 2, 3], [0, 0, 4, 5, 6]]),
        ({"maxlen": 4, "padding": "post", "value": 9}, [[1, 9, 9, 9], [2, 3, 9, 9], [4, 5, 6, 9]]),
    ],
)
def test_pad_sequences_padding_and_truncation(kwargs, expected):
    padded = pad_sequences(SEQUENCES, **kwargs)
    assert padded.dtype == np.int32
    np.testing.assert_array_equal(padded, expected)


def test_pad_sequences_empty_sequences():
    np.testing.assert_array_equal(pad_sequences([[], [1, 2]]), [[0, 0], [1, 2]])
    # maxlen defaults to the longest length, 0 here.
    assert pad_sequences([[], []]).shape == (2, 0)
    assert pad_sequences([], maxlen=3).shape == (0, 3)
    with pytest.raises(ValueError, match="maxlen"):
        pad_sequences([])


def test_pad_sequences_maxlen_zero():
    # Keras' `s[-0:]` keeps everything and then fails; attnx returns empty rows.
    for truncating in ("pre", "post"):
        assert pad_sequences(SEQUENCES, maxlen=0, truncating=truncating).shape == (3, 0)


def test_pad_sequences_dtypes_and_float_values():
    floats = [[1.5, -2.7], [3.25]]
    # np.asarray(..., dtype="int32") truncates toward zero.
    np.testing.assert_array_equal(pad_sequences(floats), [[1, -2], [0, 3]])
    padded = pad_sequences(floats, dtype="float32", value=0.5)
    assert padded.dtype == np.float32
    np.testing.assert_array_equal(padded, np.array([[1.5, -2.7], [0.5, 3.25]], dtype=np.float32))
    assert pad_sequences(SEQUENCES, dtype="int64").dtype == np.int64
    assert pad_sequences(SEQUENCES, dtype=np.float64).dtype == np.float64


def test_pad_sequences_strings_need_object_dtype():
    padded = pad_sequences([["a", "bb"], ["c"]], dtype=object, value="<pad>")
    assert padded.tolist() == [["a", "bb"], ["<pad>", "c"]]
    with pytest.raises(ValueError, match="dtype=object"):
        pad_sequences([["a"]], value="<pad>")


def test_pad_sequences_arrays_and_sample_shape():
    np.testing.assert_array_equal(pad_sequences(np.arange(6).reshape(2, 3), maxlen=2), [[1, 2], [4, 5]])
    frames = [np.ones((2, 3)), np.full((1, 3), 2.0)]
    padded = pad_sequences(frames, dtype="float32", padding="post")
    assert padded.shape == (2, 2, 3)
    np.testing.assert_array_equal(padded[1], [[2, 2, 2], [0, 0, 0]])
    with pytest.raises(ValueError, match="expected shape"):
        pad_sequences([np.ones((2, 3)), np.ones((1, 4))])


def test_pad_sequences_bad_arguments():
    with pytest.raises(ValueError, match="Padding type"):
        pad_sequences(SEQUENCES, padding="middle")
    with pytest.raises(ValueError, match="Truncating type"):
        pad_sequences(SEQUENCES, truncating="both")
    # attnx checks up front; Keras would accept these when all sequences are empty.
    with pytest.raises(ValueError, match="Padding type"):
        pad_sequences([[]], padding="left")
    with pytest.raises(ValueError, match="non-iterable"):
        pad_sequences([[1], 5])
    with pytest.raises(ValueError, match="list of sequences"):
        pad_sequences(iter(SEQUENCES))
    with pytest.raises(TypeError, match="maxlen"):
        pad_sequences(SEQUENCES, maxlen=2.5)
    with pytest.raises(ValueError, match="maxlen"):
        pad_sequences(SEQUENCES, maxlen=-1)


def test_tokenizer_config_is_the_same_in_every_process():
    """Data-parallel ranks compare model configs (a Seq2Seq's holds its tokenizers): no set order in them."""
    import os
    import subprocess
    import sys
    code = ("import attnx; t = attnx.text.Tokenizer(oov_token='<unk>'); "
            "t.fit_on_texts(['a b c d e f g h', 'h g f e d c b a', 'c a b']); t.fit_on_sequences([[3, 1, 2, 5, 4]]); "
            "print(t.to_json())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(outs) == 1
