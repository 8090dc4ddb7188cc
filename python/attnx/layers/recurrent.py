"""Recurrent layers: SimpleRNN, GRU, LSTM (stackable with `num_layers`), Bidirectional, and the
step-by-step cells SimpleRNNCell, GRUCell, LSTMCell for decoders.

Forward and backpropagation through time run in C++ (`cpp/include/attnx/rnn.hpp`): one GEMM
projects every step's input, one small GEMM per step for the recurrence, fused gate math. The
cells are the one-step case of the same kernels.

Weight layout (Keras'): ``kernel (input_dim, G * units)``, ``recurrent_kernel (units, G * units)``,
gate blocks along the last axis in the order

- SimpleRNN: one block; ``bias (units,)``.
- LSTM: i, f, g (Keras' "c"), o (Keras' and PyTorch's order); ``bias (4 * units,)``.
- GRU: r, z, n (PyTorch's order). ``reset_after=True`` (default, PyTorch's form
  ``n = tanh(x W_n + b_in + r * (h U_n + b_hn))``): ``bias (2, 3 * units)`` = [input bias,
  recurrent bias] as Keras stores it. ``reset_after=False`` (Keras' classic form
  ``n = tanh(x W_n + b_n + (r * h) U_n)``): ``bias (3 * units,)``.
  Keras orders GRU gates z, r, h: ``GRU.set_keras_weights`` / ``get_keras_weights`` convert;
  ``set_weights`` / ``get_weights`` use attnx's (r, z, n) order.

Stacked layers (``num_layers > 1``) name the weights of level l > 0 ``kernel_l``,
``recurrent_kernel_l``, ``bias_l``; Bidirectional prefixes ``forward_`` / ``backward_``.

Masks follow the one mask rule (`attnx.masking`): a padded step (mask False) carries the state
through unchanged and outputs zeros, as PyTorch's pack_padded_sequence does, for post- and
pre-padding alike; ``lengths=`` (B,) is the same as the mask ``t < lengths[b]``. A row of length 0
keeps its initial state and outputs zeros.

Each training call's kernel state (gates, previous states, dropout masks) lives in the cache that
`forward` returns and nowhere else, so a layer called several times in a model gets the sum of its
calls' parameter gradients (ARCHITECTURE.md, "The layer contract").
"""
import functools
from typing import NamedTuple

import numpy as np

from .. import backend, initializers, kernels, quantization, random, regularizers
from ..masking import as_mask
from .base import Layer

_ACTIVATIONS = ("tanh", "sigmoid", "relu", "linear")


def _activation(layer_name, arg, value):
    value = "linear" if value is None else value
    if value not in _ACTIVATIONS:
        raise ValueError(f"{layer_name}: `{arg}` must be one of {', '.join(_ACTIVATIONS)}, got {value!r}")
    return value


def _step_mask(layer, mask, lengths, batch, steps):
    """The (B, T) bool step mask from `mask` or `lengths` (None when every step is real, which
    spares the kernel its per-step mask test)."""
    if mask is not None and lengths is not None:
        raise ValueError(f"Layer '{layer.name}': pass `mask` or `lengths`, not both")
    given = "mask" if lengths is None else "lengths"
    step_mask = as_mask(mask if lengths is None else lengths, batch, steps, f"Layer '{layer.name}': `{given}`")
    return None if step_mask is None or step_mask.all() else step_mask


# Input dropout's per-sequence keep mask (B, 1, C) is repeated over the steps for inputs of at most this
# many features: NumPy's product broadcast along T runs C-long inner loops, and for short ones the repeat
# and two same-shape products (forward, backward) cost less than two broadcast ones (B 32, T 32, C 32:
# 6.0 against 2.1 + 1.9 us per product; C 128 (B 64, T 128): 207 against 44 + 122; C 256: 414 against
# 96 + 395, no gain for one more (B, T, C) array held)
_REPEATED_KEEP_MAX_FEATURES = 128


def level_suffix(level):
    """The suffix of level `level`'s weight names: "" for the first, "_1", "_2", ... above it."""
    return "" if level == 0 else f"_{level}"


