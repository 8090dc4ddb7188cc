"""Models: `Input`, the functional `Model`, `Sequential`, and Keras' training API
(compile / fit / evaluate / predict, summary, save / load).

A model records every layer call made on symbolic tensors as a node. Running it walks the nodes
in order; its backward walks them in reverse, restoring each call's forward cache first, so a
layer called twice (shared weights) still gets each call's gradient.

Tensor arguments of a call are its `inputs` (one tensor or a list), then tensors among the extra
positional arguments, then tensors among the keyword arguments (e.g. ``initial_state=[h, c]``),
in that order. A layer's ``backward`` returns the gradients in that same order (None for those
it has none for, e.g. masks or token ids).
"""
import inspect

import numpy as np

from . import backend, callbacks as callbacks_module, losses as losses_module
from . import metrics as metrics_module, optimizers
from .layers.base import Layer, unique_name


# ------------------------------------------------------------------------ symbolic graph
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
        self.input_tensors = _tensors_in(self.call_spec)
        self.outputs = []
        self.multi_output = False
        self.cache = None


def _is_tensor(x):
    return isinstance(x, SymbolicTensor)


def _tensors_in(spec):
    """Every SymbolicTensor in (inputs, args, kwargs), in the documented order."""
    inputs, args, kwargs = spec
    found = []
    for part in [inputs, *args, *kwargs.values()]:
        items = part if isinstance(part, (list, tuple)) else [part]
        found.extend(x for x in items if _is_tensor(x))
    return found


def _substitute(x, values):
    if _is_tensor(x):
        return values[id(x)]
    if isinstance(x, (list, tuple)):
        return type(x)(_substitute(v, values) for v in x)
    return x


def symbolic_call(layer, inputs, args, kwargs):
    """Records `layer(inputs, *args, **kwargs)` on symbolic tensors and returns symbolic outputs."""
    node = Node(layer, inputs, tuple(args), dict(kwargs))
    if not layer.built:
        shapes = [t.shape for t in inputs] if isinstance(inputs, (list, tuple)) else inputs.shape
        layer.build(shapes)
        layer.built = True
    in_shape = [t.shape for t in inputs] if isinstance(inputs, (list, tuple)) else inputs.shape
    # call options that change the outputs (e.g. return_attention_scores) reach compute_output_shape
    # when it names them
    accepted = inspect.signature(layer.compute_output_shape).parameters
    options = {k: v for k, v in kwargs.items() if k in accepted and not _tensors_in(((), (), {k: v}))}
    out_shape = layer.compute_output_shape(in_shape, **options)
    node.multi_output = isinstance(out_shape, list)
    shapes = out_shape if node.multi_output else [out_shape]
    dtype = layer.dtype
    node.outputs = [SymbolicTensor(s, dtype, node, i) for i, s in enumerate(shapes)]
    return list(node.outputs) if node.multi_output else node.outputs[0]


