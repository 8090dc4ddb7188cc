"""The compiled inference plan (ARCHITECTURE.md, "Models and training"): a functional model's inference
call as one C++ call (`cpp/include/attnx/plan.hpp`, GIL released) over buffers allocated once.

`run(model, x)` looks up the plan of x's signature (shape and dtype; a few kept per model), building it
on first use from each layer's public spec and weights through `LOWERINGS`, a registry keyed by layer
class: one function per class that adds the kernel calls that layer's forward makes. The plan points
into the weight arrays, which optimizer steps, `set_weights`, loaders and users' numpy writes change in
place (the copy of a recurrent kernel it packs and keeps between runs is remade whenever the kernel's
bytes differ from those it was packed from); a plan whose layer replaced an array (`quantize`) is
rebuilt. A quantized (int8) layer's lowering adds the int8 kernels its eager forward calls on the same
packed kernels (`attnx.quantization.packed`), so the plan gives its outputs bit for bit; the plan is
rebuilt when a kernel is packed anew (`set_weights` and loaders unpack it). Anything the plan does
not hold, a layer class without a lowering, a configuration its lowering declines, a mask given to the
call, a non-float32 policy, an input the eager path would reject, makes `run` return None, and the caller takes the eager path, which
computes the same outputs (or raises its own error).
"""
import math
from typing import NamedTuple

import numpy as np

from .. import kernels, quantization
from ..layers.attention_pooling import AttentionPooling
from ..layers.core import Activation, Dense, Dropout, Embedding, GlobalAveragePooling1D, SpatialDropout1D
from ..layers.feed_forward import FeedForward
from ..layers.normalization import LayerNormalization
from ..layers.positions import PositionalEncoding, PositionEmbedding
from ..layers.recurrent import GRU, LSTM, Bidirectional, SimpleRNN
from ..layers.scores import dot_product_scale
from ..layers.transformer import TransformerEncoder, TransformerEncoderLayer

MAX_PLANS = 4  # signatures kept per model (the oldest goes first)
# the most memory the input projection tables of one recurrent layer over an embedding take (V x G
# floats per direction; made per row as ids are read); a larger one projects the gathered rows per call
EMBEDDED_PROJECTION_BYTES = 64 << 20
# the most bytes of table rows (B x T x G floats) a call takes the table for: the steps read each row in place
# (the next step's prefetched), the fused product reads x_t instead and multiplies C more rows of W (sentiment
# LSTM(100), T=32, 1 thread, Zen 5, shared host: table / fused 0.90 at batch 16, 0.93 at 32, 0.94 at 64,
# 0.98 at 128, 6.5 MB)
EMBEDDED_GATHER_BYTES = 8 << 20


class Unsupported(Exception):
    """What a lowering raises for a layer configuration the plan does not hold."""


class _Value(NamedTuple):
    """A tensor of the plan: its float slot (0: the model's input), shape, mask slot (-1: none), whether
    it is the input's token ids, and the embedding whose rows of those ids it is (`_EmbeddedRows`, its
    slot -1 until a layer that cannot take the ids and the table asks for the rows)."""
    slot: int
    shape: tuple
    mask: int = -1
    ids: bool = False
    rows_of: object = None


class _EmbeddedRows:
    """An embedding's rows of the input's ids, gathered into a slot only when a layer reads them: a
    float recurrent layer takes the ids and a float table instead (its input projection becomes a table
    over the vocabulary, `InferencePlan.rnn(embedding=...)`), and Dropout passes them on. An int8 table
    has its per-row `scale`."""

    def __init__(self, table, scale=None):
        self.table, self.scale, self.slot = table, scale, -1


