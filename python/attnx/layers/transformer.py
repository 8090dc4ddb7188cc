"""Transformer blocks: layer normalization, positional encodings, the position-wise feed-forward
network, multi-head attention, and encoder / decoder layers and stacks.

The math runs in C++ (`transformer.hpp`, `attention.hpp`, `dense.hpp`); these classes check
inputs, lay out buffers and chain the backward passes. Composite layers (FeedForward, the encoder
and decoder layers and their stacks) expose their sublayers' weights in their own ``params`` /
``grads`` under ``"<sublayer>/<weight>"`` names, sharing the same arrays.

Masks follow Keras: bool, True = real token / may attend. A padding mask ``(batch, S)`` may also be
given as lengths ``(batch,)`` of ints. A query that may attend to nothing gets zero attention
weights (and so only the output bias), never NaN.
"""
import numpy as np

from .. import _core, activations, backend, initializers
from .attention import (attend_mask, scaled_dot_product_attention,
                        scaled_dot_product_attention_backward)
from .base import Layer
from .core import Dense


def _dropout_keep(shape, rate, dtype):
    """A scaled dropout mask (entries 0 or 1 / (1 - rate)) drawn in C++ from a seed of attnx's
    generator, or None when rate is 0."""
    if rate == 0.0:
        return None
    return _core.dropout_keep(list(shape), rate, int(backend.rng().integers(0, 2 ** 63)), dtype)


class _Composite(Layer):
    """A layer made of sublayers whose weights it exposes as its own, "<prefix>/<name>"."""

    def _output_grad(self, dy, shape):
        """The output's gradient; with return_attention_scores, dy may be (doutput, None, ...):
        gradients into the returned weights are only taken by MultiHeadAttention itself."""
        if isinstance(dy, (list, tuple)):
            if any(d is not None for d in dy[1:]):
                raise ValueError(f"Layer '{self.name}': backward takes no gradient for the returned attention "
                                 "weights; pass (doutput, None)")
            dy = dy[0]
        return self._grad_input(dy, shape)

    def _add_sublayer(self, prefix, layer, input_shape):
        layer.build(input_shape)
        layer.built = True
        for name in layer.params:
            self.params[f"{prefix}/{name}"] = layer.params[name]
            self.grads[f"{prefix}/{name}"] = layer.grads[name]
        return layer


# ---------------------------------------------------------------------------- normalization
class LayerNormalization(Layer):
    """Normalizes each position over its features: ``gamma * (x - mean) / sqrt(var + epsilon) + beta``.

    Args:
        epsilon: added to the variance; Keras' default 1e-3, PyTorch's nn.LayerNorm 1e-5.
        center: learn the shift `beta`.
        scale: learn the scale `gamma`.
        beta_initializer, gamma_initializer: Keras defaults zeros and ones.

    Input shape: ``(batch, ..., features)``. Output shape: the same.
    Weights (Keras order): gamma ``(features,)``, beta ``(features,)``.
    """

    supports_masking = True

    def __init__(self, epsilon=1e-3, center=True, scale=True, beta_initializer="zeros", gamma_initializer="ones",
                 axis=-1, **kwargs):
        super().__init__(**kwargs)
        if axis not in (-1,):
            raise ValueError(f"LayerNormalization: only axis=-1 (the feature axis) is supported, got {axis}")
        if not float(epsilon) > 0:
            raise ValueError(f"LayerNormalization: epsilon must be positive, got {epsilon}")
        self.epsilon = float(epsilon)
        self.center, self.scale = bool(center), bool(scale)
        self.beta_initializer = initializers.get(beta_initializer)
        self.gamma_initializer = initializers.get(gamma_initializer)
        self.features = None

    def build(self, input_shape):
        if len(input_shape) < 1 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, ..., features) with known features, "
                             f"got shape {input_shape}")
        self.features = int(input_shape[-1])
        if self.scale:
            self.add_weight("gamma", (self.features,), self.gamma_initializer)
        if self.center:
            self.add_weight("beta", (self.features,), self.beta_initializer)

    def call(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=2, last_dim=self.features)
        x2 = x.reshape(-1, self.features)
        y, mean, rstd = _core.layernorm_forward(x2, self.params.get("gamma"), self.params.get("beta"), self.epsilon)
        if training:
            self._cache = (x2, mean, rstd, x.shape)
        return y.reshape(x.shape)

    def backward(self, dy):
        x2, mean, rstd, shape = self._saved()
        dy = self._grad_input(dy, shape).reshape(x2.shape)
        dx = _core.layernorm_backward(dy, x2, mean, rstd, self.params.get("gamma"), self.grads.get("gamma"),
                                      self.grads.get("beta"))
        return dx.reshape(shape)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon, "center": self.center, "scale": self.scale,
                "beta_initializer": initializers.serialize(self.beta_initializer),
                "gamma_initializer": initializers.serialize(self.gamma_initializer)}


# ---------------------------------------------------------------------------- positions
class PositionalEncoding(Layer):
    """Adds the fixed sinusoidal position encoding of Vaswani et al. (2017) to a sequence:
    ``output[b, t, 2i] = inputs[b, t, 2i] + sin(t / max_wavelength^(2i / D))`` and cos on the odd
    features. No weights; any sequence length.

    Args:
        max_wavelength: the base of the geometric progression of wavelengths (10000 in the paper).

    Input shape: ``(batch, T, D)``. Output shape: the same. The mask passes through.
    """

    supports_masking = True

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = float(max_wavelength)
        self._table = np.zeros((0, 0), dtype=self.dtype)

    def table(self, length, dim):
        """The (length, dim) encoding, recomputed only when a longer sequence or new size arrives."""
        if self._table.shape[0] < length or self._table.shape[1] != dim:
            self._table = _core.sinusoidal_table(length, dim, self.dtype, self.max_wavelength)
        return self._table

    def call(self, inputs, training=False):
        x = self._float_input(inputs, ndim=3)
        y = _core.add_positions_forward(x, self.table(x.shape[1], x.shape[2]))
        if training:
            self._cache = x.shape
        return y

    def backward(self, dy):
        return self._grad_input(dy, self._saved())

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "max_wavelength": self.max_wavelength}


