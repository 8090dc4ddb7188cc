"""Transformer encoder and decoder layers and stacks, and the decoder's cached step (`DecoderCache`).

The math runs in C++ (`transformer.hpp`, `attention.hpp`, `decoder_step.hpp`); these classes check inputs,
lay out buffers and chain the backward passes. Every layer follows the contract of `layers.base`. The layers and
stacks call their sublayers (MultiHeadAttention, FeedForward, LayerNormalization) through ``apply`` /
``backprop`` and keep the sublayers' caches inside their own, so a layer called several times keeps each call's
state apart; they expose their sublayers' weights in their own ``params`` / ``grads`` under
``"<sublayer>/<weight>"`` names, sharing the same arrays.

Masks follow `attnx.masking` (bool or 0/1 integers, True = real token / may attend; a padding mask
``(batch, S)`` may also be lengths ``(batch,)``). An attention mask is ``(batch, T, S)``, or one
``(T, S)`` mask shared by the batch. A query that may attend to nothing gets zero attention
weights (and so only the output bias), never NaN.
"""

import numpy as np

from .. import activations, kernels, quantization, random
from ..masking import as_mask
from .attention import is_shape
from .composite import _add, _Composite, _dropout_stream, _where
from .feed_forward import FeedForward
from .multi_head_attention import _attention_mask, _combine_masks, head_sizes, MultiHeadAttention
from .normalization import LayerNormalization


def _decoder_masks(layer, target_shape, S, decoder_padding_mask, decoder_attention_mask, encoder_padding_mask,
                   encoder_attention_mask):
    """A decoder layer's or stack's four mask arguments, checked once, as the (self-attention,
    cross-attention) masks the kernels take, for a target (B, T) and S memory positions."""
    B, T = target_shape
    self_mask = _combine_masks(
        _attention_mask(decoder_attention_mask, B, T, T, _where(layer, "decoder_attention_mask")),
        as_mask(decoder_padding_mask, B, T, _where(layer, "decoder_padding_mask")))
    cross_mask = _combine_masks(
        _attention_mask(encoder_attention_mask, B, T, S, _where(layer, "encoder_attention_mask")),
        as_mask(encoder_padding_mask, B, S, _where(layer, "encoder_padding_mask")))
    return self_mask, cross_mask