class _Builder:
    """Adds a model's ops to one `kernels.inference_plan`, recording the weight arrays it points into
    (the plan reads their values at every run: it repacks its copy of a recurrent kernel whose bytes
    changed, so any write in place is seen; a replaced array rebuilds the plan)."""

    def __init__(self, shape, token_ids):
        self.plan = kernels.inference_plan(input_shape=list(shape), token_ids=token_ids)
        self.weights = []  # (params dict, name, array): the plan is current while each entry is its dict's
        self.packed = []  # (kernel, key, packed kernel): current while quantization still holds it packed

    def slot(self, shape):
        return self.plan.add_slot(size=math.prod(shape))

    def rows(self, value):
        """value with its embedding rows in a slot (the embedding op added at the first layer reading them)."""
        rows = value.rows_of
        if rows is None:
            return value
        if rows.slot < 0:
            rows.slot = self.slot(value.shape)
            if rows.scale is None:
                self.plan.embedding(out=rows.slot, table=rows.table)
            else:
                self.plan.embedding_int8(out=rows.slot, table=rows.table, scale=rows.scale)
        return value._replace(slot=rows.slot, rows_of=None)

    def weight(self, layer, name, required=True, dtype=np.float32):
        """Layer `layer`'s weight `name` (None when absent and not `required`)."""
        array = layer.params.get(name)
        if array is None:
            if required:
                raise Unsupported(f"'{layer.name}' has no weight {name}")
            return None
        if array.dtype != dtype or not array.flags.c_contiguous:
            raise Unsupported(f"'{layer.name}': {name} is {array.dtype}")
        self.weights.append((layer.params, name, array))
        return array

    def int8(self, layer, name, split=0):
        """Quantized `layer`'s int8 weight `name` packed as its eager forward takes it
        (`quantization.packed`), the kernel and its scale recorded."""
        kernel = self.weight(layer, name, dtype=np.int8)
        self.weight(layer, name + "_scale")
        packed = quantization.packed(layer, name, split)
        self.packed.append((kernel, split, packed))
        return packed

    def int8_projections(self, attention, names):
        """MultiHeadAttention `attention`'s projections `names` packed side by side, as its eager
        self-attention multiplies them (`quantization.packed_projections`)."""
        for name in names:
            self.weight(attention, f"{name}_kernel", dtype=np.int8)
            self.weight(attention, f"{name}_kernel_scale")
        packed, _ = quantization.packed_projections(attention, names)
        self.packed.append((attention.params[f"{names[0]}_kernel"], names, packed))
        return packed


class _Plan:
    def __init__(self, builder, result, token_ids):
        self.plan, self.weights, self.packed = builder.plan, builder.weights, builder.packed
        self.slot, self.shape, self.token_ids = result.slot, list(result.shape), token_ids

    def current(self):
        for params, name, array in self.weights:  # (a loop: half the time of all() over a generator)
            if params.get(name) is not array:
                return False
        for kernel, key, packed in self.packed:
            if not quantization.is_packed(kernel, key, packed):
                return False
        return True


class _Plans(dict):
    """A model's plans by signature. A copy of the model starts without them: they point into the
    original's weights."""

    def __deepcopy__(self, memo):
        return _Plans()

    def __reduce__(self):
        return _Plans, ()


LOWERINGS = {}


def lowers(*classes, takes_token_rows=False, int8=False):
    """Registers a function (builder, layer, value) -> value as the lowering of `classes`; one that
    `takes_token_rows` is given an embedding's rows unmade (`_Value.rows_of`) and makes them if it must
    (`_Builder.rows`); one that takes `int8` lowers quantized layers too (the others' are refused)."""
    def register(fn):
        fn.takes_token_rows, fn.int8 = takes_token_rows, int8
        for cls in classes:
            LOWERINGS[cls] = fn
        return fn
    return register


def run(model, x):
    """`model`'s inference outputs for x through its plan, or None: no plan holds this call (the caller
    runs the eager path)."""
    if type(x) is not np.ndarray:
        return None
    plans = model.__dict__.get("_inference_plans")
    if plans is None:
        plans = model.__dict__["_inference_plans"] = _Plans()
    key = (x.shape, x.dtype.char)
    entry = plans.get(key, False)
    if entry is False or (entry is not None and not entry.current()):
        entry = _compile(model, x)
        if entry is False:
            return None  # not built yet: the eager call builds it, a later call plans
        plans.pop(key, None)
        if len(plans) >= MAX_PLANS:
            plans.pop(next(iter(plans)))
        plans[key] = entry
    if entry is None:
        return None
    if entry.token_ids and x.dtype != np.int64:
        x = x.astype(np.int64)
    elif not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    return entry.plan.run(x=x, result=entry.slot, shape=entry.shape)