class _LevelCache(NamedTuple):
    """What the backward pass of one level in one direction needs from its training forward."""
    x: np.ndarray  # the level's input, after input dropout
    mask: np.ndarray  # (B, T) bool step mask, or None
    input_keep: np.ndarray  # input dropout's scaled keep mask, or None
    recurrent_keep: np.ndarray  # recurrent dropout's scaled keep mask (B, H), or None
    kernel_cache: tuple  # what rnn_forward returned for rnn_backward
    reverse: bool


class _Recurrent(Layer):
    """Weights and one-level forward/backward shared by the sequence layers and the cells."""

    _cell = None  # "simple", "gru" or "lstm": the C++ kernel
    _bf16_products = True  # attnx.mixed_precision: the products over all steps (rnn_bf16.hpp)
    _gates = 1
    _has_cell_state = False

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
                 kernel_regularizer=None, recurrent_regularizer=None, bias_regularizer=None, reset_after=True,
                 unit_forget_bias=True, quantization_mode=None, **kwargs):
        super().__init__(**kwargs)
        kind = type(self).__name__
        self.quantization_mode = quantization.check_mode(kind, quantization_mode)
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

    # ------------------------------------------------- the public spec (export, interop, quantization)
    @property
    def cell_kind(self):
        """The recurrence the layer computes: "simple", "gru" or "lstm" (a string, where Keras' `cell` is
        a layer object attnx's sequence layers do not have)."""
        return self._cell

    @property
    def input_dim(self):
        """The features of level 0's input (built layers)."""
        return self._input_dim()

    def level_biases(self, level=0):
        """(input bias, recurrent bias or None) of level `level`, views of `params` (GRU with
        reset_after keeps both; the others one bias; (None, None) without use_bias)."""
        return self._biases(self.params, level)

    def quantizable_weights(self):
        return {name + level_suffix(level): "columns" for level in range(self.num_layers)
                for name in ("kernel", "recurrent_kernel")}

    # --------------------------------------------------------------------- weights
    def _build_levels(self, input_dim, stacked_input_dim):
        """Creates the weights of every level: level 0 reads `input_dim` features, the others
        `stacked_input_dim` (units, or 2 * units below a bidirectional level)."""
        G = self._gates * self.units
        with quantization.building(self):
            for level in range(self.num_layers):
                sfx = level_suffix(level)
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
        b = tensors.get("bias" + level_suffix(level))
        if b is None:
            return None, None
        if b.ndim == 2:
            return b[0], b[1]
        return b, None

    def _input_dim(self, level=0):
        return self.params["kernel" + level_suffix(level)].shape[0]

    # ----------------------------------------------------------- one level of recurrence
    def _keep_mask(self, shape, rate):
        """A dropout keep mask from the layer's stream (tests replace `seed_generator.next_key` to fix it)."""
        return self.seed_generator.keep(shape, rate, self.dtype)

    def _level_forward(self, level, x, mask, h0, c0, reverse, training, input_keep=None, recurrent_keep=None,
                       need_y=True):
        """Runs level `level` over x (B, T, C). Returns (y (B, T, H), or None unless `need_y`; final h;
        final c or None; the level's cache for `_level_backward`, or None unless training)."""
        if self.quantization_mode:
            return self._int8_level_forward(level, x, mask, h0, c0, reverse, training, need_y)
        sfx = level_suffix(level)
        if input_keep is not None:
            if input_keep.shape[1] != x.shape[1] and x.shape[2] <= _REPEATED_KEEP_MAX_FEATURES:
                input_keep = np.repeat(input_keep, x.shape[1], axis=1)  # once, for this product and backward's
            x = x * input_keep  # a new C-contiguous array
        bias, recurrent_bias = self._biases(self.params, level)
        y, h, c, kernel_cache = kernels.rnn_forward(
            cell=self._cell, x=x, kernel=self.params["kernel" + sfx],
            recurrent_kernel=self.params["recurrent_kernel" + sfx], bias=bias, recurrent_bias=recurrent_bias,
            h0=h0, c0=c0, mask=mask, recurrent_mask=recurrent_keep, reverse=reverse, reset_after=self.reset_after,
            activation=self.activation, recurrent_activation=self.recurrent_activation, training=training,
            return_sequences=need_y, bf16=self.compute_dtype == "bfloat16")
        cache = _LevelCache(x, mask, input_keep, recurrent_keep, kernel_cache, reverse) if training else None
        return y, h, c, cache

    def _int8_level_forward(self, level, x, mask, h0, c0, reverse, training, need_y):
        """`_level_forward` of a quantized layer: inputs and h_{t-1} quantized per row, int8 products."""
        quantization.inference_only(self, training)
        sfx, p = level_suffix(level), self.params

        def float32(a):
            return None if a is None else np.require(a, np.float32, "CA")
        bias, recurrent_bias = self._biases(p, level)
        classic_gru = self._cell == "gru" and not self.reset_after  # its candidate's columns packed apart
        y, h, c = kernels.rnn_forward_int8(
            cell=self._cell, x=float32(x), kernel=quantization.packed(self, "kernel" + sfx),
            recurrent_kernel=quantization.packed(self, "recurrent_kernel" + sfx,
                                                 split=2 * self.units if classic_gru else 0),
            bias=float32(bias), recurrent_bias=float32(recurrent_bias), h0=float32(h0), c0=float32(c0), mask=mask,
            reverse=reverse, reset_after=self.reset_after, activation=self.activation,
            recurrent_activation=self.recurrent_activation, return_sequences=need_y)
        return y, h, c, None

    def _level_backward(self, level, cache, dy, dh, dc, need_dx=True):
        """Backward of `_level_forward` from the gradients of its y, final h and final c (each may be
        None); adds into self.grads and returns (dx, or None unless `need_dx`; dh0; dc0 or None)."""
        sfx, grads = level_suffix(level), self.grads  # (a property: read once)
        dbias, drecurrent_bias = self._biases(grads, level)
        dx, dh0, dc0 = kernels.rnn_backward(
            cell=self._cell, x=cache.x, kernel=self.params["kernel" + sfx],
            recurrent_kernel=self.params["recurrent_kernel" + sfx], cache=cache.kernel_cache, mask=cache.mask,
            recurrent_mask=cache.recurrent_keep, dy=dy, dh=dh, dc=dc, dkernel=grads["kernel" + sfx],
            drecurrent_kernel=grads["recurrent_kernel" + sfx], dbias=dbias, drecurrent_bias=drecurrent_bias,
            reverse=cache.reverse, reset_after=self.reset_after, activation=self.activation,
            recurrent_activation=self.recurrent_activation, need_dx=need_dx, bf16=self.compute_dtype == "bfloat16")
        if dx is not None and cache.input_keep is not None:
            dx *= cache.input_keep
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
                "bias_regularizer": regularizers.serialize(self.bias_regularizer), **quantization.config(self)}

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