# ---------------------------------------------------------------------------- encoder / decoder
class _TransformerLayerBase(_Composite):
    """What encoder and decoder layers share: the config, the sublayer wiring, and the residual
    block ``x + dropout(sublayer(x))`` in both norm orders.

    A residual block's sublayer is a pair of functions: ``sublayer(h) -> (output, cache, weights)``
    (weights: the attention weights when returned, else None) and
    ``sublayer_backprop(cache, doutput) -> (dh, dsource)`` (dsource: the gradient of the memory a
    cross-attention attends to, else None).
    """

    @property
    def quantization_mode(self):
        return self.self_attention.quantization_mode if self.built else None

    def __init__(self, num_heads, intermediate_dim, dropout=0.0, activation="relu", layer_norm_epsilon=1e-5,
                 norm_first=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, _ = head_sizes(type(self).__name__, num_heads)
        if int(intermediate_dim) <= 0:
            raise ValueError(f"{type(self).__name__}: intermediate_dim must be positive, got {intermediate_dim}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        self.intermediate_dim = int(intermediate_dim)
        self.dropout = float(dropout)
        self.activation = activations.get(activation)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm_first = bool(norm_first)
        self.model_dim = self.head_dim = None
        self.seed_generator = random.SeedGenerator(seed, type(self).__name__)  # the residual blocks' dropout
        self.seed = self.seed_generator.seed

    def _model_dim(self, input_shape):
        if not is_shape(input_shape, (3,)) or input_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': needs inputs (batch, T, features) with known features, got "
                             f"shape {input_shape}")
        self.model_dim = int(input_shape[-1])
        _, self.head_dim = head_sizes(f"Layer '{self.name}' (inputs of shape {input_shape})", self.num_heads,
                                      self.model_dim)
        return self.model_dim

    def _attention(self, prefix, input_shapes):
        return self._add_sublayer(prefix, MultiHeadAttention(
            self.num_heads, self.head_dim, dropout=self.dropout, dtype=self.dtype_policy,
            seed=random.sub_seed(self.seed, 1 if prefix == "self_attention" else 2), name=f"{self.name}/{prefix}"),
            input_shapes)

    def _norm(self, prefix, input_shape):
        return self._add_sublayer(prefix, LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                                                             name=f"{self.name}/{prefix}"), input_shape)

    def _feed_forward(self, input_shape):
        return self._add_sublayer("feed_forward", FeedForward(
            self.intermediate_dim, self.activation, self.dropout, dtype=self.dtype_policy, seed=random.sub_seed(self.seed, 3),
            name=f"{self.name}/feed_forward"), input_shape)

    def _residual(self, x, norm, sublayer, training):
        """One residual block: post-norm ``norm(x + dropout(sublayer(x)))``, or with norm_first
        ``x + dropout(sublayer(norm(x)))``. Returns (y, weights, cache)."""
        norm_cache = None
        h = x
        if self.norm_first:
            h, norm_cache = norm.apply(x, training=training)
        inner, sublayer_cache, weights = sublayer(h)
        # the mask drawn as it is used, forward and backward (never written out)
        stream = _dropout_stream(self.seed_generator, x.shape[0], self.dropout) if training else None
        y = kernels.residual_add(x=x, sub=inner, dropout_stream=stream)
        if not self.norm_first:
            y, norm_cache = norm.apply(y, training=training)
        return y, weights, (norm_cache, sublayer_cache, stream)

    def _residual_backprop(self, cache, dy, norm, sublayer_backprop, need_dx=True):
        """Backward of `_residual`: returns (dx, dsource); dx is None when the sublayer skipped the
        input gradient nobody reads (`need_dx` False)."""
        norm_cache, sublayer_cache, stream = cache
        if not self.norm_first:
            dy = norm.backprop(norm_cache, dy)
        dinner = dy if stream is None else kernels.apply_keep(x=dy, dropout_stream=stream)
        # post-norm: the sublayer reads the block's input itself, and its input gradient only joins the
        # residual's; pre-norm: it reads the norm's output, whose gradient the norm's weights need
        dh, dsource = sublayer_backprop(sublayer_cache, dinner, need_dx or self.norm_first)
        if dh is None:
            return None, dsource
        if self.norm_first:
            dh = norm.backprop(norm_cache, dh)
        return _add(dy, dh), dsource

    @staticmethod
    def _attention_sublayer(attention, source, mask, use_causal_mask, return_attention_scores, training):
        """`attention` as a residual block's sublayer: the stream h attends to `source` (to itself
        when None) under a checked mask."""
        def sublayer(h):
            outputs, cache = attention.forward_checked(h, h if source is None else source, None, mask,
                                                       use_causal_mask, return_attention_scores, training)
            output, weights = outputs if return_attention_scores else (outputs, None)
            return output, cache, weights
        return sublayer

    def _feed_forward_sublayer(self, training):
        return lambda h: (*self.feed_forward.apply(h, training=training), None)

    def _feed_forward_backprop(self, cache, doutput, need_dx=True):
        return self.feed_forward.backprop(cache, doutput, need_dx), None

    def _self_attention_backprop(self, cache, doutput, need_dx=True):
        # query, key and value are one stream: its one gradient (None when need_dx is False)
        return self.self_attention.backprop_self_attention(cache, doutput, need_dx), None

    # where each residual block's weights start in the cached step's list (decoder_step.hpp's
    # DecoderLayerWeights): a norm's gamma and beta, then the sublayer's
    _STEP_SLOTS = {"self_attention": (0, ("query", "key", "value", "output")),
                   "cross_attention": (10, ("query", "output")), "feed_forward": (16, None)}

    def step_weights(self):
        """The 22 weights (or None) in the order the cached step takes them (`decoder_step.hpp`'s
        DecoderLayerWeights), from `residual_blocks()`: per block its norm's gamma and beta, then
        the attention's projections as (in, out) matrices with their biases (the cross-attention's
        query and output only: its keys and values are the cache's), or the feed-forward network's
        two kernels and biases; a quantized layer's kernels packed (`quantization.step_product`). An
        encoder layer leaves the cross-attention block's entries None."""
        weights = [None] * 22
        for kind, norm, sublayer in self.residual_blocks():
            start, projections = self._STEP_SLOTS[kind]
            weights[start:start + 2] = [norm.params.get("gamma"), norm.params.get("beta")]
            if projections is None:
                denses = (sublayer.intermediate_dense, sublayer.output_dense)
                weights[start + 2:start + 6] = [w for d in denses for w in quantization.step_product(d)]
                continue
            for i, name in enumerate(projections):  # int8: packed, self q, k, v in one product
                weights[start + 2 + 2 * i:start + 4 + 2 * i] = quantization.step_product(
                    sublayer, name, fused=kind == "self_attention")
        return weights

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout, "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon, "norm_first": self.norm_first, "seed": self.seed}


