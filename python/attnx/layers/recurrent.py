"""Recurrent layers: SimpleRNN, GRU, LSTM (stackable with `num_layers`), Bidirectional, and the
step-by-step cells SimpleRNNCell, GRUCell, LSTMCell for decoders.

Forward and backpropagation through time run in C++ (`cpp/include/attnx/rnn.hpp`): one GEMM
projects every step's input, one small GEMM per step for the recurrence, fused gate math. The
cells are the one-step case of the same kernels.

Weight layout (Keras'): ``kernel (input_dim, G * units)``, ``recurrent_kernel (units, G * units)``,
gate blocks along the last axis in the order

- SimpleRNN: one block; ``bias (units,)``.
- LSTM: i, f, g (Keras' "c"), o (Keras' and PyTorch's order); ``bias (4 * units,)``.
- GRU: r, z, n (PyTorch's order, DESIGN.md). ``reset_after=True`` (default, PyTorch's form
  ``n = tanh(x W_n + b_in + r * (h U_n + b_hn))``): ``bias (2, 3 * units)`` = [input bias,
  recurrent bias] as Keras stores it. ``reset_after=False`` (Keras' classic form
  ``n = tanh(x W_n + b_n + (r * h) U_n)``): ``bias (3 * units,)``.
  Keras orders GRU gates z, r, h: ``GRU.set_keras_weights`` / ``get_keras_weights`` convert;
  ``set_weights`` / ``get_weights`` use attnx's (r, z, n) order.

Stacked layers (``num_layers > 1``) name the weights of level l > 0 ``kernel_l``,
``recurrent_kernel_l``, ``bias_l``; Bidirectional prefixes ``forward_`` / ``backward_``.

Masks: a padded step (mask False) carries the state through unchanged and outputs zeros, as
PyTorch's pack_padded_sequence does, for post- and pre-padding alike. ``lengths=`` (B,) is the
same as the mask ``t < lengths[b]``.
"""

import numpy as np

from .. import _core, backend, initializers, regularizers
from ..interop import register_from_torch, register_to_torch, set_torch_params
from .base import Layer, attend_mask

_ACTIVATIONS = ("tanh", "sigmoid", "relu", "linear")


def _activation(layer_name, arg, value):
    value = "linear" if value is None else value
    if value not in _ACTIVATIONS:
        raise ValueError(f"{layer_name}: `{arg}` must be one of {', '.join(_ACTIVATIONS)}, got {value!r}")
    return value


def _step_mask(layer, mask, lengths, batch, steps):
    """The (B, T) bool step mask from `mask` or `lengths` (None when every step is real)."""
    if mask is not None and lengths is not None:
        raise ValueError(f"Layer '{layer.name}': pass `mask` or `lengths`, not both")
    given = "lengths" if lengths is not None else "mask"
    if lengths is not None and np.ndim(lengths) != 1:
        raise ValueError(f"Layer '{layer.name}': `lengths` expected shape ({batch},), got {np.shape(lengths)}")
    if mask is not None and np.ndim(mask) != 2:  # lengths go through `lengths=`, where 0 is refused
        raise ValueError(f"Layer '{layer.name}': `mask` expected shape ({batch}, {steps}), got {np.shape(mask)}")
    step_mask = attend_mask(lengths if lengths is not None else mask, batch, steps, where=f"Layer '{layer.name}': "
                            f"`{given}`", min_length=1)
    return None if step_mask is None or step_mask.all() else step_mask


