"""Checkpoints of models, layers and optimizers together, as TensorFlow's `tf.train` names them:
`Checkpoint`, `CheckpointManager` and `latest_checkpoint`.

    >>> import numpy as np, attnx
    >>> encoder, decoder = attnx.layers.Dense(4), attnx.layers.Dense(2)
    >>> _ = decoder(encoder(np.ones((1, 3), np.float32)))
    >>> optimizer = attnx.optimizers.Adam()
    >>> checkpoint = attnx.train.Checkpoint(optimizer=optimizer, encoder=encoder, decoder=decoder)
    >>> checkpoint.save("training_checkpoints/ckpt")
    'training_checkpoints/ckpt-1'
    >>> # a fresh process, the same objects made anew:
    >>> status = checkpoint.restore(attnx.train.latest_checkpoint("training_checkpoints"))

A checkpoint is one `.attnx` archive (`attnx.saving`: checked, checksummed, written atomically) at
``<prefix>-<n>.attnx`` holding each layer's weights (matched by order, as `load_weights`) and each
optimizer's step count and slot buffers (matched to the weights they update). The folder's
``checkpoint`` file (JSON) names its checkpoints, the latest last. A layer or model not built yet when
`restore` runs (a subclassed model before its first call) receives its weights, and its optimizer
slots, right after its first call builds them, as TensorFlow defers; the status `restore` returns says
whether everything was consumed.
"""
import json
import os
import re

import numpy as np

from . import saving
from .layers.base import Layer
from .optimizers import Optimizer

CHECKPOINT_FORMAT = "attnx-checkpoint"
INDEX_FILE = "checkpoint"  # the folder's list of checkpoints, as TensorFlow's
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # an object's name, and a checkpoint's file name in the index


def _file_of(save_path):
    """The archive of the checkpoint `save_path` ("<prefix>-<n>", or the file itself)."""
    save_path = os.fspath(save_path)
    return save_path if save_path.endswith(".attnx") else save_path + ".attnx"


class CheckpointLoadStatus:
    """What `Checkpoint.restore` did: `assert_consumed` raises while a deferred restore waits for its layer
    to be built (call the model once), `expect_partial` says that is intended (TensorFlow's names)."""

    def __init__(self, pending):
        self._pending = pending  # [(name, object, callback)] still waiting

    def _waiting(self):
        return [name for name, obj, callback in self._pending if callback in obj.__dict__.get("_deferred_restore", [])]

    def assert_consumed(self):
        waiting = self._waiting()
        if waiting:
            raise AssertionError(f"Checkpoint: {waiting} not restored yet: they are restored after their first call "
                                 "builds their weights")
        return self

    assert_existing_objects_matched = assert_consumed

    def expect_partial(self):
        return self


