"""ONNX converters of the transformer layers: LayerNormalization (ONNX's own operator),
PositionalEncoding (the sinusoids computed in the graph for any length, in double precision as
attnx's table), PositionEmbedding, FeedForward, MultiHeadAttention (MatMul / Softmax per head), and
the encoder and decoder layers and stacks (post- or pre-norm)."""
import functools
import math

import numpy as np

from ..layers import (FeedForward, LayerNormalization, MultiHeadAttention, PositionalEncoding, PositionEmbedding,
                      TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)
from .core import dense
from .registry import converts, output_mask_of, unsupported



def layer_norm(g, layer, x):
    features = layer.features
    gamma = layer.params.get("gamma", np.ones(features, np.float32))
    inputs = [x, g.weight(gamma, f"{layer.name}/gamma")]
    if "beta" in layer.params:
        inputs.append(g.weight(layer.params["beta"], f"{layer.name}/beta"))
    return g.node("LayerNormalization", inputs, axis=-1, epsilon=layer.epsilon)


@converts(LayerNormalization)
def _layer_norm(g, layer, call):
    if layer.rms_scaling or layer.axis not in (-1, [-1]):
        raise unsupported(layer, "rms_scaling and axes other than -1 have no ONNX export yet")
    return layer_norm(g, layer, call.inputs)


@converts(PositionalEncoding)
def _positional_encoding(g, layer, call):
    x, (_, _, D) = call.inputs, call.shapes
    # table[t, d] = sin or cos(t / max_wavelength^((d - d % 2) / D)), in double as attnx's table
    d = np.arange(D)
    wavelengths = g.weight(np.power(layer.max_wavelength, (d - d % 2) / D), f"{layer.name}/wavelengths")
    positions = g.unsqueeze(g.cast(g.steps(x, 1), np.float64), 1)
    angles = g.node("Div", [positions, wavelengths])
    table = g.node("Where", [g.weight(d % 2 == 0, f"{layer.name}/even"), g.node("Sin", [angles]),
                             g.node("Cos", [angles])])
    return g.node("Add", [x, g.cast(table, np.float32)])


@converts(PositionEmbedding)
def _position_embedding(g, layer, call):
    x = call.inputs
    table = g.node("Slice", [g.weight(layer.params["embeddings"], f"{layer.name}/embeddings"), g.ints([0]),
                             g.shape_dim(x, 1), g.ints([0])])
    return g.node("Add", [x, table])


def feed_forward(g, layer, x):
    return dense(g, layer.output_dense, dense(g, layer.intermediate_dense, x))


@converts(FeedForward)
def _feed_forward(g, layer, call):
    return feed_forward(g, layer, call.inputs)


def attention_allowed(g, query, key, attention_mask=None, padding_mask=None, causal=False):
    """The bool mask over (B, heads, Tq, S) (broadcast) that multi-head attention may attend where
    True, or None: attention_mask (B, Tq, S) or (Tq, S), AND padding_mask (B, S), AND causal."""
    masks = [None if attention_mask is None else g.as_bool(attention_mask),
             None if padding_mask is None else g.unsqueeze(g.as_bool(padding_mask), 1),
             g.causal_mask(query, key) if causal else None]
    allowed = g.all_of(masks)
    return None if allowed is None else g.node("Unsqueeze", [allowed, g.ints([-3])])  # the heads axis


def _heads(g, x, heads, size, perm):
    """(B, T, heads * size) -> the heads as (B, heads, T, size) (perm (0, 2, 1, 3)) or (B, heads, size, T)."""
    return g.transpose(g.reshape(x, (0, 0, heads, size)), *perm)


