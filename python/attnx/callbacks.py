"""Callbacks for `Model.fit`, with Keras' names and behaviour."""
import math
import os

import numpy as np


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


class CallbackList:
    def __init__(self, callbacks, model, params):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            cb.set_model(model)
            cb.params = params

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