class _Recurrent(Layer):
    """Weights and one-level forward/backward shared by the sequence layers and the cells."""

    _cell = None  # "simple", "gru" or "lstm": the C++ kernel
    _gates = 1
    _has_cell_state = False

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
                 kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None, reset_after=True,
                 unit_forget_bias=True, **kwargs):
        super().__init__(**kwargs)
        kind = type(self).__name__
        if int(units) <= 0:
            raise ValueError(f"{kind}: units must be positive, got {units}")
        self.units = int(units)
        self.activation = _activation(kind, "activation", activation)
        self.recurrent_activation = _activation(kind, "recurrent_activation", recurrent_activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.recurrent_initializer = initializers.get(recurrent_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = regularizers.get(recurrent_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.reset_after = bool(reset_after)
        self.unit_forget_bias = bool(unit_forget_bias)
        self.num_layers = 1

    @property
    def state_size(self):
        return [self.units] * (2 if self._has_cell_state else 1)

    # --------------------------------------------------------------------- weights
    @staticmethod
    def _suffix(level):
        return "" if level == 0 else f"_{level}"

    def _build_levels(self, input_dim, stacked_input_dim):
        """Creates the weights of every level: level 0 reads `input_dim` features, the others
        `stacked_input_dim` (units, or 2 * units below a bidirectional level)."""
        G = self._gates * self.units
        for level in range(self.num_layers):
            sfx = self._suffix(level)
            in_dim = input_dim if level == 0 else stacked_input_dim
            self.add_weight("kernel" + sfx, (in_dim, G), self.kernel_initializer, self.kernel_regularizer)
            self.add_weight("recurrent_kernel" + sfx, (self.units, G), self.recurrent_initializer,
                            self.recurrent_regularizer)
            if self.use_bias:
                two = self._cell == "gru" and self.reset_after
                bias = self.add_weight("bias" + sfx, (2, G) if two else (G,), self.bias_initializer,
                                       self.bias_regularizer)
                if self._cell == "lstm" and self.unit_forget_bias:
                    bias[self.units:2 * self.units] = 1.0  # Keras: the forget gate starts open

    def _biases(self, tensors, level):
        """(input bias, recurrent bias) views of `tensors` (params or grads) for the kernel."""
        b = tensors.get("bias" + self._suffix(level))
        if b is None:
            return None, None
        if b.ndim == 2:
            return b[0], b[1]
        return b, None

    def _input_dim(self, level=0):
        return self.params["kernel" + self._suffix(level)].shape[0]

    # ----------------------------------------------------------- one level of recurrence
    def _noise_rng(self):
        """Where dropout masks come from (tests replace it to fix the masks)."""
        return backend.rng()

    def _keep_mask(self, shape, rate):
        keep = self._noise_rng().random(shape) >= rate
        return keep.astype(self.dtype) * self.dtype.type(1.0 / (1.0 - rate))

    def _level_forward(self, level, x, mask, h0, c0, reverse, training, input_keep=None, recurrent_keep=None,
                       need_y=True):
        """Runs level `level` over x (B, T, C); returns (y (B, T, H), or None unless `need_y`, h, c, ctx for
        backward)."""
        sfx = self._suffix(level)
        if input_keep is not None:
            x = np.ascontiguousarray(x * input_keep)
        b_in, b_rec = self._biases(self.params, level)
        y, h, c, cache = _core.rnn_forward(
            self._cell, x, self.params["kernel" + sfx], self.params["recurrent_kernel" + sfx], b_in, b_rec, h0, c0,
            mask, recurrent_keep, reverse, self.reset_after, self.activation, self.recurrent_activation, True,
            training, need_y)
        ctx = (x, mask, input_keep, recurrent_keep, cache, reverse) if training else None
        return y, h, c, ctx

    def _level_backward(self, level, ctx, dy, dh, dc):
        """Backward of `_level_forward`; adds into self.grads, returns (dx, dh0, dc0)."""
        x, mask, input_keep, recurrent_keep, cache, reverse = ctx
        sfx = self._suffix(level)
        db_in, db_rec = self._biases(self.grads, level)
        dx, dh0, dc0 = _core.rnn_backward(
            self._cell, x, self.params["kernel" + sfx], self.params["recurrent_kernel" + sfx], cache, mask,
            recurrent_keep, dy, dh, dc, self.grads["kernel" + sfx], self.grads["recurrent_kernel" + sfx], db_in,
            db_rec, reverse, self.reset_after, self.activation, self.recurrent_activation, True, True)
        if input_keep is not None:
            dx *= input_keep
        return dx, dh0, dc0

    def _state_input(self, value, arg, shape):
        arr = np.asarray(value)
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"Layer '{self.name}': `{arg}` must be a numeric array, got dtype {arr.dtype}")
        if arr.shape != tuple(shape):
            raise ValueError(f"Layer '{self.name}': `{arg}` expected shape {tuple(shape)}, got {arr.shape}")
        return np.ascontiguousarray(arr, dtype=self.dtype)

    def _base_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation,
                "use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "recurrent_initializer": initializers.serialize(self.recurrent_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer),
                "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
                "recurrent_regularizer": regularizers.serialize(self.recurrent_regularizer),
                "bias_regularizer": regularizers.serialize(self.bias_regularizer)}

    def _kind_config(self):
        """The options only some cell kinds have."""
        if self._cell == "gru":
            return {"recurrent_activation": self.recurrent_activation, "reset_after": self.reset_after}
        if self._cell == "lstm":
            return {"recurrent_activation": self.recurrent_activation, "unit_forget_bias": self.unit_forget_bias}
        return {}


def _split_states(layer, inputs, initial_state):
    """(x, list of state arrays or None): states come from `initial_state` or from a list input
    ``[x, h0(, c0)]`` (Keras' spelling, which also makes them differentiable inputs)."""
    if isinstance(inputs, (list, tuple)):
        if initial_state is not None:
            raise ValueError(f"Layer '{layer.name}': initial states given both in the input list and as "
                             "`initial_state`")
        if len(inputs) < 2:
            raise ValueError(f"Layer '{layer.name}': a list input is [inputs, *initial_states], got "
                             f"{len(inputs)} item(s)")
        return inputs[0], list(inputs[1:])
    if initial_state is None:
        return inputs, None
    states = list(initial_state) if isinstance(initial_state, (list, tuple)) else [initial_state]
    return inputs, states


class _RNN(_Recurrent):
    """Base of SimpleRNN, GRU and LSTM: a whole sequence, optionally `num_layers` levels deep."""

    def __init__(self, units, dropout=0.0, recurrent_dropout=0.0, return_sequences=False, return_state=False,
                 go_backwards=False, num_layers=1, stack_dropout=0.0, stateful=False, unroll=False, **kwargs):
        super().__init__(units, **kwargs)
        kind = type(self).__name__
        if stateful or unroll:
            raise ValueError(f"{kind}: stateful and unroll are not supported")
        for arg, rate in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout),
                          ("stack_dropout", stack_dropout)):
            if not 0.0 <= float(rate) < 1.0:
                raise ValueError(f"{kind}: {arg} must be in [0, 1), got {rate}")
        if int(num_layers) < 1:
            raise ValueError(f"{kind}: num_layers must be >= 1, got {num_layers}")
        self.dropout, self.recurrent_dropout = float(dropout), float(recurrent_dropout)
        self.stack_dropout = float(stack_dropout)
        self.return_sequences, self.return_state = bool(return_sequences), bool(return_state)
        self.go_backwards = bool(go_backwards)
        self.num_layers = int(num_layers)

    def build(self, input_shape):
        if isinstance(input_shape, list):  # [x, *initial_states]
            input_shape = input_shape[0]
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, features) with known features, "
                             f"got shape {input_shape}")
        self._build_levels(input_shape[-1], self.units)

    # ----------------------------------------------------------------------- states
    def _initial_states(self, states, batch):
        """Per level lists (h0s, c0s), each entry (B, H) or None."""
        L = self.num_layers
        if states is None:
            return [None] * L, [None] * L
        want = 2 if self._has_cell_state else 1
        if len(states) != want:
            raise ValueError(f"Layer '{self.name}': expected {want} initial state(s) "
                             f"({'[h, c]' if want == 2 else '[h]'}), got {len(states)}")
        shape = (batch, self.units) if L == 1 else (L, batch, self.units)
        arrays = [self._state_input(s, "initial_state[%d]" % i, shape) for i, s in enumerate(states)]
        per_level = [[a] if L == 1 else list(a) for a in arrays]
        return per_level[0], per_level[1] if want == 2 else [None] * L

    def _stack_states(self, per_level):
        return per_level[0] if self.num_layers == 1 else np.stack(per_level)

    def _level_noise(self, level, batch, steps, in_dim, training):
        """(input keep mask, recurrent keep mask) for one level: `dropout` and `recurrent_dropout`
        draw one mask per sequence (Keras), `stack_dropout` one per element between levels (PyTorch)."""
        if not training:
            return None, None
        keep = None
        if self.dropout > 0:
            keep = self._keep_mask((batch, 1, in_dim), self.dropout)
        if level > 0 and self.stack_dropout > 0:
            between = self._keep_mask((batch, steps, in_dim), self.stack_dropout)
            keep = between if keep is None else keep * between
        rec = self._keep_mask((batch, self.units), self.recurrent_dropout) if self.recurrent_dropout > 0 else None
        return keep, rec

    # ----------------------------------------------------------------------- forward
    def call(self, inputs, training=False, mask=None, initial_state=None, lengths=None):
        x, states = _split_states(self, inputs, initial_state)
        x = self._float_input(x, "inputs", ndim=3, last_dim=self._input_dim())
        B, T = x.shape[:2]
        step_mask = _step_mask(self, mask, lengths, B, T)
        h0s, c0s = self._initial_states(states, B)
        seq, hs, cs, ctxs = x, [], [], []
        for level in range(self.num_layers):
            keep, rec = self._level_noise(level, B, T, seq.shape[2], training)
            seq, h, c, ctx = self._level_forward(level, seq, step_mask, h0s[level], c0s[level], self.go_backwards,
                                                 training, keep, rec,
                                                 need_y=self.return_sequences or level + 1 < self.num_layers)
            hs.append(h)
            cs.append(c)
            ctxs.append(ctx)
        if training:
            self._cache = (ctxs, B, T, states is not None)
        out = seq if self.return_sequences else hs[-1]
        if self.return_sequences and self.go_backwards:
            out = np.ascontiguousarray(out[:, ::-1])  # Keras: outputs in processing order
        if not self.return_state:
            return out
        return [out, self._stack_states(hs)] + ([self._stack_states(cs)] if self._has_cell_state else [])

    def backward(self, dy):
        ctxs, B, T, had_states = self._saved()
        H, L = self.units, self.num_layers
        n_out = 1 + (len(self.state_size) if self.return_state else 0)
        grads = list(dy) if self.return_state else [dy]
        if len(grads) != n_out:
            raise ValueError(f"Layer '{self.name}': backward expected {n_out} gradients (one per output), got "
                             f"{len(grads)}")
        state_shape = (B, H) if L == 1 else (L, B, H)
        d_states = [None if g is None else self._grad_input(g, state_shape, f"dy[{i + 1}]")
                    for i, g in enumerate(grads[1:])]
        d_h = [None] * L if d_states == [] or d_states[0] is None else (
            [d_states[0]] if L == 1 else list(d_states[0]))
        d_c = [None] * L if len(d_states) < 2 or d_states[1] is None else (
            [d_states[1]] if L == 1 else list(d_states[1]))
        d_seq = None
        if grads[0] is not None:
            if self.return_sequences:
                d_seq = self._grad_input(grads[0], (B, T, H), "dy")
                if self.go_backwards:
                    d_seq = np.ascontiguousarray(d_seq[:, ::-1])
            else:
                d_last = self._grad_input(grads[0], (B, H), "dy")
                d_h[-1] = d_last if d_h[-1] is None else d_h[-1] + d_last
        dh0s, dc0s = [None] * L, [None] * L
        for level in reversed(range(L)):
            d_seq, dh0s[level], dc0s[level] = self._level_backward(level, ctxs[level], d_seq, d_h[level], d_c[level])
        if not had_states:
            return d_seq
        return [d_seq, self._stack_states(dh0s)] + ([self._stack_states(dc0s)] if self._has_cell_state else [])

    def compute_mask(self, inputs, mask=None):
        return mask if self.return_sequences else None

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        B = input_shape[0]
        out = (B, input_shape[1], self.units) if self.return_sequences else (B, self.units)
        if not self.return_state:
            return out
        state = (B, self.units) if self.num_layers == 1 else (self.num_layers, B, self.units)
        return [out] + [state] * len(self.state_size)

    def get_config(self):
        return {**self._base_config(), **self._kind_config(), "dropout": self.dropout,
                "recurrent_dropout": self.recurrent_dropout, "return_sequences": self.return_sequences,
                "return_state": self.return_state, "go_backwards": self.go_backwards,
                "num_layers": self.num_layers, "stack_dropout": self.stack_dropout}


