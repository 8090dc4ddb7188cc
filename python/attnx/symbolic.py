"""Symbolic tensors: what a layer call on `attnx.Input`s returns while a model is being defined.

Calling a layer on a `SymbolicTensor` records a `Node` (the layer and its argument structure)
instead of computing anything; `attnx.Model(inputs, outputs)` walks those nodes. This module
knows layers only by their methods (`build`, `compute_output_shape`), so the layer base class
and the models both import it without importing each other.

Tensor arguments of a call are its `inputs` (one tensor or a list), then tensors among the extra
positional arguments, then tensors among the keyword arguments (e.g. ``initial_state=[h, c]``),
in that order. A layer's backward returns the gradients in that same order.
"""
import inspect

import numpy as np

from .backend import unique_name


class SymbolicTensor:
    """A placeholder for an array inside a model definition: its shape (batch axis None) and dtype."""

    def __init__(self, shape, dtype, node=None, index=0, name=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.node = node
        self.index = index
        self.name = name

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        source = self.node.layer.name if self.node else "input"
        return f"<SymbolicTensor shape={self.shape} dtype={self.dtype} from {source}>"


def Input(shape, dtype="float32", name=None, batch_size=None):
    """A model input: ``attnx.Input(shape=(32,), dtype="int32")`` for batches of 32 token ids."""
    if isinstance(shape, int):
        shape = (shape,)
    return SymbolicTensor((batch_size,) + tuple(shape), dtype, name=name or unique_name("input"))


class Node:
    """One recorded layer call: the layer, its argument structure and its output tensors."""

    def __init__(self, layer, inputs, args, kwargs):
        self.layer = layer
        self.call_spec = (inputs, args, kwargs)
        # a call on one tensor and nothing else: running the graph looks its value up directly
        self.single_input = is_symbolic(inputs) and not args and not kwargs
        self.input_tensors = tensors_in(self.call_spec)
        self.outputs = []
        self.multi_output = False


def is_symbolic(x):
    return isinstance(x, SymbolicTensor)


def any_symbolic(inputs):
    items = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
    return any(isinstance(t, SymbolicTensor) for t in items)


def tensors_in(spec):
    """Every SymbolicTensor in (inputs, args, kwargs), in the documented order."""
    inputs, args, kwargs = spec
    found = []
    for part in [inputs, *args, *kwargs.values()]:
        items = part if isinstance(part, (list, tuple)) else [part]
        found.extend(x for x in items if is_symbolic(x))
    return found


def substitute(x, values):
    """`x` with each SymbolicTensor replaced by ``values[id(tensor)]`` (lists, tuples and dicts kept)."""
    if is_symbolic(x):
        return values[id(x)]
    if isinstance(x, (list, tuple)):
        return type(x)(substitute(v, values) for v in x)
    if isinstance(x, dict):
        return {k: substitute(v, values) for k, v in x.items()}
    return x


def symbolic_call(layer, inputs, args, kwargs):
    """Records `layer(inputs, *args, **kwargs)` on symbolic tensors and returns symbolic outputs."""
    node = Node(layer, inputs, tuple(args), dict(kwargs))
    in_shape = [t.shape for t in inputs] if isinstance(inputs, (list, tuple)) else inputs.shape
    if not layer.built:
        layer.build(in_shape)
        layer.built = True
    # call options that change the outputs (e.g. return_attention_scores) reach compute_output_shape
    # when it names them
    if layer._infers_shapes_by_calling():
        layer._build_input_shape = in_shape
        out_shape = _shapes_from_calls(layer, inputs, args, kwargs)
    else:
        accepted = inspect.signature(layer.compute_output_shape).parameters
        options = {k: v for k, v in kwargs.items() if k in accepted and not tensors_in(((), (), {k: v}))}
        out_shape = layer.compute_output_shape(in_shape, **options)
    node.multi_output = isinstance(out_shape, list)
    shapes = out_shape if node.multi_output else [out_shape]
    node.outputs = [SymbolicTensor(s, layer.dtype, node, i) for i, s in enumerate(shapes)]
    return list(node.outputs) if node.multi_output else node.outputs[0]


def _shapes_from_calls(layer, inputs, args, kwargs):
    """The output shape(s) of a `call` layer on symbolic tensors: it runs on zeros of their dtypes, once
    with every unknown axis of size 2 and once of size 3; axes that changed are unknown (None)."""
    runs = []
    for fill in (2, 3):
        values = {id(t): np.zeros(tuple(fill if d is None else d for d in t.shape), dtype=t.dtype)
                  for t in tensors_in((inputs, args, kwargs))}
        out = layer.apply(substitute(inputs, values), *substitute(list(args), values), training=False,
                          **substitute(dict(kwargs), values))[0]
        runs.append([np.shape(o) for o in out] if isinstance(out, (list, tuple)) else [np.shape(out)])
    shapes = [tuple(None if i == 0 or a != b else a for i, (a, b) in enumerate(zip(sa, sb)))
              for sa, sb in zip(*runs)]
    return shapes if len(shapes) > 1 else shapes[0]
