"""int8 inference: ``model.quantize("int8")`` (Keras 3's name).

A quantized layer keeps its kernels as int8 with one float32 scale per output unit (symmetric:
``scale = max|w| / 127``, ``q = round(w / scale)``; an Embedding's table per row), quantizes its
inputs per row at run time the same way, and multiplies on int8 register tiles with int32
accumulation (``cpp/include/attnx/quantized.hpp``: AVX-512 VNNI, AVX2 or baseline, the same
integers on each); biases, activations, the recurrent gate math and the state stay float32.

Quantizable: Dense, Embedding, SimpleRNN / GRU / LSTM (every level, and their cells), Bidirectional.
The layer's weights become ``kernel`` (int8) followed by ``kernel_scale`` (float32), and so on
for ``recurrent_kernel`` and ``embeddings``; its config gains ``"quantization_mode": "int8"``, so
``model.save`` / ``attnx.load_model`` keep it quantized. A quantized layer runs inference only.
The layers name their kind in ``_quantize_kind`` (this module imports no layer classes).
"""
import contextlib
from collections import OrderedDict

import numpy as np

from . import kernels
from .layers import base

MODES = ("int8",)

# The weights each kind of layer quantizes (per output unit), and whether per row of the stored
# matrix (Embedding: one scale per token) instead of per column
_TARGETS = {"dense": (("kernel",), False), "embedding": (("embeddings",), True)}

# How much an int8 layer's output may differ from its float32 output, relative to the output's
# largest magnitude (the tests hold every quantizable layer to it): two roundings of at most half a
# step of 1/127 each, over products that partly cancel.
ERROR_BOUND = 0.03


def check_mode(owner, mode):
    """`mode` if it names a quantization mode (None: not quantized); ValueError naming `owner` otherwise."""
    if mode is None or mode in MODES:
        return mode
    raise ValueError(f"{owner}: unknown quantization mode {mode!r}; expected one of {MODES}")


def config(layer):
    """The config entry of a quantized layer ({} for a float one)."""
    return {"quantization_mode": layer.quantization_mode} if layer.quantization_mode else {}


def inference_only(layer, training):
    """Raises when a quantized layer is asked to train."""
    if training:
        raise ValueError(f"Layer '{layer.name}': is quantized ({layer.quantization_mode}) and runs inference only; "
                         "train the float model, then call model.quantize")


def quantize_columns(w):
    """(q int8, scale float32) of a float matrix (K, N) per column."""
    q, scale = kernels.quantize_rows(x=np.ascontiguousarray(np.asarray(w, np.float32).T))
    return np.ascontiguousarray(q.T), scale


def _weight_names(layer):
    kind = layer._quantize_kind
    if kind == "recurrent":
        return [n + ("" if level == 0 else f"_{level}") for level in range(layer.num_layers)
                for n in ("kernel", "recurrent_kernel")], False
    return _TARGETS[kind]


def quantize_layer(layer, mode="int8"):
    """Quantizes a built layer's weights in place (a Bidirectional: both directions)."""
    check_mode(f"Layer '{layer.name}'", mode)
    if layer._quantize_kind == "bidirectional":
        for sub in (layer.forward_layer, layer.backward_layer):
            if not sub.quantization_mode:
                quantize_layer(sub, mode)
        C = layer.forward_layer.params["kernel"].shape[0]
        layer.params.clear(), layer.grads.clear(), layer._regularizers.clear()
        layer.build((None, None, C))  # adopts the sublayers' weights again
        return
    names, per_row = _weight_names(layer)
    params, grads = OrderedDict(), OrderedDict()
    for name, p in layer.params.items():
        if name not in names:
            params[name], grads[name] = p, layer.grads[name]
            continue
        if per_row:
            q, scale = kernels.quantize_rows(x=np.ascontiguousarray(p, np.float32))
        else:
            q, scale = quantize_columns(p)
        params[name], params[name + "_scale"] = q, scale
        grads[name], grads[name + "_scale"] = np.zeros(q.shape, np.float32), np.zeros(scale.shape, np.float32)
    layer.params.clear(), layer.grads.clear()
    layer.params.update(params), layer.grads.update(grads)
    layer._regularizers.clear()  # of float weights no longer there
    layer.quantization_mode = mode


