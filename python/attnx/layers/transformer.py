"""Transformer blocks: layer normalization, positional encodings, the position-wise feed-forward
network, multi-head attention, and encoder / decoder layers and stacks.

The math runs in C++ (`transformer.hpp`, `attention.hpp`, `dense.hpp`); these classes check
inputs, lay out buffers and chain the backward passes. Every layer follows the contract of
`layers.base`: ``forward`` returns ``(outputs, cache)`` and ``backprop(cache, dy)`` takes the cache
back. Composite layers (FeedForward, the encoder and decoder layers and their stacks) call their
sublayers through ``apply`` / ``backprop`` and keep the sublayers' caches inside their own, so a
composite layer called several times keeps each call's state apart. They expose their sublayers'
weights in their own ``params`` / ``grads`` under ``"<sublayer>/<weight>"`` names, sharing the
same arrays.

Masks follow `attnx.masking` (bool or 0/1 integers, True = real token / may attend; a padding mask
``(batch, S)`` may also be lengths ``(batch,)``). An attention mask is ``(batch, T, S)``, or one
``(T, S)`` mask shared by the batch. A query that may attend to nothing gets zero attention
weights (and so only the output bias), never NaN.
"""
import math

import numpy as np

from .. import activations, backend, initializers, kernels, random, regularizers
from ..masking import as_mask
from .attention import _default_scale, _dense, _dense_backward, is_shape, scaled_dot_product_attention_backward
from ..symbolic import any_symbolic
from .base import Layer
from .core import Dense


def _dropout_keep(generator, shape, rate, dtype):
    """A scaled dropout mask (entries 0 or 1 / (1 - rate)) from `generator` (an `attnx.random.SeedGenerator`),
    or None when rate is 0 or a recorded inference call takes no randomness."""
    if rate == 0.0 or not backend.training_randomness(True):
        return None
    return generator.keep(shape, rate, dtype)


def _where(layer, arg):
    """The start of an error message about argument `arg` of `layer`."""
    return f"Layer '{layer.name}': `{arg}`"


def _attention_mask(mask, batch, queries, keys, where):
    """An attention mask as the kernel takes it, or None: (batch, queries, keys), or
    (1, queries, keys) for one (queries, keys) mask shared by the batch (as torch's attn_mask).
    Keras' forms too: float 0/1 values, and (batch, heads, queries, keys) the same for every head."""
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        values = np.asarray(mask)
        if not np.all((values == 0) | (values == 1)):
            raise ValueError(f"{where}: a float mask must hold only 0 and 1, got other values")
        mask = values.astype(bool)
    if mask is not None and np.ndim(mask) == 4:  # per head: one mask when every head has the same
        per_head = np.asarray(mask)
        if per_head.shape[1] != 1 and not np.all(per_head == per_head[:, :1]):
            raise ValueError(f"{where}: a (batch, heads, queries, keys) mask must be the same for every head "
                             f"(attnx's kernel takes one mask for all heads), got shape {per_head.shape}")
        mask = per_head[:, 0]
    if mask is not None and np.ndim(mask) == 2:
        mask = np.asarray(mask)[None]
    mask = as_mask(mask, batch, keys, where, queries=queries, shared=True)
    if mask is not None and mask.ndim == 2:  # given as lengths: every query sees the same keys
        mask = np.ascontiguousarray(np.broadcast_to(mask[:, None, :], (batch, queries, keys)))
    return mask


def _combine_masks(attention_mask, padding_mask):
    """The one mask the attention kernel takes: the padding (B, S), the attention mask, or their AND."""
    if attention_mask is None:
        return padding_mask
    if padding_mask is None:
        return attention_mask
    return attention_mask & padding_mask[:, None, :]


def _decoder_masks(layer, target_shape, S, decoder_padding_mask, decoder_attention_mask, encoder_padding_mask,
                   encoder_attention_mask):
    """A decoder layer's or stack's four mask arguments, checked once, as the (self-attention,
    cross-attention) masks the kernels take, for a target (B, T) and S memory positions."""
    B, T = target_shape
    self_mask = _combine_masks(
        _attention_mask(decoder_attention_mask, B, T, T, _where(layer, "decoder_attention_mask")),
        as_mask(decoder_padding_mask, B, T, _where(layer, "decoder_padding_mask")))
    cross_mask = _combine_masks(
        _attention_mask(encoder_attention_mask, B, T, S, _where(layer, "encoder_attention_mask")),
        as_mask(encoder_padding_mask, B, S, _where(layer, "encoder_padding_mask")))
    return self_mask, cross_mask


class _Composite(Layer):
    """A layer made of sublayers whose weights it exposes as its own, "<prefix>/<name>".

    Its backprop passes its `need_dx` on to the sublayers whose input gradient goes nowhere but into
    this layer's own input gradient, so that they skip it when a model does not read it.
    """

    quantizes_sublayers = False  # its fused float32 kernels read the sublayers' weights (FeedForward's Dense)

    def _add_sublayer(self, prefix, layer, input_shape):
        layer.build(input_shape)
        layer.built = True
        for name in layer.params:
            self.params[f"{prefix}/{name}"] = layer.params[name]
            self.grads[f"{prefix}/{name}"] = layer.grads[name]
        return layer

    def _output_grad(self, dy, shape):
        """The output's gradient; with return_attention_scores, dy may be (doutput, None, ...):
        gradients into the returned weights are only taken by MultiHeadAttention itself."""
        if isinstance(dy, (list, tuple)):
            if any(d is not None for d in dy[1:]):
                raise ValueError(f"Layer '{self.name}': backprop takes no gradient for the returned attention "
                                 "weights; pass (doutput, None)")
            dy = dy[0]
        return self._grad_input(dy, shape)


