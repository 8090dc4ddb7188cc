"""The converter registry: each converter module (export.core, .conv, .recurrent, .attention,
.transformer) registers one function per layer class here; `export.model` looks them up. Kept
apart from the package's __init__ so that the converter modules import it without importing the
package that imports them."""
from typing import NamedTuple

from .graph import UnsupportedLayerError

_CONVERTERS = {}  # layer class -> fn(graph, layer, call) -> output name or list of names
_MASK_RULES = {}  # layer class -> fn(graph, layer, call) -> the output mask (name, list, or None)


class Call(NamedTuple):
    """One layer call as the ONNX graph sees it.

    inputs: the tensor name, or list of names, the layer was called on.
    shapes: their attnx shapes (batch axis None), the same structure.
    args, kwargs: the call's other arguments, tensors among them replaced by their names.
    mask: the mask reaching the layer (Keras' propagation): a bool (batch, steps) tensor name, a
        list of those (None entries) for a list input, or None.
    """
    inputs: object
    shapes: object
    args: tuple
    kwargs: dict
    mask: object = None

    def option(self, name, default=None):
        return self.kwargs.get(name, default)


def converts(*layer_classes):
    """Registers the decorated function as the ONNX converter of exactly these classes (not
    their subclasses, which may compute something else)."""
    def wrap(fn):
        for cls in layer_classes:
            _CONVERTERS[cls] = fn
        return fn
    return wrap


def output_mask_of(*layer_classes):
    """Registers the decorated function as the rule giving these classes' output mask (the
    default passes the input mask on when the layer `supports_masking`, as Layer.compute_mask)."""
    def wrap(fn):
        for cls in layer_classes:
            _MASK_RULES[cls] = fn
        return fn
    return wrap


def convert(graph, layer, call):
    """The outputs of `layer` on `call` added to `graph`; UnsupportedLayerError names the layer when
    no converter handles its class."""
    if layer.quantization_mode:
        raise unsupported(layer, f"it is quantized ({layer.quantization_mode}); ONNX Runtime would not compute "
                                 "attnx's int8 products, so export the float32 model (before model.quantize)")
    fn = _CONVERTERS.get(type(layer))
    if fn is None:
        raise unsupported(layer, _why_not(layer))
    return fn(graph, layer, call)


def output_mask(graph, layer, call):
    rule = _MASK_RULES.get(type(layer))
    if rule is not None:
        return rule(graph, layer, call)
    return call.mask if layer.supports_masking else None


def unsupported(layer, reason):
    """The error for a layer (or a layer option) that cannot be exported."""
    return UnsupportedLayerError(f"attnx.export: layer '{layer.name}' ({type(layer).__name__}) cannot be exported "
                                 f"to ONNX: {reason}")


def _why_not(layer):
    if getattr(layer, "call", None) is not None:
        return ("it is written as a `call` with attnx.ops, which has no ONNX converter; build the model from "
                "attnx's own layers (e.g. AttentionPooling for the Keras tutorial's attention)")
    return "no ONNX converter is registered for this class"


def supported_layers():
    """The names of the layer classes with a converter, sorted."""
    return sorted(cls.__name__ for cls in _CONVERTERS)
