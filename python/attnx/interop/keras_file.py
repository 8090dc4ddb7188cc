"""Keras 3 model files in and out.

    model = attnx.interop.from_keras("tutorial.keras")                   # json + h5py, no keras
    model = attnx.interop.from_keras("model.weights.h5", config="config.json")
    attnx.interop.to_keras(model, "model.keras")                         # needs keras

A `.keras` file is a zip archive of ``config.json`` (the model's layers and, for functional models,
every layer call), ``metadata.json`` and ``model.weights.h5``. In the h5 file Keras keeps each layer
of ``model.layers`` under ``layers/<its class name in snake case>`` (``_1``, ``_2``, ... for repeats,
in layer order, whatever the layers' names), its variables in ``vars/0``, ``vars/1``, ... and those
of its sublayers in subgroups (``cell``, ``forward_layer/cell``, ``query_dense``, ...).

Each layer is converted by the converter registered for its Keras class (`interop.registry`): the
converters live with the PyTorch ones, one module per attnx layer module. Reading trusts nothing in
the file: the zip directory is checked before a member is read (members stored, inside the file),
every h5 dataset's declared size against the bytes the file stores for it before it is read, and
the layers the config declares are built under a weight budget bounded by the weight file's size
(`layers.base.weight_budget`), so a crafted file cannot make attnx allocate much more than its size.
Any malformed file is a ValueError naming it.
"""
import io
import json
import os
import re
import struct
import zipfile
import zlib

import numpy as np

from ..layers.base import weight_budget
from ..masking import call_mask
from ..saving import open_regular
from ..symbolic import Input
from .registry import _FROM_KERAS, _TO_KERAS

# Every attnx layer converted from Keras creates at most this much more than the Keras weights it
# reads (a margin for converters that make explicit what Keras keeps implicit).
_WEIGHT_ALLOWANCE = 16 << 20


class _OpOutput:
    """The output of a Keras op in a functional graph. Keras 3 records the ops that compute and pass on
    the mask of ``Embedding(mask_zero=True)`` (NotEqual, ConvertToTensor) and hands their result to
    layers as ``mask=``; attnx propagates that mask itself, so these outputs are dropped. Any other use
    of an op is an error naming it."""

    def __init__(self, class_name, name):
        self.class_name, self.name = class_name, name


def _import_converters():
    from . import attention, conv, core, keras_layers, recurrent, transformer  # noqa: F401  (they register themselves)


def _import_keras():
    import importlib.util
    if importlib.util.find_spec("keras") is None:
        raise ImportError("to_keras needs keras 3 (pip install 'attnx[keras]'); from_keras does not")
    try:
        import keras
    except (ImportError, ValueError) as exc:  # keras is there, the backend it is set to is not
        backend = os.environ.get("KERAS_BACKEND") or "the one ~/.keras/keras.json names"
        raise ImportError(f"to_keras: keras is installed but its backend ({backend}) cannot be imported: "
                          f"{type(exc).__name__}: {exc}. Install that backend, or choose an installed one "
                          "with KERAS_BACKEND=torch (or tensorflow, jax) or in ~/.keras/keras.json") from exc
    return keras


