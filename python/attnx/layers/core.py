"""Core layers: Dense, Embedding, Activation, Dropout, and the shape and merge pieces functional
models need (Flatten, Reshape, Concatenate, Add, GlobalAveragePooling1D)."""
import math

import numpy as np

from .. import activations, backend, initializers, kernels, quantization, random, regularizers
from ..masking import as_mask
from .base import Layer


class Dense(Layer):
    """Densely connected layer: ``output = activation(inputs @ kernel + bias)`` on the last axis.

    Args:
        units: size of the output's last axis.
        activation: "linear" (default, also None), "relu", "tanh", "sigmoid", "softmax" or "gelu".
        use_bias: whether to add a bias.
        kernel_initializer, bias_initializer: Keras defaults glorot_uniform and zeros.
        kernel_regularizer, bias_regularizer: e.g. ``attnx.regularizers.L2(1e-3)``.
        kernel_constraint, bias_constraint: e.g. ``attnx.constraints.MaxNorm(2)``, after each optimizer step.

    Input shape ``(batch, ..., in_features)``; output shape ``(batch, ..., units)``.
    The kernel is stored as Keras does, ``(in_features, units)``.
    """

    supports_masking = True
    _bf16_products = True  # attnx.mixed_precision

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, quantization_mode=None, **kwargs):
        super().__init__(**kwargs)
        self.quantization_mode = quantization.check_mode("Dense", quantization_mode)
        if int(units) <= 0:
            raise ValueError(f"Dense: units must be positive, got {units}")
        self.units = int(units)
        self._set_kernel_arguments(activation, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                                   bias_regularizer, kernel_constraint, bias_constraint)

    def build(self, input_shape):
        if len(input_shape) < 2 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, ..., features) with known features, "
                             f"got shape {input_shape}")
        with quantization.building(self):
            self._add_kernel_and_bias((input_shape[-1], self.units), self.units)

    def forward(self, inputs, training=False):
        kernel = self.params["kernel"]
        x = self._float_input(inputs, min_ndim=2, last_dim=kernel.shape[0])
        lead = x.shape[:-1]
        x2 = x.reshape(math.prod(lead), kernel.shape[0])  # -1 fails for 0 features
        if self.quantization_mode:
            return self._int8_forward(x2, training).reshape(lead + (self.units,)), None
        dense_forward = kernels.dense_forward_bf16 if self.compute_dtype == "bfloat16" else kernels.dense_forward
        y, z = dense_forward(x=x2, kernel=kernel, bias=self.params.get("bias"), activation=self.activation)
        return y.reshape(lead + (self.units,)), ((x2, y, z, lead) if training else None)

    def _int8_forward(self, x2, training):
        """The quantized layer's output for x2 (rows, in_features): x2 quantized per row, int8 products."""
        quantization.inference_only(self, training)
        p = self.params
        return kernels.dense_forward_int8(x=np.require(x2, np.float32, "CA"),
                                          kernel=quantization.packed(self, "kernel"),
                                          bias=p.get("bias"), activation=self.activation)

    def quantizable_weights(self):
        return {"kernel": "columns"}

    def backprop(self, cache, dy, need_dx=True):
        x2, y, z, lead = cache
        dy = self._grad_input(dy, lead + (self.units,)).reshape(-1, self.units)
        dense_backward = kernels.dense_backward_bf16 if self.compute_dtype == "bfloat16" else kernels.dense_backward
        grads = self.grads  # (a property: read once)
        dx = dense_backward(dy=dy, x=x2, kernel=self.params["kernel"], y=y, z=z, activation=self.activation,
                            dkernel=grads["kernel"], dbias=grads.get("bias"), need_dx=need_dx)
        return None if dx is None else dx.reshape(lead + (x2.shape[1],))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units, **self._kernel_arguments_config(),
                **quantization.config(self)}


