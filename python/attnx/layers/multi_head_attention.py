"""Multi-head attention (Keras' `MultiHeadAttention`), the one rule for a number of heads
(`head_sizes`) and the attention-mask forms its callers take."""

import functools
import math

import numpy as np

from .. import kernels, quantization, random
from ..masking import as_mask
from ..symbolic import any_symbolic
from .attention import _default_scale, _dense, _dense_backward, scaled_dot_product_attention_backward
from .base import Layer
from .composite import _add, _dropout_stream, _where


def _attention_mask(mask, batch, queries, keys, where):
    """An attention mask as the kernel takes it, or None: (batch, queries, keys), or
    (1, queries, keys) for one (queries, keys) mask shared by the batch (as torch's attn_mask).
    Keras' forms too: float 0/1 values, and (batch, heads, queries, keys) the same for every head."""
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        values = np.asarray(mask)
        if not np.all((values == 0) | (values == 1)):
            raise ValueError(f"{where}: a float mask must hold only 0 and 1, got other values")
        mask = values.astype(bool)
    if mask is not None and np.ndim(mask) == 4:  # per head: one mask when every head has the same
        per_head = np.asarray(mask)
        if per_head.shape[1] != 1 and not np.all(per_head == per_head[:, :1]):
            raise ValueError(f"{where}: a (batch, heads, queries, keys) mask must be the same for every head "
                             f"(attnx's kernel takes one mask for all heads), got shape {per_head.shape}")
        mask = per_head[:, 0]
    if mask is not None and np.ndim(mask) == 2:
        mask = np.asarray(mask)[None]
    mask = as_mask(mask, batch, keys, where, queries=queries, shared=True)
    if mask is not None and mask.ndim == 2:  # given as lengths: every query sees the same keys
        mask = np.ascontiguousarray(np.broadcast_to(mask[:, None, :], (batch, queries, keys)))
    return mask


def _combine_masks(attention_mask, padding_mask):
    """The one mask the attention kernel takes: the padding (B, S), the attention mask, or their AND."""
    if attention_mask is None:
        return padding_mask
    if padding_mask is None:
        return attention_mask
    return attention_mask & padding_mask[:, None, :]


# ---------------------------------------------------------------------------- attention
def head_sizes(owner, num_heads, model_dim=None):
    """The one rule for a number of heads, for every layer and model that takes `num_heads`: a
    positive integer (2.5 or True is an error, never truncated) dividing the model size `model_dim`
    (when known). Returns (num_heads, model_dim // num_heads or None)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
        raise ValueError(f"{owner}: the argument `num_heads` must be a positive integer, got {num_heads!r}")
    if model_dim is None:
        return int(num_heads), None
    if model_dim % num_heads:
        raise ValueError(f"{owner}: the embedding size {model_dim} is not divisible by num_heads={num_heads}")
    return int(num_heads), int(model_dim) // int(num_heads)


def _positive_int(value, arg):
    """`value` as a positive int; MultiHeadAttention's error (naming `arg`) for 0, negatives, floats."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"MultiHeadAttention: Invalid argument `{arg}`: expected a positive integer, got {value!r}")
    return int(value)


def _output_dims(output_shape):
    """Keras' output_shape (None, an int or a tuple of ints) as a tuple of ints, or None."""
    if output_shape is None:
        return None
    dims = (output_shape,) if not isinstance(output_shape, (list, tuple)) else tuple(output_shape)
    if not dims or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0 for d in dims):
        raise ValueError(f"MultiHeadAttention: Invalid `output_shape`: expected an int or a tuple of positive ints, "
                         f"got {output_shape!r}")
    return tuple(int(d) for d in dims)


def _mha_masks(mask, query_mask, value_mask, key_mask):
    """The (query, value, key) masks of a MultiHeadAttention call: explicit ones win over the masks
    its inputs carry (`mask`: the query's, or [query's, value's(, key's)] in a functional model)."""
    carried = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    carried += [None] * (3 - len(carried))
    return tuple(m if m is not None else c for m, c in zip((query_mask, value_mask, key_mask), carried))


