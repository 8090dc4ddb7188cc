"""Models: the functional `Model`, `Sequential`, models written as classes, and Keras' training
API (compile / fit / evaluate / predict, the *_on_batch steps, summary, save / load).

A functional model records every layer call made on symbolic tensors as a node
(`attnx.symbolic`). Running it walks the nodes in order, keeping each call's cache in a list that
is the model's own cache; its backward walks the nodes in reverse, handing each layer the cache of
that very call, so a layer called several times (shared weights) gets each call's gradient and
their sum in its ``grads``. Nothing about a call is stored on the model or its layers: inference in
one thread never disturbs a training step in flight in another.

Training is one loop for every model: `fit` and `evaluate` call `train_step` / `test_step`, which
run `forward`, the compiled losses and `backprop`. A model written as a class (its layers as
attributes, its own `forward` and `backprop`, like `attnx.seq2seq.Seq2Seq`) trains through the same
loop, and may override `train_data` to derive its inputs and targets from a batch.
"""
import functools
import time
import warnings

import numpy as np

from . import callbacks as callbacks_module, data_adapter, losses as losses_module
from . import metrics as metrics_module, ops, optimizers, saving, serialization
from .backend import unique_name
from .layers import base as layers_base
from .layers.base import Layer
from .ops import TracedArray
from .symbolic import Input, SymbolicTensor, is_symbolic, substitute


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
    """A model: from symbolic inputs to outputs (Keras' functional API), or written as a class.

    Functional::

        inputs = attnx.Input(shape=(32,), dtype="int32")
        x = attnx.layers.Embedding(5000, 32)(inputs)
        outputs = attnx.layers.Dense(1, activation="sigmoid")(attnx.layers.Flatten()(x))
        model = attnx.Model(inputs, outputs)

    Several inputs and outputs are given as lists. As a class: subclass `Model`, set the layers as
    attributes in ``__init__`` and implement ``forward`` and ``backprop`` with their ``apply`` and
    ``backprop`` (the layer contract); the class then compiles, fits, saves and loads like any model.
    A Model is also a Layer: it can be called on arrays, backpropagated and nested.
    """

    _multi_input = False
    _multi_output = False
    output_names = ("output_1", "output_2")  # a class model's outputs (with _multi_output), in metric names

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
            if not is_symbolic(t):
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
    def _functional(self):
        return bool(self._nodes)

    @property
    def layers(self):
        """The model's layers, each once: graph order for a functional model, attribute order for a class
        (its sublayers: attributes, and layers in attribute lists, tuples and dicts)."""
        if not self._functional:
            return [layer for _, layer in self._sublayers()]
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
    # A functional model's weights are its layers', named "<layer name>/<weight>"; a model written as a
    # class has its own (add_weight) and its sublayers', named "<attribute path>/<weight>".
    def _named_layers(self):
        if self._functional:
            return [(l.name, l) for l in self.layers]
        return list(self._sublayers())

    def _own_weights(self):
        return self.__dict__.setdefault("_own_params", {}), self.__dict__.setdefault("_own_grads", {})

    @property
    def params(self):
        own = {} if self._functional else self._own_weights()[0]
        return _unique_arrays({**own, **{f"{path}/{k}": p for path, l in self._named_layers()
                                         for k, p in l.params.items()}})

    @params.setter
    def params(self, value):  # Layer.__init__ assigns an empty dict
        pass

    @property
    def grads(self):
        own = {} if self._functional else self._own_weights()[1]
        return _unique_arrays({**own, **{f"{path}/{k}": g for path, l in self._named_layers()
                                         for k, g in l.grads.items()}})

    @grads.setter
    def grads(self, value):
        pass

    @property
    def trainable_params(self):
        if not self.trainable:
            return []
        own = [] if self._functional else [(n, p, self._own_weights()[1][n]) for n, p in self._own_weights()[0].items()]
        entries = own + [(f"{path}/{n}", p, g) for path, l in self._named_layers() for n, p, g in l.trainable_params]
        seen = set()  # a layer reachable twice (an attribute, and inside another sublayer) trains once
        return [e for e in entries if not (id(e[1]) in seen or seen.add(id(e[1])))]

    def _adopt_sublayer_weights(self):
        pass  # a model's params walk its layers at every access

    def _all_regularizers(self):
        own = list(self._regularizers.items())
        return own + [(f"{path}/{n}", r) for path, l in self._named_layers() for n, r in l._all_regularizers()]

    def zero_grad(self):
        for g in self._own_weights()[1].values():
            g.fill(0)
        for layer in self.layers:
            layer.zero_grad()

    def regularization_loss(self):
        params = self._own_weights()[0]
        own = sum(reg(params[n]) for n, reg in self._regularizers.items())
        return float(own + sum(layer.regularization_loss() for layer in self.layers))

    def add_regularization_grads(self):
        params, grads = self._own_weights()
        for n, reg in self._regularizers.items():
            reg.add_gradient(params[n], grads[n])
        for layer in self.layers:
            layer.add_regularization_grads()

    def count_params(self):
        return int(sum(p.size for p in self.params.values()))

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

    def forward(self, inputs, *args, training=False, mask=None, **kwargs):
        if self._functional:
            if args or kwargs:
                raise TypeError(f"Model '{self.name}': a functional model takes its inputs only (got "
                                f"{len(args)} more positional and {sorted(kwargs)} keyword arguments)")
            outputs, _, caches = self._run_graph(inputs, training, mask)
            return outputs, caches
        if getattr(self, "call", None) is None:
            raise NotImplementedError(f"Model '{self.name}' has no graph: build it from attnx.Input tensors, "
                                      "or subclass Model and implement call (or forward and backprop)")
        if not hasattr(self, "_build_inputs"):  # what load_model calls the model on to create its weights
            self._build_inputs = _input_spec([inputs] + list(args))
        return super().forward(inputs, *args, training=training, mask=mask, **kwargs)

    def backprop(self, cache, dy):
        if self._functional:
            return self._backprop_graph(cache, dy, self.input_gradient_needed)
        return super().backprop(cache, dy)

    def _runs_call(self):
        return type(self).forward is Model.forward and not self._functional

    def _infers_shapes_by_calling(self):
        return self._runs_call()

    def _run_graph(self, inputs, training=False, mask=None, check=False):
        """Runs the recorded calls; returns (outputs, output masks (a list), per-call caches or None).
        `check`: raise NonFiniteError on the first non-finite input or layer output."""
        values, masks = {}, {}
        for t, x in zip(self.inputs, self._feed(inputs)):
            values[id(t)] = x
        if check:
            _check_finite([values[id(t)] for t in self.inputs], lambda i: f"model input '{self.inputs[i].name}'")
        if mask is not None:
            for t, m in zip(self.inputs, _structure(mask) if self._multi_input else [mask]):
                masks[id(t)] = m
        caches = [] if training else None
        for node in self._nodes:
            inputs_spec, args, kwargs = node.call_spec
            if node.single_input:
                x, call_args, call_kwargs = values[id(inputs_spec)], (), {}
                in_mask = masks.get(id(inputs_spec))
            else:
                x = substitute(inputs_spec, values)
                call_args = substitute(args, values)
                call_kwargs = substitute(kwargs, values)
                in_mask = call_kwargs.pop("mask", None)  # a mask given to the call wins over the propagated one
                if in_mask is None:
                    m = [masks.get(id(t)) for t in _structure(inputs_spec)]
                    in_mask = (m if isinstance(inputs_spec, (list, tuple)) else m[0]) if any(
                        v is not None for v in m) else None
            layer = node.layer
            if isinstance(layer, Model) and layer._functional:  # a nested model: its masks come with its outputs
                out, out_masks, cache = layer._run_graph(x, training, in_mask, check)
            else:
                out, cache = layer.apply(x, *call_args, training=training, mask=in_mask, **call_kwargs)
                out_mask = layer.compute_mask(x, in_mask)
                out_masks = out_mask if isinstance(out_mask, list) else [out_mask]
            if training:
                caches.append(cache)
            outs = _structure(out) if node.multi_output else [out]
            if check:
                _check_finite(outs, lambda i: f"output {i} of layer '{layer.name}' ({type(layer).__name__}) "
                                              "in the forward pass")
            for t, o, m in zip(node.outputs, outs, out_masks + [None] * (len(outs) - len(out_masks))):
                values[id(t)] = o
                if m is not None:
                    masks[id(t)] = m
        result = [values[id(t)] for t in self.outputs]
        return (result if self._multi_output else result[0]), [masks.get(id(t)) for t in self.outputs], caches

    def _backprop_graph(self, caches, dy, input_gradients=True, check=False):
        """Backpropagates output gradients `dy` through the calls that made `caches`; returns the
        gradients of the model inputs (None for each when `input_gradients` is False, which lets
        layers fed only by model inputs skip that work)."""
        if caches is None:
            raise RuntimeError(f"Model '{self.name}': backward needs a forward pass with training=True first")
        grads = {}
        dys = _structure(dy) if self._multi_output else [dy]
        if len(dys) != len(self.outputs):
            raise ValueError(f"Model '{self.name}': expected {len(self.outputs)} output gradients, got {len(dys)}")
        for t, g in zip(self.outputs, dys):
            if g is not None:
                grads[id(t)] = np.asarray(g)
        input_ids = {id(t) for t in self.inputs}
        for node, cache in zip(reversed(self._nodes), reversed(caches)):
            out_grads = [grads.get(id(t)) for t in node.outputs]
            if all(g is None for g in out_grads):
                continue
            layer = node.layer
            d_out = out_grads if node.multi_output else out_grads[0]
            needed = input_gradients or not all(id(t) in input_ids for t in node.input_tensors)
            if isinstance(layer, Model) and layer._functional:
                d_in = layer._backprop_graph(cache, d_out, needed, check)
            else:
                layer.input_gradient_needed = needed
                try:
                    d_in = layer.backprop(cache, d_out)
                finally:
                    layer.input_gradient_needed = True
            inputs_spec = node.call_spec[0]
            if isinstance(inputs_spec, (list, tuple)) or len(node.input_tensors) > 1:
                d_in = _structure(d_in)
            else:
                d_in = [d_in]
            if check:
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
        if not self._functional:
            return super().compute_output_shape(input_shape)
        shapes = [t.shape for t in self.outputs]
        return shapes if self._multi_output else shapes[0]

    def compute_mask(self, inputs, mask=None):
        """The output masks for `inputs` (a functional model runs to find them; models nest without this)."""
        if not self._functional:
            return None
        masks = self._run_graph(inputs, False, mask)[1]
        return masks if self._multi_output else masks[0]

    # --------------------------------------------------------------- training
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
        self.input_gradient_needed = False
        try:
            self.backprop(cache, dy)
        finally:
            self.input_gradient_needed = True
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
        loss += self.regularization_loss()
        self.add_regularization_grads()
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
        return loss + self.regularization_loss()

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
        params, grads = self.params, self.grads

        def backward(output_grads):
            scale = float(output_grads[0])
            for name, regularizer in self._all_regularizers():
                gradient = np.zeros_like(params[name])
                regularizer.add_gradient(params[name], gradient)
                grads[name] += gradient * gradient.dtype.type(scale)
            return []
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
                                        shuffle=shuffle, class_weight=class_weight,
                                        rng=None if self._distribute is None else self._distribute.shuffle_rng())
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
        try:
            cbs.on_train_begin()
            trained_any = False
            while self._fit_position["epoch"] < epochs and not self.stop_training:
                epoch, first_step = self._fit_position["epoch"], self._fit_position["step"]
                cbs.on_epoch_begin(epoch)
                self._reset_metrics()
                loss_mean = metrics_module.Mean("loss")
                bar = _progress(data.steps_per_epoch, f"Epoch {epoch + 1}/{epochs}", verbose == 1, initial=first_step)
                start = time.perf_counter()
                for step, batch in enumerate(data.epoch(first_step), first_step):
                    cbs.on_train_batch_begin(step)
                    loss = self.train_on_batch(batch.x, batch.y, batch.sample_weight, check_numerics=check_numerics)
                    self._fit_position["step"] = step + 1
                    trained_any = True
                    loss_mean.update_state(loss, batch.size)
                    logs = {"loss": loss_mean.result(), **self._metric_results()}
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
                    logs.update({f"val_{k}": v for k, v in self._evaluate(validation, "validation_data").items()})
                if bar is not None:
                    bar.set_postfix({k: f"{v:.4f}" for k, v in logs.items()})
                    bar.close()
                elif verbose == 2:
                    parts = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
                    print(f"Epoch {epoch + 1}/{epochs} - {time.perf_counter() - start:.1f}s - {parts}", flush=True)
                cbs.on_epoch_end(epoch, logs)
            cbs.on_train_end()
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

    _fit_data = _fit_position = None
    _distribute = None

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

    def _evaluate(self, data, what, verbose=0):
        """Loss and metrics over the batches of one epoch of `data` (a DataAdapter), as a dict."""
        self._reset_metrics()
        loss_mean = metrics_module.Mean("loss")
        bar = _progress(data.steps_per_epoch, "Evaluate", verbose == 1)
        for batch in data.epoch():
            self._build_for(batch.x)
            loss_mean.update_state(self.test_step(batch.x, batch.y, batch.sample_weight), batch.size)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        self._sum_metrics_over_ranks()
        if not loss_mean.count:
            raise ValueError(f"{what}: the data gave no batch (a generator gives its batches once: give "
                             f"{'validation_steps' if what == 'validation_data' else 'steps'} and enough batches)")
        return {"loss": loss_mean.result(), **self._metric_results()}

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 return_dict=False):
        """Loss (regularization included, as Keras reports it) and metrics over (x, y): arrays, or
        `x` an iterable of batches (as in `fit`); `steps` batches of it (default: one pass)."""
        self._check_compiled()
        data = data_adapter.DataAdapter("evaluate", x, y, sample_weight, batch_size=batch_size, steps=steps)
        verbose = 1 if verbose == "auto" else int(verbose)
        dist = self._distribute
        if dist is not None:
            logs = dist.run(self, self._evaluate, data, "evaluate", verbose if dist.is_main else 0)
        else:
            logs = self._evaluate(data, "evaluate", verbose)
        return self._result(logs, return_dict)

    def predict(self, x, batch_size=None, verbose=0, steps=None):
        """Outputs for x (arrays, or an iterable of batches as in `fit`, targets ignored), computed
        in batches in inference mode; `steps` batches (default: one pass)."""
        data = data_adapter.DataAdapter("predict", x, batch_size=batch_size, steps=steps, targets=False)
        dist = self._distribute
        if dist is not None:
            return dist.run(self, self._predict, data, int(verbose) if dist.is_main else 0)
        return self._predict(data, int(verbose))

    def _predict(self, data, verbose):
        bar = _progress(data.steps_per_epoch, "Predict", verbose == 1)
        outs = []
        for batch in data.epoch():
            outs.append(self.predict_on_batch(batch.x))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        if not outs:
            raise ValueError("predict: the data gave no batch")
        if self._multi_output:
            return [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]
        return np.concatenate(outs)

    # ----------------------------------------------------------------- summary
    def summary(self, print_fn=print):
        """Prints each layer with its output shape and parameter count."""
        rows = [("Layer (type)", "Output Shape", "Param #")]
        for t in (self.inputs if self._functional else []):
            rows.append((f"{t.name} (Input)", str(t.shape), "0"))
        listed = set()
        for node in self._nodes:  # each layer once, as Keras does: a shared layer's weights count once
            if id(node.layer) in listed:
                continue
            listed.add(id(node.layer))
            shapes = [o.shape for o in node.outputs]
            rows.append((f"{node.layer.name} ({type(node.layer).__name__})",
                         str(shapes[0]) if len(shapes) == 1 else str(shapes), str(node.layer.count_params())))
        if not self._functional:  # a model written as a class: its layers, shapes unknown until called
            rows += [(f"{l.name} ({type(l).__name__})", "?", str(l.count_params())) for l in self.layers]
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
        """Saves config, weights and compile settings to one `.attnx` file, atomically (under a
        data-parallel strategy, rank 0 writes and the others skip)."""
        if self._writes_files:
            saving.save_model(self, path)

    def save_weights(self, path):
        if self._writes_files:
            saving.save_weights(self, path)

    @property
    def _writes_files(self):
        return self._distribute is None or self._distribute.is_main

    def load_weights(self, path):
        saving.load_weights(self, path)

    def get_config(self):
        """A functional model's layers and every recorded call with its tensor references (a model
        written as a class returns its constructor arguments instead)."""
        if not self._functional:
            return super().get_config()
        input_index = {id(t): i for i, t in enumerate(self.inputs)}
        node_index = {}
        for i, node in enumerate(self._nodes):
            for j, t in enumerate(node.outputs):
                node_index[id(t)] = (i, j)

        def ref(t):
            return {"input": input_index[id(t)]} if id(t) in input_index else dict(
                zip(("node", "output"), node_index[id(t)]))
        nodes = []
        for node in self._nodes:
            inputs, args, kwargs = node.call_spec
            nodes.append({"layer": node.layer.name, "inputs": _encode(inputs, ref),
                          "args": [_encode(a, ref) for a in args],
                          "kwargs": {k: _encode(v, ref) for k, v in kwargs.items()},
                          "multi_output": node.multi_output})
        return {
            "name": self.name,
            "layers": [_layer_entry(l) for l in self.layers],
            "inputs": [{"shape": list(t.shape[1:]), "dtype": t.dtype.name, "name": t.name} for t in self.inputs],
            "multi_input": self._multi_input,
            "nodes": nodes,
            "outputs": [ref(t) for t in self.outputs],
            "multi_output": self._multi_output,
        }

    @classmethod
    def from_config(cls, config):
        if "nodes" not in config:  # a model written as a class
            return super().from_config(config)
        layers = {}
        for entry in config["layers"]:
            layer = _layer_from_entry(entry)
            layers[layer.name] = layer
        tensors = {"input": [Input(tuple(i["shape"]), dtype=i["dtype"], name=i["name"]) for i in config["inputs"]],
                   "node": []}
        for node in config["nodes"]:
            layer = layers[node["layer"]]
            out = layer(_decode(node["inputs"], tensors), *[_decode(a, tensors) for a in node["args"]],
                        **{k: _decode(v, tensors) for k, v in node["kwargs"].items()})
            tensors["node"].append(out if node["multi_output"] else [out])
        inputs = tensors["input"] if config["multi_input"] else tensors["input"][0]
        outputs = [_decode({"tensor": r}, tensors) for r in config["outputs"]]
        return cls(inputs, outputs if config["multi_output"] else outputs[0], name=config["name"])


