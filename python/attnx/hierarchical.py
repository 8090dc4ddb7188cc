"""Hierarchical Attention Networks (Yang et al. 2016) for document classification, and a document
task made from the UCI review sentences (restaurant reviews that decide the label among product
reviews that do not).

A document is (sentences, words) token ids. Each sentence is read by a word-level bidirectional
GRU whose outputs an attention pooling sums into a sentence vector; the sentence vectors are read by
a sentence-level bidirectional GRU whose outputs a second attention pooling sums into the document
vector, which a Dense layer classifies::

    h_sw = BiGRU_word(E w_sw),   alpha_sw = softmax_w(tanh(h_sw W_w + b_w) . u_w),   s_s = sum_w alpha_sw h_sw
    g_s  = BiGRU_sent(s_s),      beta_s   = softmax_s(tanh(g_s W_s + b_s) . u_s),    d   = sum_s beta_s g_s
    y    = Dense(d)

with learned context vectors u_w, u_s (`ContextAttention`). The Keras tutorial's `AttentionPooling`
(``softmax(tanh(h . w + b))``) was tried first: its scores lie in [-1, 1], so its weights can differ
by at most e^2, and on the review documents its sentence attention stayed near uniform.
Padding (id 0) is masked at both levels: padded words and wholly padded sentences get zero weight.
The model is composed of existing layers, each called through the layer contract (``apply`` /
``backprop``); its kernels are theirs.
"""
from typing import NamedTuple

import numpy as np

from . import initializers, ops
from .backend import unique_name
from .layers import GRU, Bidirectional, Dense, Embedding, Layer
from .models import Model


class ContextAttention(Layer):
    """HAN's attention pooling with a learned context vector: over the real steps t of (B, T, d) inputs,

        u_t = tanh(h_t W + b),   alpha = softmax_t(u_t . u_ctx),   output = sum_t alpha_t h_t

    Returns ``[output (B, d), alpha (B, T)]`` (alpha takes no gradient). A fully masked row pools to
    zeros. Written with `attnx.ops` around a Dense sublayer (``projection``), so its backward is the
    tape's.

    Args:
        units: the size of u (the paper's attention hidden size).
    """

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"ContextAttention: `units` must be a positive integer, got {units!r}")
        self.units = int(units)
        self.projection = Dense(self.units, activation="tanh", dtype=self.dtype.name)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, features), got shape {input_shape}")
        self.add_weight("context", (self.units,), initializers.get("glorot_uniform"))
        if not self.projection.built:
            self.projection.build(input_shape)
            self.projection.built = True
        self._adopt_sublayer_weights()

    def call(self, inputs, mask=None):
        scores = ops.matmul(self.projection(inputs), self.params["context"])
        alpha = ops.softmax(scores, axis=-1, mask=mask)
        return [ops.sum(ops.multiply(ops.expand_dims(alpha, -1), inputs), axis=1), alpha]

    def compute_output_shape(self, input_shape):
        return [(input_shape[0], input_shape[2]), (input_shape[0], input_shape[1])]

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class _HANCache(NamedTuple):
    shape: tuple  # (B, S, W)
    embedding: object
    word_encoder: object
    word_attention: object
    sentence_encoder: object
    sentence_attention: object
    classifier: object
    with_scores: bool


