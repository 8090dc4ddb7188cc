"""Callbacks for `Model.fit`, with Keras' names and behaviour."""
import csv
import json
import math
import os
import tempfile

import numpy as np

from . import backend, optimizers, random, saving


class Callback:
    """Base class; `self.model` is set by fit. Hooks receive the epoch/batch index and a logs dict."""

    def __init__(self):
        self.model = None
        self.params = {}

    def set_model(self, model):
        self.model = model

    def on_train_begin(self, logs=None): pass
    def on_train_end(self, logs=None): pass
    def on_epoch_begin(self, epoch, logs=None): pass
    def on_epoch_end(self, epoch, logs=None): pass
    def on_train_batch_begin(self, batch, logs=None): pass
    def on_train_batch_end(self, batch, logs=None): pass
    # evaluate, and fit's validation (Keras calls them there too)
    def on_test_begin(self, logs=None): pass
    def on_test_end(self, logs=None): pass
    def on_test_batch_begin(self, batch, logs=None): pass
    def on_test_batch_end(self, batch, logs=None): pass
    # predict: on_predict_batch_end's logs hold the batch's {"outputs": ...}
    def on_predict_begin(self, logs=None): pass
    def on_predict_end(self, logs=None): pass
    def on_predict_batch_begin(self, batch, logs=None): pass
    def on_predict_batch_end(self, batch, logs=None): pass


class CallbackList:
    def __init__(self, callbacks, model, params):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            cb.set_model(model)
            cb.params = params

    def calls(self, *hooks):
        """Whether some callback does something at one of `hooks` (its own method, not Callback's empty
        one): the training loop skips the batch hooks, and the logs it would make for them, when none
        does, as Keras' CallbackList does."""
        return any(getattr(getattr(cb, hook, None), "__func__", None) is not getattr(Callback, hook)
                   for cb in self.callbacks for hook in hooks)

    def __getattr__(self, hook):
        if not hook.startswith("on_"):
            raise AttributeError(hook)
        indexed = hook.startswith(("on_epoch_", "on_train_batch_", "on_test_batch_", "on_predict_batch_"))

        def fire(*args, logs=None):
            # Keras calls every hook with its logs dict as the last positional argument (so a
            # LambdaCallback(on_epoch_begin=lambda epoch, logs: ...) works); fill it in when the
            # caller has none
            if len(args) == int(indexed):
                args = args + ({} if logs is None else logs,)
            for cb in self.callbacks:
                getattr(cb, hook)(*args)
        return fire


class History(Callback):
    """Records every epoch's logs: ``history.history["val_loss"]`` etc. Returned by fit."""

    def on_train_begin(self, logs=None):
        self.epoch = []
        self.history = {}

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for k, v in (logs or {}).items():
            self.history.setdefault(k, []).append(v)


def _mode_better(mode, monitor):
    if mode == "auto":
        mode = "max" if any(s in monitor for s in ("acc", "precision", "recall", "f1", "auc")) else "min"
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
    return mode


class EarlyStopping(Callback):
    """Stops training when `monitor` has not improved by `min_delta` for `patience` epochs.

    With ``restore_best_weights=True`` the model gets back the weights of its best epoch.
    """

    def __init__(self, monitor="val_loss", min_delta=0.0, patience=0, verbose=0, mode="auto", baseline=None,
                 restore_best_weights=False, start_from_epoch=0):
        super().__init__()
        self.monitor, self.min_delta, self.patience = monitor, abs(min_delta), int(patience)
        self.verbose, self.baseline, self.restore_best_weights = verbose, baseline, restore_best_weights
        self.start_from_epoch = start_from_epoch
        self.mode = _mode_better(mode, monitor)

    def _improved(self, current, reference):
        if self.mode == "min":
            return current < reference - self.min_delta
        return current > reference + self.min_delta

    def on_train_begin(self, logs=None):
        self.wait = 0
        self.stopped_epoch = 0
        self.best = math.inf if self.mode == "min" else -math.inf
        self.best_weights = None
        self.best_epoch = 0

    def on_epoch_end(self, epoch, logs=None):
        current = (logs or {}).get(self.monitor)
        if current is None:
            raise KeyError(f"EarlyStopping: metric '{self.monitor}' is not in the logs ({sorted(logs or {})})")
        if epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.model.get_weights()
        self.wait += 1
        if self._improved(current, self.best):
            self.best, self.best_epoch = current, epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._improved(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.restore_best_weights and self.best_weights is not None:
                self.model.set_weights(self.best_weights)
            if self.verbose:
                print(f"Epoch {epoch + 1}: early stopping (best {self.monitor} {self.best:.4f} "
                      f"at epoch {self.best_epoch + 1})")


class ModelCheckpoint(Callback):
    """Saves the model (or only its weights) after every epoch, or only when `monitor` improves.

    `filepath` may contain format fields from the epoch logs, e.g. ``"model-{epoch:02d}-{val_loss:.3f}.attnx"``.
    Files are written atomically: an interrupted save leaves the previous file intact.
    """

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_best_only=False, save_weights_only=False,
                 mode="auto"):
        super().__init__()
        self.filepath, self.monitor, self.verbose = os.fspath(filepath), monitor, verbose
        self.save_best_only, self.save_weights_only = save_best_only, save_weights_only
        self.mode = _mode_better(mode, monitor)
        self.best = math.inf if self.mode == "min" else -math.inf

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        path = self.filepath.format(epoch=epoch + 1, **logs)
        if self.save_best_only:
            current = logs.get(self.monitor)
            if current is None:
                raise KeyError(f"ModelCheckpoint: metric '{self.monitor}' is not in the logs ({sorted(logs)})")
            better = current < self.best if self.mode == "min" else current > self.best
            if not better:
                return
            self.best = current
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path)
        if self.verbose:
            print(f"Epoch {epoch + 1}: saved to {path}")