class Embedding(Layer):
    """Turns token ids into dense vectors: ``output[..., :] = embeddings[ids[...], :]``.

    Args:
        input_dim: vocabulary size; ids must lie in [0, input_dim).
        output_dim: embedding size.
        embeddings_initializer: Keras' default uniform(-0.05, 0.05); or a pretrained
            ``(input_dim, output_dim)`` matrix (as it is, or ``initializers.Constant(matrix)``),
            e.g. from `attnx.text.load_word_vectors`. The model's config then holds the matrix.
        embeddings_regularizer: e.g. ``attnx.regularizers.L2(1e-3)``.
        mask_zero: id 0 is padding; downstream layers get the mask ``ids != 0``.
        weights: ``[matrix]``, Keras 2's way: the starting weights, kept out of the config.
        trainable: False keeps the embeddings as they are (optimizers skip them; saved in the config).

    Input: integer ids ``(batch, T)`` (or any shape); output ``(batch, T, output_dim)``.

    Pretrained, frozen GloVe vectors::

        vectors = attnx.text.load_word_vectors("glove.6B.100d.txt", tokenizer)
        layers.Embedding(*vectors.matrix.shape, embeddings_initializer=vectors.matrix, trainable=False)
    """

    def __init__(self, input_dim, output_dim, embeddings_initializer="uniform", embeddings_regularizer=None,
                 mask_zero=False, input_length=None, weights=None, quantization_mode=None, **kwargs):
        super().__init__(**kwargs)
        self.quantization_mode = quantization.check_mode("Embedding", quantization_mode)
        for arg, value in (("input_dim", input_dim), ("output_dim", output_dim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"Embedding: `{arg}` must be a positive integer, got {value!r}")
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.embeddings_regularizer = regularizers.get(embeddings_regularizer)
        self.mask_zero = bool(mask_zero)
        self.input_length = input_length
        # Keras: the matrix, or a list holding it
        self._initial_weights = None if weights is None else [weights] if np.ndim(weights) == 2 else list(weights)

    def build(self, input_shape):
        with quantization.building(self):
            self.add_weight("embeddings", (self.input_dim, self.output_dim), self.embeddings_initializer,
                            self.embeddings_regularizer)
            if self._initial_weights is not None:
                self.set_weights(self._initial_weights)
                self._initial_weights = None

    def token_ids(self, inputs):
        """inputs as a contiguous int64 array, checked against the vocabulary."""
        arr = np.asarray(inputs)
        if arr.dtype.kind == "f":
            if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
                raise TypeError(f"Layer '{self.name}': token ids must be integers, got non-integral floats")
        elif arr.dtype.kind not in "iu":
            raise TypeError(f"Layer '{self.name}': token ids must be integers, got dtype {arr.dtype}")
        self._check_shape(arr, "inputs", min_ndim=1)
        ids = np.require(arr, np.int64, "CA")
        if ids.size and (ids.min() < 0 or ids.max() >= self.input_dim):
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise IndexError(f"Layer '{self.name}': token id {bad} out of range [0, {self.input_dim}) "
                             f"(input_dim={self.input_dim})")
        return ids

    def forward(self, inputs, training=False):
        ids = self.token_ids(inputs)
        if self.quantization_mode:
            quantization.inference_only(self, training)
            return kernels.embedding_forward_int8(ids=ids, table=self.params["embeddings"],
                                                  scale=self.params["embeddings_scale"]), None
        return kernels.embedding_forward(ids=ids, table=self.params["embeddings"]), (ids if training else None)

    def backprop(self, cache, dy, need_dx=True):
        ids = cache
        dy = self._grad_input(dy, ids.shape + (self.output_dim,))
        kernels.embedding_backward(dtable=self.grads["embeddings"], dout=dy, ids=ids)
        return None  # integer ids have no gradient

    def quantizable_weights(self):
        return {"embeddings": "rows"}

    @property
    def _creates_mask(self):
        return self.mask_zero

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return np.asarray(inputs) != 0

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim, "output_dim": self.output_dim,
                "embeddings_initializer": initializers.serialize(self.embeddings_initializer),
                "embeddings_regularizer": regularizers.serialize(self.embeddings_regularizer),
                "mask_zero": self.mask_zero, "input_length": self.input_length, **quantization.config(self)}


class Activation(Layer):
    """Applies an activation function ("relu", "tanh", "sigmoid", "softmax", "gelu", "linear")."""

    supports_masking = True

    def __init__(self, activation, **kwargs):
        super().__init__(**kwargs)
        self.activation = activations.get(activation)

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=1)
        y = kernels.activation_forward(x=x, activation=self.activation)
        return y, ((x, y) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        x, y = cache
        return kernels.activation_backward(dy=self._grad_input(dy, y.shape), x=x, y=y, activation=self.activation)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "activation": self.activation}


