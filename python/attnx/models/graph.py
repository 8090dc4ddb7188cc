"""The functional API's execution: a model's recorded layer calls (`attnx.symbolic` nodes) run in order,
forward and backward, with the masks they propagate; and the config that records them."""
import numpy as np

from .. import saving
from ..masking import call_mask, carried_masks, output_masks
from ..layers import base as layers_base
from ..symbolic import Input, SymbolicTensor, is_symbolic, substitute
from .numerics import _check_finite


def _structure(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


class GraphMixin:
    """A `Model` built from symbolic tensors: its nodes, layers, forward and backward passes."""

    def _init_graph(self, inputs, outputs):
        # dict inputs (Keras): fed by their keys; self.inputs lists them in the dict's order
        self._input_keys = [str(k) for k in inputs] if isinstance(inputs, dict) else None
        inputs = list(inputs.values()) if isinstance(inputs, dict) else inputs
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

    @property
    def nodes(self):
        """A functional model's recorded layer calls in the order they run (`attnx.symbolic` nodes: layer,
        call_spec, outputs); [] for a model written as a class. Export and interop walk these."""
        return list(self._nodes)

    @property
    def sublayers(self):  # Layer.sublayers: a model's are its layers
        return self.layers

    def get_layer(self, name):
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise ValueError(f"Model '{self.name}': no layer named '{name}'")


    def _feed(self, inputs):
        """Model inputs (array, list, or dict by the model's input keys, else by input name) as a list matching
        self.inputs."""
        if isinstance(inputs, dict):
            keys = self._input_keys or [t.name for t in self.inputs]
            missing = [k for k in keys if k not in inputs]
            if missing:
                raise ValueError(f"Model '{self.name}': missing inputs {missing} (the dict's keys: {sorted(inputs)})")
            return [inputs[k] for k in keys]
        xs = _structure(inputs) if self._multi_input else [inputs]
        if len(xs) != len(self.inputs):
            raise ValueError(f"Model '{self.name}': expected {len(self.inputs)} inputs, got {len(xs)}")
        for x, t in zip(xs, self.inputs):
            arr = np.asarray(x)
            if arr.ndim != len(t.shape):
                raise ValueError(f"Model '{self.name}': input '{t.name}' expected rank {len(t.shape)} "
                                 f"(shape {t.shape}), got shape {arr.shape}")
        return xs

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
            else:
                x = substitute(inputs_spec, values)
                call_args = substitute(args, values)
                call_kwargs = substitute(kwargs, values)
            given = call_kwargs.pop("mask", None)
            # no tensor carries a mask yet (most models): nothing to look up
            in_mask = call_mask(inputs_spec, lambda t: masks.get(id(t)), given) if masks else given
            layer = node.layer
            if isinstance(layer, GraphMixin) and layer._functional:  # a nested model: its masks come with its outputs
                out, out_masks, cache = layer._run_graph(x, training, in_mask, check)
            else:
                out, cache = layer.apply(x, *call_args, training=training, mask=in_mask, **call_kwargs)
                out_masks = layer.compute_mask(x, in_mask)
            if training:
                caches.append(cache)
            outs = _structure(out) if node.multi_output else [out]
            if check:
                _check_finite(outs, lambda i: f"output {i} of layer '{layer.name}' ({type(layer).__name__}) "
                                              "in the forward pass")
            if out_masks is None:
                values.update(zip(map(id, node.outputs), outs))
                continue
            for (t, m), o in zip(output_masks(node.outputs, out_masks), outs):
                values[id(t)] = o
                if m is not None:
                    masks[id(t)] = m
        result = [values[id(t)] for t in self.outputs]
        return (result if self._multi_output else result[0]), carried_masks(self.outputs, lambda t: masks.get(id(t))), caches

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
            needed = input_gradients or not input_ids.issuperset(map(id, node.input_tensors))
            if isinstance(layer, GraphMixin) and layer._functional:
                d_in = layer._backprop_graph(cache, d_out, needed, check)
            else:
                d_in = layer.run_backprop(cache, d_out, needed)
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

    def _graph_config(self):
        """A functional model's layers and every recorded call with its tensor references."""
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
            "input_keys": self._input_keys,
            "nodes": nodes,
            "outputs": [ref(t) for t in self.outputs],
            "multi_output": self._multi_output,
        }

    @classmethod
    def _from_graph_config(cls, config):
        """The model a `get_config` describes; a config from a file is untrusted: every reference is checked
        (a ValueError naming the entry) before it is followed."""
        layers = {}
        for i, entry in enumerate(_listed(config, "layers")):
            if not isinstance(entry, dict):
                raise ValueError(f"functional model config: layers[{i}] must be an object, got {type(entry).__name__}")
            layer = _layer_from_entry(entry)
            if layer.name in layers:
                raise ValueError(f"functional model config: two layers are named {layer.name!r}")
            layers[layer.name] = layer
        tensors = {"input": [], "node": []}
        for i, spec in enumerate(_listed(config, "inputs")):
            if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list):
                raise ValueError(f"functional model config: inputs[{i}] must be an object with a shape list")
            tensors["input"].append(Input(tuple(spec["shape"]), dtype=spec.get("dtype"), name=spec.get("name")))
        for i, node in enumerate(_listed(config, "nodes")):
            where = f"nodes[{i}]"
            if not isinstance(node, dict) or node.get("layer") not in layers or \
                    not isinstance(node.get("args"), list) or not isinstance(node.get("kwargs"), dict) or \
                    not isinstance(node.get("multi_output"), bool):
                raise ValueError(f"functional model config: {where} must name one of the config's layers and hold "
                                 "args (a list), kwargs (an object) and multi_output (true/false)")
            out = layers[node["layer"]](_decode(node.get("inputs"), tensors, f"{where}.inputs"),
                                        *[_decode(a, tensors, f"{where}.args[{j}]") for j, a in enumerate(node["args"])],
                                        **{k: _decode(v, tensors, f"{where}.kwargs.{k}") for k, v in node["kwargs"].items()})
            tensors["node"].append(out if node["multi_output"] else [out])
        if not isinstance(config.get("multi_input"), bool) or not isinstance(config.get("multi_output"), bool):
            raise ValueError("functional model config: multi_input and multi_output must be true or false")
        if not tensors["input"] or (not config["multi_input"] and len(tensors["input"]) != 1):
            raise ValueError(f"functional model config: {len(tensors['input'])} inputs for a model with "
                             f"multi_input={config['multi_input']}")
        inputs = tensors["input"] if config["multi_input"] else tensors["input"][0]
        keys = config.get("input_keys")
        if keys is not None:
            if not isinstance(keys, list) or len(keys) != len(tensors["input"]) or \
                    not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
                raise ValueError(f"functional model config: input_keys must be {len(tensors['input'])} distinct "
                                 f"strings, one per input, got {keys!r}")
            inputs = dict(zip(keys, tensors["input"]))
        outputs = [_decode({"tensor": r}, tensors, f"outputs[{i}]") for i, r in enumerate(_listed(config, "outputs"))]
        if not outputs or (not config["multi_output"] and len(outputs) != 1):
            raise ValueError(f"functional model config: {len(outputs)} outputs for a model with "
                             f"multi_output={config['multi_output']}")
        return cls(inputs, outputs if config["multi_output"] else outputs[0], name=config["name"])