def _snake_case(name):
    """Keras' `naming.to_snake_case`: how it names a layer's group in the weight file."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


# ------------------------------------------------------------------------------------- reading
class WeightGroup:
    """The weights of one Keras layer in the h5 file: `shapes(sub)` says what they are without reading
    them, `read(sub)` reads them, each checked against the bytes the file holds for it. `sub` is a
    sublayer's group ("cell", "forward_layer/cell", "query_dense"); "" the layer's own variables."""

    def __init__(self, h5, path, source, file_bytes):
        self.h5, self.path, self.source, self.file_bytes = h5, path, source, file_bytes

    def _datasets(self, sub=""):
        path = "/".join(p for p in (self.path, sub, "vars") if p)
        group = self.h5.get(path)
        if group is None:
            return []
        count = len(group)
        if sorted(group) != [str(i) for i in range(count)]:
            raise ValueError(f"{self.source}: weight group '{path}' holds {sorted(group)}, expected 0 .. {count - 1}")
        datasets = [group[str(i)] for i in range(count)]
        for i, ds in enumerate(datasets):
            nbytes = int(np.prod(ds.shape, dtype=np.int64)) * ds.dtype.itemsize
            if ds.external or ds.is_virtual:
                raise ValueError(f"{self.source}: weight '{path}/{i}' keeps its data outside the weight file "
                                 f"({'HDF5 external storage' if ds.external else 'a virtual dataset'}); attnx reads "
                                 "only the bytes inside it")
            if ds.dtype.kind != "f":
                raise ValueError(f"{self.source}: weight '{path}/{i}' has dtype {ds.dtype}, expected floats")
            if nbytes > self.file_bytes or ds.id.get_storage_size() < nbytes:
                raise ValueError(f"{self.source}: truncated or corrupted weight file (weight '{path}/{i}' declares "
                                 f"shape {ds.shape}, {nbytes} bytes; the file stores {ds.id.get_storage_size()})")
        return datasets

    def sublayer(self, sub):
        """The group of a wrapped layer (TimeDistributed's "layer")."""
        return WeightGroup(self.h5, f"{self.path}/{sub}", self.source, self.file_bytes)

    def shapes(self, sub=""):
        return [tuple(ds.shape) for ds in self._datasets(sub)]

    def read(self, sub=""):
        return [np.asarray(ds[()]) for ds in self._datasets(sub)]


def _check_zip(zf, path, file_size):
    """The members a `.keras` file has, stored (Keras does not compress them) and inside the file."""
    infos = {info.filename: info for info in zf.infolist()}
    for name in ("config.json", "model.weights.h5"):
        if name not in infos:
            raise ValueError(f"{path}: not a Keras 3 .keras file (no {name}; members {sorted(infos)})")
    for info in infos.values():
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise ValueError(f"{path}: member {info.filename!r} is compressed or encrypted; Keras stores the "
                             "members of a .keras file as they are")
        if info.file_size != info.compress_size or info.header_offset + info.compress_size > file_size:
            raise ValueError(f"{path}: truncated or corrupted .keras file (member {info.filename!r} declares "
                             f"{info.file_size} bytes, the file has {file_size})")
    return infos


def _load_config(config, source):
    """A Keras model config from a dict (`model.get_config()` or a `to_json()` dict), a JSON string or
    the path of a config.json."""
    if isinstance(config, (str, os.PathLike)) and not str(config).lstrip().startswith("{"):
        with open_regular(config, "Keras config file") as f:
            config = f.read()
    if isinstance(config, dict):  # as a file holds it: lists, not the tuples of get_config()
        try:
            config = json.dumps(config)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: the model config is not JSON-serializable ({exc})") from exc
    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"{source}: the model config is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{source}: the model config should be a JSON object, got {type(config).__name__}")
    if "class_name" not in config:  # model.get_config(): the inner part
        config = {"class_name": "Functional" if "input_layers" in config else "Sequential", "config": config}
    return config


def from_keras(path, config=None, custom_objects=None):
    """An attnx model with the architecture and weights of a Keras 3 model.

    Args:
        path: a `.keras` file (`model.save("m.keras")`), or a weights file (`model.save_weights(
            "m.weights.h5")`) together with `config`.
        config: for a weights file, the model's config: the path of a config.json, a JSON string
            (`model.to_json()`) or a dict (`model.get_config()`).
        custom_objects: ``{Keras class name: attnx layer class}`` for custom layers under other
            names than the tutorial's (``attention``, ``Attention``, ``AttentionLayer``), e.g.
            ``{"MyAttention": attnx.layers.AttentionPooling}``, as Keras' ``custom_objects``.

    Returns:
        An `attnx.Sequential` for a Keras Sequential, else a functional `attnx.Model`, with the same
        predictions (the layers both libraries have: see ARCHITECTURE.md, "Interop"). The Keras
        tutorial's custom attention layer (weights W (d, 1), b (T, 1): softmax over time of
        ``tanh(x W + b)``, then the weighted sum) becomes `layers.AttentionPooling`.

    Masks: attnx propagates the mask of ``Embedding(mask_zero=True)`` as Keras does, and its
    recurrent layers take Keras' ``zero_output_for_mask``. Keras' MultiHeadAttention derives
    query and value masks from its inputs' masks; attnx's takes explicit masks only, so a file whose
    MultiHeadAttention is fed that mask is refused (its predictions would differ).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: a truncated or corrupted file, a config that does not describe a model, a
            layer attnx has no counterpart for (named with its Keras class), or an option attnx lacks.
    """
    import h5py

    path = os.fspath(path)
    try:
        file = open_regular(path, "Keras file")
    except FileNotFoundError:
        raise FileNotFoundError(f"from_keras: no file at {path}") from None
    try:
        with file:
            file_size = os.fstat(file.fileno()).st_size
            if zipfile.is_zipfile(file):
                if config is not None:
                    raise ValueError(f"{path}: a .keras file holds its config; pass config= with a weights file only")
                with zipfile.ZipFile(file) as zf:
                    infos = _check_zip(zf, path, file_size)
                    config = zf.read("config.json")
                    weights_bytes = infos["model.weights.h5"].file_size
                    weights_file = io.BytesIO(zf.read("model.weights.h5"))
            else:
                if config is None:
                    raise ValueError(f"{path}: not a .keras file; for a weights file pass its model's config "
                                     "(config='config.json', model.to_json() or model.get_config())")
                file.seek(0)
                weights_bytes, weights_file = file_size, file
            config = _load_config(config, path)
            with h5py.File(weights_file, "r") as h5:
                return _build_model(config, h5, path, weights_bytes, custom_objects or {})
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error, struct.error, KeyError,
            TypeError, IndexError, AttributeError, RecursionError, RuntimeError, NotImplementedError,
            # a number the converters cannot take, e.g. "units": Infinity
            OverflowError) as exc:
        raise ValueError(f"{path}: truncated or corrupted Keras file, or a config attnx cannot read "
                         f"({type(exc).__name__}: {exc})") from exc