def _compile(model, x):
    """The plan of `model` for inputs like x; None when the model holds something the plan does not;
    False when a layer is not built yet."""
    if not (model._functional and len(model.inputs) == 1 and len(model.outputs) == 1 and x.size
            and not model._multi_output and x.ndim == len(model.inputs[0].shape)):
        return None
    for layer in model.layers:
        if not layer.built or layer.__dict__.get("_deferred_restore"):
            return False
    token_ids = x.dtype.kind in "iu"
    if not token_ids and x.dtype != np.float32:
        return None
    try:
        builder = _Builder(x.shape, token_ids)
        values = {id(model.inputs[0]): _Value(0, tuple(x.shape), -1, token_ids)}
        for node in model._nodes:
            inputs_spec, args, kwargs = node.call_spec
            lowering = LOWERINGS.get(type(node.layer))
            if lowering is None or not node.single_input or args or kwargs or node.multi_output:
                return None
            layer = node.layer
            if layer.dtype != np.float32 or layer.dtype_policy.name != "float32" or \
                    (getattr(layer, "quantization_mode", None) and not lowering.int8):
                return None
            value = values[id(inputs_spec)]
            if value.ids and not isinstance(layer, Embedding):
                return None
            if not lowering.takes_token_rows:
                value = builder.rows(value)
            out = lowering(builder, layer, value)
            if value.mask >= 0 and not isinstance(layer, Embedding):
                passed = layer.compute_mask(None, _MASK)
                if passed is not None and passed is not _MASK:
                    return None
                out = out._replace(mask=value.mask if passed is _MASK else -1)
            values[id(node.outputs[0])] = out
        result = builder.rows(values[id(model.outputs[0])])
        if result.slot == 0:
            return None
        return _Plan(builder, result, token_ids)
    except (Unsupported, ValueError, TypeError):
        return None  # the eager path runs it (and raises for input it cannot take)


_MASK = object()  # stands for "the input's mask" when asking a layer's compute_mask what it passes on


def _features(layer, value, ndim=None, last=None):
    """value's shape, after checking the rank and last axis `layer` takes."""
    shape = value.shape
    if (ndim is not None and len(shape) != ndim) or len(shape) < 2 or (last is not None and shape[-1] != last):
        raise Unsupported(f"'{layer.name}' takes another shape than {shape}")
    return shape


# ----------------------------------------------------------------------------------- the lowerings
@lowers(Embedding, int8=True)
def _embedding(b, layer, value):
    if not value.ids:
        raise Unsupported("token ids as floats")  # the eager path checks they are whole numbers
    if layer.quantization_mode:
        table, scale = b.weight(layer, "embeddings", dtype=np.int8), b.weight(layer, "embeddings_scale")
    else:
        table, scale = b.weight(layer, "embeddings"), None
    shape = value.shape + (layer.output_dim,)
    mask = -1
    if layer.mask_zero:
        if len(value.shape) != 2:
            raise Unsupported("a padding mask of ids that are not (batch, steps)")
        mask = b.plan.add_mask_slot(size=math.prod(value.shape))
        b.plan.padding_mask(mask=mask)
    return _Value(-1, shape, mask, rows_of=_EmbeddedRows(table, scale))


@lowers(Dense, int8=True)
def _dense(b, layer, value):
    int8 = layer.quantization_mode
    kernel = b.weight(layer, "kernel", dtype=np.int8 if int8 else np.float32)
    shape = _features(layer, value, last=kernel.shape[0])
    out_shape = shape[:-1] + (layer.units,)
    out, rows, bias = b.slot(out_shape), math.prod(shape[:-1]), b.weight(layer, "bias", False)
    if int8:
        b.plan.dense_int8(outs=[out], widths=[layer.units], in_=value.slot, kernel=b.int8(layer, "kernel"),
                          biases=[bias], activation=layer.activation, rows=rows)
    else:
        b.plan.dense(out=out, in_=value.slot, kernel=kernel, bias=bias, activation=layer.activation, rows=rows)
    return _Value(out, out_shape, value.mask)


@lowers(Activation)
def _activation(b, layer, value):
    out = b.slot(value.shape)
    b.plan.activation(out=out, in_=value.slot, activation=layer.activation, rows=math.prod(value.shape[:-1]),
                      cols=value.shape[-1])
    return value._replace(slot=out)


