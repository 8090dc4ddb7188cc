"""Losses: the built-in ones computed together with their gradient by one C++ kernel; your own
written with `attnx.ops` and differentiated by its tape.

Reduction follows Keras' "sum_over_batch_size": the mean over every scored element; a mask or
`ignore_index` leaves its elements out of the mean, as PyTorch's ignore_index and Keras' masks do.

Your own loss, as in Keras, is a function ``fn(y_true, y_pred)`` returning one value per sample
(or per scored element), given straight to ``compile(loss=fn)``, or a `Loss` subclass that
implements only ``call(y_true, y_pred)``:

    from attnx import ops as K
    model.compile("adam", loss=lambda y_true, y_pred: K.mean(K.square(y_true - y_pred), axis=-1))

The loss is then the (sample-weighted) mean of those values, and its gradient comes from
replaying the ops of `call` (`attnx.ops.Tape`).

Called inside a recorded computation (an `attnx.GradientTape` block, a layer's `call`), a loss
records itself on the tape: ``loss_object(y_true, y_pred)`` is a value of the tape whose backward is
the loss kernel's gradient. ``reduction="none"`` (Keras) gives one value per sample instead of the
mean: per label for the sparse cross-entropy, per row (the mean over the last axis) for the others.
"""
import math

import numpy as np

from . import _core, masking, ops, serialization
from .backend import snake_case