class Checkpoint:
    """Models, layers and optimizers saved and restored together (TensorFlow's `tf.train.Checkpoint`).

    Args:
        **objects: name=object, each an attnx Layer or Model, or an optimizer. Names are letters,
            digits, ``_``, ``.`` and ``-``.

    `save(prefix)` writes ``<prefix>-<n>.attnx`` (n counts the saves, restored with the checkpoint) and
    returns ``<prefix>-<n>``; `write(path)` writes ``<path>.attnx`` without counting; `restore(path)`
    (also `read`) reads either, or does nothing given None (no checkpoint yet), as TensorFlow.
    """

    def __init__(self, **objects):
        for name, obj in objects.items():
            if not _NAME.match(name):
                raise ValueError(f"Checkpoint: object name {name!r} must be letters, digits, '_', '.' or '-'")
            if not isinstance(obj, (Layer, Optimizer)):
                raise TypeError(f"Checkpoint: {name}= must be an attnx layer, model or optimizer, got "
                                f"{type(obj).__name__}")
        self._objects = dict(objects)
        self.save_counter = 0

    def __getattr__(self, name):
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"Checkpoint has no object {name!r} (it holds {sorted(objects)})")

    def _layers(self):
        return [(n, o) for n, o in self._objects.items() if isinstance(o, Layer)]

    def _optimizers(self):
        return [(n, o) for n, o in self._objects.items() if isinstance(o, Optimizer)]

    # ----------------------------------------------------------------------------- writing
    def write(self, file_prefix):
        """Writes every object's state to ``<file_prefix>.attnx`` (creating its folder); returns file_prefix."""
        arrays, layers_header = {}, {}
        for name, layer in self._layers():
            params = list(layer.params.items())
            layers_header[name] = len(params)
            for i, (pname, p) in enumerate(params):
                arrays[f"{name}/{i:05d}/{pname}"] = p
        optimizers_header, slot_arrays = {}, {}
        for oname, opt in self._optimizers():
            slots = []
            for lname, layer in self._layers():
                for i, p in enumerate(layer.params.values()):
                    slot = opt._slots.get(id(p))
                    if slot is None or slot[0] is not p:
                        continue
                    slots.append([lname, i, len(slot[1])])
                    for j, buf in enumerate(slot[1]):
                        slot_arrays[f"{oname}/{lname}/{i:05d}/slot{j}"] = buf
            optimizers_header[oname] = {"iterations": int(opt.iterations), "slots": slots}
        header = {"format": CHECKPOINT_FORMAT, "save_counter": self.save_counter, "layers": layers_header,
                  "optimizers": optimizers_header}
        path = _file_of(file_prefix)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        saving._write_archive(path, header, arrays, slot_arrays)
        return os.fspath(file_prefix)

    def save(self, file_prefix):
        """Writes checkpoint number ``save_counter + 1`` to ``<file_prefix>-<n>.attnx``, lists it in the folder's
        `checkpoint` file and returns ``<file_prefix>-<n>``."""
        self.save_counter += 1
        path = self.write(f"{os.fspath(file_prefix)}-{self.save_counter}")
        _record_in_index(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
        return path

    # ----------------------------------------------------------------------------- reading
    def restore(self, save_path):
        """Restores every object from the checkpoint `save_path` (``<prefix>-<n>``; None: nothing to do). An
        object not built yet is restored after its first call (see the status returned)."""
        if save_path is None:
            return CheckpointLoadStatus([])
        path = _file_of(save_path)
        header, arrays = saving._read_archive(path, CHECKPOINT_FORMAT, _check_checkpoint_header)
        saved = {}
        for name, value in arrays:
            owner, index = name.split("/", 2)[:2]
            saved.setdefault(owner, []).append((int(index), name, value))
        optimizer_arrays = dict(header["optimizer_arrays"])
        for name, count in header["layers"].items():
            if name not in self._objects or not isinstance(self._objects[name], Layer):
                raise ValueError(f"{path}: holds the layer or model {name!r}; this Checkpoint has "
                                 f"{sorted(self._objects)}")
            if len(saved.get(name, [])) != count:
                raise ValueError(f"{path}: layer {name!r} lists {count} weights, the file holds "
                                 f"{len(saved.get(name, []))}")
        for name in header["optimizers"]:
            if not isinstance(self._objects.get(name), Optimizer):
                raise ValueError(f"{path}: holds the optimizer {name!r}; this Checkpoint has {sorted(self._objects)}")
        pending = []
        for name, layer in self._layers():
            if name not in header["layers"]:
                continue
            weights = [(n, v) for _, n, v in sorted(saved.get(name, []), key=lambda entry: entry[0])]
            slots = [(self._objects[oname], [optimizer_arrays[f"{oname}/{name}/{i:05d}/slot{j}"] for j in range(k)], i)
                     for oname, state in header["optimizers"].items()
                     for lname, i, k in state["slots"] if lname == name]
            callback = _restorer(layer, name, weights, slots, path)
            if not callback():
                layer.__dict__.setdefault("_deferred_restore", []).append(callback)
                pending.append((name, layer, callback))
        for name, state in header["optimizers"].items():
            self._objects[name].iterations = int(state["iterations"])
        self.save_counter = int(header["save_counter"])
        return CheckpointLoadStatus(pending)

    read = restore


def _restorer(layer, name, weights, slots, path):
    """A callback restoring `layer`'s weights and its optimizer slots once it has them all: True when done."""
    def restore():
        params = list(layer.params.values())
        if len(params) < len(weights):
            if params and layer.built and not layer._runs_call():
                raise ValueError(f"{path}: {name!r} holds {len(weights)} weights, the layer has {len(params)}")
            return False  # not built yet: after its first call
        saving.assign(layer, weights, f"{path} ({name!r})")
        for opt, buffers, i in slots:
            p = params[i]
            if len(buffers) != opt.num_slots or any(b.shape != p.shape for b in buffers):
                raise ValueError(f"{path}: the optimizer's buffers for weight {i} of {name!r} do not match "
                                 f"{type(opt).__name__} on shape {p.shape}")
            opt._slots[id(p)] = (p, [np.array(b, dtype=p.dtype, copy=True) for b in buffers])
        return True
    return restore


def _check_checkpoint_header(header, path):
    def fail(what):
        raise ValueError(f"{path}: malformed checkpoint header: {what}")
    counter = header.get("save_counter")
    if not isinstance(counter, int) or isinstance(counter, bool) or counter < 0:
        fail("save_counter must be a non-negative integer")
    layers = header.get("layers")
    if not isinstance(layers, dict) or any(not isinstance(k, str) or not _NAME.match(k) or not isinstance(v, int)
                                           or isinstance(v, bool) or v < 0 for k, v in layers.items()):
        fail("layers must map names to weight counts")
    optimizers = header.get("optimizers")
    if not isinstance(optimizers, dict):
        fail("optimizers must be a dict")
    for name, state in optimizers.items():
        if not isinstance(name, str) or not _NAME.match(name) or not isinstance(state, dict):
            fail(f"optimizer {name!r}")
        iterations, slots = state.get("iterations"), state.get("slots")
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 0:
            fail(f"optimizer {name!r}: iterations must be a non-negative integer")
        if not isinstance(slots, list) or any(
                not isinstance(s, list) or len(s) != 3 or s[0] not in layers or
                any(not isinstance(v, int) or isinstance(v, bool) for v in s[1:]) or not 0 <= s[1] < layers[s[0]]
                or not 0 <= s[2] <= 8 for s in slots):
            fail(f"optimizer {name!r}: slots must be [layer, weight index, buffer count]")
    names = {e["name"] for e in header.get("optimizer_weights", []) if isinstance(e, dict)}
    for name, state in optimizers.items():
        for lname, i, k in state["slots"]:
            for j in range(k):
                if f"{name}/{lname}/{i:05d}/slot{j}" not in names:
                    fail(f"optimizer {name!r}: buffer {j} of {lname!r} weight {i} is missing")
    for entry in header.get("weights", []):
        parts = entry.get("name", "").split("/", 2) if isinstance(entry, dict) else []
        if len(parts) != 3 or parts[0] not in layers or not parts[1].isdigit():
            fail(f"weight entry {entry!r} is not <layer>/<index>/<name>")


# -------------------------------------------------------------------------------- the folder's index
def _read_index(directory):
    """The checkpoint names listed in `directory`'s index (oldest first), checked; [] when there is none."""
    path = os.path.join(os.fspath(directory), INDEX_FILE)
    if not os.path.exists(path):
        return []
    with saving.open_regular(path, "checkpoint index") as f:
        raw = f.read(1 << 20)
    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a checkpoint index ({exc})") from None
    names = index.get("checkpoints") if isinstance(index, dict) else None
    if not isinstance(names, list) or any(not isinstance(n, str) or not _NAME.match(n) for n in names):
        raise ValueError(f"{path}: not a checkpoint index (expected {{\"checkpoints\": [file names]}})")
    return names


def _write_index(directory, names):
    path = os.path.join(directory, INDEX_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"checkpoints": names}, f)
    os.replace(tmp, path)


