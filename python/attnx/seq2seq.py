"""Sequence-to-sequence translation with attention: encoder, fused Bahdanau and Luong decoders,
greedy decoding, batched beam search, BLEU, and `translate` with the attention matrix.

The decoders run every target step of teacher-forced training in one C++ call, forward and
backward (`cpp/include/attnx/seq2seq.hpp`); `step()` runs the same kernel for one step at
inference time. Equations (y_{t-1} the previous target word):

- Bahdanau (the TensorFlow NMT tutorial): ``a_t = softmax(v . tanh(s_{t-1} W_q + b_q + enc W_k))``,
  ``c_t = a_t . enc``, ``s_t = RNN([emb(y_{t-1}); c_t], s_{t-1})``, ``logits_t = s_t W_out + b_out``.
- Luong: ``h_t = RNN([emb(y_{t-1}); h~_{t-1}], h_{t-1})`` (input feeding), ``a_t = softmax(score(h_t,
  enc))`` with score dot ``h_t . enc_s``, general ``h_t . (enc_s W_k)`` or concat
  ``v . tanh(h_t W_q + b_q + enc_s W_k)``, ``h~_t = tanh([c_t; h_t] W_c)``, ``logits_t = h~_t W_out + b_out``;
  ``local_window=D`` restricts a_t to |s - p_t| <= D with a Gaussian around p_t: Luong's local-m
  (``local_mode="m"``, p_t = t) or local-p (``local_mode="p"``, ``p_t = L sigmoid(v_p . tanh(h_t W_p))``
  with L the source length).

Typical use::

    splits = attnx.datasets.load_anki_pairs(data_dir=..., max_words=10)
    model = Seq2Seq.from_texts(splits.train.source, splits.train.target, units=256)
    model.compile(optimizer="adam")
    model.fit_texts(splits.train.source, splits.train.target, epochs=10)
    translation, attention = model.translate("<start> i am hungry . <end>")
"""
import time
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from . import _core, initializers, losses, metrics, optimizers, text
from .layers.base import Layer
from .layers.core import Embedding
from .layers.recurrent import GRU, LSTM, Bidirectional

__all__ = ["Encoder", "BahdanauDecoder", "LuongDecoder", "DecoderState", "Hypothesis", "Seq2Seq", "load"]

_CELLS = {"gru": GRU, "lstm": LSTM}


def _check_choice(owner, arg, value, choices):
    if value not in choices:
        raise ValueError(f"{owner}: `{arg}` must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _positive_int(owner, arg, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: `{arg}` must be a positive integer, got {value!r}")
    return int(value)


def _sequence_mask(layer, mask, batch, steps, arg):
    """A (B, L) bool mask from a bool mask or (B,) lengths (None: every position real)."""
    if mask is None:
        return None
    arr = np.asarray(mask)
    if arr.dtype.kind in "iu" and arr.ndim == 1:  # lengths
        if arr.shape != (batch,):
            raise ValueError(f"Layer '{layer.name}': `{arg}` lengths expected shape ({batch},), got {arr.shape}")
        if arr.min() < 0 or arr.max() > steps:
            raise ValueError(f"Layer '{layer.name}': `{arg}` lengths must lie in [0, {steps}], got "
                             f"{arr.min()}..{arr.max()}")
        arr = np.arange(steps)[None, :] < arr[:, None]
    if arr.dtype != np.bool_:
        raise TypeError(f"Layer '{layer.name}': `{arg}` must be a bool mask (True = real token) or int lengths, "
                        f"got dtype {arr.dtype}")
    if arr.shape != (batch, steps):
        raise ValueError(f"Layer '{layer.name}': `{arg}` expected shape ({batch}, {steps}), got {arr.shape}")
    return np.ascontiguousarray(arr)


class _Composite(Layer):
    """A layer made of sublayers: its params / grads are theirs under "<sublayer>/<name>" keys
    (the same arrays, so the sublayers' kernels and the optimizer share them)."""

    def _adopt(self, prefix, layer, input_shape):
        layer.build(input_shape)
        layer.built = True
        for name, p in layer.params.items():
            self.params[f"{prefix}/{name}"] = p
            self.grads[f"{prefix}/{name}"] = layer.grads[name]
        return layer


