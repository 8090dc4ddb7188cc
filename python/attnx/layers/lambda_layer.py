"""Lambda (Keras 3's): a function written with `attnx.ops` as a layer, trained through the tape."""
import base64
import inspect
import marshal
import types

import numpy as np

from .. import ops, serialization
from ..masking import as_mask
from .base import Layer

_SAFE_MODE_MESSAGE = ("loading a Lambda whose function is Python bytecode (a lambda or a local function) runs "
                      "that code: pass safe_mode=False to Lambda.from_config if you trust its source, or register "
                      "the function with @attnx.register_serializable()")


def _serialize_function(fn, what):
    """A config entry for a function: `attnx.ops`' or a registered one by name; any other as its bytecode
    (Keras' way for lambdas, loaded only with safe_mode=False)."""
    name = serialization.registered_name(fn)
    if name is not None:
        return {"registered": name}
    if getattr(ops, getattr(fn, "__name__", ""), None) is fn:
        return {"ops": fn.__name__}
    if not isinstance(fn, types.FunctionType):
        raise ValueError(f"Lambda: {what} {fn!r} is not a Python function, which a config cannot hold; register it "
                         "with @attnx.register_serializable()")
    if fn.__closure__:
        raise ValueError(f"Lambda: {what} {fn.__name__!r} reads variables of an enclosing function, which a config "
                         "cannot hold; register it with @attnx.register_serializable() or pass them in `arguments`")
    loaded = getattr(fn, "_attnx_bytecode", None)  # marshal's bytes vary between copies of one code object
    bytecode = loaded[1] if loaded and loaded[0] is fn.__code__ else base64.b64encode(
        marshal.dumps(fn.__code__)).decode("ascii")
    return {"bytecode": bytecode, "defaults": None if fn.__defaults__ is None else list(fn.__defaults__)}


def _deserialize_function(entry, safe_mode, what):
    if not isinstance(entry, dict) or len(entry.keys() - {"defaults"}) != 1:
        raise ValueError(f"Lambda: {what} in a config must be a dict with 'registered', 'ops' or 'bytecode', got "
                         f"{entry!r}")
    if "registered" in entry:
        fn = serialization.get_registered_object(entry["registered"])
        if fn is None:
            raise ValueError(f"Lambda: {what} {entry['registered']!r} is not registered: register it with "
                             "@attnx.register_serializable() or give it in custom_objects")
        return fn
    if "ops" in entry:
        fn = getattr(ops, str(entry["ops"]), None)
        if entry["ops"] not in ops.__all__ or not callable(fn):
            raise ValueError(f"Lambda: {what} {entry['ops']!r} is not a function of attnx.ops")
        return fn
    if safe_mode:
        raise ValueError(f"Lambda: {_SAFE_MODE_MESSAGE}")
    code = marshal.loads(base64.b64decode(entry["bytecode"]))
    defaults = entry.get("defaults")
    # the function's globals: attnx.ops as `ops`, NumPy as `np` (what a Lambda's function reads), and custom objects
    scope = {"ops": ops, "np": np, **(serialization._scope.get() or {})}
    fn = types.FunctionType(code, scope, code.co_name, None if defaults is None else tuple(defaults))
    fn._attnx_bytecode = (code, entry["bytecode"])  # saved again as it was read
    return fn