_RNN_DOC = """
    Args:
        units: size of the state h (and c).
        activation: candidate / output activation (default tanh; also relu, sigmoid, linear).
        recurrent_activation: gate activation (default sigmoid; GRU and LSTM).
        use_bias: whether the layer has biases.
        kernel_initializer, recurrent_initializer, bias_initializer: Keras' defaults glorot_uniform,
            orthogonal, zeros.
        kernel_regularizer, recurrent_regularizer, bias_regularizer: e.g. ``attnx.regularizers.L2(1e-4)``.
        dropout: fraction of input features dropped during training, one mask per sequence (Keras).
        recurrent_dropout: fraction of state units dropped where the state meets the recurrent
            kernel, one mask per sequence (Keras).
        return_sequences: return every step's output (B, T, units) instead of the last (B, units).
        return_state: also return the final state(s): ``[output, h]`` (``[output, h, c]`` for LSTM).
        go_backwards: process the sequence in reverse (returned sequences are in processing order).
        num_layers: levels stacked as in PyTorch; states then have shape (num_layers, B, units).
        stack_dropout: PyTorch's `dropout`: elementwise dropout on each level's output but the last.

    Call arguments:
        inputs: (B, T, features), or a list ``[inputs, h0(, c0)]`` (then backward returns their gradients).
        mask: bool (B, T), True = real step (e.g. from ``Embedding(mask_zero=True)``); padded steps carry
            the state and output zeros. ``lengths``: (B,) ints in [1, T], the same as ``t < lengths``.
        initial_state: ``[h0(, c0)]`` each (B, units).
        training: keep what backward needs and apply dropout.

    Input shape: (batch, steps, features).
    Output shape: (batch, steps, units) with return_sequences, else (batch, units); plus the states.
    backward(dy) takes the same structure as the output (None for unused parts) and returns dx, or
    ``[dx, dh0(, dc0)]`` when initial states were given.
"""


