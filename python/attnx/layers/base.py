"""The layer contract every attnx layer follows (ARCHITECTURE.md, "The layer contract").

A layer implements two methods, and everything else calls them:

- ``forward(inputs, training=False, mask=None, ...) -> (outputs, cache)``: the forward pass.
  `cache` is everything backward needs from this one call (None when not training). The layer
  keeps no per-call state of its own: a layer called several times in a model, or by several
  threads at once, keeps each call's state apart because each call has its own cache.
- ``backprop(cache, dy, need_dx=True) -> dinputs``: the gradient of each input of the call that made
  `cache` (the same structure as the inputs; None for inputs without one, e.g. token ids), and **adds**
  the parameter gradients into ``layer.grads``, so a shared layer receives the sum over its calls.
  With ``need_dx=False`` (a model's layers fed only by its inputs) the layer may skip its input
  gradient and return None. Everything about the call comes in the arguments: nothing is set on the
  layer around it.

A layer may instead define only ``call(inputs, ...)`` written with `attnx.ops` and other layers
(Keras' way): the default ``forward`` runs it, recording a training call on an `attnx.ops.Tape` (its
cache), and the default ``backprop`` replays that tape. Inside a recorded computation (such a `call`,
or an `attnx.GradientTape` block) every layer call is recorded on the tape: a `call` layer's ops
directly, any other layer's call as one node whose backward is that layer's own ``backprop``. The
layers a `call` layer holds as attributes (directly, or at any depth of lists, tuples, dicts and sets)
are its sublayers: their weights are its weights, named ``<attribute path>/<weight>``.

Callers use them as:
- ``y = layer(x, training=...)``: forward; a training call's cache is kept as the layer's last
  call, for ``dx = layer.backward(dy)`` (the one-layer convenience: backprop of the last call).
- ``y, cache = layer.apply(x, training=...)`` then ``layer.backprop(cache, dy)``: what models and
  composite layers do (builds the layer on its first call, as ``__call__`` does).

``layer.params`` / ``layer.grads`` are ordered dicts name -> ndarray that the C++ kernels read and
write in place, so optimizer updates and ``set_weights`` never invalidate them.
"""
import contextlib
import contextvars
import functools
import itertools
import math
import threading
import weakref
from collections import OrderedDict

import numpy as np

from .. import activations, backend, constraints, initializers, masking, mixed_precision, ops, quantization, \
    regularizers, serialization
from ..backend import snake_case, unique_name
from ..symbolic import any_symbolic, symbolic_call

# What the weights created in this context may still take, or None: see weight_budget.
_weight_budget = contextvars.ContextVar("attnx_weight_budget", default=None)
# The `training` of the `call` running on this thread (Keras' call context): a layer called inside it
# with training=None takes it.
_call_training = contextvars.ContextVar("attnx_call_training", default=False)


@contextlib.contextmanager
def weight_budget(nbytes, source):
    """Within the block, creating weights of more than `nbytes` bytes in total raises ValueError naming
    `source`, before anything is allocated: `attnx.load_model` builds a model from a file's config with
    the file's weight bytes as the budget, so that no config can allocate more than its file holds."""
    token = _weight_budget.set({"bytes": int(nbytes), "source": source})
    try:
        yield
    finally:
        _weight_budget.reset(token)


