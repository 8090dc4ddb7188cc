"""Image captioning with visual attention: Show, Attend and Tell (Xu et al. 2015).

An encoder (any attnx layer or model) turns an image into L annotation vectors of size D, one per
region (a CNN's last feature map reshaped to (L, D)); the decoder is seq2seq's fused Bahdanau
decoder with an LSTM cell (`attnx.seq2seq.BahdanauDecoder`) attending over the regions while it
writes the caption. The paper's pieces:

- initial state from the mean annotation: ``h0 = tanh(mean_i(a_i) W_h + b_h)``, ``c0`` likewise
  (the Dense layers ``init_h``, ``init_c``);
- the gating scalar ``beta_t = sigmoid(f_beta(h_{t-1}))`` multiplying the context (``gated``);
- the doubly stochastic regularization ``lambda sum_i (1 - sum_t alpha_ti)^2`` (the loss
  `DoublyStochasticRegularization` on the attention weights, the model's second output; its
  gradient flows into the weights through the fused kernel);
- soft attention (the expected context) or hard attention (one region drawn per step, the score
  trained by REINFORCE with a moving-average baseline, the reward being the caption's log
  likelihood).

`ImageCaptioner` is a `Model` written as a class, like `Seq2Seq`: ``fit(images, tokens)`` trains
with teacher forcing through `Model.fit` (callbacks, validation, history), ``save`` /
``attnx.load_model`` store it, and greedy or beam captioning return the attention over the regions
for every word. Typical use, with `attnx.datasets.load_digit_captions`::

    data = attnx.datasets.load_digit_captions(6000, canvas=(16, 48), seed=0)
    model = ImageCaptioner(encoder, image_shape=(16, 48, 1), vocabulary=data.vocabulary)
    model.compile(optimizer="adam")
    model.fit(data.images, data.tokens, epochs=10, batch_size=64)
    [(words, attention)] = model.caption(data.images[:1])   # attention (len(words), L)
"""
from typing import NamedTuple

import numpy as np

from . import losses, ops
from .backend import unique_name
from .layers.base import Layer
from .layers.core import Dense
from .models import Model
from .models.graph import _layer_entry, _layer_from_entry
from . import decoding
from .decoding import check_target_ids, positive_int as _positive_int, without_trailing_padding as _without_trailing_padding
from .seq2seq import BahdanauDecoder

__all__ = ["DoublyStochasticRegularization", "ImageCaptioner"]


class DoublyStochasticRegularization(losses.Loss):
    """Show, Attend and Tell's doubly stochastic regularization of the attention weights: per caption
    ``strength * sum_i (1 - sum_t alpha_ti)^2`` over the regions i and the real steps t (target id
    != 0), averaged over the captions. It pushes every region to receive, over the whole caption,
    about as much attention as any other.

    ``compute(y_true, y_pred)``: y_true the target ids (B, T) (0 = padding step), y_pred the weights
    (B, T, L).
    """

    def __init__(self, strength=1.0, name=None):
        super().__init__(name=name)
        strength = float(strength)
        if not np.isfinite(strength) or strength < 0:
            raise ValueError(f"DoublyStochasticRegularization: `strength` must be a finite number >= 0, got {strength}")
        self.strength = strength

    def call(self, y_true, y_pred):
        weights = ops.untraced(y_pred)
        if weights.ndim != 3 or np.shape(y_true) != weights.shape[:2]:
            raise ValueError(f"{self.name}: expected weights (B, T, L) and target ids (B, T), got {weights.shape} and "
                             f"{np.shape(y_true)}")
        real = (np.asarray(y_true) != 0).astype(weights.dtype)[:, :, None]
        coverage = ops.sum(y_pred * real, axis=1)  # sum_t alpha_ti, (B, L)
        return ops.sum(ops.square(1.0 - coverage), axis=-1) * self.strength

    def get_config(self):
        return {**super().get_config(), "strength": self.strength}


class _CaptionerCache(NamedTuple):
    encoder: object
    init_h: object
    init_c: object
    decoder: object