class Loss:
    """Base class. ``loss(y_true, y_pred)`` gives the value; ``compute`` gives value and gradient.

    Subclasses implement ``compute`` (the built-in losses, on their C++ kernels), or only
    ``call(y_true, y_pred)`` written with `attnx.ops`, returning per-sample values: the default
    ``compute`` reduces them as Keras does and differentiates them.
    """

    from_logits = False
    registry = serialization.ClassRegistry("loss")  # the classes by the names files hold
    _REDUCTIONS = ("sum_over_batch_size", "sum", "none")
    # reduction "none" gives the mean over the last axis of the elementwise losses (Keras' per-sample values)
    _per_row_mean = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Loss.registry.add(cls)

    def __init__(self, name=None, reduction="sum_over_batch_size"):
        self.name = name or snake_case(type(self).__name__)
        if reduction not in self._REDUCTIONS:
            raise ValueError(f"{self.name}: `reduction` must be one of {', '.join(map(repr, self._REDUCTIONS))}, "
                             f"got {reduction!r}")
        self.reduction = reduction

    def __call__(self, y_true, y_pred, sample_weight=None, mask=None):
        """The loss of a batch: a float (its `reduction` of the values), or per-sample values with
        reduction "none"; inside a recorded computation, a value of the tape (see the module docstring)."""
        tape = ops.active_tape()
        traced = tape.traced(y_pred) if tape is not None else y_pred
        pred = self._pred(ops.untraced(traced))
        if self.reduction == "none":
            if sample_weight is not None or mask is not None:
                raise ValueError(f"{self.name}: reduction 'none' returns the unweighted values: multiply them by "
                                 "your weights or mask")
            values = self._values(y_true, pred)
            if not isinstance(traced, ops.TracedArray):
                return values
            scale = self.count(y_true, pred) / (pred.shape[-1] if self._per_row_mean else 1)

            def backward(output_grads):
                # sum_i g_i v_i is `scale` times the mean that `compute` weighs with g and differentiates
                dpred = self.compute(y_true, pred, sample_weight=np.asarray(output_grads[0], pred.dtype))[1]
                return [dpred * pred.dtype.type(scale)]
            return tape.record_call(backward, [values], [traced])[0]
        value, dpred = self.compute(y_true, pred, sample_weight, mask)
        scale = 1.0 if self.reduction == "sum_over_batch_size" else self.count(y_true, pred, mask)
        if not isinstance(traced, ops.TracedArray):
            return value * scale
        dpred = dpred * pred.dtype.type(scale) if scale != 1.0 else dpred
        return tape.record_call(lambda output_grads: [dpred * output_grads[0]],
                                [np.asarray(value * scale, dtype=pred.dtype)], [traced])[0]

    def _values(self, y_true, pred):
        """The per-sample values of reduction "none" (plain arrays)."""
        call = getattr(self, "call", None)
        if call is None:
            raise NotImplementedError(f"{self.name}: reduction 'none' is not available for this loss")
        return np.asarray(ops.untraced(call(self._call_target(y_true, pred), pred)))

    def compute(self, y_true, y_pred, sample_weight=None, mask=None):
        """Returns (loss, d loss / d y_pred).

        This default runs ``call(y_true, y_pred)`` with `y_pred` watched by a tape. With v the
        values it returns and w the weights (`sample_weight` and `mask` over their leading axes):
            loss = sum(w v) / n,   d loss / d v = w / n,
        n being the number of values (of unmasked values when a mask is given); the tape takes
        d loss / d v back to `y_pred`.
        """
        call = getattr(self, "call", None)
        if call is None:
            raise NotImplementedError(f"{type(self).__name__}: define `call(y_true, y_pred)` (with attnx.ops) "
                                      f"or `compute`")
        pred = self._pred(y_pred)
        target = self._call_target(y_true, pred)
        tape = ops.Tape()
        with tape:
            traced_pred = tape.watch(pred)
            values = call(target, traced_pred)
        v = np.asarray(ops.untraced(values))
        w, denom = self._weights(sample_weight, mask, v.shape, pred.dtype)
        w = np.ones(v.shape, dtype=pred.dtype) if w is None else w
        dpred, = tape.backward([values], [w / pred.dtype.type(denom)], [traced_pred])
        return float(np.sum(v * w) / denom), dpred

    def count(self, y_true, y_pred, mask=None):
        """The number the mean of `compute` divides by on this batch (Keras' "sum_over_batch_size":
        the values, or the unmasked ones), so that ``value * count`` is the batch's weighted sum:
        data-parallel training combines the shards' losses with it, exactly as one process would."""
        pred = self._pred(y_pred)
        return _denominator(mask, np.shape(ops.untraced(self.call(self._call_target(y_true, pred), pred))))

    def get_config(self):
        config = {"name": self.name}
        if self.reduction != "sum_over_batch_size":
            config["reduction"] = self.reduction
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @staticmethod
    def _call_target(y_true, pred):
        """y_true as `call` sees it: labels (B,) shaped as predictions (B, 1), in the prediction's
        dtype (Keras casts y_true so)."""
        target = np.asarray(y_true)
        if target.ndim == pred.ndim - 1 and pred.shape[-1] == 1:
            target = target.reshape(pred.shape)
        return target.astype(pred.dtype, copy=False)

    # -- helpers shared by the elementwise losses
    def _pred(self, y_pred):
        pred = np.asarray(y_pred)
        if pred.dtype.kind != "f":
            raise TypeError(f"{self.name}: y_pred must be floating point, got dtype {pred.dtype}")
        if pred.ndim == 0 or pred.shape[0] == 0:
            raise ValueError(f"{self.name}: y_pred must be a non-empty batch, got shape {pred.shape}")
        return np.require(pred, None, "CA")

    def _elementwise_target(self, y_true, pred):
        target = np.asarray(y_true)
        if target.dtype.kind not in "fiub":
            raise TypeError(f"{self.name}: y_true must be numeric, got dtype {target.dtype}")
        if target.shape != pred.shape:
            # Keras accepts labels (B,) for predictions (B, 1); nothing else is broadcast
            if pred.shape[-1] == 1 and target.shape == pred.shape[:-1]:
                target = target.reshape(pred.shape)
            else:
                raise ValueError(f"{self.name}: y_true shape {target.shape} does not match y_pred shape {pred.shape}")
        return np.require(target, pred.dtype, "CA")

    def _weights(self, sample_weight, mask, shape, dtype):
        """Per-element weights broadcast from leading axes, and the mean's denominator."""
        w = None
        if mask is not None:
            mask = masking.mask_values(mask, f"{self.name}: `mask`")  # the one mask rule: bool or 0/1
        for extra, what in ((sample_weight, "sample_weight"), (mask, "mask")):
            if extra is None:
                continue
            e = np.asarray(extra, dtype=dtype)
            if e.shape != tuple(shape[:e.ndim]):
                raise ValueError(f"{self.name}: {what} shape {e.shape} must match the leading axes of {shape}")
            e = np.broadcast_to(e.reshape(e.shape + (1,) * (len(shape) - e.ndim)), shape)
            w = e if w is None else w * e
        return (None if w is None else np.ascontiguousarray(w)), max(_denominator(mask, shape), 1.0)