class Layer:
    """Base class of all layers.

    Subclasses implement ``build(input_shape)`` (create weights with ``add_weight``),
    ``forward(inputs, training=False, mask=None) -> (outputs, cache)``, ``backprop(cache, dy, need_dx=True)``,
    ``compute_output_shape(input_shape)`` and ``get_config()`` (see the module docstring); or,
    Keras' way, only ``build`` and ``call(inputs)`` written with `attnx.ops`, which the default
    `forward` / `backprop` differentiate.

    Args:
        name: unique layer name (default: the class name in snake case, numbered).
        trainable: whether optimizers update this layer's weights.
        dtype: "float32", "float64" (used by the gradient checks) or "mixed_bfloat16" (a policy,
            `attnx.mixed_precision`); default the global policy.
        input_shape: shape of one sample, for the first layer of a `Sequential` model.
    """

    registry = serialization.ClassRegistry("layer")  # the classes by the names files hold
    supports_masking = False  # True: the input mask passes through unchanged
    # The arguments besides `inputs` that are arrays with gradients, as (name, position among the extra
    # positional arguments or None), in the order `backprop` returns their gradients after the inputs':
    # a call recorded on a tape moves them into its inputs list (``mha(q, v)`` is ``mha([q, v])``,
    # ``rnn(x, initial_state=s)`` is ``rnn([x, *s])``).
    _gradient_arguments = ()
    # True for a layer whose compute_mask makes a mask from its inputs alone (Embedding(mask_zero=True))
    _creates_mask = False
    # True for a layer whose products run on bfloat16 operands under the mixed_bfloat16 policy
    # (attnx.mixed_precision); the others compute in float32 under it
    _bf16_products = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Layer.registry.add(cls)

    def __new__(cls, *args, **kwargs):
        layer = super().__new__(cls)
        layer._created = next(_creation_order)
        layer._init_arguments = (args, kwargs)  # for the default get_config of a class without one (Keras 3)
        return layer

    def __init__(self, name=None, trainable=True, dtype=None, input_shape=None, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword arguments {sorted(kwargs)}")
        self.name = name or unique_name(snake_case(type(self).__name__))
        self.trainable = bool(trainable)
        self.dtype_policy = mixed_precision.layer_policy(dtype, f"{type(self).__name__} dtype")
        self.dtype = np.dtype(self.dtype_policy.variable_dtype)  # the weights'
        self.params = OrderedDict()
        self.grads = OrderedDict()
        self._regularizers = {}
        self._cache = None
        self.built = False
        self.input_shape_arg = None if input_shape is None else tuple(input_shape)

    @property
    def compute_dtype(self):
        """The dtype of this layer's products: "bfloat16" under mixed_bfloat16 where the layer implements it
        (`_bf16_products`), else its weights' dtype."""
        # the policy's name, not np.dtype.name (a slow property), on this per-call path
        policy = self.dtype_policy.name
        return "bfloat16" if self._bf16_products and policy == "mixed_bfloat16" else self.dtype_policy.variable_dtype

    # ------------------------------------------------------------------ weights
    def add_weight(self, name, shape, initializer="glorot_uniform", regularizer=None, constraint=None):
        """Creates a parameter (and its zeroed gradient buffer) and returns it; `constraint` (attnx.constraints)
        projects it after every optimizer step."""
        shape = tuple(int(s) for s in shape)
        params, grads = self._own_weights()
        budget = _weight_budget.get()
        if budget is not None:  # checked before the initializer allocates
            nbytes = math.prod(shape) * np.dtype(self.dtype).itemsize
            if nbytes > budget["bytes"]:
                raise ValueError(f"{budget['source']}: layer '{self.name}' would create weight '{name}' of shape "
                                 f"{shape} {self.dtype} ({nbytes} bytes); the file holds {budget['bytes']} bytes "
                                 "of weights not yet created")
            budget["bytes"] -= max(nbytes, 0)  # a negative size is the initializer's error to raise
        value = np.ascontiguousarray(initializers.get(initializer)(shape, self.dtype), dtype=self.dtype)
        if value.shape != shape:
            raise ValueError(f"{self.name}: initializer for '{name}' gave shape {value.shape}, expected {shape}")
        params[name] = value
        # np.zeros (calloc), not zeros_like (which writes its zeros): a gradient no backward has written
        # keeps its pages unmapped, so a model that only predicts or exports holds its weights once
        grads[name] = np.zeros(value.shape, value.dtype)
        if regularizer is not None:
            self._regularizers[name] = regularizers.get(regularizer)
        constraints.attach(value, constraints.get(constraint))
        return value

    # Keras' kernel-layer arguments (Dense, Conv1D, Conv2D; MultiHeadAttention's without an activation,
    # has_activation False): one home for reading, creating and configuring them
    def _set_kernel_arguments(self, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                              bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None,
                              kernel_constraint=None, bias_constraint=None, has_activation=True):
        if has_activation:
            self.activation = activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.bias_constraint = constraints.get(bias_constraint)

    def _add_kernel_and_bias(self, kernel_shape, units):
        """The weights "kernel" of `kernel_shape` and, with use_bias, "bias" of (units,)."""
        self.add_weight("kernel", kernel_shape, self.kernel_initializer, self.kernel_regularizer,
                        self.kernel_constraint)
        if self.use_bias:
            self.add_weight("bias", (units,), self.bias_initializer, self.bias_regularizer, self.bias_constraint)

    def _kernel_arguments_config(self, has_activation=True):
        return {**({"activation": self.activation} if has_activation else {}), "use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer),
                "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": regularizers.serialize(self.bias_regularizer),
                "kernel_constraint": constraints.serialize(self.kernel_constraint),
                "bias_constraint": constraints.serialize(self.bias_constraint)}

    def _own_weights(self):
        """(params, grads): the dicts `add_weight` adds to."""
        return self.params, self._grads

    @property
    def grads(self):
        """name -> the buffer a backward pass adds that weight's gradient into: the layer's own, or
        inside `GradientTape.gradient` that tape's (`ops.gradient_buffers`), so a tape's gradients live
        on the tape."""
        return ops.gradient_buffers(self.params, self._grads)

    @grads.setter
    def grads(self, value):
        self._grads = value

    def zero_grad(self):
        ops.zero_gradients(self.grads.values())

    # ------------------------------------------------------------ sublayers
    def _sublayers(self):
        """(attribute path, layer) for each layer held as an attribute, directly or at any depth of lists,
        tuples, dicts and sets (Keras' tracking; a set's layers in the order they were made), each layer
        once, in the order of the attributes, public ones first (``_private`` ones too, as Keras)."""
        seen = {id(self)}
        attributes = [(n, v) for n, v in list(self.__dict__.items()) if n not in _UNTRACKED_ATTRIBUTES]
        attributes.sort(key=lambda item: item[0].startswith("_"))  # stable: a public path names a layer first
        for name, value in attributes:
            for path, layer in _layers_in(value, name, set()):
                if id(layer) not in seen:
                    seen.add(id(layer))
                    yield path, layer

    def _adopt_sublayer_weights(self):
        """Makes the weights of the sublayers (built by now) this layer's, as ``<path>/<weight>``, sharing
        the buffers: trained, counted, saved and loaded with this layer's (a `call` layer's sublayers)."""
        sublayers = list(self._sublayers())
        counts = tuple((id(layer), len(layer.params)) for _, layer in sublayers)
        if counts == self.__dict__.get("_adopted_counts"):
            return  # nothing built since the last call
        self._adopted_counts = counts
        known = {id(p) for p in self.params.values()}  # a layer reachable by two paths counts once
        for path, layer in sublayers:
            for name, p in layer.params.items():
                if id(p) not in known:
                    known.add(id(p))
                    self.params[f"{path}/{name}"] = p
                    self.grads[f"{path}/{name}"] = layer.grads[name]
            for name, regularizer in layer._all_regularizers():
                self._regularizers.setdefault(f"{path}/{name}", regularizer)

    def _all_regularizers(self):
        return list(self._regularizers.items())

    def _frozen_params(self):
        """ids of the sublayers' weights that are not trainable (a frozen sublayer's, BatchNormalization's moving
        statistics)."""
        return {id(p) for _, layer in self._sublayers() for p in layer.non_trainable_weights}

    def get_weights(self):
        """Copies of the parameters, in Keras' order."""
        return [p.copy() for p in self.params.values()]

    def set_weights(self, weights):
        """Sets the parameters from a list in Keras' order (copied into the existing buffers)."""
        weights = list(weights)
        if len(weights) != len(self.params):
            raise ValueError(f"Layer '{self.name}': set_weights expected {len(self.params)} arrays "
                             f"({', '.join(self.params)}), got {len(weights)}")
        for (pname, p), w in zip(self.params.items(), weights):
            w = np.asarray(w)
            if w.shape != p.shape:
                raise ValueError(f"Layer '{self.name}': weight '{pname}' expected shape {p.shape}, got {w.shape}")
        names, params = list(self.params), list(self.params.values())
        quantization.check_weights(names, params, weights, lambda i: f"Layer '{self.name}': weight '{names[i]}'")
        for p, w in zip(params, weights):
            np.copyto(p, w, casting="same_kind")

    def count_params(self):
        return int(sum(p.size for p in self.params.values()))

    @property
    def sublayers(self):
        """The layers this one holds as attributes (directly, or in lists, tuples and dicts), each once."""
        return [layer for _, layer in self._sublayers()]

    # ------------------------------------------------ int8 (attnx.quantization: the layer's public spec)
    quantization_mode = None  # "int8" once quantized (Dense, Embedding, the recurrent layers set it)

    def quantizable_weights(self):
        """{weight name: "columns" or "rows"}: the weights `quantize` stores as int8 with one float32
        scale per column (a kernel's output units) or per row (an Embedding's tokens); {}: none."""
        return {}

    def quantize_refusal(self):
        """Why this layer cannot be quantized (`Model.quantize` raises with it), or None."""
        return None

    def quantize(self, mode):
        """Stores the weights `quantizable_weights()` names, and those of the sublayers, as int8 for
        inference (Keras 3's name; ``mode="int8"``): see `attnx.quantization`. Returns the layer."""
        return quantization.quantize(self, mode)

    def replace_weights(self, replaced):
        """Puts new arrays in place of weights (`attnx.quantization`: a float kernel by its int8 form and
        its scale): `replaced` maps id(old array) to [(name suffix, array, gradient buffer)]; this
        layer's entry `name` of an old array becomes `name + suffix` for each, in order, and its
        regularizer goes (a regularizer of the float weight)."""
        params, grads = OrderedDict(), OrderedDict()
        for name, p in self.params.items():
            for suffix, new, grad in replaced.get(id(p), [("", p, self.grads[name])]):
                params[name + suffix], grads[name + suffix] = new, grad
            if id(p) in replaced:
                self._regularizers.pop(name, None)
        self.params.clear(), self.grads.clear()
        self.params.update(params), self.grads.update(grads)

    @property
    def trainable_params(self):
        """(name, param, grad) for every parameter an optimizer should update."""
        if not self.trainable:
            return []
        grads = self.grads  # (a property: read once)
        if not self._runs_call():
            return [(n, p, grads[n]) for n, p in self.params.items()]
        frozen = self._frozen_params()
        return [(n, p, grads[n]) for n, p in self.params.items() if id(p) not in frozen]

    @property
    def trainable_variables(self):
        """The weights an optimizer updates (Keras' name): what ``tape.gradient`` is asked for."""
        return [p for _, p, _ in self.trainable_params]

    trainable_weights = trainable_variables

    @property
    def weights(self):
        """Every weight, sublayers' included (Keras' name)."""
        return list(self.params.values())

    variables = weights

    @property
    def non_trainable_weights(self):
        trainable = {id(p) for p in self.trainable_variables}
        return [p for p in self.weights if id(p) not in trainable]

    # ------------------------------------------------------------ regularizers
    def regularization_loss(self):
        if not self._regularizers:
            return 0.0
        params = self.params
        return float(sum(reg(params[n]) for n, reg in self._regularizers.items()))

    @property
    def losses(self):
        """The regularization penalties of this layer's weights (Keras' name): one float per regularized weight."""
        return [float(reg(self.params[n])) for n, reg in self._regularizers.items()]

    def add_regularization_grads(self):
        """Adds each regularizer's gradient into the matching ``grads`` buffer."""
        if self._regularizers:
            params, grads = self.params, self.grads  # (a property: read once)
            for n, reg in self._regularizers.items():
                reg.add_gradient(params[n], grads[n])

    def regularize(self):
        """``regularization_loss()`` after ``add_regularization_grads()``, reading each regularized weight
        once (a training step's pair)."""
        if not self._regularizers:
            return 0.0
        params, grads = self.params, self.grads
        return float(sum(reg.penalty_and_add_gradient(params[n], grads[n]) for n, reg in self._regularizers.items()))

    # --------------------------------------------------------------- calling
    def __call__(self, inputs, *args, training=None, mask=None, **kwargs):
        if type(inputs) is not np.ndarray and any_symbolic(inputs):
            if mask is not None:  # an explicit mask (a symbolic tensor) is an input of the call's node
                kwargs["mask"] = mask
            return symbolic_call(self, inputs, args, kwargs)
        training = _call_training.get() if training is None else bool(training)  # Keras: inherited
        if mask is None and kwargs.get("lengths") is None:  # lengths given: they are the mask
            mask = _attached_mask(inputs)
        tape = ops.active_tape()
        if tape is not None and not self._runs_call():
            outputs = self._record_call(tape, inputs, args, kwargs, training, mask)
        else:
            outputs, cache = self.apply(inputs, *args, training=training, mask=mask, **kwargs)
            if training and cache is not None:
                self._cache = cache  # the last training call, for backward(dy)
        if mask is not None or self._creates_mask:
            _attach_masks(outputs, self.compute_mask(_map(inputs, ops.untraced), mask))
        return outputs

    def apply(self, inputs, *args, training=False, mask=None, **kwargs):
        """Runs the forward pass and returns ``(outputs, cache)``, the cache being this call's state
        for `backprop` (None unless training). Builds the layer on its first call."""
        if not self.built:
            self._build_input_shape = _shapes_of(inputs)
            self.build(self._build_input_shape)
            self.built = True
        if self._accepts("training"):
            kwargs["training"] = training
        if mask is not None and self._accepts("mask"):
            kwargs["mask"] = mask
        result = self.forward(inputs, *args, **kwargs)
        if self.__dict__.get("_deferred_restore"):  # weights restored before they existed (attnx.train.Checkpoint)
            self._deferred_restore = [restore for restore in self._deferred_restore if not restore()]
        return result

    def _accepts(self, arg):
        return arg in _parameters(type(self).forward)

    def _runs_call(self):
        """Whether `forward` is the default one that runs `call` (recording its ops on a tape)."""
        return type(self).forward is Layer.forward

    def _infers_shapes_by_calling(self):
        """Whether a symbolic call finds the output shapes by calling the layer on zeros of the inputs'
        dtypes (a `call` layer without its own compute_output_shape; its args and kwargs included)."""
        return self._runs_call() and type(self).compute_output_shape is Layer.compute_output_shape

    def _record_call(self, tape, inputs, args, kwargs, training, mask):
        """This layer's call, inside a recorded computation, as one node of `tape`: the forward's
        training path (without dropout and sampling unless `training`), its backward `backprop`."""
        inputs, args, kwargs = self._with_gradient_arguments(inputs, args, kwargs)
        for value in list(args) + list(kwargs.values()) + ([] if mask is None else [mask]):
            if any(isinstance(v, ops.TracedArray) for v in _as_list(value)):
                raise ValueError(f"Layer '{self.name}': a value with a gradient was given as an argument other than "
                                 "the inputs, whose gradient this layer does not compute; pass it in the inputs")
        traced = _map(inputs, tape.traced)
        # The same deterministic call twice on one tape (the tutorial's W2(values) at every decoder step)
        # is recorded once: its outputs are reused and its backward runs once on the summed gradients.
        # Same call means the same objects holding the same values (an array changed in place in between
        # is another call).
        call = (traced, args, kwargs, mask)
        key = None if training or not self._deterministic else (
            id(self), *[id(v) for v in _as_list(traced) + list(args) + list(kwargs.values()) + [mask]],
            *kwargs)
        if key is not None and key in tape.calls:
            recorded_call, values_then, recorded_outputs = tape.calls[key]
            if _same_objects(recorded_call, call) and _same_values(values_then, _arrays_of(call)):
                return recorded_outputs
        values = _map(traced, ops.untraced)
        randomness = contextlib.nullcontext() if training else backend.without_training_randomness()
        with randomness, ops.paused():  # the layer's own arithmetic is not the tape's
            outputs, cache = self.apply(values, *args, training=True, mask=mask, **kwargs)
        flat_inputs = _as_list(traced)
        need_dx = any(isinstance(x, ops.TracedArray) for x in flat_inputs)
        multi = isinstance(outputs, (list, tuple))

        def backward(output_grads):
            dinputs = self.run_backprop(cache, list(output_grads) if multi else output_grads[0], need_dx)
            return _as_list(dinputs) if isinstance(inputs, (list, tuple)) else [dinputs]

        params, grads = self.params, self.grads
        recorded = tape.record_call(backward, _as_list(outputs), flat_inputs,
                                    weights=[(p, grads[n]) for n, p in params.items()])
        outputs = type(outputs)(recorded) if multi else recorded[0]
        if key is not None:  # holds the objects, so their ids stay theirs, and a copy of their values
            tape.calls[key] = (call, [a.copy() for a in _arrays_of(call)], outputs)
        return outputs

    @property
    def _deterministic(self):
        """Whether an inference-mode call's outputs depend on its inputs and weights alone (not on a state
        carried between calls or on random draws), so that a tape may reuse them."""
        return not getattr(self, "stateful", False)

    def _with_gradient_arguments(self, inputs, args, kwargs):
        """(inputs, args, kwargs) with the `_gradient_arguments` given moved into the inputs list."""
        extra, taken, kwargs = [], set(), dict(kwargs)
        for name, position in self._gradient_arguments:
            if kwargs.get(name) is not None:
                value = kwargs.pop(name)
            elif position is not None and position < len(args) and args[position] is not None:
                value = args[position]
                taken.add(position)
            else:
                break
            extra += _as_list(value)
        if not extra:
            return inputs, args, kwargs
        args = tuple(a for i, a in enumerate(args) if i not in taken)
        return _as_list(inputs) + extra, args, kwargs

    def build(self, input_shape):
        """Creates the weights for inputs of `input_shape` (batch axis first, may be None)."""

    def forward(self, inputs, *args, training=False, mask=None, **kwargs):
        """Returns ``(outputs, cache)``: the outputs, and what `backprop` needs (None unless training).

        Layers with their own kernels override it. This default runs ``self.call(inputs, ...)``,
        Keras' way of writing a layer with `attnx.ops` and other layers (`training` and `mask` reach
        `call` if it names them, and layers called inside without `training` take this call's): on
        plain arrays outside training; in a training call under an `attnx.ops.Tape` that watches the
        float inputs and every array of ``self.params``, the tape being the cache. Called inside
        another recorded computation, it records on that tape.
        """
        call = getattr(self, "call", None)
        if call is None:
            raise NotImplementedError(f"{type(self).__name__}: define `call` (written with attnx.ops), or "
                                      f"`forward` and `backprop`")
        self._check_input_shapes(inputs)
        accepted = _parameters(type(self).call)
        kwargs.update({k: v for k, v in (("training", training), ("mask", mask)) if k in accepted})
        inputs = _map(inputs, lambda x: x if isinstance(x, ops.TracedArray) else self._as_call_input(x))
        tape = ops.active_tape()
        nested = tape is not None
        if not nested and not training:
            outputs = self._run_call(call, inputs, args, kwargs, training)
            return outputs, None
        tape = tape or ops.Tape()
        with tape:
            if not nested:
                inputs = _map(inputs, lambda x: tape.watch(x) if x.dtype.kind == "f" else x)
            params, grads = self.params, self.grads  # a model's are views built on each access
            for name, p in params.items():
                tape.watch(p, into=grads[name])
            outputs = self._run_call(call, inputs, args, kwargs, training)
        if nested:  # the outer call's tape holds this call: its outputs stay traced
            return outputs, None
        return _map(outputs, ops.untraced), {"tape": tape, "inputs": inputs, "outputs": outputs}

    def _run_call(self, call, inputs, args, kwargs, training):
        token = _call_training.set(bool(training))
        try:
            outputs = call(inputs, *args, **kwargs)
        finally:
            _call_training.reset(token)
        self._adopt_sublayer_weights()
        for value in _as_list(outputs):
            if not isinstance(value, (np.ndarray, np.generic, ops.TracedArray)):
                raise TypeError(f"Layer '{self.name}': `call` returned {type(value).__name__}; it must return an "
                                "array (a value of attnx.ops) or a list or tuple of them")
        return outputs

    def _check_input_shapes(self, inputs):
        """A `call` layer's inputs against those it was built for: the same rank, and for float inputs
        the same last axis (their features; token ids' last axis is time)."""
        built = getattr(self, "_build_input_shape", None)
        if built is None:
            return
        for b, x in zip(built if isinstance(built, list) else [built], _as_list(inputs)):
            g = np.shape(ops.untraced(x))
            floats = getattr(x, "dtype", np.dtype("O")).kind == "f"
            if isinstance(b, tuple) and (len(b) != len(g) or (floats and b and b[-1] not in (None, g[-1]))):
                raise ValueError(f"Layer '{self.name}' was built for inputs of shape {b}, and is called on shape {g}: "
                                 "a layer's weights fit the shape of its first call")

    def backprop(self, cache, dy, need_dx=True):
        """Gradients of the inputs of the call that returned `cache`; adds into ``self.grads``.

        Layers with their own kernels override it. This default replays the tape of a `call`
        layer's training call (see `forward`): None for inputs that were not float.
        """
        if not self._runs_call():
            raise NotImplementedError(f"{type(self).__name__}.backprop")
        tape, inputs, outputs = cache["tape"], cache["inputs"], cache["outputs"]
        sources = [x for x in _as_list(inputs) if isinstance(x, ops.TracedArray)]
        multi = isinstance(outputs, (list, tuple))
        dys = list(dy) if multi and isinstance(dy, (list, tuple)) else [dy]
        if len(dys) != len(_as_list(outputs)):
            raise ValueError(f"Layer '{self.name}': {len(_as_list(outputs))} output gradients expected, got "
                             f"{len(dys)}")
        try:
            grads = iter(tape.backward(_as_list(outputs), dys, sources))
        except ValueError as exc:
            raise ValueError(f"Layer '{self.name}': {exc}") from None
        return _map(inputs, lambda x: next(grads) if isinstance(x, ops.TracedArray) else None)

    def run_backprop(self, cache, dy, need_dx=True):
        """``backprop(cache, dy, need_dx)``, or ``backprop(cache, dy)`` for a class of yours whose
        backprop takes no `need_dx` (it then always computes its input gradient): what models and
        tapes call."""
        if "need_dx" in _parameters(type(self).backprop):
            return self.backprop(cache, dy, need_dx=need_dx)
        return self.backprop(cache, dy)

    def _as_call_input(self, x):
        """An input of `call` as an array; floats in this layer's dtype (Keras' autocast)."""
        x = np.asarray(x)
        return x.astype(self.dtype) if x.dtype.kind == "f" and x.dtype != self.dtype else x

    def backward(self, dy):
        """Backpropagates `dy` through this layer's last training call (``layer(x, training=True)``)."""
        if self._cache is None:
            raise RuntimeError(f"Layer '{self.name}': backward() needs a forward pass with training=True first")
        return self.backprop(self._cache, dy)

    def compute_mask(self, inputs, mask=None):
        return mask if self.supports_masking else None

    def compute_output_shape(self, input_shape):
        """Output shape for an input shape (batch axis None). The default runs the layer on
        small zero inputs, once with each unknown axis of size 2 and once of size 3, and
        reports axes that changed as unknown."""
        outs = [_as_list(self.apply(_dummy(input_shape, fill), training=False)[0])
                for fill in (2, 3)]
        shapes = []
        for a, b in zip(*outs):
            shapes.append(tuple(None if i == 0 or da != db else da for i, (da, db) in enumerate(zip(a.shape, b.shape))))
        return shapes if len(shapes) > 1 else shapes[0]

    # ------------------------------------------------------------------ config
    def get_config(self):
        """The arguments that make this layer again. A class of yours that does not define get_config gets
        its constructor's arguments, when they are what a config holds (numbers, strings, lists, dicts,
        None), as Keras 3 does; otherwise define get_config (and from_config)."""
        config = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype_policy.name}
        if self.input_shape_arg is not None:
            config["input_shape"] = list(self.input_shape_arg)
        init = type(self).__init__
        own_class = not (init.__module__ or "").startswith("attnx.")
        if own_class and (type(self).get_config.__module__ or "").startswith("attnx."):
            config.update(self._constructor_arguments())
        return config

    def _constructor_arguments(self):
        import inspect
        args, kwargs = getattr(self, "_init_arguments", ((), {}))
        try:
            bound = inspect.signature(type(self).__init__).bind(None, *args, **kwargs)
        except TypeError:
            bound = None
        arguments = {}
        for i, (name, value) in enumerate(({} if bound is None else bound.arguments).items()):
            if i == 0:  # self
                continue
            kind = bound.signature.parameters[name].kind
            if kind == inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise NotImplementedError(f"Layer '{self.name}' ({type(self).__name__}): its constructor took "
                                              "*args, which a config cannot name: define get_config()")
                continue
            items = value.items() if kind == inspect.Parameter.VAR_KEYWORD else [(name, value)]
            for key, v in items:
                if not _config_value(v):
                    raise NotImplementedError(f"Layer '{self.name}' ({type(self).__name__}): its constructor argument "
                                              f"{key}={type(v).__name__} is not what a config holds (numbers, strings, "
                                              "lists, dicts): define get_config() and from_config()")
                arguments[key] = v
        return arguments

    @classmethod
    def from_config(cls, config):
        import inspect
        parameters = inspect.signature(cls.__init__).parameters
        if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return cls(**config)
        layer = cls(**{k: v for k, v in config.items() if k in parameters})  # a constructor without **kwargs
        layer.name = config.get("name", layer.name)
        layer.trainable = config.get("trainable", layer.trainable)
        return layer

    # ------------------------------------------------------------- helpers
    def _float_input(self, x, arg="inputs", ndim=None, min_ndim=None, last_dim=None):
        """x as a C-contiguous array of this layer's dtype, after checking its kind and shape."""
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"Layer '{self.name}': `{arg}` must be a numeric array, got dtype {arr.dtype}")
        self._check_shape(arr, arg, ndim, min_ndim, last_dim)
        return _as_kernel_array(arr, self.dtype)

    def _check_shape(self, arr, arg, ndim=None, min_ndim=None, last_dim=None):
        if ndim is not None and arr.ndim != ndim:
            raise ValueError(f"Layer '{self.name}': `{arg}` expected rank {ndim}, got shape {arr.shape}")
        if min_ndim is not None and arr.ndim < min_ndim:
            raise ValueError(f"Layer '{self.name}': `{arg}` expected rank >= {min_ndim}, got shape {arr.shape}")
        if arr.ndim >= 1 and arr.shape[0] == 0:
            raise ValueError(f"Layer '{self.name}': `{arg}` is an empty batch (shape {arr.shape})")
        if last_dim is not None and arr.shape[-1] != last_dim:
            raise ValueError(f"Layer '{self.name}': `{arg}` expected last axis of size {last_dim} "
                             f"(shape (..., {last_dim})), got shape {arr.shape}")

    def _grad_input(self, dy, shape, arg="dy"):
        """The upstream gradient as a contiguous array of the layer dtype with the output's shape."""
        arr = np.asarray(dy)
        if arr.shape != tuple(shape):
            raise ValueError(f"Layer '{self.name}': `{arg}` expected shape {tuple(shape)}, got {arr.shape}")
        return _as_kernel_array(arr, self.dtype)

    def __repr__(self):
        return f"<{type(self).__name__} name={self.name!r}>"


