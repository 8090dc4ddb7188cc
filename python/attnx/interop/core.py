"""Converters of the core layers. PyTorch: Linear <-> Dense, Embedding <-> Embedding. Keras: Dense,
Embedding, Activation, Dropout, SpatialDropout1D, Flatten, Reshape, Concatenate, Add, Multiply, Masking,
RepeatVector, GlobalAveragePooling1D, each to and from the layer of the same name; from Keras also
TimeDistributed around a layer that acts on the last axis (that layer: attnx's take any rank)."""
from .. import regularizers
from ..layers.core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D,
                           Masking, Multiply, RepeatVector, Reshape, SpatialDropout1D)
from .registry import (_FROM_KERAS, check_keras_options, kernel_arguments_from_keras, keras_kernel_arguments,
                       keras_kwargs, keras_layer_kwargs, keras_regularizer, no_weights, register_from_keras,
                       register_from_torch, register_to_keras, register_to_torch, set_torch_params,
                       torch_kernel_and_bias)


@register_from_torch("Linear")
def _linear_from(module, dtype):
    layer = Dense(module.out_features, use_bias=module.bias is not None, dtype=dtype)
    layer.build((None, module.in_features))
    layer.built = True
    return layer, torch_kernel_and_bias(lambda weight: weight.T)


@register_to_torch(Dense)
def _linear_to(layer):
    import torch
    if layer.activation != "linear":
        raise ValueError(f"to_torch: Dense '{layer.name}' has activation {layer.activation!r}; "
                         "torch.nn.Linear has none")
    kernel = layer.params["kernel"]
    module = torch.nn.Linear(kernel.shape[0], kernel.shape[1], bias=layer.use_bias,
                             dtype=getattr(torch, layer.dtype.name))
    tensors = {"weight": kernel.T}
    if layer.use_bias:
        tensors["bias"] = layer.params["bias"]
    return set_torch_params(module, tensors)


@register_from_torch("Embedding")
def _embedding_from(module, dtype):
    # these change the results (max_norm renormalizes rows inside forward, scale_grad_by_freq
    # rescales gradients); attnx's Embedding has neither. (padding_idx only freezes one row's
    # gradient in torch: the forward pass is the same.)
    if module.max_norm is not None or module.scale_grad_by_freq:
        raise ValueError("from_torch: torch.nn.Embedding with max_norm or scale_grad_by_freq has no attnx "
                         "equivalent")
    layer = Embedding(module.num_embeddings, module.embedding_dim, dtype=dtype)
    layer.build((None, None))
    layer.built = True
    return layer, lambda t, grads=False: {"embeddings": t["weight"]}


@register_to_torch(Embedding)
def _embedding_to(layer):
    import torch
    module = torch.nn.Embedding(layer.input_dim, layer.output_dim, dtype=getattr(torch, layer.dtype.name))
    return set_torch_params(module, {"weight": layer.params["embeddings"]})


# ----------------------------------------------------------------------------- Keras
@register_from_keras("Dense")
def _dense_from_keras(class_name, config, weights):
    layer = Dense(config["units"], **kernel_arguments_from_keras(config), **keras_layer_kwargs(config))
    return layer, weights.read


@register_to_keras(Dense)
def _dense_to_keras(layer, keras):
    return [(keras.layers.Dense(layer.units, **keras_kernel_arguments(keras, layer), **keras_kwargs(layer)),
             layer.get_weights())]


@register_from_keras("Embedding")
def _embedding_from_keras(class_name, config, weights):
    layer = Embedding(config["input_dim"], config["output_dim"], mask_zero=config.get("mask_zero", False),
                      embeddings_regularizer=regularizers.get(config.get("embeddings_regularizer")),
                      **keras_layer_kwargs(config))
    return layer, weights.read


@register_to_keras(Embedding)
def _embedding_to_keras(layer, keras):
    return [(keras.layers.Embedding(layer.input_dim, layer.output_dim, mask_zero=layer.mask_zero,
                                    embeddings_regularizer=keras_regularizer(keras, layer.embeddings_regularizer),
                                    **keras_kwargs(layer)),
             layer.get_weights())]


@register_from_keras("Activation")
def _activation_from_keras(class_name, config, weights):
    return Activation(config["activation"], **keras_layer_kwargs(config)), no_weights