class PositionEmbedding(Layer):
    """Adds a learned embedding of each position to a sequence: ``output[b, t] = inputs[b, t] + embeddings[t]``.

    Args:
        sequence_length: the longest sequence the table covers; longer inputs raise ValueError.
        initializer: for the table (Keras' default glorot_uniform).

    Input shape: ``(batch, T, D)`` with T <= sequence_length. Output shape: the same.
    Weights: embeddings ``(sequence_length, D)``.
    """

    supports_masking = True

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if int(sequence_length) <= 0:
            raise ValueError(f"PositionEmbedding: sequence_length must be positive, got {sequence_length}")
        self.sequence_length = int(sequence_length)
        self.initializer = initializers.get(initializer)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, T, features) with known features, "
                             f"got shape {input_shape}")
        self.add_weight("embeddings", (self.sequence_length, input_shape[-1]), self.initializer)

    def call(self, inputs, training=False):
        table = self.params["embeddings"]
        x = self._float_input(inputs, ndim=3, last_dim=table.shape[1])
        if x.shape[1] > self.sequence_length:
            raise ValueError(f"Layer '{self.name}': `inputs` has {x.shape[1]} positions (shape {x.shape}), more "
                             f"than the table's sequence_length={self.sequence_length}")
        y = _core.add_positions_forward(x, table)
        if training:
            self._cache = x.shape
        return y

    def backward(self, dy):
        shape = self._saved()
        dy = self._grad_input(dy, shape)
        _core.add_positions_backward(self.grads["embeddings"], dy)
        return dy

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length,
                "initializer": initializers.serialize(self.initializer)}


# ---------------------------------------------------------------------------- feed-forward
class FeedForward(_Composite):
    """The position-wise feed-forward network of a transformer layer:
    ``output = dropout(activation(inputs @ W1 + b1)) @ W2 + b2``.

    Args:
        intermediate_dim: width of the hidden layer.
        activation: "relu" (default) or "gelu" (any attnx activation).
        dropout: rate of the dropout on the hidden activations (PyTorch's placement).
        output_dim: size of the output's last axis (default: the input's).

    Input shape: ``(batch, ..., D)``. Output shape: ``(batch, ..., output_dim or D)``.
    Weights: intermediate/kernel ``(D, intermediate_dim)``, intermediate/bias, output/kernel, output/bias.
    """

    supports_masking = True

    def __init__(self, intermediate_dim, activation="relu", dropout=0.0, output_dim=None, **kwargs):
        super().__init__(**kwargs)
        if int(intermediate_dim) <= 0:
            raise ValueError(f"FeedForward: intermediate_dim must be positive, got {intermediate_dim}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"FeedForward: dropout must be in [0, 1), got {dropout}")
        self.intermediate_dim = int(intermediate_dim)
        self.activation = activations.get(activation)
        self.dropout = float(dropout)
        self.output_dim = None if output_dim is None else int(output_dim)

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs a known feature size, got shape {input_shape}")
        out_dim = self.output_dim or input_shape[-1]
        self.intermediate_dense = self._add_sublayer(
            "intermediate", Dense(self.intermediate_dim, self.activation, dtype=self.dtype,
                                  name=f"{self.name}/intermediate"), input_shape)
        self.output_dense = self._add_sublayer(
            "output", Dense(out_dim, dtype=self.dtype, name=f"{self.name}/output"),
            tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, inputs, training=False):
        if not training:  # one kernel, blocks of rows: the (batch, ..., intermediate_dim) hidden is never stored
            x = self._float_input(inputs, min_ndim=2, last_dim=self.intermediate_dense.params["kernel"].shape[0])
            inner, outer = self.intermediate_dense.params, self.output_dense.params
            y = _core.feed_forward_forward(x.reshape(-1, x.shape[-1]), inner["kernel"], inner.get("bias"),
                                           outer["kernel"], outer.get("bias"), self.activation)
            return y.reshape(x.shape[:-1] + (y.shape[-1],))
        hidden = self.intermediate_dense(inputs, training=training)
        keep = _dropout_keep(hidden.shape, self.dropout, self.dtype) if training else None
        if keep is not None:
            hidden = _core.apply_keep(hidden, keep)
        if training:
            self._cache = (keep,)
        return self.output_dense(hidden, training=training)

    def backward(self, dy):
        keep, = self._saved()
        dhidden = self.output_dense.backward(dy)
        if keep is not None:
            dhidden = _core.apply_keep(dhidden, keep)
        return self.intermediate_dense.backward(dhidden)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "activation": self.activation,
                "dropout": self.dropout, "output_dim": self.output_dim}