class LearningRateScheduler(Callback):
    """Sets the optimizer's learning rate at each epoch start to ``schedule(epoch, lr)``."""

    def __init__(self, schedule, verbose=0):
        super().__init__()
        self.schedule, self.verbose = schedule, verbose

    def on_epoch_begin(self, epoch, logs=None):
        opt = self.model.optimizer
        opt.learning_rate = float(self.schedule(epoch, opt.current_learning_rate))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self.model.optimizer.current_learning_rate


class TerminateOnNaN(Callback):
    """Stops training when the batch loss becomes NaN or infinite."""

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(loss):
            print(f"Batch {batch}: invalid loss, terminating training")
            self.model.stop_training = True


class LambdaCallback(Callback):
    """A callback from plain functions, e.g. ``LambdaCallback(on_epoch_end=lambda epoch, logs: ...)``."""

    def __init__(self, **hooks):
        super().__init__()
        for name, fn in hooks.items():
            if not hasattr(Callback, name):
                raise ValueError(f"LambdaCallback: unknown hook {name!r}")
            setattr(self, name, fn)


class CSVLogger(Callback):
    """Writes every epoch's logs as a row of a CSV file: ``epoch`` (from 0, as Keras) then the
    logs' keys in sorted order. With ``append=True`` an existing file is continued (its header is
    written only if it is empty), e.g. when training resumes."""

    def __init__(self, filename, separator=",", append=False):
        super().__init__()
        self.filename, self.separator, self.append = os.fspath(filename), separator, append
        self._file = self._writer = self._keys = None

    def on_train_begin(self, logs=None):
        write_header = not (self.append and os.path.exists(self.filename) and os.path.getsize(self.filename))
        self._file = open(self.filename, "a" if self.append else "w", newline="", encoding="utf-8")
        self._writer, self._keys, self._write_header = None, None, write_header

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self._writer is None:
            self._keys = sorted(logs)
            self._writer = csv.DictWriter(self._file, ["epoch"] + self._keys, delimiter=self.separator,
                                          extrasaction="ignore")
            if self._write_header:
                self._writer.writeheader()
        self._writer.writerow({"epoch": epoch, **{k: logs.get(k, "NA") for k in self._keys}})
        self._file.flush()  # each epoch reaches the file even if training dies later

    def on_train_end(self, logs=None):
        self._file.close()
        self._file = self._writer = None


