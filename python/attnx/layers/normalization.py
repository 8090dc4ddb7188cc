"""The normalization layers: BatchNormalization (Keras 3's: the batch's statistics while training, the
moving statistics it keeps as non-trainable weights otherwise; in C++: `batch_norm.hpp`) and
LayerNormalization (each sample over its feature axes, in C++: `transformer.hpp`)."""
import numbers

import numpy as np

from .. import backend, initializers, kernels, regularizers
from ..masking import as_mask
from .attention import is_shape
from .base import Layer


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

    def _feature_axis(self, ndim):
        """The feature axis, non-negative, for inputs of rank `ndim`."""
        if not -ndim <= self.axis < ndim:
            raise ValueError(f"Layer '{self.name}': axis {self.axis} is out of range for inputs of rank {ndim}")
        if self.axis % ndim == 0:
            raise ValueError(f"Layer '{self.name}': axis {self.axis} is the batch axis; normalize over features")
        return self.axis % ndim

    def build(self, input_shape):
        if not is_shape(input_shape, range(2, 33)):
            raise ValueError(f"Layer '{self.name}': expects one input of rank 2 or more, got shape(s) {input_shape}")
        features = input_shape[self._feature_axis(len(input_shape))]
        if features is None:
            raise ValueError(f"Layer '{self.name}': the feature axis {self.axis} of inputs {input_shape} must be "
                             "known")
        shape = (features,)
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

    def forward(self, inputs, training=False, mask=None):
        x = self._float_input(inputs, min_ndim=2)
        axis = self._feature_axis(x.ndim)
        features = self.params["moving_mean"].shape[0]
        if x.shape[axis] != features:
            raise ValueError(f"Layer '{self.name}': was built for {features} features on axis {self.axis}, got "
                             f"inputs of shape {x.shape}")
        if mask is not None:
            if x.ndim < 3:
                raise ValueError(f"Layer '{self.name}': a mask needs inputs (batch, steps, ..., features), got shape "
                                 f"{x.shape}")
            mask = as_mask(mask, x.shape[0], x.shape[1], f"Layer '{self.name}': `mask`")
        # the batch's statistics in a training call; a call recorded on a tape with training=False keeps a cache
        # but takes the moving statistics, as it draws no dropout (backend.training_randomness)
        batch_statistics = bool(backend.training_randomness(training) and self.trainable)
        y, mean, rstd, count = kernels.batch_norm_forward(
            x=x, axis=axis, gamma=self.params.get("gamma"), beta=self.params.get("beta"),
            moving_mean=self.params["moving_mean"], moving_variance=self.params["moving_variance"], mask=mask,
            training=batch_statistics, momentum=self.momentum, epsilon=self.epsilon)
        return y, ((x, axis, mean, rstd, count, mask) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        x, axis, mean, rstd, count, mask = cache
        return kernels.batch_norm_backward(dy=self._grad_input(dy, x.shape), x=x, axis=axis, mean=mean, rstd=rstd,
                                           count=count, gamma=self.params.get("gamma"), mask=mask,
                                           dgamma=self.grads.get("gamma"), dbeta=self.grads.get("beta"),
                                           need_dx=need_dx)

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

    def _normalized_axes(self, input_shape):
        """The normalized axes of inputs of `input_shape`, non-negative and sorted; Keras' errors for an axis out
        of range or named twice, and attnx's rule that they be the trailing axes (one row each)."""
        ndim = len(input_shape)
        given = self.axis if isinstance(self.axis, list) else [self.axis]
        for a in given:
            if not -ndim <= a < ndim:
                raise ValueError(f"Layer '{self.name}': Axis {a} is out of bounds for input shape "
                                 f"{tuple(input_shape)}. Received: axis={self.axis}")
        axes = sorted(a % ndim for a in given)
        if len(set(axes)) != len(axes):
            raise ValueError(f"Layer '{self.name}': Duplicate axes in axis={self.axis} for inputs of rank {ndim} "
                             f"(they name the axes {axes}); name each axis once")
        if axes[0] < 1 or axes != list(range(ndim - len(axes), ndim)):
            raise ValueError(f"Layer '{self.name}': axis {self.axis} for inputs of rank {ndim}: attnx normalizes "
                             "trailing axes after the batch axis only (e.g. -1 or (-2, -1))")
        return axes

    def build(self, input_shape):
        if not is_shape(input_shape, range(1, 33)):
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, ..., features) with known features, "
                             f"got shape {input_shape}")
        axes = self._normalized_axes(input_shape)
        shape = tuple(input_shape[a] for a in axes)
        if None in shape:
            raise ValueError(f"Layer '{self.name}': needs inputs with known sizes on the normalized axes, got shape "
                             f"{input_shape}")
        # Keras 3 keeps `axis` as a sorted list after build, in the signs the user wrote (-1 stays -1)
        self.axis = sorted(self.axis) if isinstance(self.axis, list) else [self.axis]
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
        self._normalized_axes(input_shape)
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon, "center": self.center,
                "scale": self.scale, "rms_scaling": self.rms_scaling,
                "beta_initializer": initializers.serialize(self.beta_initializer),
                "gamma_initializer": initializers.serialize(self.gamma_initializer),
                "beta_regularizer": regularizers.serialize(self.beta_regularizer),
                "gamma_regularizer": regularizers.serialize(self.gamma_regularizer)}
