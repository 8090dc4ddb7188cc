"""attnx: attention-based sequence models with a C++ core and a Keras-style API."""
import os

# OpenBLAS' idle workers spin (sched_yield) for 2^28 cycles (~0.1 s) after every threaded product,
# taking a core from attnx's own threads that run between products (time loops split over batch
# rows, losses, Adam): 275 -> 55 ms of system time per seq2seq training step. 2^20 cycles (< 1 ms)
# still covers back-to-back products. OpenBLAS reads it once, when it loads with _core; a value
# the user set wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from . import _core  # noqa: E402
from . import (activations, backend, callbacks, constraints, initializers, layers, losses, metrics, optimizers,
               regularizers)
from ._version import __version__  # noqa: F401
from .backend import set_num_threads, set_random_seed, show_config
from .models import Input, Model, Sequential, load_model
from .ops import GradientTape
from .serialization import custom_object_scope, register_serializable
from . import seq2seq, vision  # noqa: E402  (registers Seq2Seq, ImageCaptioner, which load_model may meet in a file)


def __getattr__(name):
    # data, datasets, distributed (mpi4py), draw, export (onnx), hierarchical, interop (torch), plot (matplotlib),
    # testing, train, utils and wrappers (scikit-learn) load on first use, keeping `import attnx` fast
    if name in ("data", "datasets", "distributed", "draw", "export", "hierarchical", "interop", "plot", "testing",
                "text", "train", "utils", "wrappers"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'attnx' has no attribute {name!r}")
