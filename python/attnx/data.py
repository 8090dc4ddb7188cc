"""`attnx.data.Dataset`: the part of `tf.data` a tutorial uses, over NumPy arrays.

    >>> import numpy as np, attnx
    >>> inputs, targets = np.ones((200, 3), np.float32), np.zeros((200, 1), np.float32)
    >>> dataset = attnx.data.Dataset.from_tensor_slices((inputs, targets)).shuffle(len(inputs), seed=0)
    >>> dataset = dataset.batch(64, drop_remainder=True)
    >>> model = attnx.Sequential([attnx.layers.Dense(1, input_shape=(3,))])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> len(model.fit(dataset, epochs=2, verbose=0).history["loss"])
    2
    >>> for batch, (inp, targ) in enumerate(dataset.take(2)):
    ...     print(batch, inp.shape, targ.shape)
    0 (64, 3) (64, 1)
    1 (64, 3) (64, 1)

A Dataset is a recipe: each iteration runs it from the start (a new shuffle order each pass, drawn from
the generator `shuffle` seeded, as `tf.data` reshuffles each iteration), yielding NumPy arrays in the
structure of the tensors given (an array, a tuple, a list or a dict of arrays). `fit`, `evaluate` and
`predict` take it as they take any iterable of batches (`attnx.data_adapter`): batches of
``(x, y)`` or ``(x, y, sample_weight)``, or `x` alone for `predict`. There is no prefetching:
`prefetch` is accepted and changes nothing.
"""
import collections.abc
import numbers

import numpy as np

from . import random

AUTOTUNE = -1  # tf.data.AUTOTUNE, for prefetch(buffer_size) and map(num_parallel_calls)
INFINITE = -1  # cardinality of a repeated dataset
UNKNOWN = -2


def _structure_map(fn, structure):
    if isinstance(structure, dict):
        return {k: _structure_map(fn, v) for k, v in structure.items()}
    if isinstance(structure, (tuple, list)):
        return type(structure)(_structure_map(fn, v) for v in structure)
    return fn(structure)


def _as_arrays(structure):
    """Tuples and dicts as structures of arrays; anything else (a list too, as tf.data) one array."""
    if isinstance(structure, dict):
        return {k: _as_arrays(v) for k, v in structure.items()}
    if isinstance(structure, tuple):
        return tuple(_as_arrays(v) for v in structure)
    return np.asarray(structure)


def _leaves(structure):
    found = []
    _structure_map(found.append, structure)
    return found


def _count(value, what, minimum=0, allow_minus_one=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
            value >= minimum or (allow_minus_one and value == -1)):
        raise ValueError(f"Dataset.{what} must be an integer >= {minimum}{' or -1' if allow_minus_one else ''}, "
                         f"got {value!r}")
    return int(value)


