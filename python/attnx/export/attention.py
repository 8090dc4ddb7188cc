"""ONNX converters of Attention (every score), AdditiveAttention, BahdanauAdditiveAttention, LuongAttention, LocalAttention
(local-m, local-p), HardAttention (argmax inference) and AttentionPooling, as MatMul / Softmax
decompositions. HardAttention with ``inference="sample"`` is refused (it draws random positions)."""
import numpy as np

from ..layers import (AdditiveAttention, Attention, AttentionPooling, BahdanauAdditiveAttention, HardAttention,
                      LocalAttention, LuongAttention)
from .registry import converts, output_mask_of, unsupported


def attention_scores(g, layer, query, key):
    """The scores (B, Tq, S) of an Attention-family `layer` for query (B, Tq, Dq) and key (B, S, Dk):
    its score's ONNX form (`attnx.layers.scores`)."""
    return layer.score_function.to_onnx(g, layer, query, key)


def _masks(g, call):
    """(query mask, value mask) of an Attention call: the [query_mask, value_mask] it was given or got."""
    mask = call.mask
    if not isinstance(mask, (list, tuple)):
        return None, None
    return tuple(None if m is None else g.as_bool(m) for m in mask[:2])


def local_window(g, positions, window, source_mask, source):
    """Luong's local window around positions p (B, Tq) (float) over the S steps of `source` (time on
    axis 1): (allowed (B, Tq, S) bool, |s - p| <= D and the source mask; gauss (B, Tq, S),
    exp(-(s - p)^2 / (2 (D / 2)^2)) inside the window, 0 outside)."""
    steps = g.cast(g.steps(source, 1), np.float32)
    distance = g.node("Sub", [steps, g.unsqueeze(positions, 2)])
    allowed = g.node("LessOrEqual", [g.node("Abs", [distance]), g.scalar(float(window))])
    if source_mask is not None:
        allowed = g.node("And", [allowed, g.unsqueeze(source_mask, 1)])
    inverse_two_variance = 2.0 / (window * window) if window > 0 else 0.0
    exponent = g.node("Mul", [g.node("Mul", [g.node("Neg", [distance]), distance]), g.scalar(inverse_two_variance)])
    return allowed, g.node("Where", [allowed, g.node("Exp", [exponent]), g.scalar(0.0)])


def source_lengths(g, source_mask, source):
    """The real steps of each row (B,) as floats: the mask's count, or S for every row."""
    if source_mask is not None:
        return g.node("ReduceSum", [g.float_of(source_mask), g.ints([1])], keepdims=0)
    return g.cast(g.node("Expand", [g.shape_dim(source, 1), g.shape_dim(source, 0)]), np.float32)


def _softmax_weights(g, scores, value_mask, causal):
    return g.masked_softmax(scores, g.all_of([None if value_mask is None else g.unsqueeze(value_mask, 1), causal]))


def _soft_attend(g, layer, call, scores, query, value, value_mask, causal):
    """(context, weights, further outputs) of a masked softmax over the scores (Attention, Additive, Luong)."""
    weights = _softmax_weights(g, scores, value_mask, causal)
    return g.node("MatMul", [weights, value]), weights, []


def _local_attend(g, layer, call, scores, query, value, value_mask, causal):
    """LocalAttention: the softmax over the window times the Gaussian, not renormalized."""
    lengths = source_lengths(g, value_mask, value)
    if layer.mode == "local-m":  # p_t = t (or the given positions), clipped to the last real position
        given = call.option("positions")
        if given is None:
            positions = g.unsqueeze(g.cast(g.steps(query, 1), np.float32), 0)
        else:
            positions = g.reshape(g.cast(given, np.float32), (0, -1))
        last = g.node("Max", [g.node("Sub", [lengths, g.scalar(1.0)]), g.scalar(0.0)])
        positions = g.node("Min", [g.node("Max", [positions, g.scalar(0.0)]), g.unsqueeze(last, 1)])
    else:  # local-p: p_t = S_b sigmoid(v_p . tanh(W_p h_t))
        hidden = g.node("Tanh", [g.matmul(query, layer.params["position_kernel"], hint=f"{layer.name}/position")])
        gate = g.node("Sigmoid", [g.squeeze(g.matmul(hidden, layer.params["position_v"],
                                                     hint=f"{layer.name}/position_v"), 2)])
        positions = g.node("Mul", [g.unsqueeze(lengths, 1), gate])
    allowed, gauss = local_window(g, positions, layer.window, value_mask, value)
    weights = g.node("Mul", [g.masked_softmax(scores, g.all_of([allowed, causal])), gauss])
    return g.node("MatMul", [weights, value]), weights, []


