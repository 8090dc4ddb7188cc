"""Converters of the image layers. PyTorch: Conv2d <-> Conv2D, MaxPool2d <-> MaxPooling2D; the
weights convert, the layouts do not (PyTorch's modules read (B, C, H, W), attnx's (B, H, W, C)).
Keras: Conv2D, MaxPooling2D, AveragePooling2D both ways, channels last on both sides and the kernel in
the same (KH, KW, C, F) layout, so the weights go across as they are."""
from ..layers.conv import AveragePooling2D, Conv2D, MaxPooling2D
from .registry import (check_keras_options, kernel_arguments_from_keras, keras_kernel_arguments, keras_kwargs,
                       keras_layer_kwargs, no_weights, register_from_keras, register_from_torch, register_to_keras,
                       register_to_torch, set_torch_params, torch_kernel_and_bias)


def _pair(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _padding_from(module, kind):
    """attnx's padding for a torch module's: 'valid' for none, 'same' where torch pads as TensorFlow
    does (stride 1, 'same' or (k - 1) / 2 on both sides of an odd kernel); ValueError otherwise."""
    padding, window = module.padding, _pair(module.kernel_size)
    if padding == "valid" or _pair(padding) == (0, 0):
        return "valid"
    symmetric = all(k % 2 and p == (k - 1) // 2 for k, p in zip(window, _pair(padding)))
    if _pair(module.stride) == (1, 1) and (padding == "same" or symmetric):
        return "same"
    raise ValueError(f"from_torch: torch.nn.{kind} with padding={padding!r}, stride={module.stride} pads otherwise "
                     "than TensorFlow's 'same' or 'valid'")


@register_from_torch("Conv2d")
def _conv2d_from(module, dtype):
    if module.groups != 1 or _pair(module.dilation) != (1, 1) or module.padding_mode != "zeros":
        raise ValueError("from_torch: torch.nn.Conv2d with groups, dilation or a padding_mode other than 'zeros' "
                         "has no attnx equivalent")
    layer = Conv2D(module.out_channels, _pair(module.kernel_size), strides=_pair(module.stride),
                   padding=_padding_from(module, "Conv2d"), use_bias=module.bias is not None, dtype=dtype)
    layer.build((None, None, None, module.in_channels))
    layer.built = True
    # (F, C, KH, KW) -> Keras' (KH, KW, C, F)
    return layer, torch_kernel_and_bias(lambda weight: weight.transpose(2, 3, 1, 0))


@register_to_torch(Conv2D)
def _conv2d_to(layer):
    import torch
    if layer.activation != "linear":
        raise ValueError(f"to_torch: Conv2D '{layer.name}' has activation {layer.activation!r}; "
                         "torch.nn.Conv2d has none")
    if layer.padding == "same" and layer.strides != (1, 1):
        raise ValueError(f"to_torch: Conv2D '{layer.name}': torch.nn.Conv2d pads 'same' for stride 1 only")
    kernel = layer.params["kernel"]
    module = torch.nn.Conv2d(kernel.shape[2], kernel.shape[3], layer.kernel_size, stride=layer.strides,
                             padding=layer.padding, bias=layer.use_bias, dtype=getattr(torch, layer.dtype.name))
    tensors = {"weight": kernel.transpose(3, 2, 0, 1)}
    if layer.use_bias:
        tensors["bias"] = layer.params["bias"]
    return set_torch_params(module, tensors)


@register_from_torch("MaxPool2d")
def _max_pool2d_from(module, dtype):
    if _pair(module.dilation) != (1, 1) or module.ceil_mode or module.return_indices:
        raise ValueError("from_torch: torch.nn.MaxPool2d with dilation, ceil_mode or return_indices has no attnx "
                         "equivalent")
    if _pair(module.padding) != (0, 0):
        raise ValueError("from_torch: torch.nn.MaxPool2d pads with -inf on both sides; attnx pools 'valid' or "
                         "TensorFlow's 'same'")
    stride = module.stride if module.stride is not None else module.kernel_size
    layer = MaxPooling2D(_pair(module.kernel_size), strides=_pair(stride), dtype=dtype)
    layer.built = True
    return layer, lambda t, grads=False: {}


@register_to_torch(MaxPooling2D)
def _max_pool2d_to(layer):
    import torch
    if layer.padding != "valid":
        raise ValueError(f"to_torch: MaxPooling2D '{layer.name}' pads 'same'; torch.nn.MaxPool2d pads both sides")
    return torch.nn.MaxPool2d(layer.pool_size, stride=layer.strides)


# ----------------------------------------------------------------------------- Keras
def _check_keras_image_options(class_name, config):
    """ValueError naming the layer for the Keras options attnx's image layers lack: channels first, and a
    convolution's dilation and groups (pair-valued options compared as pairs: JSON holds them as lists)."""
    config = {**config, "data_format": config.get("data_format") or "channels_last"}
    if class_name == "Conv2D":
        config["dilation_rate"] = _pair(config.get("dilation_rate", 1))
        check_keras_options(class_name, config, dilation_rate=(1, 1), groups=1)
    check_keras_options(class_name, config, data_format="channels_last")


@register_from_keras("Conv2D")
def _conv2d_from_keras(class_name, config, weights):
    _check_keras_image_options(class_name, config)
    layer = Conv2D(config["filters"], _pair(config["kernel_size"]), strides=_pair(config.get("strides", 1)),
                   padding=config.get("padding", "valid"), **kernel_arguments_from_keras(config),
                   **keras_layer_kwargs(config))
    return layer, weights.read


@register_to_keras(Conv2D)
def _conv2d_to_keras(layer, keras):
    return [(keras.layers.Conv2D(layer.filters, layer.kernel_size, strides=layer.strides, padding=layer.padding,
                                 **keras_kernel_arguments(keras, layer), **keras_kwargs(layer)),
             layer.get_weights())]


_POOLING = {cls.__name__: cls for cls in (MaxPooling2D, AveragePooling2D)}


@register_from_keras(*_POOLING)
def _pooling2d_from_keras(class_name, config, weights):
    _check_keras_image_options(class_name, config)
    strides = config.get("strides")  # None: the pool size, in both libraries
    layer = _POOLING[class_name](_pair(config.get("pool_size", 2)), strides=None if strides is None else _pair(strides),
                                 padding=config.get("padding", "valid"), **keras_layer_kwargs(config))
    return layer, no_weights


@register_to_keras(*_POOLING.values())
def _pooling2d_to_keras(layer, keras):
    keras_class = getattr(keras.layers, type(layer).__name__)
    return [(keras_class(layer.pool_size, strides=layer.strides, padding=layer.padding, **keras_kwargs(layer)), [])]
