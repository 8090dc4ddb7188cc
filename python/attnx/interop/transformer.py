"""Converters of the transformer layers. PyTorch: LayerNorm <-> LayerNormalization,
MultiheadAttention <-> MultiHeadAttention, TransformerEncoderLayer / TransformerDecoderLayer and
the TransformerEncoder / TransformerDecoder stacks (without a final norm) both ways. Keras:
LayerNormalization and MultiHeadAttention both ways (attnx keeps Keras' weight layout)."""
import numpy as np

from .. import constraints, regularizers
from ..layers import (LayerNormalization, MultiHeadAttention, TransformerDecoder, TransformerDecoderLayer,
                      TransformerEncoder, TransformerEncoderLayer)
from .registry import (check_keras_options, keras_constraint, keras_kwargs, keras_layer_kwargs, keras_regularizer,
                       register_from_keras, register_from_torch, register_to_keras, register_to_torch, set_torch_params)


def _torch_dtype(layer):
    import torch
    return getattr(torch, layer.dtype.name)


# ----------------------------------------------------------------------------- LayerNorm
@register_from_torch("LayerNorm")
def _layernorm_from(module, dtype):
    if len(module.normalized_shape) != 1:
        raise ValueError(f"from_torch: LayerNorm over {tuple(module.normalized_shape)}; attnx normalizes the "
                         "last axis only")
    layer = LayerNormalization(epsilon=module.eps, scale=module.weight is not None, center=module.bias is not None,
                               dtype=dtype)
    layer.build((None, module.normalized_shape[0]))
    layer.built = True

    def to_attnx(t, grads=False):
        return {name: t[torch_name] for name, torch_name in (("gamma", "weight"), ("beta", "bias"))
                if torch_name in t}
    return layer, to_attnx


@register_to_torch(LayerNormalization)
def _layernorm_to(layer):
    import torch
    if layer.center and not layer.scale:
        raise ValueError(f"to_torch: LayerNormalization '{layer.name}' has beta without gamma; "
                         "torch.nn.LayerNorm cannot")
    module = torch.nn.LayerNorm(layer.features, eps=layer.epsilon, elementwise_affine=layer.scale,
                                bias=layer.center, dtype=_torch_dtype(layer))
    tensors = {}
    if layer.scale:
        tensors["weight"] = layer.params["gamma"]
    if layer.center:
        tensors["bias"] = layer.params["beta"]
    return set_torch_params(module, tensors)


