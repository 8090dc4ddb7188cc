"""Weights both ways between attnx layers and their PyTorch counterparts, and whole models both ways
between attnx and Keras 3 (`.keras` files: see `interop.keras_file`).

    layer = attnx.interop.from_torch(torch.nn.Linear(4, 3))
    module = attnx.interop.to_torch(layer)
    model = attnx.interop.from_keras("model.keras")
    attnx.interop.to_keras(model, "model.keras")

Every converter lives in this package, one module per layer module (`interop.core`, `interop.conv`,
`interop.recurrent`, `interop.transformer`); layer modules never import interop. Each registers
itself here, one way:

- ``@register_from_torch("Linear")`` decorates ``fn(module) -> (layer, to_attnx)`` where
  ``to_attnx(tensors, grads=False)`` maps a dict {torch parameter name: ndarray}
  (``module.named_parameters()`` names) to a dict {attnx param name: ndarray}. Weights and
  gradients both go through it, so ``torch_grads(module, layer)`` is the torch gradient in attnx
  layout (what parity tests compare). ``grads=True`` matters only where one attnx weight is the sum
  of several torch weights (an RNN's b_ih + b_hh): its gradient is each one's, not their sum.
- ``@register_to_torch(Dense)`` decorates ``fn(layer) -> torch module`` with the weights copied.
- ``@register_from_keras("LSTM")`` / ``@register_to_keras(LSTM)``: the Keras converters of the same
  modules (their contracts in `interop.registry`).
"""
import weakref

from .keras_file import from_keras, keras_objects, to_keras  # noqa: F401
from .registry import _FROM_TORCH, _TO_TORCH, register_from_torch, register_to_torch, set_torch_params  # noqa: F401


# layer -> the `to_attnx` of the torch module it came from (torch_grads maps the module's gradients with it)
_TORCH_MAPPINGS = weakref.WeakKeyDictionary()


def _import_converters():
    # the converter modules register themselves when imported (torch is imported only inside them)
    from . import attention, conv, core, recurrent, transformer  # noqa: F401


def _numpy_params(module, grads=False):
    out = {}
    for name, p in module.named_parameters():
        t = p.grad if grads else p
        out[name] = None if t is None else t.detach().cpu().numpy()
    return out


def from_torch(module, dtype="float32"):
    """An attnx layer equivalent to the PyTorch `module`, with its weights copied."""
    _import_converters()
    name = type(module).__name__
    if name not in _FROM_TORCH:
        raise TypeError(f"from_torch: no converter for torch.nn.{name}; supported: {', '.join(sorted(_FROM_TORCH))}")
    layer, to_attnx = _FROM_TORCH[name](module, dtype)
    weights = to_attnx(_numpy_params(module))
    layer.set_weights([weights[k] for k in layer.params])
    _TORCH_MAPPINGS[layer] = to_attnx
    return layer


def torch_grads(module, layer):
    """The gradients PyTorch accumulated in `module`, mapped to `layer`'s parameter names."""
    grads = _numpy_params(module, grads=True)
    missing = [k for k, v in grads.items() if v is None]
    if missing:
        raise ValueError(f"torch_grads: torch parameters without a gradient: {missing}")
    if layer not in _TORCH_MAPPINGS:
        raise ValueError(f"torch_grads: layer '{layer.name}' was not made by attnx.interop.from_torch")
    return _TORCH_MAPPINGS[layer](grads, grads=True)


def to_torch(layer):
    """A PyTorch module equivalent to the attnx `layer`, with its weights copied."""
    _import_converters()
    name = type(layer).__name__
    if name not in _TO_TORCH:
        raise TypeError(f"to_torch: no converter for attnx layer {name}; supported: {', '.join(sorted(_TO_TORCH))}")
    if not layer.built:
        raise ValueError(f"to_torch: layer '{layer.name}' has no weights yet; call it on data first")
    if layer.quantization_mode:
        raise ValueError(f"to_torch: layer '{layer.name}' is quantized ({layer.quantization_mode}); convert the "
                         "float32 layer (before quantize)")
    return _TO_TORCH[name](layer)