class TransformerEncoderLayer(_TransformerLayerBase):
    """A transformer encoder layer (Vaswani et al. 2017): self-attention then a position-wise
    feed-forward network, each in a residual block with dropout and layer normalization.

    Post-norm (default, as the paper and PyTorch): ``x = norm1(x + dropout(attn(x)))``,
    ``y = norm2(x + dropout(ff(x)))``. With ``norm_first=True``: ``x = x + dropout(attn(norm1(x)))``,
    ``y = x + dropout(ff(norm2(x)))``.

    Args:
        num_heads: attention heads; the embedding size must be divisible by it.
        intermediate_dim: hidden width of the feed-forward network.
        dropout: rate for the attention weights, the feed-forward hidden layer and both residuals.
        activation: feed-forward activation, "relu" or "gelu".
        layer_norm_epsilon: 1e-5 as PyTorch (Keras' LayerNormalization default is 1e-3).
        norm_first: pre-norm instead of post-norm.

    Call arguments:
        inputs: ``(batch, T, D)``.
        padding_mask: ``(batch, T)`` (True = real token) or lengths ``(batch,)``; the `mask`
            an upstream layer (e.g. ``Embedding(mask_zero=True)``) passes is used when not given.
        attention_mask: ``(batch, T, T)`` or ``(T, T)``, True = may attend.
        use_causal_mask: each position attends only to itself and earlier ones.
        return_attention_scores: also return the weights ``(batch, num_heads, T, T)``.

    Output shape: ``(batch, T, D)``. Weights: ``self_attention/*`` (see MultiHeadAttention),
    ``norm1/*``, ``feed_forward/*``, ``norm2/*``. ``backprop(cache, dy)`` returns dinputs (with
    return_attention_scores, dy may be ``(doutput, None)``).
    """

    supports_masking = True

    def build(self, input_shape):
        self._model_dim(input_shape)
        self.self_attention = self._attention("self_attention", [input_shape, input_shape])
        self.norm1 = self._norm("norm1", input_shape)
        self.feed_forward = self._feed_forward(input_shape)
        self.norm2 = self._norm("norm2", input_shape)

    def forward(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False,
                return_attention_scores=False, training=False, mask=None):
        x = self._float_input(inputs, ndim=3, last_dim=self.model_dim)
        B, T = x.shape[:2]
        self_mask = _combine_masks(_attention_mask(attention_mask, B, T, T, _where(self, "attention_mask")),
                                   as_mask(mask if padding_mask is None else padding_mask, B, T,
                                           _where(self, "padding_mask")))
        return self.forward_checked(x, self_mask, use_causal_mask, return_attention_scores, training)

    def forward_checked(self, x, self_mask, use_causal_mask=False, return_attention_scores=False, training=False):
        """`forward` on inputs x (B, T, D) and the self-attention mask it checked (as
        `MultiHeadAttention.forward_checked` takes it): what TransformerEncoder runs per layer."""
        self_attend = self._attention_sublayer(self.self_attention, None, self_mask, use_causal_mask,
                                               return_attention_scores, training)
        y, weights, attention_block = self._residual(x, self.norm1, self_attend, training)
        y, _, feed_forward_block = self._residual(y, self.norm2, self._feed_forward_sublayer(training), training)
        outputs = (y, weights) if return_attention_scores else y
        return outputs, ((attention_block, feed_forward_block, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        attention_block, feed_forward_block, shape = cache
        dy = self._output_grad(dy, shape)
        dy, _ = self._residual_backprop(feed_forward_block, dy, self.norm2, self._feed_forward_backprop)
        dx, _ = self._residual_backprop(attention_block, dy, self.norm1, self._self_attention_backprop, need_dx)
        return dx

    def residual_blocks(self):
        """The layer's structure, read by the ONNX export: its residual blocks in order as (kind,
        norm, sublayer), as `TransformerDecoderLayer.residual_blocks`."""
        return [("self_attention", self.norm1, self.self_attention), ("feed_forward", self.norm2, self.feed_forward)]

    def start_cache(self, batch_size, capacity=16):
        """An empty `DecoderCache` for `step` over `batch_size` rows: this layer run causally, one
        position at a time (a decoder-only model's layer)."""
        return _start_cache(self, [self], None, None, capacity, batch_size)

    def step(self, x, cache):
        """One position x (N, D) over the cache: this layer's forward with use_causal_mask=True at
        that position (see `TransformerEncoder.step`). Returns (y, cache)."""
        y, cache, _ = _cached_step(self, [self], x, cache, False)
        return y, cache

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        if not return_attention_scores:
            return tuple(input_shape)
        return [tuple(input_shape), (input_shape[0], self.num_heads, input_shape[1], input_shape[1])]


class TransformerDecoderLayer(_TransformerLayerBase):
    """A transformer decoder layer: causal self-attention, cross-attention to the encoder's output
    (the memory), and a position-wise feed-forward network, each in a residual block.

    Post-norm (default): ``x = norm1(x + dropout(self_attn(x)))``,
    ``x = norm2(x + dropout(cross_attn(x, memory)))``, ``y = norm3(x + dropout(ff(x)))``;
    ``norm_first=True`` normalizes each block's input instead (as in TransformerEncoderLayer).

    Args: as TransformerEncoderLayer.

    Call arguments:
        inputs: ``[target (batch, T, D), memory (batch, S, D_memory)]``.
        decoder_padding_mask: ``(batch, T)`` or lengths, for the target's keys.
        decoder_attention_mask: ``(batch, T, T)`` or ``(T, T)`` for self-attention.
        encoder_padding_mask: ``(batch, S)`` or lengths, for the memory's keys.
        encoder_attention_mask: ``(batch, T, S)`` or ``(T, S)`` for cross-attention.
        use_causal_mask: target position t attends only to targets <= t (default True).
        return_attention_scores: also return the self- and cross-attention weights
            ``(batch, heads, T, T)`` and ``(batch, heads, T, S)``.

    Output shape: ``(batch, T, D)``. ``backprop(cache, dy)`` returns ``[dtarget, dmemory]``.
    Weights: ``self_attention/*``, ``norm1/*``, ``cross_attention/*``, ``norm2/*``,
    ``feed_forward/*``, ``norm3/*``. Cached decoding: ``start_cache`` / ``step`` (as
    `TransformerDecoder`'s, for this one layer); ``residual_blocks()`` describes the structure.
    """

    def build(self, input_shape):
        if not isinstance(input_shape, list) or len(input_shape) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got input shape {input_shape}")
        target_shape, memory_shape = (tuple(s) for s in input_shape)
        self._model_dim(target_shape)
        if len(memory_shape) != 3 or memory_shape[-1] is None:
            raise ValueError(f"Layer '{self.name}': memory expected shape (batch, S, features), got {memory_shape}")
        self.self_attention = self._attention("self_attention", [target_shape, target_shape])
        self.norm1 = self._norm("norm1", target_shape)
        self.cross_attention = self._attention("cross_attention", [target_shape, memory_shape])
        self.norm2 = self._norm("norm2", target_shape)
        self.feed_forward = self._feed_forward(target_shape)
        self.norm3 = self._norm("norm3", target_shape)

    def forward(self, inputs, decoder_padding_mask=None, decoder_attention_mask=None, encoder_padding_mask=None,
                encoder_attention_mask=None, use_causal_mask=True, return_attention_scores=False, training=False,
                mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got {type(inputs).__name__}")
        x = self._float_input(inputs[0], "target", ndim=3, last_dim=self.model_dim)
        memory = self._float_input(inputs[1], "memory", ndim=3)
        if isinstance(mask, (list, tuple)):  # masks propagated from upstream layers
            decoder_padding_mask = mask[0] if decoder_padding_mask is None else decoder_padding_mask
            encoder_padding_mask = mask[1] if encoder_padding_mask is None else encoder_padding_mask
        self_mask, cross_mask = _decoder_masks(self, x.shape[:2], memory.shape[1], decoder_padding_mask,
                                               decoder_attention_mask, encoder_padding_mask, encoder_attention_mask)
        return self.forward_checked(x, memory, self_mask, cross_mask, use_causal_mask, return_attention_scores,
                                    training)

    def forward_checked(self, x, memory, self_mask, cross_mask, use_causal_mask=True, return_attention_scores=False,
                        training=False):
        """`forward` on target x (B, T, D), memory (B, S, D_memory) and the self- and cross-attention
        masks it checked (as `MultiHeadAttention.forward_checked` takes them): what
        TransformerDecoder runs per layer."""
        self_attend = self._attention_sublayer(self.self_attention, None, self_mask, use_causal_mask,
                                               return_attention_scores, training)
        cross_attend = self._attention_sublayer(self.cross_attention, memory, cross_mask, False,
                                                return_attention_scores, training)
        y, self_weights, self_attention_block = self._residual(x, self.norm1, self_attend, training)
        y, cross_weights, cross_attention_block = self._residual(y, self.norm2, cross_attend, training)
        y, _, feed_forward_block = self._residual(y, self.norm3, self._feed_forward_sublayer(training), training)
        outputs = (y, self_weights, cross_weights) if return_attention_scores else y
        if not training:
            return outputs, None
        return outputs, (self_attention_block, cross_attention_block, feed_forward_block, y.shape)

    def backprop(self, cache, dy, need_dx=True):
        self_attention_block, cross_attention_block, feed_forward_block, shape = cache
        dy = self._output_grad(dy, shape)
        dy, _ = self._residual_backprop(feed_forward_block, dy, self.norm3, self._feed_forward_backprop)
        dy, dmemory = self._residual_backprop(cross_attention_block, dy, self.norm2, self.cross_attention.backprop)
        dtarget, _ = self._residual_backprop(self_attention_block, dy, self.norm1, self._self_attention_backprop,
                                             need_dx)
        return [dtarget, dmemory]

    def residual_blocks(self):
        """The layer's structure, read by the cached step's weights and the ONNX export: its residual
        blocks in order as (kind, norm, sublayer), kind "self_attention", "cross_attention" or
        "feed_forward"; each block is ``norm(x + sublayer(x))``, or ``x + sublayer(norm(x))`` with
        norm_first."""
        return [("self_attention", self.norm1, self.self_attention),
                ("cross_attention", self.norm2, self.cross_attention), ("feed_forward", self.norm3, self.feed_forward)]

    def start_cache(self, memory, encoder_padding_mask=None, capacity=16):
        """An empty `DecoderCache` of this layer for memory (N, S, D_memory); see `TransformerDecoder.start_cache`."""
        return _start_cache(self, [self], memory, encoder_padding_mask, capacity)

    def step(self, x, cache, return_attention_scores=False):
        """One target position through this layer over its cache; see `TransformerDecoder.step`."""
        return _cached_step(self, [self], x, cache, return_attention_scores)

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else None

    def compute_output_shape(self, input_shape, return_attention_scores=False):
        target, memory = (tuple(s) for s in input_shape)
        if not return_attention_scores:
            return target
        return [target, (target[0], self.num_heads, target[1], target[1]),
                (target[0], self.num_heads, target[1], memory[1])]


class _TransformerStack(_Composite):
    """num_layers copies of a transformer layer class, applied in order."""

    MAX_LAYERS = 256  # a file sets num_layers: a bound keeps building it linear in what the file holds

    layer_class = None

    @property
    def quantization_mode(self):
        return self.blocks[0].quantization_mode

    def __init__(self, num_layers, num_heads, intermediate_dim, dropout=0.0, activation="relu",
                 layer_norm_epsilon=1e-5, norm_first=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or \
                not 1 <= num_layers <= self.MAX_LAYERS:
            raise ValueError(f"{type(self).__name__}: num_layers must be an integer in [1, {self.MAX_LAYERS}], "
                             f"got {num_layers!r}")
        self.num_layers = int(num_layers)
        self.layer_config = {"num_heads": num_heads, "intermediate_dim": intermediate_dim, "dropout": dropout,
                             "activation": activation, "layer_norm_epsilon": layer_norm_epsilon,
                             "norm_first": norm_first}
        self.seed = None if seed is None else random.as_seed(seed, type(self).__name__)
        self.blocks = [self.layer_class(**self.layer_config, seed=random.sub_seed(self.seed, i), dtype=self.dtype_policy,
                                        name=f"{self.name}/layer_{i}") for i in range(self.num_layers)]

    def build(self, input_shape):
        for i, block in enumerate(self.blocks):
            self._add_sublayer(f"layer_{i}", block, input_shape)

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_config, "seed": self.seed}


class TransformerEncoder(_TransformerStack):
    """A stack of `num_layers` TransformerEncoderLayer blocks (PyTorch's nn.TransformerEncoder
    without a final norm).

    Args: num_layers, then those of TransformerEncoderLayer.
    Call arguments: as TransformerEncoderLayer; with return_attention_scores the weights come as a
    list, one ``(batch, heads, T, T)`` array per layer.
    Input shape ``(batch, T, D)``; output shape the same. Weights: ``layer_<i>/...``.
    """

    layer_class = TransformerEncoderLayer
    supports_masking = True

    def forward(self, inputs, padding_mask=None, attention_mask=None, use_causal_mask=False,
                return_attention_scores=False, training=False, mask=None):
        y = self._float_input(inputs, ndim=3)
        B, T = y.shape[:2]
        # checked once, here, so that errors name this layer; the blocks take the checked mask
        self_mask = _combine_masks(_attention_mask(attention_mask, B, T, T, _where(self, "attention_mask")),
                                   as_mask(mask if padding_mask is None else padding_mask, B, T,
                                           _where(self, "padding_mask")))
        return self.forward_checked(y, self_mask, use_causal_mask, return_attention_scores, training)

    def forward_checked(self, y, self_mask, use_causal_mask=False, return_attention_scores=False, training=False):
        """`forward` on inputs (B, T, D) and the self-attention mask it checked (as
        `MultiHeadAttention.forward_checked` takes it), for models that checked their masks."""
        block_caches, all_weights = [], []
        for block in self.blocks:
            outputs, cache = block.forward_checked(y, self_mask, use_causal_mask, return_attention_scores, training)
            y, weights = outputs if return_attention_scores else (outputs, None)
            block_caches.append(cache)
            all_weights.append(weights)
        outputs = (y, all_weights) if return_attention_scores else y
        return outputs, ((block_caches, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        block_caches, shape = cache
        dy = self._output_grad(dy, shape)
        for block, block_cache in zip(reversed(self.blocks), reversed(block_caches)):
            dy = block.backprop(block_cache, dy, need_dx or block is not self.blocks[0])
        return dy

    def start_cache(self, batch_size, capacity=16):
        """An empty `DecoderCache` for `step`: the stack run causally one position at a time (a
        decoder-only model), as `TransformerDecoder.start_cache` without a memory."""
        return _start_cache(self, self.blocks, None, None, capacity, batch_size)

    def step(self, x, cache):
        """One position through every layer at once: equal to this stack's forward with
        use_causal_mask=True at that position; see `TransformerDecoder.step`. Returns (y, cache)."""
        y, cache, _ = _cached_step(self, self.blocks, x, cache, False)
        return y, cache

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


class TransformerDecoder(_TransformerStack):
    """A stack of `num_layers` TransformerDecoderLayer blocks, all attending to the same memory.

    Args: num_layers, then those of TransformerDecoderLayer.
    Call arguments: as TransformerDecoderLayer; with return_attention_scores the self- and
    cross-attention weights come as two lists, one array per layer.
    Output shape ``(batch, T, D)``; ``backprop(cache, dy)`` returns ``[dtarget, dmemory]``.
    Cached decoding: ``cache = start_cache(memory, encoder_padding_mask)``, then per position
    ``y, cache, weights = step(x, cache)`` (every layer in one C++ call).
    """

    layer_class = TransformerDecoderLayer

    def forward(self, inputs, decoder_padding_mask=None, decoder_attention_mask=None, encoder_padding_mask=None,
                encoder_attention_mask=None, use_causal_mask=True, return_attention_scores=False, training=False,
                mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError(f"Layer '{self.name}': call with [target, memory], got {type(inputs).__name__}")
        y = self._float_input(inputs[0], "target", ndim=3)
        memory = self._float_input(inputs[1], "memory", ndim=3)
        (B, T), S = y.shape[:2], memory.shape[1]
        if isinstance(mask, (list, tuple)):  # masks propagated from upstream layers
            decoder_padding_mask = mask[0] if decoder_padding_mask is None else decoder_padding_mask
            encoder_padding_mask = mask[1] if encoder_padding_mask is None else encoder_padding_mask
        # checked once, here, so that errors name this layer; the blocks take the checked masks
        self_mask, cross_mask = _decoder_masks(self, (B, T), S, decoder_padding_mask, decoder_attention_mask,
                                               encoder_padding_mask, encoder_attention_mask)
        return self.forward_checked(y, memory, self_mask, cross_mask, use_causal_mask, return_attention_scores,
                                    training)

    def forward_checked(self, y, memory, self_mask, cross_mask, use_causal_mask=True, return_attention_scores=False,
                        training=False):
        """`forward` on target (B, T, D), memory (B, S, D_memory) and the masks it checked (as
        `TransformerDecoderLayer.forward_checked` takes them), for models that checked their masks."""
        block_caches, self_weights, cross_weights = [], [], []
        for block in self.blocks:
            outputs, cache = block.forward_checked(y, memory, self_mask, cross_mask, use_causal_mask,
                                                   return_attention_scores, training)
            y, w_self, w_cross = outputs if return_attention_scores else (outputs, None, None)
            block_caches.append(cache)
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        outputs = (y, self_weights, cross_weights) if return_attention_scores else y
        return outputs, ((block_caches, y.shape) if training else None)

    def backprop(self, cache, dy, need_dx=True):
        block_caches, shape = cache
        dy = self._output_grad(dy, shape)
        dmemory = None
        for block, block_cache in zip(reversed(self.blocks), reversed(block_caches)):
            dy, dblock_memory = block.backprop(block_cache, dy, need_dx or block is not self.blocks[0])
            dmemory = dblock_memory if dmemory is None else _add(dmemory, dblock_memory)  # every block reads it
        return [dy, dmemory]

    def start_cache(self, memory, encoder_padding_mask=None, capacity=16):
        """The `DecoderCache` that decoding starts from, for encoder outputs memory (N, S, D_memory):
        every layer's cross-attention keys and values of the memory, projected once, empty
        self-attention caches of `capacity` positions (they grow when decoding goes further), and
        the memory's padding mask ((N, S) or lengths (N,), checked here once for the whole decoding)."""
        return _start_cache(self, self.blocks, memory, encoder_padding_mask, capacity)

    def step(self, x, cache, return_attention_scores=False):
        """One target position through every layer at once (one C++ call, `decoder_step.hpp`):
        equal to this stack's causal `forward` at that position.

        Args:
            x: (N, D) the embedded target tokens of position ``cache.length``.
            cache: a `DecoderCache` (from `start_cache`, or returned by the last step); its rows for
                this position are written in place.
            return_attention_scores: also return the last layer's cross-attention weights (N, heads, S).
        Returns:
            (y (N, D), the cache (the same object, one position longer), weights or None).
        """
        return _cached_step(self, self.blocks, x, cache, return_attention_scores)

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else None

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])


# ---------------------------------------------------------------------------- cached decoding
class DecoderCache:
    """What the cached decoding of decoder layers carries for N rows (CTranslate2's per-layer cache):

    - ``keys``, ``values`` (layers, N, capacity, D): the self-attention keys and values of the
      ``length`` positions decoded so far (rows beyond ``length`` unused);
    - ``cross_keys``, ``cross_values`` (layers, N, S, D): the memory's, projected once;
    - ``source_mask`` (N, S) bool (True = real memory position), or None.

    A step writes its position's rows in place; `select` gives the independent cache of some rows.
    """

    __slots__ = ("keys", "values", "cross_keys", "cross_values", "source_mask", "length", "layer_weights")

    def __init__(self, keys, values, cross_keys, cross_values, source_mask, length, layer_weights):
        self.keys, self.values, self.cross_keys, self.cross_values = keys, values, cross_keys, cross_values
        self.source_mask, self.length = source_mask, length
        self.layer_weights = layer_weights  # each layer's step_weights(): views of its weights, read once

    def select(self, rows, sources=None):
        """The cache of the given rows (an index or bool array), in that order; only the decoded
        positions are copied. With `sources`, only the first `sources` memory positions are kept (the
        rows' real ones, when the memory was padded for longer rows)."""
        keys = np.empty((self.keys.shape[0], len(np.arange(self.keys.shape[1])[rows])) + self.keys.shape[2:],
                        self.keys.dtype)
        values = np.empty_like(keys)
        keys[:, :, :self.length] = self.keys[:, rows, :self.length]
        values[:, :, :self.length] = self.values[:, rows, :self.length]
        S = slice(sources)
        return DecoderCache(keys, values, np.ascontiguousarray(self.cross_keys[:, rows, S]),
                            np.ascontiguousarray(self.cross_values[:, rows, S]),
                            None if self.source_mask is None else np.ascontiguousarray(self.source_mask[rows, S]),
                            self.length, self.layer_weights)

    def _grow(self, positions):
        """Room for at least `positions` positions (capacity doubled, decoded rows kept)."""
        L, N, capacity, D = self.keys.shape
        if positions <= capacity:
            return
        capacity = max(positions, 2 * capacity)
        for name in ("keys", "values"):
            grown = np.empty((L, N, capacity, D), self.keys.dtype)
            grown[:, :, :self.length] = getattr(self, name)[:, :, :self.length]
            setattr(self, name, grown)


def _start_cache(owner, blocks, memory, encoder_padding_mask, capacity, batch_size=None):
    """`start_cache` of a layer or stack (`owner`) made of transformer layers `blocks`: decoder
    layers attending to `memory`, or encoder layers (memory None) over `batch_size` rows."""
    if not owner.built:
        raise ValueError(f"Layer '{owner.name}': start_cache needs the layer built (call it once, or build it)")
    for value, arg in ((capacity, "capacity"), (batch_size, "batch_size")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{_where(owner, arg)} must be a positive integer, got {value!r}")
    D, dtype = blocks[0].model_dim, owner.dtype
    if memory is None:
        N, source_mask = int(batch_size), None
        cross_keys = cross_values = np.empty((len(blocks), N, 0, D), dtype)
    else:
        memory = owner._float_input(memory, "memory", ndim=3)
        N, S = memory.shape[:2]
        source_mask = as_mask(encoder_padding_mask, N, S, _where(owner, "encoder_padding_mask"))
        cross_keys = np.stack([b.cross_attention.project("key", memory) for b in blocks])
        cross_values = np.stack([b.cross_attention.project("value", memory) for b in blocks])
    keys = np.empty((len(blocks), N, int(capacity), D), dtype)
    return DecoderCache(keys, np.empty_like(keys), cross_keys, cross_values, source_mask, 0,
                        [block.step_weights() for block in blocks])


def _cached_step(owner, blocks, x, cache, return_attention_scores):
    """`step` of a decoder layer or stack (`owner`) made of decoder layers `blocks`: one call of
    the cached step kernel for all of them."""
    first = blocks[0]
    x = owner._float_input(x, "x", ndim=2, last_dim=first.model_dim)
    if not isinstance(cache, DecoderCache) or cache.keys.shape[:2] != (len(blocks), len(x)):
        raise ValueError(f"{_where(owner, 'cache')} expected the DecoderCache of {len(blocks)} layer(s) and "
                         f"{len(x)} rows that start_cache or the last step returned")
    cache._grow(cache.length + 1)
    y, weights = kernels.decoder_stack_step(
        x=x, self_keys=cache.keys, self_values=cache.values, cross_keys=cache.cross_keys,
        cross_values=cache.cross_values, source_mask=cache.source_mask, position=cache.length,
        weights=cache.layer_weights, num_heads=first.num_heads, norm_first=first.norm_first,
        epsilon=first.layer_norm_epsilon, activation=first.activation,
        return_attention=bool(return_attention_scores))
    cache.length += 1
    return y, cache, weights