def multi_head_attention(g, layer, query, value, key=None, allowed=None, want_weights=False):
    """(output (B, T, out), weights (B, heads, T, S) or None) of MultiHeadAttention `layer`."""
    H, dk, dv = layer.num_heads, layer.key_dim, layer.value_dim
    params = layer.params

    def project(name, x):
        kernel = params[f"{name}_kernel"]
        bias = params.get(f"{name}_bias")
        return g.matmul(x, kernel.reshape(kernel.shape[0], -1), None if bias is None else bias.reshape(-1),
                        f"{layer.name}/{name}")

    q = _heads(g, project("query", query), H, dk, (0, 2, 1, 3))
    k = _heads(g, project("key", value if key is None else key), H, dk, (0, 2, 3, 1))
    v = _heads(g, project("value", value), H, dv, (0, 2, 1, 3))
    scores = g.node("Mul", [g.node("MatMul", [q, k]), g.scalar(1.0 / math.sqrt(dk))])
    weights = g.masked_softmax(scores, allowed)
    context = g.reshape(g.transpose(g.node("MatMul", [weights, v]), 0, 2, 1, 3), (0, 0, H * dv))
    if layer.use_gate:  # Keras 3.15: each head's context times sigmoid(query W^G + b^G)
        context = g.node("Mul", [context, g.node("Sigmoid", [project("gate", query)])])
    kernel = params["output_kernel"]
    if kernel.ndim != 3:
        raise unsupported(layer, f"output_shape {layer.output_shape} (several output axes) has no ONNX export yet")
    output = g.matmul(context, kernel.reshape(-1, kernel.shape[-1]), params.get("output_bias"), f"{layer.name}/output")
    return output, (weights if want_weights else None)


@converts(MultiHeadAttention)
def _multi_head_attention(g, layer, call):
    if isinstance(call.inputs, (list, tuple)):
        query, value, key = (list(call.inputs) + [None])[:3]
    else:
        query, value, key = (call.inputs, *call.args, None)[:3]
    query_shape = call.shapes[0] if isinstance(call.inputs, (list, tuple)) else call.shapes
    if len(query_shape) != 3:
        raise unsupported(layer, f"inputs of rank {len(query_shape)} (attention_axes={layer.attention_axes}) have no "
                                 "ONNX export yet; rank-3 inputs (batch, T, features) export")
    # the query / value / key masks: given to the call, else those its inputs carry (Keras)
    carried = (list(call.mask) if isinstance(call.mask, (list, tuple)) else [call.mask]) + [None] * 3
    query_mask, value_mask, key_mask = (call.option(name) if call.option(name) is not None else carried[i]
                                        for i, name in enumerate(("query_mask", "value_mask", "key_mask")))
    padding = g.all_of([None if m is None else g.as_bool(m)
                        for m in (call.option("key_padding_mask"), value_mask, key_mask)])
    allowed = attention_allowed(g, query, value, call.option("attention_mask"), padding,
                                call.option("use_causal_mask", False))
    if query_mask is not None:  # a padded query attends to nothing: (B, 1, Tq, 1)
        rows = g.unsqueeze(g.unsqueeze(g.as_bool(query_mask), 2), 1)
        allowed = rows if allowed is None else g.all_of([allowed, rows])
    want_weights = bool(call.option("return_attention_scores"))
    output, weights = multi_head_attention(g, layer, query, value, key, allowed, want_weights)
    return [output, weights] if want_weights else output


@output_mask_of(MultiHeadAttention)
def _multi_head_attention_mask(g, layer, call):
    return call.mask[0] if isinstance(call.mask, (list, tuple)) else call.mask  # the query's


def _residual(g, layer, x, norm, sublayer):
    """Post-norm ``norm(x + sublayer(x))`` or pre-norm ``x + sublayer(norm(x))``; returns (y, weights)."""
    inner, weights = sublayer(layer_norm(g, norm, x) if layer.norm_first else x)
    y = g.node("Add", [x, inner])
    return (y if layer.norm_first else layer_norm(g, norm, y)), weights


def _layer_blocks(g, layer, x, sublayers):
    """An encoder or decoder layer as its public description says (`residual_blocks()`, in order):
    returns (y, {kind: attention weights or None}); `sublayers` maps each kind to
    ``fn(sublayer, h) -> (output, weights)``."""
    weights = {}
    for kind, norm, sublayer in layer.residual_blocks():
        x, weights[kind] = _residual(g, layer, x, norm, functools.partial(sublayers[kind], sublayer))
    return x, weights