# Keras' `_keras_mask` outside the functional API: the mask a layer call's compute_mask gave, kept
# beside the output array it belongs to (while that array lives), so that the next layer called on
# that array inside a `call` or a GradientTape block receives it as the graph would pass it. Each thread
# has its own table (`.masks`), keyed by the array's id and checked by a weak reference.
_attached = threading.local()


def _as_kernel_array(arr, dtype):
    """`arr` as the kernels read it: C-contiguous, aligned, of `dtype` (a copy only when it is not)."""
    flags = arr.flags
    if arr.dtype == dtype and flags.c_contiguous and flags.aligned:
        return arr  # np.require costs a microsecond to say so
    return np.require(arr, dtype, "CA")


def _mask_of(x):
    array = ops.untraced(x)
    entry = _attached.masks.get(id(array))
    return entry[1] if entry is not None and entry[0]() is array else None


def _attached_mask(inputs):
    """The masks attached to `inputs` (its structure), or None when none has one."""
    if not getattr(_attached, "masks", None):
        return None
    return masking.call_mask(inputs, _mask_of)


def _attach_masks(outputs, masks):
    table = _attached.__dict__.setdefault("masks", {})
    for output, mask in masking.output_masks(_as_list(outputs), masks):
        array = ops.untraced(output)
        if mask is not None and isinstance(array, np.ndarray):
            key = id(array)
            table[key] = (weakref.ref(array, lambda _, key=key, table=table: table.pop(key, None)), mask)


