"""The attention scores, one object each, in one registry (`SCORES`): what a score computes and
everything that has to agree about it lives together:

- its weights (``build``), forward and backward for the `Attention` family of
  `attnx.layers.attention` (on a layer's params and options: ``use_scale``, ``units``,
  ``use_bias``, ``normalize``);
- its ONNX form (``to_onnx``), which `attnx.export.attention` emits, and the fused decoders' step
  scores (``decoder_onnx``), which `attnx.export.seq2seq` emits;
- its Keras name (Keras' ``Attention(score_mode=...)``), and the C++ ``ScoreKind`` of the fused
  seq2seq decoders (`cpp/include/attnx/seq2seq.hpp`) it runs as there (``decoder_kind``: additive,
  general or dot; None where the decoders do not offer it).

``get(name, owner)`` is the one lookup: an unknown name is a ValueError naming the owner and the
known scores, so a layer or decoder refuses it at construction. `dot_product_scale` is the one
derivation of the 1 / sqrt(d) of scaled dot products (these scores, `scaled_dot_product_attention`,
MultiHeadAttention).

Scores (query q (B, Tq, Dq), key k (B, S, Dk)):

- ``"dot"``: ``q . k`` (Keras' ``score_mode="dot"``); ``"scaled_dot"``: ``q . k / sqrt(Dk)``;
  ``"general"``: ``q^T W_a k``; all three times a learned scalar with ``use_scale``.
- ``"concat"`` (Luong) and ``"additive"`` (Bahdanau): ``v^T tanh(q W_q + b + k W_k)`` with the
  projections kept apart so the (Tq, S) concatenations are never formed; additive has the bias by
  default and may be weight-normalized (``v = g v / ||v||``).
- ``"tanh_sum"``: Keras' ``score_mode="concat"``, ``w * sum(tanh(s (q + k)))`` (scalars w and, with
  ``use_scale``, s); ``"keras_additive"``: Keras' AdditiveAttention, ``sum(v * tanh(q + k))``, v
  the learned (dim,) ``scale`` with ``use_scale``, else ones.
"""
import math

import numpy as np

from .. import initializers, kernels


def dot_product_scale(key_dim):
    """1 / sqrt(key_dim): the scale of a scaled dot product over keys of `key_dim` features."""
    return 1.0 / math.sqrt(max(1, int(key_dim)))


def project(x, kernel, bias=None, activation="linear"):
    """``activation(x . kernel + bias)`` for x (N, C): the projections inside the scores."""
    return kernels.dense_forward(x=x, kernel=kernel, bias=bias, activation=activation)[0]


def project_backward(dy, x, kernel, y, activation, dkernel, dbias=None, need_dx=True):
    """Backward of `project` (y its output): adds into dkernel (and dbias), returns dx or None."""
    # the kernel reads the pre-activation z only for gelu; for the activations used here z is y
    return kernels.dense_backward(dy=dy, x=x, kernel=kernel, y=y, z=y, activation=activation, dkernel=dkernel,
                                  dbias=dbias, need_dx=need_dx)


class Score:
    """One score. Subclasses set the class attributes and implement the methods."""

    name = None
    keras_name = None  # Keras' Attention score_mode that computes this score, if any
    decoder_kind = None  # the fused decoders' C++ ScoreKind, if they offer this score
    same_sizes = False  # query and key must have one size (no projection between them)
    learns_vector = False  # learns its own v: a use_scale multiplier would add nothing
    default_bias = False
    normalizable = False

    def build(self, layer, query_dim, key_dim):
        """Adds the score's weights to `layer` (an Attention-family layer)."""
        if layer.use_scale:
            layer.add_weight("scale", (1,), "ones")

    def forward(self, layer, query, key):
        """(scores (B, Tq, S), what `backward` needs) of query (B, Tq, Dq), key (B, S, Dk)."""
        raise NotImplementedError

    def backward(self, layer, dscores, query, key, cache, need_dx):
        """(dquery, dkey), (None, None) without `need_dx`; adds the score weights' gradients."""
        raise NotImplementedError

    def to_onnx(self, g, layer, query, key):
        """The scores (B, Tq, S) in the ONNX graph `g` (`attnx.export.graph.Graph`)."""
        raise NotImplementedError

    def decoder_onnx(self, g, params, query, keys):
        """The fused decoders' step scores (B, S) in `g` for a query (B, H) and the keys the encoder
        graph projected once (B, S, Dk) (the encoder outputs for dot), from the decoder's `params`."""
        raise NotImplementedError(f"the fused decoders have no {self.name!r} score")

    def __repr__(self):
        return f"<attention score {self.name!r}>"


