"""attnx: attention-based sequence models with a C++ core and a Keras-style API."""
from . import _core
from . import activations, backend, initializers, layers, losses, optimizers, regularizers
from .backend import set_num_threads, set_random_seed

__version__ = "0.1.0"


def __getattr__(name):
    # interop (imports torch) and plot (imports matplotlib) load on first use to keep `import attnx` fast
    if name in ("interop", "plot", "testing"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'attnx' has no attribute {name!r}")