class ReduceLROnPlateau(Callback):
    """Multiplies the learning rate by `factor` when `monitor` has not improved by more than
    `min_delta` for `patience` epochs, then waits `cooldown` epochs before counting again; never
    below `min_lr`. Adds ``learning_rate`` to the epoch logs. The optimizer needs a constant
    learning rate (a schedule already decides it)."""

    def __init__(self, monitor="val_loss", factor=0.1, patience=10, verbose=0, mode="auto", min_delta=1e-4,
                 cooldown=0, min_lr=0.0):
        super().__init__()
        if not 0.0 <= factor < 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be in [0, 1), got {factor}")
        self.monitor, self.factor, self.patience, self.verbose = monitor, float(factor), int(patience), verbose
        self.min_delta, self.cooldown, self.min_lr = abs(float(min_delta)), int(cooldown), float(min_lr)
        self.mode = _mode_better(mode, monitor)

    def _improved(self, current):
        if self.mode == "min":
            return current < self.best - self.min_delta
        return current > self.best + self.min_delta

    def on_train_begin(self, logs=None):
        if isinstance(self.model.optimizer.learning_rate, optimizers.LearningRateSchedule):
            raise ValueError("ReduceLROnPlateau: the optimizer's learning rate is a schedule; give it a number")
        self.best = math.inf if self.mode == "min" else -math.inf
        self.wait = self.cooldown_counter = 0

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        optimizer = self.model.optimizer
        logs["learning_rate"] = float(optimizer.learning_rate)
        current = logs.get(self.monitor)
        if current is None:
            raise KeyError(f"ReduceLROnPlateau: metric '{self.monitor}' is not in the logs ({sorted(logs)})")
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._improved(current):
            self.best, self.wait = current, 0
        elif self.cooldown_counter == 0:
            self.wait += 1
            # compared in float32 as Keras does, so that a rate stored as float32 counts as reaching min_lr
            if self.wait >= self.patience and np.float32(optimizer.learning_rate) > np.float32(self.min_lr):
                optimizer.learning_rate = max(float(optimizer.learning_rate) * self.factor, self.min_lr)
                self.cooldown_counter, self.wait = self.cooldown, 0
                if self.verbose:
                    print(f"Epoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {optimizer.learning_rate}.")


