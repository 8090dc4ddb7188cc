"""Keras converters of the attention layers: Keras' Attention (dot and concat scores) and
AdditiveAttention to attnx's Attention / AdditiveAttention and back (the same layers), and the Keras tutorial's custom
attention layer to `AttentionPooling`, which `to_keras` writes as the Keras layer
`attnx>AttentionPooling` defined here.

The tutorial's layer (``class attention(Layer)``) has weights W (d, 1) and b (T, 1) (or (T,)) and
computes ``e = tanh(x W + b)``, ``a = softmax(e)`` over time, output ``sum_t a_t x_t``: exactly
AttentionPooling's score, b being its per-step bias (a bias of size 1: ``length_agnostic=True``).
Its ``call`` takes no mask, so Keras does not give it one: it becomes ``AttentionPooling(use_mask=False)``.
"""
import functools

import numpy as np

from ..layers import AdditiveAttention, Attention, AttentionPooling, BahdanauAdditiveAttention
from .registry import check_keras_options, keras_kwargs, keras_layer_kwargs, register_from_keras, register_to_keras


# ----------------------------------------------------------------------------- Keras' Attention
@register_from_keras("Attention")
def _attention_from_keras(class_name, config, weights):
    check_keras_options(class_name, config, score_mode=("dot", "concat"))
    layer = Attention(use_scale=config.get("use_scale", False), score_mode=config.get("score_mode", "dot"),
                      dropout=config.get("dropout", 0.0), seed=config.get("seed"), **keras_layer_kwargs(config))
    return layer, lambda: [np.reshape(w, (1,)) for w in weights.read()]  # scalars, in Keras' order


@register_from_keras("AdditiveAttention")
def _additive_from_keras(class_name, config, weights):
    layer = AdditiveAttention(use_scale=config.get("use_scale", True), dropout=config.get("dropout", 0.0),
                              seed=config.get("seed"), **keras_layer_kwargs(config))
    return layer, weights.read


def _identity_multiple(matrix):
    """s when `matrix` is s * I, else None."""
    s = matrix[0, 0]
    return float(s) if matrix.shape[0] == matrix.shape[1] and np.array_equal(matrix, s * np.eye(len(matrix))) else None


@register_to_keras(Attention)
def _attention_to_keras(layer, keras):
    kwargs = {"dropout": layer.dropout, **keras_kwargs(layer)}
    p = layer.params
    mode = layer.score_function.keras_name  # Keras' score_mode of this score (attnx.layers.scores)
    if mode is not None:
        return [(keras.layers.Attention(use_scale=layer.use_scale, score_mode=mode, **kwargs),
                 [w[0] for w in p.values()])]
    if layer.score == "additive" and not layer.normalize and not np.any(p.get("bias", 0)) and \
            _identity_multiple(p["query_kernel"]) == 1.0 and _identity_multiple(p["key_kernel"]) == 1.0:
        return [(keras.layers.AdditiveAttention(use_scale=True, **kwargs), [p["v"][:, 0]])]
    raise ValueError(f"to_keras: {type(layer).__name__} '{layer.name}' (score {layer.score!r}) has no Keras "
                     "counterpart: Keras' Attention computes dot or concat (tanh_sum) scores and AdditiveAttention "
                     "adds query and key without projections (attnx's Bahdanau form with identity kernels and no "
                     "bias)")


register_to_keras(BahdanauAdditiveAttention)(_attention_to_keras)


@register_to_keras(AdditiveAttention)
def _additive_to_keras(layer, keras):
    return [(keras.layers.AdditiveAttention(use_scale=layer.use_scale, dropout=layer.dropout, **keras_kwargs(layer)),
             layer.get_weights())]


# ----------------------------------------------------------------------------- AttentionPooling
@register_from_keras("custom>attention", "custom>attentionlayer", "custom>attentionpooling")
def _pooling_from_keras(class_name, config, weights):
    shapes = weights.shapes()
    if len(shapes) != 2 or len(shapes[0]) not in (1, 2) or shapes[0][-1:] not in ((1,), shapes[0][:1]):
        raise ValueError(f"custom layer {class_name} ('{config.get('name')}') has weights of shapes {shapes}; "
                         "attnx converts the Keras tutorial's attention layer, with W (d, 1) and b (T, 1) or (T,)")
    steps = int(np.prod(shapes[1], dtype=np.int64))
    layer = AttentionPooling(return_sequences=config.get("return_sequences", False), length_agnostic=steps == 1,
                             use_mask=config.get("use_mask", False), **keras_layer_kwargs(config))
    return layer, lambda: [np.reshape(w, (-1, 1)) for w in weights.read()]


@register_to_keras(AttentionPooling)
def _pooling_to_keras(layer, keras):
    cls = keras_attention_pooling(keras)
    return [(cls(return_sequences=layer.return_sequences, length_agnostic=layer.length_agnostic,
                 use_mask=layer.use_mask, **keras_kwargs(layer)), layer.get_weights())]


@functools.lru_cache(maxsize=None)
def keras_attention_pooling(keras):
    """The Keras layer `attnx>AttentionPooling`: the tutorial's attention layer with AttentionPooling's
    options (defined once keras is imported, registered under the package name "attnx")."""
    ops = keras.ops

    @keras.saving.register_keras_serializable(package="attnx")
    class AttentionPooling(keras.layers.Layer):
        """e = tanh(x W + b), a = softmax(e) over time (masked steps 0), output sum_t a_t x_t (or x * a)."""

        def __init__(self, return_sequences=False, length_agnostic=False, use_mask=True, **kwargs):
            super().__init__(**kwargs)
            self.return_sequences, self.length_agnostic, self.use_mask = return_sequences, length_agnostic, use_mask
            self.supports_masking = True

        def build(self, input_shape):
            self.W = self.add_weight(name="kernel", shape=(input_shape[-1], 1), initializer="random_normal")
            steps = 1 if self.length_agnostic else input_shape[1]
            self.b = self.add_weight(name="bias", shape=(steps, 1), initializer="zeros")

        def call(self, x, mask=None):
            e = ops.squeeze(ops.tanh(ops.matmul(x, self.W) + self.b), axis=-1)
            if mask is not None and self.use_mask:
                keep = ops.cast(mask, x.dtype)
                # a fully masked row gets zero weights, as in attnx
                a = ops.softmax(ops.where(ops.cast(mask, "bool"), e, -1e9), axis=-1) * keep
            else:
                a = ops.softmax(e, axis=-1)
            weighted = x * ops.expand_dims(a, -1)
            return weighted if self.return_sequences else ops.sum(weighted, axis=1)

        def compute_mask(self, inputs, mask=None):
            return mask if self.return_sequences and self.use_mask else None

        def compute_output_shape(self, input_shape):
            return tuple(input_shape) if self.return_sequences else (input_shape[0], input_shape[-1])

        def get_config(self):
            return {**super().get_config(), "return_sequences": self.return_sequences,
                    "length_agnostic": self.length_agnostic, "use_mask": self.use_mask}

    return AttentionPooling
