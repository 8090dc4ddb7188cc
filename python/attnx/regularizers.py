"""Weight regularizers: their loss is added to the training loss and their gradient to the weights'."""
import numpy as np


class Regularizer:
    def __call__(self, w):
        """The penalty for weights w (a float)."""
        raise NotImplementedError

    def gradient(self, w):
        """d penalty / d w."""
        raise NotImplementedError

    def get_config(self):
        return {}


class L1L2(Regularizer):
    """penalty = l1 * sum|w| + l2 * sum w^2 (Keras' definition: no 1/2 factor)."""

    def __init__(self, l1=0.0, l2=0.0):
        self.l1, self.l2 = float(l1), float(l2)
        if self.l1 < 0 or self.l2 < 0:
            raise ValueError(f"L1L2: factors must be non-negative, got l1={l1}, l2={l2}")

    def __call__(self, w):
        total = 0.0
        if self.l1:
            total += self.l1 * float(np.abs(w).sum(dtype=np.float64))
        if self.l2:
            total += self.l2 * float(np.square(w, dtype=np.float64).sum())
        return total

    def gradient(self, w):
        g = np.zeros_like(w)
        if self.l1:
            g += self.l1 * np.sign(w)
        if self.l2:
            g += (2.0 * self.l2) * w
        return g

    def get_config(self):
        return {"l1": self.l1, "l2": self.l2}


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