class BackupAndRestore(Callback):
    """Backs up training so that a `fit` that was interrupted (an exception, a killed process)
    resumes where the backup was taken when the same fit is run again: same model, compile
    arguments, data and fit arguments (a generator made anew, from its beginning).

    A backup in `backup_dir` holds the model with its weights, optimizer state and learning rate
    (an `.attnx` file), the position of the fit (epoch, batch within the epoch and position in the
    data), the state of attnx's random stream (`attnx.random`: its seed and step, which fix shuffling,
    dropout and sampling) and of the NumPy generator of initial weights (`attnx.backend.rng()`), so
    the resumed run continues bit for bit as the uninterrupted one would have. It is written at the
    end of every epoch (``save_freq="epoch"``) or every `save_freq` batches, each backup replacing
    the last one only once it is complete. A fit that completes deletes it (``delete_checkpoint``).

    Not restored, as in Keras: the other callbacks' state, and the running loss and metric means
    of an epoch resumed in its middle (its logs count only the batches after the resume).
    """

    STATE_FILE = "backup.json"

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        super().__init__()
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq <= 0):
            raise ValueError(f"BackupAndRestore: save_freq must be 'epoch' or a positive number of batches, "
                             f"got {save_freq!r}")
        self.backup_dir, self.save_freq, self.delete_checkpoint = os.fspath(backup_dir), save_freq, delete_checkpoint
        self._batches_since_backup = 0

    @property
    def _state_path(self):
        return os.path.join(self.backup_dir, self.STATE_FILE)

    def _read_state(self):
        """The backup's state, None if there is none. Nothing in backup.json is trusted: the file must be
        a regular file holding JSON, and every field has its type and range (`_check_state`) before
        anything is loaded or deleted, so no file outside the backup folder is ever read or removed."""
        try:
            f = saving.open_regular(self._state_path, "backup state file")
        except FileNotFoundError:
            return None
        with f:
            try:
                state = json.loads(f.read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
                raise ValueError(f"{self._state_path}: not a backup this BackupAndRestore wrote "
                                 f"({type(exc).__name__}: {exc})") from exc
        return self._check_state(state)

    def _check_state(self, state):
        """`state` (backup.json's content) if every field is as `_backup` writes it, else ValueError naming
        the file and the field. Ranges: `number` >= 0, `model_file` exactly ``model-<number>.attnx`` (a
        regular file in the backup folder, not a link), the epoch within this fit's epochs, the step and
        the batches drawn no more than the fit can have trained, generator states the generator takes."""
        path = self._state_path

        def field(container, key, expected, what):
            value = container.get(key) if isinstance(container, dict) else None
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise ValueError(f"{path}: field '{what}' should be {_KIND[expected]}, got {shown}")
            return value

        def at_most(value, low, high, what):
            if not low <= value <= (math.inf if high is None else high):
                raise ValueError(f"{path}: field '{what}' is {value}, expected {low} .. {high if high is not None else ''}")

        if not isinstance(state, dict):
            raise ValueError(f"{path}: should hold a JSON object, got {type(state).__name__}")
        number = field(state, "number", int, "number")
        at_most(number, 0, None, "number")
        model_file = field(state, "model_file", str, "model_file")
        if model_file != f"model-{number}.attnx":
            raise ValueError(f"{path}: field 'model_file' is {model_file[:80]!r}, expected 'model-{number}.attnx' "
                             "(a file in the backup folder)")
        model_path = os.path.join(self.backup_dir, model_file)
        if not os.path.isfile(model_path) or os.path.islink(model_path):
            raise ValueError(f"{path}: field 'model_file' names {model_file!r}, which is not a regular file in "
                             f"{self.backup_dir}")
        training = field(state, "training", dict, "training")
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        epoch = field(training, "epoch", int, "training.epoch")
        at_most(epoch, 0, epochs, "training.epoch")
        step = field(training, "step", int, "training.step")
        at_most(step, 0, steps, "training.step")
        data = field(training, "data", dict, "training.data")
        for key in ("drawn", "pass_key"):
            if key not in data:
                raise ValueError(f"{path}: field 'training.data' has no '{key}'")
        if data.get("drawn") is not None:
            drawn = field(data, "drawn", int, "training.data.drawn")
            # the batches drawn from the current pass were trained by this fit, epoch by epoch
            at_most(drawn, 0, None if steps is None else epoch * steps + step, "training.data.drawn")
        if data.get("pass_key") is not None:
            at_most(field(data, "pass_key", int, "training.data.pass_key"), 0, 2 ** 64 - 1, "training.data.pass_key")
        _check_rng_state(field(state, "rng", dict, "rng"), path, "rng")
        stream = field(state, "random", dict, "random")
        if set(stream) != {"seed", "step"}:
            raise ValueError(f"{path}: field 'random' should hold 'seed' and 'step', got {sorted(stream)}")
        at_most(field(stream, "seed", int, "random.seed"), 0, 2 ** 64 - 1, "random.seed")
        at_most(field(stream, "step", int, "random.step"), 0, None, "random.step")
        return state

    def on_train_begin(self, logs=None):
        if not self.model.built:
            raise ValueError("BackupAndRestore: the model must have its weights when fit begins (give the first "
                             "layer an input_shape, or call the model on data first)")
        if os.path.exists(self.backup_dir) and not os.path.isdir(self.backup_dir):
            raise ValueError(f"BackupAndRestore: backup_dir {self.backup_dir} is not a folder")
        os.makedirs(self.backup_dir, exist_ok=True)
        self._batches_since_backup = 0
        state = self._read_state()
        if state is None:
            return
        model_path = os.path.join(self.backup_dir, state["model_file"])
        header, weights = saving.read_model(model_path)
        saving.assign(self.model, weights, model_path)
        saving.restore_optimizer_state(self.model, header, model_path)
        self.model.optimizer.learning_rate = optimizers.get(header["compile"]["optimizer"]).learning_rate
        self.model.restore_training_state(state["training"])
        backend.rng().bit_generator.state = state["rng"]
        random.set_state(state["random"])

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch":
            return
        self._batches_since_backup += 1
        if self._batches_since_backup >= self.save_freq:
            self._backup()

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._backup()

    def _backup(self):
        """Writes the model under a new name, then the state naming it (atomically), then deletes
        the previous model file: a crash at any point leaves one complete backup."""
        self._batches_since_backup = 0
        previous = self._read_state()
        number = 0 if previous is None else previous["number"] + 1
        model_file = f"model-{number}.attnx"
        self.model.save(os.path.join(self.backup_dir, model_file))
        state = {"number": number, "model_file": model_file, "training": self.model.training_state(),
                 "rng": backend.rng().bit_generator.state, "random": random.get_state()}
        fd, tmp = tempfile.mkstemp(prefix=".backup-", suffix=".tmp", dir=self.backup_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._state_path)
        if previous is not None:
            os.remove(os.path.join(self.backup_dir, previous["model_file"]))

    def on_train_end(self, logs=None):
        if not self.delete_checkpoint:
            return
        state = self._read_state()
        if state is not None:
            os.remove(os.path.join(self.backup_dir, state["model_file"]))
            os.remove(self._state_path)


_KIND = {int: "an integer", str: "a string", dict: "an object"}


def _check_rng_state(state, path, what):
    """ValueError naming `path` and `what` unless `state` is one NumPy's generator takes (tried on a copy
    of attnx's generator: the bit generator's own checks, e.g. of its counter's range)."""
    trial = backend.rng().bit_generator.__class__()
    try:
        trial.state = state
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise ValueError(f"{path}: field '{what}' is not a state of {type(trial).__name__} "
                         f"({type(exc).__name__}: {exc})") from exc


# ------------------------------------------------------------------------------------------- TensorBoard
def _crc32c_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data):
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated and offset ("masked")."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number, wire_type, payload):
    """One protobuf field: its key, then the payload (length-prefixed for wire type 2)."""
    key = _varint((number << 3) | wire_type)
    return key + (_varint(len(payload)) + payload if wire_type == 2 else payload)


