"""A small builder of ONNX graphs: the converters add nodes and weights through it and name
tensors by the strings it returns. Only standard ONNX operators of one opset (`OPSET`)."""
import numpy as np

try:
    import onnx
    from onnx import helper, numpy_helper
except ImportError as error:  # the one optional dependency of attnx.export
    raise ImportError('attnx.export needs the onnx package: pip install "attnx[onnx]"') from error

OPSET = 18  # LayerNormalization (17) and reductions that take their axes as an input (18)

# a masked score: below every real score, and finite so that a fully masked row stays NaN-free
MASKED_SCORE = float(np.finfo(np.float32).min)


class UnsupportedLayerError(ValueError):
    """A layer (or a layer option) that `attnx.export` cannot express in standard ONNX operators."""


# An ONNX file is one protobuf message, which cannot exceed 2 GiB; and building that message, writing it
# and checking it each hold another copy of the weights. A model with `EXTERNAL_DATA_BYTES` of weights or
# more therefore streams them into ONNX external data, a side file `<file>.data`, as the graph is built
# (`ExternalData`): each weight is written once, straight from its array, and the message holds only
# their places, so exporting needs little memory beyond the model's own (<= 1.5 x the weights + 200 MiB,
# `tests/test_export_large.py`). Smaller models are one file (a few copies of at most 64 MiB).
EXTERNAL_DATA_BYTES = 64 << 20
INLINE_TENSOR_BYTES = 1024  # smaller weights (shapes, scalars, small constants) stay in the message
_ALIGNMENT = 64  # each external tensor starts at a multiple of it (aligned vector loads when mapped)


class ExternalData:
    """The side file of an export: ``<path>.data`` (a stale one replaced), opened for writing; `add`
    appends one array's bytes and returns its TensorProto, which points at them."""

    def __init__(self, path):
        self.path = path.with_name(path.name + ".data")
        self.file = open(self.path, "wb")
        self.offset = 0

    def add(self, array, name):
        """`array` (C-contiguous) appended to the file; its TensorProto named `name`."""
        if array.dtype.byteorder == ">":  # ONNX stores little-endian
            array = array.astype(array.dtype.newbyteorder("<"))
        tensor = onnx.TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        padding = -self.offset % _ALIGNMENT
        self.file.write(bytes(padding))
        self.offset += padding
        self.file.write(memoryview(array.reshape(-1)).cast("B"))  # the array's own bytes, not a copy
        for key, value in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += array.nbytes
        return tensor

    def close(self):
        self.file.close()


def claim_memory(nbytes):
    """Raises MemoryError unless `nbytes` more can be allocated now. protobuf's runtime cannot report a
    failed allocation (it crashes the process), so an export asks first for what its messages will take:
    NumPy allocates the block without writing to it (no page is touched) and frees it at once."""
    np.empty(int(nbytes), dtype=np.uint8)


# what the messages of an export take beyond their weights' bytes (nodes, names, the checker, the writer)
MESSAGE_OVERHEAD_BYTES = 32 << 20
# copies of the weights an in-message export holds at once: the initializers, the graph, the model,
# the serialized bytes (onnx.helper copies messages; the checker and the writer serialize)
IN_MESSAGE_COPIES = 4


def write(model, path):
    """Checks ONNX ModelProto `model` with the ONNX checker and writes it to `path`. Weights already in
    external data (a graph built with an `ExternalData`) stay there; a message whose inline weights reach
    `EXTERNAL_DATA_BYTES` moves them to ``<name>.data`` on writing (so that any graph, however built,
    writes), and ONNX Runtime reads the side file from the model's folder."""
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    streamed = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    if weight_bytes < EXTERNAL_DATA_BYTES:
        if not streamed:
            onnx.checker.check_model(model)
        onnx.save(model, str(path))
        if streamed:
            onnx.checker.check_model(str(path))  # by path: the checker finds the external data from there
        return
    data = path.with_name(path.name + ".data")
    if data.exists():  # left by an earlier export to this path: onnx appends to no existing file
        data.unlink()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=INLINE_TENSOR_BYTES)
    onnx.checker.check_model(str(path))


