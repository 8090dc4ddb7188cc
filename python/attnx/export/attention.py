"""ONNX converters of Attention (every score), AdditiveAttention, LuongAttention and
AttentionPooling, as MatMul / Softmax decompositions. HardAttention and LocalAttention are refused."""
import math

import numpy as np

from ..layers.attention import (AdditiveAttention, Attention, AttentionPooling, HardAttention, LocalAttention,
                                LuongAttention)
from .registry import converts, output_mask_of, refuse

refuse(HardAttention, "its context is the value at one chosen position (argmax or a sample), which export does not "
                      "implement; use Attention for a soft context")
refuse(LocalAttention, "its Gaussian window around a predicted position is not implemented in export; use "
                       "Attention or LuongAttention (global attention)")


def attention_scores(g, layer, query, key):
    """The scores (B, Tq, S) of an Attention-family `layer` for query (B, Tq, Dq) and key (B, S, Dk)."""
    params = layer.params
    if layer.score in ("dot", "scaled_dot", "general"):
        scale = 1.0 / math.sqrt(layer._sizes[1]) if layer.score == "scaled_dot" else 1.0
        if layer.use_scale:
            scale *= float(params["scale"][0])
        projected = g.matmul(query, params["kernel"], hint=layer.name) if layer.score == "general" else query
        scores = g.node("MatMul", [projected, g.transpose(key, 0, 2, 1)])
        return scores if scale == 1.0 else g.node("Mul", [scores, g.scalar(scale)])
    # concat / additive: v . tanh(q W_q + b + k W_k), over (B, Tq, S, U)
    pq = g.matmul(query, params["query_kernel"], params.get("bias"), f"{layer.name}/query")
    pk = g.matmul(key, params["key_kernel"], hint=f"{layer.name}/key")
    hidden = g.node("Tanh", [g.node("Add", [g.unsqueeze(pq, 2), g.unsqueeze(pk, 1)])])
    v = layer._v()[:, None]  # weight-normalized when normalize=True
    return g.squeeze(g.node("MatMul", [hidden, g.weight(v, f"{layer.name}/v")]), 3)


def _masks(g, call):
    """(query mask, value mask) of an Attention call: the [query_mask, value_mask] it was given or got."""
    mask = call.mask
    if not isinstance(mask, (list, tuple)):
        return None, None
    return tuple(None if m is None else g.as_bool(m) for m in mask[:2])


@converts(Attention, AdditiveAttention, LuongAttention)
def _attention(g, layer, call):
    query, value = call.inputs[0], call.inputs[1]
    key = call.inputs[2] if len(call.inputs) == 3 else value
    single_step = len(call.shapes[0]) == 2
    if single_step:
        query = g.unsqueeze(query, 1)
    query_mask, value_mask = _masks(g, call)
    if value_mask is not None:
        value_mask = g.unsqueeze(value_mask, 1)  # (B, S) -> (B, 1, S), over the queries
    causal = g.causal_mask(query, value) if call.option("use_causal_mask") else None
    weights = g.masked_softmax(attention_scores(g, layer, query, key), g.all_of([value_mask, causal]))
    output = g.node("MatMul", [weights, value])
    if query_mask is not None:  # Keras: padded queries get a zero context
        query_mask = g.float_of(g.reshape(query_mask, (0, -1)))
        output = g.node("Mul", [output, g.unsqueeze(query_mask, 2)])
    if isinstance(layer, LuongAttention) and layer.attentional_units:
        joined = g.concat([output, query], -1)  # h~ = tanh([c; h] W_c)
        output = g.node("Tanh", [g.matmul(joined, layer.params["attentional_kernel"], hint=layer.name)])
    outputs = [output] + ([weights] if call.option("return_attention_scores") else [])
    if single_step:
        outputs = [g.squeeze(o, 1) for o in outputs]
    return outputs if len(outputs) > 1 else outputs[0]


@output_mask_of(Attention, AdditiveAttention, LuongAttention)
def _query_mask(g, layer, call):
    return call.mask[0] if isinstance(call.mask, (list, tuple)) else None


@converts(AttentionPooling)
def _attention_pooling(g, layer, call):
    x = call.inputs
    energy = g.node("Tanh", [g.node("Add", [g.matmul(x, layer.params["kernel"], hint=layer.name),
                                           g.weight(layer.params["bias"], f"{layer.name}/bias")])])
    weights = g.masked_softmax(g.squeeze(energy, 2), None if call.mask is None else g.as_bool(call.mask))
    weighted = g.node("Mul", [x, g.unsqueeze(weights, 2)])
    output = weighted if layer.return_sequences else g.node("ReduceSum", [weighted, g.ints([1])], keepdims=0)
    return [output, weights] if call.option("return_attention_scores") else output


@output_mask_of(AttentionPooling)
def _pooled_mask(g, layer, call):
    return call.mask if layer.return_sequences else None
