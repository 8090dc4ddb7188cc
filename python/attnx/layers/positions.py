"""Position information for sequences: the fixed sinusoidal encoding of "Attention Is All You Need"
and a learned position embedding."""


import numpy as np

from .. import initializers, kernels
from .attention import is_shape
from .base import Layer


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

