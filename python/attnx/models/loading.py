"""`load_model`: a model file back into a model (the class found by name, built, its weights and
compile settings restored)."""
import numpy as np

from .. import saving, serialization
from ..layers import base as layers_base
from ..layers.base import Layer
from .model import Model


def load_model(path, custom_objects=None, compile=True):
    """Loads a model saved with ``model.save(path)`` (config, weights, compile settings and optimizer
    state): a functional model, a Sequential, a model class such as `attnx.seq2seq.Seq2Seq`, or a model
    class of yours. `custom_objects` ({name: class or function}) names your layers, models and loss
    functions not registered with `attnx.register_serializable`; ``compile=False`` leaves the model
    uncompiled (the saved optimizer, losses and metrics are not rebuilt), as in Keras. Bounds: those of
    `attnx.saving.read_model` (no allocation beyond the file's size), then the model class's own."""
    with serialization.custom_object_scope(custom_objects):
        return _load_model(path, compile)


def _load_model(path, compile=True):
    import importlib
    for module in _LAZY_MODULES:  # their classes and losses register on import: a file may name any of them
        importlib.import_module(module)
    header, weights = saving.read_model(path, compile)
    name = header["model"]["class_name"]
    cls = Layer.registry.get(name)
    if cls is None or not issubclass(cls, Model):
        raise ValueError(f"{path}: unknown model class {name!r} (register it with @attnx.register_serializable() "
                         "or give it in custom_objects)")
    try:
        # weights are created as floats (an int8 one as float32, 4 bytes a value, then quantized)
        with layers_base.weight_budget(sum(max(w.nbytes, 4 * w.size) for _, w in weights), path):
            model = cls.from_config(header["model"]["config"])
            build_inputs = header["model"].get("build_inputs")
            if build_inputs is not None:
                _build_from_spec(model, _checked_spec(build_inputs, path))
            if header["model"].get("quantization_mode"):
                model.quantize(header["model"]["quantization_mode"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: the model config does not describe a {cls.__name__} ({exc})") from exc
    saving.assign(model, weights, path)
    compile_config = header.get("compile")
    if compile_config and compile:
        from .. import losses, optimizers
        model.compile(optimizer=optimizers.get(compile_config["optimizer"]),
                      loss=[losses.get(l) for l in compile_config["loss"]] if len(compile_config["loss"]) > 1
                      else losses.get(compile_config["loss"][0]),
                      metrics=compile_config["metrics"] if len(compile_config["metrics"]) > 1
                      else compile_config["metrics"][0],
                      loss_weights=compile_config["loss_weights"])
        saving.restore_optimizer_state(model, header, path)
    return model


# the modules of model and layer classes that `import attnx` leaves for first use (attnx/__init__.py)
_LAZY_MODULES = ("attnx.draw", "attnx.hierarchical")


def _build_from_spec(model, spec):
    """Calls a model written as a class once on zeros of `spec` (`_input_spec`), creating its weights."""
    values = [None if s is None else np.zeros(s["shape"], dtype=s["dtype"]) for s in spec]
    model.apply(values[0], *values[1:], training=False)


def _checked_spec(spec, path):
    """A saved `_input_spec`, every entry checked: None or {shape: small non-negative ints, dtype: a numeric dtype}."""
    if not isinstance(spec, list) or not 1 <= len(spec) <= 64 or spec[0] is None:
        raise ValueError(f"{path}: model.build_inputs should be a list of 1 to 64 input specs, the first not null, "
                         f"got {str(spec)[:80]}")
    for i, entry in enumerate(spec):
        if entry is None:
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or len(shape) > 8 or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 4096 for d in shape) or \
                np.prod(shape, dtype=np.int64) > 2 ** 24 or entry.get("dtype") not in _SPEC_DTYPES:
            raise ValueError(f"{path}: model.build_inputs[{i}] should be {{shape: up to 8 sizes <= 4096, dtype: one of "
                             f"{sorted(_SPEC_DTYPES)}}}, got {entry!r}")
    return spec


_SPEC_DTYPES = {"float32", "float64", "int32", "int64", "bool", "uint8", "int8", "int16"}