class SimpleRNN(_RNN):
    __doc__ = "Fully connected recurrence ``h_t = activation(x_t W + b + h_{t-1} U)``.\n" + _RNN_DOC
    _cell, _gates = "simple", 1


class GRU(_RNN):
    __doc__ = ("Gated recurrent unit (Cho et al. 2014). Gates (r, z, n); ``reset_after=True`` (default) is\n"
               "PyTorch's form with bias (2, 3 * units), False Keras' classic form with bias (3 * units,).\n"
               "Keras weights (gate order z, r, h) load with `set_keras_weights`.\n" + _RNN_DOC)
    _cell, _gates = "gru", 3

    def __init__(self, units, reset_after=True, **kwargs):
        super().__init__(units, reset_after=reset_after, **kwargs)

    def set_keras_weights(self, weights):
        """Loads Keras GRU weights ``[kernel, recurrent_kernel, bias]`` (gate order z, r, h)."""
        self.set_weights([_swap_first_two_gates(w, self.units) for w in weights])

    def get_keras_weights(self):
        """The weights in Keras' GRU order (z, r, h)."""
        return [_swap_first_two_gates(w, self.units) for w in self.get_weights()]


class LSTM(_RNN):
    __doc__ = ("Long short-term memory (Hochreiter & Schmidhuber 1997). Gates (i, f, g, o) as Keras and\n"
               "PyTorch order them; ``unit_forget_bias`` starts the forget-gate bias at 1 (Keras).\n" + _RNN_DOC)
    _cell, _gates, _has_cell_state = "lstm", 4, True

    def __init__(self, units, unit_forget_bias=True, **kwargs):
        super().__init__(units, unit_forget_bias=unit_forget_bias, **kwargs)


