"""The transformer's position-wise feed-forward network (Dense, activation, dropout, Dense) in one
fused call."""

import numpy as np

from .. import activations, kernels, quantization, random
from .attention import is_shape
from .composite import _Composite, _dropout_stream
from .core import Dense


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

    @property
    def quantization_mode(self):
        return self.intermediate_dense.quantization_mode if self.built else None

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
            "intermediate", Dense(self.intermediate_dim, self.activation, dtype=self.dtype_policy,
                                  name=f"{self.name}/intermediate"), input_shape)
        self.output_dense = self._add_sublayer(
            "output", Dense(out_dim, dtype=self.dtype_policy, name=f"{self.name}/output"),
            tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def forward(self, inputs, training=False):
        if self.quantization_mode:  # int8: both products in one kernel, the hidden rows kept in cache
            quantization.inference_only(self, training)
            inner, outer = self.intermediate_dense, self.output_dense
            x = self._float_input(inputs, min_ndim=2, last_dim=inner.params["kernel"].shape[0])
            y = kernels.feed_forward_forward_int8(
                x=np.require(x.reshape(-1, x.shape[-1]), np.float32, "CA"), activation=self.activation,
                kernel1=quantization.packed(inner, "kernel"), bias1=inner.params.get("bias"),
                kernel2=quantization.packed(outer, "kernel"), bias2=outer.params.get("bias"))
            return y.reshape(x.shape[:-1] + (y.shape[-1],)), None
        # inference in one float32 kernel, blocks of rows: the (batch, ..., intermediate_dim) hidden is never
        # stored; under mixed_bfloat16 (the sublayers take the policy) the two Dense layers' bf16 products
        if not training and self.intermediate_dense.compute_dtype != "bfloat16":
            inner, outer = self.intermediate_dense.params, self.output_dense.params
            x = self._float_input(inputs, min_ndim=2, last_dim=inner["kernel"].shape[0])
            y = kernels.feed_forward_forward(x=x.reshape(-1, x.shape[-1]), kernel1=inner["kernel"],
                                           bias1=inner.get("bias"), kernel2=outer["kernel"], bias2=outer.get("bias"),
                                           activation=self.activation)
            return y.reshape(x.shape[:-1] + (y.shape[-1],)), None
        hidden, intermediate_cache = self.intermediate_dense.apply(inputs, training=True)
        # the mask drawn as it is used, forward and backward: never written out (a (B, T, F) buffer)
        stream = _dropout_stream(self.seed_generator, hidden.shape[0], self.dropout)
        if stream is not None:
            hidden = kernels.apply_keep(x=hidden, dropout_stream=stream)
        y, output_cache = self.output_dense.apply(hidden, training=True)
        return y, (intermediate_cache, stream, output_cache)

    def backprop(self, cache, dy, need_dx=True):
        intermediate_cache, stream, output_cache = cache
        dhidden = self.output_dense.backprop(output_cache, dy)
        if stream is not None:
            dhidden = kernels.apply_keep(x=dhidden, dropout_stream=stream)
        return self.intermediate_dense.backprop(intermediate_cache, dhidden, need_dx)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        return {**super().get_config(), "intermediate_dim": self.intermediate_dim, "activation": self.activation,
                "dropout": self.dropout, "output_dim": self.output_dim, "seed": self.seed}

