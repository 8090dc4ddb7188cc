"""PyTorch converters of the recurrent layers: torch.nn.RNN / GRU / LSTM <-> SimpleRNN / GRU / LSTM,
and their ``bidirectional=True`` form <-> Bidirectional.

torch names the weights of level l ``weight_ih_l{l}``, ``weight_hh_l{l}``, ``bias_ih_l{l}``,
``bias_hh_l{l}`` (suffix ``_reverse`` for the backward direction) and stores kernels transposed;
attnx's layout is in `attnx.layers.recurrent`.
"""
import numpy as np

from ..layers.recurrent import GRU, LSTM, Bidirectional, SimpleRNN, level_suffix
from .registry import register_from_torch, register_to_torch, set_torch_params

_LAYER_OF_TORCH = {"RNN": SimpleRNN, "GRU": GRU, "LSTM": LSTM}
_TORCH_OF_CELL = {"simple": "RNN", "gru": "GRU", "lstm": "LSTM"}


def _torch_level_to_attnx(kind, tensors, torch_suffix, use_bias, grads):
    """One level and direction of torch tensors -> {kernel, recurrent_kernel, bias} (attnx layout).
    PyTorch adds b_ih and b_hh; Keras' single bias for SimpleRNN and LSTM is their sum, so its
    gradient is that of either one (both equal)."""
    out = {"kernel": tensors["weight_ih" + torch_suffix].T,
           "recurrent_kernel": tensors["weight_hh" + torch_suffix].T}
    if use_bias:
        b_ih, b_hh = tensors["bias_ih" + torch_suffix], tensors["bias_hh" + torch_suffix]
        out["bias"] = np.stack([b_ih, b_hh]) if kind == "GRU" else b_ih if grads else b_ih + b_hh
    return out


def _rnn_from_torch(module, dtype):
    kind = type(module).__name__
    if getattr(module, "proj_size", 0):
        raise ValueError("from_torch: LSTM with proj_size is not supported")
    extra = {"activation": module.nonlinearity} if kind == "RNN" else {}
    layer = _LAYER_OF_TORCH[kind](module.hidden_size, use_bias=module.bias, num_layers=module.num_layers,
                                  stack_dropout=module.dropout, return_sequences=True, return_state=True,
                                  dtype=dtype, **extra)
    directions = [("", "")]  # (attnx weight prefix, torch weight suffix)
    if module.bidirectional:
        layer = Bidirectional(layer)
        directions = [("forward_", ""), ("backward_", "_reverse")]
    layer.build((None, None, module.input_size))
    layer.built = True

    def to_attnx(tensors, grads=False):
        out = {}
        for prefix, torch_direction in directions:
            for level in range(module.num_layers):
                level_weights = _torch_level_to_attnx(kind, tensors, f"_l{level}{torch_direction}", module.bias,
                                                      grads)
                for name, value in level_weights.items():
                    out[prefix + name + level_suffix(level)] = value
        return out
    return layer, to_attnx


for _kind in _LAYER_OF_TORCH:
    register_from_torch(_kind)(_rnn_from_torch)


@register_to_torch(SimpleRNN)
@register_to_torch(GRU)
@register_to_torch(LSTM)
@register_to_torch(Bidirectional)
def _rnn_to_torch(layer):
    import torch
    bidirectional = isinstance(layer, Bidirectional)
    base = layer.forward_layer if bidirectional else layer
    kind = _TORCH_OF_CELL[base._cell]
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
    module = getattr(torch.nn, kind)(base._input_dim(), base.units, num_layers=base.num_layers, bias=base.use_bias,
                                     batch_first=True, dropout=base.stack_dropout, bidirectional=bidirectional,
                                     dtype=getattr(torch, layer.dtype.name), **extra)
    directions = [("", layer.forward_layer), ("_reverse", layer.backward_layer)] if bidirectional else [("", layer)]
    tensors = {}
    for torch_direction, sub in directions:
        for level in range(base.num_layers):
            sfx, torch_sfx = level_suffix(level), f"_l{level}{torch_direction}"
            tensors["weight_ih" + torch_sfx] = sub.params["kernel" + sfx].T
            tensors["weight_hh" + torch_sfx] = sub.params["recurrent_kernel" + sfx].T
            if base.use_bias:
                b_in, b_rec = sub._biases(sub.params, level)
                tensors["bias_ih" + torch_sfx] = b_in
                # attnx's single bias (SimpleRNN, LSTM) is torch's b_ih + b_hh: all of it goes to b_ih
                tensors["bias_hh" + torch_sfx] = np.zeros_like(b_in) if b_rec is None else b_rec
    return set_torch_params(module, tensors)