def _structure(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


class NonFiniteError(FloatingPointError):
    """Raised by ``fit(..., check_numerics=True)`` when a value becomes NaN or infinite."""


def _nonfinite_report(value):
    """None if `value` (an array, or None) is finite (or not floating point), else e.g. '2 NaN, 1 inf of 12'."""
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.dtype.kind not in "fc" or np.isfinite(arr).all():
        return None
    n_nan = int(np.isnan(arr).sum())
    return f"{n_nan} NaN, {int(arr.size - n_nan - np.isfinite(arr).sum())} inf of {arr.size} values"


def _check_finite(values, where):
    """Raises NonFiniteError naming `where` (a callable index -> text) for the first non-finite array."""
    for i, v in enumerate(values):
        report = _nonfinite_report(v)
        if report is not None:
            raise NonFiniteError(f"check_numerics: {where(i)} is not finite ({report})")


# ----------------------------------------------------------------------------- models
class Model(Layer):
    """A model from symbolic inputs to outputs (Keras' functional API)::

        inputs = attnx.Input(shape=(32,), dtype="int32")
        x = attnx.layers.Embedding(5000, 32)(inputs)
        outputs = attnx.layers.Dense(1, activation="sigmoid")(attnx.layers.Flatten()(x))
        model = attnx.Model(inputs, outputs)

    Several inputs and outputs are given as lists. A Model is also a Layer: it can be called on
    arrays (``model(x, training=True)``), backpropagated (``model.backward(dy)``) and nested.
    """

    def __init__(self, inputs=None, outputs=None, name=None, **kwargs):
        self._nodes = []
        super().__init__(name=name or unique_name("model"), **kwargs)
        self.optimizer = None
        self.stop_training = False
        self.compiled = False
        if inputs is not None:
            self._init_graph(inputs, outputs)

    # ---------------------------------------------------------------- graph
    def _init_graph(self, inputs, outputs):
        self._multi_input = isinstance(inputs, (list, tuple))
        self._multi_output = isinstance(outputs, (list, tuple))
        self.inputs = _structure(inputs)
        self.outputs = _structure(outputs)
        for t in self.inputs + self.outputs:
            if not _is_tensor(t):
                raise TypeError(f"Model '{self.name}': inputs and outputs must be symbolic tensors "
                                f"(from attnx.Input and layer calls), got {type(t).__name__}")
        for t in self.inputs:
            if t.node is not None:
                raise ValueError(f"Model '{self.name}': inputs must come from attnx.Input")
        self._nodes = self._topological_nodes()
        seen = {}
        for layer in self.layers:
            if layer.name in seen and seen[layer.name] is not layer:
                raise ValueError(f"Model '{self.name}': two layers are named '{layer.name}'; names must be unique")
            seen[layer.name] = layer
        self.built = True

    def _topological_nodes(self):
        order, done, visiting = [], set(), set()
        input_ids = {id(t) for t in self.inputs}

        def visit(tensor):
            if id(tensor) in input_ids:
                return
            node = tensor.node
            if node is None:
                raise ValueError(f"Model '{self.name}': output depends on an input that is not among the "
                                 f"model's inputs ({tensor.name})")
            if id(node) in done:
                return
            if id(node) in visiting:
                raise ValueError(f"Model '{self.name}': the layer graph has a cycle")
            visiting.add(id(node))
            for t in node.input_tensors:
                visit(t)
            visiting.discard(id(node))
            done.add(id(node))
            order.append(node)

        for t in self.outputs:
            visit(t)
        return order

    @property
    def layers(self):
        out, seen = [], set()
        for node in self._nodes:
            if id(node.layer) not in seen:
                seen.add(id(node.layer))
                out.append(node.layer)
        return out

    def get_layer(self, name):
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise ValueError(f"Model '{self.name}': no layer named '{name}'")

    # ------------------------------------------------------- params as a Layer
    @property
    def params(self):
        return {f"{l.name}/{k}": p for l in self.layers for k, p in l.params.items()}

    @params.setter
    def params(self, value):  # Layer.__init__ assigns an empty dict
        pass

    @property
    def grads(self):
        return {f"{l.name}/{k}": g for l in self.layers for k, g in l.grads.items()}

    @grads.setter
    def grads(self, value):
        pass

    @property
    def trainable_params(self):
        if not self.trainable:
            return []
        return [(f"{l.name}/{n}", p, g) for l in self.layers for n, p, g in l.trainable_params]

    def zero_grad(self):
        for layer in self.layers:
            layer.zero_grad()

    def regularization_loss(self):
        return float(sum(layer.regularization_loss() for layer in self.layers))

    def add_regularization_grads(self):
        for layer in self.layers:
            layer.add_regularization_grads()

    def count_params(self):
        return int(sum(l.count_params() for l in self.layers))

    @property
    def _cache(self):
        caches = [node.cache for node in self._nodes]
        return None if all(c is None for c in caches) else caches

    @_cache.setter
    def _cache(self, caches):
        for i, node in enumerate(self._nodes):
            node.cache = None if caches is None else caches[i]

    # --------------------------------------------------------- forward/backward
    def _feed(self, inputs):
        """Model inputs (array, list, or dict by input name) as a list matching self.inputs."""
        if isinstance(inputs, dict):
            missing = [t.name for t in self.inputs if t.name not in inputs]
            if missing:
                raise ValueError(f"Model '{self.name}': missing inputs {missing}")
            return [inputs[t.name] for t in self.inputs]
        xs = _structure(inputs) if self._multi_input else [inputs]
        if len(xs) != len(self.inputs):
            raise ValueError(f"Model '{self.name}': expected {len(self.inputs)} inputs, got {len(xs)}")
        for x, t in zip(xs, self.inputs):
            arr = np.asarray(x)
            if arr.ndim != len(t.shape):
                raise ValueError(f"Model '{self.name}': input '{t.name}' expected rank {len(t.shape)} "
                                 f"(shape {t.shape}), got shape {arr.shape}")
        return xs

    def call(self, inputs, training=False, mask=None):
        self.output_masks = []
        values, masks = {}, {}
        for t, x in zip(self.inputs, self._feed(inputs)):
            values[id(t)] = x
        check = training and self._check_numerics
        if check:
            _check_finite([values[id(t)] for t in self.inputs], lambda i: f"model input '{self.inputs[i].name}'")
        if mask is not None:
            for t, m in zip(self.inputs, _structure(mask) if self._multi_input else [mask]):
                masks[id(t)] = m
        for node in self._nodes:
            inputs_spec, args, kwargs = node.call_spec
            x = _substitute(inputs_spec, values)
            call_args = _substitute(args, values)
            call_kwargs = _substitute(kwargs, values)
            in_mask = None
            if "mask" not in call_kwargs:
                m = [masks.get(id(t)) for t in _structure(inputs_spec)]
                in_mask = (m if isinstance(inputs_spec, (list, tuple)) else m[0]) if any(
                    v is not None for v in m) else None
            layer = node.layer
            out = layer(x, *call_args, training=training, mask=in_mask, **call_kwargs)
            node.cache = layer._cache if training else None
            outs = _structure(out) if node.multi_output else [out]
            if check:
                _check_finite(outs, lambda i: f"output {i} of layer '{layer.name}' ({type(layer).__name__}) "
                                              "in the forward pass")
            out_mask = layer.compute_mask(x, in_mask if in_mask is not None else call_kwargs.get("mask"))
            out_masks = out_mask if isinstance(out_mask, list) else [out_mask] + [None] * (len(outs) - 1)
            for t, o, m in zip(node.outputs, outs, out_masks):
                values[id(t)] = o
                if m is not None:
                    masks[id(t)] = m
        self.output_masks = [masks.get(id(t)) for t in self.outputs]
        result = [values[id(t)] for t in self.outputs]
        return result if self._multi_output else result[0]

    def backward(self, dy, input_gradients=True):
        """Backpropagates output gradients `dy` through the recorded calls; returns the gradients
        of the model inputs (None for each when `input_gradients` is False, which lets layers fed
        only by model inputs skip that work)."""
        if all(node.cache is None for node in self._nodes) and self._nodes:
            raise RuntimeError(f"Model '{self.name}': backward() needs a forward pass with training=True first")
        grads = {}
        dys = _structure(dy) if self._multi_output else [dy]
        if len(dys) != len(self.outputs):
            raise ValueError(f"Model '{self.name}': expected {len(self.outputs)} output gradients, got {len(dys)}")
        for t, g in zip(self.outputs, dys):
            if g is not None:
                grads[id(t)] = np.asarray(g)
        input_ids = {id(t) for t in self.inputs}
        for node in reversed(self._nodes):
            out_grads = [grads.get(id(t)) for t in node.outputs]
            if all(g is None for g in out_grads):
                continue
            layer = node.layer
            layer._cache = node.cache
            layer.input_gradient_needed = input_gradients or not all(id(t) in input_ids for t in node.input_tensors)
            try:
                d_in = layer.backward(out_grads if node.multi_output else out_grads[0])
            finally:
                layer.input_gradient_needed = True
            inputs_spec = node.call_spec[0]
            if isinstance(inputs_spec, (list, tuple)) or len(node.input_tensors) > 1:
                d_in = _structure(d_in)
            else:
                d_in = [d_in]
            if self._check_numerics:
                _check_finite(d_in, lambda i: f"gradient of input {i} of layer '{layer.name}' "
                                              f"({type(layer).__name__}) in the backward pass")
                names = list(layer.grads)
                _check_finite(layer.grads.values(), lambda i: f"gradient of weight '{names[i]}' of layer "
                                                              f"'{layer.name}' ({type(layer).__name__})")
            for t, g in zip(node.input_tensors, d_in):
                if g is None:
                    continue
                grads[id(t)] = g if id(t) not in grads else grads[id(t)] + g
        result = [grads.get(id(t)) for t in self.inputs]
        return result if self._multi_input else result[0]

    def compute_output_shape(self, input_shape):
        shapes = [t.shape for t in self.outputs]
        return shapes if self._multi_output else shapes[0]

    def compute_mask(self, inputs, mask=None):
        masks = getattr(self, "output_masks", None) or [None]
        return masks if self._multi_output else masks[0]

    # --------------------------------------------------------------- training
    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None):
        """Configures training.

        Args:
            optimizer: name ("adam", "sgd", "rmsprop", "adamw") or an optimizer instance.
            loss: name or Loss instance; a list (or dict by output layer name) for several outputs.
            metrics: list of names/instances ("accuracy", "precision", "recall", "f1"), or a list
                of such lists for several outputs.
            loss_weights: weights of each output's loss in the total.
        """
        self.optimizer = optimizers.get(optimizer)
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
                                "metrics": [[m if isinstance(m, str) else m.name for m in ms] for ms in per_output],
                                "loss_weights": self.loss_weights}
        self.compiled = True

    def _num_outputs(self):
        return len(self.outputs)

    def _ensure_graph(self):
        if not self.built:
            raise ValueError(f"Model '{self.name}' has no inputs yet; build it first")

    def _check_compiled(self):
        if not self.compiled:
            raise RuntimeError(f"Model '{self.name}': call compile(optimizer, loss) before training or evaluating")

    def _metric_names(self, prefix=""):
        names = []
        for i, ms in enumerate(self.compiled_metrics):
            tag = "" if len(self.compiled_metrics) == 1 else f"{self.outputs[i].node.layer.name}_"
            names.extend(prefix + tag + m.name for m in ms)
        return names

    def _losses_and_grads(self, ys, preds, sample_weight):
        total, dys = 0.0, []
        masks = getattr(self, "output_masks", None) or [None] * len(preds)
        for lf, w, y, p, m in zip(self.loss_functions, self.loss_weights, ys, preds, masks):
            if m is not None and np.shape(m) != np.shape(p)[:np.ndim(m)]:
                m = None  # an output mask that does not index the prediction (e.g. pooled away)
            value, dy = lf.compute(y, p, sample_weight, mask=m)
            total += w * value
            dys.append(dy * dy.dtype.type(w) if w != 1.0 else dy)
        return total, dys

    def _update_metrics(self, ys, preds, sample_weight):
        masks = getattr(self, "output_masks", None) or [None] * len(preds)
        for ms, y, p, m in zip(self.compiled_metrics, ys, preds, masks):
            if m is not None and np.shape(m) != np.shape(p)[:np.ndim(m)]:
                m = None
            for metric in ms:
                metric.update_state(y, p, sample_weight, mask=m)

    _check_numerics = False  # set while train_on_batch(check_numerics=True) runs

    def train_on_batch(self, x, y, sample_weight=None, check_numerics=False):
        """One optimization step on one batch; returns the batch loss (regularization included).
        `check_numerics`: as in `fit`."""
        self._check_compiled()
        if check_numerics and not self._check_numerics:
            self._check_numerics = True
            try:
                return self.train_on_batch(x, y, sample_weight)
            finally:
                self._check_numerics = False
        ys = _structure(y) if self._multi_output else [y]
        self.zero_grad()
        preds = _structure(self.call(x, training=True)) if self._multi_output else [self.call(x, training=True)]
        loss, dys = self._losses_and_grads(ys, preds, sample_weight)
        loss += self.regularization_loss()
        if self._check_numerics:
            _check_finite([loss], lambda i: "the loss")
            _check_finite(dys, lambda i: f"gradient of the loss for output {i} (layer "
                                         f"'{self.outputs[i].node.layer.name}')")
        self.backward(dys if self._multi_output else dys[0], input_gradients=False)
        self.add_regularization_grads()
        self.optimizer.apply([(p, g) for _, p, g in self.trainable_params])
        if self._check_numerics:
            names = [n for n, _, _ in self.trainable_params]
            _check_finite([p for _, p, _ in self.trainable_params],
                          lambda i: f"weight '{names[i]}' after the optimizer step")
        self._update_metrics(ys, preds, sample_weight)
        return loss

    def _batches(self, n, batch_size, shuffle):
        order = backend.rng().permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, batch_size):
            yield order[start:start + batch_size]

    def fit(self, x=None, y=None, batch_size=32, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, initial_epoch=0, sample_weight=None, check_numerics=False):
        """Trains for `epochs` passes over (x, y), Keras-style; returns a `History`.

        Args:
            x, y: arrays (or lists / dicts of arrays for several inputs / outputs).
            batch_size: samples per step.
            epochs: index of the last epoch (training runs epochs initial_epoch .. epochs - 1).
            verbose: 0 silent, 1 a progress bar per epoch (default), 2 one line per epoch.
            callbacks: e.g. ``[attnx.callbacks.EarlyStopping(patience=2)]``.
            validation_split: fraction of the data, taken from the end before shuffling, held out.
            validation_data: (x_val, y_val) evaluated after each epoch (overrides validation_split).
            shuffle: reshuffle the training samples every epoch (seed with attnx.set_random_seed).
            sample_weight: per-sample loss weights (batch,).
            check_numerics: stop with `attnx.models.NonFiniteError` (a FloatingPointError) as soon as
                a value becomes NaN or infinite, naming where: a model input, the output of the
                first layer that produced one in the forward pass, the loss or its gradient, the
                gradient a layer's backward pass produced for an input or a weight (the first
                such layer going backwards), or a weight after the optimizer step. Off by default
                (it scans every activation and gradient, which costs time).
        """
        self._check_compiled()
        if int(batch_size) <= 0:
            raise ValueError(f"fit: batch_size must be positive, got {batch_size}")
        xs, ys = self._as_data(x, "x"), self._as_data(y, "y", outputs=True)
        n = self._num_samples(xs, ys)
        sw = None if sample_weight is None else np.asarray(sample_weight)
        if validation_data is None and validation_split:
            if not 0.0 < validation_split < 1.0:
                raise ValueError(f"fit: validation_split must be in (0, 1), got {validation_split}")
            cut = int(n * (1.0 - validation_split))
            if cut == 0 or cut == n:
                raise ValueError(f"fit: validation_split={validation_split} leaves no training or validation data "
                                 f"from {n} samples")
            tail = slice(cut, None)
            validation_data = (self._pick(xs, tail, self._multi_input), self._pick(ys, tail, self._multi_output))
            xs, ys = [a[:cut] for a in xs], [a[:cut] for a in ys]
            sw = None if sw is None else sw[:cut]
            n = cut
        verbose = 1 if verbose == "auto" else int(verbose)
        history = callbacks_module.History()
        cbs = callbacks_module.CallbackList(list(callbacks or []) + [history], self,  # History last, as Keras
                                            {"epochs": epochs, "verbose": verbose})
        self.stop_training = False
        cbs.on_train_begin()
        steps = (n + batch_size - 1) // batch_size
        for epoch in range(initial_epoch, epochs):
            cbs.on_epoch_begin(epoch)
            for ms in self.compiled_metrics:
                for m in ms:
                    m.reset_state()
            loss_mean = metrics_module.Mean("loss")
            bar = _progress(steps, f"Epoch {epoch + 1}/{epochs}", verbose == 1)
            import time
            start = time.perf_counter()
            for step, idx in enumerate(self._batches(n, int(batch_size), shuffle)):
                cbs.on_train_batch_begin(step)
                loss = self.train_on_batch(self._pick(xs, idx, self._multi_input), self._pick(ys, idx, self._multi_output),
                                           None if sw is None else sw[idx], check_numerics=check_numerics)
                loss_mean.update_state(loss, len(idx))
                logs = {"loss": loss_mean.result(), **self._metric_results()}
                cbs.on_train_batch_end(step, {**logs, "loss": loss})
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix({k: f"{v:.4f}" for k, v in logs.items()}, refresh=False)
                if self.stop_training:
                    break
            logs = {"loss": loss_mean.result(), **self._metric_results()}
            if validation_data is not None:
                val = self.evaluate(*validation_data[:2], batch_size=batch_size, verbose=0, return_dict=True)
                logs.update({f"val_{k}": v for k, v in val.items()})
            if bar is not None:
                bar.set_postfix({k: f"{v:.4f}" for k, v in logs.items()})
                bar.close()
            elif verbose == 2:
                parts = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
                print(f"Epoch {epoch + 1}/{epochs} - {time.perf_counter() - start:.1f}s - {parts}", flush=True)
            cbs.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        cbs.on_train_end()
        self.history = history
        return history

    def _metric_results(self):
        names = self._metric_names()
        values = [m.result() for ms in self.compiled_metrics for m in ms]
        return dict(zip(names, values))

    def _as_data(self, data, what, outputs=False):
        if data is None:
            raise ValueError(f"Model '{self.name}': {what} is required")
        tensors = self.outputs if outputs else self.inputs
        multi = self._multi_output if outputs else self._multi_input
        if isinstance(data, dict):
            key = (lambda t: t.node.layer.name) if outputs else (lambda t: t.name)
            return [np.asarray(data[key(t)]) for t in tensors]
        items = list(data) if (multi and isinstance(data, (list, tuple))) else [data]
        if len(items) != len(tensors):
            raise ValueError(f"Model '{self.name}': expected {len(tensors)} arrays for {what}, got {len(items)}")
        return [np.asarray(a) for a in items]

    def _num_samples(self, *groups):
        sizes = {a.shape[0] if a.ndim else -1 for g in groups for a in g}
        if len(sizes) != 1:
            raise ValueError(f"Model '{self.name}': inputs and targets have different numbers of samples: "
                             f"{sorted(sizes)}")
        n = sizes.pop()
        if n <= 0:
            raise ValueError(f"Model '{self.name}': no samples (empty batch)")
        return n

    @staticmethod
    def _pick(arrays, idx, multi):
        picked = [a[idx] for a in arrays]
        return picked if multi else picked[0]

    def evaluate(self, x=None, y=None, batch_size=32, verbose="auto", sample_weight=None, return_dict=False):
        """Loss (regularization included, as Keras reports it) and metrics over (x, y)."""
        self._check_compiled()
        xs, ys = self._as_data(x, "x"), self._as_data(y, "y", outputs=True)
        n = self._num_samples(xs, ys)
        for ms in self.compiled_metrics:
            for m in ms:
                m.reset_state()
        loss_mean = metrics_module.Mean("loss")
        sw = None if sample_weight is None else np.asarray(sample_weight)
        verbose = 1 if verbose == "auto" else int(verbose)
        bar = _progress((n + batch_size - 1) // batch_size, "Evaluate", verbose == 1)
        for idx in self._batches(n, int(batch_size), False):
            xb, yb = self._pick(xs, idx, self._multi_input), self._pick(ys, idx, self._multi_output)
            preds = self.call(xb, training=False)
            preds = _structure(preds) if self._multi_output else [preds]
            ys_b = _structure(yb) if self._multi_output else [yb]
            swb = None if sw is None else sw[idx]
            loss, _ = self._losses_and_grads(ys_b, preds, swb)
            loss_mean.update_state(loss + self.regularization_loss(), len(idx))
            self._update_metrics(ys_b, preds, swb)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        result = {"loss": loss_mean.result(), **self._metric_results()}
        return result if return_dict else (list(result.values()) if len(result) > 1 else result["loss"])

    def predict(self, x, batch_size=32, verbose=0):
        """Outputs for x, computed in batches (inference mode)."""
        self._ensure_graph_for(x)
        xs = self._as_data(x, "x")
        n = self._num_samples(xs)
        outs = [self.call(self._pick(xs, idx, self._multi_input), training=False)
                for idx in self._batches(n, int(batch_size), False)]
        if self._multi_output:
            return [np.concatenate([o[i] for o in outs]) for i in range(len(self.outputs))]
        return np.concatenate(outs)

    def _ensure_graph_for(self, x):
        self._ensure_graph()

    # ----------------------------------------------------------------- summary
    def summary(self, print_fn=print):
        """Prints each layer with its output shape and parameter count."""
        rows = [("Layer (type)", "Output Shape", "Param #")]
        for t in self.inputs:
            rows.append((f"{t.name} (Input)", str(t.shape), "0"))
        listed = set()
        for node in self._nodes:  # each layer once, as Keras does: a shared layer's weights count once
            if id(node.layer) in listed:
                continue
            listed.add(id(node.layer))
            shapes = [o.shape for o in node.outputs]
            rows.append((f"{node.layer.name} ({type(node.layer).__name__})",
                         str(shapes[0]) if len(shapes) == 1 else str(shapes), str(node.layer.count_params())))
        widths = [max(len(r[i]) for r in rows) + 2 for i in range(3)]
        line = "=" * sum(widths)
        print_fn(f'Model: "{self.name}"')
        print_fn(line)
        for i, r in enumerate(rows):
            print_fn("".join(c.ljust(w) for c, w in zip(r, widths)))
            print_fn(line if i == 0 else "-" * sum(widths))
        trainable = sum(l.count_params() for l in self.layers if l.trainable)
        print_fn(f"Total params: {self.count_params():,}")
        print_fn(f"Trainable params: {trainable:,}")
        print_fn(f"Non-trainable params: {self.count_params() - trainable:,}")

    # ---------------------------------------------------------- save and load
    def save(self, path):
        """Saves config, weights and compile settings to one `.attnx` file, atomically."""
        from .saving import save_model
        save_model(self, path)

    def save_weights(self, path):
        from .saving import save_weights
        save_weights(self, path)

    def load_weights(self, path):
        from .saving import load_weights
        load_weights(self, path)

    def get_config(self):
        from .saving import functional_config
        return functional_config(self)

    @classmethod
    def from_config(cls, config):
        from .saving import functional_from_config
        return functional_from_config(config)


class Sequential(Model):
    """A linear stack of layers::

        model = attnx.Sequential([
            attnx.layers.Dense(64, activation="relu", input_shape=(20,)),
            attnx.layers.Dense(1, activation="sigmoid"),
        ])

    The graph is built from the first layer's `input_shape` (or a leading ``attnx.Input``), or
    else on the first call, fit or predict, from the data.
    """

    def __init__(self, layers=None, name=None, **kwargs):
        super().__init__(name=name or unique_name("sequential"), **kwargs)
        self._stack = []
        self._input_spec = None
        for layer in layers or []:
            self.add(layer)

    def add(self, layer):
        if _is_tensor(layer):
            if self._stack:
                raise ValueError(f"Sequential '{self.name}': an Input must come first")
            self._input_spec = layer
            return
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential '{self.name}': expected a Layer, got {type(layer).__name__}")
        self._stack.append(layer)
        self.built = False
        self._nodes = []
        first = self._stack[0]
        if self._input_spec is not None:
            self._build_graph(self._input_spec)
        elif first.input_shape_arg is not None:
            self._build_graph(Input(first.input_shape_arg, dtype=_input_dtype(first)))

    def _build_graph(self, input_tensor):
        x = input_tensor
        for layer in self._stack:
            x = layer(x)
            if isinstance(x, list):
                raise ValueError(f"Sequential '{self.name}': layer '{layer.name}' has several outputs; "
                                 "use the functional Model")
        self._init_graph(input_tensor, x)

    def build(self, input_shape):
        if not self.built:
            dtype = "int64" if isinstance(self._stack[0], _token_layers()) else "float32"
            self._build_graph(Input(tuple(input_shape[1:]), dtype=dtype))

    def _ensure_data_graph(self, x):
        if self.built:
            return
        if not self._stack:
            raise ValueError(f"Sequential '{self.name}' has no layers")
        arr = np.asarray(x)
        if arr.ndim == 0:
            raise ValueError(f"Sequential '{self.name}': input must have a batch axis, got a scalar")
        self._build_graph(Input(arr.shape[1:], dtype=arr.dtype if arr.dtype.kind in "iu" else "float32"))

    def call(self, inputs, training=False, mask=None):
        self._ensure_data_graph(inputs)
        return super().call(inputs, training=training, mask=mask)

    def _ensure_graph(self):
        if not self.built and not self._stack:
            raise ValueError(f"Sequential '{self.name}' has no layers")

    def _ensure_graph_for(self, x):
        self._ensure_data_graph(x[0] if isinstance(x, (list, tuple)) else x)

    def fit(self, x=None, y=None, *args, **kwargs):
        self._ensure_data_graph(x)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self._ensure_data_graph(x)
        return super().evaluate(x, y, *args, **kwargs)

    def _num_outputs(self):
        return 1

    @property
    def layers(self):
        return list(self._stack)

    def summary(self, print_fn=print):
        if not self.built:
            raise ValueError(f"Sequential '{self.name}' is not built yet: give the first layer an input_shape, "
                             "or call the model on data first")
        super().summary(print_fn)

    def get_config(self):
        from .saving import sequential_config
        return sequential_config(self)

    @classmethod
    def from_config(cls, config):
        from .saving import sequential_from_config
        return sequential_from_config(config)


def _token_layers():
    from .layers.core import Embedding
    return (Embedding,)


def _input_dtype(layer):
    return "int64" if isinstance(layer, _token_layers()) else "float32"


def _progress(total, desc, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="step", leave=True, dynamic_ncols=True)


def load_model(path):
    """Loads a model saved with ``model.save(path)`` (config, weights and compile settings)."""
    from .saving import load_model as _load
    return _load(path)
