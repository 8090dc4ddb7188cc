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
target, so an interrupted save leaves any previous file intact; the file keeps the permission bits
of the one it replaces (a new one gets 0666 less the umask).

Loading trusts nothing in the file and raises ``ValueError`` for every malformed one, before it
allocates more than the file's size: first the zip directory (only the members above, stored, not
compressed or encrypted, inside the file, together no larger than it), then the header's types (every weight's
name, shape, dtype - bool, integer or floating point only - and SHA-256; the model and compile
sections), then each weight's declared size against its member's, and only then the members: their
CRCs, SHA-256, and the .npy header's dtype, shape and byte count against the header. Weights come
back as read-only views of the members' bytes. No pickle, and no class is imported by name.
"""
import collections
import hashlib
import io
import json
import math
import os
import re
import secrets
import stat
import struct
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


def open_regular(path, what):
    """`path` opened for binary reading if it is a regular file. A FIFO, a device, a socket or a folder
    is a ValueError naming `what` and the path (opening a FIFO for reading would wait for a writer
    forever: it is opened without blocking, then refused); no file is FileNotFoundError."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"No {what} at {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not a {what}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise ValueError(f"{path}: is {kind}, not a {what} (only regular files are read)")
    return os.fdopen(fd, "rb")


# --------------------------------------------------------------------- the archive
def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _create_temporary(folder):
    """(fd, name) of a new hidden file in `folder`, created with mode 0666 less the umask, as `open`
    would create the target (mkstemp's 0600 would hide a saved model from other accounts)."""
    while True:
        tmp = os.path.join(folder, f".attnx-{secrets.token_hex(8)}.tmp")
        try:
            # O_EXCL: never open a file (or follow a link) someone else put there
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def _write_atomic(path, write_members):
    """Writes a zip archive to `path` through a temporary file and an atomic rename; a file it replaces
    keeps its permission bits."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        replaced_mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        replaced_mode = None
    fd, tmp = _create_temporary(folder)
    try:
        with os.fdopen(fd, "wb") as f:
            if replaced_mode is not None:
                os.chmod(tmp, replaced_mode)
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


class _Entry(collections.namedtuple("_Entry", "name shape dtype sha256 member")):
    """One array the header lists, checked: `member` is the zip member that must hold it."""

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.dtype.itemsize


# The only members the writer makes: paths from a fixed alphabet, so no name can escape a folder.
_MEMBER_NAME = re.compile(r"attnx\.json|(weights|optimizer)/\d{5,}\.npy")
_JSON_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _typed(value, expected, path, what):
    """`value` if it has the JSON type `expected` (a bool is no integer), else ValueError naming `what`."""
    if isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ValueError(f"{path}: {what} should be {_JSON_TYPE_NAMES[expected]}, got {type(value).__name__} {shown}")


def _real_dtype(value, path, what):
    """The NumPy dtype named by `value`: bool, integer or floating point only, as the writer saves them."""
    try:
        dtype = np.dtype(_typed(value, str, path, what))
    except TypeError as exc:  # a string NumPy does not know
        raise ValueError(f"{path}: {what} {value!r} is not a NumPy dtype ({exc})") from exc
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.shape != ():
        raise ValueError(f"{path}: {what} is {dtype.str!r} ({dtype}); weights are bool, integer or floating point")
    return dtype


def _entries(header, key, folder, path):
    """The header's list `key` of stored arrays as `_Entry`s, every field type-checked."""
    entries = []
    for i, entry in enumerate(_typed(header.get(key, []), list, path, f"header field '{key}'")):
        what = f"{key}[{i}]"
        entry = _typed(entry, dict, path, what)
        shape = tuple(_typed(d, int, path, f"{what}.shape[{j}]")
                      for j, d in enumerate(_typed(entry.get("shape"), list, path, f"{what}.shape")))
        if any(d < 0 for d in shape):
            raise ValueError(f"{path}: {what}.shape {list(shape)} has a negative size")
        entries.append(_Entry(_typed(entry.get("name"), str, path, f"{what}.name"), shape,
                              _real_dtype(entry.get("dtype"), path, f"{what}.dtype"),
                              _typed(entry.get("sha256"), str, path, f"{what}.sha256"), f"{folder}/{i:05d}.npy"))
    return entries


def _check_directory(zf, path, file_size):
    """The zip directory describes only members the writer makes, stored (not compressed), unencrypted,
    each inside the file and all together no larger than it (overlapping members would be): so the
    members read below never allocate more than the file's size."""
    infos = zf.infolist()
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: the zip directory lists a member twice")
    for info in infos:
        if not _MEMBER_NAME.fullmatch(info.filename):
            raise ValueError(f"{path}: unexpected member {info.filename!r} (an attnx file holds attnx.json, "
                             "weights/NNNNN.npy and optimizer/NNNNN.npy)")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{path}: member {info.filename!r} is compressed (zip method {info.compress_type}); "
                             "attnx files store their members uncompressed")
        if info.flag_bits & 0x1:
            raise ValueError(f"{path}: member {info.filename!r} is encrypted")
        if info.file_size != info.compress_size or info.header_offset + info.compress_size > file_size:
            raise ValueError(f"{path}: truncated or corrupted attnx file (member {info.filename!r} declares "
                             f"{info.file_size} bytes, stored {info.compress_size}, the file has {file_size})")
    if sum(info.file_size for info in infos) > file_size:
        raise ValueError(f"{path}: truncated or corrupted attnx file (its members declare "
                         f"{sum(info.file_size for info in infos)} bytes in a file of {file_size})")
    return {info.filename: info for info in infos}


