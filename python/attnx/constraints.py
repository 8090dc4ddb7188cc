"""Weight constraints (Keras' `keras.constraints`): a projection applied to a weight after each optimizer
step, ``w <- constraint(w)``, in place.

A layer attaches a constraint to its weight array (`Layer.add_weight(constraint=...)`); optimizers call
`apply_constraints` on the arrays they just updated, so a constraint follows its array into any model,
composite layer or `GradientTape` loop that steps it (Keras keeps it on the variable for the same reason).
"""
import weakref

import numpy as np

# Keras' backend.epsilon(), added to the norms it divides by
_EPSILON = 1e-7

# id(weight array) -> (weak reference to the array, its constraint); an entry leaves with its array
_attached = {}


class Constraint:
    def __call__(self, w):
        """The projected weights (a new array of w's shape and dtype)."""
        return w

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _norms(w, axis):
    """The L2 norms over `axis` (an int or a list of ints, as Keras' configs hold them), kept as axes."""
    return np.sqrt(np.sum(np.square(w), axis=tuple(axis) if isinstance(axis, list) else axis, keepdims=True))


class MaxNorm(Constraint):
    """Scales each slice along `axis` whose L2 norm exceeds `max_value` down to it (Keras' MaxNorm)."""

    def __init__(self, max_value=2, axis=0):
        self.max_value, self.axis = float(max_value), axis

    def __call__(self, w):
        norms = _norms(w, self.axis)
        return w * (np.clip(norms, 0, self.max_value) / (_EPSILON + norms))

    def get_config(self):
        return {"max_value": self.max_value, "axis": self.axis}


class MinMaxNorm(Constraint):
    """Moves each slice's L2 norm into [min_value, max_value] at `rate` (Keras' MinMaxNorm)."""

    def __init__(self, min_value=0.0, max_value=1.0, rate=1.0, axis=0):
        self.min_value, self.max_value, self.rate, self.axis = float(min_value), float(max_value), float(rate), axis

    def __call__(self, w):
        norms = _norms(w, self.axis)
        desired = self.rate * np.clip(norms, self.min_value, self.max_value) + (1 - self.rate) * norms
        return w * (desired / (_EPSILON + norms))

    def get_config(self):
        return {"min_value": self.min_value, "max_value": self.max_value, "rate": self.rate, "axis": self.axis}


class NonNeg(Constraint):
    """Sets negative weights to zero (Keras' NonNeg)."""

    def __call__(self, w):
        return w * (w >= 0)


class UnitNorm(Constraint):
    """Scales each slice along `axis` to L2 norm 1 (Keras' UnitNorm)."""

    def __init__(self, axis=0):
        self.axis = axis

    def __call__(self, w):
        return w / (_EPSILON + _norms(w, self.axis))

    def get_config(self):
        return {"axis": self.axis}


max_norm, min_max_norm, non_neg, unit_norm = MaxNorm, MinMaxNorm, NonNeg, UnitNorm
_CLASSES = {cls.__name__: cls for cls in (MaxNorm, MinMaxNorm, NonNeg, UnitNorm)}
_NAMES = {"max_norm": MaxNorm, "min_max_norm": MinMaxNorm, "non_neg": NonNeg, "unit_norm": UnitNorm}


def get(identifier):
    """A Constraint from None, a Constraint, Keras' names ("non_neg", "NonNeg", ...) or a serialized dict."""
    if identifier is None or isinstance(identifier, Constraint):
        return identifier
    if isinstance(identifier, dict) and identifier.get("class_name") in _CLASSES:
        return _CLASSES[identifier["class_name"]].from_config(identifier.get("config") or {})
    if isinstance(identifier, str) and (identifier in _NAMES or identifier in _CLASSES):
        return (_NAMES.get(identifier) or _CLASSES[identifier])()
    raise ValueError(f"Unknown constraint {identifier!r}: use one of {sorted(_CLASSES)} (attnx.constraints), "
                     "their snake_case names, or a Constraint instance")


def serialize(constraint):
    return None if constraint is None else {"class_name": type(constraint).__name__,
                                            "config": constraint.get_config()}


def attach(weight, constraint):
    """Makes `constraint` (None: none) the one every optimizer step applies to the array `weight`."""
    _attached.pop(id(weight), None)
    if constraint is not None:
        key = id(weight)
        _attached[key] = (weakref.ref(weight, lambda _ref, key=key: _attached.pop(key, None)), constraint)


def constraint_of(weight):
    entry = _attached.get(id(weight))
    return entry[1] if entry is not None and entry[0]() is weight else None


def apply_constraints(weights):
    """Projects each array of `weights` that has a constraint, in place (after an optimizer step)."""
    for w in weights:
        constraint = constraint_of(w)
        if constraint is not None:
            np.copyto(w, np.asarray(constraint(w), dtype=w.dtype))