def _listed(config, key):
    value = config.get(key)
    if not isinstance(value, list):
        raise ValueError(f"functional model config: '{key}' must be a list, got {type(value).__name__}")
    return value


def _layer_entry(layer):
    entry = {"class_name": layers_base.Layer.registry.name_of(type(layer)), "config": layer.get_config()}
    if isinstance(layer, GraphMixin):
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


def _decode(value, tensors, where):
    """A value of `_encode`'s form; tensor references point at an input or at an output of an earlier node."""
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in ("tensor", "list", "value"):
        raise ValueError(f"functional model config: {where} must be one of {{tensor: ...}}, {{list: [...]}}, "
                         f"{{value: ...}}, got {str(value)[:80]}")
    if "tensor" in value:
        ref = value["tensor"]
        if isinstance(ref, dict) and set(ref) == {"input"} and _index(ref["input"], len(tensors["input"])):
            return tensors["input"][ref["input"]]
        if isinstance(ref, dict) and set(ref) == {"node", "output"} and _index(ref["node"], len(tensors["node"])) \
                and _index(ref["output"], len(tensors["node"][ref["node"]])):
            return tensors["node"][ref["node"]][ref["output"]]
        raise ValueError(f"functional model config: {where} refers to {str(ref)[:80]}, which is not an input or an "
                         f"output of an earlier node ({len(tensors['input'])} inputs, {len(tensors['node'])} nodes "
                         "before it)")
    if "list" in value:
        if not isinstance(value["list"], list):
            raise ValueError(f"functional model config: {where}.list must be a list")
        return [_decode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value["list"])]
    return value["value"]


def _index(value, size):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size
