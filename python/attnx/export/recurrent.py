"""ONNX converters of SimpleRNN, GRU, LSTM (stacked with `num_layers`) and Bidirectional, on the
ONNX RNN, GRU and LSTM operators.

Weights: attnx keeps Keras' ``kernel (C, G * H)`` with gate blocks (i, f, g, o) for LSTM and
(r, z, n) for GRU; ONNX wants ``W (G * H, C)`` with gates (i, o, f, c) and (z, r, h), and the
recurrent bias apart (GRU ``reset_after`` is ONNX's ``linear_before_reset=1``).

Masks: attnx lets a padded step (anywhere in the row: pre-, post-padding or holes) carry the state
and output zeros, and the backward direction read the real steps in reverse. The ONNX operators
only know ``sequence_lens`` (real steps first). Both agree once each row's real steps are moved
to its front in order: the converter sorts them there (TopK on a key that puts real steps first),
runs the operators with the rows' lengths, and moves the outputs back to the original positions
(the padded ones get the operators' zeros past the length).
"""
import numpy as np

from ..layers.recurrent import (GRU, LSTM, Bidirectional, GRUCell, LSTMCell, SimpleRNN, SimpleRNNCell,
                                level_suffix)
from .registry import converts, output_mask_of

OPERATORS = {"simple": "RNN", "gru": "GRU", "lstm": "LSTM"}
_ONNX_GATE_ORDER = {"simple": [0], "gru": [1, 0, 2], "lstm": [0, 3, 1, 2]}  # attnx's gate blocks in ONNX's order
_ONNX_ACTIVATIONS = {"tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu", "linear": "Affine"}


def _onnx_gates(cell, units, w):
    """w (..., G * units) with its gate blocks in ONNX's order."""
    return np.concatenate([w[..., k * units:(k + 1) * units] for k in _ONNX_GATE_ORDER[cell]], axis=-1)


def cell_weights(cell, units, kernel, recurrent_kernel, bias):
    """ONNX's (W (G * H, C), R (G * H, H), B (2 * G * H,)) of one direction from attnx's kernel
    (C, G * H), recurrent kernel (H, G * H) and bias ((G * H,), (2, G * H) for GRU reset_after, or None)."""
    W = _onnx_gates(cell, units, kernel).T
    R = _onnx_gates(cell, units, recurrent_kernel).T
    zeros = np.zeros(W.shape[0], dtype=W.dtype)
    if bias is None:
        input_bias, recurrent_bias = zeros, zeros
    elif bias.ndim == 2:  # GRU reset_after: [input bias, recurrent bias]
        input_bias, recurrent_bias = _onnx_gates(cell, units, bias[0]), _onnx_gates(cell, units, bias[1])
    else:
        input_bias, recurrent_bias = _onnx_gates(cell, units, bias), zeros
    return W, R, np.concatenate([input_bias, recurrent_bias])


def _level_weights(layer, level):
    sfx = level_suffix(level)
    return cell_weights(layer.cell_kind, layer.units, layer.params["kernel" + sfx],
                        layer.params["recurrent_kernel" + sfx], layer.params.get("bias" + sfx))


def _activations(layer):
    """The ONNX activation list of one direction, LSTM (f, g, h), GRU (f, g), RNN (f), and the
    alphas and betas that list consumes (ONNX Runtime reads them only for the activations that
    take them: Affine, attnx's "linear", is 1 * x + 0)."""
    names = {"simple": [layer.activation], "gru": [layer.recurrent_activation, layer.activation],
             "lstm": [layer.recurrent_activation, layer.activation, layer.activation]}[layer.cell_kind]
    affine = names.count("linear")
    return [_ONNX_ACTIVATIONS[n] for n in names], [1.0] * affine, [0.0] * affine


def _operator_attributes(directions):
    """The ONNX operator's attributes for the layers (or cells) of its directions, in order."""
    layer = directions[0]
    activations, alphas, betas = (sum(parts, []) for parts in zip(*(_activations(l) for l in directions)))
    attributes = {"hidden_size": layer.units, "activations": activations}
    if alphas:
        attributes.update(activation_alpha=alphas, activation_beta=betas)
    if layer.cell_kind == "gru":
        attributes["linear_before_reset"] = int(layer.reset_after)
    return attributes


def one_step(g, cell, weights, x, states, hint, **attributes):
    """One step of the ONNX operator of `cell` ("simple", "gru", "lstm") with `weights` (W, R, B) of
    `cell_weights`, on x (B, C) from states [h(, c)] (each (B, H); None: zeros). Returns [h(, c)]."""
    W, R, B = (g.weight(w[None], f"{hint}/{part}") for w, part in zip(weights, "WRB"))
    starts = [g.unsqueeze(s, 0) for s in states or []]
    outputs = g.node(OPERATORS[cell], [g.unsqueeze(x, 0), W, R, B, ""] + starts, outputs=3 if cell == "lstm" else 2,
                     **attributes)
    return [g.squeeze(s, 0) for s in outputs[1:]]