def _record_in_index(directory, name):
    names = [n for n in _read_index(directory) if n != name] + [name]
    _write_index(directory, names)


def latest_checkpoint(checkpoint_dir):
    """The newest checkpoint saved in `checkpoint_dir` (``<folder>/<prefix>-<n>``, as `restore` takes it), or None."""
    names = [n for n in _read_index(checkpoint_dir)
             if os.path.isfile(_file_of(os.path.join(os.fspath(checkpoint_dir), n)))]
    return os.path.join(os.fspath(checkpoint_dir), names[-1]) if names else None


class CheckpointManager:
    """Numbered checkpoints in one folder, keeping the newest `max_to_keep` (TensorFlow's CheckpointManager).

    Args:
        checkpoint: an `attnx.train.Checkpoint`.
        directory: the folder (created on the first save).
        max_to_keep: how many to keep (None: all).
        checkpoint_name: the files' prefix, default "ckpt".
    """

    def __init__(self, checkpoint, directory, max_to_keep=5, checkpoint_name="ckpt"):
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"CheckpointManager: expects an attnx.train.Checkpoint, got {type(checkpoint).__name__}")
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)
                                        or max_to_keep < 1):
            raise ValueError(f"CheckpointManager: max_to_keep must be a positive integer or None, got {max_to_keep!r}")
        if not _NAME.match(str(checkpoint_name)):
            raise ValueError(f"CheckpointManager: checkpoint_name {checkpoint_name!r} must be letters, digits, '_', "
                             "'.' or '-'")
        self.checkpoint, self.directory = checkpoint, os.fspath(directory)
        self.max_to_keep, self.checkpoint_name = max_to_keep, str(checkpoint_name)

    @property
    def checkpoints(self):
        """The kept checkpoints, oldest first (paths as `restore` takes them)."""
        prefix = self.checkpoint_name + "-"
        return [os.path.join(self.directory, n) for n in _read_index(self.directory) if n.startswith(prefix)
                and os.path.isfile(_file_of(os.path.join(self.directory, n)))]

    @property
    def latest_checkpoint(self):
        kept = self.checkpoints
        return kept[-1] if kept else None

    def save(self, checkpoint_number=None):
        """Saves the next checkpoint (numbered `checkpoint_number` when given), deletes those beyond
        `max_to_keep`, and returns its path."""
        if checkpoint_number is not None:
            self.checkpoint.save_counter = int(checkpoint_number) - 1
        path = self.checkpoint.save(os.path.join(self.directory, self.checkpoint_name))
        kept = self.checkpoints
        if self.max_to_keep is not None and len(kept) > self.max_to_keep:
            for old in kept[:-self.max_to_keep]:
                os.unlink(_file_of(old))
            _write_index(self.directory, [os.path.basename(p) for p in kept[-self.max_to_keep:]])
        return path

    def restore_or_initialize(self):
        """Restores the latest checkpoint if there is one; returns its path or None."""
        latest = self.latest_checkpoint
        self.checkpoint.restore(latest)
        return latest