class HierarchicalAttentionNetwork(Model):
    """Yang et al.'s Hierarchical Attention Network as a model class.

    Args:
        vocab_size: token ids lie in [0, vocab_size); 0 is padding.
        embedding_dim: word embedding size.
        word_units, sentence_units: the GRU sizes of each direction at the word and sentence levels.
        num_classes: 1 (the default) for a binary task (a sigmoid output), else a softmax over the classes.
        dtype: "float32" or "float64".

    Call: ``model(ids)`` with ids (batch, sentences, words) ints gives the class probabilities;
    ``model(ids, return_attention_scores=True)`` gives ``[probabilities, word weights (batch,
    sentences, words), sentence weights (batch, sentences)]`` (`attention` does that at inference).
    Train with ``compile`` / ``fit(ids, labels)`` like any model.

    Layers: ``embedding``, ``word_encoder`` and ``sentence_encoder`` (Bidirectional GRU),
    ``word_attention`` and ``sentence_attention`` (ContextAttention), ``classifier`` (Dense).
    """

    def __init__(self, vocab_size, embedding_dim=64, word_units=32, sentence_units=32, attention_units=None,
                 num_classes=1, dtype="float32", name=None):
        super().__init__(name=name or unique_name("hierarchical_attention_network"), dtype=dtype)
        attention_units = 2 * word_units if attention_units is None else attention_units
        for arg, value in (("vocab_size", vocab_size), ("embedding_dim", embedding_dim), ("word_units", word_units),
                           ("sentence_units", sentence_units), ("attention_units", attention_units),
                           ("num_classes", num_classes)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"HierarchicalAttentionNetwork: `{arg}` must be a positive integer, got {value!r}")
        self.vocab_size, self.embedding_dim = int(vocab_size), int(embedding_dim)
        self.word_units, self.sentence_units, self.num_classes = int(word_units), int(sentence_units), int(num_classes)
        self.attention_units = int(attention_units)
        self.embedding = Embedding(self.vocab_size, self.embedding_dim, dtype=dtype, name="embedding")
        self.word_encoder = Bidirectional(GRU(self.word_units, return_sequences=True, dtype=dtype),
                                          name="word_encoder")
        self.word_attention = ContextAttention(self.attention_units, dtype=dtype, name="word_attention")
        self.sentence_encoder = Bidirectional(GRU(self.sentence_units, return_sequences=True, dtype=dtype),
                                              name="sentence_encoder")
        self.sentence_attention = ContextAttention(self.attention_units, dtype=dtype, name="sentence_attention")
        self.classifier = Dense(self.num_classes, activation="sigmoid" if self.num_classes == 1 else "softmax",
                                dtype=dtype, name="classifier")
        self.build()

    def build(self, input_shape=None):
        """Creates the weights (they depend on the sizes given to the constructor only)."""
        D, Hw, Hs = self.embedding_dim, 2 * self.word_units, 2 * self.sentence_units
        for layer, shape in ((self.embedding, (None, None)), (self.word_encoder, (None, None, D)),
                             (self.word_attention, (None, None, Hw)), (self.sentence_encoder, (None, None, Hw)),
                             (self.sentence_attention, (None, None, Hs)), (self.classifier, (None, Hs))):
            if not layer.built:
                layer.build(shape)
                layer.built = True
        self.built = True

    def get_config(self):
        return {"name": self.name, "vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim,
                "word_units": self.word_units, "sentence_units": self.sentence_units,
                "attention_units": self.attention_units,
                "num_classes": self.num_classes, "dtype": self.dtype.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def _ids(self, inputs):
        ids = np.asarray(inputs)
        if ids.dtype.kind not in "iu" and not (ids.dtype.kind == "f" and ids.size and np.all(ids == np.round(ids))):
            raise TypeError(f"Model '{self.name}': inputs must be integer token ids, got dtype {ids.dtype}")
        if ids.ndim != 3 or 0 in ids.shape:
            raise ValueError(f"Model '{self.name}': inputs must be token ids (batch, sentences, words), got shape "
                             f"{ids.shape}")
        return ids.astype(np.int64, copy=False)

    def forward(self, inputs, training=False, return_attention_scores=False):
        ids = self._ids(inputs)
        B, S, W = ids.shape
        words = ids.reshape(B * S, W)
        word_mask = words != 0
        sentence_mask = word_mask.reshape(B, S, W).any(axis=-1)
        embedded, c_embedding = self.embedding.apply(words, training=training)
        h, c_word = self.word_encoder.apply(embedded, training=training, mask=word_mask)
        (sentences, word_weights), c_word_att = self.word_attention.apply(h, training=training, mask=word_mask)
        g, c_sentence = self.sentence_encoder.apply(sentences.reshape(B, S, -1), training=training,
                                                    mask=sentence_mask)
        (document, sentence_weights), c_sentence_att = self.sentence_attention.apply(g, training=training,
                                                                                     mask=sentence_mask)
        out, c_classifier = self.classifier.apply(document, training=training)
        cache = _HANCache((B, S, W), c_embedding, c_word, c_word_att, c_sentence, c_sentence_att, c_classifier,
                          bool(return_attention_scores)) if training else None
        if return_attention_scores:
            return [out, word_weights.reshape(B, S, W), sentence_weights], cache
        return out, cache

    def backprop(self, cache, dy, need_dx=True):
        B, S, W = cache.shape
        dout = dy[0] if cache.with_scores else dy  # the attention weights take no gradient
        ddocument = self.classifier.backprop(cache.classifier, dout)
        dg = self.sentence_attention.backprop(cache.sentence_attention, [ddocument, None])
        dsentences = self.sentence_encoder.backprop(cache.sentence_encoder, dg)
        dh = self.word_attention.backprop(cache.word_attention, [dsentences.reshape(B * S, -1), None])
        dembedded = self.word_encoder.backprop(cache.word_encoder, dh)
        self.embedding.backprop(cache.embedding, dembedded, need_dx=False)  # token ids take no gradient
        return None

    def attention(self, ids):
        """(word weights (batch, sentences, words), sentence weights (batch, sentences)) at inference."""
        _, word_weights, sentence_weights = self.forward(ids, return_attention_scores=True)[0]
        return word_weights, sentence_weights

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)