@lowers(Dropout, SpatialDropout1D, takes_token_rows=True)
def _identity(b, layer, value):
    return value  # inference: dropout passes its input on


@lowers(SimpleRNN, GRU, LSTM, takes_token_rows=True, int8=True)
def _recurrent(b, layer, value):
    if layer.stateful or layer.return_state or (layer.go_backwards and layer.return_sequences):
        raise Unsupported("stateful, return_state or go_backwards with sequences")
    if value.mask >= 0 and layer.return_sequences and not layer.zero_output_for_mask:
        raise Unsupported("carrying the last real output over padded steps")
    return _recurrent_stack(b, [(layer, layer.go_backwards)], value, layer.return_sequences, None)


@lowers(Bidirectional, takes_token_rows=True, int8=True)
def _bidirectional(b, layer, value):
    if layer.merge_mode is None or layer.return_state or layer.forward_layer.stateful or \
            layer.backward_layer.stateful:
        raise Unsupported("two outputs, return_state or stateful")
    return _recurrent_stack(b, layer.directions, value, layer.return_sequences, layer.merge_mode)


def _recurrent_stack(b, directions, value, return_sequences, merge_mode):
    """The levels of one or two directions (`recurrent._stack_forward`'s order): each level runs every
    direction over the level's input, the next level reads their outputs side by side; the top level's
    outputs merged by `merge_mode`. Over an embedding's rows of (B, T) ids, the first level's directions
    take the ids and the table (a table of V x G floats each) unless those tables outgrow
    EMBEDDED_PROJECTION_BYTES or the rows a call gathers EMBEDDED_GATHER_BYTES (or either is int8: a
    quantized layer runs `rnn_int8`, its eager forward's kernel, over the rows)."""
    first = directions[0][0]
    B, T, _ = _features(first, value, ndim=3, last=first.input_dim)
    H, levels = first.units, first.num_layers
    rows_of = value.rows_of
    table = rows_of.table if rows_of is not None and rows_of.scale is None and not first.quantization_mode else None
    G = first.params["kernel"].shape[1]
    if table is None or len(directions) * table.shape[0] * G * 4 > EMBEDDED_PROJECTION_BYTES or \
            B * T * G * 4 > EMBEDDED_GATHER_BYTES:
        table, value = None, b.rows(value)
    seq = value.slot
    for level in range(levels):
        top = level + 1 == levels
        sequences = return_sequences or not top
        outs = []
        for layer, reverse in directions:
            sfx = "" if level == 0 else f"_{level}"
            bias, recurrent_bias = layer.level_biases(level)
            b.weight(layer, "bias" + sfx, False)  # recorded: a replaced bias rebuilds the plan
            out = b.slot((B, T if sequences else 1, H))
            if layer.quantization_mode:  # a classic GRU's candidate columns packed apart, as its forward's
                split = 2 * H if layer.cell_kind == "gru" and not layer.reset_after else 0
                b.plan.rnn_int8(out=out, in_=seq, cell=layer.cell_kind, kernel=b.int8(layer, "kernel" + sfx),
                                recurrent_kernel=b.int8(layer, "recurrent_kernel" + sfx, split),
                                bias=None if bias is None else np.ascontiguousarray(bias),
                                recurrent_bias=None if recurrent_bias is None else np.ascontiguousarray(recurrent_bias),
                                mask=value.mask, reverse=reverse, reset_after=layer.reset_after,
                                activation=layer.activation, recurrent_activation=layer.recurrent_activation,
                                batch=B, steps=T, return_sequences=sequences)
                outs.append(out)
                continue
            embedding = table if level == 0 else None
            b.plan.rnn(out=out, in_=0 if embedding is not None else seq, embedding=embedding, cell=layer.cell_kind,
                       kernel=b.weight(layer, "kernel" + sfx),
                       recurrent_kernel=b.weight(layer, "recurrent_kernel" + sfx),
                       bias=None if bias is None else np.ascontiguousarray(bias),
                       recurrent_bias=None if recurrent_bias is None else np.ascontiguousarray(recurrent_bias),
                       mask=value.mask, reverse=reverse, reset_after=layer.reset_after, activation=layer.activation,
                       recurrent_activation=layer.recurrent_activation, batch=B, steps=T, return_sequences=sequences)
            outs.append(out)
        rows = B * (T if sequences else 1)
        if len(outs) == 1:
            seq = outs[0]
            continue
        mode = merge_mode if top else "concat"
        seq = b.slot((rows, 2 * H if mode == "concat" else H))
        b.plan.merge(out=seq, a=outs[0], b=outs[1], mode=mode, rows=rows, width=H)
    width = 2 * H if merge_mode == "concat" else H
    return _Value(seq, (B, T, width) if return_sequences else (B, width), value.mask)


