"""Conv1D (Keras 3's, channels last) on the kernels of Conv2D: a sequence (B, T, C) is an image of one
row (B, 1, T, C), a (K, C, F) kernel one of (1, K, C, F)."""
import numpy as np

from .. import kernels
from ..masking import as_mask
from .base import Layer
from .conv import _check_elements, _output_size, _positive_int

_PADDINGS = ("valid", "same", "causal")


def _one(value, arg):
    """An integer, or a tuple / list of one (Keras takes both)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"Conv1D: {arg} must be an integer or a tuple of one, got {value!r}")
        value = value[0]
    return _positive_int(value, arg, "Conv1D")


class Conv1D(Layer):
    """1-D convolution over steps (Keras' Conv1D, ``data_format="channels_last"``):
    ``outputs[t] = activation(sum_k inputs[t * strides + k * dilation_rate] . kernel[k] + bias)``.

    Args:
        filters: output channels.
        kernel_size: the window's steps (an integer or a tuple of one).
        strides: default 1.
        padding: "valid" (whole windows only), "same" (output ``ceil(T / strides)``, zeros at both
            ends, the odd one at the end, as TensorFlow) or "causal" (zeros before the sequence, so that
            output t sees steps <= t).
        dilation_rate: the gap between the window's taps, default 1 (with strides 1 only, as Keras).
        groups: the channels and filters split into this many groups, each filter reading its group's
            channels only (Keras' grouped convolution), default 1.
        activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
            kernel_constraint, bias_constraint: as Conv2D.

    Input (batch, steps, channels); output (batch, new_steps, filters). The kernel is stored as Keras
    does, (kernel_size, channels, filters). A mask (batch, steps) (Keras ignores one) makes the masked
    steps read as zeros, so that padding does not leak into the real steps' outputs; the output has no
    mask (its steps are windows).
    """

    _bf16_products = True  # attnx.mixed_precision: the convolution's products (conv.hpp's bf16 path)

    def __init__(self, filters, kernel_size, strides=1, padding="valid", dilation_rate=1, activation=None,
                 use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None, bias_constraint=None,
                 data_format="channels_last", groups=1, **kwargs):
        super().__init__(**kwargs)
        if data_format != "channels_last":
            raise ValueError(f"Conv1D: only data_format='channels_last' is supported, got {data_format!r}; "
                             "transpose the inputs to (batch, steps, channels)")
        self.filters = _positive_int(filters, "filters", "Conv1D")
        self.groups = _positive_int(groups, "groups", "Conv1D")
        if self.filters % self.groups:
            raise ValueError(f"Conv1D: filters={self.filters} must be a multiple of groups={self.groups}")
        self.kernel_size = _one(kernel_size, "kernel_size")
        self.strides = _one(strides, "strides")
        self.dilation_rate = _one(dilation_rate, "dilation_rate")
        if self.strides > 1 and self.dilation_rate > 1:
            raise ValueError(f"Conv1D: strides={self.strides} with dilation_rate={self.dilation_rate}: one of them "
                             "must be 1 (as in Keras)")
        self.padding = str(padding).lower()
        if self.padding not in _PADDINGS:
            raise ValueError(f"Conv1D: padding must be one of {_PADDINGS}, got {padding!r}")
        self._set_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                                   bias_regularizer, kernel_constraint, bias_constraint)

    @property
    def _span(self):
        """The steps one window covers: (kernel_size - 1) * dilation_rate + 1."""
        return (self.kernel_size - 1) * self.dilation_rate + 1

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, steps, channels) with known channels, "
                             f"got shape {input_shape}")
        if input_shape[-1] % self.groups:
            raise ValueError(f"Layer '{self.name}': {input_shape[-1]} input channels do not split into groups="
                             f"{self.groups}")
        shape = (self.kernel_size, input_shape[-1] // self.groups, self.filters)
        _check_elements(shape, "the kernel", f"Layer '{self.name}'")
        self._add_kernel_and_bias(shape, self.filters)

    def _image_kernel(self):
        """The kernel as Conv2D's (1, span, C, F): the taps dilation_rate apart, zeros between them."""
        kernel = self.params["kernel"]
        if self.dilation_rate == 1:
            return kernel.reshape((1,) + kernel.shape)  # a view: no copy
        wide = np.zeros((1, self._span) + kernel.shape[1:], dtype=kernel.dtype)
        wide[0, ::self.dilation_rate] = kernel
        return wide

    def forward(self, inputs, training=False, mask=None):
        kernel = self.params["kernel"]
        if isinstance(inputs, np.ndarray):
            _check_elements(inputs.shape, "the input", f"Layer '{self.name}'")
        x = self._float_input(inputs, ndim=3, last_dim=kernel.shape[1] * self.groups)
        keep = None
        if mask is not None:
            keep = as_mask(mask, x.shape[0], x.shape[1], f"Layer '{self.name}': `mask`")[:, :, None]
            x = x * keep
        steps = x.shape[1]
        padding = "valid" if self.padding == "causal" else self.padding
        if self.padding == "causal":  # zeros before the sequence: output t sees steps <= t
            x = np.concatenate([np.zeros((x.shape[0], self._span - 1, x.shape[2]), x.dtype), x], axis=1)
        if padding == "valid" and x.shape[1] < self._span:
            raise ValueError(f"Layer '{self.name}': a window of {self._span} steps is longer than the input's "
                             f"{steps} (shape {np.shape(inputs)}) with padding 'valid'")
        image = np.ascontiguousarray(x[:, None])
        image_kernel = self._image_kernel()
        bias = self.params.get("bias")
        parts = []
        for images, group_kernel, group_bias in self._groups(image, image_kernel, bias):
            parts.append(kernels.conv2d_forward(x=images, kernel=group_kernel, bias=group_bias,
                                                strides=(1, self.strides), padding=padding,
                                                activation=self.activation, bf16=self.compute_dtype == "bfloat16"))
        cache = (image, image_kernel, parts, padding, keep, steps) if training else None
        y = parts[0][0] if self.groups == 1 else np.concatenate([part[0] for part in parts], axis=-1)
        return y[:, 0], cache

    def _groups(self, image, image_kernel, bias):
        """(channels, kernel, bias) of each group, contiguous (the whole arrays when groups = 1)."""
        if self.groups == 1:
            return [(image, image_kernel, bias)]
        c, f = image.shape[-1] // self.groups, self.filters // self.groups
        return [(np.ascontiguousarray(image[..., g * c:(g + 1) * c]),
                 np.ascontiguousarray(image_kernel[..., g * f:(g + 1) * f]),
                 None if bias is None else np.ascontiguousarray(bias[g * f:(g + 1) * f]))
                for g in range(self.groups)]

    def backprop(self, cache, dy, need_dx=True):
        image, image_kernel, parts, padding, keep, steps = cache
        y0 = parts[0][0]
        dy = self._grad_input(dy, (y0.shape[0], y0.shape[2], self.filters))[:, None]
        dkernel, dbias = self.grads["kernel"], self.grads.get("bias")
        direct = self.dilation_rate == 1 and self.groups == 1  # the kernels add into the gradients themselves
        dwide = dkernel.reshape((1,) + dkernel.shape) if direct else np.zeros_like(image_kernel)
        dbias_all = dbias if direct or dbias is None else np.zeros_like(dbias)
        f = self.filters // self.groups
        dxs = []
        groups = self._groups(image, image_kernel, None)
        for g, ((images, group_kernel, _), (y, z)) in enumerate(zip(groups, parts)):
            one = slice(g * f, (g + 1) * f)
            dkernel_g = dwide if self.groups == 1 else np.zeros_like(group_kernel)
            dbias_g = dbias_all if self.groups == 1 or dbias is None else np.zeros(f, dbias.dtype)
            dxs.append(kernels.conv2d_backward(dy=dy if self.groups == 1 else np.ascontiguousarray(dy[..., one]),
                                               x=images, kernel=group_kernel, y=y, z=z, strides=(1, self.strides),
                                               padding=padding, activation=self.activation, dkernel=dkernel_g,
                                               dbias=dbias_g, need_dx=need_dx, bf16=self.compute_dtype == "bfloat16"))
            if self.groups > 1:
                dwide[..., one] += dkernel_g
                if dbias is not None:
                    dbias_all[one] += dbias_g
        if not direct:  # the taps' gradients; the zeros between them are no weights
            dkernel += dwide[0, ::self.dilation_rate]
            if dbias is not None:
                dbias += dbias_all
        if dxs[0] is None:
            return None
        dx = dxs[0] if self.groups == 1 else np.concatenate(dxs, axis=-1)
        dx = dx[:, 0, dx.shape[2] - steps:]  # without the causal zeros
        if keep is not None:
            dx = dx * keep
        return np.ascontiguousarray(dx)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        steps = input_shape[1]
        if self.padding == "causal":
            steps = None if steps is None else steps + self._span - 1
        return (input_shape[0], _output_size(steps, self._span, self.strides,
                                             "valid" if self.padding == "causal" else self.padding), self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": [self.kernel_size],
                "strides": [self.strides], "padding": self.padding, "dilation_rate": [self.dilation_rate],
                "groups": self.groups, **self._kernel_arguments_config()}