_PROB_EPSILON = 1e-7  # Keras' backend epsilon, as loss.hpp clips probabilities


def _denominator(mask, shape):
    """How many of the elements of `shape` a mean counts: all, or those `mask` (leading axes) keeps."""
    if mask is None:
        return float(math.prod(shape))
    m = np.asarray(mask, dtype=bool)
    return float(np.broadcast_to(m.reshape(m.shape + (1,) * (len(shape) - m.ndim)), shape).sum())


class BinaryCrossentropy(Loss):
    """Binary cross-entropy; numerically stable from logits, Keras-clipped from probabilities."""

    _per_row_mean = True

    def __init__(self, from_logits=False, name="binary_crossentropy", reduction="sum_over_batch_size"):
        super().__init__(name, reduction)
        self.from_logits = bool(from_logits)

    def _values(self, y_true, pred):
        y = self._elementwise_target(y_true, pred)
        if self.from_logits:  # max(z, 0) - z y + log(1 + e^-|z|)
            values = np.maximum(pred, 0) - pred * y + np.log1p(np.exp(-np.abs(pred)))
        else:  # the kernel's clip (loss.hpp)
            eps = pred.dtype.type(_PROB_EPSILON)
            p = np.clip(pred, eps, 1 - eps)
            values = -(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
        return values.mean(axis=-1)

    def count(self, y_true, y_pred, mask=None):
        return _denominator(mask, np.shape(y_pred))

    def compute(self, y_true, y_pred, sample_weight=None, mask=None):
        pred = self._pred(y_pred)
        target = self._elementwise_target(y_true, pred)
        w, denom = self._weights(sample_weight, mask, pred.shape, pred.dtype)
        return _core.binary_crossentropy(pred=pred, target=target, weights=w, from_logits=self.from_logits, denom=denom)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits}


class MeanSquaredError(Loss):
    _per_row_mean = True

    def __init__(self, name="mean_squared_error", reduction="sum_over_batch_size"):
        super().__init__(name, reduction)

    def _values(self, y_true, pred):
        return np.square(pred - self._elementwise_target(y_true, pred)).mean(axis=-1)

    def count(self, y_true, y_pred, mask=None):
        return _denominator(mask, np.shape(y_pred))

    def compute(self, y_true, y_pred, sample_weight=None, mask=None):
        pred = self._pred(y_pred)
        target = self._elementwise_target(y_true, pred)
        w, denom = self._weights(sample_weight, mask, pred.shape, pred.dtype)
        return _core.mean_squared_error(pred=pred, target=target, weights=w, denom=denom)