def _event(wall_time, step=None, file_version=None, scalars=()):
    """An `Event` protobuf (tensorflow/core/util/event.proto): wall_time = 1 (double), step = 2 (int64),
    file_version = 3, summary = 5 holding `Summary.Value`s (tag = 1, simple_value = 2, a float)."""
    import struct
    message = _field(1, 1, struct.pack("<d", wall_time))
    if step is not None:
        message += _field(2, 0, _varint(int(step) & 0xFFFFFFFFFFFFFFFF))
    if file_version is not None:
        message += _field(3, 2, file_version.encode())
    if scalars:
        values = b"".join(_field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
                          for tag, value in scalars)
        message += _field(5, 2, values)
    return message


class _EventWriter:
    """One TensorBoard event file (TFRecords of `Event`s), written as TensorBoard's readers expect it."""

    def __init__(self, folder):
        import socket
        import time
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}."
                                         f"{os.getpid()}.attnx")
        self._file = open(self.path, "ab")
        self.write(_event(time.time(), file_version="brain.Event:2"))

    def write(self, event):
        import struct
        length = struct.pack("<Q", len(event))
        self._file.write(length + struct.pack("<I", _masked_crc32c(length)) + event +
                         struct.pack("<I", _masked_crc32c(event)))

    def scalars(self, step, values):
        import time
        self.write(_event(time.time(), step=step, scalars=[(k, float(v)) for k, v in values.items()]))
        self._file.flush()

    def close(self):
        self._file.close()


class TensorBoard(Callback):
    """Writes the logs of `fit` as TensorBoard scalars (Keras' TensorBoard callback, scalars only): under
    `log_dir`, ``train/`` gets each epoch's training logs and ``validation/`` the ``val_`` ones (without the
    prefix), tagged ``epoch_<name>`` as Keras tags them; with ``update_freq="batch"`` or an integer n,
    ``train/`` also gets every n-th batch's logs tagged ``batch_<name>``. The files are TensorBoard's event
    format, written without TensorFlow; ``tensorboard --logdir <log_dir>`` shows them.

    Args:
        log_dir: the folder (created).
        update_freq: "epoch" (default), "batch" (every batch) or a number of batches.
    """

    def __init__(self, log_dir="logs", update_freq="epoch", **ignored):
        super().__init__()
        if update_freq not in ("epoch", "batch") and (isinstance(update_freq, bool) or
                                                     not isinstance(update_freq, int) or update_freq < 1):
            raise ValueError(f"TensorBoard: update_freq must be 'epoch', 'batch' or a positive integer, got "
                             f"{update_freq!r}")
        self.log_dir = os.fspath(log_dir)
        self.update_freq = 1 if update_freq == "batch" else update_freq
        self._writers = {}
        self._batches = 0

    def _writer(self, name):
        if name not in self._writers:
            self._writers[name] = _EventWriter(os.path.join(self.log_dir, name))
        return self._writers[name]

    def on_train_begin(self, logs=None):
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self.update_freq != "epoch" and self._batches % self.update_freq == 0:
            values = {f"batch_{k}": v for k, v in (logs or {}).items() if np.ndim(v) == 0}
            self._writer("train").scalars(self._batches, values)

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: v for k, v in (logs or {}).items() if np.ndim(v) == 0}
        train = {f"epoch_{k}": v for k, v in logs.items() if not k.startswith("val_")}
        validation = {f"epoch_{k[4:]}": v for k, v in logs.items() if k.startswith("val_")}
        if self.model is not None and getattr(self.model, "optimizer", None) is not None:
            train["epoch_learning_rate"] = self.model.optimizer.current_learning_rate
        self._writer("train").scalars(epoch, train)
        if validation:
            self._writer("validation").scalars(epoch, validation)

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
