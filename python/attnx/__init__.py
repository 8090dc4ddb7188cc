"""attnx: attention-based sequence models with a C++ core and a Keras-style API."""
from . import _core
from . import activations, backend, callbacks, initializers, layers, losses, metrics, optimizers, regularizers
from .backend import set_num_threads, set_random_seed
from .models import Input, Model, Sequential, load_model

__version__ = "0.1.0"


def __getattr__(name):
    # datasets, text, seq2seq, interop (torch), plot (matplotlib) and testing load on first use,
    # keeping `import attnx` fast
    if name in ("datasets", "interop", "plot", "seq2seq", "testing", "text"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'attnx' has no attribute {name!r}")