def _hard_attend(g, layer, call, scores, query, value, value_mask, causal):
    """HardAttention at inference: the value at the argmax of the weights (zero with nothing to attend)."""
    if layer.inference != "argmax":
        raise unsupported(layer, "inference='sample' draws random positions; export HardAttention(inference='argmax')")
    weights = _softmax_weights(g, scores, value_mask, causal)
    positions = g.node("ArgMax", [weights], axis=-1, keepdims=0)
    has_source = g.float_of(g.node("Greater", [g.node("ReduceSum", [weights, g.ints([-1])], keepdims=1),
                                               g.scalar(0.0)]))
    context = g.node("Mul", [g.node("GatherND", [value, g.unsqueeze(positions, 2)], batch_dims=1), has_source])
    return context, weights, [positions] if call.option("return_positions") else []


_ATTEND = {Attention: _soft_attend, AdditiveAttention: _soft_attend, BahdanauAdditiveAttention: _soft_attend,
           LuongAttention: _soft_attend,
           LocalAttention: _local_attend, HardAttention: _hard_attend}


@converts(*_ATTEND)
def _attention(g, layer, call):
    query, value = call.inputs[0], call.inputs[1]
    key = call.inputs[2] if len(call.inputs) == 3 else value
    single_step = len(call.shapes[0]) == 2
    if single_step:
        query = g.unsqueeze(query, 1)
    query_mask, value_mask = _masks(g, call)
    causal = g.causal_mask(query, value) if call.option("use_causal_mask") else None
    output, weights, extra = _ATTEND[type(layer)](g, layer, call, attention_scores(g, layer, query, key), query, value,
                                                  value_mask, causal)
    if query_mask is not None:  # Keras: padded queries get a zero context
        query_mask = g.float_of(g.reshape(query_mask, (0, -1)))
        output = g.node("Mul", [output, g.unsqueeze(query_mask, 2)])
    if isinstance(layer, LuongAttention) and layer.attentional_units:
        joined = g.concat([output, query], -1)  # h~ = tanh([c; h] W_c)
        output = g.node("Tanh", [g.matmul(joined, layer.params["attentional_kernel"], hint=layer.name)])
    outputs = [output] + ([weights] if call.option("return_attention_scores") else []) + extra
    if single_step:
        outputs = [g.squeeze(o, 1) for o in outputs]
    return outputs if len(outputs) > 1 else outputs[0]


@output_mask_of(*_ATTEND)
def _query_mask(g, layer, call):
    return call.mask[0] if isinstance(call.mask, (list, tuple)) else None


@converts(AttentionPooling)
def _attention_pooling(g, layer, call):
    if g.open_steps and not layer.length_agnostic:
        raise unsupported(layer, f"its per-step bias fixes T={layer.params['bias'].shape[0]} steps, which "
                                 "dynamic_steps=True would leave open; export without dynamic_steps, or use "
                                 "AttentionPooling(length_agnostic=True)")
    x = call.inputs
    energy = g.node("Tanh", [g.node("Add", [g.matmul(x, layer.params["kernel"], hint=layer.name),
                                           g.weight(layer.params["bias"], f"{layer.name}/bias")])])
    mask = call.mask if layer.use_mask else None
    weights = g.masked_softmax(g.squeeze(energy, 2), None if mask is None else g.as_bool(mask))
    weighted = g.node("Mul", [x, g.unsqueeze(weights, 2)])
    output = weighted if layer.return_sequences else g.node("ReduceSum", [weighted, g.ints([1])], keepdims=0)
    return [output, weights] if call.option("return_attention_scores") else output


@output_mask_of(AttentionPooling)
def _pooled_mask(g, layer, call):
    return call.mask if layer.return_sequences and layer.use_mask else None