def _same_objects(a, b):
    """Whether two (inputs, args, kwargs, mask) hold the same objects, structure for structure."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_objects(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_objects(a[k], b[k]) for k in a)
    return a is b


# A layer's own attributes about a call or its construction, never sublayers: the last training call's
# cache, and the constructor's arguments (a layer given to the constructor is tracked where it is kept).
_UNTRACKED_ATTRIBUTES = frozenset({"_cache", "_init_arguments"})
_creation_order = itertools.count()  # Layer._created: the order sets of layers are tracked in


def _layers_in(value, path, containers):
    """(path, layer) for each layer in `value`, at any depth of lists, tuples, dicts and sets."""
    if isinstance(value, Layer):
        yield path, value
        return
    if not isinstance(value, (list, tuple, dict, set, frozenset)) or id(value) in containers:
        return
    containers.add(id(value))  # a container holding itself is walked once
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (set, frozenset)):
        items = enumerate(sorted((v for v in value if isinstance(v, Layer)), key=lambda layer: layer._created))
    else:
        items = enumerate(value)
    for key, item in items:
        yield from _layers_in(item, f"{path}/{key}", containers)


def _arrays_of(value):
    """The NumPy arrays in `value` (nested lists, tuples, dicts; a TracedArray's array), in order."""
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays_of(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays_of(v)]
    value = ops.untraced(value)
    return [value] if isinstance(value, np.ndarray) else []


def _same_values(arrays_then, arrays_now):
    """Whether arrays hold what copies of them taken earlier hold (NaN equal to NaN)."""
    return len(arrays_then) == len(arrays_now) and all(
        a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        for a, b in zip(arrays_then, arrays_now))


def _config_value(value):
    """Whether `value` is what a JSON config holds."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_config_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _config_value(v) for k, v in value.items())
    return False


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _map(x, fn):
    """`fn` applied to `x`, or to each item of a list or tuple `x` (the structure kept)."""
    return type(x)(fn(v) for v in x) if isinstance(x, (list, tuple)) else fn(x)


@functools.lru_cache(maxsize=None)
def _parameters(function):
    """The parameter names of `function` (a layer class's `forward` or `call`), looked up once."""
    import inspect  # on first use only: inspect is slow to import and `import attnx` must stay fast
    return frozenset(inspect.signature(function).parameters)


def _shapes_of(inputs):
    if isinstance(inputs, (list, tuple)):
        return [tuple(np.shape(x)) for x in inputs]
    return tuple(np.shape(inputs))


def _dummy(input_shape, fill):
    if isinstance(input_shape, list):
        return [_dummy(s, fill) for s in input_shape]
    return np.zeros(tuple(fill if d is None else d for d in input_shape), dtype=np.float32)


def get(identifier):
    """A layer class by the name a file holds (used when loading saved models): see
    `serialization.ClassRegistry` (the active custom_objects, attnx's own classes, registered names,
    then your classes by their class name)."""
    found = Layer.registry[identifier]
    if not (isinstance(found, type) and issubclass(found, Layer)):
        raise ValueError(f"{identifier!r} names {found!r}, not a Layer class")
    return found
