"""Saving and loading whole models.

The `.attnx` format is a zip archive (stored, uncompressed) holding:

- ``attnx.json``: ``{"format": "attnx-model", "format_version": 1, "attnx_version": ...,
  "model": {"class_name", "config"}, "compile": {...} | null, "weights": [{"name", "shape",
  "dtype", "sha256"}, ...]}``. The model config lists the layers (class name and config) and, for
  functional models, every layer call with its tensor references.
- ``weights/00000.npy`` ...: one NumPy .npy file per parameter, in ``model.params`` order.
- for a compiled model whose optimizer has taken steps: ``"optimizer_state": {"iterations": n,
  "slots": [[param index, slot index], ...]}`` in the header and ``optimizer/00000.npy`` ... (the
  moment / momentum buffers, listed in ``"optimizer_weights"`` like the weights), so a loaded
  model continues training exactly where the saved one stopped, as Keras does.

Files are written to a temporary file in the same folder, flushed to disk and renamed over the
target, so an interrupted save leaves any previous file intact. Loading checks the zip CRCs, the
format version, every weight's shape, dtype and SHA-256, and raises ``ValueError`` on any
mismatch, truncation or corruption.
"""
import hashlib
import io
import json
import os
import struct
import tempfile
import zipfile
import zlib

import numpy as np

from ._version import __version__

FORMAT = "attnx-model"
WEIGHTS_FORMAT = "attnx-weights"
FORMAT_VERSION = 1


def check_json(value):
    """Raises TypeError for a value a JSON config cannot hold."""
    json.dumps(value)


# --------------------------------------------------------------------- the archive
def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _write_atomic(path, write_members):
    """Writes a zip archive to `path` through a temporary file and an atomic rename."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".attnx-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as zf:
                write_members(zf)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def _blobs(arrays):
    entries, blobs = [], []
    for name, value in arrays.items():
        blob = _npy_bytes(value)
        entries.append({"name": name, "shape": list(value.shape), "dtype": value.dtype.name,
                        "sha256": hashlib.sha256(blob).hexdigest()})
        blobs.append(blob)
    return entries, blobs


def _write_archive(path, header, params, optimizer_arrays=None):
    entries, blobs = _blobs(params)
    header = {**header, "format_version": FORMAT_VERSION, "weights": entries}
    opt_blobs = []
    if optimizer_arrays:
        header["optimizer_weights"], opt_blobs = _blobs(optimizer_arrays)

    def members(zf):
        zf.writestr("attnx.json", json.dumps(header, indent=1))
        for i, blob in enumerate(blobs):
            zf.writestr(f"weights/{i:05d}.npy", blob)
        for i, blob in enumerate(opt_blobs):
            zf.writestr(f"optimizer/{i:05d}.npy", blob)
    _write_atomic(path, members)


def _read_members(zf, path, entries, folder):
    out = []
    for i, entry in enumerate(entries):
        blob = zf.read(f"{folder}/{i:05d}.npy")
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            raise ValueError(f"{path}: weight '{entry['name']}' is corrupted (checksum mismatch)")
        value = np.load(io.BytesIO(blob), allow_pickle=False)
        if list(value.shape) != entry["shape"] or value.dtype.name != entry["dtype"]:
            raise ValueError(f"{path}: weight '{entry['name']}' has shape {value.shape} {value.dtype}, "
                             f"header says {entry['shape']} {entry['dtype']}")
        out.append((entry["name"], value))
    return out


def _read_archive(path, expected_format):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No attnx file at {path}")
    try:
        with zipfile.ZipFile(path) as zf:
            header = json.loads(zf.read("attnx.json").decode("utf-8"))
            if header.get("format") != expected_format:
                raise ValueError(f"{path}: not an {expected_format} file (format {header.get('format')!r})")
            if header.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"{path}: format version {header.get('format_version')} is not supported "
                                 f"(this attnx reads version {FORMAT_VERSION})")
            weights = _read_members(zf, path, header["weights"], "weights")
            header["optimizer_arrays"] = _read_members(zf, path, header.get("optimizer_weights", []), "optimizer")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, EOFError, json.JSONDecodeError,
            UnicodeDecodeError, OSError, zlib.error, struct.error,
            # a flipped flag or method byte: zipfile asks for a password or an unknown decompressor
            RuntimeError, NotImplementedError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{path}: truncated or corrupted attnx file ({type(exc).__name__}: {exc})") from exc
    return header, weights


def assign(model, weights, path):
    """Copies the saved weights into the model's parameters in order (as Keras matches weights by
    topological order, so a same-architecture model with other layer names loads them too)."""
    params = list(model.params.items())
    if len(weights) != len(params):
        raise ValueError(f"{path}: file holds {len(weights)} weights {[n for n, _ in weights]}, the model has "
                         f"{len(params)} parameters {[n for n, _ in params]}")
    for (name, value), (pname, p) in zip(weights, params):
        if p.shape != value.shape:
            raise ValueError(f"{path}: weight '{name}' has shape {value.shape}, the model's parameter '{pname}' "
                             f"expects {p.shape}")
    for (_, value), (_, p) in zip(weights, params):
        np.copyto(p, value)


# --------------------------------------------------------------------- public API
def _optimizer_state(model):
    """(header entry, {name: array}) for the optimizer's step count and slot buffers, or (None, None)."""
    opt = getattr(model, "optimizer", None) if model.compiled else None
    if opt is None or not opt.iterations:
        return None, None
    slots, arrays = [], {}
    for i, (name, p) in enumerate(model.params.items()):
        slot = opt._slots.get(id(p))
        if slot is None or slot[0] is not p:
            continue
        for j, buf in enumerate(slot[1]):
            slots.append([i, j])
            arrays[f"{name}/slot{j}"] = buf
    return {"iterations": int(opt.iterations), "slots": slots}, arrays