# ---------------------------------------------------------------------------- masks
def _attention_mask(layer, mask, batch, target_len, source_len, arg):
    """A (batch, target_len, source_len) bool mask from (batch, T, S) or a shared (T, S), or None."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"Layer '{layer.name}': `{arg}` must be a bool mask with True = may attend "
                        f"(additive float masks are not supported); got dtype {m.dtype}")
    if m.shape == (target_len, source_len):
        m = np.broadcast_to(m, (batch, target_len, source_len))
    elif m.shape != (batch, target_len, source_len):
        raise ValueError(f"Layer '{layer.name}': `{arg}` expected shape ({batch}, {target_len}, {source_len}) or "
                         f"({target_len}, {source_len}), got {m.shape}")
    return np.ascontiguousarray(m)


def _combine_masks(attention_mask, padding_mask):
    """The one mask the attention kernel takes: (B, S) padding, (B, T, S) full, or their AND."""
    if attention_mask is None:
        return padding_mask
    if padding_mask is None:
        return attention_mask
    return attention_mask & padding_mask[:, None, :]


def _with_weights(out, returned):
    """A sublayer's (output, weights), from a call that returned weights only when asked: the
    weights of every head are only written out when someone will read them."""
    return out if returned else (out, None)


def _linear_backward(dy2, x2, kernel, dkernel, dbias, need_dx=True):
    """Backward of a linear projection (2-D views); a linear activation reads neither y nor z,
    so dy stands in for both."""
    return _core.dense_backward(dy2, x2, kernel, dy2, dy2, "linear", dkernel, dbias, need_dx)


# ---------------------------------------------------------------------------- attention
class MultiHeadAttention(Layer):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017) with Keras' signature.

    Each head h projects ``q_h = query @ Wq_h + bq_h`` (and k_h, v_h likewise), attends with
    ``softmax(q_h k_h^T / sqrt(key_dim)) v_h`` and the concatenated heads are projected to the
    output. The attention core is `attnx.layers.attention.scaled_dot_product_attention` (one
    kernel call for all batch rows and heads, reading the projections in place).

    Args:
        num_heads: number of heads.
        key_dim: size of each head's query and key.
        value_dim: size of each head's value (default key_dim).
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_shape: size of the output's last axis (default: the query's).
        kernel_initializer, bias_initializer: Keras defaults glorot_uniform and zeros.

    Call arguments:
        query: ``(batch, T, query_dim)``; or a list ``[query, value]`` / ``[query, value, key]``.
        value: ``(batch, S, value_dim_in)``.
        key: ``(batch, S, key_dim_in)``; default: value.
        attention_mask: bool ``(batch, T, S)`` or ``(T, S)``, True = query t may attend to key s.
        key_padding_mask: bool ``(batch, S)`` (True = real token) or lengths ``(batch,)``.
        use_causal_mask: query t attends only to keys s <= t.
        return_attention_scores: also return the per-head weights ``(batch, num_heads, T, S)``.
        training: apply dropout and keep what backward needs.

    Output shape: ``(batch, T, output_shape or query_dim)``.
    Weights (Keras order and shapes): query_kernel ``(query_dim, heads, key_dim)``, query_bias
    ``(heads, key_dim)``, key_kernel, key_bias, value_kernel ``(value_dim_in, heads, value_dim)``,
    value_bias, output_kernel ``(heads, value_dim, out)``, output_bias ``(out,)``.
    ``backward(dy)`` (dy may be ``(doutput, dweights)``) returns ``[dquery, dvalue]``, or
    ``[dquery, dvalue, dkey]`` when a key was given; with no key, dvalue includes the key's path.
    """

    def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True, output_shape=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if int(num_heads) <= 0 or int(key_dim) <= 0 or (value_dim is not None and int(value_dim) <= 0):
            raise ValueError(f"MultiHeadAttention: num_heads, key_dim and value_dim must be positive, got "
                             f"{num_heads}, {key_dim}, {value_dim}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        self.num_heads, self.key_dim = int(num_heads), int(key_dim)
        self.value_dim = int(value_dim) if value_dim is not None else self.key_dim
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.output_shape = None if output_shape is None else int(output_shape)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)

    def __call__(self, query, value=None, key=None, **kwargs):
        # Keras-style call layer(query, value, key): build from all three shapes (Layer.__call__
        # alone would see only the query's), on arrays and on a model's symbolic tensors alike.
        if not self.built and value is not None and not isinstance(query, (list, tuple)):
            self.build([tuple(t.shape) for t in (query, value, key) if t is not None])
            self.built = True
        args = (value,) if key is None else (value, key)
        return super().__call__(query, *(args if value is not None else ()), **kwargs)

    def build(self, input_shape):
        """Creates the weights for [query, value] or [query, value, key] shapes."""
        if not isinstance(input_shape, list) or not 2 <= len(input_shape) <= 3:
            raise ValueError(f"Layer '{self.name}': call with (query, value[, key]) or [query, value[, key]], "
                             f"got input shape {input_shape}")
        shapes = list(input_shape) + [input_shape[1]] * (3 - len(input_shape))
        self.build_from_dims(shapes[0][-1], shapes[1][-1], shapes[2][-1])

    def build_from_dims(self, query_dim, value_dim, key_dim):
        """Creates the weights for inputs with these feature sizes."""
        H, dk, dv = self.num_heads, self.key_dim, self.value_dim
        out = self.output_shape or query_dim
        for name, in_dim, head_dim in (("query", query_dim, dk), ("key", key_dim, dk), ("value", value_dim, dv)):
            self.add_weight(f"{name}_kernel", (in_dim, H, head_dim), self.kernel_initializer)
            if self.use_bias:
                self.add_weight(f"{name}_bias", (H, head_dim), self.bias_initializer)
        self.add_weight("output_kernel", (H, dv, out), self.kernel_initializer)
        if self.use_bias:
            self.add_weight("output_bias", (out,), self.bias_initializer)

    @staticmethod
    def _matrix(name, kernel):
        """The Keras-shaped kernel as the (in, out) matrix dense_forward takes (a view)."""
        return kernel.reshape(-1, kernel.shape[-1]) if name == "output" else kernel.reshape(kernel.shape[0], -1)

    def _project(self, name, x2):
        bias = self.params.get(f"{name}_bias")
        return _core.dense_forward(x2, self._matrix(name, self.params[f"{name}_kernel"]),
                                   None if bias is None else bias.reshape(-1), "linear")[0]

    def _project_backward(self, name, dy2, x2):
        dbias = self.grads.get(f"{name}_bias")
        return _linear_backward(dy2, x2, self._matrix(name, self.params[f"{name}_kernel"]),
                                self._matrix(name, self.grads[f"{name}_kernel"]),
                                None if dbias is None else dbias.reshape(-1))

    def call(self, query, value=None, key=None, attention_mask=None, key_padding_mask=None, use_causal_mask=False,
             return_attention_scores=False, training=False):
        if isinstance(query, (list, tuple)):
            if not 2 <= len(query) <= 3 or value is not None:
                raise ValueError(f"Layer '{self.name}': call with [query, value] or [query, value, key], got "
                                 f"{len(query)} inputs")
            query, value, key = (list(query) + [None])[:3]
        if value is None:
            raise ValueError(f"Layer '{self.name}': needs a value (self-attention: layer(x, x))")
        has_key = key is not None
        q_in = self._float_input(query, "query", ndim=3)
        v_in = self._float_input(value, "value", ndim=3)
        k_in = self._float_input(key, "key", ndim=3) if has_key else v_in
        B, T = q_in.shape[:2]
        S = v_in.shape[1]
        if v_in.shape[0] != B or k_in.shape[:2] != (B, S):
            raise ValueError(f"Layer '{self.name}': query, value and key must share the batch and value/key the "
                             f"length; got query {q_in.shape}, value {v_in.shape}, key {k_in.shape}")
        for name, arr in (("query", q_in), ("value", v_in), ("key", k_in)):
            in_dim = self.params[f"{name}_kernel"].shape[0]
            if arr.shape[2] != in_dim:
                raise ValueError(f"Layer '{self.name}': `{name}` expected shape ({B}, *, {in_dim}), got {arr.shape}")
        mask = _combine_masks(_attention_mask(self, attention_mask, B, T, S, "attention_mask"),
                              attend_mask(key_padding_mask, B, S, where=f"Layer '{self.name}': `key_padding_mask`"))

        H = self.num_heads
        q2, k2, v2 = q_in.reshape(B * T, -1), k_in.reshape(B * S, -1), v_in.reshape(B * S, -1)
        q = self._project("query", q2).reshape(B, T, -1)
        k = self._project("key", k2).reshape(B, S, -1)
        v = self._project("value", v2).reshape(B, S, -1)
        keep = _dropout_keep((B, H, T, S), self.dropout, self.dtype) if training else None
        context, weights = scaled_dot_product_attention(q, k, v, mask, bool(use_causal_mask), heads=H,
                                                        dropout_keep=keep,
                                                        return_weights=training or return_attention_scores)
        context2 = context.reshape(B * T, -1)
        out = self._project("output", context2).reshape(B, T, -1)
        if training:
            self._cache = (q2, k2 if has_key else None, v2, q, k, v, keep, weights, context2, has_key)
        return (out, weights) if return_attention_scores else out

    def backward(self, dy):
        q2, k2, v2, q, k, v, keep, weights, context2, has_key = self._saved()
        dweights = None
        if isinstance(dy, (list, tuple)):
            dy, dweights = dy
            if dweights is not None:
                dweights = self._grad_input(dweights, weights.shape, "dweights")
        B, T = q.shape[:2]
        dy = self._grad_input(dy, (B, T, self.params["output_kernel"].shape[-1]))
        dcontext = self._project_backward("output", dy.reshape(B * T, -1), context2)
        dq, dk, dv = scaled_dot_product_attention_backward(dcontext.reshape(B, T, -1), weights, q, k, v,
                                                           heads=self.num_heads, dweights=dweights, dropout_keep=keep)
        dquery = self._project_backward("query", dq.reshape(q2.shape[0], -1), q2).reshape(B, T, -1)
        dvalue = self._project_backward("value", dv.reshape(v2.shape[0], -1), v2)
        dkey = self._project_backward("key", dk.reshape(v2.shape[0], -1), k2 if has_key else v2)
        S = v.shape[1]
        dvalue = dvalue.reshape(B, S, -1)
        dkey = dkey.reshape(B, S, -1)
        if has_key:
            return [dquery, dvalue, dkey]
        dvalue += dkey
        return [dquery, dvalue]

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        query_shape = input_shape[0] if isinstance(input_shape, list) else input_shape
        out = tuple(query_shape[:-1]) + (self.output_shape or query_shape[-1],)
        if not return_attention_scores:
            return out
        source_len = input_shape[1][1] if isinstance(input_shape, list) else None
        return [out, (query_shape[0], self.num_heads, query_shape[1], source_len)]

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "key_dim": self.key_dim,
                "value_dim": self.value_dim, "dropout": self.dropout, "use_bias": self.use_bias,
                "output_shape": self.output_shape,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer)}