def _unique_arrays(named):
    """`named` without the entries whose array came earlier under another name (Keras dedupes weights)."""
    seen = set()
    return {n: a for n, a in named.items() if not (id(a) in seen or seen.add(id(a)))}


@functools.lru_cache(maxsize=None)
def _takes_one_argument(method):
    """Whether `method` is Keras' ``train_step(self, data)`` (one argument besides self); looked up once."""
    import inspect
    parameters = list(inspect.signature(method).parameters.values())[1:]
    return len(parameters) == 1 and parameters[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                           inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _input_spec(values):
    """[{shape, dtype}] of the arrays among `values` (None for anything else), batch axis 1."""
    spec = []
    for v in values:
        arr = v.value if isinstance(v, TracedArray) else v
        spec.append({"shape": [1] + list(np.shape(arr))[1:], "dtype": np.asarray(arr).dtype.name}
                    if isinstance(arr, np.ndarray) else None)
    return spec


def _build_from_spec(model, spec):
    """Calls a model written as a class once on zeros of `spec` (`_input_spec`), creating its weights."""
    values = [None if s is None else np.zeros(s["shape"], dtype=s["dtype"]) for s in spec]
    model.apply(values[0], *values[1:], training=False)


def _checked_spec(spec, path):
    """A saved `_input_spec`, every entry checked: None or {shape: small non-negative ints, dtype: a numeric dtype}."""
    if not isinstance(spec, list) or len(spec) > 64:
        raise ValueError(f"{path}: model.build_inputs should be a list of input specs, got {type(spec).__name__}")
    for i, entry in enumerate(spec):
        if entry is None:
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or len(shape) > 8 or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 4096 for d in shape) or \
                np.prod(shape, dtype=np.int64) > 2 ** 24 or entry.get("dtype") not in _SPEC_DTYPES:
            raise ValueError(f"{path}: model.build_inputs[{i}] should be {{shape: up to 8 sizes <= 4096, dtype: one of "
                             f"{sorted(_SPEC_DTYPES)}}}, got {entry!r}")
    return spec


