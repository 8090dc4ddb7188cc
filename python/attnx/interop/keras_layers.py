"""Keras 3 converters of the layers of `layers.normalization` (BatchNormalization), `layers.conv1d`
(Conv1D), `layers.pooling` (GlobalMaxPooling1D, GlobalAveragePooling2D) and `layers.shape` (Permute,
Dot), both ways, weights in Keras' order as they are (Conv1D's kernel is (K, C, F) in both)."""
from .. import regularizers
from ..layers.conv1d import Conv1D
from ..layers.normalization import BatchNormalization
from ..layers.pooling import GlobalAveragePooling2D, GlobalMaxPooling1D
from ..layers.shape import Dot, Permute
from .registry import (check_keras_options, kernel_arguments_from_keras, keras_kernel_arguments, keras_kwargs,
                       keras_layer_kwargs, keras_regularizer, no_weights, register_from_keras, register_to_keras)


def _one(value):
    return value[0] if isinstance(value, (list, tuple)) else value


@register_from_keras("Conv1D")
def _conv1d_from_keras(class_name, config, weights):
    check_keras_options(class_name, {**config, "data_format": config.get("data_format") or "channels_last"},
                        data_format="channels_last")
    layer = Conv1D(config["filters"], _one(config["kernel_size"]), strides=_one(config.get("strides", 1)),
                   padding=config.get("padding", "valid"), dilation_rate=_one(config.get("dilation_rate", 1)),
                   groups=config.get("groups", 1), **kernel_arguments_from_keras(config), **keras_layer_kwargs(config))
    return layer, weights.read


@register_to_keras(Conv1D)
def _conv1d_to_keras(layer, keras):
    return [(keras.layers.Conv1D(layer.filters, layer.kernel_size, strides=layer.strides, padding=layer.padding,
                                 dilation_rate=layer.dilation_rate, groups=layer.groups,
                                 **keras_kernel_arguments(keras, layer), **keras_kwargs(layer)), layer.get_weights())]


@register_from_keras("BatchNormalization")
def _batch_normalization_from_keras(class_name, config, weights):
    check_keras_options(class_name, config, renorm=False, synchronized=False)
    layer = BatchNormalization(axis=config.get("axis", -1), momentum=config.get("momentum", 0.99),
                               epsilon=config.get("epsilon", 1e-3), center=config.get("center", True),
                               scale=config.get("scale", True),
                               beta_regularizer=regularizers.get(config.get("beta_regularizer")),
                               gamma_regularizer=regularizers.get(config.get("gamma_regularizer")),
                               **keras_layer_kwargs(config))
    return layer, weights.read


@register_to_keras(BatchNormalization)
def _batch_normalization_to_keras(layer, keras):
    return [(keras.layers.BatchNormalization(axis=layer.axis, momentum=layer.momentum, epsilon=layer.epsilon,
                                             center=layer.center, scale=layer.scale,
                                             beta_regularizer=keras_regularizer(keras, layer.beta_regularizer),
                                             gamma_regularizer=keras_regularizer(keras, layer.gamma_regularizer),
                                             **keras_kwargs(layer)), layer.get_weights())]


_POOLING = {cls.__name__: cls for cls in (GlobalMaxPooling1D, GlobalAveragePooling2D)}


@register_from_keras(*_POOLING)
def _global_pooling_from_keras(class_name, config, weights):
    return _POOLING[class_name](data_format=config.get("data_format") or "channels_last",
                                keepdims=config.get("keepdims", False), **keras_layer_kwargs(config)), no_weights


@register_to_keras(*_POOLING.values())
def _global_pooling_to_keras(layer, keras):
    return [(getattr(keras.layers, type(layer).__name__)(data_format=layer.data_format, keepdims=layer.keepdims,
                                                         **keras_kwargs(layer)), [])]


@register_from_keras("Permute")
def _permute_from_keras(class_name, config, weights):
    return Permute(tuple(config["dims"]), **keras_layer_kwargs(config)), no_weights


@register_to_keras(Permute)
def _permute_to_keras(layer, keras):
    return [(keras.layers.Permute(layer.dims, **keras_kwargs(layer)), [])]


@register_from_keras("Dot")
def _dot_from_keras(class_name, config, weights):
    return Dot(config["axes"], normalize=config.get("normalize", False), **keras_layer_kwargs(config)), no_weights


@register_to_keras(Dot)
def _dot_to_keras(layer, keras):
    return [(keras.layers.Dot(layer.axes, normalize=layer.normalize, **keras_kwargs(layer)), [])]