def step_mask(g, call):
    """The (B, T) bool step mask of a recurrent call: its `lengths` argument, else the mask reaching it."""
    lengths = call.option("lengths")
    x = call.inputs[0] if isinstance(call.inputs, (list, tuple)) else call.inputs
    if lengths is not None:
        steps = g.unsqueeze(g.steps(x, 1), 0)
        return g.node("Less", [steps, g.unsqueeze(g.cast(lengths, np.int64), 1)])
    mask = call.mask
    return mask[0] if isinstance(mask, (list, tuple)) else mask


def _compaction(g, mask):
    """(order, inverse, lengths) of a (B, T) step mask: gathering steps by `order` puts each row's
    real steps first (in order), gathering by `inverse` puts them back; lengths (B,) int32."""
    steps = g.cast(g.steps(mask, 1), np.float32)  # float keys: TopK sorts floats on every runtime
    T = g.cast(g.shape_dim(mask, 1), np.float32)
    key = g.node("Where", [mask, steps, g.node("Add", [steps, T])])
    k = g.shape_dim(mask, 1)
    _, order = g.node("TopK", [key, k], outputs=2, largest=0, sorted=1)
    _, inverse = g.node("TopK", [g.cast(order, np.float32), k], outputs=2, largest=0, sorted=1)
    lengths = g.node("ReduceSum", [g.cast(mask, np.int32), g.ints([1])], keepdims=0)
    return order, inverse, lengths


def _gather_steps(g, x, order):
    """x (B, T, C) with its steps reordered per row by `order` (B, T)."""
    return g.node("GatherND", [x, g.unsqueeze(order, 2)], batch_dims=1)


def reverse_steps(g, x):
    """x (B, T, ...) with the time axis reversed."""
    return g.node("Slice", [x, g.ints([-1]), g.ints([np.iinfo(np.int64).min]), g.ints([1]), g.ints([-1])])


def _level_state(g, layer, state, level):
    """A given initial state (B, H), or (L, B, H) for a stack, at level `level` as (1, B, H)."""
    if layer.num_layers > 1:
        state = g.node("Gather", [state, g.weight(np.asarray(level, np.int64), "level")], axis=0)
    return g.unsqueeze(state, 0)


def run_stack(g, directions, x, mask, initial_states=None, need_sequences=True):
    """The levels of one recurrent layer, or of the two directions of a Bidirectional, on x (B, T, C).

    Args:
        directions: [(layer, reverse)], one entry or two (forward, backward).
        mask: (B, T) bool step mask or None.
        initial_states: per direction the [h(, c)] tensors ((B, H), or (L, B, H) for a stack), or None.
        need_sequences: whether the top level's sequences are wanted.
    Returns:
        (per direction the top level's outputs (B, T, H), or None; per direction the final
        (hs, cs) lists over the levels, each (B, H); cs empty without a cell state).
    """
    layer = directions[0][0]
    n_states = len(layer.state_size)
    inverse = lengths = None
    if mask is not None:
        order, inverse, lengths = _compaction(g, mask)
        x = _gather_steps(g, x, order)
    seq = g.transpose(x, 1, 0, 2)  # ONNX's (T, B, C)
    D = len(directions)
    direction = "bidirectional" if D == 2 else ("reverse" if directions[0][1] else "forward")
    attributes = {"direction": direction, **_operator_attributes([l for l, _ in directions])}
    finals = [([], []) for _ in directions]
    for level in range(layer.num_layers):
        weights = [_level_weights(l, level) for l, _ in directions]
        W, R, B = (g.weight(np.stack([w[i] for w in weights]), f"{layer.name}/{part}{level_suffix(level)}")
                   for i, part in enumerate("WRB"))
        starts = [] if initial_states is None else [  # (D, B, H) each
            g.concat([_level_state(g, l, states[i], level) for (l, _), states in zip(directions, initial_states)], 0)
            for i in range(n_states)]
        outputs = g.node(OPERATORS[layer.cell_kind], [seq, W, R, B, lengths or ""] + starts, outputs=1 + n_states,
                         **attributes)
        Y, final = outputs[0], outputs[1:]
        if initial_states is not None and lengths is not None:  # a row of length 0 keeps its initial state
            has_steps = g.node("Greater", [g.unsqueeze(lengths, 0, 2), g.weight(np.asarray(0, np.int32), "zero")])
            final = [g.node("Where", [has_steps, f, s]) for f, s in zip(final, starts)]
        for d, (hs, cs) in enumerate(finals):
            index = g.weight(np.asarray(d, np.int64), "direction")
            hs.append(g.node("Gather", [final[0], index], axis=0))
            if n_states == 2:
                cs.append(g.node("Gather", [final[1], index], axis=0))
        seq = g.reshape(g.transpose(Y, 0, 2, 1, 3), (0, 0, -1))  # (T, B, D * H): the next level's input
    if not need_sequences:
        return None, finals
    tops = []
    for d in range(D):
        y = g.transpose(g.node("Gather", [Y, g.weight(np.asarray(d, np.int64), "direction")], axis=1), 1, 0, 2)
        tops.append(y if inverse is None else _gather_steps(g, y, inverse))
    return tops, finals