@lowers(AttentionPooling)
def _attention_pooling(b, layer, value):
    kernel, bias = b.weight(layer, "kernel"), b.weight(layer, "bias")
    B, T, C = _features(layer, value, ndim=3, last=kernel.shape[0])
    if not layer.length_agnostic and T != bias.shape[0]:
        raise Unsupported("a sequence length the per-step bias was not built for")
    shape = (B, T, C) if layer.return_sequences else (B, C)
    out = b.slot(shape)
    b.plan.attention_pooling(out=out, in_=value.slot, kernel=kernel, bias=bias,
                             mask=value.mask if layer.use_mask else -1, batch=B, steps=T,
                             return_sequences=layer.return_sequences)
    return _Value(out, shape, value.mask)


@lowers(PositionalEncoding, PositionEmbedding)
def _positions(b, layer, value):
    B, T, D = _features(layer, value, ndim=3)
    if isinstance(layer, PositionEmbedding):
        table = b.weight(layer, "embeddings")
        if T > layer.sequence_length or D != table.shape[1]:
            raise Unsupported("more positions than the table")
    else:
        table = layer.table(T, D)  # the sinusoids, computed once (the plan keeps this array alive)
    out = b.slot(value.shape)
    b.plan.add_positions(out=out, in_=value.slot, table=table, batch=B, steps=T)
    return value._replace(slot=out)


@lowers(LayerNormalization)
def _layer_norm(b, layer, value):
    return value._replace(slot=_norm(b, layer, value.slot, value.shape))


