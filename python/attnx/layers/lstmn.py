"""The Long Short-Term Memory-Network (Cheng, Dong & Lapata 2016): an LSTM that keeps a memory tape
of all its earlier hidden and cell states and reads it at every step through attention over the
earlier steps only (the paper's intra-attention, the tutorials' first definition of self-attention).

Step t, over the earlier real steps j (``cpp/include/attnx/lstmn.hpp`` has the equations above its
loops)::

    alpha_t   = softmax_j(v . tanh(h_j Wm + x_t Wa + ba + h~_{t-1} Ws))
    h~_t, c~_t = sum_j alpha_tj h_j, sum_j alpha_tj c_j       (the initial state on an empty tape)
    [i f g o] = [sig sig tanh sig](x_t W + b + h~_t U),  c_t = f c~_t + i g,  h_t = o tanh(c_t)

Forward and backward over the tape run in C++. The layer is a recurrent layer like `LSTM`: masks
and ``lengths``, ``return_sequences``, ``return_state``, ``go_backwards``, ``num_layers`` (stacked as
PyTorch stacks), inside `Bidirectional`; plus ``return_attention_scores``.
"""
from typing import NamedTuple

import numpy as np

from .. import initializers, kernels
from .recurrent import (_RNN, _RNN_DOC, _SequenceCache, _split_states, _stack_forward, _step_mask,
                        level_suffix)


class _TapeCache(NamedTuple):
    """One level's call in one direction: what `LSTMN._level_backward` needs (the kernel's cache
    only in training) and its attention weights."""
    x: np.ndarray  # the level's input, after input dropout
    mask: np.ndarray  # (B, T) bool step mask, or None
    input_keep: np.ndarray  # input dropout's scaled keep mask, or None
    kernel_cache: tuple  # what lstmn_forward returned for lstmn_backward, or None outside training
    reverse: bool
    weights: np.ndarray  # (B, T, T) attention over the earlier steps


_ATTENTION_WEIGHTS = ("memory_kernel", "attention_input_kernel", "summary_kernel", "attention_bias",
                      "attention_vector")