def _attention_axes_arg(attention_axes):
    """Keras' `attention_axes` (None, an int, or a list or tuple of ints) as None or a tuple of ints."""
    if attention_axes is None:
        return None
    axes = (attention_axes,) if isinstance(attention_axes, (int, np.integer)) else attention_axes
    if isinstance(attention_axes, bool) or not isinstance(axes, (list, tuple)) or not axes or \
            any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
        raise ValueError(f"MultiHeadAttention: `attention_axes` must be an int, list, or tuple. Received: "
                         f"attention_axes={attention_axes!r}")
    return tuple(int(a) for a in axes)


class _AxesCache(tuple):
    """The cache of a call over `attention_axes` or inputs of rank > 3: (the layout, the rank-3 call's cache)."""


def _value_and_key(value, key):
    """The positional arguments after the query that a call gave: (), (value,) or (value, key)."""
    if value is None:
        return ()
    return (value,) if key is None else (value, key)


class MultiHeadAttention(Layer):
    """Multi-head attention (Vaswani et al. 2017) with Keras' weight layout.

    Each head h projects the inputs, ``q_h = query W^Q_h``, ``k_h = key W^K_h``, ``v_h = value W^V_h``;
    ``softmax(q_h k_h^T / sqrt(key_dim)) v_h`` and the concatenated heads are projected to the
    output. The attention core is the kernel of `attnx.layers.attention.scaled_dot_product_attention`
    (one call for all batch rows and heads, reading the projections in place).

    Args:
        num_heads: number of heads.
        key_dim: size of each head's query and key.
        value_dim: size of each head's value (default key_dim).
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_shape: size of the output's last axis (default: the query's), or a tuple of sizes
            (Keras: the output is then ``(batch, T, *output_shape)``).
        attention_axes: the axes attention runs over (Keras'): None, every axis between the batch and the
            features; an int or a list of them. The other axes between batch and features are batch axes of
            their own; the query attends over the product of its attention axes, as Keras' einsum does.
        use_gate: Keras 3.15's gated attention: ``sigmoid(query W^G + b^G)`` (per head, value_dim wide)
            multiplies each head's context before the output projection.
        kernel_initializer, bias_initializer: Keras defaults glorot_uniform and zeros.
        kernel_regularizer, bias_regularizer: e.g. ``attnx.regularizers.L2(1e-4)``, on every projection.
        kernel_constraint, bias_constraint: e.g. ``attnx.constraints.MaxNorm(2)``, applied after each step.

    Call arguments:
        query: ``(batch, T, query_dim)``; or a list ``[query, value]`` / ``[query, value, key]``. Rank > 3:
            ``(batch, ..., query_dim)`` with `attention_axes` (masks then: none, as attnx's kernel takes a
            (batch, T, S) mask of one query axis).
        value: ``(batch, S, value_dim_in)``.
        key: ``(batch, S, key_dim_in)``; default: value.
        query_mask, value_mask, key_mask: ``(batch, T)`` / ``(batch, S)`` (Keras): in a functional model
            they come from the inputs' masks (e.g. ``Embedding(mask_zero=True)``); the query's mask is
            passed on to the output. A query row with nothing to attend to gets a zero context.
        attention_mask: ``(batch, T, S)``, ``(T, S)`` or ``(batch, heads, T, S)`` the same for each head;
            bool, 0/1 integers or 0/1 floats; True = query t may attend to key s.
        key_padding_mask: ``(batch, S)`` (True = real token) or lengths ``(batch,)``.
        use_causal_mask: query t attends only to keys s <= t.
        return_attention_scores: also return the per-head weights ``(batch, num_heads, T, S)``.
        training: apply dropout and keep what backprop needs.

    Output shape: ``(batch, T, *output_shape)`` or ``(batch, T, query_dim)``.
    Weights (Keras order and shapes): query_kernel ``(query_dim, heads, key_dim)``, query_bias
    ``(heads, key_dim)``, key_kernel, key_bias, (with use_gate) gate_kernel ``(query_dim, heads, value_dim)``,
    gate_bias, value_kernel ``(value_dim_in, heads, value_dim)``, value_bias, output_kernel
    ``(heads, value_dim, out)``, output_bias ``(out,)``.
    ``backprop(cache, dy)`` (dy may be ``(doutput, dweights)``) returns ``[dquery, dvalue]``, or
    ``[dquery, dvalue, dkey]`` when a key was given; with no key, dvalue includes the key's path.
    """

    _bf16_products = True  # attnx.mixed_precision: the four projections (scores and softmax stay float32)
    _gradient_arguments = (("value", 0), ("key", 1))  # see Layer._with_gradient_arguments

    def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True, output_shape=None,
                 attention_axes=None, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None, bias_constraint=None,
                 use_gate=False, seed=None, quantization_mode=None, **kwargs):
        super().__init__(**kwargs)
        self.quantization_mode = quantization.check_mode("MultiHeadAttention", quantization_mode)
        self.num_heads, _ = head_sizes("MultiHeadAttention", num_heads)
        self.key_dim = _positive_int(key_dim, "key_dim")
        self.value_dim = _positive_int(value_dim, "value_dim") if value_dim is not None else self.key_dim
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        self.seed_generator = random.SeedGenerator(seed, "MultiHeadAttention")
        self.seed = self.seed_generator.seed
        dims = _output_dims(output_shape)
        # an int (or a tuple of one, Keras' config of it) stays an int; several sizes stay a tuple
        self.output_shape = None if dims is None else (dims[0] if len(dims) == 1 else dims)
        self.attention_axes = _attention_axes_arg(attention_axes)
        self.use_gate = bool(use_gate)
        self._set_kernel_arguments(None, use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
                                   bias_regularizer, kernel_constraint, bias_constraint, has_activation=False)

    # Keras-style calls layer(query, value, key): Layer.__call__ and Layer.apply would build from
    # the query's shape alone, so both build here from all three, on arrays and on a model's
    # symbolic tensors alike.
    supports_masking = True

    def __call__(self, query, value=None, key=None, **kwargs):
        self._build_from_inputs(query, value, key)
        if value is not None and not isinstance(query, (list, tuple)) and \
                any(type(t) is not np.ndarray and any_symbolic(t) for t in (query, value, key) if t is not None):
            # on a model's tensors the call records [query, value(, key)] as its inputs: each input's mask
            # and shape reach the layer
            return super().__call__([query, *_value_and_key(value, key)], **kwargs)
        return super().__call__(query, *_value_and_key(value, key), **kwargs)

    def apply(self, query, value=None, key=None, **kwargs):
        self._build_from_inputs(query, value, key)
        return super().apply(query, *_value_and_key(value, key), **kwargs)

    def _build_from_inputs(self, query, value, key):
        if not self.built and value is not None and not isinstance(query, (list, tuple)):
            self.build([tuple(np.shape(t)) for t in (query, value, key) if t is not None])
            self.built = True

    def build(self, input_shape):
        """Creates the weights for [query, value] or [query, value, key] shapes."""
        if not isinstance(input_shape, list) or not 2 <= len(input_shape) <= 3:
            raise ValueError(f"Layer '{self.name}': call with (query, value[, key]) or [query, value[, key]], "
                             f"got input shape {input_shape}")
        self._check_shapes(*input_shape)
        self._layout(input_shape)
        shapes = list(input_shape) + [input_shape[1]] * (3 - len(input_shape))
        self.build_from_dims(shapes[0][-1], shapes[1][-1], shapes[2][-1])

    def _layout(self, shapes):
        """(batch axes, attention axes) of inputs of these shapes (query, value[, key]), non-negative, or None
        for (batch, T, features) attention over axis 1 (the kernel's own layout). Keras' rule: the attention
        axes lie between the batch axis and the features; query, value and key have one rank and share the
        sizes of the batch axes."""
        ranks = {len(shape) for shape in shapes}
        if len(ranks) != 1 or min(ranks) < 3:
            raise ValueError(f"Layer '{self.name}': query, value and key should be rank 3 (batch, time, features), "
                             f"got shapes {[tuple(s) for s in shapes]}; or all of one rank above 3 (batch, ..., "
                             "features) with attention_axes")
        ndim = ranks.pop()
        given = tuple(range(1, ndim - 1)) if self.attention_axes is None else self.attention_axes
        axes = tuple(a + ndim if a < 0 else a for a in given)  # as Keras: -2 is the last axis before the features
        if any(not 1 <= a <= ndim - 2 for a in axes) or len(set(axes)) != len(axes):
            raise ValueError(f"Layer '{self.name}': attention_axes={self.attention_axes} for inputs of rank {ndim}: "
                             f"each axis once, between the batch axis and the features (1 to {ndim - 2})")
        axes = tuple(sorted(axes))
        batch_axes = tuple(a for a in range(ndim - 1) if a not in axes)
        if axes == (1,) and ndim == 3:
            return None
        for shape in shapes[1:]:
            if any(shape[a] != shapes[0][a] and None not in (shape[a], shapes[0][a]) for a in batch_axes[1:]):
                raise ValueError(f"Layer '{self.name}': query, value and key must share the sizes of the axes "
                                 f"{batch_axes[1:]} (not attention axes {axes}), got shapes "
                                 f"{[tuple(s) for s in shapes]}")
        return batch_axes, axes

    def _check_shapes(self, query_shape, value_shape, key_shape=None):
        """Keras' shape rule: value and key share every axis but the batch and the last."""
        if key_shape is not None and tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(f"Layer '{self.name}': All dimensions of `value` and `key`, except the last one, must "
                             f"be equal. Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}")

    def build_from_dims(self, query_dim, value_dim, key_dim):
        """Creates the weights for inputs with these feature sizes."""
        H, dk, dv = self.num_heads, self.key_dim, self.value_dim
        out = _output_dims(self.output_shape) or (query_dim,)
        # Keras' order: its sublayers query, key, gate, value, attention_output, as its build makes them
        projections = [("query", query_dim, dk), ("key", key_dim, dk)] + \
            [("gate", query_dim, dv)] * self.use_gate + [("value", value_dim, dv)]
        with quantization.building(self):
            for name, in_dim, head_dim in projections:
                self._add_projection(name, (in_dim, H, head_dim), (H, head_dim))
            self._add_projection("output", (H, dv, *out), out)

    def quantizable_weights(self):
        # int8: each projection's kernel per output unit; the output kernel's input is (heads, value_dim)
        return {name: "head_columns" if name == "output_kernel" else "columns"
                for name in self.params if name.endswith("_kernel")}

    def _add_projection(self, name, kernel_shape, bias_shape):
        self.add_weight(f"{name}_kernel", kernel_shape, self.kernel_initializer, self.kernel_regularizer,
                        self.kernel_constraint)
        if self.use_bias:
            self.add_weight(f"{name}_bias", bias_shape, self.bias_initializer, self.bias_regularizer,
                            self.bias_constraint)

    def matrix(self, name):
        """The kernel of projection `name` ("query", "key", "value", "output") as the (in, out)
        matrix the kernels take (a view of the weight)."""
        return self._matrix(name, self.params[f"{name}_kernel"])

    @staticmethod
    def _matrix(name, kernel):
        """The Keras-shaped kernel as the (in, out) matrix dense_forward takes (a view)."""
        if name == "output":
            return kernel.reshape(kernel.shape[0] * kernel.shape[1], -1)
        return kernel.reshape(kernel.shape[0], -1)

    def _output_tail(self):
        """The output's axes after (batch, T): the output kernel's after (heads, value_dim)."""
        return self.params["output_kernel"].shape[2:]

    def _project(self, name, rows, activation="linear"):
        bias = self.params.get(f"{name}_bias")
        bias = None if bias is None else bias.reshape(-1)
        if self.quantization_mode:  # int8 products, the scales, bias and activation in their epilogue
            return kernels.dense_forward_int8(x=np.require(rows, np.float32, "CA"), bias=bias, activation=activation,
                                              kernel=quantization.packed(self, f"{name}_kernel"))
        kernel = self._matrix(name, self.params[f"{name}_kernel"])
        if self.compute_dtype == "bfloat16":
            return kernels.dense_forward_bf16(x=rows, kernel=kernel, bias=bias, activation=activation)[0]
        return _dense(rows, kernel, bias, activation)

    def _project_input(self, names, rows):
        """The projections `names` of one input's rows: under bfloat16 from one call that pairs the rows
        once for all of them (dense_forward_bf16_blocks), else one by one."""
        if self.compute_dtype != "bfloat16" or self.quantization_mode or len(names) == 1:
            return [self._project(name, rows) for name in names]
        biases = [self.params.get(f"{name}_bias") for name in names]
        return kernels.dense_forward_bf16_blocks(x=rows, kernels=[self.matrix(name) for name in names],
                                                 biases=[None if b is None else b.reshape(-1) for b in biases])

    def _project_input_backward(self, names, dys, rows, need_dx):
        """Backward of `_project_input`: the input's gradient, the sum of the projections' (None when not
        `need_dx`)."""
        if self.compute_dtype != "bfloat16" or len(names) == 1:
            dxs = [self._project_backward(name, dy, rows, need_dx) for name, dy in zip(names, dys)]
            return functools.reduce(_add, dxs) if need_dx else None
        dbiases = [self.grads.get(f"{name}_bias") for name in names]
        return kernels.dense_backward_bf16_blocks(
            dys=list(dys), x=rows, kernels=[self.matrix(name) for name in names],
            dkernels=[self._matrix(name, self.grads[f"{name}_kernel"]) for name in names],
            dbiases=[None if d is None else d.reshape(-1) for d in dbiases], need_dx=need_dx)

    def project(self, name, inputs):
        """One projection on its own, for incremental decoding (a decoder step reuses the keys and
        values of the earlier steps): ``"query"``, ``"key"`` or ``"value"`` of inputs (B, T, in) as
        (B, T, heads * head_dim), or ``"output"`` of a context (B, T, heads * value_dim)."""
        x = self._float_input(inputs, name, ndim=3)
        B, T = x.shape[:2]
        return self._project(name, x.reshape(B * T, x.shape[2])).reshape(B, T, -1)

    def _project_backward(self, name, dy, rows, need_dx, y=None, activation="linear"):
        dbias = self.grads.get(f"{name}_bias")
        kernel, dkernel = self._matrix(name, self.params[f"{name}_kernel"]), self._matrix(name, self.grads[f"{name}_kernel"])
        dbias = None if dbias is None else dbias.reshape(-1)
        # a linear activation does not read its output y: dy stands in for it
        y = dy if y is None else y
        if self.compute_dtype == "bfloat16":
            return kernels.dense_backward_bf16(dy=dy, x=rows, kernel=kernel, y=y, z=y, activation=activation,
                                               dkernel=dkernel, dbias=dbias, need_dx=need_dx)
        return _dense_backward(dy, rows, kernel, y, activation, dkernel, dbias, need_dx)

    def forward(self, query, value=None, key=None, attention_mask=None, key_padding_mask=None,
                use_causal_mask=False, return_attention_scores=False, training=False, mask=None, query_mask=None,
                value_mask=None, key_mask=None):
        if isinstance(query, (list, tuple)):
            if not 2 <= len(query) <= 3 or value is not None:
                raise ValueError(f"Layer '{self.name}': call with [query, value] or [query, value, key], got "
                                 f"{len(query)} inputs")
            query, value, key = (list(query) + [None])[:3]
        if value is None:
            raise ValueError(f"Layer '{self.name}': needs a value (self-attention: layer(x, x))")
        has_key = key is not None
        q_in = self._float_input(query, "query", min_ndim=3)
        v_in = self._float_input(value, "value", min_ndim=3)
        k_in = self._float_input(key, "key", min_ndim=3) if has_key else v_in
        self._check_shapes(q_in.shape, v_in.shape, k_in.shape)
        layout = self._layout([q_in.shape, v_in.shape, k_in.shape])
        for name, arr in (("query", q_in), ("value", v_in), ("key", k_in)):
            in_dim = self.params[f"{name}_kernel"].shape[0]
            if arr.shape[-1] != in_dim:
                raise ValueError(f"Layer '{self.name}': `{name}` expected shape ({q_in.shape[0]}, *, {in_dim}), "
                                 f"got {arr.shape}")
        if layout is not None:
            masks = (attention_mask, key_padding_mask) + _mha_masks(mask, query_mask, value_mask, key_mask)
            if use_causal_mask or any(m is not None for m in masks):
                raise ValueError(f"Layer '{self.name}': masks and use_causal_mask take inputs (batch, T, features) "
                                 f"attending over axis 1; got query {q_in.shape} with attention_axes="
                                 f"{self.attention_axes}: call it without masks")
            return self._forward_over_axes(layout, q_in, v_in, k_in if has_key else None, return_attention_scores,
                                           training)
        B, T = q_in.shape[:2]
        S = v_in.shape[1]
        if v_in.shape[0] != B or k_in.shape[:2] != (B, S):
            raise ValueError(f"Layer '{self.name}': query, value and key must share the batch and value/key the "
                             f"length; got query {q_in.shape}, value {v_in.shape}, key {k_in.shape}")
        query_mask, value_mask, key_mask = _mha_masks(mask, query_mask, value_mask, key_mask)
        padding = None  # (B, S): key_padding_mask AND value_mask AND key_mask
        for arg, m in (("key_padding_mask", key_padding_mask), ("value_mask", value_mask), ("key_mask", key_mask)):
            m = as_mask(m, B, S, _where(self, arg))
            padding = m if padding is None else padding if m is None else padding & m
        mask = _combine_masks(_attention_mask(attention_mask, B, T, S, _where(self, "attention_mask")), padding)
        if query_mask is not None:  # Keras: a padded query attends to nothing
            rows = as_mask(query_mask, B, T, _where(self, "query_mask"))
            full = np.ones((B, T, S), bool) if mask is None else np.broadcast_to(
                mask if mask.ndim == 3 else mask[:, None, :], (B, T, S))
            mask = np.ascontiguousarray(full & rows[:, :, None])
        return self.forward_checked(q_in, v_in, k_in if has_key else None, mask, use_causal_mask,
                                    return_attention_scores, training)

    def _forward_over_axes(self, layout, query, value, key, return_attention_scores, training):
        """Attention over `layout`'s attention axes: the batch axes (the batch and every other axis before the
        features) merged into one batch and the attention axes into one sequence, the rank-3 call, and its
        results put back in the query's axes; the scores (batch axes, heads, query's attention axes, value's
        attention axes) as Keras' einsum gives them."""
        batch_axes, axes = layout
        perm = batch_axes + axes + (query.ndim - 1,)
        flat = [None if x is None else np.ascontiguousarray(np.transpose(x, perm)).reshape(
            math.prod(x.shape[a] for a in batch_axes), math.prod(x.shape[a] for a in axes), x.shape[-1])
            for x in (query, value, key)]
        outputs, cache = self.forward_checked(*flat, None, False, return_attention_scores, training)
        out, weights = outputs if return_attention_scores else (outputs, None)
        lead = tuple(query.shape[a] for a in batch_axes)
        out = out.reshape(lead + tuple(query.shape[a] for a in axes) + out.shape[2:])
        restore = tuple(np.argsort(batch_axes + axes)) + tuple(range(query.ndim - 1, out.ndim))
        out = np.ascontiguousarray(np.transpose(out, restore))
        if return_attention_scores:
            weights = weights.reshape(lead + (self.num_heads,) + tuple(query.shape[a] for a in axes) +
                                      tuple(value.shape[a] for a in axes))
        shapes = tuple(None if x is None else x.shape for x in (query, value, key))
        return ((out, weights) if return_attention_scores else out), \
            (None if cache is None else _AxesCache((perm, restore, shapes, cache)))

    def _backprop_over_axes(self, cache, dy, need_dx):
        """`backprop` of a `_forward_over_axes` call: dy (and dweights) in the rank-3 call's layout, its input
        gradients back in the inputs' axes."""
        perm, restore, (query_shape, value_shape, key_shape), inner = cache
        dweights = None
        if isinstance(dy, (list, tuple)):
            dy, dweights = dy
        tail = self._output_tail()
        dy = self._grad_input(dy, tuple(query_shape[:-1]) + tail)
        forward_order = tuple(int(a) for a in np.argsort(restore))  # the output's axes as the rank-3 call's
        merged = inner[3].shape[:2]  # the projected query (batch', T', ...) of the rank-3 call
        dy = np.ascontiguousarray(np.transpose(dy, forward_order)).reshape(merged + tail)
        if dweights is not None:
            dweights = np.asarray(dweights).reshape(inner[7].shape)
        grads = self.backprop(inner, dy if dweights is None else (dy, dweights), need_dx)
        if grads is None:
            return None
        inverse = tuple(int(a) for a in np.argsort(perm))
        shapes = [query_shape, value_shape] + ([key_shape] if key_shape is not None else [])
        return [np.ascontiguousarray(np.transpose(g.reshape(tuple(shape[a] for a in perm)), inverse))
                for g, shape in zip(grads, shapes)]

    def forward_checked(self, query, value, key, mask, use_causal_mask=False, return_attention_scores=False,
                        training=False):
        """`forward` on inputs and one mask it has checked: query (B, T, in), value (B, S, in), key or
        None (the value), mask (B, S), (B, T, S), (1, T, S) or None as the kernel takes it (the
        layers of this module call it with the masks they checked once)."""
        quantization.inference_only(self, training and self.quantization_mode)
        q_in, v_in = query, value
        has_key = key is not None
        k_in = key if has_key else v_in
        one_input = q_in is v_in and not has_key  # self-attention, layer(x, x)
        (B, T), S = q_in.shape[:2], v_in.shape[1]
        H = self.num_heads
        # sizes spelled out, not -1: a zero-length query or value (B * T == 0) has no size to infer from
        q_rows, k_rows, v_rows = (q_in.reshape(B * T, q_in.shape[2]), k_in.reshape(B * S, k_in.shape[2]),
                                  v_in.reshape(B * S, v_in.shape[2]))
        if self.quantization_mode and q_in is k_in is v_in:  # int8 self-attention: q, k, v in one product
            kernel, bias = quantization.packed_projections(self, ("query", "key", "value"))
            q, k, v = (p.reshape(B, T, -1) for p in kernels.dense_forward_int8_blocks(
                x=np.require(q_rows, np.float32, "CA"), kernel=kernel, bias=bias,
                widths=[H * self.key_dim, H * self.key_dim, H * self.value_dim]))
        else:  # the projections of one input from one call (key and value, or all three in self-attention)
            if one_input:
                q, k, v = self._project_input(("query", "key", "value"), q_rows)
            else:
                q, = self._project_input(("query",), q_rows)
                k, v = (self._project_input(("key", "value"), v_rows) if not has_key else
                        self._project_input(("key",), k_rows) + self._project_input(("value",), v_rows))
            q, k, v = (q.reshape(B, T, H * self.key_dim), k.reshape(B, S, H * self.key_dim),
                       v.reshape(B, S, H * self.value_dim))
        # the (B, H, T, S) keep mask is drawn by the kernel as it goes (never written out), forward and backward
        stream = _dropout_stream(self.seed_generator, B, self.dropout) if training else None
        # the kernel itself: the mask is checked (scaled_dot_product_attention would check it again)
        context, weights = kernels.sdpa_forward(query=q, key=k, value=v, mask=mask, causal=bool(use_causal_mask),
                                                scale=_default_scale(q, H), heads=H, dropout_stream=stream,
                                                return_weights=bool(training or return_attention_scores),
                                                bf16=self.compute_dtype == "bfloat16")
        context_rows = context.reshape(B * T, H * self.value_dim)
        # use_gate: each head's context times sigmoid(query W^G + b^G), before the output projection (Keras 3.15)
        gate = self._project("gate", q_rows, "sigmoid") if self.use_gate else None
        attended = context_rows if gate is None else context_rows * gate
        out = self._project("output", attended).reshape(B, T, *self._output_tail())
        outputs = (out, weights) if return_attention_scores else out
        if not training:
            return outputs, None
        # with no key given, the key projection read the value: k_rows is None says so to backprop
        return outputs, (q_rows, k_rows if has_key else None, v_rows, q, k, v, stream, weights, attended, gate,
                         context_rows, one_input)

    def backprop(self, cache, dy, need_dx=True):
        if isinstance(cache, _AxesCache):
            return self._backprop_over_axes(cache, dy, need_dx)
        return self._backprop(cache, dy, need_dx, sum_inputs=False)

    def backprop_self_attention(self, cache, dy, need_dx=True):
        """`backprop` of a call ``layer(x, x)`` (query, key and value one input, as `forward_checked`'s of the
        transformer layers): that input's one gradient, the sum of `backprop`'s two, under bfloat16 from one
        product (None when not `need_dx`)."""
        if isinstance(cache, _AxesCache) or not cache[-1]:
            raise ValueError(f"Layer '{self.name}': backprop_self_attention needs a call layer(x, x) on rank-3 "
                             "inputs, with no key")
        return self._backprop(cache, dy, need_dx, sum_inputs=True)

    def _backprop(self, cache, dy, need_dx, sum_inputs):
        q_rows, k_rows, v_rows, q, k, v, stream, weights, attended, gate, context_rows, one_input = cache
        dweights = None
        if isinstance(dy, (list, tuple)):
            dy, dweights = dy
            if dweights is not None:
                dweights = self._grad_input(dweights, weights.shape, "dweights")
        (B, T, _), S = q.shape, v.shape[1]
        tail = self._output_tail()
        dy = self._grad_input(dy, (B, T, *tail))
        # sizes spelled out, not -1, as in forward (zero-length sequences)
        dattended = self._project_backward("output", dy.reshape(B * T, math.prod(tail)), attended, need_dx=True)
        dcontext = dattended if gate is None else dattended * gate
        dq, dk, dv = scaled_dot_product_attention_backward(dcontext.reshape(B, T, context_rows.shape[1]), weights,
                                                           q, k, v, heads=self.num_heads, dweights=dweights,
                                                           dropout_stream=stream,
                                                           bf16=self.compute_dtype == "bfloat16")
        # sizes spelled out, not -1, as in forward (zero-length sequences)
        dq, dk, dv = dq.reshape(B * T, q.shape[2]), dk.reshape(B * S, k.shape[2]), dv.reshape(B * S, v.shape[2])
        dgate_query = None
        if gate is not None:
            dgate_query = self._project_backward("gate", dattended * context_rows, q_rows, need_dx, gate, "sigmoid")
        if sum_inputs:  # the one input's gradient: the three projections' from one product
            dx = self._project_input_backward(("query", "key", "value"), (dq, dk, dv), q_rows, need_dx)
            if not need_dx:
                return None
            return (dx if dgate_query is None else _add(dx, dgate_query)).reshape(B, T, q_rows.shape[1])
        dquery = self._project_input_backward(("query",), (dq,), q_rows, need_dx)
        if k_rows is None:  # the value was the key too
            dvalue = self._project_input_backward(("key", "value"), (dk, dv), v_rows, need_dx)
        else:
            dvalue = self._project_input_backward(("value",), (dv,), v_rows, need_dx)
            dkey = self._project_input_backward(("key",), (dk,), k_rows, need_dx)
        if not need_dx:
            return None
        if dgate_query is not None:
            dquery = _add(dquery, dgate_query)
        dquery, dvalue = dquery.reshape(B, T, q_rows.shape[1]), dvalue.reshape(B, S, v_rows.shape[1])
        return [dquery, dvalue] if k_rows is None else [dquery, dvalue, dkey.reshape(B, S, k_rows.shape[1])]

    def compute_mask(self, inputs, mask=None):
        return mask[0] if isinstance(mask, (list, tuple)) else mask  # the query's (Keras)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None, return_attention_scores=False):
        """Keras' ``(query_shape, value_shape, key_shape)``, or one list of them."""
        if value_shape is None and isinstance(query_shape, list) and query_shape and \
                isinstance(query_shape[0], (list, tuple)):
            query_shape, value_shape, key_shape = (list(query_shape) + [None, None])[:3]
        query_shape = tuple(query_shape)
        if value_shape is not None:
            value_shape = tuple(value_shape)
            self._check_shapes(query_shape, value_shape, None if key_shape is None else tuple(key_shape))
        out = query_shape[:-1] + (_output_dims(self.output_shape) or (query_shape[-1],))
        if not return_attention_scores:
            return out
        if value_shape is None:
            return [out, (query_shape[0], self.num_heads) + query_shape[1:-1] + (None,)]
        layout = self._layout([query_shape, value_shape])
        if layout is None:
            return [out, (query_shape[0], self.num_heads, query_shape[1], value_shape[1])]
        batch_axes, axes = layout
        return [out, tuple(query_shape[a] for a in batch_axes) + (self.num_heads,) +
                tuple(query_shape[a] for a in axes) + tuple(value_shape[a] for a in axes)]

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "key_dim": self.key_dim,
                "value_dim": self.value_dim, "dropout": self.dropout, "output_shape": self.output_shape,
                "seed": self.seed, "attention_axes": self.attention_axes, "use_gate": self.use_gate,
                **quantization.config(self), **self._kernel_arguments_config(has_activation=False)}