class _SequenceCache(NamedTuple):
    """What backprop needs from one training call of a sequence layer (SimpleRNN, GRU, LSTM,
    Bidirectional)."""
    levels: list  # levels[level][direction]: that level's _LevelCache
    batch: int
    steps: int
    had_states: bool  # initial states were given: backprop returns their gradients too
    outputs: tuple = None  # Bidirectional with merge_mode "mul": the two directions' outputs
    carried_from: np.ndarray = None  # zero_output_for_mask=False: the step each output was taken from


def _carry_outputs(seq, step_mask):
    """Keras' ``zero_output_for_mask=False``: a masked step outputs the output of the last real step
    before it (zeros before the first). Returns (outputs, the (B, T) index of the step each output
    comes from, -1 for zeros)."""
    T = seq.shape[1]
    source = np.maximum.accumulate(np.where(step_mask, np.arange(T), -1), axis=1)
    out = np.take_along_axis(seq, np.maximum(source, 0)[:, :, None], axis=1)
    out[source < 0] = 0
    return out, source


def _carry_outputs_backward(d_out, source):
    """The gradient of the kernel's outputs from that of `_carry_outputs`' (each output's gradient
    goes to the step it was taken from)."""
    B, T, H = d_out.shape
    d_seq = np.zeros_like(d_out)
    taken = source >= 0
    rows = (np.arange(B)[:, None] * T + source)[taken]
    np.add.at(d_seq.reshape(B * T, H), rows, d_out[taken])
    return d_seq


