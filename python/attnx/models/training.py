"""Keras' training API for every model: compile, fit / evaluate / predict and their one loop, the
*_on_batch steps, Keras' train_step(data) override with compute_loss / compute_metrics, and where `fit`
is for `attnx.callbacks.BackupAndRestore`."""
import functools
import time
import warnings

import numpy as np

from .. import callbacks as callbacks_module, data_adapter, losses as losses_module
from .. import metrics as metrics_module, ops, optimizers
from .graph import _structure
from .numerics import _check_finite


class TrainingMixin:
    """compile / fit / evaluate / predict of a `Model` (functional or a class)."""

    _fit_data = _fit_position = None
    _distribute = None

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None, distribute=None):
        """Configures training.

        Args:
            optimizer: name ("adam", "sgd", "rmsprop", "adamw") or an optimizer instance.
            loss: name or Loss instance; a list (or dict by output layer name) for several outputs.
            metrics: list of names/instances ("accuracy", "precision", "recall", "f1"), or a list
                of such lists for several outputs.
            loss_weights: weights of each output's loss in the total.
            distribute: an `attnx.distributed.DataParallel` to train, evaluate and predict on every
                rank of an MPI job (run under ``mpiexec``): each global batch is split across the
                ranks, their gradients summed, and only rank 0 prints and writes files.
        """
        self.optimizer = optimizers.get(optimizer)
        if distribute is not None and not all(hasattr(distribute, a) for a in ("run", "shard_batch", "sum")):
            raise TypeError(f"Model '{self.name}': `distribute` must be an attnx.distributed.DataParallel, got "
                            f"{distribute!r}")
        self._distribute = distribute
        n = self._num_outputs()
        if loss is None:
            raise ValueError(f"Model '{self.name}': compile() needs a loss")
        if isinstance(loss, dict):
            loss = [loss[t.node.layer.name] for t in self.outputs]
        loss_list = loss if isinstance(loss, (list, tuple)) else [loss] * n
        if len(loss_list) != n:
            raise ValueError(f"Model '{self.name}': {n} outputs but {len(loss_list)} losses")
        self.loss_functions = [losses_module.get(l) for l in loss_list]
        self.loss_weights = [1.0] * n if loss_weights is None else [float(w) for w in loss_weights]
        metrics = metrics or []
        per_output = metrics if (metrics and isinstance(metrics[0], (list, tuple))) else [metrics] * n
        self.compiled_metrics = [[metrics_module.get(m, lf) for m in ms]
                                 for ms, lf in zip(per_output, self.loss_functions)]
        self._compile_config = {"optimizer": optimizers.serialize(self.optimizer),
                                "loss": [losses_module.serialize(l) for l in self.loss_functions],
                                "metrics": [[m.name for m in ms] for ms in self.compiled_metrics],
                                "loss_weights": self.loss_weights}
        self.compiled = True

    def _num_outputs(self):
        return len(self.outputs) if self._functional else (2 if self._multi_output else 1)

    def _build_for(self, x):
        """Builds the model from a first batch `x` if it has no graph yet (Keras builds on the first
        fit, evaluate, predict or *_on_batch call). Functional models are built already."""

    def _check_compiled(self):
        if not self.compiled:
            raise RuntimeError(f"Model '{self.name}': call compile(optimizer, loss) before training or evaluating")

    def _output_name(self, i):
        """Output i's name in the metric names: its layer's, or a class model's `output_names`."""
        return self.outputs[i].node.layer.name if self._functional else self.output_names[i]

    def _metric_names(self, prefix=""):
        names = []
        for i, ms in enumerate(self.compiled_metrics):
            tag = "" if len(self.compiled_metrics) == 1 else f"{self._output_name(i)}_"
            names.extend(prefix + tag + m.name for m in ms)
        return names

    def _losses_and_grads(self, ys, preds, sample_weight, masks):
        """(the weighted total of the outputs' losses, each output's loss gradient). Under a
        data-parallel strategy the value is this rank's part of the global batch's loss and the
        gradients are scaled to match: each output's mean is taken over the whole global batch."""
        masks = [_loss_mask(m, p) for m, p in zip(masks, preds)]
        shares = [1.0] * len(preds)
        if self._distribute is not None:
            counts = [lf.count(y, p, m) for lf, y, p, m in zip(self.loss_functions, ys, preds, masks)]
            shares = [c / t if t else 0.0 for c, t in zip(counts, self._distribute.sum(counts))]
        total, dys = 0.0, []
        for lf, w, y, p, m, share in zip(self.loss_functions, self.loss_weights, ys, preds, masks, shares):
            value, dy = lf.compute(y, p, sample_weight, mask=m)
            total += w * share * value
            dys.append(dy * dy.dtype.type(w * share) if w * share != 1.0 else dy)
        return total, dys

    def _update_metrics(self, ys, preds, sample_weight, masks):
        for ms, y, p, m in zip(self.compiled_metrics, ys, preds, masks):
            m = _loss_mask(m, p)
            for metric in ms:
                metric.update_state(y, p, sample_weight, mask=m)

    def _reset_metrics(self):
        for ms in self.compiled_metrics:
            for m in ms:
                m.reset_state()

    def train_data(self, x, y):
        """The (inputs, targets) a training or test step feeds to `forward` and the losses, from a
        batch (x, y) as `fit` and `evaluate` were given it. Identity here; a model that derives
        both from its data overrides it (Seq2Seq: teacher forcing, targets shifted by one)."""
        return x, y

    # True for a model whose `train_data` makes the targets from x alone (DRAW: the images), so that
    # ``fit(x)`` and ``evaluate(x)`` take no y
    targets_from_inputs = False

    def _forward_for_loss(self, x, training, check=False):
        """(predictions, output masks, cache), predictions and masks as lists (one per output)."""
        if self._functional:
            out, masks, cache = self._run_graph(x, training, None, check)
        else:
            out, cache = self.apply(x, training=training)
            masks = [None] * self._num_outputs()
            if check:
                _check_finite(_structure(out), lambda i: f"output {i} of model '{self.name}' in the forward pass")
        return (_structure(out) if self._multi_output else [out]), masks, cache

    def _backprop_for_loss(self, cache, dys, check=False):
        dy = dys if self._multi_output else dys[0]
        if self._functional:
            self._backprop_graph(cache, dy, input_gradients=False, check=check)
            return
        self.run_backprop(cache, dy, need_dx=False)
        if check:
            names = list(self.grads)
            _check_finite(self.grads.values(), lambda i: f"gradient of weight '{names[i]}' in the backward pass")

    def train_step(self, x, y, sample_weight=None, check_numerics=False):
        """One optimization step on the batch (x, y): forward, losses, backprop, optimizer, metrics.
        Returns the batch loss (regularization included). `check_numerics`: as in `fit`.
        Under a data-parallel strategy (x, y) is the global batch: this rank trains on its shard
        and the ranks' gradients are summed before the one optimizer step every rank takes."""
        dist = self._distribute
        if dist is not None:
            x, y, sample_weight = dist.shard_batch(x, y, sample_weight)
        self.zero_grad()
        loss, ys = 0.0, None
        if dist is None or dist.rows(x):  # a rank whose shard is empty only joins the sums
            x, y = self.train_data(x, y)
            ys = self._target_list(y)
            preds, masks, cache = self._forward_for_loss(x, True, check_numerics)
            loss, dys = self._losses_and_grads(ys, preds, sample_weight, masks)
            if check_numerics:
                _check_finite([loss], lambda i: "the loss")
                _check_finite(dys, lambda i: f"gradient of the loss for output {i}" + (
                    f" (layer '{self.outputs[i].node.layer.name}')" if self._functional else ""))
            self._backprop_for_loss(cache, dys, check_numerics)
        elif dist is not None:
            dist.sum([0.0] * self._num_outputs())  # the loss counts: this rank scores nothing
        if dist is not None:
            loss = dist.allreduce_gradients([g for _, _, g in self.trainable_params], loss)
        loss += self.regularize()
        self.optimizer.apply([(p, g) for _, p, g in self.trainable_params])
        if check_numerics:
            names = [n for n, _, _ in self.trainable_params]
            _check_finite([p for _, p, _ in self.trainable_params],
                          lambda i: f"weight '{names[i]}' after the optimizer step")
        if ys is not None:
            self._update_metrics(ys, preds, sample_weight, masks)
        return loss

    def test_step(self, x, y, sample_weight=None):
        """The batch loss (regularization included, as Keras reports it) in inference mode; updates
        the metrics (with a data-parallel strategy: this rank's shard; `fit` and `evaluate` sum the
        metrics over the ranks where they report them)."""
        return self._test_loss(x, y, sample_weight) + self.regularization_loss()

    def _test_loss(self, x, y, sample_weight):
        """test_step's loss without the regularization (which `_evaluate` computes once per pass)."""
        dist = self._distribute
        if dist is not None:
            x, y, sample_weight = dist.shard_batch(x, y, sample_weight)
        loss = 0.0
        if dist is None or dist.rows(x):
            x, y = self.train_data(x, y)
            ys = self._target_list(y)
            preds, masks, _ = self._forward_for_loss(x, False)
            loss, _ = self._losses_and_grads(ys, preds, sample_weight, masks)
            self._update_metrics(ys, preds, sample_weight, masks)
        elif dist is not None:
            dist.sum([0.0] * self._num_outputs())
        if dist is not None:
            loss = dist.sum([loss])[0]
        return loss

    def predict_step(self, x):
        """The outputs for one batch in inference mode (with a data-parallel strategy every rank
        computes its shard and every rank gets the whole batch's outputs)."""
        dist = self._distribute
        if dist is None:
            return self.apply(x, training=False)[0]
        x, = dist.shard_batch(x)
        out = self.apply(x, training=False)[0] if dist.rows(x) else None
        return dist.gather(out)

    def train_on_batch(self, x, y, sample_weight=None, check_numerics=False):
        """One optimization step on one batch; returns the batch loss (regularization included).
        `check_numerics`: as in `fit`."""
        self._check_compiled()
        self._build_for(x)
        if _takes_one_argument(type(self).train_step):  # Keras' train_step(self, data), overridden
            logs = self.train_step((x, y) if sample_weight is None else (x, y, sample_weight))
            loss = logs.get("loss") if isinstance(logs, dict) else logs
            if loss is None:
                raise ValueError(f"Model '{self.name}': train_step(data) must return the loss, or a dict with "
                                 f"'loss', got {logs!r}")
            return float(ops.untraced(loss))
        return self.train_step(x, y, sample_weight, check_numerics)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        """The compiled losses of `y_pred` against `y` (weighted by `loss_weights`) plus the weights'
        regularization, as in Keras: inside a GradientTape block a value of the tape, whose gradient
        reaches the predictions and the regularized weights. For an overridden ``train_step(data)``."""
        self._check_compiled()
        preds = _structure(y_pred) if self._multi_output else [y_pred]
        total = 0.0
        for lf, w, target, pred in zip(self.loss_functions, self.loss_weights, self._target_list(y), preds):
            value = lf(target, pred, sample_weight)
            total = total + (value if w == 1.0 else ops.multiply(value, w))
        return ops.add(total, self._regularization_term())

    def _regularization_term(self):
        """The regularization loss; on a tape, a value whose backward adds the regularizers' gradients."""
        value = self.regularization_loss()
        tape = ops.active_tape()
        if tape is None or not self._all_regularizers():
            return value
        params = self.params

        def backward(output_grads):
            scale = float(output_grads[0])
            grads = self.grads  # read on replay: inside GradientTape.gradient, that tape's buffers
            for name, regularizer in self._all_regularizers():
                gradient = np.zeros_like(params[name])
                regularizer.add_gradient(params[name], gradient)
                grads[name] += gradient * gradient.dtype.type(scale)
            return []
        grads = self.grads
        regularized = [(params[n], grads[n]) for n, _ in self._all_regularizers()]
        return tape.record_call(backward, [np.asarray(value, dtype=self.dtype)], [], weights=regularized)[0]

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Updates the compiled metrics with a batch's predictions and returns their results (a dict), as
        Keras' ``compute_metrics``, for an overridden ``train_step(data)``."""
        preds = [ops.untraced(p) for p in (_structure(y_pred) if self._multi_output else [y_pred])]
        self._update_metrics(self._target_list(y), preds, sample_weight, [None] * len(preds))
        return self._metric_results()

    def test_on_batch(self, x, y, sample_weight=None, return_dict=False):
        """Loss (and metrics) of one batch in inference mode, as `evaluate` on that batch alone."""
        self._check_compiled()
        self._build_for(x)
        self._reset_metrics()
        loss = self.test_step(x, y, None if sample_weight is None else np.asarray(sample_weight))
        return self._result({"loss": loss, **self._metric_results()}, return_dict)

    def predict_on_batch(self, x):
        """Outputs for one batch (inference mode)."""
        self._build_for(x)
        return self.predict_step(x)

    @property
    def metrics_names(self):
        """The names `evaluate` returns its values under: "loss", then the compiled metrics' (Keras)."""
        self._check_compiled()
        return ["loss"] + self._metric_names()

    @staticmethod
    def _result(logs, return_dict):
        return logs if return_dict else (list(logs.values()) if len(logs) > 1 else logs["loss"])

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, check_numerics=False):
        """Trains for `epochs` epochs, Keras-style; returns a `History`.

        Args:
            x, y: arrays (or lists / dicts of arrays for several inputs / outputs); or `x` a
                generator or any other iterable of batches ``(x, y)`` / ``(x, y, sample_weight)``
                and `y` None (see `attnx.data_adapter` for the rules).
            batch_size: samples per step for arrays (default 32); an iterable fixes its own.
            epochs: index of the last epoch (training runs epochs initial_epoch .. epochs - 1).
            verbose: 0 silent, 1 a progress bar per epoch (default), 2 one line per epoch.
            callbacks: e.g. ``[attnx.callbacks.EarlyStopping(patience=2)]``.
            validation_split: fraction of the array data, taken from the end before shuffling, held out.
            validation_data: ``(x_val, y_val)`` or ``(x_val, y_val, sample_weight_val)`` arrays, or
                an iterable of batches, evaluated after each epoch (overrides validation_split).
            shuffle: reshuffle array samples every epoch (seed with attnx.set_random_seed).
            class_weight: {class index: weight} weighting each sample's loss by its target's class
                (sparse ids, (B, 1) binary or one-hot targets; one output; not with sample_weight).
            sample_weight: per-sample loss weights (batch,) for array data.
            initial_epoch: the epoch to start from (to continue an earlier fit).
            steps_per_epoch: batches per epoch; the next epoch continues where the last one
                stopped (a generator then runs across epochs). Default: one pass over the data.
            validation_steps: batches of validation data per evaluation (default: one pass).
            validation_batch_size: batch size for array validation data (default `batch_size`).
            check_numerics: stop with `attnx.models.NonFiniteError` (a FloatingPointError) as soon as
                a value becomes NaN or infinite, naming where: a model input, the output of the
                first layer that produced one in the forward pass, the loss or its gradient, the
                gradient a layer's backward pass produced for an input or a weight (the first
                such layer going backwards), or a weight after the optimizer step. Off by default
                (it scans every activation and gradient, which costs time).
        """
        self._check_compiled()
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = data_adapter.train_validation_split(
                x, y, sample_weight, validation_split)
        data = data_adapter.DataAdapter("fit", x, y, sample_weight, batch_size=batch_size, steps=steps_per_epoch,
                                        shuffle=shuffle, class_weight=class_weight, training=True,
                                        targets=not self.targets_from_inputs)
        validation = None if validation_data is None else self._validation_adapter(
            validation_data, validation_batch_size or batch_size, validation_steps)
        if data.arrays:  # built now, so that callbacks find the weights at on_train_begin
            self._build_for(x)
        verbose = 1 if verbose == "auto" else int(verbose)
        dist = self._distribute
        if dist is not None:
            return dist.run(self, self._fit, data, validation, epochs, verbose if dist.is_main else 0, callbacks,
                            initial_epoch, check_numerics)
        return self._fit(data, validation, epochs, verbose, callbacks, initial_epoch, check_numerics)

    def _fit(self, data, validation, epochs, verbose, callbacks, initial_epoch, check_numerics):
        history = callbacks_module.History()
        cbs = callbacks_module.CallbackList(list(callbacks or []) + [history], self,  # History last, as Keras
                                            {"epochs": epochs, "steps": data.steps_per_epoch, "verbose": verbose})
        self.stop_training = False
        # where training is, for training_state(): the next batch to train is `step` of `epoch`
        self._fit_data, self._fit_position = data, {"epoch": int(initial_epoch), "step": 0}
        batch_hooks = cbs.calls("on_train_batch_begin", "on_train_batch_end")
        try:
            cbs.on_train_begin()
            trained_any, logs = False, {}
            while self._fit_position["epoch"] < epochs and not self.stop_training:
                epoch, first_step = self._fit_position["epoch"], self._fit_position["step"]
                cbs.on_epoch_begin(epoch)
                self._reset_metrics()
                loss_mean = metrics_module.Mean("loss")
                bar = _progress(data.steps_per_epoch, f"Epoch {epoch + 1}/{epochs}", verbose == 1, initial=first_step)
                start = time.perf_counter()
                for step, batch in enumerate(data.epoch(first_step), first_step):
                    if batch_hooks:
                        cbs.on_train_batch_begin(step)
                    loss = self.train_on_batch(batch.x, batch.y, batch.sample_weight, check_numerics=check_numerics)
                    self._fit_position["step"] = step + 1
                    trained_any = True
                    loss_mean.update_state(loss, batch.size)
                    if batch_hooks or bar is not None:  # (the epoch's logs are made at its end)
                        logs = {"loss": loss_mean.result(), **self._metric_results()}
                    if batch_hooks:
                        cbs.on_train_batch_end(step, {**logs, "loss": loss})
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix({k: f"{v:.4f}" for k, v in logs.items()}, refresh=False)
                    if self.stop_training:
                        break
                # an epoch that found no batch (a resumed epoch whose batches had all been trained
                # goes on to its end: validation and on_epoch_end)
                if self._fit_position["step"] == first_step == 0:
                    if bar is not None:
                        bar.close()
                    if not trained_any:
                        raise ValueError("fit: the data gave no batch")
                    warnings.warn(f"fit: the data ran out in epoch {epoch + 1}, training stops (a generator gives "
                                  "its batches once: give steps_per_epoch and a generator that yields "
                                  "steps_per_epoch * epochs batches, or data that can be iterated again)",
                                  stacklevel=2)
                    break
                self._fit_position.update(epoch=epoch + 1, step=0)
                self._sum_metrics_over_ranks()
                logs = {"loss": loss_mean.result(), **self._metric_results()}
                if validation is not None:
                    logs.update({f"val_{k}": v for k, v in self._evaluate(validation, "validation_data",
                                                                          callbacks=cbs).items()})
                if bar is not None:
                    bar.set_postfix({k: f"{v:.4f}" for k, v in logs.items()})
                    bar.close()
                elif verbose == 2:
                    parts = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
                    print(f"Epoch {epoch + 1}/{epochs} - {time.perf_counter() - start:.1f}s - {parts}", flush=True)
                cbs.on_epoch_end(epoch, logs)
            cbs.on_train_end(logs)  # the last logs, as Keras
        finally:
            self._fit_data = self._fit_position = None
        self.history = history
        return history

    @staticmethod
    def _validation_adapter(validation_data, batch_size, steps):
        if data_adapter.is_array_data(validation_data):
            if not isinstance(validation_data, (list, tuple)) or len(validation_data) not in (2, 3):
                raise ValueError("fit: validation_data must be (x_val, y_val), (x_val, y_val, sample_weight_val) "
                                 f"or an iterable of batches, got {type(validation_data).__name__}")
            return data_adapter.DataAdapter("validation_data", *validation_data, batch_size=batch_size, steps=steps)
        return data_adapter.DataAdapter("validation_data", validation_data, steps=steps)

    def training_state(self):
        """Where the `fit` in progress is: ``{"epoch", "step", "data"}``, the epoch and batch it
        trains next and the position in its data (JSON-able; `attnx.callbacks.BackupAndRestore`
        saves it with the weights and the random generator)."""
        if self._fit_position is None:
            raise RuntimeError(f"Model '{self.name}': training_state() is only defined while fit runs")
        return {**self._fit_position, "data": self._fit_data.get_state()}

    def restore_training_state(self, state):
        """Makes the `fit` in progress continue from a `training_state()`; call it from a callback's
        ``on_train_begin`` with the same data given to fit as to the fit the state came from."""
        if self._fit_position is None:
            raise RuntimeError(f"Model '{self.name}': restore_training_state() is only possible while fit runs")
        self._fit_data.set_state(state["data"])
        self._fit_position.update(epoch=int(state["epoch"]), step=int(state["step"]))

    def _sum_metrics_over_ranks(self):
        """Under a data-parallel strategy: every rank's metrics become those of all ranks' data."""
        if self._distribute is not None:
            self._distribute.sum_metrics([m for ms in self.compiled_metrics for m in ms])

    def _metric_results(self):
        names = self._metric_names()
        values = [m.result() for ms in self.compiled_metrics for m in ms]
        return dict(zip(names, values))

    def _target_list(self, y):
        """Targets as a list, one per output (a dict is keyed by output layer name)."""
        if self._functional and isinstance(y, dict):
            missing = [t.node.layer.name for t in self.outputs if t.node.layer.name not in y]
            if missing:
                raise ValueError(f"Model '{self.name}': missing targets for outputs {missing}")
            return [y[t.node.layer.name] for t in self.outputs]
        ys = _structure(y) if self._multi_output else [y]
        if len(ys) != self._num_outputs():
            raise ValueError(f"Model '{self.name}': expected {self._num_outputs()} target arrays, got {len(ys)}")
        return ys

    def _evaluate(self, data, what, verbose=0, callbacks=None):
        """Loss and metrics over the batches of one epoch of `data` (a DataAdapter), as a dict."""
        self._reset_metrics()
        loss_mean = metrics_module.Mean("loss")
        bar = _progress(data.steps_per_epoch, "Evaluate", verbose == 1)
        callbacks = callbacks or callbacks_module.CallbackList([], self, {})
        batch_hooks = callbacks.calls("on_test_batch_begin", "on_test_batch_end")
        callbacks.on_test_begin()
        # the weights' penalty once per pass when nothing between the batches can change the weights
        # (a batch hook might) and test_step is ours: a pass over every regularized weight per batch saved
        regularization = None
        for step, batch in enumerate(data.epoch()):
            self._build_for(batch.x)
            if batch_hooks:
                callbacks.on_test_batch_begin(step)
            if batch_hooks or type(self).test_step is not TrainingMixin.test_step:
                loss = self.test_step(batch.x, batch.y, batch.sample_weight)
            else:
                loss = self._test_loss(batch.x, batch.y, batch.sample_weight)
                if regularization is None:
                    regularization = self.regularization_loss()
                loss = loss + regularization
            loss_mean.update_state(loss, batch.size)
            if batch_hooks:
                callbacks.on_test_batch_end(step, {"loss": loss_mean.result(), **self._metric_results()})
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        self._sum_metrics_over_ranks()
        if not loss_mean.count:
            raise ValueError(f"{what}: the data gave no batch (a generator gives its batches once: give "
                             f"{'validation_steps' if what == 'validation_data' else 'steps'} and enough batches)")
        logs = {"loss": loss_mean.result(), **self._metric_results()}
        callbacks.on_test_end(logs)
        return logs

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 return_dict=False, callbacks=None):
        """Loss (regularization included, as Keras reports it) and metrics over (x, y): arrays, or
        `x` an iterable of batches (as in `fit`); `steps` batches of it (default: one pass). `callbacks` get
        Keras' on_test_* hooks."""
        self._check_compiled()
        data = data_adapter.DataAdapter("evaluate", x, y, sample_weight, batch_size=batch_size, steps=steps,
                                        targets=not self.targets_from_inputs)
        verbose = 1 if verbose == "auto" else int(verbose)
        dist = self._distribute
        cbs = callbacks_module.CallbackList(callbacks or [], self, {"steps": data.steps_per_epoch, "verbose": verbose})
        if dist is not None:
            logs = dist.run(self, self._evaluate, data, "evaluate", verbose if dist.is_main else 0, cbs)
        else:
            logs = self._evaluate(data, "evaluate", verbose, cbs)
        return self._result(logs, return_dict)

    def predict(self, x, batch_size=None, verbose=0, steps=None, callbacks=None):
        """Outputs for x (arrays, or an iterable of batches as in `fit`, targets ignored), computed
        in batches in inference mode; `steps` batches (default: one pass). `callbacks` get Keras' on_predict_*
        hooks (on_predict_batch_end's logs: {"outputs": the batch's outputs})."""
        if self._one_batch(x, batch_size, verbose, steps, callbacks):  # no adapter, no progress bar
            return self.predict_on_batch(x)
        data = data_adapter.DataAdapter("predict", x, batch_size=batch_size, steps=steps, targets=False)
        dist = self._distribute
        cbs = callbacks_module.CallbackList(callbacks or [], self, {"steps": data.steps_per_epoch,
                                                                    "verbose": int(verbose)})
        if dist is not None:
            return dist.run(self, self._predict, data, int(verbose) if dist.is_main else 0, cbs)
        return self._predict(data, int(verbose), cbs)

    def _one_batch(self, x, batch_size, verbose, steps, callbacks):
        """Whether predict's data is one array of at most one batch with nothing to report: the batch goes
        straight to predict_on_batch (the adapter would hand it over unchanged)."""
        limit = 32 if batch_size is None else batch_size if type(batch_size) is int else 0  # else the adapter says why
        return (type(x) is np.ndarray and x.ndim >= 1 and 0 < len(x) <= limit and steps is None
                and not callbacks and not verbose and self._distribute is None and not self._multi_input)

    def _predict(self, data, verbose, callbacks):
        bar = _progress(data.steps_per_epoch, "Predict", verbose == 1)
        outs = []
        callbacks.on_predict_begin()
        for step, batch in enumerate(data.epoch()):
            callbacks.on_predict_batch_begin(step)
            outs.append(self.predict_on_batch(batch.x))
            callbacks.on_predict_batch_end(step, {"outputs": outs[-1]})
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        callbacks.on_predict_end()
        if not outs:
            raise ValueError("predict: the data gave no batch")
        if self._multi_output:
            return [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]
        return np.concatenate(outs)


@functools.lru_cache(maxsize=None)
def _takes_one_argument(method):
    """Whether `method` is Keras' ``train_step(self, data)`` (one argument besides self); looked up once."""
    import inspect
    parameters = list(inspect.signature(method).parameters.values())[1:]
    return len(parameters) == 1 and parameters[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                           inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _loss_mask(mask, pred):
    """An output mask as the losses and metrics take it: None when it does not index the prediction
    (e.g. a sequence mask after the time axis was pooled away)."""
    return None if mask is None or np.shape(mask) != np.shape(pred)[:np.ndim(mask)] else mask

def _progress(total, desc, enabled, initial=0):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="step", leave=True, dynamic_ncols=True)
