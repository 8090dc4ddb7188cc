"""Functional and Sequential models as ONNX graphs: the model's recorded layer calls are walked in
order (as a model runs them, `Model.nodes`), each call becoming its layer's converter's nodes, and the
masks propagated as Keras propagates them (`Layer.compute_mask`), as bool tensors of the graph."""
from pathlib import Path

import numpy as np

from ..masking import call_mask, carried_masks, output_masks
from ..models import Model
from ..symbolic import is_symbolic, substitute
from . import graph
from .graph import OPSET, ExternalData, Graph, UnsupportedLayerError, write
from .registry import Call, convert, output_mask, unsupported


def _structure(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _shapes(spec):
    """`spec` (a call's inputs) with each symbolic tensor replaced by its shape."""
    if is_symbolic(spec):
        return spec.shape
    if isinstance(spec, (list, tuple)):
        return type(spec)(_shapes(x) for x in spec)
    return spec


def convert_model(g, model, inputs, masks):
    """Adds the calls of functional `model` on tensors `inputs` (names, one per model input) with
    masks `masks` (names or None, one per input); returns (output names, output masks) as lists."""
    values, propagated = {}, {}
    for t, name, mask in zip(model.inputs, inputs, masks):
        values[id(t)] = name
        if mask is not None:
            propagated[id(t)] = mask
    for node in model.nodes:
        inputs_spec, args, kwargs = node.call_spec
        x = substitute(inputs_spec, values)
        call_kwargs = substitute(kwargs, values)
        in_mask = call_mask(inputs_spec, lambda t: propagated.get(id(t)), call_kwargs.pop("mask", None))
        layer = node.layer
        _refuse_lengths(layer, kwargs)
        if isinstance(layer, Model) and layer.nodes:  # a nested model: its masks come with its outputs
            outs, out_masks = convert_model(g, layer, _structure(x),
                                            _structure(in_mask) if in_mask is not None else [None] * len(layer.inputs))
        else:
            call = Call(x, _shapes(inputs_spec), substitute(args, values), call_kwargs, in_mask)
            out = convert(g, layer, call)
            outs = _structure(out) if node.multi_output else [out]
            out_masks = output_mask(g, layer, call)
        for (t, m), o in zip(output_masks(node.outputs, out_masks), outs):
            values[id(t)] = o
            if m is not None:
                propagated[id(t)] = m
    return [values[id(t)] for t in model.outputs], carried_masks(model.outputs, lambda t: propagated.get(id(t)))


def _refuse_lengths(layer, kwargs):
    """Masks passed to a call as model tensors must be bool (batch, ...) masks: lengths (batch,) would
    need the steps of whichever sequence they measure (the recurrent layers' `lengths` is handled)."""
    for name, value in kwargs.items():
        if name.endswith("mask") and is_symbolic(value) and value.ndim == 1:
            raise unsupported(layer, f"`{name}` is given as lengths {value.shape}; export takes masks as bool "
                                     "(batch, steps) tensors")


def _declared_shape(tensor, dynamic_steps):
    """An input's ONNX shape: "batch" first, the axes attnx leaves open (and axis 1 with
    `dynamic_steps`) named, the rest fixed."""
    return ["batch"] + [f"{tensor.name}_axis{i}" if d is None or (i == 1 and dynamic_steps) else int(d)
                        for i, d in enumerate(tensor.shape[1:], 1)]


def model_to_onnx(model, opset=OPSET, dynamic_steps=False, external_data=None):
    """The ONNX ModelProto of a built functional or Sequential `model` (see `attnx.export.to_onnx`), its
    weights written to `external_data` (an `ExternalData`) as they are converted when one is given."""
    if model.built and not model.nodes:
        raise UnsupportedLayerError(f"attnx.export: model '{model.name}' ({type(model).__name__}) is a class model "
                                    "with its own forward; to_onnx exports Sequential and functional models and "
                                    "Seq2Seq")
    if not model.nodes:
        raise ValueError(f"attnx.export: model '{model.name}' is not built; give its first layer an input_shape (or "
                         "start it with attnx.Input), or call it on data once, before exporting")
    g = Graph(model.name, open_steps=dynamic_steps, external_data=external_data)
    inputs = [g.add_input(t.name, t.dtype, _declared_shape(t, dynamic_steps)) for t in model.inputs]
    outputs, _ = convert_model(g, model, inputs, [None] * len(inputs))
    names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    for value, name, t in zip(outputs, names, model.outputs):
        g.add_output(value, name, np.float32, ["batch"] + [None] * (len(t.shape) - 1))
    return g.model(opset, doc=f"attnx model '{model.name}'")


def export_model(model, path, opset=OPSET, dynamic_steps=False):
    """Writes functional or Sequential `model` to `path`: a model of `EXTERNAL_DATA_BYTES` of weights or
    more streams them into ``<path>.data`` while its graph is built. A failed export (MemoryError, a
    full disk) leaves no partial file behind."""
    weight_bytes = sum(w.nbytes for w in model.weights)
    streamed = weight_bytes >= graph.EXTERNAL_DATA_BYTES
    graph.claim_memory(graph.MESSAGE_OVERHEAD_BYTES + (0 if streamed else graph.IN_MESSAGE_COPIES * weight_bytes))
    external_data = ExternalData(path) if streamed else None
    try:
        proto = model_to_onnx(model, opset, dynamic_steps, external_data)
        if external_data is not None:
            external_data.close()
        write(proto, path)
    except BaseException:
        if external_data is not None:
            external_data.close()
        for partial in (path, path.with_name(path.name + ".data")):
            partial.unlink(missing_ok=True)
        raise


def check_path(path, what="path"):
    """`path` as a Path whose folder exists (FileNotFoundError otherwise, before any work)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"attnx.export: cannot write {what} {str(path)!r}: the folder {str(path.parent)!r} "
                                "does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"attnx.export: cannot write {what} {str(path)!r}: it is a folder")
    return path


# ONNX Runtime's names of the input types attnx declares
_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
                "tensor(double)": np.float64, "tensor(bool)": np.bool_}


class OnnxModel:
    """An exported model (`to_onnx`) in ONNX Runtime, taking inputs as `Model.predict` does: ids of
    any integer dtype (``pad_sequences`` gives int32, the graph declares int64) and floats of any
    float dtype are converted to the types the graph declares; ONNX Runtime itself takes only those.

        model = attnx.export.OnnxModel("sentiment.onnx")
        probabilities = model.predict(x)     # == attnx's model.predict(x) to 1e-5
    """

    def __init__(self, path, providers=("CPUExecutionProvider",), sess_options=None):
        import onnxruntime
        self.session = onnxruntime.InferenceSession(str(path), sess_options, providers=list(providers))
        self.inputs = self.session.get_inputs()

    def _converted(self, spec, value):
        target = np.dtype(_NUMPY_TYPES[spec.type])
        x = np.asarray(value)
        if target.kind in "iu":
            if x.dtype.kind not in "biu":
                raise TypeError(f"OnnxModel: input '{spec.name}' takes integer ids, got dtype {x.dtype}")
            if x.size and (x.min() < np.iinfo(target).min or x.max() > np.iinfo(target).max):
                raise ValueError(f"OnnxModel: input '{spec.name}' holds ids outside {target}'s range")
        elif x.dtype.kind not in "biuf":
            raise TypeError(f"OnnxModel: input '{spec.name}' takes real numbers, got dtype {x.dtype}")
        return np.ascontiguousarray(x, dtype=target)

    def predict(self, x):
        """The model's outputs for `x` (an array, or a list with one array per model input): one
        array, or a list for a model with several outputs."""
        xs = list(x) if isinstance(x, (list, tuple)) else [x]
        if len(xs) != len(self.inputs):
            raise ValueError(f"OnnxModel: the model takes {len(self.inputs)} inputs "
                             f"{[i.name for i in self.inputs]}, got {len(xs)}")
        outputs = self.session.run(None, {spec.name: self._converted(spec, v) for spec, v in zip(self.inputs, xs)})
        return outputs[0] if len(outputs) == 1 else outputs