def _swap_first_two_gates(w, units):
    """Swaps the first two gate blocks on the last axis: Keras' (z, r, h) <-> attnx's (r, z, n)."""
    w = np.asarray(w)
    return np.concatenate([w[..., units:2 * units], w[..., :units], w[..., 2 * units:]], axis=-1)


# ------------------------------------------------------------------------------ cells
class _Cell(_Recurrent):
    """One step of the recurrence, for decoders: the T = 1 case of the sequence kernels."""

    def build(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        if len(input_shape) != 2 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, features) with known features, "
                             f"got shape {input_shape}")
        self._build_levels(input_shape[-1], self.units)

    def call(self, inputs, states=None, training=False):
        x, states = _split_states(self, inputs, states)
        x = self._float_input(x, "inputs", ndim=2, last_dim=self._input_dim())
        B = x.shape[0]
        n = len(self.state_size)
        if states is not None and len(states) != n:
            raise ValueError(f"Layer '{self.name}': expected {n} state(s), got {len(states)}")
        states = [None] * n if states is None else [self._state_input(s, f"states[{i}]", (B, self.units))
                                                  for i, s in enumerate(states)]
        _, h, c, ctx = self._level_forward(0, x[:, None, :], None, states[0], states[1] if n == 2 else None, False,
                                           training, need_y=False)
        if training:
            self._cache = (ctx, B, states[0] is not None)
        return [h, c] if self._has_cell_state else h

    def backward(self, dy):
        ctx, B, had_states = self._saved()
        grads = list(dy) if self._has_cell_state else [dy]
        if len(grads) != len(self.state_size):
            raise ValueError(f"Layer '{self.name}': backward expected {len(self.state_size)} gradients, "
                             f"got {len(grads)}")
        grads = [None if g is None else self._grad_input(g, (B, self.units), f"dy[{i}]")
                 for i, g in enumerate(grads)]
        dx, dh, dc = self._level_backward(0, ctx, None, grads[0], grads[1] if len(grads) > 1 else None)
        dx = dx[:, 0, :]
        if not had_states:
            return dx
        return [dx, dh] + ([dc] if self._has_cell_state else [])

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        out = (input_shape[0], self.units)
        return [out, out] if self._has_cell_state else out

    def get_config(self):
        return {**self._base_config(), **self._kind_config()}


_CELL_DOC = """
    Args: as the sequence layer (units, activations, initializers, regularizers{extra}); no dropout.

    Call: ``cell(x, states)`` or ``cell([x, *states])`` with x (batch, features) and states
    ``{states}`` each (batch, units) (zeros when omitted). Returns the new state{ret}.
    backward(dy) takes the gradient of that output and returns dx, or ``[dx, {dstates}]`` when states
    were given.
"""


class SimpleRNNCell(_Cell):
    __doc__ = "One step of SimpleRNN: ``h = activation(x W + b + h_prev U)``.\n" + _CELL_DOC.format(
        extra="", states="[h]", ret=" h (batch, units)", dstates="dh")
    _cell, _gates = "simple", 1


class GRUCell(_Cell):
    __doc__ = "One step of GRU (gates r, z, n; same layout as `GRU`).\n" + _CELL_DOC.format(
        extra=", reset_after", states="[h]", ret=" h (batch, units)", dstates="dh")
    _cell, _gates = "gru", 3

    def __init__(self, units, reset_after=True, **kwargs):
        super().__init__(units, reset_after=reset_after, **kwargs)


class LSTMCell(_Cell):
    __doc__ = "One step of LSTM (gates i, f, g, o; same layout as `LSTM`).\n" + _CELL_DOC.format(
        extra=", unit_forget_bias", states="[h, c]", ret="s [h, c]", dstates="dh, dc")
    _cell, _gates, _has_cell_state = "lstm", 4, True

    def __init__(self, units, unit_forget_bias=True, **kwargs):
        super().__init__(units, unit_forget_bias=unit_forget_bias, **kwargs)


