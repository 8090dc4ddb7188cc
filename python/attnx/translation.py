"""The transformer translation model of "Attention Is All You Need" (Vaswani et al. 2017), with the
API of the recurrent `attnx.seq2seq.Seq2Seq` (``from_texts``, ``compile``, ``fit_texts``,
``translate``, ``evaluate_bleu``), greedy and beam search over a key/value cache, and subword
vocabularies (`attnx.text.SubwordTokenizer`). `attnx.seq2seq` re-exports `Transformer`.

The model is the encoder stack, the decoder stack (causal self-attention, then attention over the
encoder's output), a final layer normalization after each (as PyTorch's ``nn.Transformer``) and a
linear layer giving the logits::

    x = dropout(E_src[source] * sqrt(D) + P),  memory = norm_enc(encoder(x, padding mask))
    y = dropout(E_tgt[target_in] * sqrt(D) + P),  h = norm_dec(decoder([y, memory], causal mask))
    logits = h W_out + b_out        (tie_output: logits = h E_tgt^T)

Training is teacher forcing as in Seq2Seq: ``fit(source ids, target ids)`` with targets that start
with the start token; `train_data` feeds ``[source, target[:, :-1]]`` and scores ``target[:, 1:]``.

Decoding runs one target position at a time, through the decoder stack's cached step
(`TransformerDecoder.step`: every layer in one C++ call). Each decoder layer keeps the keys and
values of the earlier positions of its self-attention (a `DecoderCache`, one row per step, rows
reordered with the hypotheses in beam search); the keys and values of the encoder output for the
cross-attention are projected once per sentence. A sentence leaves the batch as soon as it is
finished (greedy: its end token; beam search: all its beams ended), so the remaining steps run
on fewer rows.

Typical use::

    splits = attnx.datasets.load_anki_pairs(data_dir=..., max_words=10)
    model = Transformer.from_texts(splits.train.source, splits.train.target, vocab_size=4000)
    model.compile()                       # Adam + NoamDecay warm-up, label smoothing 0.1
    model.fit_texts(splits.train.source, splits.train.target, epochs=10)
    translation, attention = model.translate("i am hungry .")
    model.save("mar.attnx")               # attnx.load_model("mar.attnx") reads it back
"""
import math
from typing import NamedTuple

import numpy as np

from . import initializers, kernels, losses, metrics, optimizers, random, text
from .backend import unique_name
from . import decoding
from .decoding import Hypothesis, check_target_ids, positive_int as _positive_int
from .layers.core import Dense, Dropout, Embedding
from .layers.multi_head_attention import head_sizes
from .layers.normalization import LayerNormalization
from .layers.positions import PositionalEncoding, PositionEmbedding
from .layers.transformer import TransformerDecoder, TransformerEncoder
from .models import Model

__all__ = ["Transformer", "Hypothesis", "LengthBuckets"]




class _Cache(NamedTuple):
    source_embedding: object
    encoder: object
    encoder_norm: object
    target_embedding: object
    decoder: object
    decoder_norm: object
    output: object


def _strip_markers(sentence):
    """A sentence without the ``<start>`` / ``<end>`` markers of `attnx.datasets.preprocess_sentence`."""
    words = sentence.split()
    if words and words[0] == "<start>":
        words = words[1:]
    if words and words[-1] == "<end>":
        words = words[:-1]
    return " ".join(words)


