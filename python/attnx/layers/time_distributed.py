"""TimeDistributed (Keras 3's): one layer applied to every step of a sequence, as one call on the
steps folded into the batch."""
import numpy as np

from ..masking import as_mask
from .base import Layer, get


class TimeDistributed(Layer):
    """Applies `layer` to every step of (batch, T, ...) inputs (one array; integers too, for a wrapped
    Embedding): the wrapped layer is called once on the
    (batch * T, ...) steps, and its outputs unfolded to (batch, T, ...). Its weights are the wrapped
    layer's (the same arrays, under the same names), trained once per call on the sum over the steps.

    A mask (batch, T), checked by the mask rule, passes through to the outputs (Keras); the wrapped layer is
    called without one.
    """

    supports_masking = True

    def __init__(self, layer, **kwargs):
        if not isinstance(layer, Layer):
            raise TypeError(f"TimeDistributed: expects an attnx layer, got {type(layer).__name__}")
        kwargs.setdefault("dtype", layer.dtype_policy.name)
        super().__init__(**kwargs)
        self.layer = layer

    # the weights are the wrapped layer's own dicts, so optimizers, set_weights and saving reach them
    @property
    def params(self):
        return self.layer.params

    @params.setter
    def params(self, value):  # Layer.__init__ assigns an empty dict
        pass

    @property
    def grads(self):
        return self.layer.grads

    @grads.setter
    def grads(self, value):
        pass

    @property
    def _regularizers(self):
        return self.layer._regularizers

    @_regularizers.setter
    def _regularizers(self, value):
        pass

    def _all_regularizers(self):
        return self.layer._all_regularizers()

    @property
    def trainable_params(self):
        return self.layer.trainable_params if self.trainable else []

    def _step_shape(self, input_shape):
        if len(input_shape) < 3:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, ...) of rank >= 3, got shape "
                             f"{tuple(input_shape)}")
        return (None,) + tuple(input_shape[2:])

    def build(self, input_shape):
        if not self.layer.built:  # its weights exist once this layer is built (a model's summary, set_weights)
            step_shape = self._step_shape(input_shape)
            self.layer._build_input_shape = step_shape
            self.layer.build(step_shape)
            self.layer.built = True

    def forward(self, inputs, training=False, mask=None):
        x = np.asarray(inputs)
        if x.dtype.kind not in "fiu":  # integers too: token ids for a wrapped Embedding
            raise TypeError(f"Layer '{self.name}': `inputs` must be a numeric array, got dtype {x.dtype}")
        if x.ndim < 3:
            raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, ...) of rank >= 3, got shape "
                             f"{x.shape}")
        batch, steps = x.shape[:2]
        if batch * steps == 0:
            raise ValueError(f"Layer '{self.name}': inputs of shape {x.shape} have no steps to apply "
                             f"{type(self.layer).__name__} to")
        if mask is not None:  # checked here, passed on by compute_mask
            as_mask(mask, batch, steps, f"Layer '{self.name}': `mask`")
        try:
            outputs, cache = self.layer.apply(x.reshape((batch * steps,) + x.shape[2:]), training=training)
        except (TypeError, ValueError) as exc:  # the wrapped layer's words, under this layer's name
            raise type(exc)(f"Layer '{self.name}' (TimeDistributed, the steps of shape {x.shape}): {exc}") from exc
        outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        unfolded = [np.asarray(o).reshape((batch, steps) + np.shape(o)[1:]) for o in outs]
        result = type(outputs)(unfolded) if isinstance(outputs, (list, tuple)) else unfolded[0]
        if not training:
            return result, None
        return result, (cache, batch, steps, [o.shape for o in outs], x.shape)

    def backprop(self, cache, dy, need_dx=True):
        inner, batch, steps, out_shapes, in_shape = cache
        dys = list(dy) if len(out_shapes) > 1 else [dy]
        folded = [None if d is None else self._grad_input(d, (batch, steps) + s[1:]).reshape(s)
                  for d, s in zip(dys, out_shapes)]
        dx = self.layer.run_backprop(inner, folded if len(out_shapes) > 1 else folded[0], need_dx)
        return None if dx is None else np.asarray(dx).reshape(in_shape)

    def compute_output_shape(self, input_shape):
        inner = self.layer.compute_output_shape(self._step_shape(input_shape))
        if isinstance(inner, list):
            return [tuple(input_shape[:2]) + tuple(s[1:]) for s in inner]
        return tuple(input_shape[:2]) + tuple(inner[1:])

    def get_config(self):
        config = super().get_config()
        config.pop("dtype", None)
        return {**config, "layer": {"class_name": Layer.registry.name_of(type(self.layer)), "config": self.layer.get_config()}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        spec = config.pop("layer")
        return cls(get(spec["class_name"]).from_config(spec["config"]), **config)