@contextlib.contextmanager
def building(layer):
    """Around the weight creation of a layer's build: a quantized layer (config "quantization_mode")
    creates float weights, then quantizes them on leaving. Loading (`base.weight_budget`), the
    float weights may take 4x the bytes the file holds (4 bytes per int8 value); the budget is then
    charged what the layer keeps."""
    budget = base._weight_budget.get()
    if not layer.quantization_mode:
        yield
        return
    if budget is None:
        yield
        quantize_layer(layer, layer.quantization_mode)
        return
    before = budget["bytes"]
    budget["bytes"] = 4 * before
    try:
        yield
    finally:
        budget["bytes"] = before
    quantize_layer(layer, layer.quantization_mode)
    kept = sum(p.nbytes for p in layer.params.values())
    if kept > before:
        raise ValueError(f"{budget['source']}: layer '{layer.name}' would keep {kept} bytes of weights; the file "
                         f"holds {before} bytes of weights not yet created")
    budget["bytes"] = before - kept


def _quantizable(layer):
    return getattr(layer, "_quantize_kind", None) is not None


def _layers_of(model):
    """Every layer of a model, nested models and composite layers' sublayers included."""
    seen, order = set(), []

    def visit(layer):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        order.append(layer)
        if _quantizable(layer):
            return  # a Bidirectional quantizes its own directions
        named = getattr(layer, "_named_layers", None)
        for _, sub in (named() if callable(named) else []):
            visit(sub)
        for value in vars(layer).values():
            if hasattr(value, "_quantize_kind") and hasattr(value, "params"):
                visit(value)

    named = model._named_layers()
    for _, layer in named:
        visit(layer)
    return order


def quantize_model(model, mode):
    """`Model.quantize`: quantizes every quantizable layer of a built model in place."""
    check_mode(f"{type(model).__name__}.quantize", mode)
    if not model.built:
        raise ValueError(f"{type(model).__name__}.quantize: the model is not built; build it (call it on a batch, "
                         "fit it, or give it an input shape) before quantizing")
    layers = [l for l in _layers_of(model) if _quantizable(l) and not l.quantization_mode]
    for layer in layers:
        quantize_layer(layer, mode)
    return model


def _float32(x):
    return np.require(x, np.float32, "CA")


def dense_forward(layer, x2, training):
    """A quantized Dense layer's output for x2 (rows, in_features)."""
    inference_only(layer, training)
    p = layer.params
    return kernels.dense_forward_int8(x=_float32(x2), kernel=p["kernel"], kernel_scale=p["kernel_scale"],
                                    bias=p.get("bias"), activation=layer.activation)


def embedding_forward(layer, ids, training):
    """A quantized Embedding's vectors for checked int64 ids."""
    inference_only(layer, training)
    return kernels.embedding_forward_int8(ids=ids, table=layer.params["embeddings"],
                                        scale=layer.params["embeddings_scale"])


def rnn_level_forward(layer, level, x, mask, h0, c0, reverse, training, need_y):
    """A quantized recurrent layer's level `level` over x (B, T, C): (y or None, h, c or None, None)."""
    inference_only(layer, training)
    sfx = "" if level == 0 else f"_{level}"
    p = layer.params
    bias, recurrent_bias = layer._biases(p, level)
    y, h, c = kernels.rnn_forward_int8(
        cell=layer._cell, x=_float32(x), kernel=p["kernel" + sfx], kernel_scale=p["kernel" + sfx + "_scale"],
        recurrent_kernel=p["recurrent_kernel" + sfx], recurrent_kernel_scale=p["recurrent_kernel" + sfx + "_scale"],
        bias=None if bias is None else _float32(bias),
        recurrent_bias=None if recurrent_bias is None else _float32(recurrent_bias),
        h0=None if h0 is None else _float32(h0), c0=None if c0 is None else _float32(c0), mask=mask,
        reverse=reverse, reset_after=layer.reset_after, activation=layer.activation,
        recurrent_activation=layer.recurrent_activation, return_sequences=need_y)
    return y, h, c, None