class Dropout(Layer):
    """Sets a fraction `rate` of inputs to zero during training, scaling the rest by 1 / (1 - rate).

    Args:
        rate: fraction to drop, in [0, 1).
        noise_shape: shape of the keep mask, broadcast over the input (None entries copy the
            input's size), e.g. ``(None, 1, None)`` drops whole features for all time steps.
        seed: seed of the masks (default: attnx's stream, `attnx.random`).
    """

    supports_masking = True

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"Dropout: rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.noise_shape = None if noise_shape is None else tuple(noise_shape)
        self.seed_generator = random.SeedGenerator(seed, type(self).__name__)
        self.seed = self.seed_generator.seed

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=1)
        if not training:
            return x, None
        if self.rate == 0.0 or not backend.training_randomness(training):
            return x, (None, x.shape)
        shape = x.shape
        if self.noise_shape is not None:
            if len(self.noise_shape) != x.ndim:
                raise ValueError(f"Layer '{self.name}': noise_shape {self.noise_shape} does not match input "
                                 f"rank {x.ndim}")
            shape = tuple(s if n is None else n for s, n in zip(x.shape, self.noise_shape))
        keep = self.seed_generator.keep(shape, self.rate, self.dtype, per_row=self.noise_shape is None or self.noise_shape[0] is None)
        return x * keep, (keep, x.shape)

    def backprop(self, cache, dy, need_dx=True):
        keep, shape = cache
        dy = self._grad_input(dy, shape)
        return dy.copy() if keep is None else dy * keep

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "rate": self.rate,
                "noise_shape": None if self.noise_shape is None else list(self.noise_shape), "seed": self.seed}


class Flatten(Layer):
    """Flattens every axis but the batch axis: (B, d1, d2, ...) -> (B, d1 * d2 * ...)."""

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=1)
        return x.reshape(x.shape[0], -1), (x.shape if training else None)

    def backprop(self, cache, dy, need_dx=True):
        shape = cache
        return self._grad_input(dy, (shape[0], math.prod(shape[1:]))).reshape(shape)

    def compute_output_shape(self, input_shape):
        rest = input_shape[1:]
        return (input_shape[0], None if any(d is None for d in rest) else int(np.prod(rest, dtype=np.int64)))


