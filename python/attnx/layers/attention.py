"""Attention: scores -> masked softmax over source positions -> context, in every variant the
tutorials name, with forward and backward in C++.

Functional API (NumPy in, NumPy out; usable without a layer):

- ``scaled_dot_product_attention(query, key, value, mask=None, causal=False, scale=None, heads=1,
  dropout_keep=None)`` -> ``(context, weights)`` and ``scaled_dot_product_attention_backward``:
  the core multi-head attention is built on.
- ``softmax_context(scores, value, mask=None)`` -> ``(context, weights)`` and
  ``softmax_context_backward``: the masked softmax and context for scores from any score function.
- ``attend_mask(mask, batch, source_len, query_len)``: a mask or lengths as the kernels take it.

Masks follow Keras: True = may attend. A query row with nothing to attend to gets zero weights and
a zero context, never NaN.
"""
import math

import numpy as np

from .. import _core, backend, initializers
from .base import Layer

SCORES = ("dot", "scaled_dot", "general", "concat", "additive")


# ----------------------------------------------------------------------------- functional API
def attend_mask(mask, batch, source_len, query_len=None, where="mask"):
    """`mask` as the kernels take it: a C-contiguous bool array (B, S) (key padding) or
    (B, Tq, S) (per query), or None.

    Accepts bool (or 0/1 integer) masks of those shapes and lengths ``(B,)`` (integers: the first
    ``lengths[b]`` source positions are real). Raises ValueError naming `where` otherwise.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype.kind not in "biu":
        raise TypeError(f"{where}: expected a bool mask or integer lengths, got dtype {m.dtype}")
    if m.ndim == 1 and m.dtype.kind in "iu":
        if m.shape != (batch,):
            raise ValueError(f"{where}: lengths expected shape ({batch},), got {m.shape}")
        if m.size and (m.min() < 0 or m.max() > source_len):
            raise ValueError(f"{where}: lengths must lie in [0, {source_len}], got {m.min()}..{m.max()}")
        return np.ascontiguousarray(np.arange(source_len)[None, :] < m[:, None])
    shapes = [(batch, source_len)] + ([(batch, query_len, source_len)] if query_len is not None else [])
    if m.shape not in shapes:
        raise ValueError(f"{where}: expected shape {' or '.join(map(str, shapes))} (True = may attend) or "
                         f"lengths ({batch},), got {m.shape}")
    return np.ascontiguousarray(m != 0 if m.dtype != bool else m)


def _as_float(x, dtype=None):
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=dtype or (np.float64 if x.dtype == np.float64 else np.float32))


def scaled_dot_product_attention(query, key, value, mask=None, causal=False, scale=None, heads=1,
                                 dropout_keep=None):
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

    Returns:
        ``(context (B, Tq, H * Dv), weights (B, H, Tq, S))``; `weights` are the softmax output
        before dropout (what backward needs and what you plot).
    """
    q = _as_float(query)
    k, v = _as_float(key, q.dtype), _as_float(value, q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(max(1, q.shape[-1] // max(1, int(heads))))
    m = attend_mask(mask, q.shape[0], k.shape[1], q.shape[1]) if q.ndim == 3 and k.ndim == 3 else mask
    return _core.sdpa_forward(q, k, v, m, bool(causal), float(scale), int(heads), dropout_keep)


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
    m = attend_mask(mask, s4.shape[0], s4.shape[3], s4.shape[2])
    context, weights = _core.softmax_context_forward(s4, _as_float(value, s.dtype), m, bool(causal), dropout_keep)
    return context, weights.reshape(s.shape)


def softmax_context_backward(dcontext, weights, value, dweights=None, dropout_keep=None):
    """Backward of `softmax_context`: returns ``(dscores, dvalue)``, dscores shaped like `weights`."""
    w = np.asarray(weights)
    w4 = w if w.ndim == 4 else w.reshape(w.shape[0], 1, *w.shape[1:])
    dw4 = None if dweights is None else _as_float(dweights, w.dtype).reshape(w4.shape)
    dscores, dvalue = _core.softmax_context_backward(_as_float(dcontext, w.dtype), w4, _as_float(value, w.dtype),
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
            if mask[0] is not None:
                query_mask = np.asarray(mask[0])
                expected = (B,) if single_step else (B, Tq)
                if query_mask.shape != expected:
                    raise ValueError(f"Layer '{self.name}': `query_mask` expected shape {expected}, "
                                     f"got {query_mask.shape}")
                query_mask = query_mask.reshape(B, Tq).astype(self.dtype)
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

    def get_config(self):
        return {**super().get_config(), "score": self.score, "use_scale": self.use_scale, "units": self.units,
                "normalize": self.normalize, "use_bias": self.use_bias, "dropout": self.dropout,
                "kernel_initializer": initializers.serialize(self.kernel_initializer)}