def _check_members(members, entries, path):
    """Every entry has its member, large enough for the entry's declared shape, and nothing else is stored."""
    expected = {"attnx.json"} | {e.member for e in entries}
    for entry in entries:
        if entry.member not in members:
            raise ValueError(f"{path}: truncated or corrupted attnx file (member {entry.member!r} of "
                             f"weight '{entry.name}' is missing)")
        if entry.nbytes > members[entry.member].file_size:
            raise ValueError(f"{path}: weight '{entry.name}' declares shape {list(entry.shape)} {entry.dtype} "
                             f"({entry.nbytes} bytes), its member holds {members[entry.member].file_size} bytes")
    extra = sorted(set(members) - expected)
    if extra:
        raise ValueError(f"{path}: members {extra} are not listed in the header")


def _read_array(zf, entry, path):
    """The entry's array, a read-only view of its member's bytes (no copy), after the checksum and the
    .npy header (dtype, shape, byte count) match the entry."""
    blob = zf.read(entry.member)  # the member's CRC is checked here
    if hashlib.sha256(blob).hexdigest() != entry.sha256:
        raise ValueError(f"{path}: weight '{entry.name}' is corrupted (checksum mismatch)")
    f = io.BytesIO(blob)
    try:
        shape, fortran_order, dtype = _NPY_HEADER_READERS[np.lib.format.read_magic(f)](f)
    except (KeyError, ValueError, TypeError, SyntaxError) as exc:
        raise ValueError(f"{path}: weight '{entry.name}' is not a .npy array this attnx writes "
                         f"({type(exc).__name__}: {exc})") from exc
    if shape != entry.shape or dtype.name != entry.dtype.name:
        raise ValueError(f"{path}: weight '{entry.name}' has shape {shape} {dtype}, "
                         f"header says {list(entry.shape)} {entry.dtype}")
    if fortran_order and len(shape) > 1:
        raise ValueError(f"{path}: weight '{entry.name}' is stored in Fortran order; attnx writes C order")
    if len(blob) - f.tell() != entry.nbytes:
        raise ValueError(f"{path}: weight '{entry.name}' holds {len(blob) - f.tell()} bytes of data, "
                         f"its shape {list(entry.shape)} {entry.dtype} needs {entry.nbytes}")
    return np.frombuffer(blob, dtype=dtype, count=math.prod(shape), offset=f.tell()).reshape(shape)


def _read_archive(path, expected_format, check_header=None):
    """(header, [(name, array), ...]) after every check of the module docstring; `check_header(header,
    path)` checks the parts only one kind of file has. Nothing larger than the file is ever allocated:
    the directory is checked before any member is read, each entry's size against its member's."""
    path = os.fspath(path)
    with open_regular(path, "attnx file") as f:
        return _read_open_archive(f, path, expected_format, check_header)