class DotScore(Score):
    """``scale * (q W) . k``: dot (W = 1, scale 1), scaled_dot (W = 1, scale 1 / sqrt(Dk)), general."""

    def __init__(self, name, scaled=False, projected=False, keras_name=None, decoder_kind=None):
        self.name, self.scaled, self.projected = name, scaled, projected
        self.keras_name, self.decoder_kind = keras_name, decoder_kind
        self.same_sizes = not projected

    def build(self, layer, query_dim, key_dim):
        if self.projected:
            layer.add_weight("kernel", (query_dim, key_dim), layer.kernel_initializer)
        super().build(layer, query_dim, key_dim)

    def _base_scale(self, key_dim):
        return dot_product_scale(key_dim) if self.scaled else 1.0

    def forward(self, layer, query, key):
        B, Tq, Dq = query.shape
        base_scale = self._base_scale(key.shape[-1])
        scale = base_scale * float(layer.params["scale"][0]) if layer.use_scale else base_scale
        projected = query
        if self.projected:  # q^T W_a k = (q W_a) . k, one GEMM over all query rows
            # sizes spelled out, not -1, here and below: a zero-length query or key has none to infer
            projected = project(query.reshape(B * Tq, Dq), layer.params["kernel"]).reshape(B, Tq, key.shape[2])
        scores = kernels.dot_scores_forward(query=projected, key=key, scale=scale)
        return scores, {"projected": projected, "scale": scale, "base_scale": base_scale}

    def backward(self, layer, dscores, query, key, cache, need_dx):
        B, Tq, Dq = query.shape
        dscale = np.zeros(1, layer.dtype) if layer.use_scale else None
        # the kernel has no flag to skip dquery and dkey; general's kernel gradient needs dprojected anyway
        dprojected, dkey = kernels.dot_scores_backward(dscores=dscores, query=cache["projected"], key=key,
                                                       scale=cache["scale"], dscale=dscale)
        if layer.use_scale:  # scores = base * s * q.k; the kernel gave sum(dscores * q.k)
            layer.grads["scale"] += cache["base_scale"] * dscale
        dquery = dprojected
        if self.projected:
            Dk = key.shape[2]
            dquery = project_backward(dprojected.reshape(B * Tq, Dk), query.reshape(B * Tq, Dq),
                                      layer.params["kernel"], cache["projected"].reshape(B * Tq, Dk), "linear",
                                      layer.grads["kernel"], need_dx=need_dx)
            dquery = None if dquery is None else dquery.reshape(B, Tq, Dq)
        return (dquery, dkey) if need_dx else (None, None)

    def to_onnx(self, g, layer, query, key):
        scale = self._base_scale(layer.key_dim)
        if layer.use_scale:
            scale *= float(layer.params["scale"][0])
        projected = g.matmul(query, layer.params["kernel"], hint=layer.name) if self.projected else query
        scores = g.node("MatMul", [projected, g.transpose(key, 0, 2, 1)])
        return scores if scale == 1.0 else g.node("Mul", [scores, g.scalar(scale)])

    def decoder_onnx(self, g, params, query, keys):
        if self.decoder_kind is None:  # scaled_dot
            return super().decoder_onnx(g, params, query, keys)
        # q . keys (general: keys = enc W_k, projected by the encoder graph; dot: keys = enc)
        return g.squeeze(g.node("MatMul", [keys, g.unsqueeze(query, 2)]), 2)


