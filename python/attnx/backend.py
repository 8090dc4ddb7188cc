"""Process-wide settings: the random generator behind initializers, dropout and shuffling, and threads."""
import numpy as np

from . import _core

_rng = np.random.default_rng()


def set_random_seed(seed):
    """Seeds every random choice attnx makes (initializers, dropout masks, shuffling).

    Two runs that call `set_random_seed(s)` first and then do the same things produce identical
    results.
    """
    global _rng
    _rng = np.random.default_rng(seed)


def rng():
    """The generator attnx draws from; reseed it with `set_random_seed`."""
    return _rng


def set_num_threads(n):
    """Sets the number of threads the C++ kernels (OpenBLAS) use."""
    n = int(n)
    if n < 1:
        raise ValueError(f"set_num_threads: expected a positive count, got {n}")
    _core.set_num_threads(n)


def get_num_threads():
    return _core.get_num_threads()


FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_dtype(dtype, where="dtype"):
    dt = np.dtype(dtype)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{where}: attnx computes in float32 or float64, got {dt}")
    return dt
