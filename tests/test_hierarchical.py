"""The Hierarchical Attention Network (attnx.hierarchical): gradients of the composed model against
finite differences, masks at both levels, saving, bad input, and end-to-end training on documents
made of UCI review sentences among neutral sentences, where the sentence attention must find the
reviews."""
import numpy as np
import pytest

import attnx
from attnx.hierarchical import HierarchicalAttentionNetwork, document_ids, review_documents
from attnx.testing import assert_close, gradcheck


def small_ids(rng, B=3, S=4, W=5, vocab=11):
    ids = rng.integers(1, vocab, (B, S, W))
    ids[0, 1, 3:] = 0  # post-padded words
    ids[1, 3] = 0  # a padding sentence
    ids[2, 0, :2] = 0  # pre-padded words
    return ids


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    model = HierarchicalAttentionNetwork(11, embedding_dim=4, word_units=3, sentence_units=2, dtype="float64")
    ids = small_ids(rng)
    out, cache = model.apply(ids, training=True)
    model.zero_grad()
    assert model.backprop(cache, rng.standard_normal((3, 1))) is None  # token ids take no gradient
    assert len(model.grads) == 1 + 2 * 6 + 2 * 3 + 2  # embedding; 2 BiGRUs of 2 x 3 weights; 2 attentions; Dense
    gradcheck(model, ids, max_elements=6, atol=1e-7, rtol=0.0)


def test_attention_weights_respect_padding():
    rng = np.random.default_rng(1)
    model = HierarchicalAttentionNetwork(11, embedding_dim=4, word_units=3, sentence_units=2)
    ids = small_ids(rng)
    probs, word_weights, sentence_weights = model(ids, return_attention_scores=True)
    assert probs.shape == (3, 1) and word_weights.shape == (3, 4, 5) and sentence_weights.shape == (3, 4)
    assert np.all(word_weights[ids == 0] == 0)
    real = (ids != 0).any(-1)
    assert_close(word_weights.sum(-1)[real], np.ones(real.sum()), 1e-6, what="word weights")
    assert sentence_weights[1, 3] == 0
    assert_close(sentence_weights.sum(-1), np.ones(3), 1e-6, what="sentence weights")
    # the padding changes nothing: a document with its padding sentence cut gives the same output
    assert_close(model(ids[1:2, :3]), probs[1:2], 1e-6, what="padding sentence")
    w, s = model.attention(ids)
    assert_close(w, word_weights, 0, what="attention()")


def test_save_and_load(tmp_path):
    rng = np.random.default_rng(2)
    model = HierarchicalAttentionNetwork(11, embedding_dim=4, word_units=3, sentence_units=2, num_classes=3)
    ids = small_ids(rng)
    model.save(tmp_path / "han.attnx")
    loaded = attnx.load_model(tmp_path / "han.attnx")
    assert_close(loaded(ids), model(ids), 0, what="loaded model")
    assert model(ids).shape == (3, 3)


@pytest.mark.parametrize("ids,error,words", [
    (np.zeros((2, 3)), ValueError, "sentences, words"),
    (np.zeros((2, 0, 3), np.int64), ValueError, "sentences, words"),
    (np.full((1, 2, 3), 0.5), TypeError, "integer"),
    (np.full((1, 2, 3), 11), IndexError, "out of range"),
])
def test_bad_input(ids, error, words):
    model = HierarchicalAttentionNetwork(11, embedding_dim=4, word_units=3, sentence_units=2, name="han")
    with pytest.raises(error, match=words):
        model(ids)


def test_bad_arguments():
    with pytest.raises(ValueError, match="word_units"):
        HierarchicalAttentionNetwork(11, word_units=0)
    with pytest.raises(ValueError, match="deciding"):
        review_documents(10, sentences=(3, 8), deciding=(4, 9))


def test_han_finds_the_review_sentences():
    """Documents of 3-8 review sentences whose label is the sentiment of their 1-2 restaurant reviews,
    among product reviews of random sentiment (train and test documents from disjoint sentences):
    HAN classifies them, and its sentence attention peaks on a restaurant review far more often than
    chance (the share of those sentences, 0.30). Measured (6 epochs): validation accuracy 0.755,
    peak on a deciding sentence in 62% of the test documents."""
    attnx.set_random_seed(0)
    train, test = review_documents(2000, seed=0, split="train"), review_documents(400, seed=1, split="test")
    tokenizer = attnx.text.Tokenizer(num_words=6000)
    tokenizer.fit_on_texts([s for doc in train.documents for s in doc])
    x_train, x_test = (document_ids(tokenizer, d.documents, max_sentences=8, max_words=20) for d in (train, test))
    model = HierarchicalAttentionNetwork(6000, embedding_dim=32, word_units=24, sentence_units=24)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, train.labels, epochs=6, batch_size=32, verbose=0,
                        validation_data=(x_test, test.labels))
    val = history.history["val_accuracy"]
    assert max(val) >= 0.72, val
    _, sentence_weights = model.attention(x_test)
    chance = np.mean([c.mean() for c in test.carries_label])
    hit = np.mean([test.carries_label[i][t] for i, t in enumerate(sentence_weights.argmax(-1))])
    assert chance < 0.35 and hit >= 0.5, (hit, chance)


# ContextAttention loads in a process that never imported attnx.hierarchical:
# tests/test_fresh_process_load.py, the contract over every public class.
