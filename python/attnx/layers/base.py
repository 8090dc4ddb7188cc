"""The layer contract every attnx layer follows (see DESIGN.md).

- ``y = layer(x, training=False, mask=None)`` runs the forward pass; with ``training=True`` the
  layer keeps in ``self._cache`` what its backward pass needs.
- ``dx = layer.backward(dy)`` returns the gradient of each input (the same structure as the
  inputs: one array, or a list for layers called on a list) and **adds** the parameter gradients
  into ``layer.grads``.
- ``layer.params`` / ``layer.grads`` are ordered dicts name -> ndarray that the C++ kernels read
  and write in place, so optimizer updates and ``set_weights`` never invalidate them.
"""
import re
from collections import OrderedDict

import numpy as np

from .. import backend, initializers, regularizers

_name_counts = {}


def snake_case(name):
    """Keras' layer naming: "MultiHeadAttention" -> "multi_head_attention", "LSTM" -> "lstm"."""
    name = re.sub(r"(.)([A-Z][a-z0-9]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def unique_name(prefix):
    n = _name_counts.get(prefix, 0)
    _name_counts[prefix] = n + 1
    return prefix if n == 0 else f"{prefix}_{n}"


def attend_mask(mask, batch, source_len, query_len=None, where="mask", shared_ok=False, min_length=0):
    """`mask` as the kernels take it: a C-contiguous bool array (B, S) (positions of a sequence,
    e.g. key padding or an RNN's steps) or (B, Tq, S) (per query), or None. The one check of masks
    and lengths for every layer that takes them.

    Accepts bool (or 0/1 integer) masks of those shapes and lengths ``(B,)`` (integers in
    ``[min_length, S]``: the first ``lengths[b]`` positions are real); with `shared_ok`, also a
    leading axis of 1 for a mask shared by the batch. Raises TypeError (dtype) or ValueError
    (shape, range) naming `where` otherwise.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype.kind not in "biu":
        raise TypeError(f"{where}: expected a bool mask or integer lengths, got dtype {m.dtype}")
    if m.ndim in (2, 3) and m.shape[0] == 1 and batch != 1 and shared_ok:
        batch = 1  # one mask for every batch row (functional API)
    if m.ndim == 1 and m.dtype.kind in "iu":
        if m.shape != (batch,):
            raise ValueError(f"{where}: lengths expected shape ({batch},), got {m.shape}")
        if m.size and (m.min() < min_length or m.max() > source_len):
            raise ValueError(f"{where}: lengths must lie in [{min_length}, {source_len}], got {m.min()}..{m.max()}")
        return np.ascontiguousarray(np.arange(source_len)[None, :] < m[:, None])
    shapes = [(batch, source_len)] + ([(batch, query_len, source_len)] if query_len is not None else [])
    if m.shape not in shapes:
        raise ValueError(f"{where}: expected shape {' or '.join(map(str, shapes))} (True = real position) or "
                         f"lengths ({batch},), got {m.shape}")
    return np.ascontiguousarray(m != 0 if m.dtype != bool else m)


class Layer:
    """Base class of all layers.

    Subclasses implement ``build(input_shape)`` (create weights with ``add_weight``),
    ``call(inputs, training=False, mask=None)`` (forward), ``backward(dy)``,
    ``compute_output_shape(input_shape)`` and ``get_config()``.

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
            self.grads[n] += reg.gradient(self.params[n])

    # --------------------------------------------------------------- calling
    def __call__(self, inputs, *args, training=False, mask=None, **kwargs):
        flat = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
        if not all(type(t) is np.ndarray for t in flat):  # arrays (the common case) skip the import
            from ..models import SymbolicTensor, symbolic_call
            if any(isinstance(t, SymbolicTensor) for t in flat):
                return symbolic_call(self, inputs, args, kwargs)
        if not self.built:
            self.build(_shapes_of(inputs))
            self.built = True
        call_kwargs = dict(kwargs)
        if self._accepts("training"):
            call_kwargs["training"] = training
        if self._accepts("mask") and mask is not None:
            call_kwargs["mask"] = mask
        if not training:
            self._cache = None  # a later backward() must not reuse a stale training cache
        return self.call(inputs, *args, **call_kwargs)

    def _accepts(self, arg):
        key = ("_accepts_" + arg)
        found = self.__dict__.get(key)
        if found is None:
            import inspect  # on first call only: inspect is slow to import and `import attnx` must stay fast
            found = arg in inspect.signature(self.call).parameters
            self.__dict__[key] = found
        return found

    def build(self, input_shape):
        """Creates the weights for inputs of `input_shape` (batch axis first, may be None)."""

    def call(self, inputs, training=False):
        raise NotImplementedError(f"{type(self).__name__}.call")

    def backward(self, dy):
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def compute_mask(self, inputs, mask=None):
        return mask if self.supports_masking else None

    def compute_output_shape(self, input_shape):
        """Output shape for an input shape (batch axis None). The default runs the layer on
        small zero inputs, once with each unknown axis of size 2 and once of size 3, and
        reports axes that changed as unknown."""
        outs = [_as_list(self.call(_dummy(input_shape, fill), training=False))
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
    def _saved(self):
        """The forward cache, or a clear error if there was no training forward pass."""
        if self._cache is None:
            raise RuntimeError(f"Layer '{self.name}': backward() needs a forward pass with training=True first")
        return self._cache

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
