"""ONNX converters of the image layers: Conv2D, MaxPooling2D, AveragePooling2D.

attnx is channels last (NHWC), ONNX's Conv and pooling operators channels first (NCHW), so each
converter transposes in and out. 'same' pads as TensorFlow does (the odd pixel at the bottom / right;
average pooling divides by the real pixels only). The pads are explicit: ONNX's auto_pad is deprecated,
and explicit pads say exactly where the odd pixel goes. They are constants when the model's Input fixes
the image size, else computed in the graph from the input's shape and applied by a Pad node.
"""
import numpy as np

from ..layers.conv import AveragePooling2D, Conv2D, MaxPooling2D
from .registry import converts

NO_PADS = [0, 0, 0, 0]


def same_pads(size, window, stride):
    """TensorFlow's 'same' padding of one axis of `size` pixels: (before, after), the odd pixel after."""
    total = max((-(-size // stride) - 1) * stride + window - size, 0)
    return total // 2, total - total // 2


def _pads(g, layer, call, x):
    """`layer`'s pads over NCHW image `x`: when known at export ('valid', or a size the model fixes) the
    operators' `pads` attribute [top, left, bottom, right], else the (8,) int64 `pads` input of a Pad node
    (N, C, top, left, then the ends), computed in the graph."""
    if layer.padding == "valid":
        return NO_PADS
    window, strides = layer.window_shape, layer.strides
    rows, cols = call.shapes[1:3]
    if g.open_steps:  # to_onnx(dynamic_steps=True) leaves the rows axis of the model's input open
        rows = None
    if rows is not None and cols is not None:
        (top, bottom), (left, right) = (same_pads(n, k, s) for n, k, s in zip((rows, cols), window, strides))
        return [top, left, bottom, right]
    # the same arithmetic on tensors: out = ceil(n / s), total = max((out - 1) s + k - n, 0)
    sizes, k, s = g.node("Shape", [x], start=2, end=4), g.ints(window), g.ints(strides)
    out = g.node("Div", [g.node("Add", [sizes, g.node("Sub", [s, g.ints([1])])]), s])
    span = g.node("Add", [g.node("Mul", [g.node("Sub", [out, g.ints([1])]), s]), k])
    total = g.node("Max", [g.node("Sub", [span, sizes]), g.ints([0])])
    before, batch_and_channels = g.node("Div", [total, g.ints([2])]), g.ints([0, 0])
    # Pad's order over all four axes, not its `axes` input: ONNX Runtime's transpose optimizer (1.32)
    # moves the Transpose before a Pad past it without remapping `axes`, and fails
    return g.node("Concat", [batch_and_channels, before, batch_and_channels, g.node("Sub", [total, before])], axis=0)


def _padded(g, x, pads, fill):
    """(x, the operator's `pads` attribute): pads computed in the graph are applied to x by a Pad node
    filled with `fill` (operators take pads as an attribute only)."""
    if isinstance(pads, list):
        return x, pads
    return g.node("Pad", [x, pads, g.scalar(fill)], mode="constant"), NO_PADS


def _nchw(g, x):
    return g.transpose(x, 0, 3, 1, 2)


def _nhwc(g, x):
    return g.transpose(x, 0, 2, 3, 1)


def _window_attributes(layer):
    return {"kernel_shape": list(layer.window_shape), "strides": list(layer.strides)}


@converts(Conv2D)
def _conv2d(g, layer, call):
    x = _nchw(g, call.inputs)
    x, pads = _padded(g, x, _pads(g, layer, call, x), 0.0)
    kernel = layer.params["kernel"].transpose(3, 2, 0, 1)  # Keras' (KH, KW, C, F) -> ONNX's (F, C, KH, KW)
    inputs = [x, g.weight(kernel, f"{layer.name}/kernel")]
    if layer.use_bias:
        inputs.append(g.weight(layer.params["bias"], f"{layer.name}/bias"))
    y = g.node("Conv", inputs, pads=pads, **_window_attributes(layer))
    return g.activation(_nhwc(g, y), layer.activation)  # channels last again: softmax runs over the channels


@converts(MaxPooling2D)
def _max_pooling2d(g, layer, call):
    x = _nchw(g, call.inputs)
    # -inf padding never wins a max, and every 'same' window holds a real pixel
    x, pads = _padded(g, x, _pads(g, layer, call, x), -np.inf)
    return _nhwc(g, g.node("MaxPool", [x], pads=pads, **_window_attributes(layer)))


@converts(AveragePooling2D)
def _average_pooling2d(g, layer, call):
    x = _nchw(g, call.inputs)
    pads = _pads(g, layer, call, x)
    if isinstance(pads, list):
        return _nhwc(g, g.node("AveragePool", [x], pads=pads, count_include_pad=0, **_window_attributes(layer)))
    # pads known only in the graph: a Pad node's zeros would be counted, so divide the zero-padded
    # windows' mean by the share of real pixels in each window (the same pooling of a padded image of ones)
    ones = g.node("Expand", [g.scalar(1.0), g.node("Concat", [g.ints([1, 1]), g.node("Shape", [x], start=2)],
                                                     axis=0)])
    means = [g.node("AveragePool", [_padded(g, t, pads, 0.0)[0]], count_include_pad=1, **_window_attributes(layer))
             for t in (x, ones)]
    return _nhwc(g, g.node("Div", means))