def _is_op(entry):
    """A Keras op recorded in a functional graph (e.g. the NotEqual of a mask), not a layer."""
    return str(entry.get("module") or "").startswith("keras.src.ops")


def _convert(entry, group, source, custom_objects):
    """(attnx layer, load) for one Keras layer entry of a config."""
    class_name = entry.get("class_name")
    builtin = str(entry.get("module") or "").startswith("keras")
    if class_name in custom_objects:
        key = f"custom>{custom_objects[class_name].__name__.lower()}"
    else:
        key = class_name if builtin else f"custom>{str(class_name).lower()}"
    if key not in _FROM_KERAS:
        kind = "Keras layer" if builtin else "custom layer"
        raise ValueError(f"{source}: {kind} {class_name} (layer '{entry.get('name') or entry['config'].get('name')}') "
                         f"has no attnx counterpart; attnx reads {', '.join(sorted(_FROM_KERAS))}")
    try:
        return _FROM_KERAS[key](class_name, entry["config"], group)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from exc


def _group_names(entries):
    """Each layer's group in the weight file: its class in snake case, numbered from the second."""
    used, names = {}, []
    for entry in entries:
        base = _snake_case(entry["class_name"])
        used[base] = used.get(base, -1) + 1
        names.append(base if used[base] == 0 else f"{base}_{used[base]}")
    return names


def _input_tensor(batch_shape, dtype, name=None):
    if not isinstance(batch_shape, (list, tuple)) or len(batch_shape) < 2:
        raise ValueError(f"input shape {batch_shape!r} should be (batch, ...)")
    return Input(tuple(batch_shape[1:]), dtype=dtype or "float32", name=name)


def _build_model(config, h5, source, weights_bytes, custom_objects):
    _import_converters()
    class_name, inner = config["class_name"], config.get("config")
    if class_name not in ("Sequential", "Functional", "Model") or not isinstance(inner, dict):
        raise ValueError(f"{source}: a {class_name} model; from_keras reads Sequential and functional models")
    entries = inner.get("layers")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "class_name" in e for e in entries):
        raise ValueError(f"{source}: the config lists no layers")
    layer_entries = [e for e in entries if not _is_op(e) and not (class_name == "Sequential"
                                                                   and e["class_name"] == "InputLayer")]
    groups = {id(e): WeightGroup(h5, f"layers/{name}", source, weights_bytes)
              for e, name in zip(layer_entries, _group_names(layer_entries))}
    loads = []

    def convert(entry):
        layer, load = _convert(entry, groups[id(entry)], source, custom_objects)
        loads.append((layer, load))
        return layer

    with weight_budget(2 * weights_bytes + _WEIGHT_ALLOWANCE, source):
        if class_name == "Sequential":
            model = _sequential(inner, entries, convert, source)
        else:
            model = _functional(inner, entries, convert, source)
    for layer, load in loads:
        try:
            layer.set_weights(load())
        except ValueError as exc:
            raise ValueError(f"{source}: the weights of layer '{layer.name}' do not match its config ({exc})") from exc
    return model