class Encoder(_Composite):
    """Source encoder: ``Embedding(mask_zero=True)`` then a (bidirectional) GRU or LSTM over the
    source, returning every step's output for attention and the final state for the decoder.

    Args:
        vocab_size: source vocabulary size (id 0 is padding).
        embedding_dim: source embedding size.
        units: RNN units per direction.
        cell: "gru" or "lstm".
        bidirectional: run both directions; outputs and final states are concatenated
            (size 2 * units), so the decoder then has 2 * units.

    Call arguments:
        inputs: source ids (B, S), 0 = padding.

    Input shape: (batch, source_steps) ints.
    Output: ``[outputs (B, S, K), mask (B, S) bool, h (B, K)(, c (B, K))]`` with K = units or 2 * units.
    backward([d_outputs, None, dh(, dc)]) returns None (token ids have no gradient).
    """

    def __init__(self, vocab_size, embedding_dim, units, cell="gru", bidirectional=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = _positive_int("Encoder", "vocab_size", vocab_size)
        self.embedding_dim = _positive_int("Encoder", "embedding_dim", embedding_dim)
        self.units = _positive_int("Encoder", "units", units)
        self.cell = _check_choice("Encoder", "cell", cell, tuple(_CELLS))
        self.bidirectional = bool(bidirectional)
        self.output_dim = self.units * (2 if self.bidirectional else 1)
        dtype = self.dtype.name
        self.embedding = Embedding(self.vocab_size, self.embedding_dim, mask_zero=True, dtype=dtype,
                                   name=f"{self.name}_embedding")
        rnn = _CELLS[self.cell](self.units, return_sequences=True, return_state=True, dtype=dtype,
                                name=f"{self.name}_{self.cell}")
        self.rnn = Bidirectional(rnn, dtype=dtype, name=f"{self.name}_bidirectional") if self.bidirectional else rnn

    @property
    def n_states(self):
        return 2 if self.cell == "lstm" else 1

    def build(self, input_shape):
        self._adopt("embedding", self.embedding, tuple(input_shape))
        self._adopt("rnn", self.rnn, (input_shape[0], input_shape[1], self.embedding_dim))

    def call(self, inputs, training=False):
        ids = self.embedding.token_ids(inputs)
        self._check_shape(ids, "inputs", ndim=2)
        mask = ids != 0
        x = self.embedding(ids, training=training)
        outs = self.rnn(x, training=training, mask=mask)
        seq, states = outs[0], outs[1:]
        if self.bidirectional:  # [h_f(, c_f), h_b(, c_b)] -> [h_f|h_b(, c_f|c_b)]
            n = self.n_states
            states = [np.concatenate([states[i], states[n + i]], axis=-1) for i in range(n)]
        if training:
            self._cache = ids.shape
        return [seq, mask] + list(states)

    def backward(self, dy):
        B, S = self._saved()
        d_seq, _, *d_states = dy
        n = self.n_states
        if len(d_states) != n:
            raise ValueError(f"Layer '{self.name}': backward expected [d_outputs, None] + {n} state gradient(s), "
                             f"got {len(d_states)}")
        if self.bidirectional:
            H = self.units
            d_states = [None if g is None else g[..., :H] for g in d_states] + \
                       [None if g is None else g[..., H:] for g in d_states]
        dx = self.rnn.backward([d_seq] + [None if g is None else np.ascontiguousarray(g) for g in d_states])
        self.embedding.backward(dx)
        return None

    def compute_output_shape(self, input_shape):
        B, S = input_shape
        return [(B, S, self.output_dim), (B, S)] + [(B, self.output_dim)] * self.n_states

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim,
                "units": self.units, "cell": self.cell, "bidirectional": self.bidirectional}


class DecoderState(NamedTuple):
    """What a decoder carries between inference steps (all with B rows):
    h (B, H), c (B, H) for LSTM, feed (B, H) Luong's previous attentional state, keys (B, S, Dk)
    the projected encoder outputs computed at the first step, position the next target step."""

    h: np.ndarray
    c: object = None
    feed: object = None
    keys: object = None
    position: int = 0

    def select(self, rows):
        """The state of the given rows (beam search reorders hypotheses with it)."""
        arrays = [None if a is None else np.ascontiguousarray(a[rows]) for a in self[:4]]
        return DecoderState(*arrays, position=self.position)