def _stack_forward(directions, x, mask, initial_states, training, need_sequences):
    """Runs the levels of a stack of one direction, or of two (Bidirectional), over x (B, T, C).

    `directions` lists (layer, reverse); every level runs each direction over the same input and
    feeds the next level their outputs concatenated. `initial_states[d]` is direction d's
    (h0s, c0s) per level. Returns (the top level's outputs per direction, or None unless
    `need_sequences`; per direction the final (hs, cs) per level; the caches per level and direction).
    """
    B, T = x.shape[:2]
    num_layers = directions[0][0].num_layers
    seq, finals, caches = x, [([], []) for _ in directions], []
    for level in range(num_layers):
        top = level + 1 == num_layers

        def run(direction, seq=seq, level=level, top=top):
            (layer, reverse), (h0s, c0s), (input_keep, recurrent_keep) = direction
            return layer._level_forward(level, seq, mask, h0s[level], c0s[level], reverse, training, input_keep,
                                        recurrent_keep, need_y=need_sequences or not top)

        # every direction's dropout noise first, in order: the draws do not depend on how they run
        noise = [layer._level_noise(level, B, T, seq.shape[2], training) for layer, _ in directions]
        runs = [functools.partial(run, d) for d in zip(directions, initial_states, noise)]
        results = backend.run_side_by_side(*runs)
        ys, level_caches = [], []
        for (y, h, c, cache), (hs, cs) in zip(results, finals):
            ys.append(y)
            hs.append(h)
            cs.append(c)
            level_caches.append(cache)
        caches.append(level_caches)
        seq = ys if top else (ys[0] if len(ys) == 1 else np.concatenate(ys, axis=-1))
    return seq, finals, caches


def _stack_backward(directions, caches, d_seqs, dhs, dcs, need_dx):
    """Backward of `_stack_forward`, adding into each layer's grads.

    `d_seqs[d]` is the gradient of direction d's top-level outputs (or None), `dhs[d]` / `dcs[d]`
    those of its final h / c per level (entries may be None). Returns (dx, or None unless
    `need_dx`; per direction dh0 and dc0 per level).
    """
    num_layers = len(caches)
    dh0s = [[None] * num_layers for _ in directions]
    dc0s = [[None] * num_layers for _ in directions]
    for level in reversed(range(num_layers)):
        def run(d, level=level):
            # the levels above the first need dx to go on; the first only when the caller reads it
            return directions[d][0]._level_backward(level, caches[level][d], d_seqs[d], dhs[d][level], dcs[d][level],
                                                    need_dx=need_dx or level > 0)

        runs = [functools.partial(run, d) for d in range(len(directions))]
        results = backend.run_side_by_side(*runs)
        dxs = []
        for d, (dx_d, dh0s[d][level], dc0s[d][level]) in enumerate(results):
            dxs.append(dx_d)
        dx = None if dxs[0] is None else sum(dxs[1:], dxs[0])  # every direction read the same input
        if level > 0:  # that input was the directions' outputs of the level below, side by side
            d_seqs = [np.ascontiguousarray(g) for g in np.split(dx, len(directions), axis=-1)]
    return dx, dh0s, dc0s


def _gradient_list(layer, dy, count):
    """The upstream gradients of a call's `count` outputs as a list (dy itself when count is 1)."""
    grads = list(dy) if count > 1 else [dy]
    if len(grads) != count:
        raise ValueError(f"Layer '{layer.name}': backprop expected {count} gradients (one per output), got "
                         f"{len(grads)}")
    return grads


def _state_grads(layer, grads, shape, first_index):
    """The final states' gradients `grads` (entries may be None) as arrays of `shape`; errors name
    them dy[first_index], dy[first_index + 1], ..."""
    return [None if g is None else layer._grad_input(g, shape, f"dy[{i}]")
            for i, g in enumerate(grads, start=first_index)]


def _direction_grads(layer, d_out, d_states, return_sequences):
    """One direction's (gradient of the top level's outputs, of the final h per level, of the final
    c per level) from the gradient of its output and of its final states [h(, c)] (arrays or None).
    Without return_sequences the output is the top level's final h, so its gradient joins that one."""
    dh = layer._per_level(d_states[0] if d_states else None)
    dc = layer._per_level(d_states[1] if len(d_states) > 1 else None)
    if return_sequences:
        return d_out, dh, dc
    if d_out is not None:
        dh[-1] = d_out if dh[-1] is None else dh[-1] + d_out
    return None, dh, dc