class ProjectedAdditiveScore(Score):
    """``v^T tanh(q W_q + b + k W_k)``: Luong's concat, Bahdanau's additive."""

    learns_vector = True
    decoder_kind = "additive"

    def __init__(self, name, default_bias, normalizable):
        self.name, self.default_bias, self.normalizable = name, default_bias, normalizable

    def build(self, layer, query_dim, key_dim):
        units = layer.units or key_dim
        layer.add_weight("query_kernel", (query_dim, units), layer.kernel_initializer)
        layer.add_weight("key_kernel", (key_dim, units), layer.kernel_initializer)
        if layer.use_bias:
            layer.add_weight("bias", (units,), "zeros")
        layer.add_weight("v", (units, 1), layer.kernel_initializer)
        if layer.normalize:
            layer.add_weight("g", (1,), initializers.Constant(math.sqrt(1.0 / units)))

    @staticmethod
    def vector(layer):
        """The score vector v of `layer` (weight-normalized when normalize=True)."""
        v = layer.params["v"][:, 0]
        if not layer.normalize:
            return np.ascontiguousarray(v)
        return np.ascontiguousarray(layer.params["g"][0] * v / np.linalg.norm(v))

    def forward(self, layer, query, key):
        B, Tq, Dq = query.shape
        S = key.shape[1]
        units = layer.params["key_kernel"].shape[1]
        # W_a [q; k] = W_q q + W_k k: project each side once, combine inside the score kernel
        pq = project(query.reshape(B * Tq, Dq), layer.params["query_kernel"], layer.params.get("bias"))
        pk = project(key.reshape(B * S, key.shape[2]), layer.params["key_kernel"])
        v = self.vector(layer)
        pq, pk = pq.reshape(B, Tq, units), pk.reshape(B, S, units)
        scores, hidden = kernels.additive_scores_forward(pq=pq, pk=pk, v=v)
        return scores, {"hidden": hidden, "v": v, "pq": pq, "pk": pk}

    def backward(self, layer, dscores, query, key, cache, need_dx):
        B, Tq, Dq = query.shape
        S = key.shape[1]
        v = cache["v"]
        dv_used = np.zeros_like(v)
        dpq, dpk = kernels.additive_scores_backward(dscores=dscores, hidden=cache["hidden"], v=v, dv=dv_used)
        self._vector_backward(layer, dv_used)
        units = v.shape[0]
        dquery = project_backward(dpq.reshape(B * Tq, units), query.reshape(B * Tq, Dq), layer.params["query_kernel"],
                                  cache["pq"].reshape(B * Tq, units), "linear", layer.grads["query_kernel"],
                                  layer.grads.get("bias"), need_dx=need_dx)
        dkey = project_backward(dpk.reshape(B * S, units), key.reshape(B * S, key.shape[2]),
                                layer.params["key_kernel"], cache["pk"].reshape(B * S, units), "linear",
                                layer.grads["key_kernel"], need_dx=need_dx)
        if not need_dx:
            return None, None
        return dquery.reshape(B, Tq, Dq), dkey.reshape(B, S, key.shape[2])

    @staticmethod
    def _vector_backward(layer, dv_used):
        """Adds the gradient of the used score vector into v (and g when weight-normalized)."""
        if not layer.normalize:
            layer.grads["v"][:, 0] += dv_used
            return
        v = layer.params["v"][:, 0]
        norm = np.linalg.norm(v)
        direction = v / norm
        # v_used = g * v / |v|: dg = dv_used . v/|v|, dv = g / |v| * (dv_used - (dv_used . v/|v|) v/|v|)
        along = float(dv_used @ direction)
        layer.grads["g"][0] += along
        layer.grads["v"][:, 0] += layer.params["g"][0] / norm * (dv_used - along * direction)

    def to_onnx(self, g, layer, query, key):
        # v . tanh(q W_q + b + k W_k), over (B, Tq, S, U)
        params = layer.params
        pq = g.matmul(query, params["query_kernel"], params.get("bias"), f"{layer.name}/query")
        pk = g.matmul(key, params["key_kernel"], hint=f"{layer.name}/key")
        hidden = g.node("Tanh", [g.node("Add", [g.unsqueeze(pq, 2), g.unsqueeze(pk, 1)])])
        return g.squeeze(g.node("MatMul", [hidden, g.weight(self.vector(layer)[:, None], f"{layer.name}/v")]), 3)

    def decoder_onnx(self, g, params, query, keys):
        # v . tanh(q W_q + b_q + keys), keys = enc W_k projected by the encoder graph
        pq = g.matmul(query, params["query_kernel"], params["query_bias"], "decoder/query")
        hidden = g.node("Tanh", [g.node("Add", [g.unsqueeze(pq, 1), keys])])
        return g.node("MatMul", [hidden, g.weight(params["score_vector"], "decoder/score_vector")])