# ---------------------------------------------------------------------------- encoder / decoder
class _TransformerLayerBase(_Composite):
    """What encoder and decoder layers share: the config, the sublayer wiring, and the residual
    block ``x + dropout(sublayer(x))`` in both norm orders."""

    def __init__(self, num_heads, intermediate_dim, dropout=0.0, activation="relu", layer_norm_epsilon=1e-5,
                 norm_first=False, **kwargs):
        super().__init__(**kwargs)
        if int(num_heads) <= 0 or int(intermediate_dim) <= 0:
            raise ValueError(f"{type(self).__name__}: num_heads and intermediate_dim must be positive, got "
                             f"{num_heads}, {intermediate_dim}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        self.num_heads, self.intermediate_dim = int(num_heads), int(intermediate_dim)
        self.dropout = float(dropout)
        self.activation = activations.get(activation)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm_first = bool(norm_first)
        self.model_dim = None

    def _model_dim(self, input_shape):
        dim = input_shape[-1]
        if dim is None or len(input_shape) != 3:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, T, features) with known features, got "
                             f"shape {input_shape}")
        if dim % self.num_heads:
            raise ValueError(f"Layer '{self.name}': the embedding size {dim} (last axis of shape {input_shape}) "
                             f"is not divisible by num_heads={self.num_heads}")
        self.model_dim = int(dim)
        return self.model_dim

    def _attention(self, prefix, input_shapes):
        dim = self.model_dim
        return self._add_sublayer(prefix, MultiHeadAttention(
            self.num_heads, dim // self.num_heads, dropout=self.dropout, dtype=self.dtype,
            name=f"{self.name}/{prefix}"), input_shapes)

    def _norm(self, prefix, input_shape):
        return self._add_sublayer(prefix, LayerNormalization(self.layer_norm_epsilon, dtype=self.dtype,
                                                             name=f"{self.name}/{prefix}"), input_shape)

    def _feed_forward(self, input_shape):
        return self._add_sublayer("feed_forward", FeedForward(
            self.intermediate_dim, self.activation, self.dropout, dtype=self.dtype,
            name=f"{self.name}/feed_forward"), input_shape)

    def _residual(self, x, sublayer, norm, training):
        """One residual block: post-norm ``norm(x + dropout(sublayer(x)))``, or with norm_first
        ``x + dropout(sublayer(norm(x)))``. `sublayer(h)` returns (output, extra); the block
        returns (y, extra) and pushes what its backward needs onto `self._keeps`."""
        inner, extra = sublayer(norm(x, training=training) if self.norm_first else x)
        keep = _dropout_keep(x.shape, self.dropout, self.dtype) if training else None
        y = _core.residual_add(x, inner, keep)
        if not self.norm_first:
            y = norm(y, training=training)
        if training:
            self._keeps.append(keep)
        return y, extra

    def _residual_backward(self, dy, keep, sublayer_backward, norm):
        """Backward of `_residual`: returns dx; sublayer_backward(dinner) returns the gradient
        into the sublayer's own input (the residual stream or the normed stream)."""
        if not self.norm_first:
            dy = norm.backward(dy)
        dinner = dy if keep is None else _core.apply_keep(dy, keep)
        dsub = sublayer_backward(dinner)
        if self.norm_first:
            dsub = norm.backward(dsub)
        return dy + dsub

    def _self_attention_backward(self, dinner):
        dquery, dvalue = self.self_attention.backward(dinner)
        dquery += dvalue  # query, key and value are one stream
        return dquery

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout, "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon, "norm_first": self.norm_first}