# ---------------------------------------------------------------------------- normalization
class LayerNormalization(Layer):
    """Normalizes each position over its features: ``gamma * (x - mean) / sqrt(var + epsilon) + beta``.

    Args:
        axis: the axis normalized over, or a list or tuple of trailing axes (Keras' default -1).
        epsilon: added to the variance; Keras' default 1e-3, PyTorch's nn.LayerNorm 1e-5.
        center: learn the shift `beta`.
        scale: learn the scale `gamma`.
        rms_scaling: Keras' scaling without centering, ``gamma * x / sqrt(var(x) + epsilon)`` (no beta).
        beta_initializer, gamma_initializer: Keras defaults zeros and ones.
        beta_regularizer, gamma_regularizer: e.g. ``attnx.regularizers.L2(0.01)``.

    Input shape: ``(batch, ..., features)``. Output shape: the same.
    Weights (Keras order): gamma, beta, each of the shape of the normalized axes.
    """

    supports_masking = True

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True, rms_scaling=False, beta_initializer="zeros",
                 gamma_initializer="ones", beta_regularizer=None, gamma_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        axes = axis if isinstance(axis, (list, tuple)) else [axis]
        if not axes or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
            raise TypeError(f"LayerNormalization: Expected an int or a list/tuple of ints for the argument 'axis', "
                            f"but received: {axis!r}")
        if not float(epsilon) > 0:
            raise ValueError(f"LayerNormalization: epsilon must be positive, got {epsilon}")
        self.axis = int(axis) if not isinstance(axis, (list, tuple)) else [int(a) for a in axis]
        self.epsilon = float(epsilon)
        self.rms_scaling = bool(rms_scaling)
        self.center, self.scale = bool(center) and not self.rms_scaling, bool(scale) or self.rms_scaling
        self.beta_initializer = initializers.get(beta_initializer)
        self.gamma_initializer = initializers.get(gamma_initializer)
        self.beta_regularizer = regularizers.get(beta_regularizer)
        self.gamma_regularizer = regularizers.get(gamma_regularizer)
        self.features = None

    def _normalized_axes(self, ndim):
        """The normalized axes as non-negative, sorted; they must be the trailing axes (one row each)."""
        axes = sorted({a % ndim if -ndim <= a < ndim else -1 - ndim
                       for a in (self.axis if isinstance(self.axis, list) else [self.axis])})
        if axes[0] < 1 or axes != list(range(ndim - len(axes), ndim)):
            raise ValueError(f"Layer '{self.name}': axis {self.axis} for inputs of rank {ndim}: attnx normalizes "
                             "trailing axes after the batch axis only (e.g. -1 or (-2, -1))")
        return axes

    def build(self, input_shape):
        if not is_shape(input_shape, range(1, 33)):
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, ..., features) with known features, "
                             f"got shape {input_shape}")
        axes = self._normalized_axes(len(input_shape))
        shape = tuple(input_shape[a] for a in axes)
        if None in shape:
            raise ValueError(f"Layer '{self.name}': needs inputs with known sizes on the normalized axes, got shape "
                             f"{input_shape}")
        self.features = int(np.prod(shape))
        self._weight_shape = shape
        if self.scale:
            self.add_weight("gamma", shape, self.gamma_initializer, self.gamma_regularizer)
        if self.center:
            self.add_weight("beta", shape, self.beta_initializer, self.beta_regularizer)

    def _flat(self, name, tensors):
        w = tensors.get(name)
        return None if w is None else w.reshape(-1)

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=2, last_dim=self._weight_shape[-1])
        if x.shape[x.ndim - len(self._weight_shape):] != self._weight_shape:
            raise ValueError(f"Layer '{self.name}': `inputs` expected trailing axes {self._weight_shape}, got shape "
                             f"{x.shape}")
        rows = x.reshape(-1, self.features)
        if self.rms_scaling:
            # y = gamma * x * r, r = 1 / sqrt(var(x) + eps) per row (Keras: x is not centered)
            centered = rows - rows.mean(axis=1, keepdims=True)
            r = 1.0 / np.sqrt(np.mean(centered * centered, axis=1, keepdims=True) + self.epsilon)
            y = rows * r * self._flat("gamma", self.params)
            return y.reshape(x.shape), ((rows, centered, r, x.shape) if training else None)
        y, mean, rstd = kernels.layernorm_forward(x=rows, gamma=self._flat("gamma", self.params),
                                                beta=self._flat("beta", self.params), eps=self.epsilon)
        return y.reshape(x.shape), ((rows, mean, rstd, x.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        if self.rms_scaling:
            rows, centered, r, shape = cache
            dy = self._grad_input(dy, shape).reshape(rows.shape)
            # y = gamma * x * r: dgamma = sum(dy * x * r); with g = dy * gamma and dr/dx = -r^3 (x - mean) / N,
            # dx = r * g - (x - mean) * r^3 * mean(g * x)
            self.grads["gamma"].reshape(-1)[:] += np.sum(dy * rows * r, axis=0)
            g = dy * self._flat("gamma", self.params)
            dx = r * g - centered * r ** 3 * np.mean(g * rows, axis=1, keepdims=True)
            return dx.reshape(shape)
        rows, mean, rstd, shape = cache
        dy = self._grad_input(dy, shape).reshape(rows.shape)
        # layernorm_backward always returns dx: the binding has no switch to skip it
        dx = kernels.layernorm_backward(dy=dy, x=rows, mean=mean, rstd=rstd, gamma=self._flat("gamma", self.params),
                                      dgamma=self._flat("gamma", self.grads), dbeta=self._flat("beta", self.grads))
        return dx.reshape(shape)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon, "center": self.center,
                "scale": self.scale, "rms_scaling": self.rms_scaling,
                "beta_initializer": initializers.serialize(self.beta_initializer),
                "gamma_initializer": initializers.serialize(self.gamma_initializer),
                "beta_regularizer": regularizers.serialize(self.beta_regularizer),
                "gamma_regularizer": regularizers.serialize(self.gamma_regularizer)}


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
        """The (>= length, dim) encoding, recomputed only when a longer sequence or new size arrives."""
        table = self._table
        if table.shape[0] < length or table.shape[1] != dim:
            table = kernels.sinusoidal_table(num_positions=length, dim=dim, dtype=self.dtype,
                                           max_wavelength=self.max_wavelength)
            # a memo of a pure function, read once per call: calls racing to replace it each use
            # the table they read, which is right for them
            self._table = table
        return table

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, ndim=3)
        y = kernels.add_positions_forward(x=x, table=self.table(x.shape[1], x.shape[2]))
        return y, (x.shape if training else None)

    def backprop(self, cache, dy, need_dx=True):
        dy = self._grad_input(dy, cache)
        return dy.copy() if need_dx else None  # a new array: callers may add into it

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
        if not is_shape(input_shape, (3,)) or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, T, features) with known features, "
                             f"got shape {input_shape}")
        self.add_weight("embeddings", (self.sequence_length, input_shape[-1]), self.initializer)

    def forward(self, inputs, training=False):
        table = self.params["embeddings"]
        x = self._float_input(inputs, ndim=3, last_dim=table.shape[1])
        if x.shape[1] > self.sequence_length:
            raise ValueError(f"Layer '{self.name}': `inputs` has {x.shape[1]} positions (shape {x.shape}), more "
                             f"than the table's sequence_length={self.sequence_length}")
        return kernels.add_positions_forward(x=x, table=table), (x.shape if training else None)

    def backprop(self, cache, dy, need_dx=True):
        dy = self._grad_input(dy, cache)
        kernels.add_positions_backward(dtable=self.grads["embeddings"], dy=dy)
        return dy.copy() if need_dx else None  # a new array: callers may add into it

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
        seed: seed of the dropout masks (default: attnx's stream, `attnx.random`).

    Input shape: ``(batch, ..., D)``. Output shape: ``(batch, ..., output_dim or D)``.
    Weights: intermediate/kernel ``(D, intermediate_dim)``, intermediate/bias, output/kernel, output/bias.
    """

    supports_masking = True

    def __init__(self, intermediate_dim, activation="relu", dropout=0.0, output_dim=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        if int(intermediate_dim) <= 0:
            raise ValueError(f"FeedForward: intermediate_dim must be positive, got {intermediate_dim}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"FeedForward: dropout must be in [0, 1), got {dropout}")
        self.intermediate_dim = int(intermediate_dim)
        self.activation = activations.get(activation)
        self.dropout = float(dropout)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.seed_generator = random.SeedGenerator(seed, "FeedForward")
        self.seed = self.seed_generator.seed

    def build(self, input_shape):
        if not is_shape(input_shape, range(2, 33)) or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, ..., features) with a known feature size, "
                             f"got shape {input_shape}")
        out_dim = self.output_dim or input_shape[-1]
        self.intermediate_dense = self._add_sublayer(
            "intermediate", Dense(self.intermediate_dim, self.activation, dtype=self.dtype,
                                  name=f"{self.name}/intermediate"), input_shape)
        self.output_dense = self._add_sublayer(
            "output", Dense(out_dim, dtype=self.dtype, name=f"{self.name}/output"),
            tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def forward(self, inputs, training=False):
        if not training:  # one kernel, blocks of rows: the (batch, ..., intermediate_dim) hidden is never stored
            inner, outer = self.intermediate_dense.params, self.output_dense.params
            x = self._float_input(inputs, min_ndim=2, last_dim=inner["kernel"].shape[0])
            y = kernels.feed_forward_forward(x=x.reshape(-1, x.shape[-1]), kernel1=inner["kernel"],
                                           bias1=inner.get("bias"), kernel2=outer["kernel"], bias2=outer.get("bias"),
                                           activation=self.activation)
            return y.reshape(x.shape[:-1] + (y.shape[-1],)), None
        hidden, intermediate_cache = self.intermediate_dense.apply(inputs, training=True)
        keep = _dropout_keep(self.seed_generator, hidden.shape, self.dropout, self.dtype)
        if keep is not None:
            hidden = kernels.apply_keep(x=hidden, keep=keep)
        y, output_cache = self.output_dense.apply(hidden, training=True)
        return y, (intermediate_cache, keep, output_cache)

    def backprop(self, cache, dy, need_dx=True):
        intermediate_cache, keep, output_cache = cache
        dhidden = self.output_dense.backprop(output_cache, dy)
        if keep is not None:
            dhidden = kernels.apply_keep(x=dhidden, keep=keep)
        return self.intermediate_dense.backprop(intermediate_cache, dhidden, need_dx)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "activation": self.activation,
                "dropout": self.dropout, "output_dim": self.output_dim, "seed": self.seed}


# ---------------------------------------------------------------------------- attention
def head_sizes(owner, num_heads, model_dim=None):
    """The one rule for a number of heads, for every layer and model that takes `num_heads`: a
    positive integer (2.5 or True is an error, never truncated) dividing the model size `model_dim`
    (when known). Returns (num_heads, model_dim // num_heads or None)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
        raise ValueError(f"{owner}: the argument `num_heads` must be a positive integer, got {num_heads!r}")
    if model_dim is None:
        return int(num_heads), None
    if model_dim % num_heads:
        raise ValueError(f"{owner}: the embedding size {model_dim} is not divisible by num_heads={num_heads}")
    return int(num_heads), int(model_dim) // int(num_heads)


def _positive_int(value, arg):
    """`value` as a positive int; MultiHeadAttention's error (naming `arg`) for 0, negatives, floats."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"MultiHeadAttention: Invalid argument `{arg}`: expected a positive integer, got {value!r}")
    return int(value)


def _output_dims(output_shape):
    """Keras' output_shape (None, an int or a tuple of ints) as a tuple of ints, or None."""
    if output_shape is None:
        return None
    dims = (output_shape,) if not isinstance(output_shape, (list, tuple)) else tuple(output_shape)
    if not dims or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0 for d in dims):
        raise ValueError(f"MultiHeadAttention: Invalid `output_shape`: expected an int or a tuple of positive ints, "
                         f"got {output_shape!r}")
    return tuple(int(d) for d in dims)


def _mha_masks(mask, query_mask, value_mask, key_mask):
    """The (query, value, key) masks of a MultiHeadAttention call: explicit ones win over the masks
    its inputs carry (`mask`: the query's, or [query's, value's(, key's)] in a functional model)."""
    carried = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    carried += [None] * (3 - len(carried))
    return tuple(m if m is not None else c for m, c in zip((query_mask, value_mask, key_mask), carried))


def _value_and_key(value, key):
    """The positional arguments after the query that a call gave: (), (value,) or (value, key)."""
    if value is None:
        return ()
    return (value,) if key is None else (value, key)


class MultiHeadAttention(Layer):
    """Multi-head attention (Vaswani et al. 2017) with Keras' weight layout.

    Each head h projects the inputs, ``q_h = query W^Q_h``, ``k_h = key W^K_h``, ``v_h = value W^V_h``;
    ``softmax(q_h k_h^T / sqrt(key_dim)) v_h`` and the concatenated heads are projected to the
    output. The attention core is the kernel of `attnx.layers.attention.scaled_dot_product_attention`
    (one call for all batch rows and heads, reading the projections in place).

    Args:
        num_heads: number of heads.
        key_dim: size of each head's query and key.
        value_dim: size of each head's value (default key_dim).
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_shape: size of the output's last axis (default: the query's), or a tuple of sizes
            (Keras: the output is then ``(batch, T, *output_shape)``).
        kernel_initializer, bias_initializer: Keras defaults glorot_uniform and zeros.

    Call arguments:
        query: ``(batch, T, query_dim)``; or a list ``[query, value]`` / ``[query, value, key]``.
        value: ``(batch, S, value_dim_in)``.
        key: ``(batch, S, key_dim_in)``; default: value.
        query_mask, value_mask, key_mask: ``(batch, T)`` / ``(batch, S)`` (Keras): in a functional model
            they come from the inputs' masks (e.g. ``Embedding(mask_zero=True)``); the query's mask is
            passed on to the output. A query row with nothing to attend to gets a zero context.
        attention_mask: ``(batch, T, S)``, ``(T, S)`` or ``(batch, heads, T, S)`` the same for each head;
            bool, 0/1 integers or 0/1 floats; True = query t may attend to key s.
        key_padding_mask: ``(batch, S)`` (True = real token) or lengths ``(batch,)``.
        use_causal_mask: query t attends only to keys s <= t.
        return_attention_scores: also return the per-head weights ``(batch, num_heads, T, S)``.
        training: apply dropout and keep what backprop needs.

    Output shape: ``(batch, T, *output_shape)`` or ``(batch, T, query_dim)``.
    Weights (Keras order and shapes): query_kernel ``(query_dim, heads, key_dim)``, query_bias
    ``(heads, key_dim)``, key_kernel, key_bias, value_kernel ``(value_dim_in, heads, value_dim)``,
    value_bias, output_kernel ``(heads, value_dim, out)``, output_bias ``(out,)``.
    ``backprop(cache, dy)`` (dy may be ``(doutput, dweights)``) returns ``[dquery, dvalue]``, or
    ``[dquery, dvalue, dkey]`` when a key was given; with no key, dvalue includes the key's path.
    """
    _gradient_arguments = (("value", 0), ("key", 1))  # see Layer._with_gradient_arguments

    def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True, output_shape=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, _ = head_sizes("MultiHeadAttention", num_heads)
        self.key_dim = _positive_int(key_dim, "key_dim")
        self.value_dim = _positive_int(value_dim, "value_dim") if value_dim is not None else self.key_dim
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        self.seed_generator = random.SeedGenerator(seed, "MultiHeadAttention")
        self.seed = self.seed_generator.seed
        self.use_bias = bool(use_bias)
        dims = _output_dims(output_shape)
        # an int (or a tuple of one, Keras' config of it) stays an int; several sizes stay a tuple
        self.output_shape = None if dims is None else (dims[0] if len(dims) == 1 else dims)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)

    # Keras-style calls layer(query, value, key): Layer.__call__ and Layer.apply would build from
    # the query's shape alone, so both build here from all three, on arrays and on a model's
    # symbolic tensors alike.
    supports_masking = True

    def __call__(self, query, value=None, key=None, **kwargs):
        self._build_from_inputs(query, value, key)
        if value is not None and not isinstance(query, (list, tuple)) and \
                any(type(t) is not np.ndarray and any_symbolic(t) for t in (query, value, key) if t is not None):
            # on a model's tensors the call records [query, value(, key)] as its inputs: each input's mask
            # and shape reach the layer
            return super().__call__([query, *_value_and_key(value, key)], **kwargs)
        return super().__call__(query, *_value_and_key(value, key), **kwargs)

    def apply(self, query, value=None, key=None, **kwargs):
        self._build_from_inputs(query, value, key)
        return super().apply(query, *_value_and_key(value, key), **kwargs)

    def _build_from_inputs(self, query, value, key):
        if not self.built and value is not None and not isinstance(query, (list, tuple)):
            self.build([tuple(np.shape(t)) for t in (query, value, key) if t is not None])
            self.built = True

    def build(self, input_shape):
        """Creates the weights for [query, value] or [query, value, key] shapes."""
        if not isinstance(input_shape, list) or not 2 <= len(input_shape) <= 3:
            raise ValueError(f"Layer '{self.name}': call with (query, value[, key]) or [query, value[, key]], "
                             f"got input shape {input_shape}")
        self._check_shapes(*input_shape)
        if any(len(shape) != 3 for shape in input_shape):
            raise ValueError(f"Layer '{self.name}': query, value and key should be rank 3 (batch, time, "
                             f"features), got shapes {input_shape}")
        shapes = list(input_shape) + [input_shape[1]] * (3 - len(input_shape))
        self.build_from_dims(shapes[0][-1], shapes[1][-1], shapes[2][-1])

    def _check_shapes(self, query_shape, value_shape, key_shape=None):
        """Keras' shape rule: value and key share every axis but the batch and the last."""
        if key_shape is not None and tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(f"Layer '{self.name}': All dimensions of `value` and `key`, except the last one, must "
                             f"be equal. Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}")

    def build_from_dims(self, query_dim, value_dim, key_dim):
        """Creates the weights for inputs with these feature sizes."""
        H, dk, dv = self.num_heads, self.key_dim, self.value_dim
        out = _output_dims(self.output_shape) or (query_dim,)
        for name, in_dim, head_dim in (("query", query_dim, dk), ("key", key_dim, dk), ("value", value_dim, dv)):
            self.add_weight(f"{name}_kernel", (in_dim, H, head_dim), self.kernel_initializer)
            if self.use_bias:
                self.add_weight(f"{name}_bias", (H, head_dim), self.bias_initializer)
        self.add_weight("output_kernel", (H, dv, *out), self.kernel_initializer)
        if self.use_bias:
            self.add_weight("output_bias", out, self.bias_initializer)

    def matrix(self, name):
        """The kernel of projection `name` ("query", "key", "value", "output") as the (in, out)
        matrix the kernels take (a view of the weight)."""
        return self._matrix(name, self.params[f"{name}_kernel"])

    @staticmethod
    def _matrix(name, kernel):
        """The Keras-shaped kernel as the (in, out) matrix dense_forward takes (a view)."""
        if name == "output":
            return kernel.reshape(kernel.shape[0] * kernel.shape[1], -1)
        return kernel.reshape(kernel.shape[0], -1)

    def _output_tail(self):
        """The output's axes after (batch, T): the output kernel's after (heads, value_dim)."""
        return self.params["output_kernel"].shape[2:]

    def _project(self, name, rows):
        bias = self.params.get(f"{name}_bias")
        return _dense(rows, self._matrix(name, self.params[f"{name}_kernel"]), None if bias is None else bias.reshape(-1))

    def project(self, name, inputs):
        """One projection on its own, for incremental decoding (a decoder step reuses the keys and
        values of the earlier steps): ``"query"``, ``"key"`` or ``"value"`` of inputs (B, T, in) as
        (B, T, heads * head_dim), or ``"output"`` of a context (B, T, heads * value_dim)."""
        x = self._float_input(inputs, name, ndim=3)
        B, T = x.shape[:2]
        return self._project(name, x.reshape(B * T, x.shape[2])).reshape(B, T, -1)

    def _project_backward(self, name, dy, rows, need_dx):
        dbias = self.grads.get(f"{name}_bias")
        # a linear activation does not read its output y: dy stands in for it
        return _dense_backward(dy, rows, self._matrix(name, self.params[f"{name}_kernel"]), dy, "linear",
                               self._matrix(name, self.grads[f"{name}_kernel"]),
                               None if dbias is None else dbias.reshape(-1), need_dx)

    def forward(self, query, value=None, key=None, attention_mask=None, key_padding_mask=None,
                use_causal_mask=False, return_attention_scores=False, training=False, mask=None, query_mask=None,
                value_mask=None, key_mask=None):
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
        self._check_shapes(q_in.shape, v_in.shape, k_in.shape)
        if v_in.shape[0] != B or k_in.shape[:2] != (B, S):
            raise ValueError(f"Layer '{self.name}': query, value and key must share the batch and value/key the "
                             f"length; got query {q_in.shape}, value {v_in.shape}, key {k_in.shape}")
        for name, arr in (("query", q_in), ("value", v_in), ("key", k_in)):
            in_dim = self.params[f"{name}_kernel"].shape[0]
            if arr.shape[2] != in_dim:
                raise ValueError(f"Layer '{self.name}': `{name}` expected shape ({B}, *, {in_dim}), got {arr.shape}")
        query_mask, value_mask, key_mask = _mha_masks(mask, query_mask, value_mask, key_mask)
        padding = None  # (B, S): key_padding_mask AND value_mask AND key_mask
        for arg, m in (("key_padding_mask", key_padding_mask), ("value_mask", value_mask), ("key_mask", key_mask)):
            m = as_mask(m, B, S, _where(self, arg))
            padding = m if padding is None else padding if m is None else padding & m
        mask = _combine_masks(_attention_mask(attention_mask, B, T, S, _where(self, "attention_mask")), padding)
        if query_mask is not None:  # Keras: a padded query attends to nothing
            rows = as_mask(query_mask, B, T, _where(self, "query_mask"))
            full = np.ones((B, T, S), bool) if mask is None else np.broadcast_to(
                mask if mask.ndim == 3 else mask[:, None, :], (B, T, S))
            mask = np.ascontiguousarray(full & rows[:, :, None])
        return self.forward_checked(q_in, v_in, k_in if has_key else None, mask, use_causal_mask,
                                    return_attention_scores, training)

    def forward_checked(self, query, value, key, mask, use_causal_mask=False, return_attention_scores=False,
                        training=False):
        """`forward` on inputs and one mask it has checked: query (B, T, in), value (B, S, in), key or
        None (the value), mask (B, S), (B, T, S), (1, T, S) or None as the kernel takes it (the
        layers of this module call it with the masks they checked once)."""
        q_in, v_in = query, value
        has_key = key is not None
        k_in = key if has_key else v_in
        (B, T), S = q_in.shape[:2], v_in.shape[1]
        H = self.num_heads
        # sizes spelled out, not -1: a zero-length query or value (B * T == 0) has no size to infer from
        q_rows, k_rows, v_rows = (q_in.reshape(B * T, q_in.shape[2]), k_in.reshape(B * S, k_in.shape[2]),
                                  v_in.reshape(B * S, v_in.shape[2]))
        q = self._project("query", q_rows).reshape(B, T, H * self.key_dim)
        k = self._project("key", k_rows).reshape(B, S, H * self.key_dim)
        v = self._project("value", v_rows).reshape(B, S, H * self.value_dim)
        keep = _dropout_keep(self.seed_generator, (B, H, T, S), self.dropout, self.dtype) if training else None
        # the kernel itself: the mask is checked (scaled_dot_product_attention would check it again)
        context, weights = kernels.sdpa_forward(query=q, key=k, value=v, mask=mask, causal=bool(use_causal_mask),
                                                scale=_default_scale(q, H), heads=H, dropout_keep=keep,
                                                return_weights=bool(training or return_attention_scores))
        context_rows = context.reshape(B * T, H * self.value_dim)
        out = self._project("output", context_rows).reshape(B, T, *self._output_tail())
        outputs = (out, weights) if return_attention_scores else out
        if not training:
            return outputs, None
        # with no key given, the key projection read the value: k_rows is None says so to backprop
        return outputs, (q_rows, k_rows if has_key else None, v_rows, q, k, v, keep, weights, context_rows)

    def backprop(self, cache, dy, need_dx=True):
        q_rows, k_rows, v_rows, q, k, v, keep, weights, context_rows = cache
        dweights = None
        if isinstance(dy, (list, tuple)):
            dy, dweights = dy
            if dweights is not None:
                dweights = self._grad_input(dweights, weights.shape, "dweights")
        (B, T, _), S = q.shape, v.shape[1]
        tail = self._output_tail()
        dy = self._grad_input(dy, (B, T, *tail))
        # sizes spelled out, not -1, as in forward (zero-length sequences)
        dcontext = self._project_backward("output", dy.reshape(B * T, math.prod(tail)), context_rows, need_dx=True)
        dq, dk, dv = scaled_dot_product_attention_backward(dcontext.reshape(B, T, context_rows.shape[1]), weights,
                                                           q, k, v, heads=self.num_heads, dweights=dweights,
                                                           dropout_keep=keep)
        key_rows = v_rows if k_rows is None else k_rows
        dquery = self._project_backward("query", dq.reshape(B * T, q.shape[2]), q_rows, need_dx)
        dvalue = self._project_backward("value", dv.reshape(B * S, v.shape[2]), v_rows, need_dx)
        dkey = self._project_backward("key", dk.reshape(B * S, k.shape[2]), key_rows, need_dx)
        if not need_dx:
            return None
        dquery, dvalue, dkey = (dquery.reshape(B, T, q_rows.shape[1]), dvalue.reshape(B, S, v_rows.shape[1]),
                                dkey.reshape(B, S, key_rows.shape[1]))
        if k_rows is not None:
            return [dquery, dvalue, dkey]
        dvalue += dkey  # the value was the key too
        return [dquery, dvalue]

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else mask  # the query's (Keras)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None, return_attention_scores=False):
        """Keras' ``(query_shape, value_shape, key_shape)``, or one list of them."""
        if value_shape is None and isinstance(query_shape, list) and query_shape and \
                isinstance(query_shape[0], (list, tuple)):
            query_shape, value_shape, key_shape = (list(query_shape) + [None, None])[:3]
        query_shape = tuple(query_shape)
        if value_shape is not None:
            value_shape = tuple(value_shape)
            self._check_shapes(query_shape, value_shape, None if key_shape is None else tuple(key_shape))
        out = query_shape[:-1] + (_output_dims(self.output_shape) or (query_shape[-1],))
        if not return_attention_scores:
            return out
        source_len = value_shape[-2] if value_shape is not None else None
        return [out, (query_shape[0], self.num_heads) + query_shape[1:-1] + (source_len,)]

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "key_dim": self.key_dim,
                "value_dim": self.value_dim, "dropout": self.dropout, "use_bias": self.use_bias,
                "output_shape": self.output_shape, "seed": self.seed,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer)}


