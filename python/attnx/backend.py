"""Process-wide settings: the random generator behind initializers, dropout and shuffling, and threads."""
import os

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


def show_config(file=None):
    """Prints what runs: the instruction set attnx's vector loops and register tiles use (picked at
    run time), the OpenBLAS build, the kernels it picked (its core; the environment variable
    OPENBLAS_CORETYPE pins them, and attnx never sets it), and the thread budget."""
    config = _core._config()
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    print(f"attnx SIMD level:  {config['simd_level']} (this CPU: {config['cpu_simd_level']})\n"
          f"OpenBLAS:          {config['openblas_config'].strip()}\n"
          f"OpenBLAS core:     {config['openblas_core']}"
          f" ({'pinned by OPENBLAS_CORETYPE=' + pinned if pinned else 'picked for this CPU'})\n"
          f"threads:           {config['threads']}", file=file)


FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_dtype(dtype, where="dtype"):
    dt = np.dtype(dtype)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{where}: attnx computes in float32 or float64, got {dt}")
    return dt