class TransformerEncoderLayer(_TransformerLayerBase):
    """A transformer encoder layer (Vaswani et al. 2017): self-attention then a position-wise
    feed-forward network, each in a residual block with dropout and layer normalization.

    Post-norm (default, as the paper and PyTorch): ``x = norm1(x + dropout(attn(x)))``,
    ``y = norm2(x + dropout(ff(x)))``. With ``norm_first=True``: ``x = x + dropout(attn(norm1(x)))``,
    ``y = x + dropout(ff(norm2(x)))``.

    Args:
        num_heads: attention heads; the embedding size must be divisible by it.
        intermediate_dim: hidden width of the feed-forward network.
        dropout: rate for the attention weights, the feed-forward hidden layer and both residuals.
        activation: feed-forward activation, "relu" or "gelu".
        layer_norm_epsilon: 1e-5 as PyTorch (Keras' LayerNormalization default is 1e-3).
        norm_first: pre-norm instead of post-norm.

    Call arguments:
        inputs: ``(batch, T, D)``.
        padding_mask: bool ``(batch, T)`` (True = real token) or lengths ``(batch,)``; the `mask`
            an upstream layer (e.g. ``Embedding(mask_zero=True)``) passes is used when not given.
        attention_mask: bool ``(batch, T, T)`` or ``(T, T)``, True = may attend.
        use_causal_mask: each position attends only to itself and earlier ones.
        return_attention_scores: also return the weights ``(batch, num_heads, T, T)``.

    Output shape: ``(batch, T, D)``. Weights: ``self_attention/*`` (see MultiHeadAttention),
    ``norm1/*``, ``feed_forward/*``, ``norm2/*``. ``backward(dy)`` returns dinputs (with
    return_attention_scores, dy may be ``(doutput, None)``).
    """

    supports_masking = True

    def build(self, input_shape):
        self._model_dim(input_shape)
        self.self_attention = self._attention("self_attention", [input_shape, input_shape])
        self.norm1 = self._norm("norm1", input_shape)
        self.feed_forward = self._feed_forward(input_shape)
        self.norm2 = self._norm("norm2", input_shape)

    def call(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False,
             return_attention_scores=False, training=False, mask=None):
        x = self._float_input(inputs, ndim=3, last_dim=self.model_dim)
        self._keeps = []

        def attend(h):
            return _with_weights(self.self_attention(
                h, h, attention_mask=attention_mask, key_padding_mask=mask if padding_mask is None else padding_mask,
                use_causal_mask=use_causal_mask, return_attention_scores=return_attention_scores,
                training=training), return_attention_scores)

        y, weights = self._residual(x, attend, self.norm1, training)
        y, _ = self._residual(y, lambda h: (self.feed_forward(h, training=training), None), self.norm2, training)
        if training:
            self._cache = (tuple(self._keeps), y.shape)
        return (y, weights) if return_attention_scores else y

    def backward(self, dy):
        (keep_attention, keep_ff), shape = self._saved()
        dy = self._output_grad(dy, shape)
        dy = self._residual_backward(dy, keep_ff, self.feed_forward.backward, self.norm2)
        return self._residual_backward(dy, keep_attention, self._self_attention_backward, self.norm1)

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        if not return_attention_scores:
            return tuple(input_shape)
        return [tuple(input_shape), (input_shape[0], self.num_heads, input_shape[1], input_shape[1])]