class TanhSumScore(Score):
    """``v . tanh(s (q + k))`` without projections: Keras' concat score (v = w ones, w the learned
    ``concat_score_weight``, s the learned ``scale`` with use_scale) and Keras' AdditiveAttention
    (v the learned (dim,) ``scale`` with use_scale, else ones; s = 1)."""

    same_sizes = True

    def __init__(self, name, keras_name, vector_scale):
        self.name, self.keras_name, self.vector_scale = name, keras_name, vector_scale

    def build(self, layer, query_dim, key_dim):
        if self.vector_scale:
            if layer.use_scale:
                layer.add_weight("scale", (query_dim,), layer.kernel_initializer)
            return
        super().build(layer, query_dim, key_dim)
        layer.add_weight("concat_score_weight", (1,), "ones")

    def _vector_and_scale(self, layer, dim):
        if self.vector_scale:
            v = layer.params["scale"] if layer.use_scale else np.ones(dim, layer.dtype)
            return v, 1.0
        s = float(layer.params["scale"][0]) if layer.use_scale else 1.0
        return np.full(dim, layer.params["concat_score_weight"][0], dtype=layer.dtype), s

    def forward(self, layer, query, key):
        v, s = self._vector_and_scale(layer, query.shape[2])
        pq, pk = (query, key) if s == 1.0 else (query * query.dtype.type(s), key * key.dtype.type(s))
        scores, hidden = kernels.additive_scores_forward(pq=np.ascontiguousarray(pq), pk=np.ascontiguousarray(pk),
                                                         v=v)
        return scores, {"hidden": hidden, "v": v, "s": s}

    def backward(self, layer, dscores, query, key, cache, need_dx):
        if self.vector_scale:  # the kernel adds dv into the learned vector itself
            dv = layer.grads["scale"] if layer.use_scale else np.zeros_like(cache["v"])
        else:
            dv = np.zeros_like(cache["v"])
        dpq, dpk = kernels.additive_scores_backward(dscores=dscores, hidden=cache["hidden"], v=cache["v"], dv=dv)
        if not self.vector_scale:
            layer.grads["concat_score_weight"] += dv.sum()
            if layer.use_scale:  # pq = s q, pk = s k
                layer.grads["scale"] += np.sum(dpq * query) + np.sum(dpk * key)
        s = cache["s"]
        if not need_dx:
            return None, None
        return (dpq, dpk) if s == 1.0 else (dpq * dpq.dtype.type(s), dpk * dpk.dtype.type(s))

    def to_onnx(self, g, layer, query, key):
        v, s = self._vector_and_scale(layer, layer.key_dim)
        summed = g.node("Add", [g.unsqueeze(query, 2), g.unsqueeze(key, 1)])
        if s != 1.0:
            summed = g.node("Mul", [summed, g.scalar(s)])
        hidden = g.node("Tanh", [summed])
        return g.squeeze(g.node("MatMul", [hidden, g.weight(np.asarray(v)[:, None], f"{layer.name}/v")]), 3)


SCORES = {score.name: score for score in (
    DotScore("dot", keras_name="dot", decoder_kind="dot"),
    DotScore("scaled_dot", scaled=True),
    DotScore("general", projected=True, decoder_kind="general"),
    ProjectedAdditiveScore("concat", default_bias=False, normalizable=False),
    ProjectedAdditiveScore("additive", default_bias=True, normalizable=True),
    TanhSumScore("tanh_sum", keras_name="concat", vector_scale=False),
    TanhSumScore("keras_additive", keras_name=None, vector_scale=True),
)}

# Keras' Attention score_mode names and the scores they are
KERAS_SCORE_MODES = {score.keras_name: name for name, score in SCORES.items() if score.keras_name}


def get(name, owner, allowed=None):
    """The score called `name`, or a ValueError naming `owner` and the scores it may use (`allowed`,
    default every registered one)."""
    allowed = tuple(SCORES) if allowed is None else tuple(allowed)
    if not isinstance(name, str) or name not in allowed:
        raise ValueError(f"{owner}: score must be one of {', '.join(map(repr, allowed))}, got {name!r}")
    return SCORES[name]


def decoder_scores():
    """The scores the fused seq2seq decoders offer (those with a C++ ScoreKind)."""
    return tuple(name for name, score in SCORES.items() if score.decoder_kind is not None)
