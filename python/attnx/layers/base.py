"""The layer contract every attnx layer follows (ARCHITECTURE.md, "The layer contract").

A layer implements two methods, and everything else calls them:

- ``forward(inputs, training=False, mask=None, ...) -> (outputs, cache)``: the forward pass.
  `cache` is everything backward needs from this one call (None when not training). The layer
  keeps no per-call state of its own: a layer called several times in a model, or by several
  threads at once, keeps each call's state apart because each call has its own cache.
- ``backprop(cache, dy) -> dinputs``: the gradient of each input of the call that made `cache`
  (the same structure as the inputs; None for inputs without one, e.g. token ids), and **adds**
  the parameter gradients into ``layer.grads``, so a shared layer receives the sum over its calls.
  When ``layer.input_gradient_needed`` is False (set by a model for layers fed only by its
  inputs) the layer may skip its input gradient and return None.

A layer may instead define only ``call(inputs, ...)`` written with `attnx.ops` (Keras' way): the
default ``forward`` runs it, recording a training call on an `attnx.ops.Tape` (its cache), and the
default ``backprop`` replays that tape.

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
import math
from collections import OrderedDict

import numpy as np

from .. import backend, initializers, ops, regularizers
from ..backend import snake_case, unique_name
from ..symbolic import any_symbolic, symbolic_call

# What the weights created in this context may still take, or None: see weight_budget.
_weight_budget = contextvars.ContextVar("attnx_weight_budget", default=None)


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


def dropout_keep(rng, shape, rate, dtype):
    """Inverted dropout's scaled keep mask: 1 / (1 - rate) where ``rng.random(shape) >= rate``, else 0."""
    dtype = np.dtype(dtype)
    return (rng.random(shape) >= rate).astype(dtype) * dtype.type(1.0 / (1.0 - rate))


