"""TimeDistributed (Keras 3's): one layer applied to every step of a sequence, as one call on the
steps folded into the batch."""
import numpy as np

from ..masking import as_mask
from .base import Layer, get


class TimeDistributed(Layer):
    """Applies `layer` to every step of (batch, T, ...) inputs: the wrapped layer is called once on the
    (batch * T, ...) steps, and its outputs unfolded to (batch, T, ...). Its weights are the wrapped
    layer's (the same arrays, under the same names), trained once per call on the sum over the steps.

    A mask (batch, T), checked by the mask rule, passes through to the outputs (Keras); the wrapped layer is
    called without one.
    """

    supports_masking = True

    def __init__(self, layer, **kwargs):
        if not isinstance(layer, Layer):
            raise TypeError(f"TimeDistributed: expects an attnx layer, got {type(layer).__name__}")
        kwargs.setdefault("dtype", layer.dtype.name)
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
        if isinstance(input_shape, list):
            return [self._step_shape(s) for s in input_shape]
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
        xs = [np.asarray(x) for x in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
        for x in xs:
            if x.ndim < 3:
                raise ValueError(f"Layer '{self.name}': expects inputs (batch, steps, ...) of rank >= 3, got shape "
                                 f"{x.shape}")
            if x.shape[:2] != xs[0].shape[:2]:
                raise ValueError(f"Layer '{self.name}': inputs must share batch and steps, got shapes "
                                 f"{[x.shape for x in xs]}")
        batch, steps = xs[0].shape[:2]
        if mask is not None and not isinstance(mask, (list, tuple)):  # checked here, passed on by compute_mask
            as_mask(mask, batch, steps, f"Layer '{self.name}': `mask`")
        folded = [x.reshape((batch * steps,) + x.shape[2:]) for x in xs]
        outputs, cache = self.layer.apply(folded if isinstance(inputs, (list, tuple)) else folded[0],
                                          training=training)
        outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        unfolded = [np.asarray(o).reshape((batch, steps) + np.shape(o)[1:]) for o in outs]
        result = type(outputs)(unfolded) if isinstance(outputs, (list, tuple)) else unfolded[0]
        if not training:
            return result, None
        return result, (cache, batch, steps, [o.shape for o in outs], [x.shape for x in xs],
                        isinstance(inputs, (list, tuple)))

    def backprop(self, cache, dy):
        inner, batch, steps, out_shapes, in_shapes, multi_input = cache
        dys = list(dy) if len(out_shapes) > 1 else [dy]
        folded = [None if d is None else self._grad_input(d, (batch, steps) + s[1:]).reshape(s)
                  for d, s in zip(dys, out_shapes)]
        self.layer.input_gradient_needed = self.input_gradient_needed
        try:
            dx = self.layer.backprop(inner, folded if len(out_shapes) > 1 else folded[0])
        finally:
            self.layer.input_gradient_needed = True
        dxs = list(dx) if multi_input else [dx]
        unfolded = [None if d is None else np.asarray(d).reshape(s) for d, s in zip(dxs, in_shapes)]
        return unfolded if multi_input else unfolded[0]

    def compute_output_shape(self, input_shape):
        first = input_shape[0] if isinstance(input_shape, list) else input_shape
        inner = self.layer.compute_output_shape(self._step_shape(input_shape))
        if isinstance(inner, list):
            return [tuple(first[:2]) + tuple(s[1:]) for s in inner]
        return tuple(first[:2]) + tuple(inner[1:])

    def get_config(self):
        config = super().get_config()
        config.pop("dtype", None)
        return {**config, "layer": {"class_name": type(self.layer).__name__, "config": self.layer.get_config()}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        spec = config.pop("layer")
        return cls(get(spec["class_name"]).from_config(spec["config"]), **config)