class Reshape(Layer):
    """Reshapes each sample to `target_shape` (one entry may be -1), keeping the batch axis."""

    def __init__(self, target_shape, **kwargs):
        super().__init__(**kwargs)
        self.target_shape = tuple(int(d) for d in target_shape)
        if sum(d == -1 for d in self.target_shape) > 1 or any(d < -1 or d == 0 for d in self.target_shape):
            raise ValueError(f"Reshape: invalid target_shape {target_shape}")

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=1)
        sample = math.prod(x.shape[1:])
        known = math.prod(d for d in self.target_shape if d != -1)
        if (-1 in self.target_shape and sample % known) or (-1 not in self.target_shape and sample != known):
            raise ValueError(f"Layer '{self.name}': cannot reshape samples of shape {x.shape[1:]} to "
                             f"{self.target_shape}")
        y = x.reshape((x.shape[0],) + self.target_shape)
        return y, ((x.shape, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        shape, out_shape = cache
        return self._grad_input(dy, out_shape).reshape(shape)

    def compute_output_shape(self, input_shape):
        if -1 not in self.target_shape:
            return (input_shape[0],) + self.target_shape
        rest = input_shape[1:]
        if any(d is None for d in rest):
            return (input_shape[0],) + tuple(None if d == -1 else d for d in self.target_shape)
        known = int(np.prod([d for d in self.target_shape if d != -1]))
        missing = int(np.prod(rest)) // known
        return (input_shape[0],) + tuple(missing if d == -1 else d for d in self.target_shape)

    def get_config(self):
        return {**super().get_config(), "target_shape": list(self.target_shape)}


class _Merge(Layer):
    """Base of layers called on a list of same-batch tensors."""

    def _inputs(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) < 2:
            raise ValueError(f"Layer '{self.name}': expects a list of at least 2 inputs, got "
                             f"{type(inputs).__name__}")
        return [self._float_input(x, f"inputs[{i}]", min_ndim=1) for i, x in enumerate(inputs)]

    def compute_mask(self, inputs, mask=None):
        if mask is None or not isinstance(mask, (list, tuple)) or all(m is None for m in mask):
            return None
        masks = [np.asarray(m, dtype=bool) for m in mask if m is not None]
        out = masks[0]
        for m in masks[1:]:
            out = out & m
        return out


class Concatenate(_Merge):
    """Concatenates a list of inputs along `axis` (default the last)."""

    def __init__(self, axis=-1, **kwargs):
        super().__init__(**kwargs)
        self.axis = int(axis)

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        ndim = xs[0].ndim
        if not -ndim <= self.axis < ndim:  # `%` alone would silently concatenate on another axis
            raise ValueError(f"Layer '{self.name}': axis {self.axis} is out of range for inputs of rank {ndim}")
        axis = self.axis % ndim
        for i, x in enumerate(xs):
            if x.ndim != ndim or any(a != b for k, (a, b) in enumerate(zip(x.shape, xs[0].shape)) if k != axis):
                raise ValueError(f"Layer '{self.name}': inputs must match except on axis {self.axis}; "
                                 f"got shapes {[x.shape for x in xs]}")
        y = np.concatenate(xs, axis=axis)
        return y, (([x.shape[axis] for x in xs], y.shape, axis) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        sizes, out_shape, axis = cache
        dy = self._grad_input(dy, out_shape)
        cuts = np.cumsum(sizes)[:-1]
        return [np.ascontiguousarray(g) for g in np.split(dy, cuts, axis=axis)]

    def compute_output_shape(self, input_shape):
        axis = self.axis % len(input_shape[0])
        out = list(input_shape[0])
        sizes = [s[axis] for s in input_shape]
        out[axis] = None if any(s is None for s in sizes) else sum(sizes)
        return tuple(out)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


class Add(_Merge):
    """Adds a list of inputs of the same shape (no broadcasting)."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        if any(x.shape != xs[0].shape for x in xs):
            raise ValueError(f"Layer '{self.name}': inputs must have the same shape, got {[x.shape for x in xs]}")
        out = xs[0].copy()
        for x in xs[1:]:
            out += x
        return out, ((len(xs), xs[0].shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        n, shape = cache
        dy = self._grad_input(dy, shape)
        return [dy.copy() for _ in range(n)]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])


class Multiply(_Merge):
    """Multiplies a list of inputs of the same shape elementwise (Keras' Multiply, no broadcasting)."""

    def forward(self, inputs, training=False):
        xs = self._inputs(inputs)
        if any(x.shape != xs[0].shape for x in xs):
            raise ValueError(f"Layer '{self.name}': inputs must have the same shape, got {[x.shape for x in xs]}")
        out = xs[0].copy()
        for x in xs[1:]:
            out *= x
        return out, (xs if training else None)

    def backprop(self, cache, dy, need_dx=True):
        xs = cache
        dy = self._grad_input(dy, xs[0].shape)
        # y = prod_j x_j: dx_i = dy * prod_{j != i} x_j
        grads = []
        for i in range(len(xs)):
            g = dy.copy()
            for j, x in enumerate(xs):
                if j != i:
                    g *= x
            grads.append(g)
        return grads

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])


class SpatialDropout1D(Dropout):
    """Dropout of whole feature channels of (batch, T, features): one keep mask per sample and feature,
    shared by every step (Keras' SpatialDropout1D, Dropout with noise_shape (batch, 1, features))."""

    def __init__(self, rate, seed=None, **kwargs):
        kwargs.pop("noise_shape", None)  # a config carries the one this layer implies
        super().__init__(rate, noise_shape=(None, 1, None), seed=seed, **kwargs)

    def forward(self, inputs, training=False):
        self._check_shape(np.asarray(inputs), "inputs", ndim=3)
        return super().forward(inputs, training=training)

    def get_config(self):
        config = super().get_config()
        config.pop("noise_shape")
        return config


class RepeatVector(Layer):
    """Repeats (batch, features) `n` times: (batch, n, features) (Keras' RepeatVector)."""

    def __init__(self, n, **kwargs):
        super().__init__(**kwargs)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"RepeatVector: n must be a positive integer, got {n!r}")
        self.n = int(n)

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, ndim=2)
        return np.repeat(x[:, None, :], self.n, axis=1), (x.shape if training else None)

    def backprop(self, cache, dy, need_dx=True):
        dy = self._grad_input(dy, (cache[0], self.n, cache[1]))
        return dy.sum(axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.n, input_shape[1])

    def get_config(self):
        return {**super().get_config(), "n": self.n}


