"""Global pooling (Keras 3's): GlobalMaxPooling1D over steps, GlobalAveragePooling2D over pixels
(GlobalAveragePooling1D lives with the core layers)."""
import numpy as np

from ..masking import as_mask
from .base import Layer
from .core import GlobalAveragePooling1D


class GlobalMaxPooling1D(GlobalAveragePooling1D):
    """The largest value of each feature over the steps of (batch, T, features).

    Args:
        data_format: "channels_last" (batch, T, features), the default, or "channels_first" (batch,
            features, T).
        keepdims: keep the time axis, of size 1.

    `mask` (batch, T) (True = real step) or lengths (batch,): the maximum over the real steps only
    (Keras ignores a mask); a fully masked row pools to zeros. The gradient goes to the first maximum.
    """

    def forward(self, inputs, mask=None, training=False):
        x = self._float_input(inputs, ndim=3)
        if self.data_format == "channels_first":
            x = x.transpose(0, 2, 1)  # (batch, T, features), a view
        if x.shape[1] == 0:
            raise ValueError(f"Layer '{self.name}': inputs have no steps (shape {np.shape(inputs)})")
        real = None
        if mask is not None:
            real = as_mask(mask, x.shape[0], x.shape[1], f"Layer '{self.name}': `mask`")
            x = np.where(real[:, :, None], x, -np.inf)
        where = np.argmax(x, axis=1)  # (batch, features): the first maximum
        pooled = np.take_along_axis(x, where[:, None, :], axis=1)[:, 0]
        if real is not None:
            pooled = np.where(real.any(axis=1)[:, None], pooled, 0).astype(self.dtype)
        if self.keepdims:
            pooled = np.expand_dims(pooled, self._steps_axis())
        return np.ascontiguousarray(pooled), ((where, real, x.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        where, real, shape = cache
        steps_first = (shape[0], shape[1], shape[2])
        out_shape = self.compute_output_shape(steps_first if self.data_format == "channels_last"
                                              else (shape[0], shape[2], shape[1]))
        dy = self._grad_input(dy, out_shape).reshape(shape[0], shape[2])
        if real is not None:
            dy = dy * real.any(axis=1)[:, None]  # a fully masked row's zeros came from no step
        dx = np.zeros(shape, dtype=self.dtype)
        np.put_along_axis(dx, where[:, None, :], dy[:, None, :], axis=1)
        return np.ascontiguousarray(dx if self.data_format == "channels_last" else dx.transpose(0, 2, 1))


class GlobalAveragePooling2D(Layer):
    """The mean of each channel over the pixels of images (Keras' GlobalAveragePooling2D).

    Args:
        data_format: "channels_last" (batch, rows, cols, channels), the default, or "channels_first"
            (batch, channels, rows, cols).
        keepdims: keep the two pixel axes, of size 1.
    """

    def __init__(self, data_format="channels_last", keepdims=False, **kwargs):
        super().__init__(**kwargs)
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(f"GlobalAveragePooling2D: data_format must be 'channels_last' or 'channels_first', got "
                             f"{data_format!r}")
        self.data_format, self.keepdims = data_format, bool(keepdims)

    def _pixel_axes(self):
        return (1, 2) if self.data_format == "channels_last" else (2, 3)

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, ndim=4)
        axes = self._pixel_axes()
        if x.shape[axes[0]] * x.shape[axes[1]] == 0:
            raise ValueError(f"Layer '{self.name}': images without pixels (shape {x.shape})")
        return x.mean(axis=axes, keepdims=self.keepdims), (x.shape if training else None)

    def backprop(self, cache, dy, need_dx=True):
        shape = cache
        axes = self._pixel_axes()
        dy = self._grad_input(dy, self.compute_output_shape(shape))
        if not self.keepdims:
            dy = np.expand_dims(dy, axes)
        count = shape[axes[0]] * shape[axes[1]]
        return np.ascontiguousarray(np.broadcast_to(dy / self.dtype.type(count), shape))

    def compute_output_shape(self, input_shape):
        axes = self._pixel_axes()
        if self.keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(input_shape))
        return tuple(d for i, d in enumerate(input_shape) if i not in axes)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format, "keepdims": self.keepdims}
