"""Sequence-to-sequence translation with attention: encoder, fused Bahdanau and Luong decoders,
greedy decoding (fused in one C++ call), beam search (`attnx.decoding` over the decoders' step),
BLEU, and `translate` with the attention matrix.

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

The encoder and the decoders follow the layer contract (`attnx.layers.base`): a training call's
state lives in the cache its `forward` returns (the decoder kernel's buffers are a fresh dict per
call), so a shared encoder or decoder gets the sum of its calls' gradients. `Seq2Seq` is a model
written as a class: it trains through `Model.fit` (callbacks, validation, history,
``check_numerics``) and saves and loads like any model.

Typical use::

    splits = attnx.datasets.load_anki_pairs(data_dir=..., max_words=10)
    model = Seq2Seq.from_texts(splits.train.source, splits.train.target, units=256)
    model.compile(optimizer="adam")
    model.fit_texts(splits.train.source, splits.train.target, epochs=10)
    translation, attention = model.translate("<start> i am hungry . <end>")
    model.save("mar.attnx")  # attnx.load_model("mar.attnx") reads it back
"""
from typing import NamedTuple

import numpy as np

from . import backend, initializers, kernels, losses, random, text
from .backend import unique_name
from .layers.base import Layer
from .layers.core import Embedding
from .layers import scores
from .layers.recurrent import GRU, LSTM, Bidirectional
from . import decoding
from .decoding import Hypothesis, check_target_ids, positive_int as _positive_int
from .decoding import without_trailing_padding as _without_trailing_padding
from .masking import as_mask
from .models import Model
from . import translation
from .translation import Transformer  # the transformer translation model, with Seq2Seq's API

__all__ = ["Encoder", "BahdanauDecoder", "LuongDecoder", "DecoderState", "Hypothesis", "Seq2Seq", "Transformer"]

_CELLS = {"gru": GRU, "lstm": LSTM}


