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

Masks follow the one rule of `attnx.masking` (Keras: True = may attend; 0/1 integer masks and
lengths too). Masks given to the functional API may also have a leading axis of 1, shared by the
whole batch. A query row with nothing to attend to gets zero weights and a zero context, never NaN.

The layers follow the contract of `attnx.layers.base`: everything one call's backprop needs is in
the cache that call returns, so a layer applied several times keeps each call's state apart.
"""
import numpy as np

from .. import backend, initializers, kernels, random
from ..masking import as_mask
from . import scores
from .base import Layer
from .scores import project as _dense, project_backward as _dense_backward


# ----------------------------------------------------------------------------- functional API
def _as_float(x, dtype=None):
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=dtype or (np.float64 if x.dtype == np.float64 else np.float32))


def _default_scale(query, heads):
    """1 / sqrt(Dk), Dk the per-head size of `query` (B, Tq, H * Dk)."""
    return scores.dot_product_scale(query.shape[-1] // max(1, int(heads)))


def _with_head_axis(scores):
    """Scores (B, Tq, S) as the kernels' (B, H = 1, Tq, S); (B, H, Tq, S) unchanged."""
    return scores if scores.ndim == 4 else scores.reshape(scores.shape[0], 1, *scores.shape[1:])


def _scores_mask(mask, scores4, where):
    B, _, Tq, S = scores4.shape
    return as_mask(mask, B, S, where, queries=Tq, shared=True)


