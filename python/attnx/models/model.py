"""`Model`: a functional graph or a class of yours, which is also a `Layer` (nestable, callable on arrays)."""
import numpy as np

from .. import quantization, saving
from ..backend import snake_case, unique_name
from ..layers.base import Layer
from ..ops import TracedArray, gradient_buffers, zero_gradients
from . import plan
from .graph import GraphMixin
from .training import TrainingMixin


class Model(TrainingMixin, GraphMixin, Layer):
    """A model: from symbolic inputs to outputs (Keras' functional API), or written as a class.

    Functional::

        inputs = attnx.Input(shape=(32,), dtype="int32")
        x = attnx.layers.Embedding(5000, 32)(inputs)
        outputs = attnx.layers.Dense(1, activation="sigmoid")(attnx.layers.Flatten()(x))
        model = attnx.Model(inputs, outputs)

    Several inputs and outputs are given as lists. As a class (Keras' subclassing): set the layers as
    attributes in ``__init__`` and write ``call(inputs, ...)`` with them and `attnx.ops`, or implement
    ``forward`` and ``backprop`` with their ``apply`` and ``backprop`` (the layer contract); the class then
    compiles, fits, saves and loads like any model. A Model is also a Layer: it can be called on arrays,
    backpropagated and nested.
    """

    _multi_input = False
    _multi_output = False
    output_names = ("output_1", "output_2")  # a class model's outputs (with _multi_output), in metric names

    def __init__(self, inputs=None, outputs=None, name=None, **kwargs):
        self._nodes = []
        # Keras: a subclass is named after its class (MyModel: "my_model")
        default = "model" if type(self).__module__.startswith("attnx.") else snake_case(type(self).__name__)
        super().__init__(name=name or unique_name(default), **kwargs)
        self.optimizer = None
        self.stop_training = False
        self.compiled = False
        if inputs is not None:
            self._init_graph(inputs, outputs)

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
        own = {} if self._functional else gradient_buffers(*self._own_weights())
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
        zero_gradients(self._own_weights()[1].values())
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

    def regularize(self):
        params, grads = self._own_weights()
        own = sum(reg.penalty_and_add_gradient(params[n], grads[n]) for n, reg in self._regularizers.items())
        return float(own + sum(layer.regularize() for layer in self.layers))

    def count_params(self):
        return int(sum(p.size for p in self.params.values()))

    def forward(self, inputs, *args, training=False, mask=None, **kwargs):
        if self._functional:
            if args or kwargs:
                raise TypeError(f"Model '{self.name}': a functional model takes its inputs only (got "
                                f"{len(args)} more positional and {sorted(kwargs)} keyword arguments)")
            if not training and mask is None:  # inference: the compiled plan, one C++ call, if it holds the model
                outputs = plan.run(self, inputs)
                if outputs is not None:
                    return outputs, None
            outputs, _, caches = self._run_graph(inputs, training, mask)
            return outputs, caches
        if getattr(self, "call", None) is None:
            raise NotImplementedError(f"Model '{self.name}' has no graph: build it from attnx.Input tensors, "
                                      "or subclass Model and implement call (or forward and backprop)")
        if not hasattr(self, "_build_inputs"):  # what load_model calls the model on to create its weights
            self._build_inputs = _input_spec([inputs] + list(args))
        return super().forward(inputs, *args, training=training, mask=mask, **kwargs)

    def backprop(self, cache, dy, need_dx=True):
        if self._functional:
            return self._backprop_graph(cache, dy, need_dx)
        return super().backprop(cache, dy, need_dx)

    def _runs_call(self):
        return type(self).forward is Model.forward and not self._functional

    def _infers_shapes_by_calling(self):
        return self._runs_call()

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
        if not self._functional:  # a model written as a class: its layers, their shapes once it was called
            shapes = self._sublayer_output_shapes()
            rows += [(f"{l.name} ({type(l).__name__})", shapes.get(id(l), "?"), str(l.count_params()))
                     for l in self.layers]
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

    def _sublayer_output_shapes(self):
        """{id(sublayer): its first output shape as text, batch axis None} of a model written as a class, from
        one inference call on zeros of its first call's input shapes (`_build_inputs`, what load_model builds
        from); {} before that call. A layer keeps nothing of its calls, so summary calls again."""
        spec = getattr(self, "_build_inputs", None)
        if spec is None:
            return {}
        shapes, sublayers = {}, self.layers

        def recording(layer, forward):
            def run(*args, **kwargs):
                outputs, cache = forward(*args, **kwargs)
                first = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
                shapes.setdefault(id(layer), str((None,) + tuple(np.shape(first))[1:]))
                return outputs, cache
            return run
        for layer in sublayers:
            layer.forward = recording(layer, layer.forward)
        try:
            values = [None if s is None else np.zeros(s["shape"], dtype=s["dtype"]) for s in spec]
            self.apply(values[0], *values[1:], training=False)
        finally:
            for layer in sublayers:
                del layer.forward
        return shapes

    # ---------------------------------------------------------- save and load
    def quantize(self, mode):
        """Quantizes the model's Dense, Embedding and recurrent layers in place for inference (Keras 3's
        name; ``mode="int8"``): see `attnx.quantization`."""
        return quantization.quantize_model(self, mode)

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
        return self._graph_config() if self._functional else super().get_config()

    @classmethod
    def from_config(cls, config):
        if "nodes" not in config:  # a model written as a class
            return super().from_config(config)
        return cls._from_graph_config(config)


def _unique_arrays(named):
    """`named` without the entries whose array came earlier under another name (Keras dedupes weights)."""
    seen = set()
    return {n: a for n, a in named.items() if not (id(a) in seen or seen.add(id(a)))}


def _input_spec(values):
    """[{shape, dtype}] of the arrays among `values` (None for anything else), batch axis 1."""
    spec = []
    for v in values:
        arr = v.value if isinstance(v, TracedArray) else v
        spec.append({"shape": [1] + list(np.shape(arr))[1:], "dtype": np.asarray(arr).dtype.name}
                    if isinstance(arr, np.ndarray) else None)
    return spec