class TransformerDecoderLayer(_TransformerLayerBase):
    """A transformer decoder layer: causal self-attention, cross-attention to the encoder's output
    (the memory), and a position-wise feed-forward network, each in a residual block.

    Post-norm (default): ``x = norm1(x + dropout(self_attn(x)))``,
    ``x = norm2(x + dropout(cross_attn(x, memory)))``, ``y = norm3(x + dropout(ff(x)))``;
    ``norm_first=True`` normalizes each block's input instead (as in MultiHeadAttention's args).

    Args: as TransformerEncoderLayer.

    Call arguments:
        inputs: ``[target (batch, T, D), memory (batch, S, D_memory)]``.
        decoder_padding_mask: bool ``(batch, T)`` or lengths, for the target's keys.
        decoder_attention_mask: bool ``(batch, T, T)`` or ``(T, T)`` for self-attention.
        encoder_padding_mask: bool ``(batch, S)`` or lengths, for the memory's keys.
        encoder_attention_mask: bool ``(batch, T, S)`` or ``(T, S)`` for cross-attention.
        use_causal_mask: target position t attends only to targets <= t (default True).
        return_attention_scores: also return the self- and cross-attention weights
            ``(batch, heads, T, T)`` and ``(batch, heads, T, S)``.

    Output shape: ``(batch, T, D)``. ``backward(dy)`` returns ``[dtarget, dmemory]``.
    Weights: ``self_attention/*``, ``norm1/*``, ``cross_attention/*``, ``norm2/*``,
    ``feed_forward/*``, ``norm3/*``.
    """

    def build(self, input_shape):
        if not isinstance(input_shape, list) or len(input_shape) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got input shape {input_shape}")
        target_shape, memory_shape = (tuple(s) for s in input_shape)
        self._model_dim(target_shape)
        if len(memory_shape) != 3 or memory_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': memory expected shape (batch, S, features), got {memory_shape}")
        self.self_attention = self._attention("self_attention", [target_shape, target_shape])
        self.norm1 = self._norm("norm1", target_shape)
        self.cross_attention = self._attention("cross_attention", [target_shape, memory_shape])
        self.norm2 = self._norm("norm2", target_shape)
        self.feed_forward = self._feed_forward(target_shape)
        self.norm3 = self._norm("norm3", target_shape)

    def call(self, inputs, decoder_padding_mask=None, decoder_attention_mask=None, encoder_padding_mask=None,
             encoder_attention_mask=None, use_causal_mask=True, return_attention_scores=False, training=False,
             mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got {type(inputs).__name__}")
        x = self._float_input(inputs[0], "target", ndim=3, last_dim=self.model_dim)
        memory = self._float_input(inputs[1], "memory", ndim=3)
        if isinstance(mask, (list, tuple)):  # masks propagated from upstream layers
            decoder_padding_mask = mask[0] if decoder_padding_mask is None else decoder_padding_mask
            encoder_padding_mask = mask[1] if encoder_padding_mask is None else encoder_padding_mask
        self._keeps = []

        def self_attend(h):
            return _with_weights(self.self_attention(
                h, h, attention_mask=decoder_attention_mask, key_padding_mask=decoder_padding_mask,
                use_causal_mask=use_causal_mask, return_attention_scores=return_attention_scores,
                training=training), return_attention_scores)

        def cross_attend(h):
            return _with_weights(self.cross_attention(
                h, memory, attention_mask=encoder_attention_mask, key_padding_mask=encoder_padding_mask,
                return_attention_scores=return_attention_scores, training=training), return_attention_scores)

        y, self_weights = self._residual(x, self_attend, self.norm1, training)
        y, cross_weights = self._residual(y, cross_attend, self.norm2, training)
        y, _ = self._residual(y, lambda h: (self.feed_forward(h, training=training), None), self.norm3, training)
        if training:
            self._cache = (tuple(self._keeps), y.shape)
        return (y, self_weights, cross_weights) if return_attention_scores else y

    def backward(self, dy):
        (keep_self, keep_cross, keep_ff), shape = self._saved()
        dy = self._output_grad(dy, shape)
        dy = self._residual_backward(dy, keep_ff, self.feed_forward.backward, self.norm3)
        dmemory = []

        def cross_backward(dinner):
            dquery, dvalue = self.cross_attention.backward(dinner)
            dmemory.append(dvalue)
            return dquery
        dy = self._residual_backward(dy, keep_cross, cross_backward, self.norm2)
        dy = self._residual_backward(dy, keep_self, self._self_attention_backward, self.norm1)
        return [dy, dmemory[0]]

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else None

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        target, memory = (tuple(s) for s in input_shape)
        if not return_attention_scores:
            return target
        return [target, (target[0], self.num_heads, target[1], target[1]),
                (target[0], self.num_heads, target[1], memory[1])]


class _TransformerStack(_Composite):
    """num_layers copies of a transformer layer class, applied in order."""

    layer_class = None

    def __init__(self, num_layers, num_heads, intermediate_dim, dropout=0.0, activation="relu",
                 layer_norm_epsilon=1e-5, norm_first=False, **kwargs):
        super().__init__(**kwargs)
        if int(num_layers) <= 0:
            raise ValueError(f"{type(self).__name__}: num_layers must be positive, got {num_layers}")
        self.num_layers = int(num_layers)
        self.layer_config = {"num_heads": num_heads, "intermediate_dim": intermediate_dim, "dropout": dropout,
                             "activation": activation, "layer_norm_epsilon": layer_norm_epsilon,
                             "norm_first": norm_first}
        self.blocks = [self.layer_class(**self.layer_config, dtype=self.dtype, name=f"{self.name}/layer_{i}")
                       for i in range(self.num_layers)]

    def build(self, input_shape):
        for i, block in enumerate(self.blocks):
            self._add_sublayer(f"layer_{i}", block, input_shape)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_config}


class TransformerEncoder(_TransformerStack):
    """A stack of `num_layers` TransformerEncoderLayer blocks (PyTorch's nn.TransformerEncoder
    without a final norm).

    Args: num_layers, then those of TransformerEncoderLayer.
    Call arguments: as TransformerEncoderLayer; with return_attention_scores the weights come as a
    list, one ``(batch, heads, T, T)`` array per layer.
    Input shape ``(batch, T, D)``; output shape the same. Weights: ``layer_<i>/...``.
    """

    layer_class = TransformerEncoderLayer
    supports_masking = True

    def call(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False,
             return_attention_scores=False, training=False, mask=None):
        y, all_weights = inputs, []
        for block in self.blocks:
            y, weights = _with_weights(block(y, padding_mask=mask if padding_mask is None else padding_mask,
                                             attention_mask=attention_mask, use_causal_mask=use_causal_mask,
                                             return_attention_scores=return_attention_scores, training=training),
                                       return_attention_scores)
            all_weights.append(weights)
        if training:
            self._cache = y.shape
        return (y, all_weights) if return_attention_scores else y

    def backward(self, dy):
        dy = self._output_grad(dy, self._saved())
        for block in reversed(self.blocks):
            dy = block.backward(dy)
        return dy

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


class TransformerDecoder(_TransformerStack):
    """A stack of `num_layers` TransformerDecoderLayer blocks, all attending to the same memory.

    Args: num_layers, then those of TransformerDecoderLayer.
    Call arguments: as TransformerDecoderLayer; with return_attention_scores the self- and
    cross-attention weights come as two lists, one array per layer.
    Output shape ``(batch, T, D)``; ``backward(dy)`` returns ``[dtarget, dmemory]``.
    """

    layer_class = TransformerDecoderLayer

    def call(self, inputs, decoder_padding_mask=None, decoder_attention_mask=None, encoder_padding_mask=None,
             encoder_attention_mask=None, use_causal_mask=True, return_attention_scores=False, training=False,
             mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got {type(inputs).__name__}")
        y, memory = inputs
        self_weights, cross_weights = [], []
        for block in self.blocks:
            out = block([y, memory], decoder_padding_mask=decoder_padding_mask,
                        decoder_attention_mask=decoder_attention_mask, encoder_padding_mask=encoder_padding_mask,
                        encoder_attention_mask=encoder_attention_mask, use_causal_mask=use_causal_mask,
                        return_attention_scores=return_attention_scores, training=training, mask=mask)
            y, w_self, w_cross = out if return_attention_scores else (out, None, None)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        if training:
            self._cache = y.shape
        return (y, self_weights, cross_weights) if return_attention_scores else y

    def backward(self, dy):
        dy = self._output_grad(dy, self._saved())
        dmemory = 0
        for block in reversed(self.blocks):
            dy, dmem = block.backward(dy)
            dmemory = dmemory + dmem
        return [dy, dmemory]

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else None

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])