def restore_optimizer_state(model, header, path):
    state = header.get("optimizer_state")
    if not state or model.optimizer is None:
        return
    arrays = [v for _, v in header["optimizer_arrays"]]
    if len(arrays) != len(state["slots"]):
        raise ValueError(f"{path}: optimizer state lists {len(state['slots'])} buffers, the file holds {len(arrays)}")
    params = list(model.params.values())
    opt = model.optimizer
    per_param = {}
    for (i, j), value in zip(state["slots"], arrays):
        if not 0 <= i < len(params) or value.shape != params[i].shape or value.dtype != params[i].dtype:
            raise ValueError(f"{path}: optimizer buffer for parameter {i} does not match the model")
        per_param.setdefault(i, {})[j] = value
    for i, bufs in per_param.items():
        p = params[i]
        if sorted(bufs) != list(range(opt.num_slots)):
            raise ValueError(f"{path}: optimizer state for parameter {i} has buffers {sorted(bufs)}, "
                             f"{type(opt).__name__} needs {opt.num_slots}")
        opt._slots[id(p)] = (p, [np.array(bufs[j], dtype=p.dtype, copy=True) for j in range(opt.num_slots)])
    opt.iterations = int(state["iterations"])


def save_model(model, path):
    """Writes config, weights, compile settings and optimizer state to `path`, atomically."""
    if not model.built:
        raise ValueError(f"Model '{model.name}' has no weights yet: build it (call it on data) before saving")
    header = {"format": FORMAT, "attnx_version": __version__,
              "model": {"class_name": type(model).__name__, "config": model.get_config()},
              "compile": None}
    if model.compiled:
        from . import optimizers  # the optimizer as it is now (e.g. a learning rate changed by a callback)
        header["compile"] = {**model._compile_config, "optimizer": optimizers.serialize(model.optimizer)}
    state, arrays = _optimizer_state(model)
    if state is not None:
        header["optimizer_state"] = state
    _write_archive(path, header, model.params, arrays)


def read_model(path):
    """(header, [(name, array), ...]) of a model file, every check passed (`attnx.load_model` builds the model)."""
    return _read_archive(path, FORMAT)


def save_weights(model, path):
    if not model.built:
        raise ValueError(f"Model '{model.name}' has no weights yet")
    _write_archive(path, {"format": WEIGHTS_FORMAT}, model.params)


def load_weights(model, path):
    _, weights = _read_archive(path, WEIGHTS_FORMAT)
    assign(model, weights, path)
