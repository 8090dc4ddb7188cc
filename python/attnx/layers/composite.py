"""What the composite layers share (FeedForward, MultiHeadAttention, the transformer layers and
stacks): `_Composite`, a layer made of sublayers whose weights it exposes as its own, the dropout
mask of their residual and attention dropout, and the sum of two gradients of one input."""
from .. import backend, kernels
from .base import Layer


def _add(a, b):
    """a + b of two gradients of one shape, split across the threads (numpy's add runs on one core)"""
    return kernels.residual_add(x=a, sub=b, keep=None)


def _draws_dropout(rate):
    """Whether a dropout of `rate` draws: not at rate 0, nor in a recorded inference call (no randomness)."""
    return rate != 0.0 and backend.training_randomness(True)


def _dropout_stream(generator, rows, rate):
    """A dropout mask's draw from `generator` (an `attnx.random.SeedGenerator`) as its `keep_stream`'s
    (rate, key, first_row), for a kernel that draws the mask as it uses it (rows: the batch's rows), or
    None when it draws nothing (_draws_dropout)."""
    return generator.keep_stream(rows, rate) if _draws_dropout(rate) else None


def _where(layer, arg):
    """The start of an error message about argument `arg` of `layer`."""
    return f"Layer '{layer.name}': `{arg}`"


class _Composite(Layer):
    """A layer made of sublayers whose weights it exposes as its own, "<prefix>/<name>".

    Its backprop passes its `need_dx` on to the sublayers whose input gradient goes nowhere but into
    this layer's own input gradient, so that they skip it when a model does not read it.
    """

    def _add_sublayer(self, prefix, layer, input_shape):
        layer.build(input_shape)
        layer.built = True
        for name in layer.params:
            self.params[f"{prefix}/{name}"] = layer.params[name]
            self.grads[f"{prefix}/{name}"] = layer.grads[name]
        return layer

    def _output_grad(self, dy, shape):
        """The output's gradient; with return_attention_scores, dy may be (doutput, None, ...):
        gradients into the returned weights are only taken by MultiHeadAttention itself."""
        if isinstance(dy, (list, tuple)):
            if any(d is not None for d in dy[1:]):
                raise ValueError(f"Layer '{self.name}': backprop takes no gradient for the returned attention "
                                 "weights; pass (doutput, None)")
            dy = dy[0]
        return self._grad_input(dy, shape)

