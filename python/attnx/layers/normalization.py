"""BatchNormalization (Keras 3's): normalizes with the batch's statistics while training and with the
moving statistics it keeps (non-trainable weights) otherwise."""
import numbers

import numpy as np

from .. import backend, initializers, regularizers
from ..masking import as_mask
from .base import Layer

# Keras adds backend.epsilon() to the count of a masked mean and variance
_MASKED_COUNT_EPSILON = 1e-7


class BatchNormalization(Layer):
    """``gamma * (x - mean) / sqrt(var + epsilon) + beta`` over the feature axis `axis`.

    With ``training=True`` (and a trainable layer) mean and var are the batch's, over every axis but
    `axis`, and the moving statistics move: ``moving = moving * momentum + batch * (1 - momentum)``;
    otherwise mean and var are the moving statistics. A mask (B, T) of (B, T, ..., C) inputs leaves the
    masked steps out of the batch statistics (they are still normalized), as Keras does.

    Args:
        axis: the feature axis, default -1.
        momentum: of the moving statistics, default 0.99.
        epsilon: added to the variance, default 1e-3.
        center, scale: whether to learn `beta` / `gamma`.
        beta_initializer, gamma_initializer, moving_mean_initializer, moving_variance_initializer:
            Keras' defaults zeros, ones, zeros, ones.
        beta_regularizer, gamma_regularizer: e.g. ``attnx.regularizers.L2(1e-3)``.

    Weights, Keras' order: gamma, beta (trainable), moving_mean, moving_variance (non-trainable).
    """

    supports_masking = True

    def __init__(self, axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True, beta_initializer="zeros",
                 gamma_initializer="ones", moving_mean_initializer="zeros", moving_variance_initializer="ones",
                 beta_regularizer=None, gamma_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(axis, numbers.Integral) or isinstance(axis, bool):
            raise TypeError(f"BatchNormalization: axis must be an integer (the feature axis, as Keras), got {axis!r}")
        self.axis = int(axis)
        self.momentum, self.epsilon = float(momentum), float(epsilon)
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"BatchNormalization: momentum must be in [0, 1], got {momentum!r}")
        if not self.epsilon > 0.0:
            raise ValueError(f"BatchNormalization: epsilon must be positive, got {epsilon!r}")
        self.center, self.scale = bool(center), bool(scale)
        self.beta_initializer = initializers.get(beta_initializer)
        self.gamma_initializer = initializers.get(gamma_initializer)
        self.moving_mean_initializer = initializers.get(moving_mean_initializer)
        self.moving_variance_initializer = initializers.get(moving_variance_initializer)
        self.beta_regularizer = regularizers.get(beta_regularizer)
        self.gamma_regularizer = regularizers.get(gamma_regularizer)

    def _feature_axes(self, ndim):
        """[the feature axis, non-negative] for inputs of rank `ndim`."""
        if not -ndim <= self.axis < ndim:
            raise ValueError(f"Layer '{self.name}': axis {self.axis} is out of range for inputs of rank {ndim}")
        if self.axis % ndim == 0:
            raise ValueError(f"Layer '{self.name}': axis {self.axis} is the batch axis; normalize over features")
        return [self.axis % ndim]

    def build(self, input_shape):
        axes = self._feature_axes(len(input_shape))
        if any(input_shape[a] is None for a in axes):
            raise ValueError(f"Layer '{self.name}': the feature axis {self.axis} of inputs {input_shape} must be "
                             "known")
        shape = tuple(input_shape[a] for a in axes)
        if self.scale:
            self.add_weight("gamma", shape, self.gamma_initializer, self.gamma_regularizer)
        if self.center:
            self.add_weight("beta", shape, self.beta_initializer, self.beta_regularizer)
        self.add_weight("moving_mean", shape, self.moving_mean_initializer)
        self.add_weight("moving_variance", shape, self.moving_variance_initializer)

    @property
    def trainable_params(self):
        """gamma and beta: the moving statistics are not an optimizer's (Keras' non-trainable weights)."""
        return [entry for entry in super().trainable_params if not entry[0].startswith("moving_")]

    def _broadcast(self, weight, ndim, axes):
        """A (features...) weight shaped to broadcast against inputs of rank `ndim`."""
        shape = [1] * ndim
        for a, size in zip(axes, weight.shape):
            shape[a] = size
        return weight.reshape(shape)

    def forward(self, inputs, training=False, mask=None):
        x = self._float_input(inputs, min_ndim=2)
        axes = self._feature_axes(x.ndim)
        mean_w = self.params["moving_mean"]
        if tuple(x.shape[a] for a in axes) != mean_w.shape:
            raise ValueError(f"Layer '{self.name}': was built for features {mean_w.shape} on axis {self.axis}, got "
                             f"inputs of shape {x.shape}")
        reduce = tuple(a for a in range(x.ndim) if a not in axes)
        gamma = self._broadcast(self.params["gamma"], x.ndim, axes) if self.scale else None
        beta = self._broadcast(self.params["beta"], x.ndim, axes) if self.center else None
        weights = None
        if mask is not None:
            if x.ndim < 3:
                raise ValueError(f"Layer '{self.name}': a mask needs inputs (batch, steps, ..., features), got shape "
                                 f"{x.shape}")
            m = as_mask(mask, x.shape[0], x.shape[1], f"Layer '{self.name}': `mask`")
            weights = m.reshape(m.shape + (1,) * (x.ndim - 2)).astype(self.dtype)
        # the batch's statistics in a training call; a call recorded on a tape with training=False keeps a cache
        # but takes the moving statistics, as it draws no dropout (backend.training_randomness)
        if backend.training_randomness(training) and self.trainable:
            if weights is None:
                count = np.asarray(np.prod([x.shape[a] for a in reduce]), dtype=self.dtype)
                mean = x.mean(axis=reduce, keepdims=True)
                centered = x - mean
                var = np.mean(centered * centered, axis=reduce, keepdims=True)
            else:
                w = np.broadcast_to(weights, x.shape)
                count = w.sum(axis=reduce, keepdims=True) + self.dtype.type(_MASKED_COUNT_EPSILON)
                mean = (w * x).sum(axis=reduce, keepdims=True) / count
                centered = x - mean
                var = (w * centered * centered).sum(axis=reduce, keepdims=True) / count
            momentum = self.dtype.type(self.momentum)
            for name, batch in (("moving_mean", mean), ("moving_variance", var)):
                moving = self.params[name]
                moving *= momentum  # in place: the optimizer's and set_weights' buffer
                moving += batch.reshape(moving.shape) * (1 - momentum)
        else:
            mean = self._broadcast(self.params["moving_mean"], x.ndim, axes)
            var = self._broadcast(self.params["moving_variance"], x.ndim, axes)
            centered = x - mean
            count = None
        inv = 1.0 / np.sqrt(var + self.dtype.type(self.epsilon))
        xhat = centered * inv
        y = xhat if gamma is None else xhat * gamma
        if beta is not None:
            y = y + beta
        y = y.astype(self.dtype, copy=False)
        if not training:
            return y, None
        return y, (xhat, inv, weights, count, reduce, axes, count is not None)

    def backprop(self, cache, dy, need_dx=True):
        xhat, inv, weights, count, reduce, axes, batch_statistics = cache
        dy = self._grad_input(dy, xhat.shape)
        if self.center:
            self.grads["beta"] += dy.sum(axis=reduce).reshape(self.grads["beta"].shape)
        if self.scale:
            self.grads["gamma"] += (dy * xhat).sum(axis=reduce).reshape(self.grads["gamma"].shape)
        if not need_dx:
            return None
        dxhat = dy * self._broadcast(self.params["gamma"], dy.ndim, axes) if self.scale else dy
        if not batch_statistics:  # the moving statistics are constants
            return (dxhat * inv).astype(self.dtype, copy=False)
        # xhat_j = (x_j - mean) inv, mean = sum_k w_k x_k / n, var = sum_k w_k (x_k - mean)^2 / n (w = 1 unmasked):
        # dx_i = inv dxhat_i + w_i / n (dmean + 2 (x_i - mean) dvar), with
        # dvar = -inv^2 / 2 sum_j dxhat_j xhat_j, dmean = -inv sum_j dxhat_j + dvar d(var)/d(mean)
        sum_dxhat = dxhat.sum(axis=reduce, keepdims=True)
        sum_dxhat_xhat = (dxhat * xhat).sum(axis=reduce, keepdims=True)
        dvar = -0.5 * inv * inv * sum_dxhat_xhat
        w = 1 if weights is None else weights
        # d(var)/d(mean) = -2 sum_k w_k (x_k - mean) / n: zero, but for the epsilon Keras adds to a masked count
        dvar_dmean = 0 if weights is None else -2 * (w * xhat / inv).sum(axis=reduce, keepdims=True) / count
        dmean = -inv * sum_dxhat + dvar * dvar_dmean
        dx = inv * dxhat + w * (dmean + 2 * (xhat / inv) * dvar) / count
        return np.ascontiguousarray(dx, dtype=self.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale,
                "beta_initializer": initializers.serialize(self.beta_initializer),
                "gamma_initializer": initializers.serialize(self.gamma_initializer),
                "moving_mean_initializer": initializers.serialize(self.moving_mean_initializer),
                "moving_variance_initializer": initializers.serialize(self.moving_variance_initializer),
                "beta_regularizer": regularizers.serialize(self.beta_regularizer),
                "gamma_regularizer": regularizers.serialize(self.gamma_regularizer)}