def final_states(g, layer, hs, cs):
    """The states a call returns, [h(, c)], each (B, H) or (L, B, H) for a stack."""
    def stacked(per_level):
        return per_level[0] if len(per_level) == 1 else g.concat([g.unsqueeze(s, 0) for s in per_level], 0)
    return [stacked(hs)] + ([stacked(cs)] if cs else [])


def _inputs_and_states(call, keyword="initial_state"):
    """(x, list of initial state tensors or None) from ``[x, *states]``, the argument `keyword`, or
    (cells) the positional argument after x."""
    if isinstance(call.inputs, (list, tuple)):
        return call.inputs[0], list(call.inputs[1:])
    states = call.option(keyword, call.args[0] if call.args else None)
    if states is None:
        return call.inputs, None
    return call.inputs, list(states) if isinstance(states, (list, tuple)) else [states]


def _carry_outputs(g, out, mask):
    """Keras' ``zero_output_for_mask=False`` (the layer's `_carry_outputs`): a masked step outputs
    the output of the last real step before it, zeros before the first. With count = the real steps
    up to t, that step is the count-th of the row's real steps, which `_compaction`'s order lists."""
    order = _compaction(g, mask)[0]
    count = g.node("CumSum", [g.cast(mask, np.int64), g.weight(np.asarray(1, np.int64), "time_axis")])
    last = g.node("Max", [g.node("Sub", [count, g.weight(np.asarray(1, np.int64), "one")]),
                          g.weight(np.asarray(0, np.int64), "zero_index")])
    carried = _gather_steps(g, out, g.node("GatherElements", [order, last], axis=1))
    started = g.unsqueeze(g.node("Greater", [count, g.weight(np.asarray(0, np.int64), "zero_index")]), 2)
    return g.node("Where", [started, carried, g.scalar(0.0)])


@converts(SimpleRNN, GRU, LSTM)
def _recurrent(g, layer, call):
    x, states = _inputs_and_states(call)
    mask = step_mask(g, call)
    tops, finals = run_stack(g, [(layer, layer.go_backwards)], x, mask,
                             None if states is None else [states], layer.return_sequences)
    hs, cs = finals[0]
    if not layer.return_sequences:
        out = hs[-1]
    else:
        out = tops[0]
        if layer.go_backwards:  # Keras: outputs (and the mask with them) in processing order
            out = reverse_steps(g, out)
            mask = None if mask is None else reverse_steps(g, mask)
        if mask is not None and not layer.zero_output_for_mask:
            out = _carry_outputs(g, out, mask)
    return [out] + final_states(g, layer, hs, cs) if layer.return_state else out


def merge_directions(g, merge_mode, forward, backward):
    if merge_mode == "concat":
        return g.concat([forward, backward], -1)
    if merge_mode == "sum":
        return g.node("Add", [forward, backward])
    if merge_mode == "mul":
        return g.node("Mul", [forward, backward])
    if merge_mode == "ave":
        return g.node("Mul", [g.node("Add", [forward, backward]), g.scalar(0.5)])
    return [forward, backward]


@converts(Bidirectional)
def _bidirectional(g, layer, call):
    fwd, bwd = layer.forward_layer, layer.backward_layer
    x, states = _inputs_and_states(call)
    n = len(fwd.state_size)
    initial = None if states is None else [states[:n], states[n:]]
    tops, finals = run_stack(g, layer.directions, x, step_mask(g, call), initial, layer.return_sequences)
    ends = tops if layer.return_sequences else [finals[0][0][-1], finals[1][0][-1]]
    merged = merge_directions(g, layer.merge_mode, *ends)
    out = merged if isinstance(merged, list) else [merged]
    if layer.return_state:
        out += final_states(g, fwd, *finals[0]) + final_states(g, bwd, *finals[1])
    return out if len(out) > 1 else out[0]


@converts(SimpleRNNCell, GRUCell, LSTMCell)
def _cell(g, layer, call):
    x, states = _inputs_and_states(call, "states")
    new_states = one_step(g, layer.cell_kind, _level_weights(layer, 0), x, states, layer.name,
                          **_operator_attributes([layer]))
    return new_states if len(layer.state_size) == 2 else new_states[0]


@output_mask_of(SimpleRNN, GRU, LSTM, Bidirectional)
def _sequence_mask(g, layer, call):
    return step_mask(g, call) if layer.return_sequences else None
