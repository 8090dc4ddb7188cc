"""The converter registry: each converter module (interop.core, .recurrent, .transformer) registers
its functions here; `attnx.interop` looks them up. Kept apart from the package's __init__ so that
the converter modules import it without importing the package that imports them."""
import numpy as np

_FROM_TORCH = {}
_TO_TORCH = {}


def register_from_torch(torch_class_name):
    def wrap(fn):
        _FROM_TORCH[torch_class_name] = fn
        return fn
    return wrap


def register_to_torch(layer_class):
    def wrap(fn):
        _TO_TORCH[layer_class.__name__] = fn
        return fn
    return wrap


def set_torch_params(module, tensors):
    """Copies {torch parameter name: ndarray} into `module` (shapes must match)."""
    import torch
    with torch.no_grad():
        for name, p in module.named_parameters():
            value = np.asarray(tensors[name])
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"set_torch_params: '{name}' expected shape {tuple(p.shape)}, got {value.shape}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(value)).to(p.dtype))
    return module
