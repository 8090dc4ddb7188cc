"""Activation functions by name, computed by the C++ kernels."""
import numpy as np

from . import kernels

NAMES = ("linear", "relu", "tanh", "sigmoid", "softmax", "gelu")


def get(name):
    """Validates an activation name (None means linear) and returns it."""
    if name is None:
        return "linear"
    if callable(name) and getattr(name, "__name__", None) in NAMES:
        return name.__name__
    if not isinstance(name, str) or name not in NAMES:
        raise ValueError(f"Unknown activation {name!r}; expected one of {', '.join(NAMES)}")
    return name


def _apply(name):
    def fn(x):
        x = np.require(x, np.result_type(np.asarray(x).dtype, np.float32), "CA")
        return kernels.activation_forward(x=x, activation=name)
    fn.__name__ = name
    fn.__doc__ = f"{name}(x), elementwise (softmax over the last axis)."
    return fn


linear = _apply("linear")
relu = _apply("relu")
tanh = _apply("tanh")
sigmoid = _apply("sigmoid")
softmax = _apply("softmax")
gelu = _apply("gelu")
