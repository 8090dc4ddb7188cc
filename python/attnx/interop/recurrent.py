"""Converters of the recurrent layers. PyTorch: torch.nn.RNN / GRU / LSTM <-> SimpleRNN / GRU / LSTM,
and their ``bidirectional=True`` form <-> Bidirectional. Keras: SimpleRNN, GRU, LSTM, Bidirectional
both ways (attnx's stacked ``num_layers`` become that many Keras layers).

torch names the weights of level l ``weight_ih_l{l}``, ``weight_hh_l{l}``, ``bias_ih_l{l}``,
``bias_hh_l{l}`` (suffix ``_reverse`` for the backward direction) and stores kernels transposed;
attnx's layout is in `attnx.layers.recurrent`.
"""
import numpy as np

from .. import regularizers
from ..layers.recurrent import GRU, LSTM, Bidirectional, SimpleRNN, swap_first_two_gates, level_suffix
from .registry import (check_keras_options, keras_kwargs, keras_layer_kwargs, keras_regularizer, register_from_keras,
                       register_from_torch, register_to_keras, register_to_torch, set_torch_params)

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
                                  zero_output_for_mask=True, dtype=dtype, **extra)  # packed sequences: zeros
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
    kind = _TORCH_OF_CELL[base.cell_kind]
    if base.cell_kind == "gru" and not base.reset_after:
        raise ValueError(f"to_torch: GRU '{base.name}' has reset_after=False; torch.nn.GRU computes the "
                         "reset_after=True form")
    if base.cell_kind != "simple" and (base.activation, base.recurrent_activation) != ("tanh", "sigmoid"):
        raise ValueError(f"to_torch: '{base.name}' uses activations ({base.activation}, "
                         f"{base.recurrent_activation}); torch.nn.{kind} has (tanh, sigmoid)")
    if base.cell_kind == "simple" and base.activation not in ("tanh", "relu"):
        raise ValueError(f"to_torch: SimpleRNN '{base.name}' has activation {base.activation!r}; torch.nn.RNN "
                         "supports tanh and relu")
    extra = {"nonlinearity": base.activation} if kind == "RNN" else {}
    module = getattr(torch.nn, kind)(base.input_dim, base.units, num_layers=base.num_layers, bias=base.use_bias,
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
                b_in, b_rec = sub.level_biases(level)
                tensors["bias_ih" + torch_sfx] = b_in
                # attnx's single bias (SimpleRNN, LSTM) is torch's b_ih + b_hh: all of it goes to b_ih
                tensors["bias_hh" + torch_sfx] = np.zeros_like(b_in) if b_rec is None else b_rec
    return set_torch_params(module, tensors)


# ----------------------------------------------------------------------------- Keras
# Keras keeps a recurrent layer's weights [kernel, recurrent_kernel, bias] in its cell, attnx's
# layout, except that Keras orders GRU gates (z, r, h) and attnx (r, z, n). Keras' GRU default
# reset_after=True is attnx's reset_after=True form: bias (2, 3 * units) = [input bias, recurrent bias].
_KERAS_RNN = {"SimpleRNN": SimpleRNN, "GRU": GRU, "LSTM": LSTM}
_REGULARIZERS = ("kernel_regularizer", "recurrent_regularizer", "bias_regularizer")


def _keras_gate_order(layer, arrays):
    """attnx <-> Keras weights of one level (the GRU swap is its own inverse)."""
    return [swap_first_two_gates(w, layer.units) for w in arrays] if layer.cell_kind == "gru" else list(arrays)


def _rnn_layer_from_keras(class_name, config):
    check_keras_options(class_name, config, stateful=False)
    kwargs = {"activation": config.get("activation", "tanh"), "use_bias": config.get("use_bias", True),
              "dropout": config.get("dropout", 0.0), "recurrent_dropout": config.get("recurrent_dropout", 0.0),
              "return_sequences": config.get("return_sequences", False),
              "return_state": config.get("return_state", False), "go_backwards": config.get("go_backwards", False),
              "zero_output_for_mask": config.get("zero_output_for_mask", False),
              **{k: regularizers.get(config.get(k)) for k in _REGULARIZERS}, **keras_layer_kwargs(config)}
    if class_name != "SimpleRNN":
        kwargs["recurrent_activation"] = config.get("recurrent_activation", "sigmoid")
    if class_name == "GRU":
        kwargs["reset_after"] = config.get("reset_after", True)
    if class_name == "LSTM":
        kwargs["unit_forget_bias"] = config.get("unit_forget_bias", True)
    return _KERAS_RNN[class_name](config["units"], **kwargs)


@register_from_keras("SimpleRNN", "GRU", "LSTM")
def _rnn_from_keras(class_name, config, weights):
    layer = _rnn_layer_from_keras(class_name, config)
    return layer, lambda: _keras_gate_order(layer, weights.read("cell"))


@register_from_keras("Bidirectional")
def _bidirectional_from_keras(class_name, config, weights):
    sub_layers = []
    for key in ("layer", "backward_layer"):
        spec = config.get(key) or config["layer"]
        if spec["class_name"] not in _KERAS_RNN:
            raise ValueError(f"Bidirectional '{config.get('name')}' wraps a {spec['class_name']}; attnx wraps "
                             "SimpleRNN, GRU and LSTM")
        sub = _rnn_layer_from_keras(spec["class_name"], {**spec["config"], "go_backwards": False})
        sub_layers.append(sub)
    layer = Bidirectional(sub_layers[0], merge_mode=config.get("merge_mode", "concat"), backward_layer=sub_layers[1],
                          **{k: v for k, v in keras_layer_kwargs(config).items() if k != "dtype"})

    def load():
        return [w for sub, group in zip(sub_layers, ("forward_layer/cell", "backward_layer/cell"))
                for w in _keras_gate_order(sub, weights.read(group))]
    return layer, load


def _keras_rnn_chain(layer, keras, wrap=None):
    """The Keras layers of an attnx recurrent layer, one per level (Keras stacks layers, not levels),
    each wrapped by `wrap` (Bidirectional) when given, with their weights."""
    base = layer.forward_layer if wrap else layer
    directions = [layer.forward_layer, layer.backward_layer] if wrap else [layer]
    if base.num_layers > 1 and base.return_state:
        raise ValueError(f"to_keras: '{layer.name}' stacks {base.num_layers} levels and returns states; Keras' "
                         "stacked layers return the last level's states only")
    chain = []
    for level in range(base.num_layers):
        last = level == base.num_layers - 1
        options = {"activation": base.activation, "use_bias": base.use_bias, "dropout": base.dropout,
                   "recurrent_dropout": base.recurrent_dropout,
                   "return_sequences": base.return_sequences or not last, "return_state": base.return_state,
                   "go_backwards": base.go_backwards and not wrap,
                   # levels below the top feed a masked level above: zeros or not, their padded outputs are
                   # skipped. Keras zeroes its last output too when it zeroes masked ones: only with sequences.
                   "zero_output_for_mask": not last or base.zero_output_for_mask and base.return_sequences,
                   **{k: keras_regularizer(keras, getattr(base, k)) for k in _REGULARIZERS}}
        if base.cell_kind != "simple":
            options["recurrent_activation"] = base.recurrent_activation
        if base.cell_kind == "gru":
            options["reset_after"] = base.reset_after
        kwargs = keras_kwargs(layer)
        name = kwargs.pop("name") + ("" if base.num_layers == 1 else f"_level{level}")
        keras_class = getattr(keras.layers, type(base).__name__)
        weights = []
        for direction in directions:
            sfx = level_suffix(level)
            arrays = [direction.params[k + sfx] for k in ("kernel", "recurrent_kernel", "bias")
                      if k + sfx in direction.params]
            weights += _keras_gate_order(base, arrays)
        if wrap:
            # attnx feeds the next level both directions concatenated, whatever the final merge
            keras_layer = keras.layers.Bidirectional(keras_class(base.units, **options),
                                                     merge_mode=layer.merge_mode if last else "concat", name=name,
                                                     **kwargs)
        else:
            keras_layer = keras_class(base.units, name=name, **options, **kwargs)
        chain.append((keras_layer, weights))
        if not last and base.stack_dropout:
            chain.append((keras.layers.Dropout(base.stack_dropout, name=f"{name}_dropout"), []))
    return chain


@register_to_keras(SimpleRNN, GRU, LSTM)
def _rnn_to_keras(layer, keras):
    return _keras_rnn_chain(layer, keras)


@register_to_keras(Bidirectional)
def _bidirectional_to_keras(layer, keras):
    return _keras_rnn_chain(layer, keras, wrap=True)
