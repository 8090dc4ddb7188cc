"""Attention: scores -> masked softmax over source positions -> context, in every variant the
tutorials name, with forward and backward in C++.

Functional API (NumPy in, NumPy out; usable without a layer):

- ``scaled_dot_product_attention(query, key, value, mask=None, causal=False, scale=None, heads=1,
  dropout_keep=None)`` -> ``(context, weights)`` and ``scaled_dot_product_attention_backward``:
  the core multi-head attention is built on.
- ``softmax_context(scores, value, mask=None)`` -> ``(context, weights)`` and
  ``softmax_context_backward``: the masked softmax and context for scores from any score function.
- ``masked_softmax(scores, mask=None, causal=False)``: the softmax over source positions alone
  (its backward is ``attnx.activations`` softmax backward: masked entries have weight 0).
- ``attend_mask(mask, batch, source_len, query_len)``: a mask or lengths as the kernels take it.

Masks given to the functional API may also have a leading axis of 1, shared by the whole batch.

Masks follow Keras: True = may attend. A query row with nothing to attend to gets zero weights and
a zero context, never NaN.
"""
import math

import numpy as np

from .. import _core, backend, initializers
from .base import Layer, attend_mask

SCORES = ("dot", "scaled_dot", "general", "concat", "additive")


# ----------------------------------------------------------------------------- functional API
def _as_float(x, dtype=None):
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=dtype or (np.float64 if x.dtype == np.float64 else np.float32))