# ---------------------------------------------------------------------------- encoder / decoder
class _TransformerLayerBase(_Composite):
    """What encoder and decoder layers share: the config, the sublayer wiring, and the residual
    block ``x + dropout(sublayer(x))`` in both norm orders.

    A residual block's sublayer is a pair of functions: ``sublayer(h) -> (output, cache, weights)``
    (weights: the attention weights when returned, else None) and
    ``sublayer_backprop(cache, doutput) -> (dh, dsource)`` (dsource: the gradient of the memory a
    cross-attention attends to, else None).
    """

    def __init__(self, num_heads, intermediate_dim, dropout=0.0, activation="relu", layer_norm_epsilon=1e-5,
                 norm_first=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, _ = head_sizes(type(self).__name__, num_heads)
        if int(intermediate_dim) <= 0:
            raise ValueError(f"{type(self).__name__}: intermediate_dim must be positive, got {intermediate_dim}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        self.intermediate_dim = int(intermediate_dim)
        self.dropout = float(dropout)
        self.activation = activations.get(activation)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm_first = bool(norm_first)
        self.model_dim = self.head_dim = None
        self.seed_generator = random.SeedGenerator(seed, type(self).__name__)  # the residual blocks' dropout
        self.seed = self.seed_generator.seed

    def _model_dim(self, input_shape):
        if not is_shape(input_shape, (3,)) or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, T, features) with known features, got "
                             f"shape {input_shape}")
        self.model_dim = int(input_shape[-1])
        _, self.head_dim = head_sizes(f"Layer '{self.name}' (inputs of shape {input_shape})", self.num_heads,
                                      self.model_dim)
        return self.model_dim

    def _attention(self, prefix, input_shapes):
        return self._add_sublayer(prefix, MultiHeadAttention(
            self.num_heads, self.head_dim, dropout=self.dropout, dtype=self.dtype,
            seed=random.sub_seed(self.seed, 1 if prefix == "self_attention" else 2), name=f"{self.name}/{prefix}"),
            input_shapes)

    def _norm(self, prefix, input_shape):
        return self._add_sublayer(prefix, LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                                                             name=f"{self.name}/{prefix}"), input_shape)

    def _feed_forward(self, input_shape):
        return self._add_sublayer("feed_forward", FeedForward(
            self.intermediate_dim, self.activation, self.dropout, dtype=self.dtype, seed=random.sub_seed(self.seed, 3),
            name=f"{self.name}/feed_forward"), input_shape)

    def _residual(self, x, norm, sublayer, training):
        """One residual block: post-norm ``norm(x + dropout(sublayer(x)))``, or with norm_first
        ``x + dropout(sublayer(norm(x)))``. Returns (y, weights, cache)."""
        norm_cache = None
        h = x
        if self.norm_first:
            h, norm_cache = norm.apply(x, training=training)
        inner, sublayer_cache, weights = sublayer(h)
        keep = _dropout_keep(self.seed_generator, x.shape, self.dropout, self.dtype) if training else None
        y = kernels.residual_add(x=x, sub=inner, keep=keep)
        if not self.norm_first:
            y, norm_cache = norm.apply(y, training=training)
        return y, weights, (norm_cache, sublayer_cache, keep)

    def _residual_backprop(self, cache, dy, norm, sublayer_backprop, need_dx=True):
        """Backward of `_residual`: returns (dx, dsource); dx is None when the sublayer skipped the
        input gradient nobody reads (`need_dx` False)."""
        norm_cache, sublayer_cache, keep = cache
        if not self.norm_first:
            dy = norm.backprop(norm_cache, dy)
        dinner = dy if keep is None else kernels.apply_keep(x=dy, keep=keep)
        # post-norm: the sublayer reads the block's input itself, and its input gradient only joins the
        # residual's; pre-norm: it reads the norm's output, whose gradient the norm's weights need
        dh, dsource = sublayer_backprop(sublayer_cache, dinner, need_dx or self.norm_first)
        if dh is None:
            return None, dsource
        if self.norm_first:
            dh = norm.backprop(norm_cache, dh)
        return dy + dh, dsource

    @staticmethod
    def _attention_sublayer(attention, source, mask, use_causal_mask, return_attention_scores, training):
        """`attention` as a residual block's sublayer: the stream h attends to `source` (to itself
        when None) under a checked mask."""
        def sublayer(h):
            outputs, cache = attention.forward_checked(h, h if source is None else source, None, mask,
                                                       use_causal_mask, return_attention_scores, training)
            output, weights = outputs if return_attention_scores else (outputs, None)
            return output, cache, weights
        return sublayer

    def _feed_forward_sublayer(self, training):
        return lambda h: (*self.feed_forward.apply(h, training=training), None)

    def _feed_forward_backprop(self, cache, doutput, need_dx=True):
        return self.feed_forward.backprop(cache, doutput, need_dx), None

    def _self_attention_backprop(self, cache, doutput, need_dx=True):
        grads = self.self_attention.backprop(cache, doutput, need_dx)
        if grads is None:  # skipped: need_dx is False
            return None, None
        dquery, dvalue = grads
        dquery += dvalue  # query, key and value are one stream
        return dquery, None

    # where each residual block's weights start in the cached step's list (decoder_step.hpp's
    # DecoderLayerWeights): a norm's gamma and beta, then the sublayer's
    _STEP_SLOTS = {"self_attention": (0, ("query", "key", "value", "output")),
                   "cross_attention": (10, ("query", "output")), "feed_forward": (16, None)}

    def step_weights(self):
        """The 22 weights (or None) in the order the cached step takes them (`decoder_step.hpp`'s
        DecoderLayerWeights), from `residual_blocks()`: per block its norm's gamma and beta, then
        the attention's projections as (in, out) matrices with their biases (the cross-attention's
        query and output only: its keys and values are the cache's), or the feed-forward network's
        two kernels and biases. An encoder layer leaves the cross-attention block's entries None."""
        weights = [None] * 22
        for kind, norm, sublayer in self.residual_blocks():
            start, projections = self._STEP_SLOTS[kind]
            weights[start:start + 2] = [norm.params.get("gamma"), norm.params.get("beta")]
            if projections is None:
                denses = (sublayer.intermediate_dense, sublayer.output_dense)
                weights[start + 2:start + 6] = [w for d in denses for w in (d.params["kernel"], d.params.get("bias"))]
                continue
            for i, name in enumerate(projections):
                bias = sublayer.params.get(f"{name}_bias")
                weights[start + 2 + 2 * i:start + 4 + 2 * i] = [sublayer.matrix(name),
                                                                None if bias is None else bias.reshape(-1)]
        return weights

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout, "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon, "norm_first": self.norm_first, "seed": self.seed}


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
        padding_mask: ``(batch, T)`` (True = real token) or lengths ``(batch,)``; the `mask`
            an upstream layer (e.g. ``Embedding(mask_zero=True)``) passes is used when not given.
        attention_mask: ``(batch, T, T)`` or ``(T, T)``, True = may attend.
        use_causal_mask: each position attends only to itself and earlier ones.
        return_attention_scores: also return the weights ``(batch, num_heads, T, T)``.

    Output shape: ``(batch, T, D)``. Weights: ``self_attention/*`` (see MultiHeadAttention),
    ``norm1/*``, ``feed_forward/*``, ``norm2/*``. ``backprop(cache, dy)`` returns dinputs (with
    return_attention_scores, dy may be ``(doutput, None)``).
    """

    supports_masking = True

    def build(self, input_shape):
        self._model_dim(input_shape)
        self.self_attention = self._attention("self_attention", [input_shape, input_shape])
        self.norm1 = self._norm("norm1", input_shape)
        self.feed_forward = self._feed_forward(input_shape)
        self.norm2 = self._norm("norm2", input_shape)

    def forward(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False,
                return_attention_scores=False, training=False, mask=None):
        x = self._float_input(inputs, ndim=3, last_dim=self.model_dim)
        B, T = x.shape[:2]
        self_mask = _combine_masks(_attention_mask(attention_mask, B, T, T, _where(self, "attention_mask")),
                                   as_mask(mask if padding_mask is None else padding_mask, B, T,
                                           _where(self, "padding_mask")))
        return self.forward_checked(x, self_mask, use_causal_mask, return_attention_scores, training)

    def forward_checked(self, x, self_mask, use_causal_mask=False, return_attention_scores=False, training=False):
        """`forward` on inputs x (B, T, D) and the self-attention mask it checked (as
        `MultiHeadAttention.forward_checked` takes it): what TransformerEncoder runs per layer."""
        self_attend = self._attention_sublayer(self.self_attention, None, self_mask, use_causal_mask,
                                               return_attention_scores, training)
        y, weights, attention_block = self._residual(x, self.norm1, self_attend, training)
        y, _, feed_forward_block = self._residual(y, self.norm2, self._feed_forward_sublayer(training), training)
        outputs = (y, weights) if return_attention_scores else y
        return outputs, ((attention_block, feed_forward_block, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        attention_block, feed_forward_block, shape = cache
        dy = self._output_grad(dy, shape)
        dy, _ = self._residual_backprop(feed_forward_block, dy, self.norm2, self._feed_forward_backprop)
        dx, _ = self._residual_backprop(attention_block, dy, self.norm1, self._self_attention_backprop, need_dx)
        return dx

    def residual_blocks(self):
        """The layer's structure, read by the ONNX export: its residual blocks in order as (kind,
        norm, sublayer), as `TransformerDecoderLayer.residual_blocks`."""
        return [("self_attention", self.norm1, self.self_attention), ("feed_forward", self.norm2, self.feed_forward)]

    def start_cache(self, batch_size, capacity=16):
        """An empty `DecoderCache` for `step` over `batch_size` rows: this layer run causally, one
        position at a time (a decoder-only model's layer)."""
        return _start_cache(self, [self], None, None, capacity, batch_size)

    def step(self, x, cache):
        """One position x (N, D) over the cache: this layer's forward with use_causal_mask=True at
        that position (see `TransformerEncoder.step`). Returns (y, cache)."""
        y, cache, _ = _cached_step(self, [self], x, cache, False)
        return y, cache

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        if not return_attention_scores:
            return tuple(input_shape)
        return [tuple(input_shape), (input_shape[0], self.num_heads, input_shape[1], input_shape[1])]


class TransformerDecoderLayer(_TransformerLayerBase):
    """A transformer decoder layer: causal self-attention, cross-attention to the encoder's output
    (the memory), and a position-wise feed-forward network, each in a residual block.

    Post-norm (default): ``x = norm1(x + dropout(self_attn(x)))``,
    ``x = norm2(x + dropout(cross_attn(x, memory)))``, ``y = norm3(x + dropout(ff(x)))``;
    ``norm_first=True`` normalizes each block's input instead (as in TransformerEncoderLayer).

    Args: as TransformerEncoderLayer.

    Call arguments:
        inputs: ``[target (batch, T, D), memory (batch, S, D_memory)]``.
        decoder_padding_mask: ``(batch, T)`` or lengths, for the target's keys.
        decoder_attention_mask: ``(batch, T, T)`` or ``(T, T)`` for self-attention.
        encoder_padding_mask: ``(batch, S)`` or lengths, for the memory's keys.
        encoder_attention_mask: ``(batch, T, S)`` or ``(T, S)`` for cross-attention.
        use_causal_mask: target position t attends only to targets <= t (default True).
        return_attention_scores: also return the self- and cross-attention weights
            ``(batch, heads, T, T)`` and ``(batch, heads, T, S)``.

    Output shape: ``(batch, T, D)``. ``backprop(cache, dy)`` returns ``[dtarget, dmemory]``.
    Weights: ``self_attention/*``, ``norm1/*``, ``cross_attention/*``, ``norm2/*``,
    ``feed_forward/*``, ``norm3/*``. Cached decoding: ``start_cache`` / ``step`` (as
    `TransformerDecoder`'s, for this one layer); ``residual_blocks()`` describes the structure.
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

    def forward(self, inputs, decoder_padding_mask=None, decoder_attention_mask=None, encoder_padding_mask=None,
                encoder_attention_mask=None, use_causal_mask=True, return_attention_scores=False, training=False,
                mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got {type(inputs).__name__}")
        x = self._float_input(inputs[0], "target", ndim=3, last_dim=self.model_dim)
        memory = self._float_input(inputs[1], "memory", ndim=3)
        if isinstance(mask, (list, tuple)):  # masks propagated from upstream layers
            decoder_padding_mask = mask[0] if decoder_padding_mask is None else decoder_padding_mask
            encoder_padding_mask = mask[1] if encoder_padding_mask is None else encoder_padding_mask
        self_mask, cross_mask = _decoder_masks(self, x.shape[:2], memory.shape[1], decoder_padding_mask,
                                               decoder_attention_mask, encoder_padding_mask, encoder_attention_mask)
        return self.forward_checked(x, memory, self_mask, cross_mask, use_causal_mask, return_attention_scores,
                                    training)

    def forward_checked(self, x, memory, self_mask, cross_mask, use_causal_mask=True, return_attention_scores=False,
                        training=False):
        """`forward` on target x (B, T, D), memory (B, S, D_memory) and the self- and cross-attention
        masks it checked (as `MultiHeadAttention.forward_checked` takes them): what
        TransformerDecoder runs per layer."""
        self_attend = self._attention_sublayer(self.self_attention, None, self_mask, use_causal_mask,
                                               return_attention_scores, training)
        cross_attend = self._attention_sublayer(self.cross_attention, memory, cross_mask, False,
                                                return_attention_scores, training)
        y, self_weights, self_attention_block = self._residual(x, self.norm1, self_attend, training)
        y, cross_weights, cross_attention_block = self._residual(y, self.norm2, cross_attend, training)
        y, _, feed_forward_block = self._residual(y, self.norm3, self._feed_forward_sublayer(training), training)
        outputs = (y, self_weights, cross_weights) if return_attention_scores else y
        if not training:
            return outputs, None
        return outputs, (self_attention_block, cross_attention_block, feed_forward_block, y.shape)

    def backprop(self, cache, dy, need_dx=True):
        self_attention_block, cross_attention_block, feed_forward_block, shape = cache
        dy = self._output_grad(dy, shape)
        dy, _ = self._residual_backprop(feed_forward_block, dy, self.norm3, self._feed_forward_backprop)
        dy, dmemory = self._residual_backprop(cross_attention_block, dy, self.norm2, self.cross_attention.backprop)
        dtarget, _ = self._residual_backprop(self_attention_block, dy, self.norm1, self._self_attention_backprop,
                                             need_dx)
        return [dtarget, dmemory]

    def residual_blocks(self):
        """The layer's structure, read by the cached step's weights and the ONNX export: its residual
        blocks in order as (kind, norm, sublayer), kind "self_attention", "cross_attention" or
        "feed_forward"; each block is ``norm(x + sublayer(x))``, or ``x + sublayer(norm(x))`` with
        norm_first."""
        return [("self_attention", self.norm1, self.self_attention),
                ("cross_attention", self.norm2, self.cross_attention), ("feed_forward", self.norm3, self.feed_forward)]

    def start_cache(self, memory, encoder_padding_mask=None, capacity=16):
        """An empty `DecoderCache` of this layer for memory (N, S, D_memory); see `TransformerDecoder.start_cache`."""
        return _start_cache(self, [self], memory, encoder_padding_mask, capacity)

    def step(self, x, cache, return_attention_scores=False):
        """One target position through this layer over its cache; see `TransformerDecoder.step`."""
        return _cached_step(self, [self], x, cache, return_attention_scores)

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

    MAX_LAYERS = 256  # a file sets num_layers: a bound keeps building it linear in what the file holds

    layer_class = None

    def __init__(self, num_layers, num_heads, intermediate_dim, dropout=0.0, activation="relu",
                 layer_norm_epsilon=1e-5, norm_first=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or \
                not 1 <= num_layers <= self.MAX_LAYERS:
            raise ValueError(f"{type(self).__name__}: num_layers must be an integer in [1, {self.MAX_LAYERS}], "
                             f"got {num_layers!r}")
        self.num_layers = int(num_layers)
        self.layer_config = {"num_heads": num_heads, "intermediate_dim": intermediate_dim, "dropout": dropout,
                             "activation": activation, "layer_norm_epsilon": layer_norm_epsilon,
                             "norm_first": norm_first}
        self.seed = None if seed is None else random.as_seed(seed, type(self).__name__)
        self.blocks = [self.layer_class(**self.layer_config, seed=random.sub_seed(self.seed, i), dtype=self.dtype,
                                        name=f"{self.name}/layer_{i}") for i in range(self.num_layers)]

    def build(self, input_shape):
        for i, block in enumerate(self.blocks):
            self._add_sublayer(f"layer_{i}", block, input_shape)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_config, "seed": self.seed}


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

    def forward(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False,
                return_attention_scores=False, training=False, mask=None):
        y = self._float_input(inputs, ndim=3)
        B, T = y.shape[:2]
        # checked once, here, so that errors name this layer; the blocks take the checked mask
        self_mask = _combine_masks(_attention_mask(attention_mask, B, T, T, _where(self, "attention_mask")),
                                   as_mask(mask if padding_mask is None else padding_mask, B, T,
                                           _where(self, "padding_mask")))
        return self.forward_checked(y, self_mask, use_causal_mask, return_attention_scores, training)

    def forward_checked(self, y, self_mask, use_causal_mask=False, return_attention_scores=False, training=False):
        """`forward` on inputs (B, T, D) and the self-attention mask it checked (as
        `MultiHeadAttention.forward_checked` takes it), for models that checked their masks."""
        block_caches, all_weights = [], []
        for block in self.blocks:
            outputs, cache = block.forward_checked(y, self_mask, use_causal_mask, return_attention_scores, training)
            y, weights = outputs if return_attention_scores else (outputs, None)
            block_caches.append(cache)
            all_weights.append(weights)
        outputs = (y, all_weights) if return_attention_scores else y
        return outputs, ((block_caches, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        block_caches, shape = cache
        dy = self._output_grad(dy, shape)
        for block, block_cache in zip(reversed(self.blocks), reversed(block_caches)):
            dy = block.backprop(block_cache, dy, need_dx or block is not self.blocks[0])
        return dy

    def start_cache(self, batch_size, capacity=16):
        """An empty `DecoderCache` for `step`: the stack run causally one position at a time (a
        decoder-only model), as `TransformerDecoder.start_cache` without a memory."""
        return _start_cache(self, self.blocks, None, None, capacity, batch_size)

    def step(self, x, cache):
        """One position through every layer at once: equal to this stack's forward with
        use_causal_mask=True at that position; see `TransformerDecoder.step`. Returns (y, cache)."""
        y, cache, _ = _cached_step(self, self.blocks, x, cache, False)
        return y, cache

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


class TransformerDecoder(_TransformerStack):
    """A stack of `num_layers` TransformerDecoderLayer blocks, all attending to the same memory.

    Args: num_layers, then those of TransformerDecoderLayer.
    Call arguments: as TransformerDecoderLayer; with return_attention_scores the self- and
    cross-attention weights come as two lists, one array per layer.
    Output shape ``(batch, T, D)``; ``backprop(cache, dy)`` returns ``[dtarget, dmemory]``.
    Cached decoding: ``cache = start_cache(memory, encoder_padding_mask)``, then per position
    ``y, cache, weights = step(x, cache)`` (every layer in one C++ call).
    """

    layer_class = TransformerDecoderLayer

    def forward(self, inputs, decoder_padding_mask=None, decoder_attention_mask=None, encoder_padding_mask=None,
                encoder_attention_mask=None, use_causal_mask=True, return_attention_scores=False, training=False,
                mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got {type(inputs).__name__}")
        y = self._float_input(inputs[0], "target", ndim=3)
        memory = self._float_input(inputs[1], "memory", ndim=3)
        (B, T), S = y.shape[:2], memory.shape[1]
        if isinstance(mask, (list, tuple)):  # masks propagated from upstream layers
            decoder_padding_mask = mask[0] if decoder_padding_mask is None else decoder_padding_mask
            encoder_padding_mask = mask[1] if encoder_padding_mask is None else encoder_padding_mask
        # checked once, here, so that errors name this layer; the blocks take the checked masks
        self_mask, cross_mask = _decoder_masks(self, (B, T), S, decoder_padding_mask, decoder_attention_mask,
                                               encoder_padding_mask, encoder_attention_mask)
        return self.forward_checked(y, memory, self_mask, cross_mask, use_causal_mask, return_attention_scores,
                                    training)

    def forward_checked(self, y, memory, self_mask, cross_mask, use_causal_mask=True, return_attention_scores=False,
                        training=False):
        """`forward` on target (B, T, D), memory (B, S, D_memory) and the masks it checked (as
        `TransformerDecoderLayer.forward_checked` takes them), for models that checked their masks."""
        block_caches, self_weights, cross_weights = [], [], []
        for block in self.blocks:
            outputs, cache = block.forward_checked(y, memory, self_mask, cross_mask, use_causal_mask,
                                                   return_attention_scores, training)
            y, w_self, w_cross = outputs if return_attention_scores else (outputs, None, None)
            block_caches.append(cache)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        outputs = (y, self_weights, cross_weights) if return_attention_scores else y
        return outputs, ((block_caches, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        block_caches, shape = cache
        dy = self._output_grad(dy, shape)
        dmemory = None
        for block, block_cache in zip(reversed(self.blocks), reversed(block_caches)):
            dy, dblock_memory = block.backprop(block_cache, dy, need_dx or block is not self.blocks[0])
            dmemory = dblock_memory if dmemory is None else dmemory + dblock_memory  # every block reads the memory
        return [dy, dmemory]

    def start_cache(self, memory, encoder_padding_mask=None, capacity=16):
        """The `DecoderCache` that decoding starts from, for encoder outputs memory (N, S, D_memory):
        every layer's cross-attention keys and values of the memory, projected once, empty
        self-attention caches of `capacity` positions (they grow when decoding goes further), and
        the memory's padding mask ((N, S) or lengths (N,), checked here once for the whole decoding)."""
        return _start_cache(self, self.blocks, memory, encoder_padding_mask, capacity)

    def step(self, x, cache, return_attention_scores=False):
        """One target position through every layer at once (one C++ call, `decoder_step.hpp`):
        equal to this stack's causal `forward` at that position.

        Args:
            x: (N, D) the embedded target tokens of position ``cache.length``.
            cache: a `DecoderCache` (from `start_cache`, or returned by the last step); its rows for
                this position are written in place.
            return_attention_scores: also return the last layer's cross-attention weights (N, heads, S).
        Returns:
            (y (N, D), the cache (the same object, one position longer), weights or None).
        """
        return _cached_step(self, self.blocks, x, cache, return_attention_scores)

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else None

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])


# ---------------------------------------------------------------------------- cached decoding
class DecoderCache:
    """What the cached decoding of decoder layers carries for N rows (CTranslate2's per-layer cache):

    - ``keys``, ``values`` (layers, N, capacity, D): the self-attention keys and values of the
      ``length`` positions decoded so far (rows beyond ``length`` unused);
    - ``cross_keys``, ``cross_values`` (layers, N, S, D): the memory's, projected once;
    - ``source_mask`` (N, S) bool (True = real memory position), or None.

    A step writes its position's rows in place; `select` gives the independent cache of some rows.
    """

    __slots__ = ("keys", "values", "cross_keys", "cross_values", "source_mask", "length", "layer_weights")

    def __init__(self, keys, values, cross_keys, cross_values, source_mask, length, layer_weights):
        self.keys, self.values, self.cross_keys, self.cross_values = keys, values, cross_keys, cross_values
        self.source_mask, self.length = source_mask, length
        self.layer_weights = layer_weights  # each layer's step_weights(): views of its weights, read once

    def select(self, rows):
        """The cache of the given rows (an index or bool array), in that order; only the decoded
        positions are copied."""
        keys = np.empty((self.keys.shape[0], len(np.arange(self.keys.shape[1])[rows])) + self.keys.shape[2:],
                        self.keys.dtype)
        values = np.empty_like(keys)
        keys[:, :, :self.length] = self.keys[:, rows, :self.length]
        values[:, :, :self.length] = self.values[:, rows, :self.length]
        return DecoderCache(keys, values, np.ascontiguousarray(self.cross_keys[:, rows]),
                            np.ascontiguousarray(self.cross_values[:, rows]),
                            None if self.source_mask is None else self.source_mask[rows], self.length,
                            self.layer_weights)

    def _grow(self, positions):
        """Room for at least `positions` positions (capacity doubled, decoded rows kept)."""
        L, N, capacity, D = self.keys.shape
        if positions <= capacity:
            return
        capacity = max(positions, 2 * capacity)
        for name in ("keys", "values"):
            grown = np.empty((L, N, capacity, D), self.keys.dtype)
            grown[:, :, :self.length] = getattr(self, name)[:, :, :self.length]
            setattr(self, name, grown)


def _start_cache(owner, blocks, memory, encoder_padding_mask, capacity, batch_size=None):
    """`start_cache` of a layer or stack (`owner`) made of transformer layers `blocks`: decoder
    layers attending to `memory`, or encoder layers (memory None) over `batch_size` rows."""
    if not owner.built:
        raise ValueError(f"Layer '{owner.name}': start_cache needs the layer built (call it once, or build it)")
    for value, arg in ((capacity, "capacity"), (batch_size, "batch_size")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{_where(owner, arg)} must be a positive integer, got {value!r}")
    D, dtype = blocks[0].model_dim, owner.dtype
    if memory is None:
        N, source_mask = int(batch_size), None
        cross_keys = cross_values = np.empty((len(blocks), N, 0, D), dtype)
    else:
        memory = owner._float_input(memory, "memory", ndim=3)
        N, S = memory.shape[:2]
        source_mask = as_mask(encoder_padding_mask, N, S, _where(owner, "encoder_padding_mask"))
        cross_keys = np.stack([b.cross_attention.project("key", memory) for b in blocks])
        cross_values = np.stack([b.cross_attention.project("value", memory) for b in blocks])
    keys = np.empty((len(blocks), N, int(capacity), D), dtype)
    return DecoderCache(keys, np.empty_like(keys), cross_keys, cross_values, source_mask, 0,
                        [block.step_weights() for block in blocks])


def _cached_step(owner, blocks, x, cache, return_attention_scores):
    """`step` of a decoder layer or stack (`owner`) made of decoder layers `blocks`: one call of
    the cached step kernel for all of them."""
    first = blocks[0]
    x = owner._float_input(x, "x", ndim=2, last_dim=first.model_dim)
    if not isinstance(cache, DecoderCache) or cache.keys.shape[:2] != (len(blocks), len(x)):
        raise ValueError(f"{_where(owner, 'cache')} expected the DecoderCache of {len(blocks)} layer(s) and "
                         f"{len(x)} rows that start_cache or the last step returned")
    cache._grow(cache.length + 1)
    y, weights = kernels.decoder_stack_step(
        x=x, self_keys=cache.keys, self_values=cache.values, cross_keys=cache.cross_keys,
        cross_values=cache.cross_values, source_mask=cache.source_mask, position=cache.length,
        weights=cache.layer_weights, num_heads=first.num_heads, norm_first=first.norm_first,
        epsilon=first.layer_norm_epsilon, activation=first.activation,
        return_attention=bool(return_attention_scores))
    cache.length += 1
    return y, cache, weights