def _norm(b, layer, slot, shape, out=None):
    if layer.rms_scaling or tuple(shape[len(shape) - len(layer._weight_shape):]) != tuple(layer._weight_shape):
        raise Unsupported("RMS scaling, or other normalized axes")
    gamma, beta = b.weight(layer, "gamma", False), b.weight(layer, "beta", False)
    out = b.slot(shape) if out is None else out
    b.plan.layernorm(out=out, in_=slot, gamma=None if gamma is None else gamma.reshape(-1),
                     beta=None if beta is None else beta.reshape(-1), eps=layer.epsilon,
                     rows=math.prod(shape) // layer.features, cols=layer.features)
    return out


@lowers(FeedForward, int8=True)
def _feed_forward(b, layer, value):
    shape = _features(layer, value)
    out_shape = shape[:-1] + (layer.output_dense.units,)
    out = b.slot(out_shape)
    _feed_forward_op(b, layer, value.slot, out, math.prod(shape[:-1]), shape[-1])
    return _Value(out, out_shape, value.mask)


def _feed_forward_op(b, layer, slot, out, rows, features):
    inner, outer = layer.intermediate_dense, layer.output_dense
    kernel1 = b.weight(inner, "kernel", dtype=np.int8 if layer.quantization_mode else np.float32)
    if kernel1.shape[0] != features:
        raise Unsupported("another feature size")
    if layer.quantization_mode:  # both products in one call, as its forward's
        b.plan.feed_forward_int8(out=out, in_=slot, kernel1=b.int8(inner, "kernel"),
                                 bias1=b.weight(inner, "bias", False), kernel2=b.int8(outer, "kernel"),
                                 bias2=b.weight(outer, "bias", False), activation=layer.activation, rows=rows)
        return
    b.plan.feed_forward(out=out, in_=slot, kernel1=kernel1, bias1=b.weight(inner, "bias", False),
                        kernel2=b.weight(outer, "kernel"), bias2=b.weight(outer, "bias", False),
                        activation=layer.activation, rows=rows)


@lowers(TransformerEncoder, TransformerEncoderLayer, int8=True)
def _transformer_encoder(b, layer, value):
    """Each encoder layer's two residual blocks (`TransformerEncoderLayer.residual_blocks`), the padding
    mask as the self-attention's key mask; the blocks' slots are shared by the layers of a stack."""
    blocks = layer.blocks if isinstance(layer, TransformerEncoder) else [layer]
    B, T, D = _features(layer, value, ndim=3, last=blocks[0].model_dim)
    rows, shape = B * T, (B, T, D)
    stream = [b.slot(shape), b.slot(shape)]  # a block's output, alternating: the next block reads it
    middle, normed, sub = b.slot(shape), b.slot(shape), b.slot(shape)
    attention_slots = {}
    x = value.slot
    for i, block in enumerate(blocks):
        out = stream[i % 2]
        h = x
        for kind, norm, sublayer in block.residual_blocks():
            target = middle if kind == "self_attention" else out
            source = _norm(b, norm, h, shape, normed) if block.norm_first else h
            if kind == "self_attention":
                _self_attention(b, sublayer, source, sub, value.mask, B, T, D, attention_slots)
            else:
                _feed_forward_op(b, sublayer, source, sub, rows, D)
            if block.norm_first:  # x + sublayer(norm(x))
                b.plan.residual_add(out=target, a=h, b=sub)
            else:  # norm(x + sublayer(x))
                b.plan.residual_add(out=normed, a=h, b=sub)
                _norm(b, norm, normed, shape, target)
            h = target
        x = out
    return _Value(x, shape, value.mask)


def _self_attention(b, attention, source, out, mask, B, T, D, slots):
    """MultiHeadAttention with the query, key and value all `source` (`forward_checked`'s products)."""
    H, key_dim, value_dim = attention.num_heads, attention.key_dim, attention.value_dim
    if tuple(attention.params["output_kernel"].shape[2:]) != (D,) or getattr(attention, "use_gate", False) or \
            getattr(attention, "attention_axes", None) is not None:  # (main's gated / per-axis attention: eager)
        raise Unsupported("an output shape other than the model size, a gate or other attention axes")
    rows, names = B * T, ("query", "key", "value")
    if not slots:
        slots.update(query=b.slot((rows, H * key_dim)), key=b.slot((rows, H * key_dim)),
                     value=b.slot((rows, H * value_dim)), context=b.slot((rows, H * value_dim)))

    def bias(name):
        array = b.weight(attention, f"{name}_bias", False)
        return None if array is None else array.reshape(-1)
    if attention.quantization_mode:  # q, k, v from one int8 product, as its forward's
        b.plan.dense_int8(outs=[slots[name] for name in names], widths=[H * key_dim, H * key_dim, H * value_dim],
                          in_=source, kernel=b.int8_projections(attention, names),
                          biases=[bias(name) for name in names], activation="linear", rows=rows)
    else:
        for name in names:
            b.weight(attention, f"{name}_kernel")
            b.plan.dense(out=slots[name], in_=source, kernel=attention.matrix(name), bias=bias(name),
                         activation="linear", rows=rows)
    b.plan.sdpa(out=slots["context"], query=slots["query"], key=slots["key"], value=slots["value"], mask=mask,
                heads=H, batch=B, steps=T, key_dim=key_dim, value_dim=value_dim, scale=dot_product_scale(key_dim))
    if attention.quantization_mode:
        b.plan.dense_int8(outs=[out], widths=[D], in_=slots["context"], kernel=b.int8(attention, "output_kernel"),
                          biases=[bias("output")], activation="linear", rows=rows)
    else:
        b.weight(attention, "output_kernel")
        b.plan.dense(out=out, in_=slots["context"], kernel=attention.matrix("output"), bias=bias("output"),
                     activation="linear", rows=rows)


@lowers(GlobalAveragePooling1D)
def _global_average(b, layer, value):
    if layer.data_format != "channels_last" or layer.keepdims:
        raise Unsupported("channels_first or keepdims")
    B, T, C = _features(layer, value, ndim=3)
    out = b.slot((B, C))
    b.plan.mean_pool(out=out, in_=value.slot, mask=value.mask, batch=B, steps=T, features=C)
    return _Value(out, (B, C), -1)