def _feed_forward_block(g):
    return lambda layer, h: (feed_forward(g, layer, h), None)


def encoder_layer(g, layer, x, padding_mask=None, attention_mask=None, causal=False, want_weights=False):
    """(y, self-attention weights or None) of TransformerEncoderLayer `layer` on x (B, T, D)."""
    allowed = attention_allowed(g, x, x, attention_mask, padding_mask, causal)
    y, weights = _layer_blocks(g, layer, x, {
        "self_attention": lambda att, h: multi_head_attention(g, att, h, h, None, allowed, want_weights),
        "feed_forward": _feed_forward_block(g)})
    return y, weights["self_attention"]


def decoder_layer(g, layer, x, memory, masks, want_weights=False):
    """(y, self weights, cross weights) of TransformerDecoderLayer `layer`; `masks` holds the
    decoder call's mask arguments."""
    self_allowed = attention_allowed(g, x, x, masks["decoder_attention_mask"], masks["decoder_padding_mask"],
                                     masks["use_causal_mask"])
    cross_allowed = attention_allowed(g, x, memory, masks["encoder_attention_mask"], masks["encoder_padding_mask"])
    y, weights = _layer_blocks(g, layer, x, {
        "self_attention": lambda att, h: multi_head_attention(g, att, h, h, None, self_allowed, want_weights),
        "cross_attention": lambda att, h: multi_head_attention(g, att, h, memory, None, cross_allowed, want_weights),
        "feed_forward": _feed_forward_block(g)})
    return y, weights["self_attention"], weights["cross_attention"]


def _encoder_arguments(call):
    padding_mask = call.option("padding_mask")
    return {"padding_mask": call.mask if padding_mask is None else padding_mask,
            "attention_mask": call.option("attention_mask"), "causal": call.option("use_causal_mask", False),
            "want_weights": bool(call.option("return_attention_scores"))}


@converts(TransformerEncoderLayer)
def _encoder_layer(g, layer, call):
    y, weights = encoder_layer(g, layer, call.inputs, **_encoder_arguments(call))
    return [y, weights] if weights is not None else y


@converts(TransformerEncoder)
def _encoder(g, layer, call):
    arguments = _encoder_arguments(call)
    y, all_weights = call.inputs, []
    for block in layer.blocks:
        y, weights = encoder_layer(g, block, y, **arguments)
        all_weights.append(weights)
    return [y] + all_weights if arguments["want_weights"] else y


def _decoder_masks(call):
    masks = {name: call.option(name) for name in ("decoder_padding_mask", "decoder_attention_mask",
                                                  "encoder_padding_mask", "encoder_attention_mask")}
    if isinstance(call.mask, (list, tuple)):  # masks propagated from upstream layers
        masks["decoder_padding_mask"] = masks["decoder_padding_mask"] or call.mask[0]
        masks["encoder_padding_mask"] = masks["encoder_padding_mask"] or call.mask[1]
    masks["use_causal_mask"] = call.option("use_causal_mask", True)
    return masks


@converts(TransformerDecoderLayer)
def _decoder_layer(g, layer, call):
    want_weights = bool(call.option("return_attention_scores"))
    y, self_weights, cross_weights = decoder_layer(g, layer, call.inputs[0], call.inputs[1], _decoder_masks(call),
                                                   want_weights)
    return [y, self_weights, cross_weights] if want_weights else y


@converts(TransformerDecoder)
def _decoder(g, layer, call):
    want_weights = bool(call.option("return_attention_scores"))
    masks = _decoder_masks(call)
    y, memory = call.inputs
    self_weights, cross_weights = [], []
    for block in layer.blocks:
        y, w_self, w_cross = decoder_layer(g, block, y, memory, masks, want_weights)
        self_weights.append(w_self)
        cross_weights.append(w_cross)
    return [y] + self_weights + cross_weights if want_weights else y


@output_mask_of(TransformerDecoderLayer, TransformerDecoder)
def _target_mask(g, layer, call):
    return call.mask[0] if isinstance(call.mask, (list, tuple)) else None