class LengthBuckets:
    """Batches of pairs of similar lengths, for `Model.fit` (an iterable it starts anew each pass).

    Each pass shuffles the pairs (from `attnx.random`'s stream, so `attnx.set_random_seed` repeats it),
    sorts each window of `window` batches' worth of pairs by target then source length, cuts the
    windows into batches of `batch_size` and shuffles the batches: a batch's rows then need little
    padding, and the order still changes every pass (fairseq's and OpenNMT's bucketing).

    Args:
        source, target: id arrays (N, S), (N, T) padded with 0 at the end.
        batch_size: rows per batch.
        window: batches per sorted window.
    """

    def __init__(self, source, target, batch_size=32, window=50):
        self.source, self.target = np.asarray(source), np.asarray(target)
        if len(self.source) != len(self.target):
            raise ValueError(f"LengthBuckets: {len(self.source)} sources but {len(self.target)} targets")
        self.batch_size = _positive_int("LengthBuckets", "batch_size", batch_size)
        self.window = _positive_int("LengthBuckets", "window", window)
        self.lengths = (self.target != 0).sum(axis=1) * (self.source.shape[1] + 1) + (self.source != 0).sum(axis=1)
        self.seed_generator = random.SeedGenerator(None, "LengthBuckets")

    def __len__(self):
        return -(-len(self.source) // self.batch_size)

    def __iter__(self):
        order = self.seed_generator.permutation(len(self.source))
        span = self.batch_size * self.window
        batches = []
        for lo in range(0, len(order), span):
            chunk = order[lo:lo + span]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        for i in self.seed_generator.permutation(len(batches)):
            yield self.source[batches[i]], self.target[batches[i]]


class Transformer(Model):
    """An encoder-decoder transformer for translation: a `Model` written as a class, trained with
    compile / fit / evaluate and saved with ``save`` like `attnx.seq2seq.Seq2Seq`, whose API it shares.

    Args:
        source_vocab_size, target_vocab_size: vocabulary sizes (id 0 is padding).
        model_dim: D, the embedding and model size (divisible by num_heads).
        num_heads, intermediate_dim, dropout, activation, layer_norm_epsilon, norm_first: those of
            every encoder and decoder layer (`attnx.layers.TransformerEncoderLayer`); dropout also
            applies to the embeddings plus positions.
        num_encoder_layers, num_decoder_layers: the depths of the two stacks.
        positions: "sinusoidal" (the paper's fixed encoding) or "learned" (`PositionEmbedding`,
            one table per side of `max_positions` rows).
        max_positions: the longest source or target a learned table covers.
        shared_embeddings: one embedding table for both sides (needs equal vocabulary sizes, e.g. a
            shared subword vocabulary).
        tie_output: the output projection is the target embedding table transposed (no bias).
        start_token, end_token: target start and end ids, or tokens of `target_tokenizer`.
        max_length: the longest target (tokens after the start token, end token included) that
            training accepts and decoding produces.
        source_tokenizer, target_tokenizer: `attnx.text.SubwordTokenizer`s (or one shared) for the
            methods that take sentences.

    Bounds (a saved file sets these, and time and memory grow with them): vocabulary sizes <= 2**22,
    model_dim <= 16384, intermediate_dim <= 65536, up to 256 layers per stack, max_positions <= 8192,
    max_length (the longest decoding) <= 1024. Sources are at most `MAX_SOURCE_LENGTH` = 1024 subwords
    (CTranslate2's max_input_length): longer ids are a ValueError, longer sentences are cut to their
    first 1024 subwords by `encode_sources` (so by `translate`, `translate_batch`, `evaluate_bleu`).

    Data: ``fit(source, target)`` takes source ids (B, S) and target ids (B, T) that begin with the
    start token, 0 = padding. ``predict(source)`` returns greedy translations (see `predict_step`).
    Call: ``model([source, target_in])`` gives the teacher-forced logits (B, T, V).
    """

    MAX_SOURCE_LENGTH = 1024

    def __init__(self, source_vocab_size, target_vocab_size, model_dim=256, num_heads=4, intermediate_dim=1024,
                 num_encoder_layers=3, num_decoder_layers=3, dropout=0.1, activation="relu", norm_first=False,
                 layer_norm_epsilon=1e-5, positions="sinusoidal", max_positions=256, shared_embeddings=False,
                 tie_output=False, start_token="<start>", end_token="<end>", max_length=50, source_tokenizer=None,
                 target_tokenizer=None, dtype="float32", name=None):
        super().__init__(name=name or unique_name("transformer"), dtype=dtype)
        owner = "Transformer"
        self.source_vocab_size = _positive_int(owner, "source_vocab_size", source_vocab_size, 2 ** 22)
        self.target_vocab_size = _positive_int(owner, "target_vocab_size", target_vocab_size, 2 ** 22)
        self.model_dim = _positive_int(owner, "model_dim", model_dim, 16384)
        _positive_int(owner, "intermediate_dim", intermediate_dim, 65536)
        _positive_int(owner, "num_encoder_layers", num_encoder_layers, 256)
        _positive_int(owner, "num_decoder_layers", num_decoder_layers, 256)
        self.num_heads, _ = head_sizes(owner, num_heads, self.model_dim)
        if positions not in ("sinusoidal", "learned"):
            raise ValueError(f"Transformer: `positions` must be 'sinusoidal' or 'learned', got {positions!r}")
        self.positions = positions
        self.max_positions = _positive_int(owner, "max_positions", max_positions, 8192)
        self.max_length = _positive_int(owner, "max_length", max_length, 1024)
        if positions == "learned" and self.max_length > self.max_positions:
            raise ValueError(f"Transformer: max_length={max_length} is longer than the learned position tables "
                             f"(max_positions={max_positions})")
        self.shared_embeddings, self.tie_output = bool(shared_embeddings), bool(tie_output)
        if self.shared_embeddings and self.source_vocab_size != self.target_vocab_size:
            raise ValueError(f"Transformer: shared_embeddings needs one vocabulary size, got {source_vocab_size} "
                             f"and {target_vocab_size}")
        for side, tokenizer, size in (("source", source_tokenizer, self.source_vocab_size),
                                      ("target", target_tokenizer, self.target_vocab_size)):
            ids = None if tokenizer is None else getattr(tokenizer, "vocab_size", "no")
            if ids is not None and (not isinstance(ids, int) or ids > size):
                raise ValueError(f"Transformer: the {side} tokenizer has {ids} ids, expected a tokenizer of at most "
                                 f"{side}_vocab_size={size}")
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.start_id = self._token_id(start_token, "start_token")
        self.end_id = self._token_id(end_token, "end_token")
        self.stack_config = {"num_heads": self.num_heads, "intermediate_dim": intermediate_dim, "dropout": dropout,
                             "activation": activation, "layer_norm_epsilon": layer_norm_epsilon,
                             "norm_first": norm_first}
        dtype = self.dtype.name
        D = self.model_dim
        # Vaswani et al. scale the embeddings by sqrt(D): drawn with std D^-1/2, they enter at std 1
        init = initializers.RandomNormal(stddev=D ** -0.5)
        # fixed layer names: the weights are "source_embedding/...", "encoder/...", ... in every Transformer
        self.source_embedding = Embedding(self.source_vocab_size, D, embeddings_initializer=init, dtype=dtype,
                                          name="source_embedding")
        self.target_embedding = self.source_embedding if self.shared_embeddings else Embedding(
            self.target_vocab_size, D, embeddings_initializer=init, dtype=dtype, name="target_embedding")
        if positions == "sinusoidal":
            self.source_positions = self.target_positions = PositionalEncoding(dtype=dtype, name="positions")
        else:
            self.source_positions = PositionEmbedding(self.max_positions, dtype=dtype, name="source_positions")
            self.target_positions = PositionEmbedding(self.max_positions, dtype=dtype, name="target_positions")
        self.embedding_dropout = Dropout(dropout, dtype=dtype, name="embedding_dropout")
        self.encoder = TransformerEncoder(num_encoder_layers, **self.stack_config, dtype=dtype, name="encoder")
        self.encoder_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="encoder_norm")
        self.decoder = TransformerDecoder(num_decoder_layers, **self.stack_config, dtype=dtype, name="decoder")
        self.decoder_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="decoder_norm")
        self.output_projection = None if self.tie_output else Dense(self.target_vocab_size, dtype=dtype,
                                                                    name="output")
        self.build()

    # ------------------------------------------------------------------------ construction
    @classmethod
    def from_texts(cls, sources, targets, vocab_size=8000, shared_vocabulary=True, **kwargs):
        """Learns BPE subword vocabularies (`attnx.text.SubwordTokenizer`) of about `vocab_size`
        tokens on the texts, one shared by both sides (and then, unless told otherwise, one shared
        embedding table) or one per side, and builds a model for them. Sentences may carry the
        ``<start>`` / ``<end>`` markers of `attnx.datasets.preprocess_sentence`."""
        sources = [_strip_markers(s) for s in sources]
        targets = [_strip_markers(t) for t in targets]
        if shared_vocabulary:
            source_tok = target_tok = text.SubwordTokenizer(vocab_size).fit_on_texts(sources + targets)
            kwargs.setdefault("shared_embeddings", True)
        else:
            source_tok = text.SubwordTokenizer(vocab_size).fit_on_texts(sources)
            target_tok = text.SubwordTokenizer(vocab_size).fit_on_texts(targets)
        return cls(source_tok.vocab_size, target_tok.vocab_size, source_tokenizer=source_tok,
                   target_tokenizer=target_tok, **kwargs)

    def _token_id(self, token, arg):
        if isinstance(token, str):
            if self.target_tokenizer is None or token not in self.target_tokenizer.word_index:
                raise ValueError(f"Transformer: `{arg}` {token!r} is not an id and not a token of the target tokenizer")
            token = self.target_tokenizer.word_index[token]
        return decoding.token_id("Transformer", arg, token, self.target_vocab_size)

    def quantize_refusal(self):
        if self.tie_output:
            return "tie_output=True multiplies by the target embedding table itself, which int8 would replace"
        return None

    def build(self, input_shape=None):
        """Creates the weights (`input_shape` is not needed: no weight depends on the sequence lengths)."""
        D = self.model_dim
        sequence = (None, None, D)
        shapes = [(self.source_embedding, (None, None)), (self.target_embedding, (None, None)),
                  (self.source_positions, sequence), (self.target_positions, sequence),
                  (self.encoder, sequence), (self.encoder_norm, sequence), (self.decoder, [sequence, sequence]),
                  (self.decoder_norm, sequence)]
        if self.output_projection is not None:
            shapes.append((self.output_projection, sequence))
        for layer, shape in shapes:
            if not layer.built:
                layer.build(shape)
                layer.built = True
        self.built = True

    def get_config(self):
        """The constructor's arguments, tokenizers included (as their JSON)."""
        tokenizers = {"source_tokenizer": self.source_tokenizer, "target_tokenizer": self.target_tokenizer}
        return {"name": self.name, "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, "model_dim": self.model_dim,
                "num_encoder_layers": self.encoder.num_layers, "num_decoder_layers": self.decoder.num_layers,
                **self.stack_config, "positions": self.positions, "max_positions": self.max_positions,
                "shared_embeddings": self.shared_embeddings, "tie_output": self.tie_output,
                "start_token": self.start_id, "end_token": self.end_id, "max_length": self.max_length,
                "dtype": self.dtype.name,
                **{k: None if t is None else t.to_json() for k, t in tokenizers.items()}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        source, target = config.get("source_tokenizer"), config.get("target_tokenizer")
        read = (lambda js: None if js is None else text.tokenizer_from_json(js))
        config["source_tokenizer"] = read(source)
        # the same JSON on both sides: a shared vocabulary, read back as one tokenizer
        config["target_tokenizer"] = config["source_tokenizer"] if target == source else read(target)
        return cls(**config)

    # ------------------------------------------------------------------------ training
    def compile(self, optimizer=None, loss=None, metrics=None, loss_weights=None, distribute=None,
                label_smoothing=0.1, warmup_steps=4000):
        """As `Model.compile`, with the paper's recipe as defaults: Adam (beta_2 0.98, epsilon 1e-9)
        on `optimizers.NoamDecay` (`warmup_steps`), and the cross-entropy of each next target token
        from the logits with `label_smoothing`, padding (id 0) ignored, averaged over the real tokens."""
        if optimizer is None:
            optimizer = optimizers.Adam(optimizers.NoamDecay(self.model_dim, warmup_steps), beta_2=0.98, epsilon=1e-9)
        if loss is None:
            loss = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0,
                                                        label_smoothing=label_smoothing)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
                        distribute=distribute)

    def _embed(self, embedding, positions, ids, training):
        """``dropout(E[ids] * sqrt(D) + P)`` and its cache."""
        x, embedding_cache = embedding.apply(ids, training=training)
        x, positions_cache = positions.apply(x * x.dtype.type(math.sqrt(self.model_dim)), training=training)
        x, dropout_cache = self.embedding_dropout.apply(x, training=training)
        return x, (embedding_cache, positions_cache, dropout_cache)

    def _embed_backprop(self, embedding, positions, cache, dx):
        embedding_cache, positions_cache, dropout_cache = cache
        dx = positions.backprop(positions_cache, self.embedding_dropout.backprop(dropout_cache, dx))
        embedding.backprop(embedding_cache, dx * dx.dtype.type(math.sqrt(self.model_dim)))

    def _logits(self, h, training):
        """logits (..., V) of the decoder output h (..., D), and the cache of the projection."""
        if self.output_projection is not None:
            return self.output_projection.apply(h, training=training)
        table = self.target_embedding.params["embeddings"]
        if self.dtype_policy.name == "mixed_bfloat16":  # in bf16, as the untied projection's Dense
            logits = kernels.bf16_matmul(a=h.reshape(-1, self.model_dim), b=table, transpose_b=True)
            return logits.reshape(h.shape[:-1] + (-1,)), (h if training else None)
        return h @ table.T, (h if training else None)

    def _logits_backprop(self, cache, dlogits):
        if self.output_projection is not None:
            return self.output_projection.backprop(cache, dlogits)
        # logits = h E^T:  dE += dlogits^T h,  dh = dlogits E
        table, V = self.target_embedding.params["embeddings"], self.target_vocab_size
        if self.dtype_policy.name == "mixed_bfloat16":
            flat = dlogits.reshape(-1, V)
            kernels.bf16_matmul(a=flat, b=cache.reshape(-1, self.model_dim), transpose_a=True,
                                out=self.target_embedding.grads["embeddings"])
            return kernels.bf16_matmul(a=flat, b=table).reshape(dlogits.shape[:-1] + (self.model_dim,))
        self.target_embedding.grads["embeddings"] += dlogits.reshape(-1, V).T @ cache.reshape(-1, self.model_dim)
        return dlogits @ table

    def _encode(self, source, training=False):
        """(memory (B, S, D), source mask (B, S), caches) of checked source ids."""
        source_mask = source != 0
        x, embedding_cache = self._embed(self.source_embedding, self.source_positions, source, training)
        # the mask of checked ids needs no other check: the stacks take it as checked
        x, encoder_cache = self.encoder.forward_checked(x, source_mask, training=training)
        memory, norm_cache = self.encoder_norm.apply(x, training=training)
        return memory, source_mask, (embedding_cache, encoder_cache, norm_cache)

    def forward(self, inputs, training=False):
        """``[source (B, S), decoder_input (B, T)]`` -> (logits (B, T, V), cache)."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Model '{self.name}': inputs must be [source ids, decoder input ids]")
        source = self._source(inputs[0])
        target = self._ids(inputs[1], "decoder_input", self.target_vocab_size)
        if len(target) != len(source):
            raise ValueError(f"Transformer: {len(source)} sources but {len(target)} decoder inputs")
        memory, source_mask, source_caches = self._encode(source, training)
        y, target_embedding_cache = self._embed(self.target_embedding, self.target_positions, target, training)
        # the causal mask alone: targets are padded at the end, so a real position never sees padding
        # (the outputs at padded positions are not scored)
        h, decoder_cache = self.decoder.forward_checked(y, memory, None, source_mask, use_causal_mask=True,
                                                        training=training)
        h, decoder_norm_cache = self.decoder_norm.apply(h, training=training)
        logits, output_cache = self._logits(h, training)
        if not training:
            return logits, None
        return logits, _Cache(source_caches[0], source_caches[1], source_caches[2], target_embedding_cache,
                              decoder_cache, decoder_norm_cache, output_cache)

    def backprop(self, cache, dy, need_dx=True):
        dh = self.decoder_norm.backprop(cache.decoder_norm, self._logits_backprop(cache.output, dy))
        dy_target, dmemory = self.decoder.backprop(cache.decoder, dh)
        self._embed_backprop(self.target_embedding, self.target_positions, cache.target_embedding, dy_target)
        dx = self.encoder.backprop(cache.encoder, self.encoder_norm.backprop(cache.encoder_norm, dmemory))
        self._embed_backprop(self.source_embedding, self.source_positions, cache.source_embedding, dx)
        return [None, None]  # token ids have no gradient

    def train_data(self, x, y):
        """Teacher forcing, as `Seq2Seq.train_data`: source ids `x` (B, S) and target ids `y` (B, T)
        starting with the start token give the inputs ``[x, y[:, :-1]]`` and the targets ``y[:, 1:]``;
        the trailing columns that are padding in every row are cut first."""
        source, target = self._source(x), self._target(y)
        if len(source) != len(target):
            raise ValueError(f"Transformer: {len(source)} sources but {len(target)} targets")
        source = source[:, :np.flatnonzero((source != 0).any(axis=0))[-1] + 1]
        target = target[:, :np.flatnonzero((target != 0).any(axis=0))[-1] + 1]
        return [source, target[:, :-1]], target[:, 1:]

    def predict_step(self, x):
        """Greedy translations of source ids `x` (B, S): target ids (B, max_length), each row ending
        with the end token (unless cut at max_length) and padded with 0 after it."""
        tokens, _, _ = self.greedy_decode(x)
        return np.pad(tokens, ((0, 0), (0, self.max_length - tokens.shape[1])))

    def _ids(self, ids, arg, vocab_size):
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Transformer: `{arg}` must be integer ids, got dtype {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"Transformer: `{arg}` expected non-empty ids of shape (batch, steps), got {ids.shape}")
        if ids.min() < 0 or ids.max() >= vocab_size:
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise IndexError(f"Transformer: `{arg}` has the token id {bad}, out of range [0, {vocab_size})")
        if self.positions == "learned" and ids.shape[1] > self.max_positions:
            raise ValueError(f"Transformer: `{arg}` has {ids.shape[1]} positions, more than the learned tables' "
                             f"max_positions={self.max_positions}")
        return ids.astype(np.int64, copy=False)

    def _source(self, source, arg="source"):
        ids = self._ids(source, arg, self.source_vocab_size)
        if ids.shape[1] > self.MAX_SOURCE_LENGTH:
            raise ValueError(f"Transformer: `{arg}` has {ids.shape[1]} steps, more than MAX_SOURCE_LENGTH = "
                             f"{self.MAX_SOURCE_LENGTH}; cut the sources (encode_sources does for sentences)")
        empty = ~(ids != 0).any(axis=1)
        if empty.any():
            raise ValueError(f"Transformer: `{arg}` has an empty sentence (a row of padding only) at row "
                             f"{int(np.argmax(empty))}")
        return ids

    def _target(self, target):
        """Teacher-forcing targets: each row the start token, 1 to max_length tokens, then padding."""
        return check_target_ids(self._ids(target, "target", self.target_vocab_size), "Transformer", "target",
                                 self.start_id, self.max_length)

    # ------------------------------------------------------------------------ texts
    def _require_tokenizers(self, what):
        if self.source_tokenizer is None or self.target_tokenizer is None:
            raise RuntimeError(f"Transformer: {what} needs source_tokenizer and target_tokenizer")

    def encode_sources(self, sentences):
        """Sentences (``<start>`` / ``<end>`` markers optional) -> padded source ids (B, S)."""
        self._require_tokenizers("encode_sources")
        seqs = []
        for sentence in sentences:
            if not isinstance(sentence, str):
                raise TypeError(f"Transformer: sentences must be str, got {type(sentence).__name__}")
            ids = self.source_tokenizer.encode(_strip_markers(sentence))
            if not ids:
                raise ValueError(f"Transformer: empty sentence {sentence!r}")
            seqs.append(ids[:self.MAX_SOURCE_LENGTH])
        return text.pad_sequences(seqs, padding="post").astype(np.int64)

    def encode_targets(self, sentences):
        """Sentences -> target ids (B, T): the start token, the subwords, the end token, padding."""
        self._require_tokenizers("encode_targets")
        seqs = [[self.start_id] + self.target_tokenizer.encode(_strip_markers(s)) + [self.end_id] for s in sentences]
        return text.pad_sequences(seqs, padding="post").astype(np.int64)

    def fit_texts(self, sources, targets, validation_data=None, batch_size=32, length_buckets=True, **kwargs):
        """`fit` on sentence lists; `validation_data` is a pair of sentence lists too, the other
        arguments are `Model.fit`'s. With `length_buckets`, each batch holds pairs of similar
        lengths (`LengthBuckets`), so that little of a batch is padding. Returns the `History`."""
        val = None if validation_data is None else (self.encode_sources(validation_data[0]),
                                                    self.encode_targets(validation_data[1]))
        source, target = self.encode_sources(sources), self.encode_targets(targets)
        if length_buckets:
            return self.fit(LengthBuckets(source, target, batch_size), validation_data=val, **kwargs)
        return self.fit(source, target, batch_size=batch_size, validation_data=val, **kwargs)

    def target_text(self, tokens):
        """Target ids (without start / end tokens) -> the detokenized sentence."""
        return self.target_tokenizer.decode(tokens)

    # ------------------------------------------------------------------------ decoding
    def _decode_length(self, max_length):
        return self.max_length if max_length is None else _positive_int("Transformer", "max_length", max_length)

    def start_state(self, memory, source_mask, capacity=None):
        """The decoding state of encoder outputs memory (N, S, D) with source mask (N, S): the
        decoder stack's `DecoderCache` (cross-attention keys and values projected once, room for
        `capacity` positions, default max_length)."""
        return self.decoder.start_cache(memory, source_mask, self.max_length if capacity is None else capacity)

    def step(self, ids, position, state, return_attention=False):
        """One decoder position for N rows: the decoder stack's cached step (one C++ call for every
        layer), then the final norm and the output projection.

        Args:
            ids: (N,) the previous tokens (the start token at position 0).
            position: the target position of `ids` (the number of steps decoded before).
            state: the `DecoderCache` of ``start_state``, or of the last step (extended in place and
                returned; its ``select(rows)`` gives the state of some rows).
            return_attention: also return the last layer's cross-attention (N, heads, S).
        Returns:
            (logits (N, V), the next state, attention or None); equal to the teacher-forced
            forward's logits at `position`.
        """
        if position != state.length:
            raise ValueError(f"Transformer.step: the state holds {state.length} decoded positions, so the next "
                             f"position is {state.length}, got position={position}")
        x, _ = self.target_embedding.apply(np.asarray(ids, dtype=np.int64)[:, None])
        x = x[:, 0] * x.dtype.type(math.sqrt(self.model_dim))
        if self.positions == "sinusoidal":
            x += self.target_positions.table(position + 1, self.model_dim)[position]
        else:
            x += self.target_positions.params["embeddings"][position]
        h, state, weights = self.decoder.step(x, state, return_attention_scores=return_attention)
        h, _ = self.decoder_norm.apply(h)
        logits, _ = self._logits(h, False)
        return logits, state, weights

    def greedy_decode(self, source, max_length=None):
        """The most likely next token at every step, for source ids (B, S) (`attnx.decoding.greedy_search`);
        a row leaves the batch at its end token.

        Returns (tokens (B, L) with the end token and 0 after it, scores (B,) the summed log
        probabilities, attention (B, heads, L, S) of the last decoder layer), L <= max_length."""
        source = self._source(source)
        L = self._decode_length(max_length)
        memory, source_mask, _ = self._encode(source)
        return decoding.greedy_search(self, self.start_state(memory, source_mask), len(source), self.start_id,
                                      self.end_id, L)

    def beam_search(self, source, width=4, length_penalty=0.0, max_length=None):
        """Batched beam search (`attnx.decoding.beam_search`: a finished hypothesis stays in its beam,
        extended by padding at no cost; final scores divided by GNMT's length penalty
        ((5 + len) / 6) ** alpha); a sentence leaves the batch once all its beams have ended.

        Args:
            source: source ids (B, S).
            width: beams per sentence (1 to the target vocabulary size; 1 gives greedy decoding).
            length_penalty: alpha >= 0.
            max_length: most tokens per hypothesis (default the model's max_length).
        Returns:
            For each sentence, its `width` `Hypothesis`es, best first; their attention is the last
            decoder layer's per head, (heads, steps, S).
        """
        width = decoding.beam_width("Transformer.beam_search", width, self.target_vocab_size)
        alpha = decoding.length_penalty_alpha("Transformer.beam_search", length_penalty)
        source = self._source(source)
        L = self._decode_length(max_length)
        memory, source_mask, _ = self._encode(source)
        return decoding.beam_search(self, self.start_state(memory, source_mask), len(source), self.start_id,
                                    self.end_id, width, alpha, L)

    def translate_batch(self, sentences, width=1, length_penalty=0.0, max_length=None, batch_size=32):
        """Translates sentences (``<start>`` / ``<end>`` markers optional), `batch_size` at a time
        in order of length (CTranslate2's `translate_batch`: rows of one batch then have similar
        lengths), greedily (width 1) or by beam search.

        Returns one `Hypothesis` per sentence, in the input order, the best of its beam; its
        ``tokens`` are target ids (`target_text` detokenizes them)."""
        self._require_tokenizers("translate_batch")
        batch_size = _positive_int("Transformer.translate_batch", "batch_size", batch_size)
        alpha = decoding.length_penalty_alpha("Transformer.translate_batch", length_penalty)
        sentences = list(sentences)
        if not sentences:
            return []
        source = self.encode_sources(sentences)
        lengths = (source != 0).sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        results = [None] * len(sentences)
        for lo in range(0, len(order), batch_size):
            rows = order[lo:lo + batch_size]
            batch = source[rows][:, :lengths[rows].max()]
            if width == 1:
                tokens, scores, attention = self.greedy_decode(batch, max_length)
                for row, hyp in zip(rows, decoding.greedy_hypotheses(tokens, scores, attention, self.end_id, alpha)):
                    results[row] = hyp
            else:
                for row, hyps in zip(rows, self.beam_search(batch, width, alpha, max_length)):
                    results[row] = hyps[0]
        return results

    def translate(self, sentence, width=1, length_penalty=0.0, max_length=None):
        """Translates one sentence, as `Seq2Seq.translate`.

        Returns (the detokenized translation, attention (target tokens + 1, source tokens)): the last
        decoder layer's cross-attention averaged over the heads (`translate_batch` gives each head's),
        with rows for the target subwords and the end token and columns for the source subwords
        (``model.source_tokenizer.tokenize(sentence)``)."""
        if not isinstance(sentence, str):
            raise TypeError(f"Transformer.translate: expected a str sentence, got {type(sentence).__name__}")
        best = self.translate_batch([sentence], width, length_penalty, max_length)[0]
        return self.target_text(best.tokens), best.attention.mean(axis=0)

    def evaluate_bleu(self, sources, references, width=1, length_penalty=0.0, batch_size=64, max_length=None,
                      scorer="auto"):
        """Corpus BLEU-4 of the translations of `sources` against `references`, both as whitespace-split
        tokens of the detokenized text (markers removed): the same function on the same text as
        `Seq2Seq.evaluate_bleu` when the texts come from `attnx.datasets.preprocess_sentence`.
        `scorer` as in `metrics.bleu_score`. Returns a `metrics.BleuScore`."""
        hyps = [self.target_text(h.tokens).split()
                for h in self.translate_batch(sources, width, length_penalty, max_length, batch_size)]
        refs = [[_strip_markers(r).split()] for r in references]
        return metrics.bleu_score(refs, hyps, scorer)
