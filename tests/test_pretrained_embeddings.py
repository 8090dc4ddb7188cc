"""Pretrained embeddings: an Embedding started from a matrix and frozen with trainable=False (through
fit, get_config, save and load), and `attnx.text.load_word_vectors` on GloVe and word2vec text files."""
import numpy as np
import pytest

import attnx
from attnx import initializers, layers
from attnx.text import Tokenizer, load_word_vectors

GLOVE = """the 0.1 0.2 0.3
cat -1.5 2.0 0.25
sat 3 4 5
zebra 9 9 9
"""


def _tokenizer(texts=("the cat sat on the mat", "the cat"), **kwargs):
    tokenizer = Tokenizer(**kwargs)
    tokenizer.fit_on_texts(list(texts))
    return tokenizer  # the=1 cat=2 sat=3 on=4 mat=5


def _frozen_model(matrix, **embedding_kwargs):
    model = attnx.Sequential([
        layers.Embedding(*matrix.shape, input_shape=(6,), trainable=False, **embedding_kwargs),
        layers.LSTM(4),
        layers.Dense(1, activation="sigmoid"),
    ])
    model.compile("adam", "binary_crossentropy")
    return model


@pytest.mark.parametrize("how", ["array", "constant", "weights"])
def test_frozen_pretrained_embedding_survives_fit_save_and_load(tmp_path, how):
    matrix = np.random.default_rng(0).normal(size=(12, 5)).astype("float32")
    kwargs = {"array": {"embeddings_initializer": matrix},
              "constant": {"embeddings_initializer": initializers.Constant(matrix)},
              "weights": {"weights": [matrix]}}[how]
    model = _frozen_model(matrix, **kwargs)
    x = np.random.default_rng(1).integers(0, 12, size=(32, 6))
    before = [p.copy() for p in model.params.values()]
    model.fit(x, np.arange(32) % 2, epochs=2, batch_size=8, verbose=0)
    embedding = model.layers[0]
    np.testing.assert_array_equal(embedding.params["embeddings"], matrix)
    assert not all(np.array_equal(b, p) for b, p in zip(before[1:], list(model.params.values())[1:]))  # the rest trains
    model.save(tmp_path / "m.attnx")
    loaded = attnx.load_model(tmp_path / "m.attnx")
    assert loaded.layers[0].trainable is False
    np.testing.assert_array_equal(loaded.layers[0].params["embeddings"], matrix)
    loaded.fit(x, np.arange(32) % 2, epochs=1, verbose=0)
    np.testing.assert_array_equal(loaded.layers[0].params["embeddings"], matrix)
    rebuilt = layers.Embedding.from_config(embedding.get_config())
    rebuilt.build((None, 6))
    assert not rebuilt.trainable
    if how != "weights":  # Keras' Constant keeps the matrix in the config; weights=[...] does not
        np.testing.assert_array_equal(rebuilt.params["embeddings"], matrix)


def test_pretrained_matrix_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        layers.Embedding(4, 2, embeddings_initializer=np.zeros((3, 2)))(np.array([[1, 2]]))
    with pytest.raises(ValueError, match="expected shape"):
        layers.Embedding(4, 2, weights=[np.zeros((4, 3))])(np.array([[1, 2]]))


def test_glove_file(tmp_path):
    (tmp_path / "glove.txt").write_text(GLOVE)
    tokenizer = _tokenizer()
    vectors = load_word_vectors(tmp_path / "glove.txt", tokenizer, oov="zeros")
    assert (vectors.hits, vectors.misses, vectors.missing) == (3, 2, ["on", "mat"])
    m = vectors.matrix
    assert m.shape == (6, 3) and m.dtype == np.float32
    np.testing.assert_allclose(m[tokenizer.word_index["cat"]], [-1.5, 2.0, 0.25])
    np.testing.assert_array_equal(m[[0, 4, 5]], 0)
    embedding = layers.Embedding(*m.shape, embeddings_initializer=m, trainable=False)
    np.testing.assert_allclose(embedding(np.array([[2, 3]]))[0], m[[2, 3]])


def test_missing_words_drawn_like_the_found_vectors(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(400)]
    values = rng.normal(2.0, 3.0, size=(400, 50))
    (tmp_path / "v.txt").write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in zip(words, values)))
    tokenizer = _tokenizer([" ".join(words[:10] + [f"new{i}" for i in range(300)])])
    vectors = load_word_vectors(tmp_path / "v.txt", tokenizer, seed=0)
    assert (vectors.hits, vectors.misses) == (10, 300)
    drawn = vectors.matrix[[tokenizer.word_index[f"new{i}"] for i in range(300)]]
    assert abs(drawn.mean() - values.mean()) < 0.05 and abs(drawn.std() - values.std()) < 0.05
    again = load_word_vectors(tmp_path / "v.txt", tokenizer, seed=0)
    np.testing.assert_array_equal(again.matrix, vectors.matrix)


def test_word2vec_header_num_words_and_spaces(tmp_path):
    (tmp_path / "w2v.txt").write_text("3 2\nthe 1 2\nnew york 3 4\ncat 5 6\n")
    tokenizer = _tokenizer(num_words=3, oov_token="<unk>")  # <unk>=1 the=2 (cat=3 cut)
    vectors = load_word_vectors(tmp_path / "w2v.txt", tokenizer, oov="zeros", dtype="float64")
    assert vectors.matrix.shape == (3, 2) and vectors.matrix.dtype == np.float64
    assert (vectors.hits, vectors.missing) == (1, ["<unk>"])
    np.testing.assert_array_equal(vectors.matrix[2], [1, 2])
    tokenizer = Tokenizer(lower=False)
    tokenizer.fit_on_texts([["new york", "cat"]])
    assert load_word_vectors(tmp_path / "w2v.txt", tokenizer).hits == 2


@pytest.mark.parametrize("content, match", [
    ("", "no word vectors"),
    ("\n\n", "no word vectors"),
    ("the 1 2 3\ncat 1 2\n", "line 2: a vector of 2 values"),
    ("the 1 2 3\ncat 1 x 3\n", "line 2: not a number"),
    ("the 1 nan 3\n", "line 1: a non-finite"),
    ("5 3\nthe 1 2 3\n", "declares 5 vectors"),
    ("2 3\nthe 1 2 3\ncat 1 2\n", "line 3"),
    ("the\n", "line 1: a word without a vector"),
])
def test_bad_vector_files(tmp_path, content, match):
    (tmp_path / "bad.txt").write_text(content)
    with pytest.raises(ValueError, match=match):
        load_word_vectors(tmp_path / "bad.txt", _tokenizer())


def test_bad_arguments(tmp_path):
    (tmp_path / "glove.txt").write_text(GLOVE)
    with pytest.raises(ValueError, match="oov"):
        load_word_vectors(tmp_path / "glove.txt", _tokenizer(), oov="uniform")
    with pytest.raises(ValueError, match="fit it"):
        load_word_vectors(tmp_path / "glove.txt", Tokenizer())
    with pytest.raises(FileNotFoundError):
        load_word_vectors(tmp_path / "missing.txt", _tokenizer())