class _AttentionDecoder(Layer):
    """Base of BahdanauDecoder and LuongDecoder (parameters, fused call, backward, step)."""

    _kind = None

    def __init__(self, vocab_size, embedding_dim, units, cell="gru", score="additive", attention_units=None,
                 local_window=None, local_mode="m", embeddings_initializer="uniform",
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", **kwargs):
        super().__init__(**kwargs)
        kind = type(self).__name__
        self.vocab_size = _positive_int(kind, "vocab_size", vocab_size)
        self.embedding_dim = _positive_int(kind, "embedding_dim", embedding_dim)
        self.units = _positive_int(kind, "units", units)
        self.cell = _check_choice(kind, "cell", cell, tuple(_CELLS))
        self.score = score
        self.attention_units = self.units if attention_units is None else _positive_int(kind, "attention_units",
                                                                                         attention_units)
        self.local_window = None if local_window is None else int(local_window)
        if self.local_window is not None and self.local_window < 0:
            raise ValueError(f"{kind}: `local_window` must be >= 0 or None, got {local_window}")
        self.local_mode = _check_choice(kind, "local_mode", local_mode, ("m", "p"))
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.recurrent_initializer = initializers.get(recurrent_initializer)
        self.attention_weights = None  # (B, T, S) of the last call, for plotting

    @property
    def n_states(self):
        return 2 if self.cell == "lstm" else 1

    @property
    def _feeds_context(self):
        return self._kind == "bahdanau"

    @property
    def _predictive(self):
        return self.local_window is not None and self.local_mode == "p"

    def build(self, input_shape):
        if not isinstance(input_shape, list) or len(input_shape) < 2 or len(input_shape[1]) != 3:
            raise ValueError(f"Layer '{self.name}': expects inputs [target_ids (B, T), encoder_outputs (B, S, K), "
                             f"h0(, c0)], got shapes {input_shape}")
        K, H, E, U, V = input_shape[1][-1], self.units, self.embedding_dim, self.attention_units, self.vocab_size
        if self.score == "dot" and K != H:
            raise ValueError(f"Layer '{self.name}': the dot score needs encoder outputs of size units={H}, got {K}")
        G = (4 if self.cell == "lstm" else 3) * H
        self.source_dim = K
        F = K if self._feeds_context else H
        self.add_weight("embeddings", (V, E), self.embeddings_initializer)
        self.add_weight("kernel", (E + F, G), self.kernel_initializer)
        self.add_weight("recurrent_kernel", (H, G), self.recurrent_initializer)
        bias = self.add_weight("bias", (2, G) if self.cell == "gru" else (G,), "zeros")
        if self.cell == "lstm":
            bias[H:2 * H] = 1.0  # Keras' unit_forget_bias
        if self.score in ("additive", "concat"):
            self.add_weight("query_kernel", (H, U), self.kernel_initializer)
            self.add_weight("query_bias", (U,), "zeros")
            self.add_weight("key_kernel", (K, U), self.kernel_initializer)
            self.add_weight("score_vector", (U,), "glorot_uniform")
        elif self.score == "general":
            self.add_weight("key_kernel", (K, H), self.kernel_initializer)
        if self._kind == "luong":
            self.add_weight("attentional_kernel", (K + H, H), self.kernel_initializer)
        if self._predictive:
            self.add_weight("position_kernel", (H, U), self.kernel_initializer)
            self.add_weight("position_vector", (U,), "glorot_uniform")
        self.add_weight("output_kernel", (H, V), self.kernel_initializer)
        self.add_weight("output_bias", (V,), "zeros")

    def _run(self, ids, enc, states, source_mask, target_mask, feed=None, keys=None, first_step=0):
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Layer '{self.name}': target ids must be integers, got dtype {ids.dtype}")
        if ids.ndim != 2:
            raise ValueError(f"Layer '{self.name}': target ids expected shape (batch, steps), got {ids.shape}")
        enc = self._float_input(enc, "encoder_outputs", ndim=3, last_dim=self.source_dim)
        B, S = enc.shape[:2]
        if ids.shape[0] != B:
            raise ValueError(f"Layer '{self.name}': target ids batch {ids.shape[0]} does not match encoder outputs "
                             f"batch {B}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise IndexError(f"Layer '{self.name}': target token id {bad} out of range [0, {self.vocab_size})")
        if len(states) != self.n_states:
            raise ValueError(f"Layer '{self.name}': expected {self.n_states} initial state(s) "
                             f"({'[h0, c0]' if self.n_states == 2 else '[h0]'}), got {len(states)}")
        states = [self._state(s, f"initial_state[{i}]", (B, self.units)) for i, s in enumerate(states)]
        smask = _sequence_mask(self, source_mask, B, S, "source_mask")
        tmask = _sequence_mask(self, target_mask, B, ids.shape[1], "mask")
        if feed is not None:
            feed = self._state(feed, "feed", (B, self.units))
        return _core.decoder_forward(
            self._kind, self.score, self.cell, np.ascontiguousarray(ids, dtype=np.int64), enc, smask, tmask,
            states[0], states[1] if self.n_states == 2 else None, feed, self.params, keys,
            -1 if self.local_window is None else self.local_window, self.local_mode, first_step), enc

    def _state(self, value, arg, shape):
        arr = np.asarray(value)
        if arr.shape != tuple(shape):
            raise ValueError(f"Layer '{self.name}': `{arg}` expected shape {tuple(shape)}, got {arr.shape}")
        return np.ascontiguousarray(arr, dtype=self.dtype)

    def call(self, inputs, training=False, mask=None, source_mask=None):
        """inputs ``[target_ids (B, T), encoder_outputs (B, S, K), h0 (B, H)(, c0 (B, H))]`` -> logits (B, T, V).
        mask: (B, T) bool target mask or lengths; source_mask: (B, S) bool or lengths."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) < 3:
            raise ValueError(f"Layer '{self.name}': inputs must be [target_ids, encoder_outputs, h0(, c0)]")
        ids, enc, *states = inputs
        (logits, _, _, _, weights, _, cache), enc = self._run(ids, enc, states, source_mask, mask)
        self.attention_weights = weights
        if training:
            self._cache = (cache, enc, logits.shape)
        return logits

    def backward(self, dy):
        cache, enc, shape = self._saved()
        dlogits = self._grad_input(dy, shape)
        denc, dh0, dc0 = _core.decoder_backward(cache, dlogits, None, None, enc, self.params, self.grads)
        return [None, denc, dh0] + ([dc0] if self.n_states == 2 else [])

    def step(self, ids, state, encoder_outputs, source_mask=None):
        """One inference step.

        Args:
            ids: (B,) the previous words.
            state: a `DecoderState` (``DecoderState(h0)`` / ``DecoderState(h0, c0)`` at the start).
            encoder_outputs: (B, S, K); source_mask (B, S) bool or lengths.
        Returns:
            (logits (B, V), the next `DecoderState`, attention weights (B, S)).
        """
        if not self.built:
            raise RuntimeError(f"Layer '{self.name}': step() needs a built decoder (call it once or build it)")
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"Layer '{self.name}': step ids expected shape (batch,), got {ids.shape}")
        states = [state.h] + ([state.c] if self.n_states == 2 else [])
        (logits, h, c, feed, weights, keys, _), _ = self._run(ids[:, None], encoder_outputs, states, source_mask,
                                                              None, state.feed, state.keys, state.position)
        return logits[:, 0], DecoderState(h, c, feed, keys, state.position + 1), weights[:, 0]

    def greedy(self, encoder_outputs, states, start_id, end_id, max_length, source_mask=None):
        """Greedy decoding in one C++ call (the step loop and argmax included).

        Args:
            encoder_outputs: (B, S, K); states: ``[h0]`` or ``[h0, c0]``; source_mask (B, S) bool or lengths.
            start_id: the first input word; end_id: the word that ends a row; max_length: most steps.
        Returns:
            (tokens (B, L) ints, 0 after a row's end token; attention (B, L, S)), L <= max_length.
        """
        if not self.built:
            raise RuntimeError(f"Layer '{self.name}': greedy() needs a built decoder (call it once or build it)")
        enc = self._float_input(encoder_outputs, "encoder_outputs", ndim=3, last_dim=self.source_dim)
        B, S = enc.shape[:2]
        if len(states) != self.n_states:
            raise ValueError(f"Layer '{self.name}': expected {self.n_states} initial state(s), got {len(states)}")
        states = [self._state(s, f"initial_state[{i}]", (B, self.units)) for i, s in enumerate(states)]
        return _core.decoder_greedy(
            self._kind, self.score, self.cell, enc, _sequence_mask(self, source_mask, B, S, "source_mask"), states[0],
            states[1] if self.n_states == 2 else None, self.params,
            -1 if self.local_window is None else self.local_window, self.local_mode, int(start_id), int(end_id),
            _positive_int(type(self).__name__, "max_length", max_length))

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], input_shape[0][1], self.vocab_size)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim,
                "units": self.units, "cell": self.cell, "score": self.score,
                "attention_units": self.attention_units, "local_window": self.local_window,
                "local_mode": self.local_mode,
                "embeddings_initializer": initializers.serialize(self.embeddings_initializer),
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "recurrent_initializer": initializers.serialize(self.recurrent_initializer)}


_DECODER_DOC = """
    Args:
        vocab_size: target vocabulary size V (id 0 is padding).
        embedding_dim: target embedding size E.
        units: decoder state size H (the encoder's final state must have this size).
        cell: "gru" (PyTorch's reset-after form) or "lstm".
        attention_units: U, the additive score's hidden size (default units).
        embeddings_initializer, kernel_initializer, recurrent_initializer: Keras' defaults.

    Weights: ``embeddings (V, E)``, ``kernel (E + F, G)`` (rows [0, E) read the embedding, the rest the
    feed), ``recurrent_kernel (H, G)``, ``bias`` as the recurrent layers store it, the score's
    ``query_kernel (H, U)``, ``query_bias (U,)``, ``key_kernel (K, U or H)``, ``score_vector (U,)``,
    ``output_kernel (H, V)``, ``output_bias (V,)``.

    Call arguments:
        inputs: ``[target_ids (B, T), encoder_outputs (B, S, K), h0 (B, H)(, c0)]``, target_ids the
            previous words (teacher forcing: the target shifted right, starting with the start token).
        mask: target mask (B, T) bool or lengths; padded steps keep the state.
        source_mask: (B, S) bool (True = real token) or lengths; fully masked rows give zero context.

    Input shape: as above. Output shape: logits (B, T, V); ``attention_weights`` (B, T, S) afterwards.
    backward(dlogits) returns ``[None, d_encoder_outputs, dh0(, dc0)]``.
"""


class BahdanauDecoder(_AttentionDecoder):
    __doc__ = """Bahdanau attention decoder as in the TensorFlow NMT tutorial: additive scores from the
    previous state s_{t-1}, ``[emb(y_{t-1}); c_t]`` into the RNN, logits from s_t. Feed F = K.
    """ + _DECODER_DOC
    _kind = "bahdanau"

    def __init__(self, vocab_size, embedding_dim, units, cell="gru", attention_units=None, **kwargs):
        kwargs.pop("score", None)
        kwargs.pop("local_window", None)
        kwargs.pop("local_mode", None)
        super().__init__(vocab_size, embedding_dim, units, cell=cell, score="additive",
                         attention_units=attention_units, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.pop("local_window")
        config.pop("local_mode")
        config.pop("score")
        return config


class LuongDecoder(_AttentionDecoder):
    __doc__ = """Luong attention decoder: scores from the current state h_t ("dot", "general" or
    "concat"), attentional state ``h~_t = tanh([c_t; h_t] W_c)`` (``attentional_kernel (K + H, H)``)
    fed to the next step (input feeding, F = H), logits from h~_t.

        score: "dot" (needs K == H), "general" or "concat".
        local_window: D for local attention (only |s - p_t| <= D, times a Gaussian of sigma D / 2);
            None for global attention.
        local_mode: "m" (local-m: p_t = t) or "p" (local-p: ``p_t = L sigmoid(v_p . tanh(h_t W_p))``,
            L the row's source length, with weights ``position_kernel (H, U)`` and ``position_vector (U,)``).
    """ + _DECODER_DOC
    _kind = "luong"

    def __init__(self, vocab_size, embedding_dim, units, score="general", cell="gru", **kwargs):
        _check_choice("LuongDecoder", "score", score, ("dot", "general", "concat"))
        super().__init__(vocab_size, embedding_dim, units, cell=cell, score=score, **kwargs)


class Hypothesis(NamedTuple):
    """One beam-search result: token ids (without the end token), the total log probability
    divided by the length penalty, and the attention weights (len(tokens) + 1 steps, S)."""

    tokens: list
    score: float
    attention: np.ndarray


def _log_softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _length_penalty(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha (1 for alpha = 0)."""
    return ((5.0 + length) / 6.0) ** alpha


class Seq2Seq:
    """An encoder-decoder translation model with attention, trained with Keras-like compile/fit.

    Args:
        source_vocab_size, target_vocab_size: vocabulary sizes (id 0 is padding).
        embedding_dim: embedding size of both sides.
        units: decoder state size; the encoder has `units` (or `units // 2` per direction when
            bidirectional, so that its concatenated final state starts the decoder).
        attention: "bahdanau" or "luong".
        score: Luong's "dot", "general" (default) or "concat"; Bahdanau is additive.
        cell: "gru" or "lstm" (both sides).
        bidirectional: bidirectional encoder.
        attention_units: additive score size (default units).
        local_window: Luong local attention window half-width (None: global).
        local_mode: "m" (local-m, p_t = t) or "p" (local-p, p_t predicted from h_t).
        start_token, end_token: target start and end ids, or words looked up in `target_tokenizer`.
        max_length: longest target (tokens after the start token, end token included) that
            training accepts and decoding produces.
        source_tokenizer, target_tokenizer: `attnx.text.Tokenizer`s for `translate` / `fit_texts`.
    """

    def __init__(self, source_vocab_size, target_vocab_size, embedding_dim=256, units=512, attention="bahdanau",
                 score=None, cell="gru", bidirectional=False, attention_units=None, local_window=None, local_mode="m",
                 start_token="<start>", end_token="<end>", max_length=50, source_tokenizer=None,
                 target_tokenizer=None, dtype="float32"):
        _check_choice("Seq2Seq", "attention", attention, ("bahdanau", "luong"))
        self.attention = attention
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.start_id = self._token_id(start_token, "start_token")
        self.end_id = self._token_id(end_token, "end_token")
        self.max_length = _positive_int("Seq2Seq", "max_length", max_length)
        units = _positive_int("Seq2Seq", "units", units)
        if bidirectional and units % 2:
            raise ValueError(f"Seq2Seq: a bidirectional encoder needs even units, got {units}")
        self.encoder = Encoder(source_vocab_size, embedding_dim, units // 2 if bidirectional else units, cell=cell,
                               bidirectional=bidirectional, dtype=dtype)
        if attention == "bahdanau":
            if score not in (None, "additive"):
                raise ValueError(f"Seq2Seq: the Bahdanau decoder scores additively, got score={score!r}")
            self.decoder = BahdanauDecoder(target_vocab_size, embedding_dim, units, cell=cell,
                                           attention_units=attention_units, dtype=dtype)
        else:
            self.decoder = LuongDecoder(target_vocab_size, embedding_dim, units, score=score or "general", cell=cell,
                                        attention_units=attention_units, local_window=local_window,
                                        local_mode=local_mode, dtype=dtype)
        self.optimizer = None
        self.loss = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0)
        self.history = {}

    @classmethod
    def from_texts(cls, sources, targets, num_words=None, oov_token=None, **kwargs):
        """Fits word-level tokenizers (``filters=''``: punctuation was split off by
        `attnx.datasets.preprocess_sentence`) on the texts and builds a model for them.
        With `oov_token` (e.g. "<unk>"), unknown words map to it instead of raising."""
        src_tok = text.Tokenizer(num_words=num_words, filters="", oov_token=oov_token)
        tgt_tok = text.Tokenizer(num_words=num_words, filters="", oov_token=oov_token)
        src_tok.fit_on_texts(list(sources))
        tgt_tok.fit_on_texts(list(targets))
        size = (lambda tok: min(num_words or 2 ** 62, len(tok.word_index) + 1))
        return cls(size(src_tok), size(tgt_tok), source_tokenizer=src_tok, target_tokenizer=tgt_tok, **kwargs)

    def _token_id(self, token, arg):
        if isinstance(token, (int, np.integer)):
            return int(token)
        if self.target_tokenizer is None or token not in self.target_tokenizer.word_index:
            raise ValueError(f"Seq2Seq: `{arg}` {token!r} is not an id and not a word of the target tokenizer")
        return self.target_tokenizer.word_index[token]

    # ------------------------------------------------------------------------ weights
    def build(self, source_steps=2):
        if not self.encoder.built:
            self.encoder.build((None, source_steps))
            self.encoder.built = True
        if not self.decoder.built:
            self.decoder.build([(None, 1), (None, source_steps, self.encoder.output_dim)]
                               + [(None, self.decoder.units)] * self.decoder.n_states)
            self.decoder.built = True

    @property
    def params(self):
        """Every parameter, named "encoder/..." and "decoder/..."."""
        self.build()
        return OrderedDict([(f"encoder/{k}", v) for k, v in self.encoder.params.items()]
                           + [(f"decoder/{k}", v) for k, v in self.decoder.params.items()])

    def count_params(self):
        return int(sum(p.size for p in self.params.values()))

    @property
    def built(self):
        return self.encoder.built and self.decoder.built

    @property
    def compiled(self):
        return self.optimizer is not None

    @property
    def _compile_config(self):
        return {"loss": losses.serialize(self.loss)}

    def get_config(self):
        """Everything `from_config` needs to rebuild the model, tokenizers included (as their JSON)."""
        dec = self.decoder
        return {"source_vocab_size": self.encoder.vocab_size, "target_vocab_size": dec.vocab_size,
                "embedding_dim": self.encoder.embedding_dim, "units": dec.units, "attention": self.attention,
                "score": None if self.attention == "bahdanau" else dec.score, "cell": dec.cell,
                "bidirectional": self.encoder.bidirectional, "attention_units": dec.attention_units,
                "local_window": dec.local_window, "local_mode": dec.local_mode, "start_token": self.start_id,
                "end_token": self.end_id, "max_length": self.max_length, "dtype": dec.dtype.name,
                "source_tokenizer": None if self.source_tokenizer is None else self.source_tokenizer.to_json(),
                "target_tokenizer": None if self.target_tokenizer is None else self.target_tokenizer.to_json()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("source_tokenizer", "target_tokenizer"):
            if config.get(key) is not None:
                config[key] = text.tokenizer_from_json(config[key])
        return cls(**config)

    def save(self, path):
        """Saves config, tokenizers, weights, optimizer and its state to `path` (the `.attnx` zip
        format of `attnx.saving`, written atomically); `attnx.seq2seq.load` reads it back."""
        from . import saving
        self.build()
        saving.save_model(self, path)

    def get_weights(self):
        return [p.copy() for p in self.params.values()]

    def set_weights(self, weights):
        params = list(self.params.values())
        if len(weights) != len(params):
            raise ValueError(f"Seq2Seq: set_weights expected {len(params)} arrays, got {len(weights)}")
        for p, w in zip(params, weights):
            if np.shape(w) != p.shape:
                raise ValueError(f"Seq2Seq: set_weights expected shape {p.shape}, got {np.shape(w)}")
            np.copyto(p, w, casting="same_kind")

    # ------------------------------------------------------------------------ training
    def compile(self, optimizer="adam", loss=None):
        """optimizer: an `attnx.optimizers` instance or name; loss: default masked sparse
        cross-entropy from logits that ignores the padding id 0."""
        self.optimizer = optimizers.get(optimizer)
        if loss is not None:
            self.loss = losses.get(loss)
        return self

    def _source(self, source, arg="source"):
        ids = np.asarray(source)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Seq2Seq: `{arg}` must be integer ids, got dtype {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"Seq2Seq: `{arg}` expected non-empty ids of shape (batch, steps), got {ids.shape}")
        if not (ids != 0).any(axis=1).all():
            raise ValueError(f"Seq2Seq: `{arg}` has an empty sentence (a row of padding only) at row "
                             f"{int(np.argmin((ids != 0).any(axis=1)))}")
        return ids

    def _target(self, target):
        ids = np.asarray(target)
        if ids.dtype.kind not in "iu" or ids.ndim != 2:
            raise ValueError(f"Seq2Seq: `target` expected integer ids of shape (batch, steps), got "
                             f"{ids.dtype} {ids.shape}")
        lengths = (ids != 0).sum(axis=1) - 1  # tokens after the start token
        if ids.shape[1] < 2 or lengths.min() < 1:
            raise ValueError("Seq2Seq: every target needs the start token and at least one more token")
        if lengths.max() > self.max_length:
            raise ValueError(f"Seq2Seq: a target has {lengths.max()} tokens after the start token, longer than "
                             f"max_length={self.max_length}")
        if not (ids[:, 0] == self.start_id).all():
            raise ValueError(f"Seq2Seq: targets must begin with the start token id {self.start_id}")
        return ids

    def _encode(self, source, training):
        enc, smask, *states = self.encoder(source, training=training)
        return enc, smask, states

    def train_on_batch(self, source, target):
        """One optimizer step on a batch of source ids (B, S) and target ids (B, T) that begin with
        the start token; returns the loss."""
        if self.optimizer is None:
            raise RuntimeError("Seq2Seq: call compile() before training")
        source, target = self._source(source), self._target(target)
        self.build(source.shape[1])
        dec_in, dec_out = target[:, :-1], target[:, 1:]
        enc, smask, states = self._encode(source, True)
        logits = self.decoder([dec_in, enc] + states, training=True, mask=dec_in != 0, source_mask=smask)
        loss, dlogits = self.loss.compute(dec_out, logits)
        self.encoder.zero_grad()
        self.decoder.zero_grad()
        _, denc, *dstates = self.decoder.backward(dlogits)
        self.encoder.backward([denc, None] + dstates)
        self.optimizer.apply([(p, g) for layer in (self.encoder, self.decoder) for _, p, g in layer.trainable_params])
        return float(loss)

    def evaluate(self, source, target, batch_size=64):
        """Mean masked cross-entropy of teacher-forced predictions."""
        source, target = self._source(source), self._target(target)
        total, count = 0.0, 0
        for lo in range(0, len(source), batch_size):
            s, t = source[lo:lo + batch_size], target[lo:lo + batch_size]
            enc, smask, states = self._encode(s, False)
            logits = self.decoder([t[:, :-1], enc] + states, mask=t[:, :-1] != 0, source_mask=smask)
            n = int((t[:, 1:] != 0).sum())
            total += float(self.loss(t[:, 1:], logits)) * n
            count += n
        return total / max(count, 1)

    def fit(self, source, target, batch_size=64, epochs=1, validation_data=None, shuffle=True, verbose=1,
            time_limit=None, seed=0):
        """Trains on id arrays; `time_limit` (seconds) stops after the batch that crosses it.
        Returns the history dict {"loss": [...], "val_loss": [...]} (per epoch)."""
        source, target = self._source(source), self._target(target)
        if len(source) != len(target):
            raise ValueError(f"Seq2Seq: {len(source)} sources but {len(target)} targets")
        rng = np.random.default_rng(seed)
        start = time.perf_counter()
        for epoch in range(epochs):
            order = rng.permutation(len(source)) if shuffle else np.arange(len(source))
            losses_seen = []
            for lo in range(0, len(order), batch_size):
                rows = order[lo:lo + batch_size]
                s, t = source[rows], target[rows]
                # trim padding columns shared by the whole batch
                s = s[:, :max(1, int((s != 0).sum(axis=1).max()))]
                t = t[:, :int((t != 0).sum(axis=1).max())]
                losses_seen.append(self.train_on_batch(s, t))
                if time_limit is not None and time.perf_counter() - start > time_limit:
                    break
            self.history.setdefault("loss", []).append(float(np.mean(losses_seen)))
            line = f"epoch {epoch + 1}/{epochs} loss {self.history['loss'][-1]:.4f}"
            if validation_data is not None:
                self.history.setdefault("val_loss", []).append(self.evaluate(*validation_data, batch_size))
                line += f" val_loss {self.history['val_loss'][-1]:.4f}"
            if verbose:
                print(line + f" ({time.perf_counter() - start:.0f} s)", flush=True)
            if time_limit is not None and time.perf_counter() - start > time_limit:
                break
        return self.history

    # ------------------------------------------------------------------------ texts
    def _require_tokenizers(self, what):
        if self.source_tokenizer is None or self.target_tokenizer is None:
            raise RuntimeError(f"Seq2Seq: {what} needs source_tokenizer and target_tokenizer")

    def encode_sources(self, sentences, max_length=None):
        """Preprocessed sentences -> padded id array; raises on empty sentences and unknown words
        (unless the tokenizer has an oov_token)."""
        self._require_tokenizers("encode_sources")
        tok = self.source_tokenizer
        seqs = []
        for sentence in sentences:
            words = text.text_to_word_sequence(sentence, tok.filters, tok.lower, tok.split)
            if not words or words == ["<start>", "<end>"]:
                raise ValueError(f"Seq2Seq: empty sentence {sentence!r}")
            unknown = [w for w in words if w not in tok.word_index or (tok.num_words and
                                                                        tok.word_index[w] >= tok.num_words)]
            if unknown and tok.oov_token is None:
                raise ValueError(f"Seq2Seq: unknown source word(s) {unknown} in {sentence!r} (not in the source "
                                 "vocabulary; give the tokenizer an oov_token to map them)")
            seqs.append(tok.texts_to_sequences([words])[0])
        return text.pad_sequences(seqs, maxlen=max_length, padding="post").astype(np.int64)

    def encode_targets(self, sentences):
        self._require_tokenizers("encode_targets")
        seqs = self.target_tokenizer.texts_to_sequences(list(sentences))
        return text.pad_sequences(seqs, padding="post").astype(np.int64)

    def fit_texts(self, sources, targets, validation_data=None, **kwargs):
        """`fit` on preprocessed sentence lists (see `attnx.datasets.load_anki_pairs`)."""
        val = None if validation_data is None else (self.encode_sources(validation_data[0]),
                                                    self.encode_targets(validation_data[1]))
        return self.fit(self.encode_sources(sources), self.encode_targets(targets), validation_data=val, **kwargs)

    def target_words(self, tokens):
        """Target ids -> words (ids outside the vocabulary give "<unk>")."""
        index_word = self.target_tokenizer.index_word
        return [index_word.get(int(t), "<unk>") for t in tokens]

    # ------------------------------------------------------------------------ decoding
    def _decode_length(self, max_length):
        return self.max_length if max_length is None else _positive_int("Seq2Seq", "max_length", max_length)

    def greedy_decode(self, source, max_length=None):
        """Most likely next word at every step, for a batch of source ids (B, S).

        Returns (tokens (B, L) ints with the end token and 0 after it, attention (B, L, S))."""
        source = self._source(source)
        self.build(source.shape[1])
        L = self._decode_length(max_length)
        enc, smask, states = self._encode(source, False)
        return self.decoder.greedy(enc, states, self.start_id, self.end_id, L, smask)

    def beam_search(self, source, width=4, length_penalty=0.0, max_length=None, end_token=None):
        """Batched beam search: the B sentences' `width` hypotheses run as B * width rows.

        Args:
            source: source ids (B, S).
            width: beams per sentence (>= 1; 1 gives greedy decoding).
            length_penalty: alpha of GNMT's ((5 + len) / 6) ** alpha dividing the final scores.
            max_length: most tokens per hypothesis (default the model's max_length).
            end_token: id that ends a hypothesis (default the model's end token).
        Returns:
            For each sentence, its `width` `Hypothesis`es, best first.
        """
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
            raise ValueError(f"Seq2Seq.beam_search: `width` must be a positive integer, got {width!r}")
        if length_penalty < 0:
            raise ValueError(f"Seq2Seq.beam_search: `length_penalty` must be >= 0, got {length_penalty}")
        source = self._source(source)
        self.build(source.shape[1])
        L = self._decode_length(max_length)
        end = self.end_id if end_token is None else int(end_token)
        B, S, W = len(source), source.shape[1], int(width)
        enc, smask, states = self._encode(source, False)
        rows = np.repeat(np.arange(B), W)
        enc, smask = np.ascontiguousarray(enc[rows]), smask[rows]
        state = DecoderState(*states).select(rows)
        scores = np.full((B, W), -np.inf)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        tokens = np.zeros((B, W, L), dtype=np.int64)
        attention = np.zeros((B, W, L, S), dtype=enc.dtype)
        lengths = np.zeros((B, W), dtype=np.int64)
        done = np.zeros((B, W), dtype=bool)
        prev = np.full(B * W, self.start_id, dtype=np.int64)
        for t in range(L):
            logits, state, weights = self.decoder.step(prev, state, enc, smask)
            logp = _log_softmax(logits.astype(np.float64)).reshape(B, W, -1)
            V = logp.shape[-1]
            # a finished hypothesis extends only with padding, at no cost
            logp[done] = -np.inf
            logp[done, 0] = 0.0
            total = (scores[:, :, None] + logp).reshape(B, W * V)
            best = np.argsort(-total, axis=1, kind="stable")[:, :W]
            beam, word = best // V, best % V
            scores = np.take_along_axis(total, best, axis=1)
            pick = (np.arange(B)[:, None] * W + beam).reshape(-1)
            state = state.select(pick)
            tokens = tokens.reshape(B * W, L)[pick].reshape(B, W, L)
            attention = attention.reshape(B * W, L, S)[pick].reshape(B, W, L, S)
            was_done = done.reshape(-1)[pick].reshape(B, W)
            lengths = lengths.reshape(-1)[pick].reshape(B, W) + ~was_done
            tokens[:, :, t] = np.where(was_done, 0, word)
            attention[:, :, t] = np.where(was_done[..., None], 0, weights.reshape(B * W, S)[pick].reshape(B, W, S))
            done = was_done | (word == end)
            prev = tokens[:, :, t].reshape(-1)
            if done.all():
                break
        results = []
        for b in range(B):
            hyps = []
            for w in range(W):
                n = int(lengths[b, w])
                seq = tokens[b, w, :n].tolist()
                if seq and seq[-1] == end:
                    seq = seq[:-1]
                hyps.append(Hypothesis(seq, float(scores[b, w]) / _length_penalty(n, length_penalty),
                                       attention[b, w, :n].copy()))
            hyps.sort(key=lambda h: -h.score)
            results.append(hyps)
        return results

    def translate(self, sentence, width=1, length_penalty=0.0, max_length=None):
        """Translates one preprocessed sentence (``<start> ... <end>``, see
        `attnx.datasets.preprocess_sentence`).

        Returns (translation str without start/end tokens, attention (target words + 1, source tokens));
        `source_tokens` / `target_tokens` for `attnx.plot.attention_heatmap` are
        ``sentence.split()`` and ``translation.split() + ['<end>']``."""
        self._require_tokenizers("translate")
        if not isinstance(sentence, str):
            raise TypeError(f"Seq2Seq.translate: expected a str sentence, got {type(sentence).__name__}")
        source = self.encode_sources([sentence])
        if width == 1:
            tokens, attention = self.greedy_decode(source, max_length)
            seq = tokens[0].tolist()
            n = seq.index(self.end_id) + 1 if self.end_id in seq else len(seq)
            words, weights = seq[:n], attention[0, :n]
            if words and words[-1] == self.end_id:
                words = words[:-1]
        else:
            best = self.beam_search(source, width, length_penalty, max_length)[0][0]
            words, weights = best.tokens, best.attention
        return " ".join(self.target_words(words)), weights

    def evaluate_bleu(self, sources, references, width=1, length_penalty=0.0, batch_size=64, max_length=None):
        """Corpus BLEU-4 of the translations of preprocessed `sources` against preprocessed
        `references` (start/end tokens are not scored)."""
        self._require_tokenizers("evaluate_bleu")
        hyps = []
        for lo in range(0, len(sources), batch_size):
            src = self.encode_sources(sources[lo:lo + batch_size])
            if width == 1:
                tokens, _ = self.greedy_decode(src, max_length)
                for row in tokens.tolist():
                    row = row[:row.index(self.end_id)] if self.end_id in row else row
                    hyps.append(self.target_words([t for t in row if t]))
            else:
                beams = self.beam_search(src, width, length_penalty, max_length)
                hyps += [self.target_words(h[0].tokens) for h in beams]
        refs = [[[w for w in r.split() if w not in ("<start>", "<end>")]] for r in references]
        return metrics.corpus_bleu(refs, hyps)


def load(path):
    """A `Seq2Seq` saved with `Seq2Seq.save` (weights, tokenizers, optimizer state); raises
    ValueError for a corrupted or truncated file or one that holds another kind of model."""
    from . import saving
    model = saving.load_model(path)
    if not isinstance(model, Seq2Seq):
        raise ValueError(f"{path}: holds a {type(model).__name__}, not a Seq2Seq model")
    return model