def _check_choice(owner, arg, value, choices):
    if value not in choices:
        raise ValueError(f"{owner}: `{arg}` must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


class _EncoderCache(NamedTuple):
    embedding: object  # the caches of the sublayers' calls, for their backprop
    rnn: object


class Encoder(Layer):
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
    Weights: the embedding's and the RNN's, named ``embedding/...`` and ``rnn/...`` (the sublayers'
    own arrays). ``backprop(cache, [d_outputs, None, dh(, dc)])`` returns None (token ids have no
    gradient).
    """

    def __init__(self, vocab_size, embedding_dim, units, cell="gru", bidirectional=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = _positive_int("Encoder", "vocab_size", vocab_size)
        self.embedding_dim = _positive_int("Encoder", "embedding_dim", embedding_dim)
        self.units = _positive_int("Encoder", "units", units)
        self.cell = _check_choice("Encoder", "cell", cell, tuple(_CELLS))
        self.bidirectional = bool(bidirectional)
        self.output_dim = self.units * (2 if self.bidirectional else 1)
        dtype = self.dtype_policy.name  # the policy (mixed_bfloat16 too), not only the weights' dtype
        self.embedding = Embedding(self.vocab_size, self.embedding_dim, mask_zero=True, dtype=dtype,
                                   name=f"{self.name}_embedding")
        rnn = _CELLS[self.cell](self.units, return_sequences=True, return_state=True, dtype=dtype,
                                name=f"{self.name}_{self.cell}")
        self.rnn = Bidirectional(rnn, dtype=dtype, name=f"{self.name}_bidirectional") if self.bidirectional else rnn

    @property
    def n_states(self):
        return 2 if self.cell == "lstm" else 1

    def build(self, input_shape):
        for prefix, layer, shape in (("embedding", self.embedding, tuple(input_shape)),
                                     ("rnn", self.rnn, (input_shape[0], input_shape[1], self.embedding_dim))):
            layer.build(shape)
            layer.built = True
            for name, p in layer.params.items():  # the same arrays: optimizers and set_weights reach the sublayer
                self.params[f"{prefix}/{name}"] = p
                self.grads[f"{prefix}/{name}"] = layer.grads[name]

    def forward(self, inputs, training=False):
        ids = self.embedding.token_ids(inputs)
        self._check_shape(ids, "inputs", ndim=2)
        mask = ids != 0
        x, embedding_cache = self.embedding.apply(ids, training=training)
        outputs, rnn_cache = self.rnn.apply(x, training=training, mask=mask)
        sequence, states = outputs[0], outputs[1:]
        if self.bidirectional:  # [h_f(, c_f), h_b(, c_b)] -> [h_f|h_b(, c_f|c_b)]
            n = self.n_states
            states = [np.concatenate([states[i], states[n + i]], axis=-1) for i in range(n)]
        cache = _EncoderCache(embedding_cache, rnn_cache) if training else None
        return [sequence, mask] + list(states), cache

    def backprop(self, cache, dy, need_dx=True):
        d_sequence, _, *d_states = dy
        if len(d_states) != self.n_states:
            raise ValueError(f"Layer '{self.name}': backprop expected [d_outputs, None] + {self.n_states} state "
                             f"gradient(s), got {len(d_states)}")
        if self.bidirectional:  # the concatenated states' gradients back to each direction's
            H = self.units
            d_states = [None if g is None else g[..., :H] for g in d_states] + \
                       [None if g is None else g[..., H:] for g in d_states]
        dx = self.rnn.backprop(cache.rnn, [d_sequence] + d_states)  # the RNN makes its inputs contiguous
        self.embedding.backprop(cache.embedding, dx)
        return None

    def compute_output_shape(self, input_shape):
        B, S = input_shape
        return [(B, S, self.output_dim), (B, S)] + [(B, self.output_dim)] * self.n_states

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim,
                "units": self.units, "cell": self.cell, "bidirectional": self.bidirectional}


class DecoderState(NamedTuple):
    """What a decoder carries between inference steps for N rows (`start_state` makes the first one):
    the encoder outputs it attends over (N, S, K) and their mask (N, S) bool (None: all real), as
    checked once by `start_state`; h (N, H), c (N, H) for LSTM, feed (N, H) Luong's previous
    attentional state, keys (N, S, Dk) the projected encoder outputs, computed at the first step;
    source_rows (N,) the row of the start state each row decodes."""

    encoder_outputs: np.ndarray
    source_mask: object
    h: np.ndarray
    c: object = None
    feed: object = None
    keys: object = None
    source_rows: object = None

    def select(self, rows):
        """The state of the given rows (an index or bool array), in that order (the searches of
        `attnx.decoding` reorder hypotheses and drop finished rows with it)."""
        pick = (lambda a: None if a is None else np.ascontiguousarray(a[rows]))
        source_rows = self.source_rows[rows]
        if np.array_equal(source_rows, self.source_rows):
            # rows reordered among rows of the same source (a beam search step): what depends on the
            # source alone (encoder outputs, mask, keys) is already in place, row for row
            return self._replace(h=pick(self.h), c=pick(self.c), feed=pick(self.feed))
        return DecoderState(*(pick(a) for a in self[:-1]), source_rows)


class _DecoderCache(NamedTuple):
    kernel: dict  # decoder_forward's buffers, read by decoder_backward
    encoder_outputs: np.ndarray  # as the kernel read them (the backward pass reads them again)
    logits_shape: tuple
    returned_weights: bool  # the call returned [logits, attention weights]
    reinforce: object = None  # hard attention: {"weights", "target_mask", "baseline"} and, once set, "reward"


class _AttentionDecoder(Layer):
    """Base of BahdanauDecoder and LuongDecoder (parameters, fused forward and backprop, step, greedy)."""

    _kind = None
    offered_scores = None  # the scores of `attnx.layers.scores` the class offers
    # attnx.mixed_precision: the teacher-forced products over all steps (seq2seq.hpp's sequence_dense_*); the
    # per-step products and the decoding steps stay float32
    _bf16_products = True

    def __init__(self, vocab_size, embedding_dim, units, cell="gru", score="additive", attention_units=None,
                 local_window=None, local_mode="m", gated=False, hard=False, baseline_decay=0.9, soft_fraction=0.5,
                 embeddings_initializer="uniform", kernel_initializer="glorot_uniform",
                 recurrent_initializer="orthogonal", seed=None, **kwargs):
        super().__init__(**kwargs)
        kind = type(self).__name__
        self.seed_generator = random.SeedGenerator(seed, kind)  # hard attention's samples
        self.seed = self.seed_generator.seed
        self.gated, self.hard = bool(gated), bool(hard)
        if (self.gated or self.hard) and self._kind != "bahdanau":
            raise ValueError(f"{kind}: `gated` and `hard` are options of the Bahdanau decoder (Show, Attend and Tell)")
        if not 0.0 <= float(baseline_decay) < 1.0:
            raise ValueError(f"{kind}: `baseline_decay` must be in [0, 1), got {baseline_decay}")
        self.baseline_decay = float(baseline_decay)
        if not 0.0 <= float(soft_fraction) <= 1.0:
            raise ValueError(f"{kind}: `soft_fraction` must be in [0, 1], got {soft_fraction}")
        self.soft_fraction = float(soft_fraction)
        self.baseline = None  # hard attention: the moving average of the rewards (learned state, as HardAttention's)
        self.vocab_size = _positive_int(kind, "vocab_size", vocab_size)
        self.embedding_dim = _positive_int(kind, "embedding_dim", embedding_dim)
        self.units = _positive_int(kind, "units", units)
        self.cell = _check_choice(kind, "cell", cell, tuple(_CELLS))
        self.score = scores.get(score, kind, self.offered_scores).name
        self.attention_units = self.units if attention_units is None else _positive_int(kind, "attention_units",
                                                                                         attention_units)
        self.local_window = None if local_window is None else int(local_window)
        if self.local_window is not None and self.local_window < 0:
            raise ValueError(f"{kind}: `local_window` must be >= 0 or None, got {local_window}")
        self.local_mode = _check_choice(kind, "local_mode", local_mode, ("m", "p"))
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.recurrent_initializer = initializers.get(recurrent_initializer)

    @property
    def n_states(self):
        return 2 if self.cell == "lstm" else 1

    @property
    def _feeds_context(self):
        return self._kind == "bahdanau"

    @property
    def _predictive(self):
        return self.local_window is not None and self.local_mode == "p"

    @property
    def score_function(self):
        """The decoder's score: its object in the registry of `attnx.layers.scores`."""
        return scores.SCORES[self.score]

    @property
    def _variant(self):
        """The kernels' arguments that choose the decoder variant (the score as the kernel's ScoreKind)."""
        return {"kind": self._kind, "score": self.score_function.decoder_kind, "cell": self.cell,
                "local_window": -1 if self.local_window is None else self.local_window, "local_mode": self.local_mode,
                "gated": self.gated, "hard": self.hard}

    def build(self, input_shape):
        if not isinstance(input_shape, list) or len(input_shape) < 2 or len(input_shape[1]) != 3:
            raise ValueError(f"Layer '{self.name}': expects inputs [target_ids (B, T), encoder_outputs (B, S, K), "
                             f"h0(, c0)], got shapes {input_shape}")
        K, H, E, U, V = input_shape[1][-1], self.units, self.embedding_dim, self.attention_units, self.vocab_size
        score_kind = self.score_function.decoder_kind
        if score_kind == "dot" and K != H:
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
        if score_kind == "additive":  # Bahdanau's additive, Luong's concat
            self.add_weight("query_kernel", (H, U), self.kernel_initializer)
            self.add_weight("query_bias", (U,), "zeros")
            self.add_weight("key_kernel", (K, U), self.kernel_initializer)
            self.add_weight("score_vector", (U,), "glorot_uniform")
        elif score_kind == "general":
            self.add_weight("key_kernel", (K, H), self.kernel_initializer)
        if self._kind == "luong":
            self.add_weight("attentional_kernel", (K + H, H), self.kernel_initializer)
        if self._predictive:
            self.add_weight("position_kernel", (H, U), self.kernel_initializer)
            self.add_weight("position_vector", (U,), "glorot_uniform")
        if self.gated:
            self.add_weight("gate_kernel", (H,), "glorot_uniform")
            self.add_weight("gate_bias", (1,), "zeros")
        self.add_weight("output_kernel", (H, V), self.kernel_initializer)
        self.add_weight("output_bias", (V,), "zeros")

    # ------------------------------------------------------------------------ input checks
    def _encoder_outputs(self, value):
        return self._float_input(value, "encoder_outputs", ndim=3, last_dim=self.source_dim)

    def _initial_states(self, states, batch):
        """[h0] or [h0, c0] checked and as the kernels read them."""
        if len(states) != self.n_states:
            raise ValueError(f"Layer '{self.name}': expected {self.n_states} initial state(s) "
                             f"({'[h0, c0]' if self.n_states == 2 else '[h0]'}), got {len(states)}")
        return [self._state(s, f"initial_state[{i}]", (batch, self.units)) for i, s in enumerate(states)]

    def _state(self, value, arg, shape):
        # _float_input refuses object, str, datetime and complex states as LSTM does (None would become
        # NaN, a complex state would lose its imaginary part)
        arr = self._float_input(value, arg)
        if arr.shape != tuple(shape):
            raise ValueError(f"Layer '{self.name}': `{arg}` expected shape {tuple(shape)}, got {arr.shape}")
        return arr

    def _mask(self, mask, batch, steps, arg):
        return as_mask(mask, batch, steps, f"Layer '{self.name}': `{arg}`")

    def _run(self, ids, encoder_outputs, states, source_mask, target_mask, feed=None, keys=None, first_step=0,
             sample=False, soft=False):
        """Checks the inputs and runs the fused kernel over the steps of `ids` (B, T); returns its
        (logits, h, c, feed, weights, keys, cache) and the encoder outputs as it read them.
        `sample`: hard attention draws its regions (else it takes the most likely ones);
        `soft`: this call attends softly even if the layer's attention is hard."""
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Layer '{self.name}': target ids must be integers, got dtype {ids.dtype}")
        if ids.ndim != 2:
            raise ValueError(f"Layer '{self.name}': target ids expected shape (batch, steps), got {ids.shape}")
        enc = self._encoder_outputs(encoder_outputs)
        B, S = enc.shape[:2]
        if ids.shape[0] != B:
            raise ValueError(f"Layer '{self.name}': target ids batch {ids.shape[0]} does not match encoder outputs "
                             f"batch {B}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise IndexError(f"Layer '{self.name}': target token id {bad} out of range [0, {self.vocab_size})")
        states = self._initial_states(states, B)
        outputs = kernels.decoder_forward(
            **{**self._variant, "hard": self.hard and not soft}, ids=np.require(ids, np.int64, "CA"), enc=enc,
            source_mask=self._mask(source_mask, B, S, "source_mask"),
            target_mask=self._mask(target_mask, B, ids.shape[1], "mask"),
            h0=states[0], c0=states[1] if self.n_states == 2 else None,
            feed0=None if feed is None else self._state(feed, "feed", (B, self.units)),
            params=self.params, keys=keys, first_step=first_step,
            uniforms=self.seed_generator.uniform(ids.shape, enc.dtype) if sample else None,
            bf16=self.compute_dtype == "bfloat16")
        return outputs, enc

    # ------------------------------------------------------------------------ training
    def forward(self, inputs, training=False, mask=None, source_mask=None, return_attention_scores=False):
        """inputs ``[target_ids (B, T), encoder_outputs (B, S, K), h0 (B, H)(, c0 (B, H))]`` -> logits (B, T, V),
        or ``[logits, attention weights (B, T, S)]`` with `return_attention_scores`.
        mask: the target mask (B, T) or lengths; source_mask: (B, S) or lengths (`attnx.masking`)."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) < 3:
            raise ValueError(f"Layer '{self.name}': inputs must be [target_ids, encoder_outputs, h0(, c0)]")
        ids, encoder_outputs, *states = inputs
        # Xu et al.'s variance reduction: a share of hard attention's training calls use the expected context
        soft = backend.training_randomness(training) and self.hard and self.soft_fraction > 0 and \
            self.seed_generator.uniform((), np.float64, per_row=False) < self.soft_fraction
        sample = backend.training_randomness(training) and self.hard and not soft
        (logits, _, _, _, weights, _, kernel_cache), enc = self._run(ids, encoder_outputs, states, source_mask,
                                                                     mask, sample=sample, soft=soft)
        cache = None
        if training:
            reinforce = None
            if sample:
                target_mask = as_mask(mask, *weights.shape[:2], f"Layer '{self.name}': `mask`")
                reinforce = {"weights": weights, "baseline": self.baseline,
                             "target_mask": np.ones(weights.shape[:2], bool) if target_mask is None else target_mask}
            cache = _DecoderCache(kernel_cache, enc, logits.shape, bool(return_attention_scores), reinforce)
        return ([logits, weights] if return_attention_scores else logits), cache

    def set_reward(self, rewards, cache):
        """Hard attention: the rewards (B,) of the regions sampled by the training call that returned
        `cache` (higher is better; Show, Attend and Tell's is the log likelihood of the caption), set
        before that call's backprop, as `HardAttention.set_reward`. Ignored for a call that used the
        expected context (`soft_fraction`)."""
        if cache is None or not self.hard:
            raise RuntimeError(f"Layer '{self.name}': set_reward() needs the cache of a training call with hard=True")
        if cache.reinforce is None:
            return
        r = np.asarray(rewards, dtype=np.float64)
        B = cache.reinforce["weights"].shape[0]
        if r.shape != (B,) or not np.isfinite(r).all():
            raise ValueError(f"Layer '{self.name}': rewards expected finite values of shape ({B},), got {r.shape}")
        cache.reinforce["reward"] = r

    def _reinforce_gradient(self, cache):
        """REINFORCE with a moving-average baseline b for the sampled regions s_t, as a gradient of
        the attention weights a (the kernel takes it through the softmax):
            loss_r = -(1 / N) sum_b (R_b - b) sum_t log a_t[s_t],   d loss_r / d a_t[s_t] = -(R_b - b) / (N a_t[s_t])
        N being the real target steps of the batch (the loss is a mean over them). Updates b."""
        ac = cache.reinforce
        if "reward" not in ac:
            raise RuntimeError(f"Layer '{self.name}': call set_reward(rewards, cache) before this call's backprop "
                               "(REINFORCE needs the reward of the sampled regions)")
        weights, reward, real = ac["weights"], ac["reward"], ac["target_mask"]
        positions = cache.kernel["positions"].T  # (B, T); -1 where a row had nothing to attend to
        mean_reward = float(reward.mean())
        baseline = mean_reward if ac["baseline"] is None else ac["baseline"]
        chosen = real & (positions >= 0)
        b, t = np.nonzero(chosen)
        s = positions[b, t]
        dweights = np.zeros_like(weights)
        # a sampled region has a weight > 0; the floor keeps a float32 underflow finite
        dweights[b, t, s] = -(reward[b] - baseline) / (max(int(real.sum()), 1) * np.maximum(weights[b, t, s], 1e-30))
        running = mean_reward if self.baseline is None else self.baseline
        self.baseline = self.baseline_decay * running + (1.0 - self.baseline_decay) * mean_reward
        return dweights

    def backprop(self, cache, dy, need_dx=True):
        """dy: dlogits, or ``[dlogits, d_weights]`` after `return_attention_scores` (d_weights None or the
        gradient of the attention weights (B, T, S), e.g. of a regularization of them) -> ``[None,
        d_encoder_outputs, dh0(, dc0)]``. Hard attention adds REINFORCE's gradient of the weights
        (`set_reward`). The kernel has no switch to skip the input gradients, so it computes them
        whatever `need_dx` says."""
        d_weights = None
        if cache.returned_weights:
            dy, d_weights = dy
            if d_weights is not None:
                d_weights = self._grad_input(d_weights, cache.logits_shape[:2] + cache.encoder_outputs.shape[1:2],
                                             "d_weights")
        if cache.reinforce is not None:
            reinforce = self._reinforce_gradient(cache)
            d_weights = reinforce if d_weights is None else d_weights + reinforce
        dlogits = self._grad_input(dy, cache.logits_shape)
        d_encoder_outputs, dh0, dc0 = kernels.decoder_backward(cache=cache.kernel, dlogits=dlogits, dweights=d_weights,
                                                             enc=cache.encoder_outputs, params=self.params,
                                                             grads=self.grads)
        return [None, d_encoder_outputs, dh0] + ([dc0] if self.n_states == 2 else [])

    # ------------------------------------------------------------------------ inference
    def _require_built(self, method):
        if not self.built:
            raise RuntimeError(f"Layer '{self.name}': {method}() needs a built decoder (call it once or build it)")

    def start_state(self, encoder_outputs, states, source_mask=None):
        """The decoding state before the first step (checked here, once per decoding).

        Args:
            encoder_outputs: (B, S, K); states: ``[h0]`` or ``[h0, c0]``; source_mask: (B, S) or lengths.
        Returns:
            a `DecoderState` for `step`.
        """
        self._require_built("start_state")
        enc = self._encoder_outputs(encoder_outputs)
        B, S = enc.shape[:2]
        states = self._initial_states(states, B)
        return DecoderState(enc, self._mask(source_mask, B, S, "source_mask"), states[0],
                            states[1] if self.n_states == 2 else None, source_rows=np.arange(B))

    def step(self, ids, position, state, return_attention=False):
        """One inference step for N rows: the step protocol of `attnx.decoding`.

        Args:
            ids: (N,) the previous words (the start token at position 0).
            position: the target position of `ids` (local-m attention reads it).
            state: a `DecoderState` (``start_state`` at position 0).
            return_attention: also return the attention weights (N, S).
        Returns:
            (logits (N, V), the next `DecoderState`, attention weights or None); equal to the
            teacher-forced forward's logits at `position`.
        """
        ids = np.require(ids, np.int64, "CA")
        if ids.ndim != 1:
            raise ValueError(f"Layer '{self.name}': step ids expected shape (batch,), got {ids.shape}")
        logits, h, c, feed, weights, keys, _ = kernels.decoder_forward(
            **self._variant, ids=ids[:, None], enc=state.encoder_outputs,
            source_mask=state.source_mask, h0=state.h, c0=state.c, feed0=state.feed, params=self.params,
            keys=state.keys, first_step=int(position))
        next_state = state._replace(h=h, c=c, feed=feed, keys=keys)
        return logits[:, 0], next_state, (weights[:, 0] if return_attention else None)

    def compiled_step(self, state, max_length):
        """What `attnx.decoding`'s search needs to run this decoder's `step` in C++ from the start
        state `state`: `kernels.search_attention_decoder` and its arguments (the variant, weights,
        encoder outputs, mask and initial states); None for a state that has stepped."""
        if state.feed is not None or state.keys is not None:
            return None
        return kernels.search_attention_decoder, {
            **self._variant, "enc": state.encoder_outputs, "source_mask": state.source_mask, "h0": state.h,
            "c0": state.c, "params": self.params}

    def greedy(self, encoder_outputs, states, start_id, end_id, max_length, source_mask=None):
        """Greedy decoding in one C++ call (search.hpp's search over the compiled step, as
        `attnx.decoding.greedy_search`, whose words it gives; without its scores).

        Args:
            encoder_outputs: (B, S, K); states: ``[h0]`` or ``[h0, c0]``; source_mask (B, S) or lengths.
            start_id: the first input word; end_id: the word that ends a row; max_length: most steps.
        Returns:
            (tokens (B, L) ints, 0 after a row's end token; attention (B, L, S)), L <= max_length.
        """
        state = self.start_state(encoder_outputs, states, source_mask)
        max_length = _positive_int(type(self).__name__, "max_length", max_length)
        compiled = self.compiled_step(state, max_length)
        if compiled is None:  # searched over the Python step (the step protocol's fallback)
            tokens, _, attention = decoding.greedy_search(self, state, len(state.h), start_id, end_id, max_length)
            return tokens, attention
        # the scores are not returned: the search needs of each step's logits only the argmax exact
        # (exact_scores=False: one row's output layer screened in int8, seq2seq.hpp's OutputScreen)
        kernel, arguments = compiled
        tokens, _, _, _, attention = kernel(**arguments, start_id=int(start_id), end_id=int(end_id), width=1,
                                            length_penalty=0.0, max_length=max_length, return_attention=True,
                                            exact_scores=False)
        return tokens[:, 0], attention[:, 0]

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        (B, T), S = input_shape[0], input_shape[1][1]
        logits = (B, T, self.vocab_size)
        return [logits, (B, T, S)] if return_attention_scores else logits

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim,
                "units": self.units, "cell": self.cell, "score": self.score,
                "attention_units": self.attention_units, "local_window": self.local_window,
                "local_mode": self.local_mode, "gated": self.gated, "hard": self.hard,
                "baseline_decay": self.baseline_decay, "soft_fraction": self.soft_fraction, "seed": self.seed,
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
        mask: target mask (B, T) or lengths (the mask rule of `attnx.masking`); padded steps keep
            the state.
        source_mask: (B, S) mask (True = real token) or lengths; fully masked rows give zero context.
        return_attention_scores: also return the attention weights (B, T, S); backprop then takes
            ``[dlogits, d_weights]`` (d_weights None, or a gradient of the weights, e.g. of a
            regularization of them).

    Input shape: as above. Output shape: logits (B, T, V), or ``[logits, weights (B, T, S)]``.
    ``backprop(cache, dlogits)`` returns ``[None, d_encoder_outputs, dh0(, dc0)]``.
"""


class BahdanauDecoder(_AttentionDecoder):
    __doc__ = """Bahdanau attention decoder as in the TensorFlow NMT tutorial: additive scores from the
    previous state s_{t-1}, ``[emb(y_{t-1}); c_t]`` into the RNN, logits from s_t. Feed F = K.

    With an LSTM cell it is Show, Attend and Tell's decoder (Xu et al. 2015) over image regions
    (`attnx.vision.ImageCaptioner`), with its two options:

        gated: the feed is ``beta_t c_t``, ``beta_t = sigmoid(s_{t-1} . gate_kernel + gate_bias)``
            (weights ``gate_kernel (H,)``, ``gate_bias (1,)``).
        hard: the context is the encoder output at one position per step, drawn from a_t in a
            training call (the score learns by REINFORCE: call ``set_reward(rewards, cache)``
            before that call's backprop, as `HardAttention`), the most likely one otherwise.
        baseline_decay: decay of hard attention's moving-average reward baseline.
        soft_fraction: the probability that a training call of hard attention uses the expected
            context instead (Xu et al. use 0.5 to reduce the variance of REINFORCE).
    """ + _DECODER_DOC
    _kind = "bahdanau"
    offered_scores = ("additive",)

    def __init__(self, vocab_size, embedding_dim, units, cell="gru", attention_units=None, score="additive", **kwargs):
        kwargs.pop("local_window", None)
        kwargs.pop("local_mode", None)
        super().__init__(vocab_size, embedding_dim, units, cell=cell, score=score, attention_units=attention_units,
                         **kwargs)

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
    offered_scores = ("dot", "general", "concat")

    def __init__(self, vocab_size, embedding_dim, units, score="general", cell="gru", **kwargs):
        super().__init__(vocab_size, embedding_dim, units, cell=cell, score=score, **kwargs)


class _Seq2SeqCache(NamedTuple):
    encoder: object
    decoder: object


class Seq2Seq(Model):
    """An encoder-decoder translation model with attention: a `Model` written as a class, trained
    with Keras' compile / fit / evaluate (callbacks, validation data, history, ``check_numerics``),
    saved with ``save`` and read back with ``attnx.load_model``.

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
            training accepts and decoding produces, <= 1024 (`decoding.MAX_DECODING_LENGTH`).
        source_tokenizer, target_tokenizer: `attnx.text.Tokenizer`s (preprocessed text) or
            `attnx.text.SubwordTokenizer`s (raw text) for `translate` / `fit_texts`.
        dtype: the policy of the encoder and decoder (`attnx.mixed_precision`), default the global
            policy; under ``mixed_bfloat16`` the decoder's products over all target steps and the
            encoder's recurrent layer multiply bf16 operands, and decoding runs float32 products.

    Data: ``fit(source, target)``, ``evaluate(source, target)`` take source ids (B, S) and target ids
    (B, T) that begin with the start token, 0 = padding; `train_data` turns them into teacher
    forcing. ``predict(source)`` returns greedy translations (see `predict_step`).

    Call: ``model([source, decoder_input])`` gives the teacher-forced logits (B, T, V), step t
    predicting the word after ``decoder_input[:, t]``.

    Layers: ``encoder`` (an `Encoder`) and ``decoder`` (a `BahdanauDecoder` or `LuongDecoder`); the
    weights are built with the model (their shapes depend on the sizes above, not on the data).

    Bounds: max_length <= 1024; sources are at most `MAX_SOURCE_LENGTH` = 1024 ids (CTranslate2's
    max_input_length): longer ids are a ValueError, longer sentences are cut to their first 1024 ids
    by `encode_sources` (so by `translate` and `evaluate_bleu`).
    """

    MAX_SOURCE_LENGTH = decoding.MAX_SOURCE_LENGTH

    def __init__(self, source_vocab_size, target_vocab_size, embedding_dim=256, units=512, attention="bahdanau",
                 score=None, cell="gru", bidirectional=False, attention_units=None, local_window=None, local_mode="m",
                 start_token="<start>", end_token="<end>", max_length=50, source_tokenizer=None,
                 target_tokenizer=None, dtype=None, name=None):
        super().__init__(name=name or unique_name("seq2seq"), dtype=dtype)
        self.attention = _check_choice("Seq2Seq", "attention", attention, ("bahdanau", "luong"))
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        vocab_size = _positive_int("Seq2Seq", "target_vocab_size", target_vocab_size)
        self.start_id = self._token_id(start_token, "start_token", vocab_size)
        self.end_id = self._token_id(end_token, "end_token", vocab_size)
        self.max_length = _positive_int("Seq2Seq", "max_length", max_length, decoding.MAX_DECODING_LENGTH)
        units = _positive_int("Seq2Seq", "units", units)
        if bidirectional and units % 2:
            raise ValueError(f"Seq2Seq: a bidirectional encoder needs even units, got {units}")
        # fixed layer names: the weights are "encoder/..." and "decoder/..." in every Seq2Seq
        self.encoder = Encoder(source_vocab_size, embedding_dim, units // 2 if bidirectional else units, cell=cell,
                               bidirectional=bidirectional, dtype=dtype, name="encoder")
        if attention == "bahdanau":
            if score is not None:  # the one Bahdanau score
                scores.get(score, "Seq2Seq: attention='bahdanau'", BahdanauDecoder.offered_scores)
            self.decoder = BahdanauDecoder(target_vocab_size, embedding_dim, units, cell=cell,
                                           attention_units=attention_units, dtype=dtype, name="decoder")
        else:
            self.decoder = LuongDecoder(target_vocab_size, embedding_dim, units, score=score or "general", cell=cell,
                                        attention_units=attention_units, local_window=local_window,
                                        local_mode=local_mode, dtype=dtype, name="decoder")
        self.build()

    @classmethod
    def from_texts(cls, sources, targets, num_words=None, oov_token=None, subwords=None, shared_vocabulary=False,
                   **kwargs):
        """Fits tokenizers on the texts and builds a model for them.

        Words (default): `text.Tokenizer`s (``filters=''``: punctuation was split off by
        `attnx.datasets.preprocess_sentence`); with `oov_token` (e.g. "<unk>"), unknown words map to it
        instead of raising. Subwords (`subwords` a vocabulary size): the Transformer's SentencePiece BPE
        vocabularies (`translation.subword_tokenizers`) learned on the sentences as written, one per side
        or one shared (`shared_vocabulary`); the model then reads and writes raw, cased text."""
        if subwords is not None:
            if num_words is not None or oov_token is not None:
                raise ValueError("Seq2Seq.from_texts: num_words and oov_token are options of word tokenizers; "
                                 "with subwords=..., pass neither (every text is spelt with subwords)")
            src_tok, tgt_tok = translation.subword_tokenizers(sources, targets, subwords, shared_vocabulary)
            return cls(src_tok.vocab_size, tgt_tok.vocab_size, source_tokenizer=src_tok, target_tokenizer=tgt_tok,
                       **kwargs)
        if shared_vocabulary:
            raise ValueError("Seq2Seq.from_texts: shared_vocabulary needs subwords=<vocabulary size>")
        src_tok = text.Tokenizer(num_words=num_words, filters="", oov_token=oov_token)
        tgt_tok = text.Tokenizer(num_words=num_words, filters="", oov_token=oov_token)
        src_tok.fit_on_texts(list(sources))
        tgt_tok.fit_on_texts(list(targets))
        size = (lambda tok: min(num_words or 2 ** 62, len(tok.word_index) + 1))
        return cls(size(src_tok), size(tgt_tok), source_tokenizer=src_tok, target_tokenizer=tgt_tok, **kwargs)

    def _token_id(self, token, arg, vocab_size):
        if not isinstance(token, (int, np.integer)):
            if self.target_tokenizer is None or token not in self.target_tokenizer.word_index:
                raise ValueError(f"Seq2Seq: `{arg}` {token!r} is not an id and not a word of the target tokenizer")
            token = self.target_tokenizer.word_index[token]
        return decoding.token_id("Seq2Seq", arg, token, vocab_size)

    def build(self, input_shape=None):
        """Creates the weights (`input_shape` is not needed: no weight depends on the sequence lengths)."""
        if not self.encoder.built:
            self.encoder.build((None, None))
            self.encoder.built = True
        if not self.decoder.built:
            self.decoder.build([(None, None), (None, None, self.encoder.output_dim)]
                               + [(None, self.decoder.units)] * self.decoder.n_states)
            self.decoder.built = True
        self.built = True

    def get_config(self):
        """The constructor's arguments, tokenizers included (as their JSON)."""
        dec = self.decoder
        return {"name": self.name, "source_vocab_size": self.encoder.vocab_size, "target_vocab_size": dec.vocab_size,
                "embedding_dim": self.encoder.embedding_dim, "units": dec.units, "attention": self.attention,
                "score": None if self.attention == "bahdanau" else dec.score, "cell": dec.cell,
                "bidirectional": self.encoder.bidirectional, "attention_units": dec.attention_units,
                "local_window": dec.local_window, "local_mode": dec.local_mode, "start_token": self.start_id,
                "end_token": self.end_id, "max_length": self.max_length, "dtype": dec.dtype_policy.name,
                "source_tokenizer": None if self.source_tokenizer is None else self.source_tokenizer.to_json(),
                "target_tokenizer": None if self.target_tokenizer is None else self.target_tokenizer.to_json()}

    @classmethod
    def from_config(cls, config):
        return cls(**translation.tokenizers_from_config(config))

    # ------------------------------------------------------------------------ training
    def compile(self, optimizer="adam", loss=None, metrics=None, loss_weights=None, distribute=None):
        """As `Model.compile`, with Seq2Seq's defaults: Adam, and the cross-entropy of each next
        target word from the logits, padding (id 0) ignored, averaged over the real words."""
        if loss is None:
            loss = losses.SparseCategoricalCrossentropy(from_logits=True, ignore_index=0)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
                        distribute=distribute)

    def forward(self, inputs, training=False):
        """``[source (B, S), decoder_input (B, T)]`` -> (logits (B, T, V), cache)."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Model '{self.name}': inputs must be [source ids, decoder input ids]")
        source, decoder_input = inputs
        (encoder_outputs, source_mask, *states), encoder_cache = self.encoder.apply(source, training=training)
        decoder_input = np.asarray(decoder_input)
        logits, decoder_cache = self.decoder.apply([decoder_input, encoder_outputs] + states, training=training,
                                                   mask=decoder_input != 0, source_mask=source_mask)
        return logits, (_Seq2SeqCache(encoder_cache, decoder_cache) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        _, d_encoder_outputs, *d_states = self.decoder.backprop(cache.decoder, dy)
        self.encoder.backprop(cache.encoder, [d_encoder_outputs, None] + d_states)
        return [None, None]  # token ids have no gradient

    def train_data(self, x, y):
        """Teacher forcing: source ids `x` (B, S) and target ids `y` (B, T) starting with the start
        token give the inputs ``[x, y[:, :-1]]`` and the targets ``y[:, 1:]`` (each step predicts the
        next word from the true previous one). The trailing columns that are padding in every row
        of the batch are cut first: the kernels would step through them for nothing."""
        source, target = self._source(x), self._target(y)
        if len(source) != len(target):
            raise ValueError(f"Seq2Seq: {len(source)} sources but {len(target)} targets")
        source, target = _without_trailing_padding(source), _without_trailing_padding(target)
        return [source, target[:, :-1]], target[:, 1:]

    def predict_step(self, x):
        """Greedy translations of source ids `x` (B, S): target ids (B, max_length), each row ending
        with the end token (unless cut at max_length) and padded with 0 after it."""
        tokens, _ = self.greedy_decode(x)
        return np.pad(tokens, ((0, 0), (0, self.max_length - tokens.shape[1])))

    def _source(self, source, arg="source"):
        ids = np.asarray(source)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Seq2Seq: `{arg}` must be integer ids, got dtype {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"Seq2Seq: `{arg}` expected non-empty ids of shape (batch, steps), got {ids.shape}")
        if ids.shape[1] > self.MAX_SOURCE_LENGTH:
            raise ValueError(f"Seq2Seq: `{arg}` has {ids.shape[1]} steps, more than MAX_SOURCE_LENGTH = "
                             f"{self.MAX_SOURCE_LENGTH}; cut the sources (encode_sources does for sentences)")
        if not (ids != 0).any(axis=1).all():
            raise ValueError(f"Seq2Seq: `{arg}` has an empty sentence (a row of padding only) at row "
                             f"{int(np.argmin((ids != 0).any(axis=1)))}")
        return ids

    def _target(self, target):
        return check_target_ids(target, "Seq2Seq", "target", self.start_id, self.max_length)

    def _encode(self, source):
        """(encoder outputs, source mask, initial decoder states) of source ids, in inference mode."""
        (encoder_outputs, source_mask, *states), _ = self.encoder.apply(source)
        return encoder_outputs, source_mask, states

    # ------------------------------------------------------------------------ texts
    def _require_tokenizers(self, what):
        if self.source_tokenizer is None or self.target_tokenizer is None:
            raise RuntimeError(f"Seq2Seq: {what} needs source_tokenizer and target_tokenizer")

    def encode_sources(self, sentences, max_length=None):
        """Sentences -> padded id array. Subword tokenizers: sentences as written (``<start>`` / ``<end>``
        optional). Word tokenizers: preprocessed sentences; unknown words raise (unless the tokenizer
        has an oov_token). An empty sentence raises. Each is cut to its first `max_length` ids (at most
        `MAX_SOURCE_LENGTH`)."""
        self._require_tokenizers("encode_sources")
        tok = self.source_tokenizer
        # a max_length given pads (and cuts) every row to it, as before; none pads to the longest
        width = None if max_length is None else min(_positive_int("Seq2Seq.encode_sources", "max_length", max_length),
                                                    self.MAX_SOURCE_LENGTH)
        if isinstance(tok, text.SubwordTokenizer):
            seqs = translation.subword_sources("Seq2Seq", tok, sentences, self.MAX_SOURCE_LENGTH)
            return text.pad_sequences(seqs, maxlen=width, padding="post", truncating="post").astype(np.int64)
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
            seqs.append(tok.texts_to_sequences([words])[0][:self.MAX_SOURCE_LENGTH])
        return text.pad_sequences(seqs, maxlen=width, padding="post").astype(np.int64)

    def encode_targets(self, sentences):
        """Sentences -> target ids (B, T) starting with the start token (subwords: added here; words:
        the preprocessed sentence's ``<start>``), padded."""
        self._require_tokenizers("encode_targets")
        if isinstance(self.target_tokenizer, text.SubwordTokenizer):
            seqs = translation.subword_targets(self.target_tokenizer, sentences, self.start_id, self.end_id)
        else:
            seqs = self.target_tokenizer.texts_to_sequences(list(sentences))
        return text.pad_sequences(seqs, padding="post").astype(np.int64)

    def fit_texts(self, sources, targets, validation_data=None, **kwargs):
        """`fit` on preprocessed sentence lists (see `attnx.datasets.load_anki_pairs`);
        `validation_data` is a pair of sentence lists too, the other arguments are `Model.fit`'s.
        Returns the `History`."""
        val = None if validation_data is None else (self.encode_sources(validation_data[0]),
                                                    self.encode_targets(validation_data[1]))
        return self.fit(self.encode_sources(sources), self.encode_targets(targets), validation_data=val, **kwargs)

    def target_words(self, tokens):
        """Target ids -> words (ids outside the vocabulary give "<unk>")."""
        index_word = self.target_tokenizer.index_word
        return [index_word.get(int(t), "<unk>") for t in tokens]

    def target_text(self, tokens):
        """Target ids (without start / end tokens) -> the sentence: subwords detokenized, words joined by
        spaces."""
        if isinstance(self.target_tokenizer, text.SubwordTokenizer):
            return self.target_tokenizer.decode(tokens)
        return " ".join(self.target_words(tokens))

    # ------------------------------------------------------------------------ decoding
    def _decode_length(self, max_length):
        return self.max_length if max_length is None else _positive_int("Seq2Seq", "max_length", max_length,
                                                                        decoding.MAX_DECODING_LENGTH)

    def greedy_decode(self, source, max_length=None):
        """Most likely next word at every step, for a batch of source ids (B, S).

        Returns (tokens (B, L) ints with the end token and 0 after it, attention (B, L, S)), L <=
        max_length (default the model's; at most 1024)."""
        source = self._source(source)
        L = self._decode_length(max_length)
        encoder = self._one_call_encoder()
        if encoder is not None:  # the encoder and the decoder's search in one C++ call
            tokens, _, _, _, attention = kernels.seq2seq_greedy(
                source=np.require(source, np.int64, "CA"), **encoder, **self.decoder._variant,
                params=self.decoder.params, start_id=int(self.start_id), end_id=int(self.end_id), max_length=L)
            return tokens[:, 0], attention[:, 0]
        enc, smask, states = self._encode(source)
        return self.decoder.greedy(enc, states, self.start_id, self.end_id, L, smask)

    def _one_call_encoder(self):
        """`kernels.seq2seq_greedy`'s encoder arguments when it computes what `_encode` does (one direction,
        float weights, the recurrent layer as the Encoder makes it), else None (the layers run eagerly)."""
        rnn, embedding = self.encoder.rnn, self.encoder.embedding
        if not isinstance(rnn, (GRU, LSTM)) or rnn.quantization_mode or embedding.quantization_mode or \
                rnn.num_layers != 1 or rnn.go_backwards or rnn.stateful or not rnn.use_bias or \
                rnn.activation != "tanh" or rnn.recurrent_activation != "sigmoid" or rnn.zero_output_for_mask or \
                (isinstance(rnn, GRU) and not rnn.reset_after) or _CELLS[self.decoder.cell] is not type(rnn):
            return None
        return {"encoder_embeddings": embedding.params["embeddings"], "encoder_kernel": rnn.params["kernel"],
                "encoder_recurrent_kernel": rnn.params["recurrent_kernel"], "encoder_bias": rnn.params["bias"],
                "encoder_bf16": rnn.compute_dtype == "bfloat16"}

    def beam_search(self, source, width=4, length_penalty=0.0, max_length=None, end_token=None):
        """Batched beam search (`attnx.decoding.beam_search`): the B sentences' `width` hypotheses run
        as rows of one decoder step; a sentence leaves the batch once all its beams have ended.

        Args:
            source: source ids (B, S).
            width: beams per sentence (1 to the target vocabulary size; 1 gives greedy decoding).
            length_penalty: alpha of GNMT's ((5 + len) / 6) ** alpha dividing the final scores.
            max_length: most tokens per hypothesis (default the model's max_length; at most 1024).
            end_token: id that ends a hypothesis (default the model's end token).
        Returns:
            For each sentence, its `width` `Hypothesis`es, best first, with the attention (steps, S).
        """
        owner = "Seq2Seq.beam_search"
        width = decoding.beam_width(owner, width, self.decoder.vocab_size)
        alpha = decoding.length_penalty_alpha(owner, length_penalty)
        end = self.end_id if end_token is None else decoding.token_id(owner, "end_token", end_token,
                                                                       self.decoder.vocab_size)
        L = self._decode_length(max_length)
        source = self._source(source)
        enc, smask, states = self._encode(source)
        return decoding.beam_search(self.decoder, self.decoder.start_state(enc, states, smask), len(source),
                                    self.start_id, end, width, alpha, L)

    def translate(self, sentence, width=1, length_penalty=0.0, max_length=None):
        """Translates one sentence: preprocessed (``<start> ... <end>``, see
        `attnx.datasets.preprocess_sentence`) for word tokenizers, as written for subword ones.

        Returns (translation str without start/end tokens, attention (target tokens + 1, source tokens));
        `source_tokens` / `target_tokens` for `attnx.plot.attention_heatmap` are ``sentence.split()`` and
        ``translation.split() + ['<end>']`` for words, the tokenizers' ``tokenize`` of the sentence and
        ``index_word`` of the tokens for subwords."""
        self._require_tokenizers("translate")
        if not isinstance(sentence, str):
            raise TypeError(f"Seq2Seq.translate: expected a str sentence, got {type(sentence).__name__}")
        source = self.encode_sources([sentence])
        if width == 1:
            tokens, attention = self.greedy_decode(source, max_length)
            words, steps = decoding.until_end(tokens[0].tolist(), self.end_id)
            weights = attention[0, :steps]
        else:
            best = self.beam_search(source, width, length_penalty, max_length)[0][0]
            words, weights = best.tokens, best.attention
        return self.target_text(words), weights

    def evaluate_bleu(self, sources, references, width=1, length_penalty=0.0, batch_size=64, max_length=None,
                      scorer="auto", normalize=False):
        """Corpus BLEU-4 of the translations of `sources` against `references` (`translation.translation_bleu`,
        the Transformer's: start/end tokens are not scored): by default the text as the model writes it
        (subwords: cased and detokenized; words: the preprocessed words joined by spaces), with
        ``normalize=True`` both sides after `attnx.datasets.preprocess_sentence` (lowercased,
        punctuation split).

        `scorer`: "sacrebleu" (the `sacrebleu` package, the score papers report), "attnx" (NLTK's
        formula, `metrics.corpus_bleu`) or "auto" (sacreBLEU when installed). Returns a
        `metrics.BleuScore`: a float in [0, 1] whose ``scorer`` and ``signature`` say which it is.
        """
        self._require_tokenizers("evaluate_bleu")
        hyps = []
        for lo in range(0, len(sources), batch_size):
            src = self.encode_sources(sources[lo:lo + batch_size])
            if width == 1:
                tokens, _ = self.greedy_decode(src, max_length)
                hyps += [self.target_text([t for t in decoding.until_end(row, self.end_id)[0] if t])
                         for row in tokens.tolist()]
            else:
                beams = self.beam_search(src, width, length_penalty, max_length)
                hyps += [self.target_text(h[0].tokens) for h in beams]
        return translation.translation_bleu(hyps, references, normalize, scorer)