def _read_open_archive(f, path, expected_format, check_header):
    """`_read_archive` on the file object `f` opened from `path`."""
    try:
        with zipfile.ZipFile(f) as zf:
            members = _check_directory(zf, path, os.fstat(f.fileno()).st_size)
            header = _typed(json.loads(zf.read("attnx.json").decode("utf-8")), dict, path, "the header attnx.json")
            if header.get("format") != expected_format:
                raise ValueError(f"{path}: not an {expected_format} file (format {header.get('format')!r})")
            if header.get("format_version") != FORMAT_VERSION or isinstance(header.get("format_version"), bool):
                raise ValueError(f"{path}: format version {header.get('format_version')} is not supported "
                                 f"(this attnx reads version {FORMAT_VERSION})")
            weights = _entries(header, "weights", "weights", path)
            optimizer_weights = _entries(header, "optimizer_weights", "optimizer", path)
            if check_header is not None:
                check_header(header, path)
            _check_members(members, weights + optimizer_weights, path)
            arrays = [(e.name, _read_array(zf, e, path)) for e in weights]
            header["optimizer_arrays"] = [(e.name, _read_array(zf, e, path)) for e in optimizer_weights]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, EOFError, json.JSONDecodeError,
            UnicodeDecodeError, OSError, zlib.error, struct.error,
            # a header nested deeper than the JSON parser recurses
            RecursionError,
            # a flipped flag or method byte: zipfile asks for a password or an unknown decompressor
            RuntimeError, NotImplementedError) as exc:
        raise ValueError(f"{path}: truncated or corrupted attnx file ({type(exc).__name__}: {exc})") from exc
    return header, arrays


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
    from . import quantization  # int8 weights: int8 in [-127, 127], finite scales
    quantization.check_weights([n for n, _ in params], [p for _, p in params], [v for _, v in weights],
                               lambda i: f"{path}: weight '{weights[i][0]}'")
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
              "model": {"class_name": type(model).registry.name_of(type(model)), "config": model.get_config()},
              "compile": None}
    build_inputs = getattr(model, "_build_inputs", None)
    if build_inputs is not None:  # a model written as a class creates its weights on this call
        header["model"]["build_inputs"] = build_inputs
    if model.quantization_mode:  # load_model quantizes the model it builds (attnx.quantization)
        header["model"]["quantization_mode"] = model.quantization_mode
    if model.compiled:
        from . import optimizers  # the optimizer as it is now (e.g. a learning rate changed by a callback)
        header["compile"] = {**model._compile_config, "optimizer": optimizers.serialize(model.optimizer)}
    state, arrays = _optimizer_state(model)
    if state is not None:
        header["optimizer_state"] = state
    _write_archive(path, header, model.params, arrays)


def _check_model_header(header, path, compile=True):
    """The model and compile sections have the types `attnx.load_model` reads, the compile settings name
    an optimizer, losses and metrics attnx has, and the optimizer state matches its buffer list."""
    model = _typed(header.get("model"), dict, path, "header field 'model'")
    _typed(model.get("class_name"), str, path, "model.class_name")
    _typed(model.get("config"), dict, path, "model.config")
    if model.get("quantization_mode") is not None:
        from . import quantization
        quantization.check_mode(f"{path}: model.quantization_mode", model["quantization_mode"])
    compile_config = header.get("compile")
    if compile_config is not None and compile:  # load_model(compile=False) does not rebuild them
        _check_compile(_typed(compile_config, dict, path, "header field 'compile'"), path)
    state = header.get("optimizer_state")
    if state is not None:
        state = _typed(state, dict, path, "header field 'optimizer_state'")
        if _typed(state.get("iterations"), int, path, "optimizer_state.iterations") < 0:
            raise ValueError(f"{path}: optimizer_state.iterations is {state['iterations']}, expected >= 0")
        slots = _typed(state.get("slots"), list, path, "optimizer_state.slots")
        for k, slot in enumerate(slots):
            if len(_typed(slot, list, path, f"optimizer_state.slots[{k}]")) != 2:
                raise ValueError(f"{path}: optimizer_state.slots[{k}] should be [parameter index, slot index], "
                                 f"got {slot}")
            for v in slot:
                _typed(v, int, path, f"optimizer_state.slots[{k}]")
        if len(slots) != len(header.get("optimizer_weights", [])):
            raise ValueError(f"{path}: optimizer state lists {len(slots)} buffers, the header "
                             f"{len(header.get('optimizer_weights', []))}")