class LSTMN(_RNN):
    __doc__ = ("Long Short-Term Memory-Network (Cheng et al. 2016): an LSTM whose carried state is a memory tape\n"
               "of every earlier (h, c), read each step through attention over the earlier steps.\n"
               "Gates (i, f, g, o) as `LSTM`. Weights per level: kernel, recurrent_kernel, bias (LSTM's), then\n"
               "memory_kernel (units, A), attention_input_kernel (features, A), summary_kernel (units, A),\n"
               "attention_bias (A,), attention_vector (A,) with A = attention_units (default units).\n"
               "\n    Extra args:\n"
               "        attention_units: size A of the attention's hidden layer (default: units).\n"
               "        return_attention_scores: also return the top level's attention (batch, steps, steps),\n"
               "            row t over the earlier steps (lower-triangular; upper with go_backwards), rows of\n"
               "            real steps after the first summing to 1, padded rows and columns zero. Outputs\n"
               "            are then ``[output, (states...,) scores]``; the scores take no gradient.\n"
               "    recurrent_dropout is not supported (the state read is an attention over the tape).\n"
               + _RNN_DOC)
    _cell, _gates, _has_cell_state = "lstm", 4, True
    _bf16_products = False  # its levels run lstmn.hpp in float32 (attnx.mixed_precision)

    def __init__(self, units, attention_units=None, return_attention_scores=False, unit_forget_bias=True,
                 recurrent_dropout=0.0, **kwargs):
        if float(recurrent_dropout) != 0.0:
            raise ValueError(f"LSTMN: recurrent_dropout is not supported, got {recurrent_dropout}")
        super().__init__(units, unit_forget_bias=unit_forget_bias, **kwargs)
        if attention_units is not None and int(attention_units) <= 0:
            raise ValueError(f"LSTMN: attention_units must be positive, got {attention_units}")
        self.attention_units = self.units if attention_units is None else int(attention_units)
        self.return_attention_scores = bool(return_attention_scores)

    # --------------------------------------------------------------------- weights
    def _build_levels(self, input_dim, stacked_input_dim):
        super()._build_levels(input_dim, stacked_input_dim)
        A = self.attention_units
        for level in range(self.num_layers):
            sfx = level_suffix(level)
            in_dim = input_dim if level == 0 else stacked_input_dim
            self.add_weight("memory_kernel" + sfx, (self.units, A), self.kernel_initializer, self.kernel_regularizer)
            self.add_weight("attention_input_kernel" + sfx, (in_dim, A), self.kernel_initializer,
                            self.kernel_regularizer)
            self.add_weight("summary_kernel" + sfx, (self.units, A), self.recurrent_initializer,
                            self.recurrent_regularizer)
            if self.use_bias:
                self.add_weight("attention_bias" + sfx, (A,), self.bias_initializer, self.bias_regularizer)
            self.add_weight("attention_vector" + sfx, (A,), initializers.get("glorot_uniform"))

    def quantizable_weights(self):
        return {}

    def quantize_refusal(self):
        return ("its gates and its attention over the memory tape run in one float32 kernel (lstmn.hpp) that has "
                "no int8 form")

    def _tensors(self, tensors, level):
        """The kernel arguments of level `level` from `tensors` (params or grads), by the kernel's names."""
        sfx = level_suffix(level)
        return {name: tensors.get(name + sfx) for name in ("kernel", "recurrent_kernel", "bias") + _ATTENTION_WEIGHTS}

    # ----------------------------------------------------------- one level of recurrence
    def _level_forward(self, level, x, mask, h0, c0, reverse, training, input_keep=None, recurrent_keep=None,
                       need_y=True):
        """As `_RNN._level_forward`; the level's cache always holds its attention weights (its kernel
        cache only in training)."""
        if input_keep is not None:
            x = x * input_keep
        y, h, c, weights, kernel_cache = kernels.lstmn_forward(
            x=x, **self._tensors(self.params, level), h0=h0, c0=c0, mask=mask, reverse=reverse, training=training)
        return y, h, c, _TapeCache(x, mask, input_keep, kernel_cache, reverse, weights)

    def _level_backward(self, level, cache, dy, dh, dc, need_dx=True):
        weights = self._tensors(self.params, level)
        del weights["bias"], weights["attention_bias"]
        grads = {"d" + name: g for name, g in self._tensors(self.grads, level).items()}
        dx, dh0, dc0 = kernels.lstmn_backward(
            x=cache.x, **weights, cache=cache.kernel_cache, mask=cache.mask, dy=dy, dh=dh, dc=dc, **grads,
            reverse=cache.reverse, need_dx=need_dx)
        if dx is not None and cache.input_keep is not None:
            dx *= cache.input_keep
        return dx, dh0, dc0

    # ----------------------------------------------------------------------- forward
    def forward(self, inputs, training=False, mask=None, initial_state=None, lengths=None):
        x, states = _split_states(self, inputs, initial_state)
        x = self._float_input(x, "inputs", ndim=3, last_dim=self._input_dim())
        B, T = x.shape[:2]
        step_mask = _step_mask(self, mask, lengths, B, T)
        top_seqs, finals, level_caches = _stack_forward([(self, self.go_backwards)], x, step_mask,
                                                        [self._initial_states(states, B)], training,
                                                        self.return_sequences)
        hs, cs = finals[0]
        scores = level_caches[-1][0].weights
        out, carried_from = self._sequence_output(top_seqs[0], hs, step_mask)
        outputs = [out] + (self._final_states(hs, cs) if self.return_state else []) + \
            ([scores] if self.return_attention_scores else [])
        cache = _SequenceCache(level_caches, B, T, states is not None, carried_from=carried_from) if training else None
        return (outputs if len(outputs) > 1 else out), cache

    def backprop(self, cache, dy, need_dx=True):
        if self.return_attention_scores:  # the scores are the last output and take no gradient
            dy = list(dy)
            if len(dy) != 2 + (len(self.state_size) if self.return_state else 0):
                raise ValueError(f"Layer '{self.name}': backprop expected one gradient per output, got {len(dy)}")
            dy = dy[:-1] if len(dy) > 2 else dy[0]
        return super().backprop(cache, dy, need_dx)

    def compute_output_shape(self, input_shape):
        out = super().compute_output_shape(input_shape)
        if not self.return_attention_scores:
            return out
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        scores = (input_shape[0], input_shape[1], input_shape[1])
        return (out if isinstance(out, list) else [out]) + [scores]

    def get_config(self):
        return {**super().get_config(), "attention_units": self.attention_units,
                "return_attention_scores": self.return_attention_scores}