class SparseCategoricalCrossentropy(Loss):
    """Cross-entropy between integer labels (..., ) and class scores (..., K).

    Args:
        from_logits: scores are logits (else probabilities, as after a softmax).
        ignore_index: a label value that contributes nothing, e.g. the padding id of targets.
        label_smoothing: epsilon of PyTorch's ``CrossEntropyLoss(label_smoothing=...)``: the target
            is ``(1 - epsilon) onehot(y) + epsilon / K`` (needs from_logits).
    """

    def __init__(self, from_logits=False, ignore_index=None, name="sparse_categorical_crossentropy",
                 reduction="sum_over_batch_size", label_smoothing=0.0):
        super().__init__(name, reduction)
        self.from_logits = bool(from_logits)
        self.ignore_index = ignore_index
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"{name}: label_smoothing must be in [0, 1), got {label_smoothing}")
        if label_smoothing and not self.from_logits:
            raise ValueError(f"{name}: label_smoothing needs from_logits=True")
        self.label_smoothing = float(label_smoothing)

    def _values(self, y_true, pred):
        labels, keep, _ = self._labels_and_keep(y_true, pred, None)
        if np.any(keep & ((labels < 0) | (labels >= pred.shape[-1]))):
            raise IndexError(f"{self.name}: labels must lie in [0, {pred.shape[-1]})")
        picked = np.take_along_axis(pred, np.where(keep, labels, 0)[..., None], axis=-1)[..., 0]
        if self.from_logits:  # logsumexp(z) - z_y
            top = pred.max(axis=-1)
            values = top + np.log(np.exp(pred - top[..., None]).sum(axis=-1)) - picked
            values += self.label_smoothing * (picked - pred.mean(axis=-1))  # smoothing's terms: loss.hpp
        else:  # the kernel's normalized, clipped probabilities (loss.hpp)
            eps = pred.dtype.type(_PROB_EPSILON)
            values = -np.log(np.clip(picked / pred.sum(axis=-1), eps, 1 - eps))
        return np.where(keep, values, 0).astype(pred.dtype, copy=False)

    def count(self, y_true, y_pred, mask=None):
        pred = self._pred(y_pred)
        labels, keep, _ = self._labels_and_keep(y_true, pred, mask)
        return self._scored(labels, keep, mask)

    def compute(self, y_true, y_pred, sample_weight=None, mask=None):
        pred = self._pred(y_pred)
        labels, keep, ignore = self._labels_and_keep(y_true, pred, mask)
        rows = labels.shape
        w = keep.astype(pred.dtype)
        if sample_weight is not None:
            sw = np.asarray(sample_weight, dtype=pred.dtype)
            if sw.shape != rows[:sw.ndim]:
                raise ValueError(f"{self.name}: sample_weight shape {sw.shape} must match the leading axes of {rows}")
            w = w * sw.reshape(sw.shape + (1,) * (len(rows) - sw.ndim))
        denom = max(self._scored(labels, keep, mask), 1.0)
        # label smoothing in the kernel's pass over each row (loss.hpp), both cores on it
        value, dpred = _core.sparse_categorical_crossentropy(pred=pred, labels=labels, weights=np.ascontiguousarray(w),
                                                             from_logits=self.from_logits, ignore_index=ignore,
                                                             denom=denom, label_smoothing=self.label_smoothing)
        return value, dpred

    def _scored(self, labels, keep, mask):
        """The mean's denominator: the labels scored (all of them unless masked or ignored)."""
        return float(keep.sum()) if (mask is not None or self.ignore_index is not None) else float(labels.size)

    def _labels_and_keep(self, y_true, pred, mask):
        """(int64 labels, the bool (labels' shape) of those scored, the ignore index as the kernel takes it)."""
        labels = np.asarray(y_true)
        if labels.dtype.kind == "f":
            if np.any(labels != np.round(labels)):
                raise TypeError(f"{self.name}: labels must be integers")
        elif labels.dtype.kind not in "iu":
            raise TypeError(f"{self.name}: labels must be integers, got dtype {labels.dtype}")
        if labels.shape != pred.shape[:-1]:
            if labels.shape == pred.shape[:-1] + (1,):
                labels = labels.reshape(pred.shape[:-1])
            else:
                raise ValueError(f"{self.name}: labels shape {labels.shape} does not match predictions "
                                 f"{pred.shape} (expected {pred.shape[:-1]})")
        labels = np.require(labels, np.int64, "CA")
        rows = labels.shape
        keep = np.ones(rows, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        if keep.shape != rows:
            raise ValueError(f"{self.name}: mask shape {keep.shape} does not match labels {rows}")
        ignore = -(2 ** 62) if self.ignore_index is None else int(self.ignore_index)
        return labels, keep & (labels != ignore), ignore

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits, "ignore_index": self.ignore_index,
                "label_smoothing": self.label_smoothing}


class CategoricalCrossentropy(Loss):
    """Cross-entropy between one-hot (or soft) targets (..., K) and class scores (..., K)."""

    def __init__(self, from_logits=False, name="categorical_crossentropy", reduction="sum_over_batch_size"):
        super().__init__(name, reduction)
        self.from_logits = bool(from_logits)

    def _values(self, y_true, pred):
        y = self._elementwise_target(y_true, pred)
        if self.from_logits:  # -sum_k y_k log_softmax(z)_k
            shifted = pred - pred.max(axis=-1, keepdims=True)
            return -(y * (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))).sum(axis=-1)
        eps = pred.dtype.type(_PROB_EPSILON)
        return -(y * np.log(np.clip(pred / pred.sum(axis=-1, keepdims=True), eps, 1 - eps))).sum(axis=-1)

    def count(self, y_true, y_pred, mask=None):
        return _denominator(mask, np.shape(y_pred)[:-1])

    def compute(self, y_true, y_pred, sample_weight=None, mask=None):
        pred = self._pred(y_pred)
        target = self._elementwise_target(y_true, pred)
        w, denom = self._weights(sample_weight, mask, pred.shape[:-1], pred.dtype)
        return _core.categorical_crossentropy(pred=pred, target=target, weights=w, from_logits=self.from_logits,
                                              denom=denom)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits}