# ------------------------------------------------------------------------- Bidirectional
_MERGE_MODES = ("concat", "sum", "mul", "ave", None)


class Bidirectional(Layer):
    """Runs a recurrent layer forward and backward in time and merges the two outputs.

    The backward direction reads each sequence's real tokens in reverse (the padding of a masked
    sequence is skipped, not read first) and its outputs are aligned with the forward direction's:
    output[:, t] of both directions belongs to input step t. With ``layer.num_layers > 1`` every
    level is bidirectional and feeds the concatenation of both directions to the next (PyTorch's
    ``bidirectional=True, num_layers=L``).

    Args:
        layer: a SimpleRNN, GRU or LSTM (its return_sequences / return_state apply; go_backwards is
            ignored: the two directions are fixed).
        merge_mode: "concat" (default), "sum", "mul", "ave", or None (a list [forward, backward]).
        backward_layer: optional layer for the backward direction (same class and units).

    Call arguments: as the wrapped layer; ``initial_state`` is
    ``[h_fwd(, c_fwd), h_bwd(, c_bwd)]``.

    Input shape: (batch, steps, features). Output shape: (batch, [steps,] 2 * units) for concat,
    (batch, [steps,] units) otherwise, then the states ``[h_fwd(, c_fwd), h_bwd(, c_bwd)]`` with
    return_state. Weights: the forward layer's (prefixed ``forward_``), then the backward layer's
    (``backward_``), Keras' order.
    """

    def __init__(self, layer, merge_mode="concat", backward_layer=None, **kwargs):
        if not isinstance(layer, _RNN):
            raise TypeError(f"Bidirectional: expects a SimpleRNN, GRU or LSTM layer, got {type(layer).__name__}")
        kwargs.setdefault("dtype", layer.dtype.name)
        super().__init__(**kwargs)
        if merge_mode not in _MERGE_MODES:
            raise ValueError(f"Bidirectional: merge_mode must be one of {_MERGE_MODES}, got {merge_mode!r}")
        self.merge_mode = merge_mode
        self.forward_layer = layer
        if backward_layer is None:
            config = layer.get_config()
            config["name"] = "backward_" + layer.name
            backward_layer = type(layer).from_config(config)
        if type(backward_layer) is not type(layer) or backward_layer.units != layer.units or \
                backward_layer.num_layers != layer.num_layers:
            raise ValueError("Bidirectional: backward_layer must be the same class with the same units and "
                             "num_layers as layer")
        self.backward_layer = backward_layer
        self.return_sequences, self.return_state = layer.return_sequences, layer.return_state

    @property
    def _directions(self):
        return (("forward_", self.forward_layer, False), ("backward_", self.backward_layer, True))

    def build(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, features) with known features, "
                             f"got shape {input_shape}")
        for prefix, layer, _ in self._directions:
            if not layer.built:
                layer._build_levels(input_shape[-1], 2 * layer.units)
                layer.built = True
            for k in layer.params:  # shared buffers: optimizers and set_weights reach the sublayers
                self.params[prefix + k] = layer.params[k]
                self.grads[prefix + k] = layer.grads[k]
            for k, reg in layer._regularizers.items():
                self._regularizers[prefix + k] = reg

    def _merge(self, yf, yb):
        if self.merge_mode == "concat":
            return np.concatenate([yf, yb], axis=-1)
        if self.merge_mode == "sum":
            return yf + yb
        if self.merge_mode == "mul":
            return yf * yb
        if self.merge_mode == "ave":
            return (yf + yb) * self.dtype.type(0.5)
        return [yf, yb]

    def _unmerge(self, d, yf, yb, shape):
        """Gradients of the two directions' outputs from that of the merged output."""
        if self.merge_mode is None:
            return [None if g is None else self._grad_input(g, shape, "dy") for g in d]
        if d is None:
            return [None, None]
        if self.merge_mode == "concat":
            d = self._grad_input(d, shape[:-1] + (2 * shape[-1],), "dy")
            return [np.ascontiguousarray(d[..., :shape[-1]]), np.ascontiguousarray(d[..., shape[-1]:])]
        d = self._grad_input(d, shape, "dy")
        if self.merge_mode == "sum":
            return [d, d]
        if self.merge_mode == "ave":
            half = d * self.dtype.type(0.5)
            return [half, half]
        return [d * yb, d * yf]  # mul

    def call(self, inputs, training=False, mask=None, initial_state=None, lengths=None):
        fwd, bwd = self.forward_layer, self.backward_layer
        x, states = _split_states(self, inputs, initial_state)
        x = self._float_input(x, "inputs", ndim=3, last_dim=fwd._input_dim())
        B, T = x.shape[:2]
        step_mask = _step_mask(self, mask, lengths, B, T)
        n = len(fwd.state_size)
        if states is not None and len(states) != 2 * n:
            raise ValueError(f"Layer '{self.name}': expected {2 * n} initial states (forward then backward), got "
                             f"{len(states)}")
        init = [fwd._initial_states(None if states is None else states[:n], B),
                bwd._initial_states(None if states is None else states[n:], B)]
        seq, finals, ctxs = x, [[[], []], [[], []]], []
        for level in range(fwd.num_layers):
            outs, level_ctx = [], []
            for d, (_, layer, reverse) in enumerate(self._directions):
                keep, rec = layer._level_noise(level, B, T, seq.shape[2], training)
                y, h, c, ctx = layer._level_forward(level, seq, step_mask, init[d][0][level], init[d][1][level],
                                                    reverse, training, keep, rec,
                                                    need_y=self.return_sequences or level + 1 < fwd.num_layers)
                outs.append(y)
                finals[d][0].append(h)
                finals[d][1].append(c)
                level_ctx.append(ctx)
            ctxs.append(level_ctx)
            seq = np.concatenate(outs, axis=-1) if level + 1 < fwd.num_layers else outs
        yf, yb = seq if self.return_sequences else (finals[0][0][-1], finals[1][0][-1])
        if training:
            self._cache = (ctxs, B, T, states is not None, yf, yb)
        out = self._merge(yf, yb)
        out = out if isinstance(out, list) else [out]
        if not self.return_state:
            return out if len(out) > 1 else out[0]
        state_out = []
        for d, layer in ((0, fwd), (1, bwd)):
            state_out.append(layer._stack_states(finals[d][0]))
            if layer._has_cell_state:
                state_out.append(layer._stack_states(finals[d][1]))
        return out + state_out

    def backward(self, dy):
        ctxs, B, T, had_states, yf, yb = self._saved()
        fwd = self.forward_layer
        H, L, n = fwd.units, fwd.num_layers, len(fwd.state_size)
        n_merged = 2 if self.merge_mode is None else 1
        grads = list(dy) if (self.return_state or self.merge_mode is None) else [dy]
        n_out = n_merged + (2 * n if self.return_state else 0)
        if len(grads) != n_out:
            raise ValueError(f"Layer '{self.name}': backward expected {n_out} gradients (one per output), got "
                             f"{len(grads)}")
        d_out = self._unmerge(grads[:n_merged] if n_merged == 2 else grads[0], yf, yb, yf.shape)
        state_shape = (B, H) if L == 1 else (L, B, H)
        d_states = [None if g is None else self._grad_input(g, state_shape, "d state") for g in grads[n_merged:]]
        d_states += [None] * (2 * n - len(d_states))

        def per_level(g):
            return [None] * L if g is None else ([g] if L == 1 else list(g))
        dh = [per_level(d_states[0]), per_level(d_states[n])]
        dc = [per_level(d_states[1]) if n == 2 else [None] * L, per_level(d_states[n + 1]) if n == 2 else [None] * L]
        if self.return_sequences:
            d_seq = d_out
        else:
            d_seq = [None, None]
            for d in range(2):
                if d_out[d] is not None:
                    dh[d][-1] = d_out[d] if dh[d][-1] is None else dh[d][-1] + d_out[d]
        dh0, dc0 = [[None] * L, [None] * L], [[None] * L, [None] * L]
        for level in reversed(range(L)):
            dxs = []
            for d, (_, layer, _) in enumerate(self._directions):
                dx, dh0[d][level], dc0[d][level] = layer._level_backward(level, ctxs[level][d], d_seq[d],
                                                                         dh[d][level], dc[d][level])
                dxs.append(dx)
            dx = dxs[0] + dxs[1]
            if level > 0:  # the level below produced [forward, backward] concatenated
                d_seq = [np.ascontiguousarray(dx[..., :H]), np.ascontiguousarray(dx[..., H:])]
        if not had_states:
            return dx
        out = [dx]
        for d, layer in ((0, fwd), (1, self.backward_layer)):
            out.append(layer._stack_states(dh0[d]))
            if n == 2:
                out.append(layer._stack_states(dc0[d]))
        return out

    def compute_mask(self, inputs, mask=None):
        return mask if self.return_sequences else None

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        H = self.forward_layer.units
        width = 2 * H if self.merge_mode == "concat" else H
        out = (input_shape[0], input_shape[1], width) if self.return_sequences else (input_shape[0], width)
        outs = [out, out] if self.merge_mode is None else [out]
        if self.return_state:
            L = self.forward_layer.num_layers
            state = (input_shape[0], H) if L == 1 else (L, input_shape[0], H)
            outs += [state] * (2 * len(self.forward_layer.state_size))
        return outs if len(outs) > 1 else outs[0]

    def get_config(self):
        config = super().get_config()
        config.pop("dtype", None)
        return {**config, "merge_mode": self.merge_mode,
                "layer": {"class_name": type(self.forward_layer).__name__, "config": self.forward_layer.get_config()},
                "backward_layer": {"class_name": type(self.backward_layer).__name__,
                                   "config": self.backward_layer.get_config()}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        spec, back = config.pop("layer"), config.pop("backward_layer", None)
        layer = Layer.registry[spec["class_name"]].from_config(spec["config"])
        if back is not None:
            back = Layer.registry[back["class_name"]].from_config(back["config"])
        return cls(layer, backward_layer=back, **config)


# ------------------------------------------------------------------------ PyTorch interop
_TORCH_KINDS = {"RNN": SimpleRNN, "GRU": GRU, "LSTM": LSTM}


def _torch_level_to_attnx(kind, t, torch_sfx, use_bias, grads):
    """One level/direction of torch tensors -> {kernel, recurrent_kernel, bias} (attnx layout).
    PyTorch adds b_ih and b_hh; Keras' single bias for SimpleRNN and LSTM is their sum, so its
    gradient is that of either one (both equal)."""
    out = {"kernel": t["weight_ih" + torch_sfx].T, "recurrent_kernel": t["weight_hh" + torch_sfx].T}
    if use_bias:
        b_ih, b_hh = t["bias_ih" + torch_sfx], t["bias_hh" + torch_sfx]
        out["bias"] = np.stack([b_ih, b_hh]) if kind == "GRU" else b_ih if grads else b_ih + b_hh
    return out


def _rnn_from_torch(module, dtype):
    kind = type(module).__name__
    if getattr(module, "proj_size", 0):
        raise ValueError("from_torch: LSTM with proj_size is not supported")
    extra = {}
    if kind == "RNN":
        extra["activation"] = module.nonlinearity
    layer = _TORCH_KINDS[kind](module.hidden_size, use_bias=module.bias, num_layers=module.num_layers,
                               stack_dropout=module.dropout, return_sequences=True, return_state=True,
                               dtype=dtype, **extra)
    directions = [("", "")]
    if module.bidirectional:
        layer = Bidirectional(layer)
        directions = [("forward_", ""), ("backward_", "_reverse")]
    layer.build((None, None, module.input_size))
    layer.built = True

    def to_attnx(t, grads=False):
        out = {}
        for prefix, torch_dir in directions:
            for level in range(module.num_layers):
                level_weights = _torch_level_to_attnx(kind, t, f"_l{level}{torch_dir}", module.bias, grads)
                for k, v in level_weights.items():
                    out[prefix + k + _Recurrent._suffix(level)] = v
        return out
    return layer, to_attnx


for _kind in _TORCH_KINDS:
    register_from_torch(_kind)(_rnn_from_torch)


def _rnn_to_torch(layer):
    import torch
    base = layer.forward_layer if isinstance(layer, Bidirectional) else layer
    kind = {"simple": "RNN", "gru": "GRU", "lstm": "LSTM"}[base._cell]
    if base._cell == "gru" and not base.reset_after:
        raise ValueError(f"to_torch: GRU '{base.name}' has reset_after=False; torch.nn.GRU computes the "
                         "reset_after=True form")
    if base._cell != "simple" and (base.activation, base.recurrent_activation) != ("tanh", "sigmoid"):
        raise ValueError(f"to_torch: '{base.name}' uses activations ({base.activation}, "
                         f"{base.recurrent_activation}); torch.nn.{kind} has (tanh, sigmoid)")
    if base._cell == "simple" and base.activation not in ("tanh", "relu"):
        raise ValueError(f"to_torch: SimpleRNN '{base.name}' has activation {base.activation!r}; torch.nn.RNN "
                         "supports tanh and relu")
    extra = {"nonlinearity": base.activation} if kind == "RNN" else {}
    bidirectional = isinstance(layer, Bidirectional)
    module = getattr(torch.nn, kind)(base._input_dim(), base.units, num_layers=base.num_layers, bias=base.use_bias,
                                     batch_first=True, dropout=base.stack_dropout, bidirectional=bidirectional,
                                     dtype=getattr(torch, layer.dtype.name), **extra)
    tensors = {}
    directions = [("forward_", "", layer.forward_layer), ("backward_", "_reverse", layer.backward_layer)] \
        if bidirectional else [("", "", layer)]
    for _, torch_dir, sub in directions:
        for level in range(base.num_layers):
            sfx, tsfx = _Recurrent._suffix(level), f"_l{level}{torch_dir}"
            tensors["weight_ih" + tsfx] = sub.params["kernel" + sfx].T
            tensors["weight_hh" + tsfx] = sub.params["recurrent_kernel" + sfx].T
            if base.use_bias:
                b_in, b_rec = sub._biases(sub.params, level)
                tensors["bias_ih" + tsfx] = b_in
                tensors["bias_hh" + tsfx] = np.zeros_like(b_in) if b_rec is None else b_rec
    return set_torch_params(module, tensors)


for _cls in (SimpleRNN, GRU, LSTM, Bidirectional):
    register_to_torch(_cls)(_rnn_to_torch)