class Graph:
    """Nodes, initializers, inputs and outputs of one ONNX graph, with unique tensor names.

    Tensors are named by strings; `node` returns the name (or names) of a node's outputs.
    `open_steps`: axis 1 of the graph's inputs is left open (`to_onnx(dynamic_steps=True)`) even where
    attnx's shapes fix it, so converters must not bake a size of that axis into constants.
    `external_data`: an `ExternalData` that weights of `INLINE_TENSOR_BYTES` or more are written to as
    they are added (a large model's export), instead of being copied into the message.
    """

    def __init__(self, name, open_steps=False, external_data=None):
        self.name, self.open_steps, self.external_data = name, open_steps, external_data
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self._used = set()
        self._constants = {}

    def unique(self, hint):
        """A tensor name starting with `hint` not used before in this graph."""
        hint = "".join(c if c.isalnum() or c in "_./" else "_" for c in hint) or "t"
        name, i = hint, 1
        while name in self._used:
            name, i = f"{hint}_{i}", i + 1
        self._used.add(name)
        return name

    def node(self, op, inputs, outputs=1, **attributes):
        """Adds `op` on `inputs` (names; "" for an omitted optional input); returns its output name,
        or the list of names when `outputs` > 1."""
        inputs = list(inputs)
        while inputs and inputs[-1] == "":  # trailing omitted inputs are left out
            inputs.pop()
        names = [self.unique(op.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=self.unique(f"{op}_node"), **attributes))
        return names[0] if outputs == 1 else names

    def weight(self, array, hint):
        """A constant (an initializer) holding `array`; equal small constants are shared."""
        array = np.asarray(array, order="C")  # (ascontiguousarray would make a scalar 1-D)
        key = None
        if array.size <= 16:
            key = (array.dtype.str, array.shape, array.tobytes())
            if key in self._constants:
                return self._constants[key]
        name = self.unique(hint)
        if self.external_data is not None and array.nbytes >= INLINE_TENSOR_BYTES:
            self.initializers.append(self.external_data.add(array, name))
        else:
            self.initializers.append(numpy_helper.from_array(array, name))
        if key is not None:
            self._constants[key] = name
        return name

    def ints(self, values):
        """An int64 1-D constant (shapes, axes, indices)."""
        return self.weight(np.asarray(values, dtype=np.int64).reshape(-1), "ints")

    def scalar(self, value, dtype=np.float32):
        return self.weight(np.asarray(value, dtype=dtype), "scalar")

    def add_input(self, hint, dtype, shape):
        """A graph input of numpy `dtype` and `shape` (None or a string for a dynamic axis)."""
        name = self.unique(hint)
        self.inputs.append(helper.make_tensor_value_info(name, _onnx_type(dtype), list(shape)))
        return name

    def add_output(self, value, hint, dtype, shape):
        """Makes tensor `value` a graph output named `hint` (through an Identity when the name differs)."""
        name = self.unique(hint)
        self.nodes.append(helper.make_node("Identity", [value], [name], name=self.unique("output_node")))
        self.outputs.append(helper.make_tensor_value_info(name, _onnx_type(dtype), list(shape)))
        return name

    def model(self, opset=OPSET, doc="", metadata=None):
        """The ONNX ModelProto of this graph, with `metadata` (a dict of strings) in its metadata_props."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="attnx",
                                  doc_string=doc)
        model.ir_version = min(model.ir_version, 10)  # what onnxruntime 1.17+ reads
        if metadata:
            helper.set_model_props(model, metadata)
        return model

    # ------------------------------------------------------------------ common pieces
    def shape_dim(self, x, axis):
        """The size of axis `axis` of `x`, as a (1,) int64 tensor."""
        bounds = {"start": axis} if axis == -1 else {"start": axis, "end": axis + 1}
        return self.node("Shape", [x], **bounds)

    def steps(self, x, axis):
        """0, 1, ..., n - 1 (int64) for n the size of axis `axis` of `x`."""
        n = self.node("Squeeze", [self.shape_dim(x, axis), self.ints([0])])
        return self.node("Range", [self.weight(np.asarray(0, np.int64), "zero"), n,
                                   self.weight(np.asarray(1, np.int64), "one")])

    def matmul(self, x, kernel, bias=None, hint="dense"):
        """x . kernel (+ bias) on the last axis; kernel and bias are arrays."""
        y = self.node("MatMul", [x, self.weight(kernel, f"{hint}/kernel")])
        return y if bias is None else self.node("Add", [y, self.weight(bias, f"{hint}/bias")])

    def activation(self, x, name):
        """attnx activation `name` ("linear", "relu", "tanh", "sigmoid", "softmax", "gelu") of x."""
        if name == "linear":
            return x
        if name == "softmax":
            return self.node("Softmax", [x], axis=-1)
        if name == "gelu":  # the exact form x * Phi(x), as attnx computes it
            erf = self.node("Erf", [self.node("Mul", [x, self.scalar(1.0 / np.sqrt(2.0))])])
            half_x = self.node("Mul", [x, self.scalar(0.5)])
            return self.node("Mul", [half_x, self.node("Add", [erf, self.scalar(1.0)])])
        return self.node({"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}[name], [x])

    def masked_softmax(self, scores, allowed=None):
        """Softmax over the last axis where bool `allowed` (broadcast to the scores) is True; rows
        with nothing allowed get zero weights, as attnx's mask rule says."""
        if allowed is None:
            return self.node("Softmax", [scores], axis=-1)
        kept = self.node("Where", [allowed, scores, self.scalar(MASKED_SCORE)])
        weights = self.node("Softmax", [kept], axis=-1)
        return self.node("Mul", [weights, self.float_of(allowed)])

    def causal_mask(self, query, key):
        """(Tq, S) bool: query step t may attend to key step s <= t (time on axis 1 of both)."""
        key_steps, query_steps = self.unsqueeze(self.steps(key, 1), 0), self.unsqueeze(self.steps(query, 1), 1)
        return self.node("LessOrEqual", [key_steps, query_steps])

    def cast(self, x, dtype):
        """x as numpy `dtype`."""
        return self.node("Cast", [x], to=_onnx_type(dtype))

    def as_bool(self, mask):
        """A mask given as bool or 0/1 integers, as bool."""
        return self.cast(mask, np.bool_)

    def unsqueeze(self, x, *axes):
        return self.node("Unsqueeze", [x, self.ints(axes)])

    def squeeze(self, x, *axes):
        return self.node("Squeeze", [x, self.ints(axes)])

    def transpose(self, x, *perm):
        return self.node("Transpose", [x], perm=list(perm))

    def reshape(self, x, shape):
        """Reshape to `shape`, 0 copying the input's size on that axis."""
        return self.node("Reshape", [x, self.ints(shape)])

    def concat(self, xs, axis):
        return xs[0] if len(xs) == 1 else self.node("Concat", list(xs), axis=axis)

    def all_of(self, masks):
        """The AND of bool tensors (None entries skipped), or None."""
        masks = [m for m in masks if m is not None]
        if not masks:
            return None
        out = masks[0]
        for m in masks[1:]:
            out = self.node("And", [out, m])
        return out

    def float_of(self, mask):
        return self.cast(mask, np.float32)


def _onnx_type(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
