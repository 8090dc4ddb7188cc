"""ONNX converters of the layers a Keras user meets in the first week (issue 41): BatchNormalization (its
inference form: the moving statistics), Conv1D, GlobalMaxPooling1D, GlobalAveragePooling2D, Permute, Dot and
TimeDistributed (the wrapped layer's own converter on the steps folded into the batch). Lambda runs Python
and has no ONNX form (the registry's error says so).
"""
import numpy as np

from ..layers.conv1d import Conv1D
from ..layers.normalization import BatchNormalization
from ..layers.pooling import GlobalAveragePooling2D, GlobalMaxPooling1D
from ..layers.shape import Dot, Permute
from ..layers.time_distributed import TimeDistributed
from .conv import same_pads
from .registry import Call, convert, converts, output_mask_of, unsupported


@converts(BatchNormalization)
def _batch_normalization(g, layer, call):
    # inference: gamma (x - moving_mean) / sqrt(moving_variance + epsilon) + beta, folded into x * a + b
    ndim = len(call.shapes)
    axis = layer.axis % ndim
    shape = [1] * ndim
    shape[axis] = -1
    p = layer.params
    scale = 1.0 / np.sqrt(p["moving_variance"].astype(np.float64) + layer.epsilon)
    if layer.scale:
        scale = scale * p["gamma"]
    shift = -p["moving_mean"] * scale + (p["beta"] if layer.center else 0.0)
    a = g.weight(np.reshape(scale, shape[1:]).astype(layer.dtype), f"{layer.name}/scale")
    b = g.weight(np.reshape(shift, shape[1:]).astype(layer.dtype), f"{layer.name}/shift")
    return g.node("Add", [g.node("Mul", [call.inputs, a]), b])


@converts(Conv1D)
def _conv1d(g, layer, call):
    x = call.inputs
    if call.mask is not None:  # attnx: masked steps read as zeros
        x = g.node("Mul", [x, g.unsqueeze(g.float_of(call.mask), 2)])
    span = (layer.kernel_size - 1) * layer.dilation_rate + 1
    if layer.padding == "valid":
        pads = [0, 0]
    elif layer.padding == "causal":
        pads = [span - 1, 0]
    elif layer.strides == 1:
        pads = [(span - 1) // 2, span - 1 - (span - 1) // 2]
    elif call.shapes[1] is not None and not g.open_steps:
        pads = list(same_pads(call.shapes[1], span, layer.strides))
    else:
        raise unsupported(layer, "padding='same' with strides > 1 needs the number of steps fixed by the model's "
                                 "Input")
    kernel = layer.params["kernel"].transpose(2, 1, 0)  # Keras' (K, C / groups, F) -> ONNX's (F, C / groups, K)
    inputs = [g.transpose(x, 0, 2, 1), g.weight(np.ascontiguousarray(kernel), f"{layer.name}/kernel")]
    if layer.use_bias:
        inputs.append(g.weight(layer.params["bias"], f"{layer.name}/bias"))
    y = g.node("Conv", inputs, kernel_shape=[layer.kernel_size], strides=[layer.strides],
               dilations=[layer.dilation_rate], pads=pads, group=layer.groups)
    return g.activation(g.transpose(y, 0, 2, 1), layer.activation)


@output_mask_of(Conv1D, GlobalMaxPooling1D, GlobalAveragePooling2D)
def _no_mask(g, layer, call):
    return None


@converts(GlobalMaxPooling1D)
def _global_max_pooling1d(g, layer, call):
    x = call.inputs
    if layer.data_format == "channels_first":
        x = g.transpose(x, 0, 2, 1)
    if call.mask is None:
        pooled = g.node("ReduceMax", [x, g.ints([1])], keepdims=0)
    else:  # masked steps never win; a fully masked row pools to zeros
        real = g.as_bool(call.mask)
        lowest = g.scalar(np.finfo(np.float32).min, layer.dtype)
        best = g.node("ReduceMax", [g.node("Where", [g.unsqueeze(real, 2), x, lowest]), g.ints([1])], keepdims=0)
        any_real = g.node("ReduceMax", [g.float_of(real), g.ints([1])], keepdims=1)
        pooled = g.node("Mul", [best, g.cast(any_real, layer.dtype)])
    if layer.keepdims:
        pooled = g.unsqueeze(pooled, 2 if layer.data_format == "channels_first" else 1)
    return pooled


@converts(GlobalAveragePooling2D)
def _global_average_pooling2d(g, layer, call):
    axes = [2, 3] if layer.data_format == "channels_first" else [1, 2]
    return g.node("ReduceMean", [call.inputs, g.ints(axes)], keepdims=int(layer.keepdims))


@converts(Permute)
def _permute(g, layer, call):
    return g.transpose(call.inputs, 0, *layer.dims)


@converts(Dot)
def _dot(g, layer, call):
    (x1, x2), (s1, s2) = call.inputs, call.shapes
    pair = layer.axes if isinstance(layer.axes, list) else [layer.axes, layer.axes]
    a1, a2 = pair[0] % len(s1), pair[1] % len(s2)  # checked by the layer when the model was built
    if len(s1) > 3 or len(s2) > 3:
        raise unsupported(layer, "inputs of rank > 3 have no ONNX export yet")
    if layer.normalize:  # x / max(|x|, epsilon) along the contracted axis (Dot's epsilon, 1e-7)
        x1, x2 = (g.node("Div", [x, g.node("Max", [g.node("ReduceL2", [x, g.ints([a])], keepdims=1),
                                                    g.scalar(1e-7)])]) for x, a in ((x1, a1), (x2, a2)))
    left = x1 if a1 == len(s1) - 1 else g.transpose(x1, *[a for a in range(len(s1)) if a != a1], a1)
    right = x2 if a2 == 1 else g.transpose(x2, 0, a2, *[a for a in range(1, len(s2)) if a != a2])
    if len(s1) == 2:
        left = g.unsqueeze(left, 1)
    if len(s2) == 2:
        right = g.unsqueeze(right, 2)
    y = g.node("MatMul", [left, right])  # (B, rest1 or 1, rest2 or 1)
    if len(s1) == 2 and len(s2) == 2:
        return g.squeeze(y, 2)  # (B, 1)
    if len(s1) == 2:
        return g.squeeze(y, 1)
    if len(s2) == 2:
        return g.squeeze(y, 2)
    return y


@converts(TimeDistributed)
def _time_distributed(g, layer, call):
    x, shape = call.inputs, call.shapes
    if any(d is None for d in shape[2:]):
        raise unsupported(layer, f"the step shape {shape[2:]} must be known")
    steps = g.reshape(x, [-1, *shape[2:]])  # (batch * T, ...)
    inner = convert(g, layer.layer, Call(steps, (None, *shape[2:]), (), {}))
    if isinstance(inner, (list, tuple)):
        raise unsupported(layer, f"the wrapped {type(layer.layer).__name__} has several outputs")
    batch_and_steps = g.node("Shape", [x], start=0, end=2)
    return g.node("Reshape", [inner, g.concat([batch_and_steps, g.node("Shape", [inner], start=1)], axis=0)])


@output_mask_of(TimeDistributed)
def _time_distributed_mask(g, layer, call):
    return call.mask
