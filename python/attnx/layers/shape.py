"""Permute and Dot (Keras 3's): moving axes, and the batched dot product of two inputs. NumPy: they
move values or make one batched matrix product (BLAS)."""
import numbers

import numpy as np

from .base import Layer
from .core import _Merge

# Keras' backend.epsilon(): Dot(normalize=True) divides by max(norm, epsilon)
_NORM_EPSILON = 1e-7


class Permute(Layer):
    """Permutes the axes of each sample (Keras' Permute): ``dims`` numbers them from 1 (the batch axis
    stays first), e.g. ``Permute((2, 1))`` turns (batch, T, features) into (batch, features, T)."""

    supports_masking = False

    def __init__(self, dims, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(dims, (list, tuple)) or any(
                not isinstance(d, numbers.Integral) or isinstance(d, bool) for d in dims):
            raise TypeError(f"Permute: dims must be a tuple of integers, got {dims!r}")
        if sorted(dims) != list(range(1, len(dims) + 1)):
            raise ValueError(f"Permute: Invalid permutation argument `dims`: expected a permutation of "
                             f"1..{len(dims)} (the batch axis 0 is not permuted), got {tuple(dims)}")
        self.dims = tuple(int(d) for d in dims)

    def forward(self, inputs, training=False):
        x = self._float_input(inputs)
        if x.ndim != len(self.dims) + 1:
            raise ValueError(f"Layer '{self.name}': dims {self.dims} permute inputs of rank {len(self.dims) + 1}, got "
                             f"shape {x.shape}")
        return np.ascontiguousarray(x.transpose((0,) + self.dims)), (x.shape if training else None)

    def backprop(self, cache, dy, need_dx=True):
        shape = cache
        dy = self._grad_input(dy, (shape[0],) + tuple(shape[d] for d in self.dims))
        return np.ascontiguousarray(dy.transpose(np.argsort((0,) + self.dims)))

    def compute_output_shape(self, input_shape):
        return (input_shape[0],) + tuple(input_shape[d] for d in self.dims)

    def get_config(self):
        return {**super().get_config(), "dims": list(self.dims)}


class Dot(_Merge):
    """The dot product of two inputs along one axis each, per sample (Keras' Dot, `batch_dot`): inputs
    (batch, ..., n) and (batch, ..., n) give the first's axes but `axes[0]`, then the second's but the batch
    axis and `axes[1]`; a result of one axis is (batch, 1).

    Args:
        axes: an integer (the same axis of both) or a pair; never the batch axis 0.
        normalize: L2-normalize each input along its axis first (the product is then the cosine
            similarity).
    """

    supports_masking = False

    def __init__(self, axes, normalize=False, **kwargs):
        super().__init__(**kwargs)
        pair = list(axes) if isinstance(axes, (list, tuple)) else [axes]
        if any(not isinstance(a, numbers.Integral) or isinstance(a, bool) for a in pair):
            raise TypeError(f"Dot: axes must be an integer or a pair of integers, got {axes!r}")
        if len(pair) not in (1, 2):
            raise ValueError(f"Dot: axes must be an integer or a pair of integers, got {axes!r}")
        self.axes = [int(a) for a in pair] if isinstance(axes, (list, tuple)) else int(axes)
        self.normalize = bool(normalize)

    def _axes(self, ndims):
        """The two contracted axes, non-negative (Keras: a negative int counts from each input's end)."""
        pair = self.axes if isinstance(self.axes, list) else [self.axes, self.axes]
        out = []
        for a, ndim in zip(pair, ndims):
            if not -ndim <= a < ndim:
                raise ValueError(f"Layer '{self.name}': axes {self.axes} is out of range for inputs of rank {ndim}")
            if a % ndim == 0:
                raise ValueError(f"Layer '{self.name}': axes {self.axes} names the batch axis 0; a Dot is per sample")
            out.append(a % ndim)
        return out

    def _normalized(self, x, axis):
        """x / max(|x|, epsilon) along `axis`, and the factor 1 / max(|x|, epsilon)."""
        scale = np.minimum(1.0 / np.sqrt(np.sum(x * x, axis=axis, keepdims=True)), 1.0 / _NORM_EPSILON)
        return x * scale.astype(x.dtype), scale

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        if len(xs) != 2:
            raise ValueError(f"Layer '{self.name}': expects a list of 2 inputs, got {len(xs)}")
        x1, x2 = xs
        for i, x in enumerate(xs):
            if x.ndim < 2:
                raise ValueError(f"Layer '{self.name}': inputs[{i}] must have rank >= 2 (batch, ...), got shape "
                                 f"{x.shape}")
        a1, a2 = self._axes((x1.ndim, x2.ndim))
        if x1.shape[0] != x2.shape[0] or x1.shape[a1] != x2.shape[a2]:
            raise ValueError(f"Layer '{self.name}': inputs of shapes {x1.shape} and {x2.shape} do not match: the batch "
                             f"and axes {[a1, a2]} must have the same sizes")
        scales = (None, None)
        if self.normalize:
            with np.errstate(divide="ignore"):
                (x1, s1), (x2, s2) = self._normalized(x1, a1), self._normalized(x2, a2)
            scales = (s1, s2)
        left = np.moveaxis(x1, a1, -1)  # (B, rest1..., n)
        right = np.moveaxis(x2, a2, 1)  # (B, n, rest2...)
        rest1, rest2 = left.shape[1:-1], right.shape[2:]
        n = x1.shape[a1]
        product = np.matmul(left.reshape(x1.shape[0], -1, n), right.reshape(x1.shape[0], n, -1))
        y = product.reshape((x1.shape[0],) + rest1 + rest2)
        if y.ndim == 1:
            y = y[:, None]
        cache = (x1, x2, scales, (a1, a2), left.shape, right.shape, y.shape) if training else None
        return np.ascontiguousarray(y), cache

    def backprop(self, cache, dy, need_dx=True):
        x1, x2, scales, (a1, a2), left_shape, right_shape, out_shape = cache
        batch, n = left_shape[0], left_shape[-1]
        g = self._grad_input(dy, out_shape).reshape(batch, -1, int(np.prod(right_shape[2:], dtype=np.int64)))
        left = np.moveaxis(x1, a1, -1).reshape(batch, -1, n)
        right = np.moveaxis(x2, a2, 1).reshape(batch, n, -1)
        # y = left . right:  dleft = g . right^T,  dright = left^T . g
        d1 = np.moveaxis(np.matmul(g, right.transpose(0, 2, 1)).reshape(left_shape), -1, a1)
        d2 = np.moveaxis(np.matmul(left.transpose(0, 2, 1), g).reshape(right_shape), 1, a2)
        grads = []
        for d, y, scale, axis in ((d1, x1, scales[0], a1), (d2, x2, scales[1], a2)):
            if scale is not None:
                # y = x s, s = min(|x|^-1, 1 / eps):  dx = s (dy - y sum(dy y)) where s = |x|^-1, else s dy
                free = scale < 1.0 / _NORM_EPSILON
                d = scale * (d - free * y * np.sum(d * y, axis=axis, keepdims=True))
            grads.append(np.ascontiguousarray(d, dtype=self.dtype))
        return grads

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        s1, s2 = (tuple(s) for s in input_shape)
        a1, a2 = self._axes((len(s1), len(s2)))
        out = (s1[0],) + tuple(d for i, d in enumerate(s1) if i not in (0, a1)) + tuple(
            d for i, d in enumerate(s2) if i not in (0, a2))
        return out if len(out) > 1 else out + (1,)

    def get_config(self):
        return {**super().get_config(), "axes": self.axes, "normalize": self.normalize}