class ImageCaptioner(Model):
    """Show, Attend and Tell: an attention LSTM decoder over the regions of an image encoder.

    Args:
        encoder: an attnx layer or model mapping images (B, *image_shape) to annotations (B, L, D).
        image_shape: the shape of one image, e.g. (H, W, C).
        vocab_size: caption vocabulary size V (id 0 is padding); default len(vocabulary).
        embedding_dim: word embedding size.
        units: LSTM state size H.
        attention_units: the additive score's hidden size (default units).
        attention: "soft" or "hard".
        gated: multiply the context by the gating scalar beta_t.
        attention_regularization: lambda of the doubly stochastic regularization (0: none).
        baseline_decay: decay of hard attention's moving-average reward baseline.
        soft_fraction: the share of hard attention's training batches that use the expected context
            (the paper's 0.5; 0: always a drawn region).
        start_token, end_token: ids (or words of `vocabulary`) that begin and end a caption.
        max_length: longest caption (tokens after the start token, end token included), at most
            `MAX_LENGTH` = 1024: a saved file sets it, and decoding runs that many steps.
        vocabulary: token id -> word, for `caption` (e.g. `DigitCaptions.vocabulary`).
        seed: seed of hard attention's samples (default: attnx's stream, `attnx.random`).

    Data: ``fit(images, tokens)`` with tokens (B, T) beginning with the start token, 0 = padding;
    `train_data` makes the teacher-forced inputs ``[images, tokens[:, :-1], tokens[:, 1:]]`` (the
    last, the targets, is hard attention's reward) and targets ``[tokens[:, 1:], tokens[:, 1:]]``
    for the two outputs, the logits (B, T, V) and the attention weights (B, T, L).
    ``predict(images)`` returns ``[tokens (N, max_length), attention (N, max_length, L)]``, greedy.

    Layers: ``encoder``, ``init_h`` and ``init_c`` (Dense, tanh, from the mean annotation) and
    ``decoder`` (a `BahdanauDecoder` with an LSTM cell).
    """

    _multi_output = True
    output_names = ("caption", "attention")
    MAX_LENGTH = decoding.MAX_DECODING_LENGTH  # the longest caption, in training and decoding

    def __init__(self, encoder, image_shape, vocab_size=None, embedding_dim=64, units=128, attention_units=None,
                 attention="soft", gated=True, attention_regularization=1.0, baseline_decay=0.9, soft_fraction=0.5,
                 start_token=1, end_token=2, max_length=20, vocabulary=None, seed=None, dtype="float32", name=None):
        super().__init__(name=name or unique_name("image_captioner"), dtype=dtype)
        if not isinstance(encoder, Layer):
            raise TypeError(f"ImageCaptioner: `encoder` must be an attnx layer or model, got {type(encoder).__name__}")
        if attention not in ("soft", "hard"):
            raise ValueError(f"ImageCaptioner: `attention` must be 'soft' or 'hard', got {attention!r}")
        self.attention = attention
        try:
            self.image_shape = tuple(_positive_int("ImageCaptioner", "image_shape", d) for d in image_shape)
        except TypeError:
            raise TypeError(f"ImageCaptioner: `image_shape` must be a tuple of sizes, got {image_shape!r}") from None
        self.vocabulary = None if vocabulary is None else tuple(str(w) for w in vocabulary)
        if vocab_size is None:
            if self.vocabulary is None:
                raise ValueError("ImageCaptioner: give `vocab_size` or `vocabulary`")
            vocab_size = len(self.vocabulary)
        vocab_size = _positive_int("ImageCaptioner", "vocab_size", vocab_size)
        self.start_id = self._token_id(start_token, "start_token", vocab_size)
        self.end_id = self._token_id(end_token, "end_token", vocab_size)
        self.max_length = _positive_int("ImageCaptioner", "max_length", max_length, self.MAX_LENGTH)
        self.attention_regularization = float(attention_regularization)
        if not np.isfinite(self.attention_regularization) or self.attention_regularization < 0:
            raise ValueError(f"ImageCaptioner: `attention_regularization` must be a finite number >= 0, got "
                             f"{attention_regularization!r}")
        self.encoder = encoder
        if not encoder.built:
            encoder.build((None,) + self.image_shape)
            encoder.built = True
        shape = encoder.compute_output_shape((None,) + self.image_shape)
        if not isinstance(shape, tuple) or len(shape) != 3 or shape[-1] is None:
            raise ValueError(f"ImageCaptioner: the encoder must map images {self.image_shape} to annotations "
                             f"(batch, regions, features), it gives {shape}")
        self.regions, self.annotation_dim = shape[1], int(shape[2])
        units = _positive_int("ImageCaptioner", "units", units)
        self.init_h = Dense(units, activation="tanh", dtype=dtype, name="init_h")
        self.init_c = Dense(units, activation="tanh", dtype=dtype, name="init_c")
        self.decoder = BahdanauDecoder(vocab_size, embedding_dim, units, cell="lstm", attention_units=attention_units,
                                       gated=gated, hard=attention == "hard", baseline_decay=baseline_decay,
                                       soft_fraction=soft_fraction, seed=seed, dtype=dtype, name="decoder")
        self.build()

    def _token_id(self, token, arg, vocab_size):
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool):
            if self.vocabulary is None or token not in self.vocabulary:
                raise ValueError(f"ImageCaptioner: `{arg}` {token!r} is not an id and not a word of the vocabulary")
            token = self.vocabulary.index(token)
        return decoding.token_id("ImageCaptioner", arg, token, vocab_size)

    def build(self, input_shape=None):
        """Creates the weights (they depend on the encoder's annotation size only)."""
        D, H = self.annotation_dim, self.decoder.units
        for layer, shape in ((self.init_h, (None, D)), (self.init_c, (None, D)),
                             (self.decoder, [(None, None), (None, None, D), (None, H), (None, H)])):
            if not layer.built:
                layer.build(shape)
                layer.built = True
        self.built = True

    def get_config(self):
        dec = self.decoder
        return {"name": self.name, "encoder": _layer_entry(self.encoder), "image_shape": list(self.image_shape),
                "vocab_size": dec.vocab_size, "embedding_dim": dec.embedding_dim, "units": dec.units,
                "attention_units": dec.attention_units, "attention": self.attention, "gated": dec.gated,
                "attention_regularization": self.attention_regularization, "baseline_decay": dec.baseline_decay,
                "soft_fraction": dec.soft_fraction, "seed": dec.seed,
                "start_token": self.start_id, "end_token": self.end_id, "max_length": self.max_length,
                "vocabulary": None if self.vocabulary is None else list(self.vocabulary), "dtype": dec.dtype.name}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = _layer_from_entry(config["encoder"])
        return cls(**config)

    # ------------------------------------------------------------------------ training
    def compile(self, optimizer="adam", loss=None, metrics=None, loss_weights=None, distribute=None):
        """As `Model.compile`, with the captioner's defaults: Adam; the cross-entropy of each next
        word from the logits (padding ignored, averaged over the real words) and the doubly
        stochastic regularization of the weights with lambda = `attention_regularization`."""
        if loss is None:
            loss = [losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0),
                    DoublyStochasticRegularization(self.attention_regularization)]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
                        distribute=distribute)

    def _annotations(self, images, training):
        """(annotations (B, L, D), h0, c0, caches) of images, checked."""
        images = np.asarray(images)
        if images.shape[1:] != self.image_shape:
            raise ValueError(f"ImageCaptioner: images expected shape (batch,) + {self.image_shape}, got {images.shape}")
        annotations, encoder_cache = self.encoder.apply(images, training=training)
        annotations = np.asarray(annotations)
        if annotations.ndim != 3 or annotations.shape[2] != self.annotation_dim:
            raise ValueError(f"ImageCaptioner: the encoder must give annotations (batch, regions, "
                             f"{self.annotation_dim}), it gave {annotations.shape}")
        mean = annotations.mean(axis=1)
        h0, h_cache = self.init_h.apply(mean, training=training)
        c0, c_cache = self.init_c.apply(mean, training=training)
        return annotations, [h0, c0], (encoder_cache, h_cache, c_cache)

    def forward(self, inputs, training=False):
        """``[images, decoder_input (B, T)(, targets (B, T))]`` -> ([logits (B, T, V), weights (B, T, L)], cache).
        Hard attention's training call needs the targets: its reward is their log likelihood."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) not in (2, 3):
            raise ValueError(f"Model '{self.name}': inputs must be [images, decoder input ids(, target ids)]")
        images, decoder_input, *targets = inputs
        annotations, states, (encoder_cache, h_cache, c_cache) = self._annotations(images, training)
        ids = np.asarray(decoder_input)
        (logits, weights), decoder_cache = self.decoder.apply(
            [ids, annotations] + states, training=training, mask=ids != 0, return_attention_scores=True)
        if training and self.attention == "hard":
            if not targets:
                raise ValueError(f"Model '{self.name}': hard attention's training call needs the target ids as a "
                                 "third input (its reward is their log likelihood)")
            rewards = _log_likelihood(logits, np.asarray(targets[0]))
            if not np.isfinite(rewards).all():
                raise ValueError(f"ImageCaptioner: hard attention's reward (the captions' log likelihood) is NaN or "
                                 f"infinite for {np.count_nonzero(~np.isfinite(rewards))} of {len(rewards)} "
                                 "captions: the images or the weights hold non-finite values")
            self.decoder.set_reward(rewards, decoder_cache)
        cache = _CaptionerCache(encoder_cache, h_cache, c_cache, decoder_cache) if training else None
        return [logits, weights], cache

    def backprop(self, cache, dy, need_dx=True):
        dlogits, dweights = dy
        _, dannotations, dh0, dc0 = self.decoder.backprop(cache.decoder, [dlogits, dweights])
        dmean = self.init_h.backprop(cache.init_h, dh0) + self.init_c.backprop(cache.init_c, dc0)
        # mean over the L regions: each receives dmean / L
        dannotations += (dmean / dannotations.shape[1])[:, None, :]
        self.encoder.run_backprop(cache.encoder, dannotations, need_dx=False)  # images need no gradient
        return [None, None, None]

    def train_data(self, x, y):
        """Teacher forcing: images `x` and token ids `y` (B, T) starting with the start token give the
        inputs ``[x, y[:, :-1], y[:, 1:]]`` and the targets ``[y[:, 1:], y[:, 1:]]`` (the next words,
        and the real steps the regularization sums over). Columns that are padding in every row are
        cut first."""
        tokens = _without_trailing_padding(self._tokens(y))
        if len(tokens) != len(x):
            raise ValueError(f"ImageCaptioner: {len(x)} images but {len(tokens)} captions")
        return [x, tokens[:, :-1], tokens[:, 1:]], [tokens[:, 1:], tokens[:, 1:]]

    def _tokens(self, tokens):
        return check_target_ids(tokens, "ImageCaptioner", "caption", self.start_id, self.max_length)

    def predict_step(self, x):
        """Greedy captions of images `x`: [tokens (B, max_length) with the end token and 0 after it,
        attention (B, max_length, L), 0 after the end token]."""
        tokens, attention = self.greedy_caption(x)
        pad = self.max_length - tokens.shape[1]
        return [np.pad(tokens, ((0, 0), (0, pad))), np.pad(attention, ((0, 0), (0, pad), (0, 0)))]

    # ------------------------------------------------------------------------ captioning
    def _decode_length(self, max_length):
        return self.max_length if max_length is None else _positive_int("ImageCaptioner", "max_length", max_length,
                                                                        self.MAX_LENGTH)

    def greedy_caption(self, images, max_length=None):
        """The most likely next word at every step, in one C++ call; `max_length` (default the model's)
        at most `MAX_LENGTH` = 1024.

        Returns (tokens (B, n) ints with the end token and 0 after it, attention (B, n, L)), n <= max_length."""
        L = self._decode_length(max_length)
        annotations, states, _ = self._annotations(images, False)
        return self.decoder.greedy(annotations, states, self.start_id, self.end_id, L)

    def beam_caption(self, images, width=3, length_penalty=0.0, max_length=None):
        """Batched beam search (`attnx.decoding.beam_search` over the decoder's step): for each image
        its `width` `Hypothesis`es, best first, each with the attention over the regions
        (len(tokens) + 1 steps, L). Bounds: `width` in [1, vocab_size], `max_length` (default the
        model's) <= `MAX_LENGTH` = 1024."""
        owner = "ImageCaptioner.beam_caption"
        width = decoding.beam_width(owner, width, self.decoder.vocab_size)
        alpha = decoding.length_penalty_alpha(owner, length_penalty)
        L = self._decode_length(max_length)
        annotations, states, _ = self._annotations(images, False)
        return decoding.beam_search(self.decoder, self.decoder.start_state(annotations, states), len(annotations),
                                    self.start_id, self.end_id, width, alpha, L)

    def caption(self, images, width=1, length_penalty=0.0, max_length=None):
        """Captions of images (B, *image_shape): for each, (words, attention (len(words), L)) with one
        row of attention over the regions per word (the end token's step left out); words are the
        vocabulary's (ids when the model has none). width > 1 uses beam search. Bounds: `width` in
        [1, vocab_size], `max_length` (default the model's) <= `MAX_LENGTH` = 1024."""
        if width == 1:
            tokens, attention = self.greedy_caption(images, max_length)
            found = []
            for row, weights in zip(tokens.tolist(), attention):
                seq, _ = decoding.until_end(row, self.end_id)
                found.append((seq, weights[:len(seq)]))
        else:
            found = [(best.tokens, best.attention[:len(best.tokens)])
                     for best, *_ in self.beam_caption(images, width, length_penalty, max_length)]
        words = (lambda ids: ids) if self.vocabulary is None else (
            lambda ids: [self.vocabulary[i] if 0 <= i < len(self.vocabulary) else "<unk>" for i in ids])
        return [(words(ids), weights) for ids, weights in found]


def _log_likelihood(logits, targets):
    """Per caption, sum_t log softmax(logits_t)[y_t] over the real steps (y_t != 0): (B,) float64."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_probs, targets[..., None].astype(np.int64), axis=-1)[..., 0]
    return (picked * (targets != 0)).sum(axis=1)
