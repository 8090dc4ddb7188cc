"""The batches `fit`, `evaluate` and `predict` train and infer on, from arrays, a generator or any
iterable of batches: one code path for every entry point (Keras' data adapters).

What the data may be (Keras' rules):

- arrays: an array, or a list / tuple / dict of arrays for several inputs or outputs, cut into
  batches of `batch_size` samples (32 by default), in a new order every epoch when shuffled;
- a sequence of batches (`attnx.utils.PyDataset`, Keras' `PyDataset` / `Sequence`, or any object with
  ``__len__`` and ``__getitem__`` that is not an array or a list / tuple / dict): ``data[i]`` is batch i;
  a shuffled pass takes the batches in a new order, and ``on_epoch_end()`` runs after each pass (Keras);
- anything else iterable (a generator, an iterator, an object with ``__iter__`` such as a PyTorch
  DataLoader) yields whole batches: ``(x, y)`` or ``(x, y, sample_weight)`` tuples or lists (a
  DataLoader's ``[x, y]``; Keras 3 reads a list as that tuple for `predict` too), or for `predict` also
  ``x`` alone (several inputs as a tuple ``((x1, x2),)`` or a dict). It fixes its own batch size.

Epochs: without `steps`, an epoch is one pass over the data (a generator gives one pass only: the
epoch after it finds nothing and training stops). With `steps` (fit's `steps_per_epoch`), an epoch
draws that many batches and the next epoch continues the same pass, as Keras does; when the pass
ends, the epoch ends early and, for data that can be iterated again, the next epoch starts a new
pass.

`class_weight` ({class: weight}, missing classes weigh 1) becomes each sample's weight from its
target: sparse class ids (B,), one probability per sample (B, 1) rounded to 0 or 1, or one-hot rows
(B, C) (argmax).
"""
import collections.abc
import math
import warnings
from typing import Any, NamedTuple

import numpy as np

from . import random

_DEFAULT_BATCH_SIZE = 32
_END = object()


class Batch(NamedTuple):
    """One batch: inputs, targets (None for predict) and per-sample weights (or None), and its number of samples."""
    x: Any
    y: Any
    sample_weight: Any
    size: int


def is_array_data(x):
    """True for an array or a list / tuple / dict of arrays (Keras reads those as arrays, several
    inputs in a list); False for any other iterable and for a sequence of batches, whose items are batches."""
    if isinstance(x, (list, tuple, dict, np.ndarray, np.generic, int, float)) or hasattr(x, "__array__"):
        return True
    return not hasattr(x, "__iter__") and not is_batch_sequence(x)


def is_batch_sequence(x):
    """True for a sequence of batches (Keras' PyDataset / Sequence): ``len(x)`` batches, ``x[i]`` the i-th;
    not an array, a list / tuple / dict of arrays, or a string."""
    return hasattr(x, "__len__") and hasattr(x, "__getitem__") and not hasattr(x, "__array__") and \
        not isinstance(x, (list, tuple, dict, str, bytes, np.ndarray))