_SPEC_DTYPES = {"float32", "float64", "int32", "int64", "bool", "uint8", "int8", "int16"}


def _layer_entry(layer):
    entry = {"class_name": type(layer).__name__, "config": layer.get_config()}
    if isinstance(layer, Model):
        entry["config"]["name"] = layer.name
    return entry


def _layer_from_entry(entry):
    return layers_base.get(entry["class_name"]).from_config(entry["config"])


def _encode(value, ref):
    if isinstance(value, SymbolicTensor):
        return {"tensor": ref(value)}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, ref) for v in value]}
    saving.check_json(value)  # raises for values a config cannot hold
    return {"value": value}


def _decode(value, tensors):
    if "tensor" in value:
        ref = value["tensor"]
        return tensors["input"][ref["input"]] if "input" in ref else tensors["node"][ref["node"]][ref["output"]]
    if "list" in value:
        return [_decode(v, tensors) for v in value["list"]]
    return value["value"]


class Sequential(Model):
    """A linear stack of layers::

        model = attnx.Sequential([
            attnx.layers.Dense(64, activation="relu", input_shape=(20,)),
            attnx.layers.Dense(1, activation="sigmoid"),
        ])

    The graph is built from the first layer's `input_shape` (or a leading ``attnx.Input``), or
    else from the data of the first call, fit, evaluate, predict or *_on_batch.
    """

    def __init__(self, layers=None, name=None, **kwargs):
        super().__init__(name=name or unique_name("sequential"), **kwargs)
        self._stack = []
        self._input_spec = None
        for layer in layers or []:
            self.add(layer)

    def add(self, layer):
        if is_symbolic(layer):
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
            self._build_graph(Input(tuple(input_shape[1:]), dtype=_input_dtype(self._stack[0])))

    def _build_for(self, x):
        if self.built:
            return
        if not self._stack:
            raise ValueError(f"Sequential '{self.name}' has no layers")
        arr = np.asarray(x[0] if isinstance(x, (list, tuple)) else x)
        if arr.ndim == 0:
            raise ValueError(f"Sequential '{self.name}': input must have a batch axis, got a scalar")
        self._build_graph(Input(arr.shape[1:], dtype=arr.dtype if arr.dtype.kind in "iu" else "float32"))

    def forward(self, inputs, training=False, mask=None):
        self._build_for(inputs)
        return super().forward(inputs, training=training, mask=mask)

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
        config = {"name": self.name, "layers": [_layer_entry(l) for l in self.layers]}
        if self.built:
            t = self.inputs[0]
            config["input"] = {"shape": list(t.shape[1:]), "dtype": t.dtype.name}
        return config

    @classmethod
    def from_config(cls, config):
        model = cls(name=config["name"])
        if "input" in config:
            model.add(Input(tuple(config["input"]["shape"]), dtype=config["input"]["dtype"]))
        for entry in config["layers"]:
            model.add(_layer_from_entry(entry))
        return model


