"""The converter registry: each converter module (interop.core, .recurrent, .transformer,
.attention) registers its functions here; `attnx.interop` and `attnx.interop.keras_file` look them
up. Kept apart from the package's __init__ so that the converter modules import it without
importing the package that imports them."""
import numpy as np

from .. import constraints, regularizers

_FROM_TORCH = {}
_TO_TORCH = {}
_FROM_KERAS = {}
_TO_KERAS = {}


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


def register_from_keras(*keras_class_names):
    """Decorates ``fn(class_name, config, weights) -> (layer, load)``: `config` is the Keras layer's
    config dict, `weights` its `keras_file.WeightGroup` (shapes known, nothing read yet); ``load()``
    returns the layer's arrays in attnx's `get_weights` order, read once the model around the layer is
    built. A custom (not built-in) Keras class registers as ``"custom>" + its name in lower case``."""
    def wrap(fn):
        for name in keras_class_names:
            _FROM_KERAS[name] = fn
        return fn
    return wrap


def torch_kernel_and_bias(kernel_from_weight):
    """The `to_attnx` of a PyTorch module with `weight` and an optional `bias` (see
    `register_from_torch`): kernel = kernel_from_weight(weight), bias as it is."""
    def to_attnx(t, grads=False):
        out = {"kernel": kernel_from_weight(t["weight"])}
        if "bias" in t:
            out["bias"] = t["bias"]
        return out
    return to_attnx


def no_weights():
    """The `load` of a Keras layer without weights (see `register_from_keras`)."""
    return []


def register_to_keras(*layer_classes):
    """Decorates ``fn(layer, keras) -> [(keras layer, its weights for set_weights), ...]``: the Keras
    layers applied one after the other in place of `layer` (one, except attnx's stacked RNNs)."""
    def wrap(fn):
        for cls in layer_classes:
            _TO_KERAS[cls.__name__] = fn
        return fn
    return wrap


def keras_layer_kwargs(config):
    """The attnx Layer arguments (name, trainable, dtype) of a Keras layer config."""
    dtype = config.get("dtype") or "float32"
    if isinstance(dtype, dict):  # a DTypePolicy
        dtype = dtype.get("config", {}).get("name", "float32")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"layer '{config.get('name')}' has dtype policy {dtype!r}; attnx computes in float32 or "
                         "float64")
    return {"name": config.get("name"), "trainable": bool(config.get("trainable", True)), "dtype": dtype}


def keras_kwargs(layer):
    """The Keras layer arguments (name, trainable, dtype) of an attnx layer."""
    return {"name": layer.name, "trainable": layer.trainable, "dtype": layer.dtype.name}


def keras_regularizer(keras, regularizer):
    """An attnx regularizer (L1L2) as Keras', or None."""
    if regularizer is None:
        return None
    return keras.regularizers.L1L2(l1=regularizer.l1, l2=regularizer.l2)


def keras_constraint(keras, constraint):
    """An attnx constraint (attnx.constraints, Keras' classes) as Keras', or None."""
    if constraint is None:
        return None
    return getattr(keras.constraints, type(constraint).__name__)(**constraint.get_config())


def kernel_arguments_from_keras(config):
    """attnx's kernel-layer arguments (Dense, Conv1D, Conv2D: `Layer._set_kernel_arguments`) of a Keras config;
    the initializers are not read (the weights come with the file)."""
    return {"activation": config.get("activation"), "use_bias": config.get("use_bias", True),
            "kernel_regularizer": regularizers.get(config.get("kernel_regularizer")),
            "bias_regularizer": regularizers.get(config.get("bias_regularizer")),
            "kernel_constraint": constraints.get(config.get("kernel_constraint")),
            "bias_constraint": constraints.get(config.get("bias_constraint"))}


def keras_kernel_arguments(keras, layer):
    """The Keras arguments of an attnx kernel layer's activation, bias, regularizers and constraints."""
    return {"activation": layer.activation, "use_bias": layer.use_bias,
            "kernel_regularizer": keras_regularizer(keras, layer.kernel_regularizer),
            "bias_regularizer": keras_regularizer(keras, layer.bias_regularizer),
            "kernel_constraint": keras_constraint(keras, layer.kernel_constraint),
            "bias_constraint": keras_constraint(keras, layer.bias_constraint)}


def check_keras_options(class_name, config, **supported):
    """Raises ValueError for a Keras option attnx does not have, set to anything but its `supported`
    value (e.g. ``stateful=False``)."""
    for option, value in supported.items():
        given = config.get(option, value)
        if given != value and not (isinstance(value, (list, tuple)) and given in value):
            raise ValueError(f"{class_name} '{config.get('name')}' has {option}={given!r}; attnx converts "
                             f"{option}={value!r} only")