def scaled_dot_product_attention(query, key, value, mask=None, causal=False, scale=None, heads=1,
                                 dropout_keep=None, return_weights=True, bf16=False):
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
        bf16: both products on operands rounded to bfloat16 with float32 sums (the `mixed_bfloat16`
            policy's arithmetic; float32 inputs only); the softmax stays float32.

    Returns:
        ``(context (B, Tq, H * Dv), weights (B, H, Tq, S))``; `weights` are the softmax output
        before dropout (what backward needs and what you plot).
    """
    q = _as_float(query)
    k, v = _as_float(key, q.dtype), _as_float(value, q.dtype)
    if q.ndim == 3 and k.ndim == 3:  # otherwise the binding reports the ranks, before any mask shape
        mask = as_mask(mask, q.shape[0], k.shape[1], "scaled_dot_product_attention: `mask`", queries=q.shape[1],
                       shared=True)
    return kernels.sdpa_forward(query=q, key=k, value=v, mask=mask, causal=bool(causal),
                              scale=_default_scale(q, heads) if scale is None else float(scale), heads=int(heads),
                              dropout_keep=dropout_keep, return_weights=bool(return_weights), bf16=bool(bf16))


def scaled_dot_product_attention_backward(dcontext, weights, query, key, value, scale=None, heads=1, dweights=None,
                                          dropout_keep=None, dscale=None, bf16=False, dropout_stream=None):
    """Backward of `scaled_dot_product_attention`: returns ``(dquery, dkey, dvalue)``.

    `dweights` is the gradient flowing into the returned weights (or None); `dscale`, a (1,) array
    of the input dtype, accumulates the gradient with respect to `scale` (for a learned scale);
    `bf16` as the forward's; `dropout_stream` the forward's (rate, key, first_row) when the kernel drew
    its keep mask (`kernels.sdpa_forward`), in place of `dropout_keep`.
    """
    q = _as_float(query)
    return kernels.sdpa_backward(dcontext=_as_float(dcontext, q.dtype), weights=weights, query=q,
                               key=_as_float(key, q.dtype), value=_as_float(value, q.dtype),
                               scale=_default_scale(q, heads) if scale is None else float(scale), heads=int(heads),
                               dweights=dweights, dropout_keep=dropout_keep, dscale=dscale, bf16=bool(bf16),
                               dropout_stream=dropout_stream)


def softmax_context(scores, value, mask=None, causal=False, dropout_keep=None):
    """Masked softmax over source positions and the context, from any scores.

    scores (B, Tq, S) or (B, H, Tq, S); value (B, S, Dv) (or (B, S, H * Dv)). Returns
    ``(context, weights)`` with weights shaped like `scores`.
    """
    s = _as_float(scores)
    s4 = _with_head_axis(s)
    context, weights = kernels.softmax_context_forward(
        scores=s4, value=_as_float(value, s.dtype), mask=_scores_mask(mask, s4, "softmax_context: `mask`"),
        causal=bool(causal), dropout_keep=dropout_keep)
    return context, weights.reshape(s.shape)


def masked_softmax(scores, mask=None, causal=False):
    """Softmax of scores (B, Tq, S) or (B, H, Tq, S) over the last axis where `mask` allows
    ((B, S), (B, Tq, S), lengths (B,), or a leading 1 for the whole batch); fully masked rows are 0."""
    s = _as_float(scores)
    s4 = _with_head_axis(s)
    return kernels.masked_softmax_forward(scores=s4, mask=_scores_mask(mask, s4, "masked_softmax: `mask`"),
                                        causal=bool(causal)).reshape(s.shape)


def softmax_context_backward(dcontext, weights, value, dweights=None, dropout_keep=None):
    """Backward of `softmax_context`: returns ``(dscores, dvalue)``, dscores shaped like `weights`."""
    w = np.asarray(weights)
    w4 = _with_head_axis(w)
    dw4 = None if dweights is None else _as_float(dweights, w.dtype).reshape(w4.shape)
    dscores, dvalue, _ = kernels.softmax_context_backward(dcontext=_as_float(dcontext, w.dtype), weights=w4,
                                                        value=_as_float(value, w.dtype), dweights=dw4,
                                                        dropout_keep=dropout_keep)
    return dscores.reshape(w.shape), dvalue


def _map_arrays(x, fn):
    """`fn` of `x`, or of each non-None item of a list or tuple `x` (the structure kept)."""
    if isinstance(x, (list, tuple)):
        return type(x)(None if v is None else fn(v) for v in x)
    return fn(x)


def _merge_leading_axes(inputs, mask, name):
    """(inputs, mask, lead): inputs of rank > 3 (Keras: (*batch, T, dim)) with their leading axes `lead`
    merged into one batch axis, masks alike; lead None for inputs of rank <= 3."""
    if not isinstance(inputs, (list, tuple)) or not inputs or np.ndim(inputs[0]) <= 3:
        return inputs, mask, None
    lead = tuple(np.shape(inputs[0])[:-2])
    for x in inputs[1:]:
        if np.ndim(x) != len(lead) + 2 or np.shape(x)[:len(lead)] != lead:
            raise ValueError(f"Layer '{name}': inputs of rank > 3 must share their leading axes {lead} (the query's "
                             f"shape {np.shape(inputs[0])}), got shape {np.shape(x)}")
    merged = [np.reshape(x, (-1,) + np.shape(x)[len(lead):]) for x in inputs]
    if isinstance(mask, (list, tuple)):
        mask = [m if m is None or np.ndim(m) <= len(lead) else np.reshape(m, (-1,) + np.shape(m)[len(lead):])
                for m in mask]
    return merged, mask, lead


# ----------------------------------------------------------------------------- layers

def is_shape(shape, ranks):
    """Whether `shape` is the shape of an array of one of `ranks` (sizes are integers or None), e.g.
    not the () of None, a number, a string or a dict given as inputs, nor a list of shapes."""
    return isinstance(shape, (list, tuple)) and len(shape) in ranks and all(
        d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool)) for d in shape)

class Attention(Layer):
    """Attention of queries over a source sequence: score -> masked softmax -> context.

    ``context = softmax(score(query, key)) . value`` over the source positions, with the scores
    of Luong et al. (2015) and Bahdanau et al. (2015) (each one object of `attnx.layers.scores`):

    - ``"dot"``: ``q . k`` (Keras' Attention).
    - ``"scaled_dot"``: ``q . k / sqrt(d_k)`` (Vaswani et al.).
    - ``"general"``: ``q^T W_a k``, W_a of shape (query size, key size).
    - ``"concat"``: ``v_a^T tanh(W_a [q; k])`` (Luong), W_a kept as a query half and a key half
      so the (Tq, S) concatenations are never formed.
    - ``"additive"``: ``v^T tanh(W1 k + W2 q + b)`` (Bahdanau); ``normalize=True`` is TensorFlow
      Addons' weight-normalized form ``v = g * v / ||v||``.
    - ``"tanh_sum"``: ``w * sum(tanh(s * (q + k)))`` without projections (Keras' ``score_mode="concat"``;
      w the scalar ``concat_score_weight``, s the scalar ``scale`` with ``use_scale``).

    Args:
        use_scale: multiply dot-style scores by a learned scalar (Keras' `use_scale`).
        score_mode: Keras' names: "dot" or "concat" (the "tanh_sum" score).
        dropout: fraction of attention weights dropped during training; the weights returned by
            ``return_attention_scores`` are those after dropout (Keras).
        seed: seed of this layer's dropout draws and samples (default: attnx's stream, `attnx.random`).
        score: attnx's names, one of those above (instead of `score_mode`).
        units: hidden size of the concat / additive scores (default: the key size).
        normalize: weight normalization of `v` (additive score).
        use_bias: the bias b inside the tanh (default: True for additive, False for concat).
        kernel_initializer: for W_a, W1, W2 and v (Keras default glorot_uniform).

    Call arguments:
        inputs: ``[query, value]`` or ``[query, value, key]`` (key defaults to value).
            query (B, Tq, Dq), or (B, Dq) for a single decoder step; value (B, S, Dv); key (B, S, Dk).
        mask: ``[query_mask, value_mask]`` (either may be None), by the rule of `attnx.masking`.
            value_mask (B, S) or (B, Tq, S), True = may attend, or lengths (B,); query_mask
            (B, Tq) (or (B,) for a single-step query) zeroes the context of padded query rows (Keras).
        return_attention_scores: also return the weights: a tuple ``(output, weights)`` (Keras).
        use_causal_mask: query t attends only to source positions s <= t.

    Output shape:
        context (B, Tq, Dv) (or (B, Dv) for a 2-D query); with ``return_attention_scores`` also
        the weights (B, Tq, S) (or (B, S)). A query with nothing to attend to gets zero weights
        and a zero context.

    ``backprop(cache, dy)`` (and ``backward(dy)``) takes the gradient of the context (and, with
    ``return_attention_scores``, a pair ``[dcontext, dweights]``, dweights may be None) and returns
    ``[dquery, dvalue]`` or ``[dquery, dvalue, dkey]``, the order of the inputs.
    """

    def __init__(self, use_scale=False, score_mode="dot", dropout=0.0, seed=None, score=None, units=None,
                 normalize=False, use_bias=None, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        owner = type(self).__name__
        if score_mode not in scores.KERAS_SCORE_MODES:
            raise ValueError(f"{owner}: Invalid value for argument score_mode. Expected one of "
                             "{" + ", ".join(map(repr, scores.KERAS_SCORE_MODES)) + f"}}. Received: score_mode={score_mode!r}")
        if score is None:
            score = scores.KERAS_SCORE_MODES[score_mode]
        elif score_mode != "dot":
            raise ValueError(f"{owner}: give score_mode (Keras' names) or score (attnx's), not both")
        score_function = scores.get(score, owner, self.offered_scores)
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        if units is not None and int(units) <= 0:
            raise ValueError(f"{type(self).__name__}: units must be positive, got {units}")
        if normalize and not score_function.normalizable:
            raise ValueError(f"{owner}: normalize=True applies to score='additive' only")
        if use_scale and score_function.learns_vector:
            raise ValueError(f"{owner}: use_scale applies to dot-style scores; the {score} score already learns v")
        self.score = score
        self.use_scale = bool(use_scale)
        self.units = None if units is None else int(units)
        self.normalize = bool(normalize)
        self.use_bias = score_function.default_bias if use_bias is None else bool(use_bias)
        self.dropout = float(dropout)
        self.seed_generator = random.SeedGenerator(seed, type(self).__name__)
        self.seed = self.seed_generator.seed
        self.kernel_initializer = initializers.get(kernel_initializer)

    # ------------------------------------------------------------------ weights
    def _split_shapes(self, input_shape):
        if not isinstance(input_shape, (list, tuple)) or not input_shape or \
                not isinstance(input_shape[0], (list, tuple)):
            raise ValueError(f"Layer '{self.name}': must be called on a list of inputs, namely [query, value] or "
                             f"[query, value, key], got input shape {input_shape}")
        if len(input_shape) not in (2, 3):
            raise ValueError(f"Layer '{self.name}': inputs must be a list of length 2 or 3 ([query, value] or "
                             f"[query, value, key]), got {len(input_shape)} inputs")
        if not all(isinstance(shape, (list, tuple)) and len(shape) >= low
                   for shape, low in zip(input_shape, (2, 3, 3))):
            raise ValueError(f"Layer '{self.name}': expects inputs [query, value] or [query, value, key] (arrays of "
                             f"shapes (batch, [Tq,] dim), (batch, S, dim)), got input shape {input_shape}")
        q, v = input_shape[0], input_shape[1]
        k = input_shape[2] if len(input_shape) == 3 else v
        return q, v, k

    # the scores a class offers (None: every score of the registry)
    offered_scores = None

    @property
    def score_function(self):
        """The layer's score: its object in the registry of `attnx.layers.scores`."""
        return scores.SCORES[self.score]

    def build(self, input_shape):
        q, _, k = self._split_shapes(input_shape)
        self.query_dim, self.key_dim = q[-1], k[-1]  # the sizes later calls must match
        if self.score_function.same_sizes and self.query_dim != self.key_dim:
            raise ValueError(f"Layer '{self.name}': the {self.score} score needs query and key of the same size, "
                             f"got query (..., {self.query_dim}) and key (..., {self.key_dim}); "
                             f"{self._different_sizes_hint}")
        self.score_function.build(self, self.query_dim, self.key_dim)

    _different_sizes_hint = "use score='general', 'concat' or 'additive' to combine different sizes"

    # ------------------------------------------------------------------ inputs
    per_query_mask = True  # the value mask may be (B, Tq, S) as well as (B, S)

    def _inputs(self, inputs, mask):
        """The call's arrays as (query (B, Tq, Dq), value, key, single_step, query_mask (B, Tq) float or
        None, value_mask bool or None); a single-step query (B, Dq) gets Tq = 1."""
        if not isinstance(inputs, (list, tuple)):
            raise ValueError(f"Layer '{self.name}': must be called on a list of inputs, namely [query, value] or "
                             f"[query, value, key], got {type(inputs).__name__}")
        if len(inputs) not in (2, 3):
            raise ValueError(f"Layer '{self.name}': inputs must be a list of length 2 or 3 ([query, value] or "
                             f"[query, value, key]), got length {len(inputs)}")
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
        if (query.shape[-1], key.shape[-1]) != (self.query_dim, self.key_dim):
            raise ValueError(f"Layer '{self.name}': built for query (..., {self.query_dim}) and key "
                             f"(..., {self.key_dim}), got query {np.shape(inputs[0])} and key {key.shape}")
        query_mask = value_mask = None
        if mask is not None:
            if not isinstance(mask, (list, tuple)):
                raise ValueError(f"Layer '{self.name}': layer mask must be a list [query_mask, value_mask], got "
                                 f"{type(mask).__name__}")
            if len(mask) not in (2, 3):
                raise ValueError(f"Layer '{self.name}': mask must be a list of length 2 or 3 ([query_mask, "
                                 f"value_mask(, key_mask)]), got length {len(mask)}")
            value_mask = as_mask(mask[1], B, S, f"Layer '{self.name}': `value_mask`",
                                 queries=Tq if self.per_query_mask else None)
            query_mask = self._query_mask(mask[0], B, Tq, single_step)
        return query, value, key, single_step, query_mask, value_mask

    def _query_mask(self, mask, batch, steps, single_step):
        """Keras' query mask as a float (B, Tq) multiplier of the context, or None."""
        if mask is None:
            return None
        where = f"Layer '{self.name}': `query_mask`"
        if single_step:  # one flag per row, (B,); as (B, 1) it follows the mask rule like any other
            flags = np.asarray(mask)
            if flags.shape != (batch,):
                raise ValueError(f"{where}: expected shape ({batch},) for a single-step query, got {flags.shape}")
            mask = flags.reshape(batch, 1)
        return as_mask(mask, batch, steps, where).astype(self.dtype)

    def _dropout_keep(self, shape, training):
        """The scaled keep mask of the attention weights for a training call, else None."""
        if not (backend.training_randomness(training) and self.dropout > 0):
            return None
        return self.seed_generator.keep(shape, self.dropout, self.dtype)

    # ------------------------------------------------------- the public spec (export, interop)
    @property
    def query_size(self):
        """The query's feature size the built layer takes."""
        return self.query_dim

    @property
    def key_size(self):
        """The key's feature size the built layer takes (the d of the scaled score's 1/sqrt(d))."""
        return self.key_dim

    def score_vector(self):
        """The concat / additive score's vector v (U,), weight-normalized when normalize=True."""
        return self.score_function.vector(self)

    # ------------------------------------------------------------------ forward
    def _score_forward(self, query, key):
        """scores (B, Tq, S) for query (B, Tq, Dq), key (B, S, Dk), and what _score_backward needs."""
        return self.score_function.forward(self, query, key)

    def _score_backward(self, dscores, query, key, sc, need_dx=True):
        """(dquery, dkey) from the gradient of the scores, (None, None) when the input gradient is not
        needed; adds the score parameters' gradients."""
        return self.score_function.backward(self, dscores, query, key, sc, need_dx)

    def _attend(self, scores, query, value, value_mask, causal, training):
        """Masked softmax and context from the scores: (context, weights (B, Tq, S), cache)."""
        B, Tq, S = scores.shape
        keep = self._dropout_keep((B, 1, Tq, S), training)
        context, weights = kernels.softmax_context_forward(scores=scores.reshape(B, 1, Tq, S), value=value,
                                                         mask=value_mask, causal=causal, dropout_keep=keep)
        dropped = weights if keep is None else weights * keep  # Keras returns the weights after dropout
        return context, dropped.reshape(B, Tq, S), {"keep": keep, "weights": weights}

    def _attend_backward(self, dcontext, dweights, value, ac, need_dx=True):
        """(dscores (B, Tq, S), dvalue, a further dquery or None) from the gradients of the context and
        weights."""
        weights, keep = ac["weights"], ac["keep"]
        dw = None if dweights is None else dweights.reshape(weights.shape)
        if dw is not None and keep is not None:  # the returned weights were weights * keep
            dw = np.ascontiguousarray(dw * keep)
        dscores, dvalue, _ = kernels.softmax_context_backward(dcontext=dcontext, weights=weights, value=value,
                                                            dweights=dw, dropout_keep=ac["keep"])
        return dscores.reshape(dcontext.shape[0], dcontext.shape[1], value.shape[1]), dvalue, None

    def _context(self, inputs, mask, causal, training, **attend_options):
        """One call's context (B, Tq, Dv), weights (B, Tq, S) and state: the arrays its backprop needs."""
        query, value, key, single_step, query_mask, value_mask = self._inputs(inputs, mask)
        scores, score_cache = self._score_forward(query, key)
        context, weights, attend_cache = self._attend(scores, query, value, value_mask, causal, training,
                                                      **attend_options)
        if query_mask is not None:
            context *= query_mask[:, :, None]
        state = {"query": query, "value": value, "key": key, "key_given": len(inputs) == 3,
                 "single_step": single_step, "query_mask": query_mask, "score": score_cache, "attend": attend_cache}
        return context, weights, state

    def _outputs(self, output, weights, state, return_attention_scores, training, extra_outputs=()):
        """``(outputs, cache)`` of a call from its (B, Tq, ...) output and weights; the cache (None unless
        training) records which outputs were returned, for backprop to read their gradients."""
        outputs = [output] + ([weights] if return_attention_scores else []) + list(extra_outputs)
        if state["single_step"]:
            outputs = [o[:, 0] for o in outputs]
        state.update(return_weights=bool(return_attention_scores), n_outputs=len(outputs))
        return (tuple(outputs) if len(outputs) > 1 else outputs[0]), (state if training else None)

    def forward(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False):
        inputs, mask, lead = _merge_leading_axes(inputs, mask, self.name)
        context, weights, state = self._context(inputs, mask, bool(use_causal_mask), training)
        outputs, cache = self._outputs(context, weights, state, return_attention_scores, training)
        if lead is None:
            return outputs, cache
        if cache is not None:
            cache["lead"] = lead
        return _map_arrays(outputs, lambda o: o.reshape(lead + o.shape[1:])), cache

    # ------------------------------------------------------------------ backward
    def _output_grads(self, cache, dy):
        """The gradients of the call's output (B, Tq, out) and weights (B, Tq, S) (or None) from `dy`, the
        structure of the call's outputs."""
        B, Tq, _ = cache["query"].shape
        S = cache["value"].shape[1]
        if cache["n_outputs"] > 1:
            if not isinstance(dy, (list, tuple)) or len(dy) != cache["n_outputs"]:
                raise ValueError(f"Layer '{self.name}': backprop expected a list of {cache['n_outputs']} gradients "
                                 f"(one per output of the call; None for the weights), got {type(dy).__name__}")
            doutput, dweights = dy[0], (dy[1] if cache["return_weights"] else None)
        else:
            doutput, dweights = dy, None
        lead = (B,) if cache["single_step"] else (B, Tq)
        size = self._output_size(cache["value"].shape[2])
        doutput = self._grad_input(doutput, lead + (size,), "dy").reshape(B, Tq, size)
        if dweights is not None:
            dweights = self._grad_input(dweights, lead + (S,), "dweights").reshape(B, Tq, S)
        return doutput, dweights

    def _context_backward(self, cache, dcontext, dweights, dquery_outside=None, need_dx=True):
        """Input gradients (in the order of the inputs) from those of the context (B, Tq, Dv) and weights;
        `dquery_outside` is a gradient of the query that bypassed the attention. None when the layer's
        input gradient is not needed."""
        if cache["query_mask"] is not None:
            dcontext = dcontext * cache["query_mask"][:, :, None]
        dscores, dvalue, dquery_attend = self._attend_backward(dcontext, dweights, cache["value"], cache["attend"],
                                                               need_dx)
        dquery, dkey = self._score_backward(dscores, cache["query"], cache["key"], cache["score"], need_dx)
        if not need_dx:
            return None
        for extra in (dquery_attend, dquery_outside):
            if extra is not None:
                dquery = dquery + extra.reshape(dquery.shape)
        if cache["single_step"]:
            dquery = dquery[:, 0]
        if cache["key_given"]:
            return [dquery, dvalue, dkey]
        return [dquery, dvalue + dkey]

    def backprop(self, cache, dy, need_dx=True):
        lead = cache.get("lead")
        if lead is not None:  # inputs of rank > 3: their leading axes were one batch axis
            dy = _map_arrays(dy, lambda d: np.reshape(d, (-1,) + np.shape(d)[len(lead):]))
        dcontext, dweights = self._output_grads(cache, dy)
        dinputs = self._context_backward(cache, dcontext, dweights, need_dx=need_dx)
        if lead is None or dinputs is None:
            return dinputs
        return [d.reshape(lead + d.shape[1:]) for d in dinputs]

    def compute_mask(self, inputs, mask=None):
        if mask is None or not isinstance(mask, (list, tuple)):
            return None
        return None if mask[0] is None else np.asarray(mask[0])

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        q, v, _ = self._split_shapes(input_shape)
        context = tuple(q[:-1]) + (self._output_size(v[-1]),)
        return [context, tuple(q[:-1]) + (v[-2],)] if return_attention_scores else context

    def _output_size(self, value_size):
        return value_size

    def get_config(self):
        return {**super().get_config(), "score": self.score, "use_scale": self.use_scale, "units": self.units,
                "normalize": self.normalize, "use_bias": self.use_bias, "dropout": self.dropout, "seed": self.seed,
                "kernel_initializer": initializers.serialize(self.kernel_initializer)}


class AdditiveAttention(Attention):
    """Keras' additive attention: ``score = sum(scale * tanh(q + k))`` over the features, without
    projections (query and key of one size); `scale` is a learned (dim,) vector with ``use_scale``
    (Keras' default), else 1. `BahdanauAdditiveAttention` is the form with W1, W2 and v.

    Args:
        use_scale: learn the (dim,) scale (glorot_uniform, as Keras).
        dropout: fraction of attention weights dropped during training.
        seed: seed of the dropout draws.

    Inputs, masks and outputs as `Attention`.
    """

    offered_scores = ("keras_additive",)
    _different_sizes_hint = "BahdanauAdditiveAttention projects different sizes"

    def __init__(self, use_scale=True, dropout=0.0, seed=None, score="keras_additive", **kwargs):
        super().__init__(use_scale=use_scale, dropout=dropout, seed=seed, score=score, **kwargs)

    def get_config(self):
        config = super().get_config()
        for key in ("score", "units", "normalize", "use_bias"):
            config.pop(key)
        return config


class BahdanauAdditiveAttention(Attention):
    """Bahdanau et al. (2015) attention: ``score = v^T tanh(W1 k + W2 q + b)``.

    Unlike Keras' `AdditiveAttention` (which adds query and key without projections), query and
    key are projected to `units`, so they may have different sizes.

    Args:
        units: hidden size of the score (default: the key size).
        normalize: TensorFlow Addons' weight normalization ``v = g * v / ||v||`` (g learned,
            initialized to sqrt(1 / units)).
        use_bias: the bias b inside the tanh.
        dropout: fraction of attention weights dropped during training.

    Inputs, masks and outputs as `Attention`.
    """

    offered_scores = ("additive",)

    def __init__(self, units=None, normalize=False, use_bias=True, dropout=0.0, score="additive", **kwargs):
        super().__init__(score=score, units=units, normalize=normalize, use_bias=use_bias, dropout=dropout,
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

    offered_scores = ("dot", "general", "concat")

    def __init__(self, score="general", attentional_units=None, units=None, dropout=0.0, **kwargs):
        if attentional_units is not None and int(attentional_units) <= 0:
            raise ValueError(f"LuongAttention: attentional_units must be positive, got {attentional_units}")
        super().__init__(score=score, units=units, dropout=dropout, **kwargs)
        self.attentional_units = None if attentional_units is None else int(attentional_units)

    def build(self, input_shape):
        super().build(input_shape)
        if self.attentional_units:
            q, v, _ = self._split_shapes(input_shape)
            self.add_weight("attentional_kernel", (v[-1] + q[-1], self.attentional_units), self.kernel_initializer)

    def forward(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False):
        context, weights, state = self._context(inputs, mask, bool(use_causal_mask), training)
        output = context
        if self.attentional_units:
            B, Tq, _ = context.shape
            joined = np.concatenate([context, state["query"]], axis=-1)
            joined = joined.reshape(B * Tq, joined.shape[2])
            attentional = _dense(joined, self.params["attentional_kernel"], activation="tanh")
            state.update(joined=joined, attentional=attentional)
            output = attentional.reshape(B, Tq, self.attentional_units)
        return self._outputs(output, weights, state, return_attention_scores, training)

    def backprop(self, cache, dy, need_dx=True):
        doutput, dweights = self._output_grads(cache, dy)
        if not self.attentional_units:
            return self._context_backward(cache, doutput, dweights, need_dx=need_dx)
        B, Tq = cache["query"].shape[:2]
        Dv = cache["value"].shape[2]
        # h~ = tanh([c; h] W_c): split the gradient of [c; h] back into the context and the query
        djoined = _dense_backward(doutput.reshape(B * Tq, self.attentional_units), cache["joined"],
                                  self.params["attentional_kernel"],
                                  cache["attentional"], "tanh", self.grads["attentional_kernel"])
        dcontext = np.ascontiguousarray(djoined[:, :Dv].reshape(B, Tq, Dv))
        return self._context_backward(cache, dcontext, dweights, dquery_outside=djoined[:, Dv:], need_dx=need_dx)

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

    offered_scores = ("dot", "general", "concat")

    def __init__(self, window, mode="local-p", score="general", position_units=None, units=None, dropout=0.0,
                 **kwargs):
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
            raise ValueError(f"LocalAttention: window D must be an integer >= 0, got {window!r}")
        if mode not in ("local-m", "local-p"):
            raise ValueError(f"LocalAttention: mode must be 'local-m' or 'local-p', got {mode!r}")
        super().__init__(score=score, units=units, dropout=dropout, **kwargs)
        self.window, self.mode = int(window), mode
        self.position_units = None if position_units is None else int(position_units)

    def build(self, input_shape):
        super().build(input_shape)
        if self.mode == "local-p":
            units = self.position_units or self.query_dim
            self.add_weight("position_kernel", (self.query_dim, units), self.kernel_initializer)
            self.add_weight("position_v", (units, 1), self.kernel_initializer)

    per_query_mask = False  # the window is placed within each row's real length, read from a (B, S) mask

    def forward(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False,
                positions=None):
        if positions is not None and self.mode != "local-m":
            raise ValueError(f"Layer '{self.name}': `positions` applies to mode='local-m'; local-p predicts them")
        context, weights, state = self._context(inputs, mask, bool(use_causal_mask), training, positions=positions)
        return self._outputs(context, weights, state, return_attention_scores, training)

    def _aligned_positions(self, query, lengths, positions):
        """p (B, Tq) and, for local-p, the activations its backward needs."""
        B, Tq, Dq = query.shape
        if self.mode == "local-m":
            if positions is None:
                p = np.broadcast_to(np.arange(Tq), (B, Tq))
            else:
                p = np.asarray(positions)
                if p.size != B * Tq:
                    raise ValueError(f"Layer '{self.name}': `positions` expected shape ({B}, {Tq}), got {p.shape}")
                p = p.reshape(B, Tq)
            last = np.maximum(lengths - 1, 0)[:, None]
            return np.ascontiguousarray(np.clip(p, 0, last), dtype=self.dtype), None
        q2 = query.reshape(B * Tq, Dq)
        hidden = _dense(q2, self.params["position_kernel"], activation="tanh")
        gate = _dense(hidden, self.params["position_v"], activation="sigmoid")
        p = np.ascontiguousarray(lengths[:, None] * gate.reshape(B, Tq), dtype=self.dtype)
        return p, {"q2": q2, "hidden": hidden, "gate": gate}

    def _attend(self, scores, query, value, value_mask, causal, training, positions=None):
        B, Tq, S = scores.shape
        lengths = (np.full(B, S) if value_mask is None else value_mask.sum(axis=1)).astype(self.dtype)
        p, position_cache = self._aligned_positions(query, lengths, positions)
        allowed, gauss = kernels.local_window_forward(positions=p, source_len=S, window=self.window,
                                                    source_mask=value_mask)
        keep = self._dropout_keep((B, 1, Tq, S), training)
        multiplier = gauss if keep is None else gauss * keep
        context, align = kernels.softmax_context_forward(scores=scores.reshape(B, 1, Tq, S), value=value, mask=allowed,
                                                       causal=causal, dropout_keep=multiplier)
        weights = align * gauss
        return context, weights.reshape(B, Tq, S), {"p": p, "gauss": gauss, "align": align, "keep": keep,
                                                    "multiplier": multiplier, "lengths": lengths,
                                                    "position": position_cache}

    def _attend_backward(self, dcontext, dweights, value, ac, need_dx=True):
        gauss, align = ac["gauss"], ac["align"]
        B, _, Tq, S = align.shape
        dw = None if dweights is None else dweights.reshape(B, 1, Tq, S)
        # weights = align * gauss, and the context used align * gauss * keep
        dscores, dvalue, dmultiplier = kernels.softmax_context_backward(
            dcontext=dcontext, weights=align, value=value, dweights=None if dw is None else np.ascontiguousarray(
                dw * gauss), dropout_keep=ac["multiplier"], need_dkeep=True)
        dscores = dscores.reshape(B, Tq, S)
        if self.mode == "local-m":
            return dscores, dvalue, None
        dgauss = dmultiplier if ac["keep"] is None else dmultiplier * ac["keep"]
        if dw is not None:
            dgauss = dgauss + dw * align
        dp = kernels.local_window_backward(dgauss=np.ascontiguousarray(dgauss), gauss=gauss, positions=ac["p"],
                                         window=self.window)
        pc = ac["position"]
        # p = S_b * sigmoid(v_p . tanh(W_p h))
        dgate = np.ascontiguousarray((dp * ac["lengths"][:, None]).reshape(-1, 1), dtype=self.dtype)
        dhidden = _dense_backward(dgate, pc["hidden"], self.params["position_v"], pc["gate"], "sigmoid",
                                  self.grads["position_v"])
        dquery = _dense_backward(dhidden, pc["q2"], self.params["position_kernel"], pc["hidden"], "tanh",
                                 self.grads["position_kernel"], need_dx=need_dx)
        return dscores, dvalue, dquery

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
    ``layer.set_reward(rewards, cache)`` with rewards (B,) or (B, Tq) of that training call (higher
    is better, e.g. -loss or 1 for a correct prediction) **before** its backprop (``cache``
    defaults to the last ``layer(..., training=True)`` call, for ``backward``). Each call's
    advantage uses the baseline of the time of the call; each backprop then updates
    ``b <- decay * b + (1 - decay) * mean(R)``.

    Args:
        score: any `Attention` score.
        inference: "argmax" (default) or "sample".
        baseline_decay: decay of the moving-average reward baseline.
        **kwargs: the other arguments of `Attention` (no dropout).

    Call arguments as `Attention`, plus ``return_positions``: also return the chosen positions
    (B, Tq) (or (B,)), integers, after the weights when those are returned too (their gradient is
    ignored).

    Output: the context (and the soft weights with ``return_attention_scores=True``). A query
    with nothing to attend to gets a zero context.
    """

    @property
    def _deterministic(self):
        return self.inference != "sample"  # sampling draws in inference too

    def __init__(self, score="dot", inference="argmax", baseline_decay=0.9, **kwargs):
        if inference not in ("argmax", "sample"):
            raise ValueError(f"HardAttention: inference must be 'argmax' or 'sample', got {inference!r}")
        if not 0.0 <= float(baseline_decay) < 1.0:
            raise ValueError(f"HardAttention: baseline_decay must be in [0, 1), got {baseline_decay}")
        super().__init__(score=score, **kwargs)
        self.inference, self.baseline_decay = inference, float(baseline_decay)
        self.baseline = None  # the moving average of the rewards: learned state, like a batch norm's statistics

    def forward(self, inputs, training=False, mask=None, return_attention_scores=False, use_causal_mask=False,
                return_positions=False):
        context, weights, state = self._context(inputs, mask, bool(use_causal_mask), training)
        positions = [state["attend"]["positions"]] if return_positions else []
        return self._outputs(context, weights, state, return_attention_scores, training, positions)

    def set_reward(self, rewards, cache=None):
        """Rewards (B,) or (B, Tq) of the positions sampled by the training call that returned `cache`
        (default: the last ``layer(..., training=True)``)."""
        cache = self._cache if cache is None else cache
        if cache is None:
            raise RuntimeError(f"Layer '{self.name}': set_reward() needs a forward pass with training=True first")
        B, Tq = cache["attend"]["positions"].shape
        r = np.asarray(rewards, dtype=np.float64)
        if r.shape == (B,):
            r = np.repeat(r[:, None], Tq, axis=1)
        if r.shape != (B, Tq):
            raise ValueError(f"Layer '{self.name}': rewards expected shape ({B},) or ({B}, {Tq}), got {r.shape}")
        cache["attend"]["reward"] = r

    def _attend(self, scores, query, value, value_mask, causal, training):
        B, Tq, S = scores.shape
        if S == 0:
            raise ValueError(f"Layer '{self.name}': hard attention picks one of the value's positions; got a value "
                             f"of length 0 (shape {value.shape})")
        weights = kernels.masked_softmax_forward(scores=scores.reshape(B, 1, Tq, S), mask=value_mask,
                                               causal=causal).reshape(B, Tq, S)
        if backend.training_randomness(training) or self.inference == "sample":
            u = self.seed_generator.uniform((B, Tq, 1), np.float64)
            positions = np.minimum((np.cumsum(weights, axis=-1) < u).sum(axis=-1), S - 1)
        else:
            positions = weights.argmax(axis=-1)
        has_source = weights.sum(axis=-1) > 0  # fully masked rows: zero context
        context = np.take_along_axis(value, positions[:, :, None], axis=1) * has_source[:, :, None]
        return np.ascontiguousarray(context, dtype=self.dtype), weights, {
            "weights": weights, "positions": positions, "has_source": has_source, "baseline": self.baseline}

    def _attend_backward(self, dcontext, dweights, value, ac, need_dx=True):
        if "reward" not in ac:
            raise RuntimeError(f"Layer '{self.name}': call set_reward(rewards, cache) before this call's backprop "
                               f"(REINFORCE needs the reward of the sampled positions)")
        weights, positions, has_source, reward = ac["weights"], ac["positions"], ac["has_source"], ac["reward"]
        B, Tq, _ = weights.shape
        rows = np.repeat(np.arange(B), Tq)
        dvalue = np.zeros_like(value)
        np.add.at(dvalue, (rows, positions.reshape(-1)),
                  (dcontext * has_source[:, :, None]).reshape(B * Tq, dcontext.shape[2]))
        mean_reward = float(reward.mean())
        baseline = mean_reward if ac["baseline"] is None else ac["baseline"]
        advantage = ((reward - baseline) * has_source).astype(self.dtype)
        onehot = np.zeros_like(weights)
        np.put_along_axis(onehot, positions[:, :, None], 1.0, axis=-1)
        dscores = -advantage[:, :, None] * (onehot - weights)
        if dweights is not None:
            dscores += kernels.activation_backward(dy=dweights, x=weights, y=weights, activation="softmax")
        running = mean_reward if self.baseline is None else self.baseline
        self.baseline = self.baseline_decay * running + (1.0 - self.baseline_decay) * mean_reward
        return np.ascontiguousarray(dscores), dvalue, None

    def compute_output_shape(self, input_shape, return_attention_scores=False, return_positions=False):
        shape = super().compute_output_shape(input_shape, return_attention_scores)
        if not return_positions:
            return shape
        positions = tuple(self._split_shapes(input_shape)[0][:-1])
        return (shape if return_attention_scores else [shape]) + [positions]

    def get_config(self):
        config = {**super().get_config(), "inference": self.inference, "baseline_decay": self.baseline_decay}
        config.pop("dropout")
        return config