class Layer:
    """Base class of all layers.

    Subclasses implement ``build(input_shape)`` (create weights with ``add_weight``),
    ``forward(inputs, training=False, mask=None) -> (outputs, cache)``, ``backprop(cache, dy)``,
    ``compute_output_shape(input_shape)`` and ``get_config()`` (see the module docstring); or,
    Keras' way, only ``build`` and ``call(inputs)`` written with `attnx.ops`, which the default
    `forward` / `backprop` differentiate.

    Args:
        name: unique layer name (default: the class name in snake case, numbered).
        trainable: whether optimizers update this layer's weights.
        dtype: "float32" (default) or "float64" (used by the gradient checks).
        input_shape: shape of one sample, for the first layer of a `Sequential` model.
    """

    registry = {}
    supports_masking = False  # True: the input mask passes through unchanged
    # A model's training step clears this for layers fed only by its inputs, whose input
    # gradient nobody reads; layers may then skip computing it and return None.
    input_gradient_needed = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Layer.registry[cls.__name__] = cls

    def __init__(self, name=None, trainable=True, dtype="float32", input_shape=None, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword arguments {sorted(kwargs)}")
        self.name = name or unique_name(snake_case(type(self).__name__))
        self.trainable = bool(trainable)
        self.dtype = backend.as_float_dtype(dtype, f"{type(self).__name__} dtype")
        self.params = OrderedDict()
        self.grads = OrderedDict()
        self._regularizers = {}
        self._cache = None
        self.built = False
        self.input_shape_arg = None if input_shape is None else tuple(input_shape)

    # ------------------------------------------------------------------ weights
    def add_weight(self, name, shape, initializer="glorot_uniform", regularizer=None):
        """Creates a parameter (and its zeroed gradient buffer) and returns it."""
        shape = tuple(int(s) for s in shape)
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
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)
        if regularizer is not None:
            self._regularizers[name] = regularizers.get(regularizer)
        return value

    def zero_grad(self):
        for g in self.grads.values():
            g.fill(0)

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
            np.copyto(p, w, casting="same_kind")

    def count_params(self):
        return int(sum(p.size for p in self.params.values()))

    @property
    def trainable_params(self):
        """(name, param, grad) for every parameter an optimizer should update."""
        if not self.trainable:
            return []
        return [(n, p, self.grads[n]) for n, p in self.params.items()]

    # ------------------------------------------------------------ regularizers
    def regularization_loss(self):
        return float(sum(reg(self.params[n]) for n, reg in self._regularizers.items()))

    def add_regularization_grads(self):
        """Adds each regularizer's gradient into the matching ``grads`` buffer."""
        for n, reg in self._regularizers.items():
            reg.add_gradient(self.params[n], self.grads[n])

    # --------------------------------------------------------------- calling
    def __call__(self, inputs, *args, training=False, mask=None, **kwargs):
        if type(inputs) is not np.ndarray and any_symbolic(inputs):
            if mask is not None:  # an explicit mask (a symbolic tensor) is an input of the call's node
                kwargs["mask"] = mask
            return symbolic_call(self, inputs, args, kwargs)
        outputs, cache = self.apply(inputs, *args, training=training, mask=mask, **kwargs)
        if training:
            self._cache = cache  # the last training call, for backward(dy)
        return outputs

    def apply(self, inputs, *args, training=False, mask=None, **kwargs):
        """Runs the forward pass and returns ``(outputs, cache)``, the cache being this call's state
        for `backprop` (None unless training). Builds the layer on its first call."""
        if not self.built:
            self.build(_shapes_of(inputs))
            self.built = True
        if self._accepts("training"):
            kwargs["training"] = training
        if mask is not None and self._accepts("mask"):
            kwargs["mask"] = mask
        return self.forward(inputs, *args, **kwargs)

    def _accepts(self, arg):
        return arg in _parameters(type(self).forward)

    def build(self, input_shape):
        """Creates the weights for inputs of `input_shape` (batch axis first, may be None)."""

    def forward(self, inputs, *args, training=False, mask=None, **kwargs):
        """Returns ``(outputs, cache)``: the outputs, and what `backprop` needs (None unless training).

        Layers with their own kernels override it. This default runs ``self.call(inputs, ...)``,
        Keras' way of writing a layer with `attnx.ops` (`training` and `mask` reach `call` if it
        names them): on plain arrays outside training; in a training call under an
        `attnx.ops.Tape` that watches the float inputs and every array of ``self.params``, the tape
        being the cache. Called from inside another layer's traced `call`, it records on that tape.
        """
        call = getattr(self, "call", None)
        if call is None:
            raise NotImplementedError(f"{type(self).__name__}: define `call` (written with attnx.ops), or "
                                      f"`forward` and `backprop`")
        accepted = _parameters(type(self).call)
        kwargs.update({k: v for k, v in (("training", training), ("mask", mask)) if k in accepted})
        inputs = _map(inputs, lambda x: x if isinstance(x, ops.TracedArray) else self._as_call_input(x))
        tape = ops.active_tape()
        if tape is None and not training:
            return call(inputs, *args, **kwargs), None
        nested = tape is not None
        tape = tape or ops.Tape()
        with tape:
            if not nested:
                inputs = _map(inputs, lambda x: tape.watch(x) if x.dtype.kind == "f" else x)
            for name, p in self.params.items():
                tape.watch(p, into=self.grads[name])
            outputs = call(inputs, *args, **kwargs)
        if nested:  # the outer call's tape holds this call: its outputs stay traced
            return outputs, None
        return _map(outputs, ops.untraced), {"tape": tape, "inputs": inputs, "outputs": outputs}

    def backprop(self, cache, dy):
        """Gradients of the inputs of the call that returned `cache`; adds into ``self.grads``.

        Layers with their own kernels override it. This default replays the tape of a `call`
        layer's training call (see `forward`): None for inputs that were not float.
        """
        if type(self).forward is not Layer.forward:
            raise NotImplementedError(f"{type(self).__name__}.backprop")
        tape, inputs, outputs = cache["tape"], cache["inputs"], cache["outputs"]
        sources = [x for x in _as_list(inputs) if isinstance(x, ops.TracedArray)]
        multi = isinstance(outputs, (list, tuple))
        grads = iter(tape.backward(_as_list(outputs), list(dy) if multi else [dy], sources))
        return _map(inputs, lambda x: next(grads) if isinstance(x, ops.TracedArray) else None)

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
        config = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype.name}
        if self.input_shape_arg is not None:
            config["input_shape"] = list(self.input_shape_arg)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    # ------------------------------------------------------------- helpers
    def _float_input(self, x, arg="inputs", ndim=None, min_ndim=None, last_dim=None):
        """x as a C-contiguous array of this layer's dtype, after checking its kind and shape."""
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"Layer '{self.name}': `{arg}` must be a numeric array, got dtype {arr.dtype}")
        self._check_shape(arr, arg, ndim, min_ndim, last_dim)
        flags = arr.flags
        if arr.dtype == self.dtype and flags.c_contiguous and flags.aligned:
            return arr  # as the kernels read it already (np.require costs a microsecond to say so)
        return np.require(arr, self.dtype, "CA")  # C-contiguous and aligned, as the kernels read it

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
        return np.require(arr, self.dtype, "CA")

    def __repr__(self):
        return f"<{type(self).__name__} name={self.name!r}>"


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
    """A layer class by name (used when loading saved models)."""
    if identifier not in Layer.registry:
        raise ValueError(f"Unknown layer class {identifier!r}")
    return Layer.registry[identifier]