def _sequential(inner, entries, convert, source):
    from ..models import Sequential

    first = entries[0] if entries else {}
    if first.get("class_name") == "InputLayer":
        shape, dtype = first["config"].get("batch_shape") or first["config"].get("batch_input_shape"), \
            first["config"].get("dtype")
    else:
        later = [e for e in entries if e.get("build_config")]
        shape = inner.get("build_input_shape") or (later[0]["build_config"].get("input_shape") if later else None)
        dtype = None
    if shape is None:
        raise ValueError(f"{source}: the Sequential model has no input shape (Keras saves it once the model is built)")
    layers = [convert(entry) for entry in entries if entry["class_name"] != "InputLayer"]
    return Sequential([_input_tensor(shape, dtype)] + layers, name=inner.get("name"))


def _history(ref):
    """(layer name, node index, tensor index) of a Keras tensor reference."""
    if isinstance(ref, dict):
        ref = ref["config"]["keras_history"]
    name, node, index = ref
    return str(name), int(node), int(index)


def _op_outputs(value):
    """The `_OpOutput`s inside a resolved call argument structure."""
    if isinstance(value, _OpOutput):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _op_outputs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _op_outputs(v)


# Keras layers that pass the mask of Embedding(mask_zero=True) on to the layers after them (the
# recurrent ones when they return sequences); any other layer ends it (pooling, Flatten, custom ones)
_PASS_MASK = {"Dropout", "SpatialDropout1D", "Dense", "Activation", "LayerNormalization", "TimeDistributed",
              "BatchNormalization",
              "Attention", "AdditiveAttention", "MultiHeadAttention", "Add", "Concatenate"}
_RECURRENT = {"SimpleRNN", "GRU", "LSTM", "Bidirectional"}


def _passes_mask(entry):
    config = entry.get("config") or {}
    if entry["class_name"] == "Bidirectional":
        config = (config.get("layer") or {}).get("config") or {}
    return entry["class_name"] in _PASS_MASK or (entry["class_name"] in _RECURRENT and
                                                 bool(config.get("return_sequences")))


