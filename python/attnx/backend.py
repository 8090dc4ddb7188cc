"""Process-wide settings: the random seed, training's randomness rule, threads and dtypes."""
import concurrent.futures
import contextlib
import contextvars
import os
import re
import threading

import numpy as np

from . import _core, random


def set_random_seed(seed):
    """Seeds every random choice attnx makes (initializers, dropout masks, sampling, shuffling; see
    `attnx.random`).

    Two runs that call `set_random_seed(s)` first and then do the same things produce identical
    results.
    """
    random.set_seed(seed)


def rng():
    """The NumPy generator of initial weights and synthetic data (`attnx.random.numpy_generator`);
    training's draws come from `attnx.random`'s stream. Reseed both with `set_random_seed`."""
    return random.numpy_generator()


# False while a layer call recorded on a tape runs in inference mode (``training=False`` under a
# GradientTape): the layer takes its training path, which keeps what its backward needs, without
# training's randomness.
_training_randomness = contextvars.ContextVar("attnx_training_randomness", default=True)


def training_randomness(training):
    """Whether a forward pass given `training` draws its training-only random numbers (dropout masks,
    hard attention's samples): the one rule every layer asks."""
    return bool(training) and _training_randomness.get()


@contextlib.contextmanager
def without_training_randomness():
    """Within the block, training calls draw no dropout masks and take no samples (see above)."""
    token = _training_randomness.set(False)
    try:
        yield
    finally:
        _training_randomness.reset(token)


def set_num_threads(n):
    """Sets the number of threads the C++ kernels (OpenBLAS) use."""
    n = int(n)
    if n < 1:
        raise ValueError(f"set_num_threads: expected a positive count, got {n}")
    _core.set_num_threads(n)


def get_num_threads():
    return _core.get_num_threads()


_side = {"executor": None, "pid": None, "busy": threading.local()}


def _serially(task):
    """task() with the kernels it calls on this thread alone."""
    _side["busy"].active = True
    _core._set_serial_kernels(True)
    try:
        return task()
    finally:
        _core._set_serial_kernels(False)
        _side["busy"].active = False


def run_side_by_side(*tasks):
    """Returns (tasks[0](), tasks[1](), ...), the first run on this thread and the others on a
    helper thread at the same time, each with the kernels it calls on its own thread, when there are
    two or more tasks and the thread budget has two or more threads; else in turn. For independent
    work such as a bidirectional layer's two directions: at the small batches attnx is used for,
    one direction per core beats both directions each split across the cores (no split
    bookkeeping, no waiting for the slower half at every step). Inside a task already running side
    by side, tasks run in turn."""
    if len(tasks) < 2 or _core.get_num_threads() < 2 or getattr(_side["busy"], "active", False):
        return tuple(task() for task in tasks)
    if _side["pid"] != os.getpid():  # none yet, or a forked child's copy whose thread is gone
        _side["executor"] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="attnx-side")
        _side["pid"] = os.getpid()
    _core._set_single_threaded_blas(True)
    try:
        # in this thread's context: what a caller's context variables say (a GradientTape's gradient buffers)
        others = [_side["executor"].submit(contextvars.copy_context().run, _serially, task) for task in tasks[1:]]
        try:
            first = _serially(tasks[0])
        finally:
            rest = [other.result() for other in others]
    finally:
        _core._set_single_threaded_blas(False)
    return (first, *rest)


def show_config(file=None):
    """Prints what runs: the instruction set attnx's vector loops and register tiles use (picked at
    run time), the OpenBLAS build, the kernels it picked (its core; the environment variable
    OPENBLAS_CORETYPE pins them, and attnx never sets it), and the thread budget."""
    config = _core._config()
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    amx = [kind for kind in ("bf16", "int8") if config[f"amx_{kind}"]]
    cpu_amx = [kind for kind in ("bf16", "int8") if config[f"cpu_amx_{kind}"]]
    print(f"attnx SIMD level:  {config['simd_level']} (this CPU: {config['cpu_simd_level']})\n"
          f"AMX tiles:         {' and '.join(amx) + ' products' if amx else 'not used'}"
          f" (this CPU and OS: {' and '.join(cpu_amx) or 'none'})\n"
          f"OpenBLAS:          {config['openblas_config'].strip()}\n"
          f"OpenBLAS core:     {config['openblas_core']}"
          f" ({'pinned by OPENBLAS_CORETYPE=' + pinned if pinned else 'picked for this CPU'})\n"
          f"threads:           {config['threads']}", file=file)


FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


_floatx = "float32"


def floatx():
    """The dtype of layers made without one (Keras' `keras.config.floatx`): "float32" unless set."""
    return _floatx


def set_floatx(dtype):
    """Makes "float32" or "float64" the dtype of the layers made from now on without a `dtype`
    (Keras' `keras.config.set_floatx`; float64 is what the gradient checks use)."""
    global _floatx
    _floatx = as_float_dtype(dtype, "set_floatx").name


def as_float_dtype(dtype, where="dtype"):
    dt = np.dtype(floatx() if dtype is None else dtype)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{where}: attnx computes in float32 or float64, got {dt}")
    return dt


_name_counts = {}


def snake_case(name):
    """Keras' naming: "MultiHeadAttention" -> "multi_head_attention", "LSTM" -> "lstm"."""
    name = re.sub(r"(.)([A-Z][a-z0-9]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def unique_name(prefix):
    """`prefix`, then `prefix_1`, `prefix_2`, ... for later objects of the same kind."""
    n = _name_counts.get(prefix, 0)
    _name_counts[prefix] = n + 1
    return prefix if n == 0 else f"{prefix}_{n}"
