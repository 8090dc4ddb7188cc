"""NaN guard: ``Model.fit(..., check_numerics=True)`` stops at the first non-finite value with a
NonFiniteError naming where it appeared (model input, a layer's output in the forward pass, the
loss, a layer's input or weight gradient in the backward pass, a weight after the update)."""
import numpy as np
import pytest

import attnx
from attnx import layers
from attnx.layers.base import Layer
from attnx.models import NonFiniteError


class GradBlowup(Layer):
    """Identity forward; backward multiplies the gradient by `factor` (inf / nan) from step `after` on."""

    def __init__(self, factor=np.inf, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def forward(self, inputs, training=False):
        x = np.asarray(inputs, dtype=self.dtype)
        return x, (x.shape if training else None)

    def backprop(self, cache, dy):
        return np.asarray(dy) * self.dtype.type(self.factor)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


class WeightGradNaN(Layer):
    """y = x * scale with a parameter whose gradient is NaN (the input gradient stays finite)."""

    def build(self, input_shape):
        self.add_weight("scale", (input_shape[-1],), "ones")

    def forward(self, inputs, training=False):
        x = np.asarray(inputs, dtype=self.dtype)
        return x * self.params["scale"], (x if training else None)

    def backprop(self, cache, dy):
        self.grads["scale"] += np.nan
        return np.asarray(dy) * self.params["scale"]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


def _data(n=16, features=5, seed=0):
    r = np.random.default_rng(seed)
    return r.normal(size=(n, features)).astype(np.float32), r.integers(0, 2, size=(n, 1)).astype(np.float32)


def _mlp(middle=None, optimizer="sgd"):
    inp = attnx.Input((5,), name="features")
    h = layers.Dense(4, activation="tanh", name="hidden")(inp)
    if middle is not None:
        h = middle(h)
    out = layers.Dense(1, activation="sigmoid", name="head")(h)
    model = attnx.Model(inp, out)
    model.compile(optimizer, "binary_crossentropy")
    return model


def test_nonfinite_input_names_the_model_input():
    x, y = _data()
    x[3, 2] = np.nan
    model = _mlp()
    with pytest.raises(NonFiniteError, match=r"model input 'features'.*1 NaN, 0 inf"):
        model.fit(x, y, epochs=1, verbose=0, check_numerics=True)


def test_forward_names_the_first_layer_with_nonfinite_output():
    x, y = _data()
    model = _mlp()
    model.get_layer("head").params["kernel"][0, 0] = np.nan
    with pytest.raises(NonFiniteError) as info:
        model.fit(x, y, epochs=1, verbose=0, check_numerics=True)
    msg = str(info.value)
    assert "layer 'head'" in msg and "forward" in msg and "hidden" not in msg
    assert isinstance(info.value, FloatingPointError)


def test_forward_overflow_in_first_layer():
    x, y = _data()
    x *= np.float32(1e30)
    model = _mlp()
    model.get_layer("hidden").params["kernel"][...] = np.float32(1e30)
    model.get_layer("hidden").activation = "linear"
    with pytest.raises(NonFiniteError, match=r"output 0 of layer 'hidden' \(Dense\) in the forward pass"):
        model.fit(x, y, epochs=1, verbose=0, check_numerics=True)


def test_backward_names_the_layer_whose_input_gradient_blew_up():
    x, y = _data()
    model = _mlp(GradBlowup(np.inf, name="blowup"))
    with pytest.raises(NonFiniteError) as info:
        model.fit(x, y, epochs=1, verbose=0, check_numerics=True)
    msg = str(info.value)
    assert "gradient of input 0 of layer 'blowup' (GradBlowup) in the backward pass" in msg
    assert "inf" in msg


def test_backward_names_the_weight_whose_gradient_is_nan():
    x, y = _data()
    model = _mlp(WeightGradNaN(name="scaler"))
    with pytest.raises(NonFiniteError, match=r"gradient of weight 'scale' of layer 'scaler'"):
        model.fit(x, y, epochs=1, verbose=0, check_numerics=True)


def test_nonfinite_target_names_the_loss():
    x, y = _data()
    model = attnx.Sequential([layers.Dense(1, input_shape=(5,), name="reg")])
    model.compile("sgd", "mse")
    y[0, 0] = np.inf
    with pytest.raises(NonFiniteError, match=r"the loss is not finite"):
        model.fit(x, y, epochs=1, verbose=0, check_numerics=True)


def test_weight_overflow_after_the_optimizer_step():
    x, y = _data()
    model = attnx.Sequential([layers.Dense(1, input_shape=(5,), name="reg")])
    model.compile(attnx.optimizers.SGD(learning_rate=1e38), "mse")
    with pytest.raises(NonFiniteError, match=r"weight 'reg/(kernel|bias)' after the optimizer step"):
        model.fit(x, y * 1e3, epochs=1, verbose=0, check_numerics=True, shuffle=False)


def test_stops_at_the_first_bad_batch_before_updating():
    x, y = _data(n=16)
    x[8:, 0] = np.nan  # second batch of 8
    model = _mlp()
    reference = _mlp()
    reference.set_weights(model.get_weights())
    with pytest.raises(NonFiniteError):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, check_numerics=True)
    reference.train_on_batch(x[:8], y[:8])
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.train_on_batch(x[8:], y[8:])  # the guard belonged to that fit call: no raise now


def test_off_by_default_and_same_results_when_on():
    x, y = _data()
    bad = x.copy()
    bad[0, 0] = np.nan
    model = _mlp()
    history = model.fit(bad, y, epochs=1, verbose=0)  # default: no check, NaN flows on
    assert not np.isfinite(history.history["loss"][0])

    attnx.set_random_seed(7)
    a = _mlp(optimizer="adam")
    attnx.set_random_seed(7)
    b = _mlp(optimizer="adam")
    a.fit(x, y, epochs=2, batch_size=4, verbose=0, shuffle=False)
    b.fit(x, y, epochs=2, batch_size=4, verbose=0, shuffle=False, check_numerics=True)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


def test_train_on_batch_accepts_the_option():
    x, y = _data()
    unchecked = _mlp(GradBlowup(np.nan))
    unchecked.train_on_batch(x, y)  # unchecked: runs and poisons the weights below the layer
    assert np.isnan(unchecked.get_layer("hidden").params["kernel"]).all()
    model = _mlp(GradBlowup(np.nan, name="nanlayer"))
    with pytest.raises(NonFiniteError, match="nanlayer"):
        model.train_on_batch(x, y, check_numerics=True)
    assert np.isfinite(model.get_layer("hidden").params["kernel"]).all()