def map_structure(fn, structure):
    """`fn` applied to every array of a (nested) list / tuple / dict, the containers kept; None stays None."""
    if structure is None:
        return None
    if isinstance(structure, dict):
        return {k: map_structure(fn, v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(map_structure(fn, v) for v in structure)
    return fn(structure)


def _leaves(structure):
    found = []
    map_structure(found.append, structure)
    return found


def _num_samples(what, x, y, sample_weight, where=""):
    """The common length of every array's first axis; ValueError if they differ or there are none."""
    sizes = {np.shape(a)[0] if np.ndim(a) else -1 for a in _leaves((x, y, sample_weight))}
    if len(sizes) != 1:
        raise ValueError(f"{what}: inputs, targets and sample weights have different numbers of samples{where}: "
                         f"{sorted(sizes)} (a scalar counts as -1)")
    n = sizes.pop()
    if n <= 0:
        raise ValueError(f"{what}: no samples (empty batch){where}")
    return n


def class_weight_to_sample_weight(what, y, class_weight):
    """Each sample's weight from its class (Keras' `class_weight`): ``class_weight.get(class, 1.0)``."""
    if not isinstance(class_weight, dict):
        raise TypeError(f"{what}: class_weight must be a dict {{class index: weight}}, "
                        f"got {type(class_weight).__name__}")
    targets = _leaves(y)
    if len(targets) != 1:
        raise ValueError(f"{what}: class_weight needs a model with one output, got {len(targets)} target arrays")
    y = np.asarray(targets[0])
    if y.ndim == 2 and y.shape[1] > 1:
        if y.dtype.kind in "iu" and not np.isin(y, (0, 1)).all():
            raise ValueError(f"{what}: class_weight needs one class per sample: targets (B,), (B, 1) or one-hot "
                             f"(B, C); integer targets {y.shape} look like a sequence of class ids")
        classes = y.argmax(axis=1)
    elif y.ndim == 2 or y.ndim == 1:
        classes = np.round(y.reshape(len(y))).astype(np.int64)
    else:
        raise ValueError(f"{what}: class_weight needs one class per sample: targets (B,), (B, 1) or one-hot "
                         f"(B, C), got shape {y.shape}")
    weights = np.ones(len(classes), dtype=np.float64)
    for k, v in class_weight.items():  # a loop over the classes given, not over the samples
        weights[classes == int(k)] = float(v)
    return weights


def train_validation_split(x, y, sample_weight, validation_split):
    """((x, y, sample_weight) for training, the same for validation): the last `validation_split`
    of the samples is held out, before any shuffling (Keras)."""
    if not (is_array_data(x) and is_array_data(y)):
        raise ValueError("fit: validation_split needs arrays; give validation_data with a generator or iterable")
    if not 0.0 < validation_split < 1.0:
        raise ValueError(f"fit: validation_split must be in (0, 1), got {validation_split}")
    n = _num_samples("fit", x, y, sample_weight)
    cut = int(n * (1.0 - validation_split))
    if cut == 0 or cut == n:
        raise ValueError(f"fit: validation_split={validation_split} leaves no training or validation data "
                         f"from {n} samples")

    def part(rows):
        return tuple(map_structure(lambda a: np.asarray(a)[rows], d) for d in (x, y, sample_weight))
    return part(slice(None, cut)), part(slice(cut, None))


class DataAdapter:
    """Batches of one entry point's data, an epoch at a time (see the module docstring).

    Args:
        what: the entry point ("fit", "evaluate", "predict", "validation_data") that error messages name.
        x, y, sample_weight: arrays; or `x` an iterable of batches and `y`, `sample_weight` None.
        batch_size: samples per batch for arrays (default 32); must be None for an iterable.
        steps: batches per epoch (None: one pass); must be positive.
        shuffle: a new sample order each pass (arrays only), drawn from `attnx.random`'s stream at the
            step the pass starts (the same on every data-parallel rank).
        training: the batches are training steps: each one moves `attnx.random` to its next step.
        class_weight: {class: weight}, turned into each batch's sample weights.
        targets: whether batches carry targets (fit, evaluate) or not (predict).
    """

    def __init__(self, what, x, y=None, sample_weight=None, batch_size=None, steps=None, shuffle=False,
                 class_weight=None, targets=True, training=False):
        self.what, self.targets, self.training = what, targets, bool(training)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps <= 0):
            raise ValueError(f"{what}: steps must be a positive integer or None, got {steps!r}")
        self.steps = None if steps is None else int(steps)
        if class_weight is not None and sample_weight is not None:
            raise ValueError(f"{what}: give class_weight or sample_weight, not both")
        self.class_weight = class_weight
        if x is None:
            raise ValueError(f"{what}: x is required")
        self.arrays = is_array_data(x)
        if self.arrays:
            if targets and y is None:
                raise ValueError(f"{what}: y is required with array inputs")
            batch_size = _DEFAULT_BATCH_SIZE if batch_size is None else batch_size
            if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
                raise ValueError(f"{what}: batch_size must be a positive integer, got {batch_size!r}")
            self.batch_size = int(batch_size)
            self.data = tuple(map_structure(np.asarray, d) for d in (x, y, sample_weight))
            self.num_samples = _num_samples(what, *self.data)
        else:
            for name, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
                if value is not None:
                    raise ValueError(f"{what}: do not give {name} when x is a generator or iterable of batches: "
                                     f"its batches hold the targets and weights and fix their size")
            self.data = x
        self.sequence = not self.arrays and is_batch_sequence(x)
        self.shuffle = shuffle and (self.arrays or self.sequence)  # a sequence: the batches' order, as Keras
        self._pass = None  # the iterator over the batches of the current pass, or None between passes
        self._drawn = 0  # batches drawn from the current pass
        self._pass_key = None  # the key the pass's shuffle drew from (to restore the pass)

    @property
    def reiterable(self):
        """Whether a new pass can be started: arrays and containers yes, a generator or iterator no."""
        return not isinstance(self.data, collections.abc.Iterator)

    @property
    def steps_per_epoch(self):
        """Batches in a full epoch, if known (for the progress bar)."""
        if self.arrays:
            full = math.ceil(self.num_samples / self.batch_size)
        else:
            full = len(self.data) if hasattr(self.data, "__len__") else None
        return self.steps if full is None else min(full, self.steps or full)

    # ----------------------------------------------------------------- passes
    def _start_pass(self, key=None):
        order = None
        count = len(self.data) if self.sequence else self.num_samples if self.arrays else 0
        if self.shuffle and key is None:
            order, key = random.permutation(count)
        elif self.shuffle:
            order = random.permutation_for(count, key)
        self._pass_key = key if self.shuffle else None
        if self.arrays:
            self._pass = self._array_batches(order)
        elif self.sequence:
            self._pass = self._sequence_batches(range(count) if order is None else order)
        else:
            self._pass = iter(self.data)
        self._drawn = 0

    def _array_batches(self, order):
        for start in range(0, self.num_samples, self.batch_size):
            rows = slice(start, start + self.batch_size) if order is None else order[start:start + self.batch_size]
            yield tuple(map_structure(lambda a: a[rows], d) for d in self.data)

    def _sequence_batches(self, order):
        if callable(getattr(self.data, "on_epoch_begin", None)):
            self.data.on_epoch_begin()
        for i in order:
            yield self.data[int(i)]
        if callable(getattr(self.data, "on_epoch_end", None)):  # Keras: after each pass
            self.data.on_epoch_end()

    def _next(self):
        """The next batch of the pass (a Batch), or _END when the pass is over."""
        item = next(self._pass, _END)
        if item is _END:
            self._pass = None
            return _END
        self._drawn += 1
        return self._batch(item)

    def _batch(self, item):
        where = f" (batch {self._drawn} of the pass)"
        if not self.arrays and isinstance(item, list) and 2 <= len(item) <= 3:
            item = tuple(item)  # a DataLoader's default collate gives [x, y] (Keras 3: a list is that tuple)
        if self.arrays:
            x, y, sw = item
        elif isinstance(item, tuple) and 1 <= len(item) <= 3 and (len(item) >= 2 or not self.targets):
            x, y, sw = item + (None,) * (3 - len(item))
        elif not self.targets and not isinstance(item, tuple):
            x, y, sw = item, None, None
        else:
            shape = f"a tuple of {len(item)}" if isinstance(item, tuple) else type(item).__name__
            expected = ("(x, y) or (x, y, sample_weight)" if self.targets
                        else "x, or (x,), (x, y), (x, y, sample_weight)")
            raise ValueError(f"{self.what}: each batch of a generator or iterable must be {expected}, "
                             f"got {shape}{where}")
        if not self.arrays:
            for name, value in [("x", x)] + ([("y", y)] if self.targets else []):
                if value is None or not is_array_data(value):
                    raise ValueError(f"{self.what}: the {name} of a batch must be an array (or a list / dict of "
                                     f"arrays), got {type(value).__name__}{where}")
        size = _num_samples(self.what, x, y if self.targets else None, sw, where)
        if self.class_weight is not None:
            if sw is not None:
                raise ValueError(f"{self.what}: give class_weight or sample weights in the batches, not both")
            sw = class_weight_to_sample_weight(self.what, y, self.class_weight)
        return Batch(x, y if self.targets else None, sw if self.targets else None, size)

    def epoch(self, first_step=0):
        """Yields the Batches of one epoch, from step `first_step` of it (a resumed epoch has its
        earlier batches drawn already, see `set_state`). Yields nothing when the data ran out."""
        started = self._pass is None
        if started:
            self._start_pass()
        step = first_step
        while self.steps is None or step < self.steps:
            batch = self._next()
            if batch is _END:
                if step == 0 and not started and self.reiterable:
                    # the last epoch ended the pass exactly (steps per epoch): this epoch starts a new one
                    self._start_pass()
                    started = True
                    continue
                if self.steps is not None and step > 0:
                    warnings.warn(f"{self.what}: the data ran out after {step} of {self.steps} steps of this epoch",
                                  stacklevel=3)
                return
            if self.training:
                random.next_step()
            yield batch
            step += 1

    # ------------------------------------------------------------ save/restore
    def get_state(self):
        """Where the data is: the batches drawn from the current pass and the key its shuffle drew
        from (a JSON-able dict, for `attnx.callbacks.BackupAndRestore`)."""
        return {"drawn": None if self._pass is None else self._drawn, "pass_key": self._pass_key}

    def set_state(self, state):
        """Puts the data where `get_state` found it: restarts the pass (the same shuffle order) and
        draws the batches drawn before. A generator must start from its beginning, as the one the
        state was taken from did."""
        self._pass = None
        if state["drawn"] is None:
            return
        self._start_pass(state["pass_key"])
        for _ in range(state["drawn"]):
            if next(self._pass, _END) is _END:
                raise ValueError(f"{self.what}: the data holds fewer batches than the {state['drawn']} to resume after")
        self._drawn = state["drawn"]