# ------------------------------------------------------------------------------- the document task
class ReviewDocuments(NamedTuple):
    documents: list  # per document, its sentences (strings)
    labels: np.ndarray  # (N,) 0/1: the sentiment of the document's restaurant reviews
    carries_label: list  # per document, a bool per sentence: True for the sentences that decide the label


_TEST_FRACTION = 0.2  # split="test": this share of each source's sentences of each label, the same for every seed


def review_documents(n, sentences=(3, 8), deciding=(1, 2), seed=0, split=None, data_dir=None):
    """`n` documents of 3-8 UCI review sentences (`sentences`, inclusive): 1-2 of them (`deciding`)
    restaurant reviews (yelp) of one sentiment, which is the document's label (balanced), the others
    product reviews (amazon) of random sentiment, which the model must learn to ignore;
    `carries_label` marks the restaurant sentences. Sentences are reused only once a pool runs out.
    ``split="train"`` / ``"test"`` draws from disjoint sentences (the last 20% of each source and label,
    in an order fixed for every seed); None from all."""
    from . import datasets
    lo, hi = sentences
    d_lo, d_hi = deciding
    if not (1 <= d_lo <= d_hi <= lo <= hi):
        raise ValueError(f"review_documents: need 1 <= deciding <= sentences, got deciding={deciding}, "
                         f"sentences={sentences}")
    if split not in (None, "train", "test"):
        raise ValueError(f"review_documents: `split` must be None, 'train' or 'test', got {split!r}")
    rng, fixed = np.random.default_rng(seed), np.random.default_rng(0)
    pools = []  # (texts, per label a shuffled index list)
    for source in ("yelp", "amazon"):
        texts, labels = datasets.load_uci_sentiment(sources=(source,), data_dir=data_dir)
        by_label = []
        for k in (0, 1):
            ids = fixed.permutation(np.flatnonzero(labels == k))
            cut = len(ids) - int(len(ids) * _TEST_FRACTION)
            ids = ids[:cut] if split == "train" else ids[cut:] if split == "test" else ids
            by_label.append(list(rng.permutation(ids)))
        pools.append((texts, by_label))
    taken = {}

    def draw(source, label):
        texts, by_label = pools[source]
        order = by_label[label]
        i = taken.get((source, label), 0)
        taken[(source, label)] = i + 1
        return texts[order[i % len(order)]]

    docs, carries = [], []
    doc_labels = rng.permutation(np.arange(n) % 2)
    for label in doc_labels:
        k = int(rng.integers(lo, hi + 1))
        r = int(rng.integers(d_lo, min(d_hi, k) + 1))
        picked = [draw(0, int(label)) for _ in range(r)] + [draw(1, int(rng.integers(2))) for _ in range(k - r)]
        order = rng.permutation(k)
        docs.append([picked[i] for i in order])
        carries.append(order < r)
    return ReviewDocuments(docs, doc_labels.astype(np.float32), carries)


def document_ids(tokenizer, documents, max_sentences, max_words):
    """Token ids (N, max_sentences, max_words) of documents (lists of sentences) with a fitted
    `attnx.text.Tokenizer`: each sentence post-padded / truncated to max_words, each document to
    max_sentences (padding sentences are all 0)."""
    from .text import pad_sequences
    out = np.zeros((len(documents), max_sentences, max_words), np.int64)
    for i, doc in enumerate(documents):
        doc = doc[:max_sentences]
        if doc:
            out[i, :len(doc)] = pad_sequences(tokenizer.texts_to_sequences(doc), maxlen=max_words, padding="post",
                                              truncating="post")
    return out
