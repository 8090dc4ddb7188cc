"""Transformer blocks: layer normalization, positional encodings, the position-wise feed-forward
network, multi-head attention, and encoder / decoder layers and stacks.

The math runs in C++ (`transformer.hpp`, `attention.hpp`, `dense.hpp`); these classes check
inputs, lay out buffers and chain the backward passes. Composite layers (FeedForward,
MultiHeadAttention's callers, encoder and decoder layers) expose their sublayers' weights in their
own ``params`` / ``grads`` under ``"<sublayer>/<weight>"`` names, sharing the same arrays.

Masks follow Keras: bool, True = real token / may attend. A padding mask ``(batch, S)`` may also be
given as lengths ``(batch,)`` of ints. A query that may attend to nothing gets zero attention
weights (and so only the output bias), never NaN.
"""
import numpy as np

from .. import _core, activations, backend, initializers
from .base import Layer
from .core import Dense


def _dropout_keep(shape, rate):
    """A bool keep-mask drawn in C++ from a seed of attnx's generator (None when rate is 0)."""
    if rate == 0.0:
        return None
    return _core.dropout_keep_mask(list(shape), rate, int(backend.rng().integers(0, 2 ** 63)))


class _Composite(Layer):
    """A layer made of sublayers whose weights it exposes as its own, "<prefix>/<name>"."""

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
        hidden = self.intermediate_dense(inputs, training=training)
        keep = _dropout_keep(hidden.shape, self.dropout) if training else None
        if keep is not None:
            hidden = _core.apply_keep_mask(hidden, keep, 1.0 / (1.0 - self.dropout))
        if training:
            self._cache = (keep,)
        return self.output_dense(hidden, training=training)

    def backward(self, dy):
        keep, = self._saved()
        dhidden = self.output_dense.backward(dy)
        if keep is not None:
            dhidden = _core.apply_keep_mask(dhidden, keep, 1.0 / (1.0 - self.dropout))
        return self.intermediate_dense.backward(dhidden)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "activation": self.activation,
                "dropout": self.dropout, "output_dim": self.output_dim}