class _RNN(_Recurrent):
    """Base of SimpleRNN, GRU and LSTM: a whole sequence, optionally `num_layers` levels deep."""
    _gradient_arguments = (("initial_state", None),)  # see Layer._with_gradient_arguments

    def __init__(self, units, dropout=0.0, recurrent_dropout=0.0, return_sequences=False, return_state=False,
                 go_backwards=False, num_layers=1, stack_dropout=0.0, zero_output_for_mask=False, stateful=False,
                 unroll=False, seed=None, implementation=2, **kwargs):
        super().__init__(units, **kwargs)
        kind = type(self).__name__
        if implementation not in (0, 1, 2):  # 0: Keras 2's, which Keras 3 still reads from configs
            raise ValueError(f"{kind}: implementation must be 1 or 2, got {implementation!r}")
        # unroll and implementation choose how Keras schedules the same arithmetic: one kernel does it here
        self.unroll, self.implementation = bool(unroll), int(implementation)
        self.seed_generator = random.SeedGenerator(seed, kind)
        self.seed = self.seed_generator.seed
        self.stateful = bool(stateful)
        self._carried_states = None  # stateful: the last call's final states, the next call's initial ones
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
        self.zero_output_for_mask = bool(zero_output_for_mask)

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
        arrays = [self._state_input(s, f"initial_state[{i}]", self._state_shape(batch)) for i, s in enumerate(states)]
        return self._per_level(arrays[0]), self._per_level(arrays[1] if want == 2 else None)

    def _state_shape(self, batch):
        """The shape of one state, (B, H), or (num_layers, B, H) for a stack."""
        return (batch, self.units) if self.num_layers == 1 else (self.num_layers, batch, self.units)

    def _per_level(self, state):
        """A state (or its gradient) of `_state_shape`, or None, as a list of one entry per level."""
        if state is None:
            return [None] * self.num_layers
        return [state] if self.num_layers == 1 else list(state)

    def _final_states(self, hs, cs):
        """The states a call returns, [h(, c)], from the per-level lists (also their gradients)."""
        def stacked(per_level):
            return per_level[0] if self.num_layers == 1 else np.stack(per_level)
        return [stacked(hs)] + ([stacked(cs)] if self._has_cell_state else [])

    def _level_noise(self, level, batch, steps, in_dim, training):
        """(input keep mask, recurrent keep mask) for one level: `dropout` and `recurrent_dropout`
        draw one mask per sequence (Keras), `stack_dropout` one per element between levels (PyTorch)."""
        if not backend.training_randomness(training):
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
    def forward(self, inputs, training=False, mask=None, initial_state=None, lengths=None):
        x, states = _split_states(self, inputs, initial_state)
        x = self._float_input(x, "inputs", ndim=3, last_dim=self._input_dim())
        B, T = x.shape[:2]
        step_mask = _step_mask(self, mask, lengths, B, T)
        top_seqs, finals, level_caches = _stack_forward([(self, self.go_backwards)], x, step_mask,
                                                        [self._initial_states(self._carried_or(states, B), B)],
                                                        training, self.return_sequences)
        hs, cs = finals[0]
        self._carry(hs, cs)
        out, carried_from = self._sequence_output(top_seqs[0], hs, step_mask)
        if self.return_state:
            out = [out] + self._final_states(hs, cs)
        return out, (_SequenceCache(level_caches, B, T, states is not None, carried_from=carried_from)
                     if training else None)

    def _sequence_output(self, top_seq, hs, step_mask):
        """The layer's output from the top level's sequence (B, T, units) and final states: the last state,
        or the sequence in Keras' order with padded steps carrying the last real output unless
        zero_output_for_mask. Returns (output, carried_from: what the backward needs to undo the carry)."""
        if not self.return_sequences:
            return hs[-1], None
        out = top_seq
        if self.go_backwards:  # Keras: outputs (and the mask with them) in processing order
            out = np.ascontiguousarray(out[:, ::-1])
            step_mask = None if step_mask is None else step_mask[:, ::-1]
        if step_mask is not None and not self.zero_output_for_mask:
            return _carry_outputs(out, step_mask)
        return out, None

    def backprop(self, cache, dy, need_dx=True):
        B, T = cache.batch, cache.steps
        n_states = len(self.state_size) if self.return_state else 0
        grads = _gradient_list(self, dy, 1 + n_states)
        d_out = grads[0]
        if d_out is not None:
            d_out = self._grad_input(d_out, (B, T, self.units) if self.return_sequences else (B, self.units), "dy")
            if cache.carried_from is not None:
                d_out = _carry_outputs_backward(d_out, cache.carried_from)
            if self.return_sequences and self.go_backwards:
                d_out = np.ascontiguousarray(d_out[:, ::-1])
        d_states = _state_grads(self, grads[1:], self._state_shape(B), first_index=1)
        d_seq, dh, dc = _direction_grads(self, d_out, d_states, self.return_sequences)
        dx, dh0s, dc0s = _stack_backward([(self, self.go_backwards)], cache.levels, [d_seq], [dh], [dc],
                                         need_dx)
        return ([dx] + self._final_states(dh0s[0], dc0s[0])) if cache.had_states else dx

    def _carried_or(self, states, batch):
        """`states`, or for a stateful layer called without them the last call's final states (constants:
        no gradient flows into the previous batch, as in Keras)."""
        if states is not None or not self.stateful or self._carried_states is None:
            return states
        if self._carried_states[0].shape[-2] != batch:
            raise ValueError(f"Layer '{self.name}': a stateful layer keeps states for batches of "
                             f"{self._carried_states[0].shape[-2]} rows, got a batch of {batch}; call reset_state() "
                             "to start again")
        return self._carried_states

    def _carry(self, hs, cs):
        """A stateful layer keeps the final states of this call for the next."""
        if self.stateful:
            self._carried_states = [np.array(s) for s in self._final_states(hs, cs)]

    def reset_state(self, states=None):
        """Stateful layers: start the next call from zero states, or from `states` ``[h(, c)]`` (Keras)."""
        if states is None:
            self._carried_states = None
            return
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        n = len(self.state_size)
        leading = () if self.num_layers == 1 else (self.num_layers,)  # the shape `_final_states` gives
        expected = f"{n} state array(s) of shape {leading + ('batch', self.units)}".replace("'", "")
        if len(states) != n:
            raise ValueError(f"Layer '{self.name}': reset_state takes {expected}, got {len(states)} value(s)")
        arrays = []
        for i, state in enumerate(states):
            array = np.asarray(state) if state is not None else None
            if array is None or array.dtype.kind not in "fiu":
                raise TypeError(f"Layer '{self.name}': reset_state's state {i} must be a numeric array, got "
                                f"{type(state).__name__ if array is None else array.dtype}")
            shape_ok = array.ndim == len(leading) + 2 and array.shape[:-2] == leading and \
                array.shape[-1] == self.units and array.shape[-2] >= 1
            if not shape_ok or (arrays and array.shape != arrays[0].shape):
                raise ValueError(f"Layer '{self.name}': reset_state takes {expected} (all of one shape), got "
                                 f"shape {array.shape} for state {i}")
            arrays.append(np.array(array, dtype=self.dtype))
        self._carried_states = arrays

    reset_states = reset_state

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
                "num_layers": self.num_layers, "stack_dropout": self.stack_dropout,
                "zero_output_for_mask": self.zero_output_for_mask, "stateful": self.stateful, "unroll": self.unroll,
                "seed": self.seed, "implementation": self.implementation}


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
        stateful: each call starts from the previous call's final states (batches of one size; Keras);
            ``reset_state()`` starts again from zeros. The states are constants of the next call.
        seed: seed of this layer's dropout masks (default: attnx's stream, `attnx.random`).
        unroll, implementation: accepted for Keras' sake; one fused kernel runs every step either way.
        zero_output_for_mask: with return_sequences and a mask, padded steps output the output of
            the last real step before them (False, Keras' default) or zeros (True, as PyTorch's
            packed sequences and Keras inside Bidirectional). Ignored inside Bidirectional.

    Call arguments:
        inputs: (B, T, features), or a list ``[inputs, h0(, c0)]`` (then backprop returns their gradients).
        mask: bool or 0/1 integer (B, T), True = real step (e.g. from ``Embedding(mask_zero=True)``);
            padded steps carry the state and the last real output (or zeros: zero_output_for_mask). ``lengths``:
            (B,) ints in [0, T], the same as ``t < lengths`` (give one of the two).
        initial_state: ``[h0(, c0)]`` each (B, units).
        training: keep what backprop needs and apply dropout.

    Input shape: (batch, steps, features).
    Output shape: (batch, steps, units) with return_sequences, else (batch, units); plus the states.
    backprop(cache, dy) takes the same structure as the output (None for unused parts) and returns
    dx, or ``[dx, dh0(, dc0)]`` when initial states were given.
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
        self.set_weights([swap_first_two_gates(w, self.units) for w in weights])

    def get_keras_weights(self):
        """The weights in Keras' GRU order (z, r, h)."""
        return [swap_first_two_gates(w, self.units) for w in self.get_weights()]