# ---------------------------------------------------------------------------- PyTorch converters
def _register_converters():
    from ..interop import register_from_torch, register_to_torch, set_torch_params

    def torch_dtype(layer):
        import torch
        return getattr(torch, layer.dtype.name)

    @register_from_torch("LayerNorm")
    def _layernorm_from(module, dtype):
        if len(module.normalized_shape) != 1:
            raise ValueError(f"from_torch: LayerNorm over {tuple(module.normalized_shape)}; attnx normalizes the "
                             "last axis only")
        affine = module.weight is not None
        layer = LayerNormalization(epsilon=module.eps, scale=affine, center=module.bias is not None, dtype=dtype)
        layer.build((None, module.normalized_shape[0]))
        layer.built = True

        def to_attnx(t, grads=False):
            return {name: t[torch_name] for name, torch_name in (("gamma", "weight"), ("beta", "bias"))
                    if torch_name in t}
        return layer, to_attnx

    @register_to_torch(LayerNormalization)
    def _layernorm_to(layer):
        import torch
        if layer.center and not layer.scale:
            raise ValueError(f"to_torch: LayerNormalization '{layer.name}' has beta without gamma; "
                             "torch.nn.LayerNorm cannot")
        module = torch.nn.LayerNorm(layer.features, eps=layer.epsilon, elementwise_affine=layer.scale,
                                    bias=layer.center, dtype=torch_dtype(layer))
        tensors = {}
        if layer.scale:
            tensors["weight"] = layer.params["gamma"]
        if layer.center:
            tensors["bias"] = layer.params["beta"]
        return set_torch_params(module, tensors)

    # -- MultiheadAttention: torch keeps (out, in) weights with heads stacked along `out`
    # (in_proj_weight = [Wq; Wk; Wv] when query, key and value sizes agree), attnx Keras' (in, heads, size).
    def mha_to_attnx(t, prefix, num_heads):
        if prefix + "in_proj_weight" in t:
            wq, wk, wv = np.split(t[prefix + "in_proj_weight"], 3)
        else:
            wq, wk, wv = (t[prefix + n] for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
        out_w = t[prefix + "out_proj.weight"]
        out = {}
        for name, w in (("query", wq), ("key", wk), ("value", wv)):
            out[f"{name}_kernel"] = w.T.reshape(w.shape[1], num_heads, -1)
        out["output_kernel"] = out_w.T.reshape(num_heads, -1, out_w.shape[0])
        if prefix + "in_proj_bias" in t:
            for name, b in zip(("query", "key", "value"), np.split(t[prefix + "in_proj_bias"], 3)):
                out[f"{name}_bias"] = b.reshape(num_heads, -1)
            out["output_bias"] = t[prefix + "out_proj.bias"]
        return out

    def mha_to_torch(layer):
        """{torch name: array} for `layer`, checking torch can hold it."""
        H, E = layer.num_heads, layer.params["query_kernel"].shape[0]
        if layer.key_dim * H != E or layer.value_dim * H != E or layer.params["output_kernel"].shape[-1] != E:
            raise ValueError(f"to_torch: MultiHeadAttention '{layer.name}' needs num_heads * key_dim == "
                             f"num_heads * value_dim == query size == output size for torch.nn.MultiheadAttention; "
                             f"got heads={H}, key_dim={layer.key_dim}, value_dim={layer.value_dim}, query size {E}, "
                             f"output size {layer.params['output_kernel'].shape[-1]}")
        p = layer.params
        w = {n: p[f"{n}_kernel"].reshape(p[f"{n}_kernel"].shape[0], -1).T for n in ("query", "key", "value")}
        tensors = {"out_proj.weight": p["output_kernel"].reshape(E, E).T}
        if w["key"].shape[1] == E and w["value"].shape[1] == E:
            tensors["in_proj_weight"] = np.concatenate([w["query"], w["key"], w["value"]])
        else:
            tensors.update(q_proj_weight=w["query"], k_proj_weight=w["key"], v_proj_weight=w["value"])
        if layer.use_bias:
            tensors["in_proj_bias"] = np.concatenate([p[f"{n}_bias"].reshape(-1) for n in ("query", "key", "value")])
            tensors["out_proj.bias"] = p["output_bias"]
        return tensors

    def check_plain_mha(module):
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("from_torch: MultiheadAttention with add_bias_kv or add_zero_attn has no attnx "
                             "equivalent")

    @register_from_torch("MultiheadAttention")
    def _mha_from(module, dtype):
        check_plain_mha(module)
        layer = MultiHeadAttention(module.num_heads, module.head_dim, dropout=module.dropout,
                                   use_bias=module.in_proj_bias is not None, dtype=dtype)
        layer.build_from_dims(module.embed_dim, module.vdim, module.kdim)
        layer.built = True
        return layer, lambda t, grads=False: mha_to_attnx(t, "", module.num_heads)

    @register_to_torch(MultiHeadAttention)
    def _mha_to(layer):
        import torch
        tensors = mha_to_torch(layer)
        module = torch.nn.MultiheadAttention(
            layer.params["query_kernel"].shape[0], layer.num_heads, dropout=layer.dropout, bias=layer.use_bias,
            kdim=layer.params["key_kernel"].shape[0], vdim=layer.params["value_kernel"].shape[0], batch_first=True,
            dtype=torch_dtype(layer))
        return set_torch_params(module, tensors)

    # -- encoder and decoder layers: the same pieces under torch's and attnx's sublayer names
    attention_names = {"self_attn.": "self_attention/", "multihead_attn.": "cross_attention/"}
    plain_names = {"linear1.weight": ("feed_forward/intermediate/kernel", True),
                   "linear1.bias": ("feed_forward/intermediate/bias", False),
                   "linear2.weight": ("feed_forward/output/kernel", True),
                   "linear2.bias": ("feed_forward/output/bias", False)}
    for i in (1, 2, 3):
        plain_names[f"norm{i}.weight"] = (f"norm{i}/gamma", False)
        plain_names[f"norm{i}.bias"] = (f"norm{i}/beta", False)

    def block_to_attnx(t, num_heads):
        out = {}
        for torch_prefix, attnx_prefix in attention_names.items():
            if any(k.startswith(torch_prefix) for k in t):
                for name, value in mha_to_attnx(t, torch_prefix, num_heads).items():
                    out[attnx_prefix + name] = value
        for torch_name, (attnx_name, transpose) in plain_names.items():
            if torch_name in t:
                out[attnx_name] = t[torch_name].T if transpose else t[torch_name]
        return out

    def block_to_torch(layer):
        tensors = {}
        for torch_prefix, attnx_prefix in attention_names.items():
            sublayer = getattr(layer, attnx_prefix[:-1], None)
            if sublayer is not None:
                tensors.update({torch_prefix + k: v for k, v in mha_to_torch(sublayer).items()})
        for torch_name, (attnx_name, transpose) in plain_names.items():
            if attnx_name in layer.params:
                tensors[torch_name] = layer.params[attnx_name].T if transpose else layer.params[attnx_name]
        return tensors

    def block_activation(module):
        import torch
        act = module.activation
        for name, fn, cls in (("relu", torch.nn.functional.relu, torch.nn.ReLU),
                              ("gelu", torch.nn.functional.gelu, torch.nn.GELU)):
            if act is fn or isinstance(act, cls):
                return name
        raise ValueError(f"from_torch: {type(module).__name__} activation {act!r}; attnx converts relu and gelu")

    def block_from(module, layer_class, dtype):
        check_plain_mha(module.self_attn)
        if module.linear1.bias is None:
            raise ValueError(f"from_torch: {type(module).__name__} with bias=False has no attnx equivalent")
        heads, dim = module.self_attn.num_heads, module.self_attn.embed_dim
        layer = layer_class(heads, module.linear1.out_features, dropout=module.dropout.p,
                            activation=block_activation(module), layer_norm_epsilon=module.norm1.eps,
                            norm_first=module.norm_first, dtype=dtype)
        shape = (None, None, dim)
        layer.build(shape if layer_class is TransformerEncoderLayer else [shape, shape])
        layer.built = True
        return layer, lambda t, grads=False: block_to_attnx(t, heads)

    def block_to(layer, torch_class):
        import torch
        if layer.activation not in ("relu", "gelu"):
            raise ValueError(f"to_torch: {type(layer).__name__} '{layer.name}' activation {layer.activation!r}; "
                             "torch supports relu and gelu")
        module = torch_class(layer.model_dim, layer.num_heads, layer.intermediate_dim, dropout=layer.dropout,
                             activation=layer.activation, layer_norm_eps=layer.layer_norm_epsilon, batch_first=True,
                             norm_first=layer.norm_first, dtype=torch_dtype(layer))
        return set_torch_params(module, block_to_torch(layer))

    @register_from_torch("TransformerEncoderLayer")
    def _encoder_layer_from(module, dtype):
        return block_from(module, TransformerEncoderLayer, dtype)

    @register_to_torch(TransformerEncoderLayer)
    def _encoder_layer_to(layer):
        import torch
        return block_to(layer, torch.nn.TransformerEncoderLayer)

    @register_from_torch("TransformerDecoderLayer")
    def _decoder_layer_from(module, dtype):
        return block_from(module, TransformerDecoderLayer, dtype)

    @register_to_torch(TransformerDecoderLayer)
    def _decoder_layer_to(layer):
        import torch
        memory_dim = layer.params["cross_attention/key_kernel"].shape[0]
        if memory_dim != layer.model_dim:
            raise ValueError(f"to_torch: TransformerDecoderLayer '{layer.name}' attends to a memory of size "
                             f"{memory_dim}; torch.nn.TransformerDecoderLayer needs d_model={layer.model_dim}")
        return block_to(layer, torch.nn.TransformerDecoderLayer)

    # -- stacks: nn.TransformerEncoder / nn.TransformerDecoder without a final norm
    def stack_from(module, stack_class, dtype):
        if module.norm is not None:
            raise ValueError(f"from_torch: {type(module).__name__} with a final norm; attnx stacks have none "
                             "(apply a LayerNormalization after the stack)")
        first, _ = block_from(module.layers[0], stack_class.layer_class, dtype)
        config = {k: v for k, v in first.get_config().items() if k not in ("name", "trainable", "dtype")}
        stack = stack_class(len(module.layers), dtype=dtype, **config)
        shape = (None, None, first.model_dim)
        stack.build(shape if stack_class is TransformerEncoder else [shape, shape])
        stack.built = True
        heads = first.num_heads

        def to_attnx(t, grads=False):
            out = {}
            for i in range(len(module.layers)):
                prefix = f"layers.{i}."
                block = block_to_attnx({k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}, heads)
                out.update({f"layer_{i}/{k}": v for k, v in block.items()})
            return out
        return stack, to_attnx

    def stack_to(stack, torch_stack_class):
        import torch
        blocks = [to_torch_block(block) for block in stack.blocks]
        module = torch_stack_class(blocks[0], len(blocks), **(
            {"enable_nested_tensor": False} if torch_stack_class is torch.nn.TransformerEncoder else {}))
        for i, block in enumerate(blocks):  # the constructor deep-copies the first block into every slot
            module.layers[i] = block
        return module

    def to_torch_block(block):
        import torch
        return block_to(block, torch.nn.TransformerEncoderLayer if isinstance(block, TransformerEncoderLayer)
                        else torch.nn.TransformerDecoderLayer)

    @register_from_torch("TransformerEncoder")
    def _encoder_from(module, dtype):
        return stack_from(module, TransformerEncoder, dtype)

    @register_to_torch(TransformerEncoder)
    def _encoder_to(stack):
        import torch
        return stack_to(stack, torch.nn.TransformerEncoder)

    @register_from_torch("TransformerDecoder")
    def _decoder_from(module, dtype):
        return stack_from(module, TransformerDecoder, dtype)

    @register_to_torch(TransformerDecoder)
    def _decoder_to(stack):
        import torch
        return stack_to(stack, torch.nn.TransformerDecoder)


_register_converters()