class Dataset(collections.abc.Iterable):
    """A sequence of elements built by chaining `from_tensor_slices`, `shuffle`, `batch`, `map`, `take`,
    `skip`, `repeat` (tf.data's names); iterate it, or give it to `fit` / `evaluate` / `predict`."""

    def __init__(self, make_iterator, cardinality):
        self._make_iterator = make_iterator  # () -> a new iterator over the elements
        self._cardinality = cardinality

    # ------------------------------------------------------------------------------ sources
    @staticmethod
    def from_tensor_slices(tensors):
        """One element per row of the arrays of `tensors` (an array, or a tuple / dict of arrays with the same
        first axis; a list is one array, as in tf.data): element i is `tensors` with every array replaced by
        its row i."""
        arrays = _as_arrays(tensors)
        leaves = _leaves(arrays)
        if not leaves:
            raise ValueError("Dataset.from_tensor_slices: no arrays given")
        if any(a.ndim == 0 for a in leaves):
            raise ValueError("Dataset.from_tensor_slices: every array needs a first axis to slice, got a scalar")
        sizes = {len(a) for a in leaves}
        if len(sizes) != 1:
            raise ValueError(f"Dataset.from_tensor_slices: the arrays have different first axes {sorted(sizes)}; "
                             "each element takes one row of every array")
        n = sizes.pop()

        def rows():
            for i in range(n):
                yield _structure_map(lambda a, i=i: a[i], arrays)
        return _dataset(rows, n)

    @staticmethod
    def from_tensors(tensors):
        """A dataset of one element, `tensors`."""
        element = _as_arrays(tensors)
        return _dataset(lambda: iter([element]), 1)

    @staticmethod
    def range(*args):
        """0, 1, ..., as Python's range, int64 scalars."""
        values = range(*args)
        return _dataset(lambda: (np.int64(v) for v in values), len(values))

    # ------------------------------------------------------------------------- transformations
    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True):
        """Elements in random order through a buffer of `buffer_size` (tf.data's: a full shuffle when it holds the
        whole dataset), drawn from attnx's random stream (`attnx.random`): `seed` fixes the orders, else
        `attnx.set_random_seed` does; each pass draws a new order unless `reshuffle_each_iteration` is False."""
        buffer_size = _count(buffer_size, "shuffle buffer_size", 1)
        if seed is not None:
            seed = _count(seed, "shuffle seed")
        source = self._make_iterator
        generator = random.SeedGenerator(seed, "Dataset.shuffle")
        fixed = {}  # the one pass key when the order is not redrawn

        def shuffled():
            if reshuffle_each_iteration:
                key = generator.next_key()
            else:
                key = fixed.setdefault("key", generator.next_key())
            draws = random.uniforms(key)
            buffer = []
            for element in source():
                if len(buffer) < buffer_size:
                    buffer.append(element)
                    continue
                i = int(next(draws) * len(buffer))
                yield buffer[i]
                buffer[i] = element
            while buffer:
                i = int(next(draws) * len(buffer))
                buffer[i], buffer[-1] = buffer[-1], buffer[i]
                yield buffer.pop()
        return _dataset(shuffled, self._cardinality)

    def batch(self, batch_size, drop_remainder=False):
        """Consecutive elements stacked into batches of `batch_size` (the last one smaller unless
        `drop_remainder`)."""
        batch_size = _count(batch_size, "batch batch_size", 1)
        source = self._make_iterator

        def batches():
            chunk = []
            for element in source():
                chunk.append(element)
                if len(chunk) == batch_size:
                    yield _stack(chunk)
                    chunk = []
            if chunk and not drop_remainder:
                yield _stack(chunk)
        n = self._cardinality
        if n >= 0:
            n = n // batch_size if drop_remainder else -(-n // batch_size)
        return _dataset(batches, n)

    def map(self, map_func, num_parallel_calls=None, deterministic=None):
        """`map_func` applied to each element (a tuple element is passed as separate arguments, as tf.data);
        its results are made arrays. `num_parallel_calls` is accepted and ignored (one thread)."""
        if not callable(map_func):
            raise TypeError(f"Dataset.map: map_func must be callable, got {type(map_func).__name__}")
        source = self._make_iterator

        def mapped():
            for element in source():
                out = map_func(*element) if isinstance(element, tuple) else map_func(element)
                yield _structure_map(np.asarray, out)
        return _dataset(mapped, self._cardinality)

    def take(self, count):
        """The first `count` elements (-1: all)."""
        count = _count(count, "take count", 0, allow_minus_one=True)
        if count == -1:
            return self
        source = self._make_iterator

        def taken():
            if count == 0:
                return
            for i, element in enumerate(source()):
                yield element
                if i + 1 == count:
                    return
        n = self._cardinality
        return _dataset(taken, count if n == INFINITE else (min(n, count) if n >= 0 else UNKNOWN))

    def skip(self, count):
        """Every element after the first `count`."""
        count = _count(count, "skip count", 0)
        source = self._make_iterator

        def skipped():
            for i, element in enumerate(source()):
                if i >= count:
                    yield element
        n = self._cardinality
        return _dataset(skipped, max(n - count, 0) if n >= 0 else n)

    def repeat(self, count=None):
        """The elements `count` times (None or -1: without end)."""
        count = -1 if count is None else _count(count, "repeat count", 0, allow_minus_one=True)
        source = self._make_iterator

        def repeated():
            done = 0
            while count == -1 or done < count:
                yield from source()
                done += 1
        n = self._cardinality
        return _dataset(repeated, INFINITE if count == -1 and n != 0 else (n * count if n >= 0 else n))

    def prefetch(self, buffer_size=AUTOTUNE):
        """The same dataset (attnx reads batches as the loop asks for them; tf.data's prefetch has no effect here)."""
        return self

    def cache(self, filename=""):
        """The same dataset (its elements are recomputed each pass; from_tensor_slices already holds them)."""
        return self

    # ------------------------------------------------------------------------------- reading
    def __iter__(self):
        return iter(self._make_iterator())

    def as_numpy_iterator(self):
        """An iterator over the elements (they are NumPy arrays already)."""
        return iter(self)

    def cardinality(self):
        """The number of elements, INFINITE (-1) or UNKNOWN (-2), as tf.data."""
        return self._cardinality

    def __repr__(self):
        return f"<attnx.data.Dataset cardinality={self._cardinality}>"


class _SizedDataset(Dataset):
    """A Dataset whose number of elements is known: it has a length (tf.data's `len` raises for the others,
    and attnx's datasets of unknown or infinite size have none, so that `fit` reads them as unsized iterables)."""

    def __len__(self):
        return self._cardinality


def _dataset(make_iterator, cardinality):
    return (_SizedDataset if cardinality >= 0 else Dataset)(make_iterator, cardinality)


def _stack(elements):
    """Elements of one structure stacked along a new first axis."""
    first = elements[0]
    if isinstance(first, dict):
        return {k: _stack([e[k] for e in elements]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_stack([e[i] for e in elements]) for i in range(len(first)))
    try:
        return np.stack(elements)
    except ValueError as exc:
        shapes = sorted({np.shape(e) for e in elements})
        raise ValueError(f"Dataset.batch: elements of different shapes {shapes} cannot form a batch ({exc})") from None