class MeanAbsoluteError(Loss):
    """Keras' MAE: the mean over the last axis of ``|y_pred - y_true|``, per sample."""

    def __init__(self, name="mean_absolute_error", reduction="sum_over_batch_size"):
        super().__init__(name, reduction)

    def call(self, y_true, y_pred):
        return ops.mean(ops.abs(ops.subtract(y_pred, y_true)), axis=-1)


class Huber(Loss):
    """Keras' Huber loss: ``0.5 e^2`` where ``|e| <= delta``, else ``delta (|e| - 0.5 delta)``, e = y_pred - y_true,
    averaged over the last axis per sample."""

    def __init__(self, delta=1.0, name="huber_loss", reduction="sum_over_batch_size"):
        super().__init__(name, reduction)
        self.delta = float(delta)

    def call(self, y_true, y_pred):
        size = ops.abs(ops.subtract(y_pred, y_true))
        quadratic = ops.minimum(size, self.delta)
        linear = ops.subtract(size, quadratic)  # 0.5 q^2 + delta * l is both branches at once
        return ops.mean(0.5 * ops.square(quadratic) + self.delta * linear, axis=-1)

    def get_config(self):
        return {**super().get_config(), "delta": self.delta}


class KLDivergence(Loss):
    """Keras' KL divergence ``sum(y_true * log(y_true / y_pred))`` over the last axis, both clipped to
    [1e-7, 1]."""

    def __init__(self, name="kl_divergence", reduction="sum_over_batch_size"):
        super().__init__(name, reduction)

    def call(self, y_true, y_pred):
        target = np.clip(np.asarray(y_true), _PROB_EPSILON, 1.0)
        return ops.sum(target * ops.subtract(np.log(target), ops.log(ops.clip(y_pred, _PROB_EPSILON, 1.0))), axis=-1)


_ALIASES = {
    "binary_crossentropy": BinaryCrossentropy, "bce": BinaryCrossentropy,
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "mean_squared_error": MeanSquaredError, "mse": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError, "mae": MeanAbsoluteError, "huber": Huber, "huber_loss": Huber,
    "kl_divergence": KLDivergence, "kld": KLDivergence,
}


class LossFunctionWrapper(Loss):
    """A function ``fn(y_true, y_pred)`` written with `attnx.ops`, as a `Loss` (what ``compile``
    makes of ``loss=fn``): its values are reduced and differentiated by `Loss.compute`."""

    def __init__(self, fn, name=None):
        super().__init__(name or getattr(fn, "__name__", None) or "loss")
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)

    def get_config(self):
        return {**super().get_config(), "function": serialization.registered_name(self.fn)}

    @classmethod
    def from_config(cls, config):
        fn = serialization.get_registered_object(config.get("function") or config.get("name"))
        if fn is None or isinstance(fn, type):
            raise ValueError(f"the loss {config.get('name')!r} was a function that is not registered: decorate it "
                             "with @attnx.register_serializable(), or give it in load_model's custom_objects")
        return cls(fn, name=config.get("name"))


def get(identifier):
    """A loss from a name, a config dict, an instance, or a function ``fn(y_true, y_pred)``."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, str):
        if identifier not in _ALIASES:
            raise ValueError(f"Unknown loss {identifier!r}; expected one of {sorted(_ALIASES)}")
        return _ALIASES[identifier]()
    if isinstance(identifier, dict):
        cls = Loss.registry.get(identifier["class_name"])
        if not (isinstance(cls, type) and issubclass(cls, Loss)):
            raise ValueError(f"Unknown loss class {identifier['class_name']!r}")
        return cls.from_config(identifier["config"])
    if callable(identifier) and not isinstance(identifier, type):
        return LossFunctionWrapper(identifier)
    raise TypeError(f"Cannot interpret {identifier!r} as a loss")


def serialize(loss):
    return {"class_name": Loss.registry.name_of(type(loss)), "config": loss.get_config()}


binary_crossentropy = BinaryCrossentropy()
sparse_categorical_crossentropy = SparseCategoricalCrossentropy()
categorical_crossentropy = CategoricalCrossentropy()
mean_squared_error = mse = MeanSquaredError()