class Masking(Layer):
    """Masks the steps of (batch, T, features) whose features all equal `mask_value`: they output zeros
    and the mask (True = a real step) goes on to the next layers (Keras' Masking).

    As Keras, the inputs are first cast to the layer's dtype and compared there, in the output and in the
    mask alike (a float64 step of 1e-50 is 0 in float32: masked, and zero in the output)."""

    def __init__(self, mask_value=0.0, **kwargs):
        super().__init__(**kwargs)
        self.mask_value = float(mask_value)

    def _step_mask(self, x):
        return np.any(x != x.dtype.type(self.mask_value), axis=-1)

    def forward(self, inputs, training=False):
        x = self._float_input(inputs, min_ndim=2)
        keep = self._step_mask(x)[..., None].astype(self.dtype)
        return x * keep, ((keep, x.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        keep, shape = cache
        return self._grad_input(dy, shape) * keep

    def compute_mask(self, inputs, mask=None):
        return self._step_mask(self._float_input(inputs, min_ndim=2))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "mask_value": self.mask_value}


class GlobalAveragePooling1D(Layer):
    """Mean over the time axis of (batch, T, features), counting only unmasked steps.

    Args:
        data_format: "channels_last" (batch, T, features), the default, or "channels_first"
            (batch, features, T) (Keras).
        keepdims: keep the time axis, of size 1.

    `mask` (also the second positional argument, as Keras) is a boolean (batch, T) array (True = real
    step) or the lengths (batch,) as integers. A fully masked row pools to zeros.
    """

    supports_masking = True

    def __init__(self, data_format="channels_last", keepdims=False, **kwargs):
        super().__init__(**kwargs)
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(f"{type(self).__name__}: data_format must be 'channels_last' or 'channels_first', got "
                             f"{data_format!r}")
        self.data_format, self.keepdims = data_format, bool(keepdims)

    def _steps_axis(self):
        return 1 if self.data_format == "channels_last" else 2

    def forward(self, inputs, mask=None, training=False):
        x = self._float_input(inputs, ndim=3)
        if self.data_format == "channels_first":
            x = x.transpose(0, 2, 1)  # (batch, T, features), a view
        if mask is None:
            weights = np.full(x.shape[:2], 1.0 / max(x.shape[1], 1), dtype=self.dtype)  # T = 0 pools to zeros
        else:
            mask = as_mask(mask, x.shape[0], x.shape[1], f"Layer '{self.name}': `mask`")
            m = mask.astype(self.dtype)
            weights = m / np.maximum(m.sum(axis=1, keepdims=True), 1)  # a fully masked row pools to zeros
        pooled = np.einsum("bt,btc->bc", weights, x)
        if self.keepdims:
            pooled = np.expand_dims(pooled, self._steps_axis())
        return pooled, ((weights, x.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        weights, shape = cache
        dy = self._grad_input(dy, self.compute_output_shape((shape[0], shape[1], shape[2])
                                                            if self.data_format == "channels_last"
                                                            else (shape[0], shape[2], shape[1])))
        dx = weights[:, :, None] * dy.reshape(shape[0], 1, shape[2])
        return np.ascontiguousarray(dx if self.data_format == "channels_last" else dx.transpose(0, 2, 1))

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        features = input_shape[2] if self.data_format == "channels_last" else input_shape[1]
        if not self.keepdims:
            return (input_shape[0], features)
        return (input_shape[0], 1, features) if self.data_format == "channels_last" else (input_shape[0], features, 1)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format, "keepdims": self.keepdims}