class Lambda(Layer):
    """Wraps ``function(inputs, **arguments)`` as a layer (Keras' Lambda). Written with `attnx.ops`
    (or arithmetic on its inputs), it trains through the tape like any `call` layer.

    Args:
        function: the function of the inputs; it gets `mask` and `training` when it names them (a mask of
            one input as the mask rule reads it: (batch, steps) bool).
        output_shape: the output shape without the batch axis, or a function of the input shape; by
            default found by calling the function on zeros.
        mask: the output mask: None (no mask), an array, or a function ``mask(inputs, input_mask)``.
        arguments: keyword arguments for `function`.

    Inputs are numeric arrays (a boolean mask is given as `mask`). Config: a function of `attnx.ops` or a
    registered one by name; a lambda as its Python bytecode, which `from_config` loads only with
    ``safe_mode=False`` (as Keras).
    """

    def __init__(self, function, output_shape=None, mask=None, arguments=None, **kwargs):
        super().__init__(**kwargs)
        if not callable(function):
            raise TypeError(f"Lambda: function must be callable, got {type(function).__name__}")
        if arguments is not None and not isinstance(arguments, dict):
            raise TypeError(f"Lambda: arguments must be a dict of keyword arguments, got {type(arguments).__name__}")
        self.function = function
        self.arguments = dict(arguments or {})
        self.mask = mask
        self.supports_masking = mask is not None
        if output_shape is not None and not callable(output_shape):
            output_shape = tuple(output_shape)
        self._output_shape = output_shape
        try:
            names = set(inspect.signature(function).parameters)
        except (TypeError, ValueError):  # a builtin without a signature
            names = set()
        self._takes_mask, self._takes_training = "mask" in names, "training" in names

    def call(self, inputs, mask=None, training=None):
        for x in inputs if isinstance(inputs, (list, tuple)) else [inputs]:
            dtype = getattr(ops.untraced(x), "dtype", None)
            if dtype is not None and dtype.kind not in "fiu":  # a mask goes in `mask`
                raise TypeError(f"Layer '{self.name}': inputs must be numeric arrays, got dtype {dtype}")
        kwargs = dict(self.arguments)
        if self._takes_mask:
            if mask is not None and not isinstance(mask, (list, tuple)) and np.ndim(ops.untraced(inputs)) >= 2:
                shape = np.shape(ops.untraced(inputs))  # the mask rule: (batch, steps) bool, 0/1 or lengths
                mask = as_mask(mask, shape[0], shape[1], f"Layer '{self.name}': `mask`")
            kwargs["mask"] = mask
        if self._takes_training:
            kwargs["training"] = training
        return self.function(inputs, **kwargs)

    def _infers_shapes_by_calling(self):
        return False  # compute_output_shape calls the function, keeping the inputs' batch size (Keras)

    def compute_output_shape(self, input_shape):
        batch = (input_shape[0] if isinstance(input_shape, list) else input_shape)[0]
        if self._output_shape is None:  # found by calling the function on zeros
            shapes = super().compute_output_shape(input_shape)
            if isinstance(shapes, list):
                return [(batch,) + tuple(s[1:]) for s in shapes]
            return (batch,) + tuple(shapes[1:])
        if callable(self._output_shape):
            return tuple(self._output_shape(input_shape))
        return (batch,) + self._output_shape

    def compute_mask(self, inputs, mask=None):
        if callable(self.mask):
            return self.mask(inputs, mask)
        return self.mask

    def get_config(self):
        config = {**super().get_config(), "function": _serialize_function(self.function, "function"),
                  "arguments": self.arguments}
        if callable(self._output_shape):
            config["output_shape"] = _serialize_function(self._output_shape, "output_shape")
        elif self._output_shape is not None:
            config["output_shape"] = list(self._output_shape)
        if callable(self.mask):
            config["mask"] = _serialize_function(self.mask, "mask")
        elif self.mask is not None:
            config["mask"] = np.asarray(self.mask).tolist()
        return config

    @classmethod
    def from_config(cls, config, safe_mode=True):
        config = dict(config)
        config["function"] = _deserialize_function(config["function"], safe_mode, "function")
        if isinstance(config.get("output_shape"), dict):
            config["output_shape"] = _deserialize_function(config["output_shape"], safe_mode, "output_shape")
        if isinstance(config.get("mask"), dict):
            config["mask"] = _deserialize_function(config["mask"], safe_mode, "mask")
        elif config.get("mask") is not None:
            config["mask"] = np.asarray(config["mask"])
        return super().from_config(config)