@register_to_keras(Activation)
def _activation_to_keras(layer, keras):
    return [(keras.layers.Activation(layer.activation, **keras_kwargs(layer)), [])]


@register_from_keras("Dropout")
def _dropout_from_keras(class_name, config, weights):
    return Dropout(config["rate"], noise_shape=config.get("noise_shape"), seed=config.get("seed"),
                   **keras_layer_kwargs(config)), no_weights


@register_from_keras("SpatialDropout1D")
def _spatial_dropout_from_keras(class_name, config, weights):
    return SpatialDropout1D(config["rate"], seed=config.get("seed"), **keras_layer_kwargs(config)), no_weights


@register_from_keras("Masking")
def _masking_from_keras(class_name, config, weights):
    return Masking(config.get("mask_value", 0.0), **keras_layer_kwargs(config)), no_weights


@register_from_keras("RepeatVector")
def _repeat_from_keras(class_name, config, weights):
    return RepeatVector(config["n"], **keras_layer_kwargs(config)), no_weights


@register_from_keras("Multiply")
def _multiply_from_keras(class_name, config, weights):
    return Multiply(**keras_layer_kwargs(config)), no_weights


@register_to_keras(SpatialDropout1D)
def _spatial_dropout_to_keras(layer, keras):
    return [(keras.layers.SpatialDropout1D(layer.rate, seed=layer.seed, name=layer.name, dtype=layer.dtype.name), [])]


@register_to_keras(Masking)
def _masking_to_keras(layer, keras):
    return [(keras.layers.Masking(layer.mask_value, **keras_kwargs(layer)), [])]


@register_to_keras(RepeatVector)
def _repeat_to_keras(layer, keras):
    return [(keras.layers.RepeatVector(layer.n, **keras_kwargs(layer)), [])]


# the Keras layers that act on the last axis alone, as their attnx counterparts do on inputs of any rank
_PER_STEP = ("Dense", "Activation", "Dropout", "LayerNormalization")


@register_from_keras("TimeDistributed")
def _time_distributed_from_keras(class_name, config, weights):
    inner = config["layer"]
    if inner.get("class_name") not in _PER_STEP:
        raise ValueError(f"TimeDistributed '{config.get('name')}' wraps a {inner.get('class_name')}; attnx converts "
                         f"TimeDistributed around {', '.join(_PER_STEP)}")
    inner_config = {**inner["config"], "name": config.get("name")}  # the wrapper's name is the unique one
    return _FROM_KERAS[inner["class_name"]](inner["class_name"], inner_config, weights.sublayer("layer"))


@register_to_keras(Dropout)
def _dropout_to_keras(layer, keras):
    return [(keras.layers.Dropout(layer.rate, noise_shape=layer.noise_shape, seed=layer.seed, **keras_kwargs(layer)),
             [])]


@register_from_keras("Flatten", "GlobalAveragePooling1D")
def _pooling_from_keras(class_name, config, weights):
    check_keras_options(class_name, config, data_format="channels_last", keepdims=False)
    layer_class = Flatten if class_name == "Flatten" else GlobalAveragePooling1D
    return layer_class(**keras_layer_kwargs(config)), no_weights


@register_from_keras("Reshape")
def _reshape_from_keras(class_name, config, weights):
    return Reshape(config["target_shape"], **keras_layer_kwargs(config)), no_weights


@register_from_keras("Concatenate")
def _concatenate_from_keras(class_name, config, weights):
    return Concatenate(axis=config.get("axis", -1), **keras_layer_kwargs(config)), no_weights


@register_from_keras("Add")
def _add_from_keras(class_name, config, weights):
    return Add(**keras_layer_kwargs(config)), no_weights


@register_to_keras(Flatten, GlobalAveragePooling1D, Add, Multiply)
def _plain_to_keras(layer, keras):
    return [(getattr(keras.layers, type(layer).__name__)(**keras_kwargs(layer)), [])]


@register_to_keras(Reshape)
def _reshape_to_keras(layer, keras):
    return [(keras.layers.Reshape(layer.target_shape, **keras_kwargs(layer)), [])]


@register_to_keras(Concatenate)
def _concatenate_to_keras(layer, keras):
    return [(keras.layers.Concatenate(axis=layer.axis, **keras_kwargs(layer)), [])]