def _check_compile(config, path):
    """Resolves the saved optimizer, losses and metrics once (and drops them), so that compiling the
    loaded model cannot fail on a name or config this attnx does not know."""
    from . import losses, metrics, optimizers  # only to resolve names; no model code
    loss = _typed(config.get("loss"), list, path, "compile.loss")
    per_output = _typed(config.get("metrics"), list, path, "compile.metrics")
    if not loss or not per_output:
        raise ValueError(f"{path}: compile settings list {len(loss)} losses and {len(per_output)} metric lists, "
                         "expected at least one of each")
    if "loss_weights" not in config:
        raise ValueError(f"{path}: compile settings have no 'loss_weights' (null or a list of numbers)")
    weights = config["loss_weights"]
    if weights is not None:
        # compile saves one loss and one weight per output
        if len(_typed(weights, list, path, "compile.loss_weights")) != len(loss):
            raise ValueError(f"{path}: compile settings list {len(loss)} losses and {len(weights)} loss weights")
        for i, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise ValueError(f"{path}: compile.loss_weights[{i}] should be a number, got {w!r}")
    names = [_typed(name, str, path, f"compile.metrics[{i}]")
             for i, output in enumerate(per_output) for name in _typed(output, list, path, f"compile.metrics[{i}]")]
    try:
        optimizer = optimizers.get(config.get("optimizer"))
        for entry in loss:
            losses.get(entry)
        for name in names:
            metrics.get(name)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise ValueError(f"{path}: compile settings this attnx cannot rebuild ({type(exc).__name__}: {exc})") from exc
    _check_optimizer(optimizer, optimizers.LearningRateSchedule, path)


def _check_optimizer(optimizer, schedule_class, path):
    """Every number of the optimizer's config (its learning rate, a schedule's parameters, betas, epsilon,
    clipping) is finite and >= 0, and a schedule gives a number: a string would fail only in fit, a NaN
    would turn every weight NaN without a word."""
    def check(value, what):
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, list):
            for i, v in enumerate(value):
                check(v, f"{what}[{i}]")
            return
        if not isinstance(value, (int, float)) or value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            shown = repr(value)
            raise ValueError(f"{path}: compile.optimizer {what} should be a finite number >= 0, got "
                             f"{shown if len(shown) <= 60 else shown[:57] + '...'}")

    config = optimizer.get_config()
    lr = config.pop("learning_rate")
    if isinstance(lr, dict):
        for key, value in lr["config"].items():
            check(value, f"learning_rate.{key}")
        if type(optimizer.learning_rate).__call__ is schedule_class.__call__:  # the abstract base
            raise ValueError(f"{path}: compile.optimizer learning_rate names {lr['class_name']!r}, "
                             "not a learning-rate schedule")
    else:
        check(lr, "learning_rate")
    for key, value in config.items():
        check(value, key)


def read_model(path, compile=True):
    """(header, [(name, array), ...]) of a model file, every check passed (`attnx.load_model` builds the
    model). The arrays are read-only views of the file's bytes; together they are never larger than the file.

    Bounds: every size the header declares is checked against the member holding it before it is read
    (one byte more than the member is a ValueError), so reading allocates no more than the file's size;
    a header nested deeper than Python's recursion limit (``sys.getrecursionlimit()``) is a ValueError."""
    return _read_archive(path, FORMAT, lambda header, where: _check_model_header(header, where, compile))


def save_weights(model, path):
    if not model.built:
        raise ValueError(f"Model '{model.name}' has no weights yet")
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)  # Keras creates the folder
    _write_archive(path, {"format": WEIGHTS_FORMAT}, model.params)


def load_weights(model, path):
    _, weights = _read_archive(path, WEIGHTS_FORMAT)
    if not model.params:  # not built yet (a class model before its first call): assigned after it, as Keras defers
        def restore():
            if not model.params:
                return False
            assign(model, weights, path)
            return True
        model.__dict__.setdefault("_deferred_restore", []).append(restore)  # run by Layer.apply
        return
    assign(model, weights, path)
