"""ONNX converters of the core layers: Dense, Embedding, Activation, Dropout, Flatten, Reshape,
Concatenate, Add, GlobalAveragePooling1D."""
import numpy as np

from ..layers.core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D,
                           Reshape)
from .registry import converts, output_mask_of, unsupported


def dense(g, layer, x):
    """`layer` (a Dense) on tensor x (..., in)."""
    return g.activation(g.matmul(x, layer.params["kernel"], layer.params.get("bias"), layer.name), layer.activation)


@converts(Dense)
def _dense(g, layer, call):
    return dense(g, layer, call.inputs)


@converts(Embedding)
def _embedding(g, layer, call):
    ids = g.cast(call.inputs, np.int64)  # whatever integer (or integral float) type came
    return g.node("Gather", [g.weight(layer.params["embeddings"], f"{layer.name}/embeddings"), ids], axis=0)


@output_mask_of(Embedding)
def _embedding_mask(g, layer, call):
    if not layer.mask_zero:
        return None
    ids = g.cast(call.inputs, np.int64)
    return g.node("Not", [g.node("Equal", [ids, g.weight(np.asarray(0, np.int64), "zero")])])


@converts(Activation)
def _activation(g, layer, call):
    return g.activation(call.inputs, layer.activation)


@converts(Dropout)
def _dropout(g, layer, call):
    return call.inputs  # inference: the identity


@converts(Flatten)
def _flatten(g, layer, call):
    return g.node("Flatten", [call.inputs], axis=1)


@converts(Reshape)
def _reshape(g, layer, call):
    return g.reshape(call.inputs, (0,) + layer.target_shape)


@converts(Concatenate)
def _concatenate(g, layer, call):
    return g.node("Concat", list(call.inputs), axis=layer.axis)


@converts(Add)
def _add(g, layer, call):
    return g.node("Sum", list(call.inputs))


@output_mask_of(Concatenate, Add)
def _merged_mask(g, layer, call):
    masks = call.mask if isinstance(call.mask, (list, tuple)) else []
    return g.all_of(masks)


@converts(GlobalAveragePooling1D)
def _global_average_pooling(g, layer, call):
    if layer.data_format != "channels_last" or layer.keepdims:
        raise unsupported(layer, "data_format='channels_first' and keepdims=True have no ONNX export yet")
    x = call.inputs
    if call.mask is None:
        return g.node("ReduceMean", [x, g.ints([1])], keepdims=0)
    m = g.float_of(call.mask)
    count = g.node("Max", [g.node("ReduceSum", [m, g.ints([1])], keepdims=1), g.scalar(1.0)])
    weights = g.node("Div", [m, count])  # a fully masked row pools to zeros
    return g.node("ReduceSum", [g.node("Mul", [x, g.unsqueeze(weights, 2)]), g.ints([1])], keepdims=0)


@output_mask_of(GlobalAveragePooling1D)
def _no_mask(g, layer, call):
    return None
