"""Weight initializers with Keras' names and defaults, drawing from `attnx.backend.rng()`."""
import math

import numpy as np

from . import backend, kernels


def _fans(shape):
    shape = tuple(shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return shape[-2] * receptive, shape[-1] * receptive


class Initializer:
    def __call__(self, shape, dtype="float32"):
        raise NotImplementedError

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class Zeros(Initializer):
    def __call__(self, shape, dtype="float32"):
        return np.zeros(shape, dtype=dtype)


class Ones(Initializer):
    def __call__(self, shape, dtype="float32"):
        return np.ones(shape, dtype=dtype)


class Constant(Initializer):
    """Fills a weight with `value`: a number, or an array of the weight's shape (Keras'
    ``Constant(embedding_matrix)`` for pretrained embeddings)."""

    def __init__(self, value=0.0):
        value = np.asarray(value)
        if value.dtype.kind not in "iuf":
            raise TypeError(f"Constant: value must be a number or an array of numbers, got dtype {value.dtype}")
        self.value = float(value) if value.ndim == 0 else value

    def __call__(self, shape, dtype="float32"):
        if isinstance(self.value, float):
            return np.full(shape, self.value, dtype=dtype)
        if self.value.shape != tuple(shape):
            raise ValueError(f"Constant: value of shape {self.value.shape} for a weight of shape {tuple(shape)}")
        return self.value.astype(dtype)

    def get_config(self):
        # an array is written out in full, as Keras does (a model's weights hold it too)
        return {"value": self.value if isinstance(self.value, float) else self.value.tolist()}


class RandomUniform(Initializer):
    def __init__(self, minval=-0.05, maxval=0.05):
        self.minval, self.maxval = float(minval), float(maxval)

    def __call__(self, shape, dtype="float32"):
        return backend.rng().uniform(self.minval, self.maxval, size=shape).astype(dtype)

    def get_config(self):
        return {"minval": self.minval, "maxval": self.maxval}


class RandomNormal(Initializer):
    def __init__(self, mean=0.0, stddev=0.05):
        self.mean, self.stddev = float(mean), float(stddev)

    def __call__(self, shape, dtype="float32"):
        return backend.rng().normal(self.mean, self.stddev, size=shape).astype(dtype)

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev}


class TruncatedNormal(Initializer):
    """Normal(mean, stddev) with values beyond two standard deviations redrawn (Keras' TruncatedNormal)."""

    def __init__(self, mean=0.0, stddev=0.05):
        self.mean, self.stddev = float(mean), float(stddev)

    def __call__(self, shape, dtype="float32"):
        return (self.mean + self.stddev * _truncated_standard_normal(shape)).astype(dtype)

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev}


class GlorotUniform(Initializer):
    """Uniform in [-limit, limit], limit = sqrt(6 / (fan_in + fan_out)) (Keras' default kernel init)."""

    def __call__(self, shape, dtype="float32"):
        fan_in, fan_out = _fans(shape)
        limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
        return backend.rng().uniform(-limit, limit, size=shape).astype(dtype)


class GlorotNormal(Initializer):
    def __call__(self, shape, dtype="float32"):
        fan_in, fan_out = _fans(shape)
        std = math.sqrt(2.0 / max(1, fan_in + fan_out))
        return _truncated_normal(shape, std).astype(dtype)


class HeUniform(Initializer):
    def __call__(self, shape, dtype="float32"):
        fan_in, _ = _fans(shape)
        limit = math.sqrt(6.0 / max(1, fan_in))
        return backend.rng().uniform(-limit, limit, size=shape).astype(dtype)


class Orthogonal(Initializer):
    """A (semi-)orthogonal matrix from the QR decomposition of a normal one (Keras' recurrent init)."""

    def __init__(self, gain=1.0):
        self.gain = float(gain)

    def __call__(self, shape, dtype="float32"):
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        cols = shape[-1]
        flat = backend.rng().normal(size=(max(rows, cols), min(rows, cols)))
        # Q of QR with R's diagonal made positive: uniform over orthogonal matrices; on one thread (NumPy's
        # threaded LAPACK took seconds for an LSTM's kernel on a busy 2-core host)
        q = kernels.orthogonal_factor(a=flat)
        if rows < cols:
            q = q.T
        return (self.gain * q[:rows, :cols]).reshape(shape).astype(dtype)

    def get_config(self):
        return {"gain": self.gain}


def _truncated_standard_normal(shape):
    # Keras' truncated normal: redraw values beyond two standard deviations
    out = backend.rng().normal(0.0, 1.0, size=shape)
    bad = np.abs(out) > 2
    while bad.any():
        out[bad] = backend.rng().normal(0.0, 1.0, size=int(bad.sum()))
        bad = np.abs(out) > 2
    return out


def _truncated_normal(shape, std):
    """Truncated so that its standard deviation is `std` (the variance-scaling initializers)."""
    return _truncated_standard_normal(shape) * std / 0.87962566103423978


_ALIASES = {
    "zeros": Zeros, "ones": Ones, "constant": Constant, "random_uniform": RandomUniform,
    "uniform": RandomUniform, "random_normal": RandomNormal, "normal": RandomNormal, "truncated_normal": TruncatedNormal,
    "glorot_uniform": GlorotUniform,
    "glorot_normal": GlorotNormal, "he_uniform": HeUniform, "orthogonal": Orthogonal,
}


def get(identifier):
    """An initializer from a name, a config dict, an instance, a callable(shape, dtype) or an array (the
    weight's value: `Constant`)."""
    if isinstance(identifier, Initializer) or callable(identifier) and not isinstance(identifier, type):
        return identifier
    if isinstance(identifier, np.ndarray):
        return Constant(identifier)
    if isinstance(identifier, str):
        if identifier not in _ALIASES:
            raise ValueError(f"Unknown initializer {identifier!r}; expected one of {sorted(_ALIASES)}")
        return _ALIASES[identifier]()
    if isinstance(identifier, dict):
        return _ALIASES[identifier["class_name"]].from_config(identifier.get("config", {}))
    raise TypeError(f"Cannot interpret {identifier!r} as an initializer")


def serialize(init):
    for name, cls in _ALIASES.items():
        if type(init) is cls:
            return {"class_name": name, "config": init.get_config()}
    raise TypeError(f"Initializer {init!r} cannot be serialized")