# ----------------------------------------------------------------------------- MultiheadAttention
# torch keeps (out, in) weights with the heads stacked along `out` (in_proj_weight = [Wq; Wk; Wv]
# when query, key and value sizes agree); attnx keeps Keras' (in, heads, size).
def _mha_to_attnx(t, prefix, num_heads):
    """attnx MultiHeadAttention weights from the torch tensors named `prefix` + torch name."""
    if prefix + "in_proj_weight" in t:
        wq, wk, wv = np.split(t[prefix + "in_proj_weight"], 3)
    else:
        wq, wk, wv = (t[prefix + n] for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    out_w = t[prefix + "out_proj.weight"]
    out = {}
    for name, w in (("query", wq), ("key", wk), ("value", wv)):
        out[f"{name}_kernel"] = w.T.reshape(w.shape[1], num_heads, -1)
    out["output_kernel"] = out_w.T.reshape(num_heads, -1, out_w.shape[0])
    if prefix + "in_proj_bias" in t:
        for name, b in zip(("query", "key", "value"), np.split(t[prefix + "in_proj_bias"], 3)):
            out[f"{name}_bias"] = b.reshape(num_heads, -1)
        out["output_bias"] = t[prefix + "out_proj.bias"]
    return out


def _mha_to_torch(layer):
    """{torch name: array} for `layer`, checking torch can hold it."""
    H, E = layer.num_heads, layer.params["query_kernel"].shape[0]
    if layer.use_gate or layer.attention_axes not in (None, (1,), (-2,)):
        raise ValueError(f"to_torch: MultiHeadAttention '{layer.name}' has use_gate={layer.use_gate}, "
                         f"attention_axes={layer.attention_axes}; torch.nn.MultiheadAttention has neither")
    if layer.key_dim * H != E or layer.value_dim * H != E or layer.params["output_kernel"].shape[-1] != E:
        raise ValueError(f"to_torch: MultiHeadAttention '{layer.name}' needs num_heads * key_dim == "
                         f"num_heads * value_dim == query size == output size for torch.nn.MultiheadAttention; "
                         f"got heads={H}, key_dim={layer.key_dim}, value_dim={layer.value_dim}, query size {E}, "
                         f"output size {layer.params['output_kernel'].shape[-1]}")
    p = layer.params
    w = {n: p[f"{n}_kernel"].reshape(p[f"{n}_kernel"].shape[0], -1).T for n in ("query", "key", "value")}
    tensors = {"out_proj.weight": p["output_kernel"].reshape(E, E).T}
    if w["key"].shape[1] == E and w["value"].shape[1] == E:
        tensors["in_proj_weight"] = np.concatenate([w["query"], w["key"], w["value"]])
    else:
        tensors.update(q_proj_weight=w["query"], k_proj_weight=w["key"], v_proj_weight=w["value"])
    if layer.use_bias:
        tensors["in_proj_bias"] = np.concatenate([p[f"{n}_bias"].reshape(-1) for n in ("query", "key", "value")])
        tensors["out_proj.bias"] = p["output_bias"]
    return tensors


def _check_plain_mha(module):
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError("from_torch: MultiheadAttention with add_bias_kv or add_zero_attn has no attnx equivalent")


@register_from_torch("MultiheadAttention")
def _mha_from(module, dtype):
    _check_plain_mha(module)
    layer = MultiHeadAttention(module.num_heads, module.head_dim, dropout=module.dropout,
                               use_bias=module.in_proj_bias is not None, dtype=dtype)
    layer.build_from_dims(module.embed_dim, module.vdim, module.kdim)
    layer.built = True
    return layer, lambda t, grads=False: _mha_to_attnx(t, "", module.num_heads)


@register_to_torch(MultiHeadAttention)
def _mha_to(layer):
    import torch
    tensors = _mha_to_torch(layer)
    module = torch.nn.MultiheadAttention(
        layer.params["query_kernel"].shape[0], layer.num_heads, dropout=layer.dropout, bias=layer.use_bias,
        kdim=layer.params["key_kernel"].shape[0], vdim=layer.params["value_kernel"].shape[0], batch_first=True,
        dtype=_torch_dtype(layer))
    return set_torch_params(module, tensors)


# ----------------------------------------------------------------------------- encoder and decoder layers
# the same pieces under torch's and attnx's sublayer names
_ATTENTION_NAMES = {"self_attn.": "self_attention/", "multihead_attn.": "cross_attention/"}
_PLAIN_NAMES = {  # torch name: (attnx name, transposed)
    "linear1.weight": ("feed_forward/intermediate/kernel", True),
    "linear1.bias": ("feed_forward/intermediate/bias", False),
    "linear2.weight": ("feed_forward/output/kernel", True),
    "linear2.bias": ("feed_forward/output/bias", False),
    **{f"norm{i}.weight": (f"norm{i}/gamma", False) for i in (1, 2, 3)},
    **{f"norm{i}.bias": (f"norm{i}/beta", False) for i in (1, 2, 3)},
}


def _block_to_attnx(t, num_heads):
    out = {}
    for torch_prefix, attnx_prefix in _ATTENTION_NAMES.items():
        if any(k.startswith(torch_prefix) for k in t):
            for name, value in _mha_to_attnx(t, torch_prefix, num_heads).items():
                out[attnx_prefix + name] = value
    for torch_name, (attnx_name, transposed) in _PLAIN_NAMES.items():
        if torch_name in t:
            out[attnx_name] = t[torch_name].T if transposed else t[torch_name]
    return out


def _block_to_torch_tensors(layer):
    tensors = {}
    for torch_prefix, attnx_prefix in _ATTENTION_NAMES.items():
        sublayer = getattr(layer, attnx_prefix[:-1], None)
        if sublayer is not None:
            tensors.update({torch_prefix + k: v for k, v in _mha_to_torch(sublayer).items()})
    for torch_name, (attnx_name, transposed) in _PLAIN_NAMES.items():
        if attnx_name in layer.params:
            tensors[torch_name] = layer.params[attnx_name].T if transposed else layer.params[attnx_name]
    return tensors


def _block_activation(module):
    import torch
    act = module.activation
    for name, fn, cls in (("relu", torch.nn.functional.relu, torch.nn.ReLU),
                          ("gelu", torch.nn.functional.gelu, torch.nn.GELU)):
        if act is fn or isinstance(act, cls):
            return name
    raise ValueError(f"from_torch: {type(module).__name__} activation {act!r}; attnx converts relu and gelu")


def _block_from(module, layer_class, dtype):
    _check_plain_mha(module.self_attn)
    if module.linear1.bias is None:
        raise ValueError(f"from_torch: {type(module).__name__} with bias=False has no attnx equivalent")
    heads, dim = module.self_attn.num_heads, module.self_attn.embed_dim
    layer = layer_class(heads, module.linear1.out_features, dropout=module.dropout.p,
                        activation=_block_activation(module), layer_norm_epsilon=module.norm1.eps,
                        norm_first=module.norm_first, dtype=dtype)
    shape = (None, None, dim)
    layer.build(shape if layer_class is TransformerEncoderLayer else [shape, shape])
    layer.built = True
    return layer, lambda t, grads=False: _block_to_attnx(t, heads)


@register_to_torch(TransformerEncoderLayer)
@register_to_torch(TransformerDecoderLayer)
def _block_to(layer):
    import torch
    if layer.activation not in ("relu", "gelu"):
        raise ValueError(f"to_torch: {type(layer).__name__} '{layer.name}' activation {layer.activation!r}; "
                         "torch supports relu and gelu")
    if isinstance(layer, TransformerEncoderLayer):
        torch_class = torch.nn.TransformerEncoderLayer
    else:
        memory_dim = layer.params["cross_attention/key_kernel"].shape[0]
        if memory_dim != layer.model_dim:
            raise ValueError(f"to_torch: TransformerDecoderLayer '{layer.name}' attends to a memory of size "
                             f"{memory_dim}; torch.nn.TransformerDecoderLayer needs d_model={layer.model_dim}")
        torch_class = torch.nn.TransformerDecoderLayer
    module = torch_class(layer.model_dim, layer.num_heads, layer.intermediate_dim, dropout=layer.dropout,
                         activation=layer.activation, layer_norm_eps=layer.layer_norm_epsilon, batch_first=True,
                         norm_first=layer.norm_first, dtype=_torch_dtype(layer))
    return set_torch_params(module, _block_to_torch_tensors(layer))


@register_from_torch("TransformerEncoderLayer")
def _encoder_layer_from(module, dtype):
    return _block_from(module, TransformerEncoderLayer, dtype)


@register_from_torch("TransformerDecoderLayer")
def _decoder_layer_from(module, dtype):
    return _block_from(module, TransformerDecoderLayer, dtype)


# ----------------------------------------------------------------------------- stacks
# nn.TransformerEncoder / nn.TransformerDecoder without a final norm
def _stack_from(module, stack_class, dtype):
    if module.norm is not None:
        raise ValueError(f"from_torch: {type(module).__name__} with a final norm; attnx stacks have none "
                         "(apply a LayerNormalization after the stack)")
    first, _ = _block_from(module.layers[0], stack_class.layer_class, dtype)
    config = {k: v for k, v in first.get_config().items() if k not in ("name", "trainable", "dtype")}
    stack = stack_class(len(module.layers), dtype=dtype, **config)
    shape = (None, None, first.model_dim)
    stack.build(shape if stack_class is TransformerEncoder else [shape, shape])
    stack.built = True
    heads = first.num_heads

    def to_attnx(t, grads=False):
        out = {}
        for i in range(len(module.layers)):
            prefix = f"layers.{i}."
            block = _block_to_attnx({k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}, heads)
            out.update({f"layer_{i}/{k}": v for k, v in block.items()})
        return out
    return stack, to_attnx


@register_from_torch("TransformerEncoder")
def _encoder_from(module, dtype):
    return _stack_from(module, TransformerEncoder, dtype)


@register_from_torch("TransformerDecoder")
def _decoder_from(module, dtype):
    return _stack_from(module, TransformerDecoder, dtype)


@register_to_torch(TransformerEncoder)
@register_to_torch(TransformerDecoder)
def _stack_to(stack):
    import torch
    blocks = [_block_to(block) for block in stack.blocks]
    if isinstance(stack, TransformerEncoder):
        module = torch.nn.TransformerEncoder(blocks[0], len(blocks), enable_nested_tensor=False)
    else:
        module = torch.nn.TransformerDecoder(blocks[0], len(blocks))
    for i, block in enumerate(blocks):  # the constructor deep-copies the first block into every slot
        module.layers[i] = block
    return module


# ----------------------------------------------------------------------------- Keras
@register_from_keras("LayerNormalization")
def _layernorm_from_keras(class_name, config, weights):
    axis = config.get("axis", -1)
    layer = LayerNormalization(axis=axis if not isinstance(axis, (list, tuple)) or len(axis) != 1 else axis[0],
                               epsilon=config.get("epsilon", 1e-3), center=config.get("center", True),
                               scale=config.get("scale", True), rms_scaling=config.get("rms_scaling", False),
                               **keras_layer_kwargs(config))
    return layer, weights.read


@register_to_keras(LayerNormalization)
def _layernorm_to_keras(layer, keras):
    return [(keras.layers.LayerNormalization(axis=layer.axis, epsilon=layer.epsilon, center=layer.center,
                                             scale=layer.scale, rms_scaling=layer.rms_scaling,
                                             **keras_kwargs(layer)), layer.get_weights())]


@register_from_keras("MultiHeadAttention")
def _mha_from_keras(class_name, config, weights):
    check_keras_options(class_name, config, sliding_window=None, activity_regularizer=None)
    output_shape = config.get("output_shape")
    if isinstance(output_shape, (list, tuple)):
        if len(output_shape) != 1:
            raise ValueError(f"MultiHeadAttention '{config.get('name')}' has output_shape {output_shape}; attnx "
                             "projects to a size (one axis)")
        output_shape = output_shape[0]
    use_gate = bool(config.get("use_gate", False))
    layer = MultiHeadAttention(config["num_heads"], config["key_dim"], value_dim=config.get("value_dim"),
                               dropout=config.get("dropout", 0.0), use_bias=config.get("use_bias", True),
                               output_shape=output_shape, attention_axes=config.get("attention_axes"),
                               use_gate=use_gate,
                               kernel_regularizer=regularizers.get(config.get("kernel_regularizer")),
                               bias_regularizer=regularizers.get(config.get("bias_regularizer")),
                               kernel_constraint=constraints.get(config.get("kernel_constraint")),
                               bias_constraint=constraints.get(config.get("bias_constraint")),
                               **keras_layer_kwargs(config))
    # Keras' sublayers in its weights' order (the gate's attribute is private: `_gate_dense`)
    sublayers = ["query_dense", "key_dense"] + ["_gate_dense"] * use_gate + ["value_dense", "output_dense"]
    return layer, lambda: [w for name in sublayers for w in weights.read(name)]


@register_to_keras(MultiHeadAttention)
def _mha_to_keras(layer, keras):
    return [(keras.layers.MultiHeadAttention(layer.num_heads, layer.key_dim, value_dim=layer.value_dim,
                                             dropout=layer.dropout, use_bias=layer.use_bias,
                                             output_shape=layer.output_shape, attention_axes=layer.attention_axes,
                                             use_gate=layer.use_gate,
                                             kernel_regularizer=keras_regularizer(keras, layer.kernel_regularizer),
                                             bias_regularizer=keras_regularizer(keras, layer.bias_regularizer),
                                             kernel_constraint=keras_constraint(keras, layer.kernel_constraint),
                                             bias_constraint=keras_constraint(keras, layer.bias_constraint),
                                             **keras_kwargs(layer)),
             layer.get_weights())]