def _input_dtype(layer):
    from .layers.core import Embedding
    return "int64" if isinstance(layer, Embedding) else "float32"


def _loss_mask(mask, pred):
    """An output mask as the losses and metrics take it: None when it does not index the prediction
    (e.g. a sequence mask after the time axis was pooled away)."""
    return None if mask is None or np.shape(mask) != np.shape(pred)[:np.ndim(mask)] else mask


def _progress(total, desc, enabled, initial=0):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="step", leave=True, dynamic_ncols=True)


def load_model(path, custom_objects=None, compile=True):
    """Loads a model saved with ``model.save(path)`` (config, weights, compile settings and optimizer
    state): a functional model, a Sequential, a model class such as `attnx.seq2seq.Seq2Seq`, or a model
    class of yours. `custom_objects` ({name: class or function}) names your layers, models and loss
    functions not registered with `attnx.register_serializable`; ``compile=False`` leaves the model
    uncompiled (the saved optimizer, losses and metrics are not rebuilt), as in Keras."""
    with serialization.custom_object_scope(custom_objects):
        return _load_model(path, compile)


def _load_model(path, compile=True):
    header, weights = saving.read_model(path, compile)
    name = header["model"]["class_name"]
    found = serialization.get_registered_object(name)
    cls = found if isinstance(found, type) else Layer.registry.get(name)
    if cls is None or not issubclass(cls, Model):
        raise ValueError(f"{path}: unknown model class {name!r} (register it with @attnx.register_serializable() "
                         "or give it in custom_objects)")
    try:
        with layers_base.weight_budget(sum(w.nbytes for _, w in weights), path):
            model = cls.from_config(header["model"]["config"])
            build_inputs = header["model"].get("build_inputs")
            if build_inputs is not None:
                _build_from_spec(model, _checked_spec(build_inputs, path))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: the model config does not describe a {cls.__name__} ({exc})") from exc
    saving.assign(model, weights, path)
    compile_config = header.get("compile")
    if compile_config and compile:
        from . import losses, optimizers
        model.compile(optimizer=optimizers.get(compile_config["optimizer"]),
                      loss=[losses.get(l) for l in compile_config["loss"]] if len(compile_config["loss"]) > 1
                      else losses.get(compile_config["loss"][0]),
                      metrics=compile_config["metrics"] if len(compile_config["metrics"]) > 1
                      else compile_config["metrics"][0],
                      loss_weights=compile_config["loss_weights"])
        saving.restore_optimizer_state(model, header, path)
    return model
