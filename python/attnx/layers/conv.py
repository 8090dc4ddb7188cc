"""Convolution and pooling over images, channels last as in Keras: Conv2D, MaxPooling2D,
AveragePooling2D. A feature map becomes (B, L, D) regions for an attention decoder with
``Reshape((-1, channels))``."""
import math
import numbers

import numpy as np

from .. import kernels
from .base import Layer

# the kernels index images, windows and weights with C++ ints (the bindings refuse larger arrays)
MAX_SIZE = 2 ** 31 - 1


def _positive_int(value, arg, owner):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{owner}: {arg} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{owner}: {arg} must be positive, got {value!r}")
    if value > MAX_SIZE:
        raise ValueError(f"{owner}: {arg} must be at most {MAX_SIZE} (the kernels index with C++ ints), got {value!r}")
    return int(value)


def _check_elements(shape, what, owner):
    """ValueError naming `owner` when an array of `shape` would have more elements than the kernels take."""
    if math.prod(shape) > MAX_SIZE:
        raise ValueError(f"{owner}: {what} of shape {tuple(shape)} would hold {math.prod(shape)} values; the "
                         f"kernels take at most {MAX_SIZE}")


def _pair(value, arg, owner):
    """`value` (an integer or two) as a pair of positive ints; TypeError or ValueError naming `owner`."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2:
        raise ValueError(f"{owner}: {arg} must be an integer or a pair of integers, got {value!r}")
    return tuple(_positive_int(v, arg, owner) for v in items)


def _padding(value, owner):
    padding = str(value).lower()
    if padding not in ("same", "valid"):
        raise ValueError(f"{owner}: padding must be 'same' or 'valid', got {value!r}")
    return padding


def _output_size(size, window, stride, padding):
    """TensorFlow's output length on one axis (None for an unknown size): every window that fits
    ('valid') or ceil(size / stride) ('same', the input padded at both ends, the odd pixel at the end)."""
    if size is None:
        return None
    if padding == "same":
        return -(-size // stride)
    return (size - window) // stride + 1


class _Windows2D(Layer):
    """What convolution and pooling share: windows over (batch, rows, cols, channels) images."""

    def _window_shape(self):
        raise NotImplementedError

    @property
    def window_shape(self):
        """(rows, cols) of the window: Conv2D's kernel_size, a pooling layer's pool_size."""
        return tuple(self._window_shape())

    def _image(self, inputs, channels=None):
        """inputs as a (B, H, W, C) array of the layer's dtype, every window with a real pixel."""
        if isinstance(inputs, np.ndarray):  # before a copy (a broadcast view may stand for gigabytes)
            _check_elements(inputs.shape, "the input", f"Layer '{self.name}'")
        x = self._float_input(inputs, ndim=4, last_dim=channels)
        window = self._window_shape()
        if self.padding == "valid" and (x.shape[1] < window[0] or x.shape[2] < window[1]):
            raise ValueError(f"Layer '{self.name}': window {window[0]}x{window[1]} is larger than the input's "
                             f"{x.shape[1]}x{x.shape[2]} pixels (shape {x.shape}) with padding 'valid'")
        return x

    def _output_shape(self, input_shape, channels):
        if len(input_shape) != 4:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, rows, cols, channels), got shape "
                             f"{tuple(input_shape)}")
        window = self._window_shape()
        return (input_shape[0],
                _output_size(input_shape[1], window[0], self.strides[0], self.padding),
                _output_size(input_shape[2], window[1], self.strides[1], self.padding), channels)