def scaled_dot_product_attention(query, key, value, mask=None, causal=False, scale=None, heads=1,
                                 dropout_keep=None, return_weights=True):
    """Scaled dot-product attention, ``softmax(scale * Q K^T) V``, over `heads` heads.

    Args:
        query: (B, Tq, H * Dk). key: (B, S, H * Dk). value: (B, S, H * Dv).
        mask: None, key padding (B, S), per-query (B, Tq, S) bool (True = may attend), or lengths (B,).
        causal: query t attends only to keys s <= t.
        scale: default 1 / sqrt(Dk), Dk the per-head key size.
        heads: H; head h reads columns [h * Dk, (h + 1) * Dk) of query and key, so the (B, T, H * d)
            projections of multi-head attention are used in place.
        dropout_keep: (B, H, Tq, S) keep mask already scaled by 1 / (1 - rate), applied to the weights
            after the softmax, or None.
        return_weights: False for inference: the (B, H, Tq, S) weights are then never written
            (each block of them lives in cache only) and None comes back in their place.

    Returns:
        ``(context (B, Tq, H * Dv), weights (B, H, Tq, S))``; `weights` are the softmax output
        before dropout (what backward needs and what you plot).
    """
    q = _as_float(query)
    k, v = _as_float(key, q.dtype), _as_float(value, q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(max(1, q.shape[-1] // max(1, int(heads))))
    m = attend_mask(mask, q.shape[0], k.shape[1], q.shape[1], shared_ok=True) if q.ndim == 3 and k.ndim == 3 else mask
    return _core.sdpa_forward(q, k, v, m, bool(causal), float(scale), int(heads), dropout_keep,
                              bool(return_weights))


def scaled_dot_product_attention_backward(dcontext, weights, query, key, value, scale=None, heads=1, dweights=None,
                                          dropout_keep=None, dscale=None):
    """Backward of `scaled_dot_product_attention`: returns ``(dquery, dkey, dvalue)``.

    `dweights` is the gradient flowing into the returned weights (or None); `dscale`, a (1,) array
    of the input dtype, accumulates the gradient with respect to `scale` (for a learned scale).
    """
    q = _as_float(query)
    if scale is None:
        scale = 1.0 / math.sqrt(max(1, q.shape[-1] // max(1, int(heads))))
    return _core.sdpa_backward(_as_float(dcontext, q.dtype), weights, q, _as_float(key, q.dtype),
                               _as_float(value, q.dtype), float(scale), int(heads), dweights, dropout_keep, dscale)


def softmax_context(scores, value, mask=None, causal=False, dropout_keep=None):
    """Masked softmax over source positions and the context, from any scores.

    scores (B, Tq, S) or (B, H, Tq, S); value (B, S, Dv) (or (B, S, H * Dv)). Returns
    ``(context, weights)`` with weights shaped like `scores`.
    """
    s = _as_float(scores)
    s4 = s if s.ndim == 4 else s.reshape(s.shape[0], 1, *s.shape[1:])
    m = attend_mask(mask, s4.shape[0], s4.shape[3], s4.shape[2], shared_ok=True)
    context, weights = _core.softmax_context_forward(s4, _as_float(value, s.dtype), m, bool(causal), dropout_keep)
    return context, weights.reshape(s.shape)


def masked_softmax(scores, mask=None, causal=False):
    """Softmax of scores (B, Tq, S) or (B, H, Tq, S) over the last axis where `mask` allows
    ((B, S), (B, Tq, S), lengths (B,), or a leading 1 for the whole batch); fully masked rows are 0."""
    s = _as_float(scores)
    s4 = s if s.ndim == 4 else s.reshape(s.shape[0], 1, *s.shape[1:])
    m = attend_mask(mask, s4.shape[0], s4.shape[3], s4.shape[2], shared_ok=True)
    return _core.masked_softmax_forward(s4, m, bool(causal)).reshape(s.shape)


def softmax_context_backward(dcontext, weights, value, dweights=None, dropout_keep=None):
    """Backward of `softmax_context`: returns ``(dscores, dvalue)``, dscores shaped like `weights`."""
    w = np.asarray(weights)
    w4 = w if w.ndim == 4 else w.reshape(w.shape[0], 1, *w.shape[1:])
    dw4 = None if dweights is None else _as_float(dweights, w.dtype).reshape(w4.shape)
    dscores, dvalue, _ = _core.softmax_context_backward(_as_float(dcontext, w.dtype), w4, _as_float(value, w.dtype),
                                                        dw4, dropout_keep)
    return dscores.reshape(w.shape), dvalue


# ----------------------------------------------------------------------------- layers
class Attention(Layer):
    """Attention of queries over a source sequence: score -> masked softmax -> context.

    ``context = softmax(score(query, key)) . value`` over the source positions, with the scores
    of Luong et al. (2015) and Bahdanau et al. (2015):

    - ``"dot"``: ``q . k`` (Keras' Attention).
    - ``"scaled_dot"``: ``q . k / sqrt(d_k)`` (Vaswani et al.).
    - ``"general"``: ``q^T W_a k``, W_a of shape (query size, key size).
    - ``"concat"``: ``v_a^T tanh(W_a [q; k])`` (Luong), W_a kept as a query half and a key half
      so the (Tq, S) concatenations are never formed.
    - ``"additive"``: ``v^T tanh(W1 k + W2 q + b)`` (Bahdanau); ``normalize=True`` is TensorFlow
      Addons' weight-normalized form ``v = g * v / ||v||``.

    Args:
        score: one of the names above.
        use_scale: multiply dot-style scores by a learned scalar (Keras' `use_scale`).
        units: hidden size of the concat / additive scores (default: the key size).
        normalize: weight normalization of `v` (additive score).
        use_bias: the bias b inside the tanh (default: True for additive, False for concat).
        dropout: fraction of attention weights dropped during training.
        kernel_initializer: for W_a, W1, W2 and v (Keras default glorot_uniform).

    Call arguments:
        inputs: ``[query, value]`` or ``[query, value, key]`` (key defaults to value).
            query (B, Tq, Dq), or (B, Dq) for a single decoder step; value (B, S, Dv); key (B, S, Dk).
        mask: ``[query_mask, value_mask]`` (either may be None). value_mask (B, S) or (B, Tq, S)
            bool, True = may attend, or lengths (B,); query_mask (B, Tq) zeroes the context of
            padded query rows (Keras).
        return_attention_scores: also return the weights.
        use_causal_mask: query t attends only to source positions s <= t.

    Output shape:
        context (B, Tq, Dv) (or (B, Dv) for a 2-D query); with ``return_attention_scores`` also
        the weights (B, Tq, S) (or (B, S)). A query with nothing to attend to gets zero weights
        and a zero context.

    ``backward(dy)`` takes the gradient of the context (and, with ``return_attention_scores``, a
    pair ``[dcontext, dweights]``, dweights may be None) and returns ``[dquery, dvalue]`` or
    ``[dquery, dvalue, dkey]``, the order of the inputs.
    """

    def __init__(self, score="dot", use_scale=False, units=None, normalize=False, use_bias=None, dropout=0.0,
                 kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if score not in SCORES:
            raise ValueError(f"{type(self).__name__}: score must be one of {', '.join(SCORES)}, got {score!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        if units is not None and int(units) <= 0:
            raise ValueError(f"{type(self).__name__}: units must be positive, got {units}")
        if normalize and score != "additive":
            raise ValueError(f"{type(self).__name__}: normalize=True applies to score='additive' only")
        if use_scale and score in ("concat", "additive"):
            raise ValueError(f"{type(self).__name__}: use_scale applies to dot-style scores; the {score} score "
                             f"already learns v")
        self.score = score
        self.use_scale = bool(use_scale)
        self.units = None if units is None else int(units)
        self.normalize = bool(normalize)
        self.use_bias = (score == "additive") if use_bias is None else bool(use_bias)
        self.dropout = float(dropout)
        self.kernel_initializer = initializers.get(kernel_initializer)

    # ------------------------------------------------------------------ weights
    def _split_shapes(self, input_shape):
        if not isinstance(input_shape, (list, tuple)) or not input_shape or \
                not isinstance(input_shape[0], (list, tuple)) or len(input_shape) not in (2, 3):
            raise ValueError(f"Layer '{self.name}': expects inputs [query, value] or [query, value, key], "
                             f"got input shape {input_shape}")
        q, v = input_shape[0], input_shape[1]
        k = input_shape[2] if len(input_shape) == 3 else v
        return q, v, k

    def build(self, input_shape):
        q, v, k = self._split_shapes(input_shape)
        dq, dk = q[-1], k[-1]
        self._sizes = (dq, dk)  # the query and key sizes later calls must match
        if self.score in ("dot", "scaled_dot") and dq != dk:
            raise ValueError(f"Layer '{self.name}': the {self.score} score needs query and key of the same size, "
                             f"got query (..., {dq}) and key (..., {dk}); use score='general', 'concat' or "
                             f"'additive' to combine different sizes")
        if self.score == "general":
            self.add_weight("kernel", (dq, dk), self.kernel_initializer)
        elif self.score in ("concat", "additive"):
            units = self.units or dk
            self.add_weight("query_kernel", (dq, units), self.kernel_initializer)
            self.add_weight("key_kernel", (dk, units), self.kernel_initializer)
            if self.use_bias:
                self.add_weight("bias", (units,), "zeros")
            self.add_weight("v", (units, 1), self.kernel_initializer)
            if self.normalize:
                self.add_weight("g", (1,), initializers.Constant(math.sqrt(1.0 / units)))
        if self.use_scale:
            self.add_weight("scale", (1,), "ones")

    # ------------------------------------------------------------------ inputs
    def _inputs(self, inputs, mask):
        if not isinstance(inputs, (list, tuple)) or len(inputs) not in (2, 3):
            raise ValueError(f"Layer '{self.name}': expects inputs [query, value] or [query, value, key], "
                             f"got {type(inputs).__name__}")
        query = self._float_input(inputs[0], "query")
        if query.ndim not in (2, 3):
            raise ValueError(f"Layer '{self.name}': `query` expected shape (batch, Tq, dim) or (batch, dim), "
                             f"got {query.shape}")
        single_step = query.ndim == 2
        if single_step:
            query = query[:, None, :]
        value = self._float_input(inputs[1], "value", ndim=3)
        key = self._float_input(inputs[2], "key", ndim=3) if len(inputs) == 3 else value
        B, Tq, S = query.shape[0], query.shape[1], value.shape[1]
        for arg, x in (("value", value), ("key", key)):
            if x.shape[0] != B:
                raise ValueError(f"Layer '{self.name}': `{arg}` expected batch size {B} (the query's), "
                                 f"got shape {x.shape}")
        if key.shape[1] != S:
            raise ValueError(f"Layer '{self.name}': `key` expected length {S} (the value's), got shape {key.shape}")
        if (query.shape[-1], key.shape[-1]) != self._sizes:
            raise ValueError(f"Layer '{self.name}': built for query (..., {self._sizes[0]}) and key "
                             f"(..., {self._sizes[1]}), got query {np.shape(inputs[0])} and key {key.shape}")
        query_mask = value_mask = None
        if mask is not None:
            if not isinstance(mask, (list, tuple)) or len(mask) != 2:
                raise ValueError(f"Layer '{self.name}': mask must be [query_mask, value_mask], got "
                                 f"{type(mask).__name__}")
            value_mask = attend_mask(mask[1], B, S, Tq, where=f"Layer '{self.name}': `value_mask`")
            if mask[0] is not None and single_step:
                query_mask = np.asarray(mask[0])
                if query_mask.shape != (B,):
                    raise ValueError(f"Layer '{self.name}': `query_mask` expected shape ({B},) for a single-step "
                                     f"query, got {query_mask.shape}")
                query_mask = query_mask.reshape(B, 1).astype(self.dtype)
            elif mask[0] is not None:  # (B, Tq) bool or lengths (B,)
                query_mask = attend_mask(mask[0], B, Tq, where=f"Layer '{self.name}': `query_mask`")
                query_mask = query_mask.astype(self.dtype)
        return query, value, key, len(inputs) == 3, single_step, query_mask, value_mask

    # ------------------------------------------------------------------ forward
    def _v(self):
        """The score vector v (weight-normalized when normalize=True)."""
        v = self.params["v"][:, 0]
        if not self.normalize:
            return np.ascontiguousarray(v)
        return np.ascontiguousarray(self.params["g"][0] * v / np.linalg.norm(v))

    def _score_forward(self, query, key):
        """scores (B, Tq, S) for query (B, Tq, Dq), key (B, S, Dk), and what _score_backward needs."""
        B, Tq, Dq = query.shape
        S = key.shape[1]
        q2 = query.reshape(B * Tq, Dq)
        if self.score in ("dot", "scaled_dot", "general"):
            base_scale = 1.0 / math.sqrt(key.shape[-1]) if self.score == "scaled_dot" else 1.0
            scale = base_scale * float(self.params["scale"][0]) if self.use_scale else base_scale
            projected = query
            if self.score == "general":  # q^T W_a k = (q W_a) . k, one GEMM over all query rows
                projected = _core.dense_forward(q2, self.params["kernel"], None, "linear")[0].reshape(B, Tq, -1)
            return _core.dot_scores_forward(projected, key, scale), dict(projected=projected, scale=scale,
                                                                         base_scale=base_scale)
        units = self.params["key_kernel"].shape[1]
        # W_a [q; k] = W_q q + W_k k: project each side once, combine inside the score kernel
        pq = _core.dense_forward(q2, self.params["query_kernel"], self.params.get("bias"), "linear")[0]
        pk = _core.dense_forward(key.reshape(B * S, -1), self.params["key_kernel"], None, "linear")[0]
        v = self._v()
        pq, pk = pq.reshape(B, Tq, units), pk.reshape(B, S, units)
        scores, hidden = _core.additive_scores_forward(pq, pk, v)
        return scores, dict(hidden=hidden, v=v, pq=pq, pk=pk)

    def _score_backward(self, dscores, query, key, sc):
        """(dquery, dkey) from the gradient of the scores; adds the score parameters' gradients."""
        B, Tq, Dq = query.shape
        S = key.shape[1]
        q2 = query.reshape(B * Tq, Dq)
        if self.score in ("dot", "scaled_dot", "general"):
            dscale = np.zeros(1, self.dtype) if self.use_scale else None
            dproj, dkey = _core.dot_scores_backward(dscores, sc["projected"], key, sc["scale"], dscale)
            if self.use_scale:  # scores = base * s * q.k; the kernel gave sum(dscores * q.k)
                self.grads["scale"] += sc["base_scale"] * dscale
            if self.score != "general":
                return dproj, dkey
            proj2 = sc["projected"].reshape(B * Tq, -1)
            dquery = _core.dense_backward(dproj.reshape(B * Tq, -1), q2, self.params["kernel"], proj2, proj2, "linear",
                                          self.grads["kernel"], None, True)
            return dquery.reshape(B, Tq, Dq), dkey
        v = sc["v"]
        dv_used = np.zeros_like(v)
        dpq, dpk = _core.additive_scores_backward(dscores, sc["hidden"], v, dv_used)
        self._v_backward(dv_used)
        units = v.shape[0]
        pq, pk = sc["pq"].reshape(B * Tq, units), sc["pk"].reshape(B * S, units)
        dquery = _core.dense_backward(dpq.reshape(B * Tq, units), q2, self.params["query_kernel"], pq, pq, "linear",
                                      self.grads["query_kernel"], self.grads.get("bias"), True)
        dkey = _core.dense_backward(dpk.reshape(B * S, units), key.reshape(B * S, -1), self.params["key_kernel"], pk,
                                    pk, "linear", self.grads["key_kernel"], None, True)
        return dquery.reshape(B, Tq, Dq), dkey.reshape(B, S, -1)

    def _attend(self, scores, query, value, value_mask, causal, training):
        """Masked softmax and context from the scores: (context, weights (B, Tq, S), cache)."""
        B, Tq, S = scores.shape
        keep = None
        if training and self.dropout > 0:
            keep = ((backend.rng().random((B, 1, Tq, S)) >= self.dropout) / (1.0 - self.dropout)).astype(self.dtype)
        context, weights = _core.softmax_context_forward(scores.reshape(B, 1, Tq, S), value, value_mask, causal, keep)
        return context, weights.reshape(B, Tq, S), dict(keep=keep, weights=weights)

    def _attend_backward(self, dcontext, dweights, value, ac):
        """(dscores, dvalue, extra dquery or None) from the gradients of the context and weights."""
        B, S = value.shape[:2]
        dw = None if dweights is None else dweights.reshape(ac["weights"].shape)
        dscores, dvalue, _ = _core.softmax_context_backward(dcontext, ac["weights"], value, dw, ac["keep"], False)
        return dscores.reshape(B, -1, S), dvalue, None

    def call(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False):
        query, value, key, key_given, single_step, query_mask, value_mask = self._inputs(inputs, mask)
        scores, score_cache = self._score_forward(query, key)
        context, weights, attend_cache = self._attend(scores, query, value, value_mask, bool(use_causal_mask),
                                                      training)
        if query_mask is not None:
            context *= query_mask[:, :, None]
        if training:
            self._cache = dict(query=query, value=value, key=key, key_given=key_given, single_step=single_step,
                               query_mask=query_mask, return_weights=return_attention_scores, score=score_cache,
                               attend=attend_cache)
        if single_step:
            context, weights = context[:, 0], weights[:, 0]
        return (context, weights) if return_attention_scores else context

    def backward(self, dy):
        c = self._saved()
        query, value, key = c["query"], c["value"], c["key"]
        B, Tq, Dq = query.shape
        S, Dv = value.shape[1], value.shape[2]
        out_shape = (B, Dv) if c["single_step"] else (B, Tq, Dv)
        w_shape = (B, S) if c["single_step"] else (B, Tq, S)
        if c["return_weights"]:
            if not isinstance(dy, (list, tuple)) or len(dy) != 2:
                raise ValueError(f"Layer '{self.name}': backward expected [dcontext, dweights] (the layer returned "
                                 f"the weights too), got {type(dy).__name__}")
            dcontext, dweights = dy
        else:
            dcontext, dweights = dy, None
        dcontext = self._grad_input(dcontext, out_shape, "dcontext").reshape(B, Tq, Dv)
        if c["query_mask"] is not None:
            dcontext = dcontext * c["query_mask"][:, :, None]
        if dweights is not None:
            dweights = self._grad_input(dweights, w_shape, "dweights").reshape(B, Tq, S)
        dscores, dvalue, dquery_extra = self._attend_backward(dcontext, dweights, value, c["attend"])
        dquery, dkey = self._score_backward(dscores, query, key, c["score"])
        if dquery_extra is not None:
            dquery = dquery + dquery_extra
        if c["single_step"]:
            dquery = dquery[:, 0]
        if c["key_given"]:
            return [dquery, dvalue, dkey]
        return [dquery, dvalue + dkey]

    def _v_backward(self, dv_used):
        """Adds the gradient of the used score vector into v (and g when weight-normalized)."""
        if not self.normalize:
            self.grads["v"][:, 0] += dv_used
            return
        v = self.params["v"][:, 0]
        norm = np.linalg.norm(v)
        direction = v / norm
        # v_used = g * v / |v|: dg = dv_used . v/|v|, dv = g / |v| * (dv_used - (dv_used . v/|v|) v/|v|)
        along = float(dv_used @ direction)
        self.grads["g"][0] += along
        self.grads["v"][:, 0] += self.params["g"][0] / norm * (dv_used - along * direction)

    def compute_mask(self, inputs, mask=None):
        if mask is None or not isinstance(mask, (list, tuple)):
            return None
        return mask[0]

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        q, v, _ = self._split_shapes(input_shape)
        context = tuple(q[:-1]) + (self._output_size(v[-1]),)
        return [context, tuple(q[:-1]) + (v[1],)] if return_attention_scores else context

    def _output_size(self, value_size):
        return value_size

    def get_config(self):
        return {**super().get_config(), "score": self.score, "use_scale": self.use_scale, "units": self.units,
                "normalize": self.normalize, "use_bias": self.use_bias, "dropout": self.dropout,
                "kernel_initializer": initializers.serialize(self.kernel_initializer)}


class AdditiveAttention(Attention):
    """Bahdanau et al. (2015) attention: ``score = v^T tanh(W1 k + W2 q + b)``.

    Unlike Keras' AdditiveAttention (which adds query and key without projections), query and
    key are projected to `units`, so they may have different sizes.

    Args:
        units: hidden size of the score (default: the key size).
        normalize: TensorFlow Addons' weight normalization ``v = g * v / ||v||`` (g learned,
            initialized to sqrt(1 / units)).
        use_bias: the bias b inside the tanh.
        dropout: fraction of attention weights dropped during training.

    Inputs, masks and outputs as `Attention`.
    """

    def __init__(self, units=None, normalize=False, use_bias=True, dropout=0.0, **kwargs):
        kwargs.pop("score", None)
        super().__init__(score="additive", units=units, normalize=normalize, use_bias=use_bias, dropout=dropout,
                         **kwargs)

    def get_config(self):
        config = super().get_config()
        config.pop("score")
        config.pop("use_scale")
        return config


class LuongAttention(Attention):
    """Luong et al. (2015) global attention with the attentional hidden state.

    ``context = softmax(score(h_t, h_s)) . h_s`` with score "dot", "general" (default) or
    "concat", then (with ``attentional_units``) the attentional hidden state
    ``h~_t = tanh(W_c [c_t; h_t])`` that Luong feeds to the output layer and the next step.

    Args:
        score: "dot", "general" or "concat".
        attentional_units: size of h~_t; None returns the context itself.
        units: hidden size of the concat score.
        dropout: fraction of attention weights dropped during training.

    Inputs, masks and backward as `Attention`; the output is h~_t (B, Tq, attentional_units)
    (or the context when attentional_units is None), plus the weights with
    ``return_attention_scores=True``.
    """

    def __init__(self, score="general", attentional_units=None, units=None, dropout=0.0, **kwargs):
        if score not in ("dot", "general", "concat"):
            raise ValueError(f"LuongAttention: score must be 'dot', 'general' or 'concat', got {score!r}")
        if attentional_units is not None and int(attentional_units) <= 0:
            raise ValueError(f"LuongAttention: attentional_units must be positive, got {attentional_units}")
        super().__init__(score=score, units=units, dropout=dropout, **kwargs)
        self.attentional_units = None if attentional_units is None else int(attentional_units)

    def build(self, input_shape):
        super().build(input_shape)
        if self.attentional_units:
            q, v, _ = self._split_shapes(input_shape)
            self.add_weight("attentional_kernel", (v[-1] + q[-1], self.attentional_units), self.kernel_initializer)

    def call(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False):
        context, weights = super().call(inputs, training=training, mask=mask, return_attention_scores=True,
                                        use_causal_mask=use_causal_mask)
        if not self.attentional_units:
            if training:  # backward takes what this call returned: [dcontext, dweights] only with the weights
                self._cache["return_weights"] = bool(return_attention_scores)
            return (context, weights) if return_attention_scores else context
        query = self._float_input(inputs[0], "query")
        lead = context.shape[:-1]
        joined = np.concatenate([context, query], axis=-1).reshape(-1, self.params["attentional_kernel"].shape[0])
        state = _core.dense_forward(joined, self.params["attentional_kernel"], None, "tanh")[0]
        if training:
            self._cache.update(joined=joined, state=state, return_weights=True, luong_weights=return_attention_scores)
        state = state.reshape(lead + (self.attentional_units,))
        return (state, weights) if return_attention_scores else state

    def backward(self, dy):
        if not self.attentional_units:
            return super().backward(dy)
        c = self._saved()
        dstate, dweights = dy if c["luong_weights"] else (dy, None)
        joined, state = c["joined"], c["state"]
        Dv = c["value"].shape[2]
        lead = (c["query"].shape[0],) if c["single_step"] else c["query"].shape[:2]
        dstate = self._grad_input(dstate, lead + (self.attentional_units,), "dy").reshape(-1, self.attentional_units)
        # h~ = tanh([c; h] W_c): split the gradient of [c; h] back into the context and the query
        djoined = _core.dense_backward(dstate, joined, self.params["attentional_kernel"], state, state, "tanh",
                                       self.grads["attentional_kernel"], None, True)
        dcontext = djoined[:, :Dv].reshape(lead + (Dv,))
        grads = super().backward([dcontext, dweights])
        grads[0] = grads[0] + djoined[:, Dv:].reshape(grads[0].shape)
        return grads

    def _output_size(self, value_size):
        return self.attentional_units or value_size

    def get_config(self):
        return {**super().get_config(), "attentional_units": self.attentional_units}


class LocalAttention(Attention):
    """Luong et al. (2015) local attention: attend to a window [p_t - D, p_t + D] of the source.

    - ``mode="local-m"`` (monotonic): p_t = t, clipped to the last real source position
      (or the `positions` call argument).
    - ``mode="local-p"`` (predictive): p_t = S_b * sigmoid(v_p^T tanh(W_p h_t)), S_b the real
      length of source row b (from the value mask), learned with gradients through p_t.

    The weights are ``a_t(s) = align(h_t, h_s) * exp(-(s - p_t)^2 / (2 sigma^2))``, sigma = D / 2,
    where align is the softmax of the score over the window positions only. As in the paper the
    Gaussian multiplies the softmaxed alignment and the result is **not** renormalized, so the
    weights of a row sum to less than 1.

    Args:
        window: D, the half-width of the window (an integer >= 0; the paper uses 10).
        mode: "local-p" (default) or "local-m".
        score: "dot", "general" (default) or "concat".
        position_units: size of W_p (default: the query size).
        units: hidden size of the concat score.
        dropout: fraction of attention weights dropped during training.

    Call arguments as `Attention` (the value mask must be (B, S) or lengths), plus
    ``positions``: (B, Tq) (or (B,) for a single-step query) aligned positions for local-m.

    Output shape: as `Attention`.
    """

    def __init__(self, window, mode="local-p", score="general", position_units=None, units=None, dropout=0.0,
                 **kwargs):
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
            raise ValueError(f"LocalAttention: window D must be an integer >= 0, got {window!r}")
        if mode not in ("local-m", "local-p"):
            raise ValueError(f"LocalAttention: mode must be 'local-m' or 'local-p', got {mode!r}")
        if score not in ("dot", "general", "concat"):
            raise ValueError(f"LocalAttention: score must be 'dot', 'general' or 'concat', got {score!r}")
        super().__init__(score=score, units=units, dropout=dropout, **kwargs)
        self.window, self.mode = int(window), mode
        self.position_units = None if position_units is None else int(position_units)
        self._positions = None

    def build(self, input_shape):
        super().build(input_shape)
        if self.mode == "local-p":
            units = self.position_units or self._sizes[0]
            self.add_weight("position_kernel", (self._sizes[0], units), self.kernel_initializer)
            self.add_weight("position_v", (units, 1), self.kernel_initializer)

    def call(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False,
             positions=None):
        self._positions = positions
        return super().call(inputs, training=training, mask=mask, return_attention_scores=return_attention_scores,
                            use_causal_mask=use_causal_mask)

    def _aligned_positions(self, query, lengths):
        """p (B, Tq) and, for local-p, the activations its backward needs."""
        B, Tq, Dq = query.shape
        last = np.maximum(lengths - 1, 0)[:, None]
        if self.mode == "local-m":
            if self._positions is None:
                p = np.broadcast_to(np.arange(Tq), (B, Tq))
            else:
                p = np.asarray(self._positions)
                if p.size != B * Tq:
                    raise ValueError(f"Layer '{self.name}': `positions` expected shape ({B}, {Tq}), got {p.shape}")
                p = p.reshape(B, Tq)
            return np.ascontiguousarray(np.clip(p, 0, last), dtype=self.dtype), None
        q2 = query.reshape(B * Tq, Dq)
        hidden = _core.dense_forward(q2, self.params["position_kernel"], None, "tanh")[0]
        gate = _core.dense_forward(hidden, self.params["position_v"], None, "sigmoid")[0]
        p = np.ascontiguousarray(lengths[:, None] * gate.reshape(B, Tq), dtype=self.dtype)
        return p, dict(q2=q2, hidden=hidden, gate=gate)

    def _attend(self, scores, query, value, value_mask, causal, training):
        B, Tq, S = scores.shape
        if value_mask is not None and value_mask.ndim != 2:
            raise ValueError(f"Layer '{self.name}': local attention takes a value mask of shape ({B}, {S}) or "
                             f"lengths ({B},), got shape {value_mask.shape}")
        lengths = np.full(B, S) if value_mask is None else value_mask.sum(axis=1)
        p, position_cache = self._aligned_positions(query, lengths.astype(self.dtype))
        allowed, gauss = _core.local_window_forward(p, S, self.window, value_mask)
        keep = None
        if training and self.dropout > 0:
            keep = ((backend.rng().random((B, 1, Tq, S)) >= self.dropout) / (1.0 - self.dropout)).astype(self.dtype)
        multiplier = gauss if keep is None else gauss * keep
        context, align = _core.softmax_context_forward(scores.reshape(B, 1, Tq, S), value, allowed, causal,
                                                       multiplier)
        weights = align * gauss
        return context, weights.reshape(B, Tq, S), dict(p=p, gauss=gauss, align=align, multiplier=multiplier,
                                                        keep=keep, lengths=lengths, position=position_cache)

    def _attend_backward(self, dcontext, dweights, value, ac):
        gauss, align = ac["gauss"], ac["align"]
        B, _, Tq, S = align.shape
        dw = None if dweights is None else dweights.reshape(B, 1, Tq, S)
        # weights = align * gauss, and the context used align * gauss * keep
        dscores, dvalue, dmultiplier = _core.softmax_context_backward(
            dcontext, align, value, None if dw is None else np.ascontiguousarray(dw * gauss), ac["multiplier"], True)
        dscores = dscores.reshape(B, Tq, S)
        if self.mode == "local-m":
            return dscores, dvalue, None
        dgauss = dmultiplier if ac["keep"] is None else dmultiplier * ac["keep"]
        if dw is not None:
            dgauss = dgauss + dw * align
        dp = _core.local_window_backward(np.ascontiguousarray(dgauss), gauss, ac["p"], self.window)
        pc = ac["position"]
        # p = S_b * sigmoid(v_p . tanh(W_p h))
        dgate = np.ascontiguousarray((dp * ac["lengths"][:, None]).reshape(-1, 1), dtype=self.dtype)
        dhidden = _core.dense_backward(dgate, pc["hidden"], self.params["position_v"], pc["gate"], pc["gate"],
                                       "sigmoid", self.grads["position_v"], None, True)
        dquery = _core.dense_backward(dhidden, pc["q2"], self.params["position_kernel"], pc["hidden"], pc["hidden"],
                                      "tanh", self.grads["position_kernel"], None, True)
        return dscores, dvalue, dquery.reshape(B, Tq, -1)

    def get_config(self):
        config = {**super().get_config(), "window": self.window, "mode": self.mode,
                  "position_units": self.position_units}
        for key in ("use_scale", "normalize", "use_bias"):
            config.pop(key)
        return config


class HardAttention(Attention):
    """Hard (stochastic) attention of Xu et al. (2015), "Show, Attend and Tell": the context is the
    value at a single source position.

    At inference the position is the argmax of the attention weights (``inference="argmax"``)
    or a sample from them (``inference="sample"``). During training (``training=True``) it is
    sampled, s ~ weights, and the score parameters learn by REINFORCE with a moving-average
    baseline b:

        d loss / d scores = -(R - b) * (onehot(s) - weights)      (= -(R - b) grad log a_s)

    while the value gets the ordinary gradient through the chosen context. Call
    ``layer.set_reward(rewards)`` with rewards (B,) or (B, Tq) (higher is better, e.g. -loss or
    1 for a correct prediction) **before** ``backward``; backward then updates
    ``b <- decay * b + (1 - decay) * mean(R)``.

    Args:
        score: any `Attention` score.
        inference: "argmax" (default) or "sample".
        baseline_decay: decay of the moving-average reward baseline.
        Other arguments as `Attention` (no dropout).

    Output: the context (and the soft weights with ``return_attention_scores=True``); the chosen
    positions are in ``layer.positions`` (B, Tq) after each call. A query with nothing to attend
    to gets a zero context.
    """

    def __init__(self, score="dot", inference="argmax", baseline_decay=0.9, **kwargs):
        if inference not in ("argmax", "sample"):
            raise ValueError(f"HardAttention: inference must be 'argmax' or 'sample', got {inference!r}")
        if not 0.0 <= float(baseline_decay) < 1.0:
            raise ValueError(f"HardAttention: baseline_decay must be in [0, 1), got {baseline_decay}")
        super().__init__(score=score, **kwargs)
        self.inference, self.baseline_decay = inference, float(baseline_decay)
        self.baseline = None
        self.positions = None
        self._reward = None

    def set_reward(self, rewards):
        """Rewards (B,) or (B, Tq) for the positions sampled in the last training call."""
        c = self._saved()
        B, Tq = c["attend"]["positions"].shape
        r = np.asarray(rewards, dtype=np.float64)
        if r.shape == (B,):
            r = np.repeat(r[:, None], Tq, axis=1)
        if r.shape != (B, Tq):
            raise ValueError(f"Layer '{self.name}': rewards expected shape ({B},) or ({B}, {Tq}), got {r.shape}")
        self._reward = r

    def _attend(self, scores, query, value, value_mask, causal, training):
        B, Tq, S = scores.shape
        weights = _core.masked_softmax_forward(scores.reshape(B, 1, Tq, S), value_mask, causal).reshape(B, Tq, S)
        if training or self.inference == "sample":
            u = backend.rng().random((B, Tq, 1))
            positions = np.minimum((np.cumsum(weights, axis=-1) < u).sum(axis=-1), S - 1)
        else:
            positions = weights.argmax(axis=-1)
        has_source = weights.sum(axis=-1) > 0  # fully masked rows: zero context
        context = np.take_along_axis(value, positions[:, :, None], axis=1) * has_source[:, :, None]
        self.positions = positions
        self._reward = None
        return np.ascontiguousarray(context, dtype=self.dtype), weights, dict(weights=weights, positions=positions,
                                                                               has_source=has_source)

    def _attend_backward(self, dcontext, dweights, value, ac):
        weights, positions, has_source = ac["weights"], ac["positions"], ac["has_source"]
        B, Tq, S = weights.shape
        rows = np.repeat(np.arange(B), Tq)
        dvalue = np.zeros_like(value)
        np.add.at(dvalue, (rows, positions.reshape(-1)), (dcontext * has_source[:, :, None]).reshape(B * Tq, -1))
        if self._reward is None:
            raise RuntimeError(f"Layer '{self.name}': call set_reward(rewards) before backward() (REINFORCE needs "
                               f"the reward of the sampled positions)")
        reward = self._reward
        baseline = float(reward.mean()) if self.baseline is None else self.baseline
        advantage = ((reward - baseline) * has_source).astype(self.dtype)
        onehot = np.zeros_like(weights)
        np.put_along_axis(onehot, positions[:, :, None], 1.0, axis=-1)
        dscores = -advantage[:, :, None] * (onehot - weights)
        if dweights is not None:
            dscores += _core.activation_backward(dweights, weights, weights, "softmax")
        self.baseline = self.baseline_decay * baseline + (1.0 - self.baseline_decay) * float(reward.mean())
        self._reward = None
        return np.ascontiguousarray(dscores), dvalue, None

    def get_config(self):
        config = {**super().get_config(), "inference": self.inference, "baseline_decay": self.baseline_decay}
        config.pop("dropout")
        return config


class AttentionPooling(Layer):
    """The attention layer of the Keras sentiment tutorial: one weight per time step, softmax over
    time, weighted sum of the inputs.

        e_t = tanh(x_t . W + b_t),   a = softmax(e) over time,   output = sum_t a_t x_t

    with W of shape (d, 1) and b of shape (T, 1) (one bias per time step, so T is fixed when the
    layer is built), as in the tutorial. ``length_agnostic=True`` uses a scalar bias (1, 1)
    instead and accepts any T.

    Args:
        return_sequences: output ``x * a`` (B, T, d) instead of the sum (B, d).
        length_agnostic: scalar bias, any sequence length.
        kernel_initializer: the tutorial's "random_normal" (stddev 0.05) by default.
        bias_initializer: "zeros".

    Call arguments:
        inputs: (B, T, d).
        mask: (B, T) bool (True = real step) or lengths (B,); padded steps get weight 0, and a
            fully padded row pools to zeros.
        return_attention_scores: also return the weights a (B, T).

    Output shape:
        (B, d), or (B, T, d) with return_sequences; plus (B, T) weights on request.
    """

    supports_masking = True

    def __init__(self, return_sequences=False, length_agnostic=False, kernel_initializer="random_normal",
                 bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.return_sequences = bool(return_sequences)
        self.length_agnostic = bool(length_agnostic)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, T, features), got shape {input_shape}")
        if not self.length_agnostic and input_shape[1] is None:
            raise ValueError(f"Layer '{self.name}': the per-step bias needs a fixed T, got shape {input_shape}; "
                             f"use AttentionPooling(length_agnostic=True) for variable lengths")
        self.add_weight("kernel", (input_shape[-1], 1), self.kernel_initializer)
        self.add_weight("bias", (1 if self.length_agnostic else input_shape[1], 1), self.bias_initializer)

    def call(self, inputs, training=False, mask=None, return_attention_scores=False):
        kernel = self.params["kernel"]
        x = self._float_input(inputs, ndim=3, last_dim=kernel.shape[0])
        B, T, _ = x.shape
        if not self.length_agnostic and T != self.params["bias"].shape[0]:
            raise ValueError(f"Layer '{self.name}': built for T={self.params['bias'].shape[0]} time steps (bias "
                             f"of shape {self.params['bias'].shape}), got inputs of shape {x.shape}; use "
                             f"AttentionPooling(length_agnostic=True) to accept any length")
        m = attend_mask(mask, B, T, where=f"Layer '{self.name}': `mask`")
        out, weights, energy = _core.attention_pooling_forward(x, kernel, self.params["bias"], m,
                                                               self.return_sequences)
        if training:
            self._cache = dict(x=x, weights=weights, energy=energy, return_weights=return_attention_scores)
        return (out, weights) if return_attention_scores else out

    def backward(self, dy):
        c = self._saved()
        x = c["x"]
        B, T, d = x.shape
        dout, dweights = (dy if c["return_weights"] else (dy, None))
        dout = self._grad_input(dout, (B, T, d) if self.return_sequences else (B, d))
        if dweights is not None:
            dweights = self._grad_input(dweights, (B, T), "dweights")
        return _core.attention_pooling_backward(dout, dweights, c["weights"], c["energy"], x, self.params["kernel"],
                                                self.grads["kernel"], self.grads["bias"], self.return_sequences)

    def compute_mask(self, inputs, mask=None):
        return mask if self.return_sequences else None

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        out = tuple(input_shape) if self.return_sequences else (input_shape[0], input_shape[-1])
        return [out, tuple(input_shape[:2])] if return_attention_scores else out

    def get_config(self):
        return {**super().get_config(), "return_sequences": self.return_sequences,
                "length_agnostic": self.length_agnostic,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer)}
