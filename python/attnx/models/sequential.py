"""`Sequential`: a linear stack of layers, a functional model built from its first input."""
import numpy as np

from ..backend import unique_name
from ..layers.base import Layer
from ..symbolic import Input, is_symbolic
from .graph import _layer_entry, _layer_from_entry
from .model import Model


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
    from ..layers.core import Embedding
    return "int64" if isinstance(layer, Embedding) else "float32"
