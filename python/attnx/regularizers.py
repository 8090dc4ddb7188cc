"""Weight regularizers: their loss is added to the training loss and their gradient to the weights'."""
import numpy as np

from . import kernels


class Regularizer:
    def __call__(self, w):
        """The penalty for weights w (a float)."""
        raise NotImplementedError

    def gradient(self, w):
        """d penalty / d w."""
        raise NotImplementedError

    def add_gradient(self, w, grad):
        """grad += d penalty / d w, in place."""
        grad += self.gradient(w)

    def penalty_and_add_gradient(self, w, grad):
        """The penalty for w, after ``add_gradient(w, grad)``: what a training step takes of a regularizer."""
        penalty = self(w)
        self.add_gradient(w, grad)
        return penalty

    def get_config(self):
        return {}


class L1L2(Regularizer):
    """penalty = l1 * sum|w| + l2 * sum w^2 (Keras' definition: no 1/2 factor)."""

    def __init__(self, l1=0.0, l2=0.0):
        self.l1, self.l2 = float(l1), float(l2)
        if self.l1 < 0 or self.l2 < 0:
            raise ValueError(f"L1L2: factors must be non-negative, got l1={l1}, l2={l2}")

    def __call__(self, w):
        return kernels.l1l2_penalty(weights=_float_array(w), l1=self.l1, l2=self.l2)

    def gradient(self, w):
        w = _float_array(w)
        g = np.zeros_like(w)
        kernels.l1l2_add_gradient(grad=g, weights=w, l1=self.l1, l2=self.l2)
        return g

    def add_gradient(self, w, grad):
        # in one pass where grad is a layer's buffer of w's shape and float dtype; else as any regularizer
        w = _float_array(w)
        if _kernel_buffer(grad, w):
            kernels.l1l2_add_gradient(grad=grad, weights=w, l1=self.l1, l2=self.l2)
        else:
            super().add_gradient(w, grad)

    def penalty_and_add_gradient(self, w, grad):
        # penalty and gradient in one pass over w where add_gradient takes one
        w = _float_array(w)
        if _kernel_buffer(grad, w):
            return kernels.l1l2_penalty_add_gradient(grad=grad, weights=w, l1=self.l1, l2=self.l2)
        return super().penalty_and_add_gradient(w, grad)

    def get_config(self):
        return {"l1": self.l1, "l2": self.l2}


def _kernel_buffer(grad, w):
    """Whether the kernels can add into `grad` in place: a writeable C-contiguous array of w's shape and dtype."""
    return (isinstance(grad, np.ndarray) and grad.dtype == w.dtype and grad.shape == w.shape
            and grad.flags.c_contiguous and grad.flags.writeable)


def _float_array(w):
    """w as a C-contiguous float32 / float64 array (other dtypes as float64)"""
    w = np.asarray(w)
    return np.ascontiguousarray(w, dtype=w.dtype if w.dtype in (np.float32, np.float64) else np.float64)


def L1(l1=0.01):
    return L1L2(l1=l1)


def L2(l2=0.01):
    return L1L2(l2=l2)


l1, l2, l1_l2 = L1, L2, L1L2


def get(identifier):
    if identifier is None or isinstance(identifier, Regularizer):
        return identifier
    if isinstance(identifier, dict):
        return L1L2(**identifier.get("config", identifier))
    if identifier in ("l1", "l2", "l1_l2"):
        return {"l1": L1, "l2": L2, "l1_l2": lambda: L1L2(0.01, 0.01)}[identifier]()
    raise ValueError(f"Unknown regularizer {identifier!r}")


def serialize(reg):
    return None if reg is None else {"class_name": "L1L2", "config": reg.get_config()}