class LSTM(_RNN):
    __doc__ = ("Long short-term memory (Hochreiter & Schmidhuber 1997). Gates (i, f, g, o) as Keras and\n"
               "PyTorch order them; ``unit_forget_bias`` starts the forget-gate bias at 1 (Keras).\n" + _RNN_DOC)
    _cell, _gates, _has_cell_state = "lstm", 4, True

    def __init__(self, units, unit_forget_bias=True, **kwargs):
        super().__init__(units, unit_forget_bias=unit_forget_bias, **kwargs)


def swap_first_two_gates(w, units):
    """Swaps the first two gate blocks on the last axis: Keras' (z, r, h) <-> attnx's (r, z, n)."""
    w = np.asarray(w)
    return np.concatenate([w[..., units:2 * units], w[..., :units], w[..., 2 * units:]], axis=-1)


# ------------------------------------------------------------------------------ cells
class _Cell(_Recurrent):
    """One step of the recurrence, for decoders: the T = 1 case of the sequence kernels."""
    _gradient_arguments = (("states", 0),)  # see Layer._with_gradient_arguments

    def build(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        if len(input_shape) != 2 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, features) with known features, "
                             f"got shape {input_shape}")
        self._build_levels(input_shape[-1], self.units)

    def forward(self, inputs, states=None, training=False):
        x, states = _split_states(self, inputs, states)
        x = self._float_input(x, "inputs", ndim=2, last_dim=self._input_dim())
        B = x.shape[0]
        n = len(self.state_size)
        if states is not None and len(states) != n:
            raise ValueError(f"Layer '{self.name}': expected {n} state(s), got {len(states)}")
        had_states = states is not None
        states = [self._state_input(s, f"states[{i}]", (B, self.units)) for i, s in enumerate(states or [])]
        h_prev, c_prev = (states + [None, None])[:2]
        _, h, c, level_cache = self._level_forward(0, x[:, None, :], None, h_prev, c_prev, False, training,
                                                   need_y=False)
        cache = (level_cache, had_states) if training else None
        return ([h, c] if self._has_cell_state else h), cache

    def backprop(self, cache, dy, need_dx=True):
        level_cache, had_states = cache
        B = level_cache.x.shape[0]
        d_states = _state_grads(self, _gradient_list(self, dy, len(self.state_size)), (B, self.units),
                                first_index=0)
        dh, dc = (d_states + [None])[:2]
        dx, dh_prev, dc_prev = self._level_backward(0, level_cache, None, dh, dc,
                                                    need_dx=need_dx)
        dx = None if dx is None else dx[:, 0, :]
        return ([dx, dh_prev] + ([dc_prev] if self._has_cell_state else [])) if had_states else dx

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
    backprop(cache, dy) takes the gradient of that output and returns dx, or ``[dx, {dstates}]`` when
    states were given.
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
    _gradient_arguments = (("initial_state", None),)  # see Layer._with_gradient_arguments

    def __init__(self, layer, merge_mode="concat", backward_layer=None, **kwargs):
        if not isinstance(layer, _RNN):
            raise TypeError(f"Bidirectional: expects a SimpleRNN, GRU or LSTM layer, got {type(layer).__name__}")
        kwargs.setdefault("dtype", layer.dtype_policy.name)
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

    def reset_state(self, states=None):
        """Stateful directions start the next call from zeros (or from `states`, forward's then backward's)."""
        n = len(self.forward_layer.state_size)
        if states is not None and (not isinstance(states, (list, tuple)) or len(states) != 2 * n):
            raise ValueError(f"Layer '{self.name}': reset_state takes None or a list of {2 * n} states (the forward "
                             f"direction's, then the backward's), got {states!r:.80}")
        self.forward_layer.reset_state(None if states is None else states[:n])
        self.backward_layer.reset_state(None if states is None else states[n:])

    reset_states = reset_state

    @property
    def quantization_mode(self):
        return self.forward_layer.quantization_mode

    @property
    def directions(self):
        """[(forward layer, False), (backward layer, True)]: each direction's layer and whether it reads
        the sequence in reverse, as `_stack_forward` (and the ONNX export) runs them."""
        return [(self.forward_layer, False), (self.backward_layer, True)]

    def build(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, features) with known features, "
                             f"got shape {input_shape}")
        for prefix, layer in (("forward_", self.forward_layer), ("backward_", self.backward_layer)):
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

    def _unmerge(self, d, outputs, shape):
        """Gradients of the two directions' outputs (each of `shape`) from that of the merged output;
        `outputs` are the two outputs, kept by training calls with merge_mode "mul"."""
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
        yf, yb = outputs
        return [d * yb, d * yf]  # mul

    def forward(self, inputs, training=False, mask=None, initial_state=None, lengths=None):
        fwd, bwd = self.forward_layer, self.backward_layer
        x, states = _split_states(self, inputs, initial_state)
        x = self._float_input(x, "inputs", ndim=3, last_dim=fwd._input_dim())
        B, T = x.shape[:2]
        step_mask = _step_mask(self, mask, lengths, B, T)
        n = len(fwd.state_size)
        if states is not None and len(states) != 2 * n:
            raise ValueError(f"Layer '{self.name}': expected {2 * n} initial states (forward then backward), got "
                             f"{len(states)}")
        initial_states = [fwd._initial_states(fwd._carried_or(None if states is None else states[:n], B), B),
                          bwd._initial_states(bwd._carried_or(None if states is None else states[n:], B), B)]
        top_seqs, finals, level_caches = _stack_forward(self.directions, x, step_mask, initial_states, training,
                                                        self.return_sequences)
        fwd._carry(*finals[0])
        bwd._carry(*finals[1])
        yf, yb = top_seqs if self.return_sequences else (finals[0][0][-1], finals[1][0][-1])
        merged = self._merge(yf, yb)
        out = merged if isinstance(merged, list) else [merged]
        if self.return_state:
            out += fwd._final_states(*finals[0]) + bwd._final_states(*finals[1])
        cache = None
        if training:
            cache = _SequenceCache(level_caches, B, T, states is not None,
                                   (yf, yb) if self.merge_mode == "mul" else None)
        return (out if len(out) > 1 else out[0]), cache

    def backprop(self, cache, dy, need_dx=True):
        fwd, bwd = self.forward_layer, self.backward_layer
        B, T, H = cache.batch, cache.steps, fwd.units
        n = len(fwd.state_size)
        n_merged = 2 if self.merge_mode is None else 1
        grads = _gradient_list(self, dy, n_merged + (2 * n if self.return_state else 0))
        d_outs = self._unmerge(grads[:2] if self.merge_mode is None else grads[0], cache.outputs,
                               (B, T, H) if self.return_sequences else (B, H))
        d_states = _state_grads(self, grads[n_merged:], fwd._state_shape(B), first_index=n_merged)
        d_seqs, dhs, dcs = zip(*(_direction_grads(layer, d_out, d_states[d * n:(d + 1) * n], self.return_sequences)
                                 for d, (layer, d_out) in enumerate(zip((fwd, bwd), d_outs))))
        dx, dh0s, dc0s = _stack_backward(self.directions, cache.levels, d_seqs, dhs, dcs,
                                         need_dx)
        if not cache.had_states:
            return dx
        return [dx] + fwd._final_states(dh0s[0], dc0s[0]) + bwd._final_states(dh0s[1], dc0s[1])

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
                "layer": {"class_name": Layer.registry.name_of(type(self.forward_layer)), "config": self.forward_layer.get_config()},
                "backward_layer": {"class_name": Layer.registry.name_of(type(self.backward_layer)),
                                   "config": self.backward_layer.get_config()}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        spec, back = config.pop("layer"), config.pop("backward_layer", None)
        layer = Layer.registry[spec["class_name"]].from_config(spec["config"])
        if back is not None:
            back = Layer.registry[back["class_name"]].from_config(back["config"])
        return cls(layer, backward_layer=back, **config)