def _references(value):
    """The (layer name, node index) of every Keras tensor in a call argument structure."""
    if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
        yield _history(value)[:2]
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _references(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _references(v)


def _functional(inner, entries, convert, source):
    from ..models import Model

    outputs_of = {}  # (layer name, node index) -> the call's outputs
    masked = set()  # the (layer name, node index) whose outputs carry Embedding(mask_zero=True)'s mask

    def resolve(value):
        if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
            name, node, index = _history(value)
            return outputs_of[(name, node)][index]
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    for entry in entries:
        name = entry.get("name") or entry["config"]["name"]
        nodes = entry.get("inbound_nodes") or []
        if entry["class_name"] == "InputLayer":
            cfg = entry["config"]
            outputs_of[(name, 0)] = [_input_tensor(cfg.get("batch_shape") or cfg.get("batch_input_shape"),
                                                   cfg.get("dtype"), name)]
            continue
        if _is_op(entry):
            for i in range(len(nodes)):
                outputs_of[(name, i)] = [_OpOutput(entry["class_name"], name)]
            continue
        layer = convert(entry)
        for i, node in enumerate(nodes):
            fed_masked = call_mask(list(_references([node.get("args", []), node.get("kwargs", {})])),
                                   lambda ref: True if ref in masked else None) is not None
            if fed_masked and entry["class_name"] == "MultiHeadAttention":
                raise ValueError(f"{source}: MultiHeadAttention '{name}' is fed the mask of Embedding(mask_zero=True): "
                                 "Keras masks the padded keys with it, attnx's MultiHeadAttention takes explicit masks "
                                 "only, so the predictions would differ; give the Keras layer no propagated mask "
                                 "(mask_zero=False) or build the model in attnx with attention_mask")
            if (entry["class_name"] == "Embedding" and (entry.get("config") or {}).get("mask_zero")) or \
                    (fed_masked and _passes_mask(entry)):
                masked.add((name, i))
            args, kwargs = resolve(node.get("args", [])), resolve(node.get("kwargs", {}))
            kwargs.pop("training", None)
            kwargs.pop("mask", None)  # attnx propagates it
            op = next(_op_outputs([args, kwargs]), None)
            if op is not None:
                raise ValueError(f"{source}: layer '{name}' is fed by the Keras op {op.class_name} ('{op.name}'); "
                                 "attnx converts layers, and masks from Embedding(mask_zero=True)")
            out = layer(*args, **{k: v for k, v in kwargs.items() if v is not None})
            outputs_of[(name, i)] = out if isinstance(out, list) else [out]

    def tensors(refs):
        """The model's inputs or outputs: one reference [name, node, index], or a list of them."""
        many = isinstance(refs[0], (list, dict))
        found = [outputs_of[_history(r)[:2]][_history(r)[2]] for r in (refs if many else [refs])]
        return found if len(found) > 1 else found[0]
    return Model(tensors(inner["input_layers"]), tensors(inner["output_layers"]), name=inner.get("name"))


# ------------------------------------------------------------------------------------- writing
def to_keras(model, path=None):
    """A Keras 3 model with the architecture and weights of the attnx `model`, saved to `path` (a
    `.keras` file) when given.

    Needs keras (imported here, on first use). `layers.AttentionPooling` becomes the Keras layer
    `attnx>AttentionPooling` (the tutorial's custom layer, with attnx's options); load such a file
    with ``keras.saving.load_model(path, custom_objects=attnx.interop.keras_objects())``.

    Raises:
        ValueError: a model without a graph (a model class such as Seq2Seq) or a layer Keras has no
            counterpart for, named.
    """
    from ..models import Model
    from ..symbolic import substitute

    keras = _import_keras()
    _import_converters()
    if not isinstance(model, Model) or not model.nodes:
        raise ValueError(f"to_keras: expects a Sequential or functional attnx model, got {type(model).__name__}")
    if not model.built and not model.nodes:
        raise ValueError(f"to_keras: model '{model.name}' has no graph yet; build it first")
    values, chains = {}, {}
    inputs = [keras.Input(shape=t.shape[1:], dtype=t.dtype.name, name=t.name) for t in model.inputs]
    for t, k in zip(model.inputs, inputs):
        values[id(t)] = k
    for node in model.nodes:
        layer = node.layer
        name = type(layer).__name__
        if layer.quantization_mode:
            raise ValueError(f"to_keras: layer '{layer.name}' is quantized ({layer.quantization_mode}); convert the "
                             "float32 model (before model.quantize)")
        if name not in _TO_KERAS:
            raise ValueError(f"to_keras: attnx layer {name} ('{layer.name}') has no Keras counterpart; "
                             f"attnx writes {', '.join(sorted(_TO_KERAS))}")
        if id(layer) not in chains:  # a shared layer: one Keras layer called again
            chains[id(layer)] = _TO_KERAS[name](layer, keras)
        inputs_spec, args, kwargs = node.call_spec
        x = substitute(inputs_spec, values)
        for k, (keras_layer, _) in enumerate(chains[id(layer)]):
            try:
                if k > 0:
                    x = keras_layer(x)
                elif name == "MultiHeadAttention" and isinstance(x, list):  # recorded as [query, value(, key)]
                    x = keras_layer(*x, *substitute(args, values), **substitute(kwargs, values))
                else:
                    x = keras_layer(x, *substitute(args, values), **substitute(kwargs, values))
            except (TypeError, ValueError) as exc:  # e.g. a call argument only attnx has (lengths=)
                raise ValueError(f"to_keras: Keras' {type(keras_layer).__name__} cannot make the call of attnx layer "
                                 f"'{layer.name}' with arguments {sorted(kwargs)} ({exc})") from exc
        outs = x if node.multi_output else [x]
        for t, o in zip(node.outputs, outs):
            values[id(t)] = o
    outputs = [values[id(t)] for t in model.outputs]
    keras_model = keras.Model(inputs if len(inputs) > 1 else inputs[0],
                              outputs if len(outputs) > 1 else outputs[0], name=model.name)
    for chain in chains.values():
        for keras_layer, weights in chain:
            keras_layer.set_weights(weights)
    if path is not None:
        keras_model.save(os.fspath(path))
    return keras_model


def keras_objects():
    """The Keras classes `to_keras` writes that Keras does not have, for
    ``keras.saving.load_model(path, custom_objects=attnx.interop.keras_objects())``."""
    from .attention import keras_attention_pooling
    cls = keras_attention_pooling(_import_keras())
    return {"attnx>AttentionPooling": cls, "AttentionPooling": cls}