class Conv2D(_Windows2D):
    """2-D convolution over images (Keras' Conv2D, ``data_format="channels_last"``):
    ``outputs = activation(conv2d(inputs, kernel) + bias)``.

    Args:
        filters: output channels.
        kernel_size: an integer or (rows, cols) of the window.
        strides: an integer or (rows, cols), default 1.
        padding: "valid" (only whole windows) or "same" (output ``ceil(size / stride)``, zeros added
            around the input, the extra one at the bottom and right as in TensorFlow).
        activation: "linear" (default, also None), "relu", "tanh", "sigmoid", "softmax" (over the
            channels) or "gelu".
        use_bias: whether to add a bias.
        kernel_initializer, bias_initializer: Keras defaults glorot_uniform and zeros.
        kernel_regularizer, bias_regularizer: e.g. ``attnx.regularizers.L2(1e-3)``.
        kernel_constraint, bias_constraint: e.g. ``attnx.constraints.MaxNorm(2)``, after each optimizer step.

    Input shape ``(batch, rows, cols, channels)``; output ``(batch, new_rows, new_cols, filters)``.
    The kernel is stored as Keras does, ``(kernel_rows, kernel_cols, channels, filters)``.
    """

    _bf16_products = True  # attnx.mixed_precision: the convolution's products (conv.hpp's bf16 path)

    def __init__(self, filters, kernel_size, strides=(1, 1), padding="valid", activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", kernel_regularizer=None,
                 bias_regularizer=None, kernel_constraint=None, bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = _positive_int(filters, "filters", "Conv2D")
        self.kernel_size = _pair(kernel_size, "kernel_size", "Conv2D")
        _check_elements(self.kernel_size + (self.filters,), "a kernel (rows, cols, filters) on one channel", "Conv2D")
        self.strides = _pair(strides, "strides", "Conv2D")
        self.padding = _padding(padding, "Conv2D")
        self._set_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                                   bias_regularizer, kernel_constraint, bias_constraint)

    def _window_shape(self):
        return self.kernel_size

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, rows, cols, channels) with known channels, "
                             f"got shape {input_shape}")
        _check_elements(self.kernel_size + (input_shape[-1], self.filters), "the kernel", f"Layer '{self.name}'")
        self._add_kernel_and_bias(self.kernel_size + (input_shape[-1], self.filters), self.filters)

    def forward(self, inputs, training=False):
        kernel = self.params["kernel"]
        x = self._image(inputs, channels=kernel.shape[2])
        y, z = kernels.conv2d_forward(x=x, kernel=kernel, bias=self.params.get("bias"), strides=self.strides,
                                    padding=self.padding, activation=self.activation,
                                    bf16=self.compute_dtype == "bfloat16")
        return y, ((x, y, z) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        x, y, z = cache
        return kernels.conv2d_backward(dy=self._grad_input(dy, y.shape), x=x, kernel=self.params["kernel"], y=y, z=z,
                                     strides=self.strides, padding=self.padding, activation=self.activation,
                                     dkernel=self.grads["kernel"], dbias=self.grads.get("bias"),
                                     need_dx=need_dx, bf16=self.compute_dtype == "bfloat16")

    def compute_output_shape(self, input_shape):
        return self._output_shape(input_shape, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, **self._kernel_arguments_config()}


class _Pooling2D(_Windows2D):
    """Pooling over windows of images; subclasses name their two kernels, and whether the backward
    one reads the forward's output."""

    _forward_kernel = _backward_kernel = None
    _backward_reads_output = False

    def __init__(self, pool_size=(2, 2), strides=None, padding="valid", **kwargs):
        super().__init__(**kwargs)
        owner = type(self).__name__
        self.pool_size = _pair(pool_size, "pool_size", owner)
        self.strides = self.pool_size if strides is None else _pair(strides, "strides", owner)
        self.padding = _padding(padding, owner)

    def _window_shape(self):
        return self.pool_size

    def forward(self, inputs, training=False):
        x = self._image(inputs)
        y = self._forward_kernel(x=x, pool_size=self.pool_size, strides=self.strides, padding=self.padding)
        return y, ((x, y) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        x, y = cache
        output = {"y": y} if self._backward_reads_output else {}
        return self._backward_kernel(dy=self._grad_input(dy, y.shape), x=x, **output, pool_size=self.pool_size,
                                     strides=self.strides, padding=self.padding)

    def compute_output_shape(self, input_shape):
        return self._output_shape(input_shape, input_shape[-1] if len(input_shape) == 4 else None)

    def get_config(self):
        return {**super().get_config(), "pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding}


class MaxPooling2D(_Pooling2D):
    """Max pooling over images (Keras' MaxPooling2D, channels last): the largest value of each
    channel in each window.

    Args:
        pool_size: an integer or (rows, cols) of the window, default 2.
        strides: an integer or (rows, cols); default the pool size.
        padding: "valid" (only whole windows) or "same" (output ``ceil(size / stride)``; windows
            reaching past the image take the maximum of their pixels inside it).

    Input shape ``(batch, rows, cols, channels)``; output ``(batch, new_rows, new_cols, channels)``.
    """

    _forward_kernel = staticmethod(kernels.max_pool2d_forward)
    _backward_kernel = staticmethod(kernels.max_pool2d_backward)
    _backward_reads_output = True


class AveragePooling2D(_Pooling2D):
    """Average pooling over images (Keras' AveragePooling2D, channels last): the mean of each
    channel in each window.

    Args:
        pool_size: an integer or (rows, cols) of the window, default 2.
        strides: an integer or (rows, cols); default the pool size.
        padding: "valid" (only whole windows) or "same" (output ``ceil(size / stride)``; windows
            reaching past the image average their pixels inside it, as TensorFlow does).

    Input shape ``(batch, rows, cols, channels)``; output ``(batch, new_rows, new_cols, channels)``.
    """

    _forward_kernel = staticmethod(kernels.avg_pool2d_forward)
    _backward_kernel = staticmethod(kernels.avg_pool2d_backward)
