"""Keras-style attention pooling over the steps of a sequence (the sentiment tutorial's layer)."""

from .. import initializers, kernels
from ..masking import as_mask
from .attention import is_shape
from .base import Layer


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
        use_mask: False ignores the mask the layer is given (an ``Embedding(mask_zero=True)``
            upstream), as the tutorial's Keras layer does: its ``call`` takes no mask.

    Call arguments:
        inputs: (B, T, d).
        mask: (B, T) bool (True = real step) or lengths (B,); padded steps get weight 0, and a
            fully padded row pools to zeros. Ignored when ``use_mask=False``.
        return_attention_scores: also return the weights a (B, T).

    Output shape:
        (B, d), or (B, T, d) with return_sequences; plus (B, T) weights on request.
    """

    supports_masking = True

    def __init__(self, return_sequences=False, length_agnostic=False, kernel_initializer="random_normal",
                 bias_initializer="zeros", use_mask=True, **kwargs):
        super().__init__(**kwargs)
        self.return_sequences = bool(return_sequences)
        self.length_agnostic = bool(length_agnostic)
        self.use_mask = bool(use_mask)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)

    def build(self, input_shape):
        if not is_shape(input_shape, (3,)) or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, T, features), got shape {input_shape}")
        if not self.length_agnostic and input_shape[1] is None:
            raise ValueError(f"Layer '{self.name}': the per-step bias needs a fixed T, got shape {input_shape}; "
                             f"use AttentionPooling(length_agnostic=True) for variable lengths")
        self.add_weight("kernel", (input_shape[-1], 1), self.kernel_initializer)
        self.add_weight("bias", (1 if self.length_agnostic else input_shape[1], 1), self.bias_initializer)

    def forward(self, inputs, training=False, mask=None, return_attention_scores=False):
        kernel = self.params["kernel"]
        x = self._float_input(inputs, ndim=3, last_dim=kernel.shape[0])
        B, T, _ = x.shape
        if not self.length_agnostic and T != self.params["bias"].shape[0]:
            raise ValueError(f"Layer '{self.name}': built for T={self.params['bias'].shape[0]} time steps (bias "
                             f"of shape {self.params['bias'].shape}), got inputs of shape {x.shape}; use "
                             f"AttentionPooling(length_agnostic=True) to accept any length")
        mask = as_mask(mask, B, T, f"Layer '{self.name}': `mask`") if self.use_mask else None
        out, weights, energy = kernels.attention_pooling_forward(
            x=x, kernel=kernel, bias=self.params["bias"], mask=mask,
            return_sequences=self.return_sequences)
        cache = {"x": x, "weights": weights, "energy": energy, "return_weights": bool(return_attention_scores)}
        return ((out, weights) if return_attention_scores else out), (cache if training else None)

    def backprop(self, cache, dy, need_dx=True):
        x = cache["x"]
        B, T, d = x.shape
        dout, dweights = dy if cache["return_weights"] else (dy, None)
        dout = self._grad_input(dout, (B, T, d) if self.return_sequences else (B, d))
        if dweights is not None:
            dweights = self._grad_input(dweights, (B, T), "dweights")
        # the kernel computes dx in the same pass as the parameter gradients (no flag to skip it)
        grads = self.grads  # (a property: read once)
        return kernels.attention_pooling_backward(dout=dout, dweights=dweights, weights=cache["weights"],
                                                energy=cache["energy"], x=x, kernel=self.params["kernel"],
                                                dkernel=grads["kernel"], dbias=grads["bias"],
                                                return_sequences=self.return_sequences)

    def compute_mask(self, inputs, mask=None):
        return mask if self.return_sequences and self.use_mask else None

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        out = tuple(input_shape) if self.return_sequences else (input_shape[0], input_shape[-1])
        return [out, tuple(input_shape[:2])] if return_attention_scores else out

    def get_config(self):
        return {**super().get_config(), "return_sequences": self.return_sequences,
                "length_agnostic": self.length_agnostic, "use_mask": self.use_mask,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer)}

