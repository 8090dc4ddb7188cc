"""Layers and losses written Keras' way, with `attnx.ops` and no backward pass: the tutorial's
attention layer equals the built-in AttentionPooling (outputs, gradients, training through `fit`),
shared calls add their gradients, and a loss function trains as the built-in loss it re-implements."""
import numpy as np
import pytest

import attnx
from attnx import layers, losses, ops as K
from attnx.testing import gradcheck

F64 = "float64"


class TutorialAttention(layers.Layer):
    """The Keras sentiment tutorial's attention layer, as the tutorial writes it."""

    def build(self, input_shape):
        # the tutorial's "normal" is Keras 2's name of random_normal, which attnx.initializers calls
        # "random_normal"
        self.W = self.add_weight(name="att_weight", shape=(input_shape[-1], 1), initializer="random_normal")
        self.b = self.add_weight(name="att_bias", shape=(input_shape[1], 1), initializer="zeros")

    def call(self, x):
        et = K.squeeze(K.tanh(K.dot(x, self.W) + self.b), axis=-1)
        at = K.softmax(et)
        at = K.expand_dims(at, axis=-1)
        return K.sum(x * at, axis=1)


def _pair(rng, T=6, d=4):
    """The tutorial layer and AttentionPooling built for (T, d) inputs, holding the same weights."""
    ours, builtin = TutorialAttention(dtype=F64), layers.AttentionPooling(dtype=F64)
    for layer in (ours, builtin):
        layer.build((None, T, d))
        layer.built = True
    builtin.set_weights([rng.standard_normal((d, 1)), rng.standard_normal((T, 1))])
    ours.set_weights(builtin.get_weights())
    return ours, builtin


def test_tutorial_layer_equals_attention_pooling():
    rng = np.random.default_rng(0)
    ours, builtin = _pair(rng)
    assert list(ours.params) == ["att_weight", "att_bias"] and list(builtin.params) == ["kernel", "bias"]
    x = rng.standard_normal((5, 6, 4))
    np.testing.assert_allclose(ours(x), builtin(x), rtol=1e-9, atol=1e-12)  # inference: plain arrays
    y, cache = ours.apply(x, training=True)
    y_ref, cache_ref = builtin.apply(x, training=True)
    np.testing.assert_allclose(y, y_ref, rtol=1e-9, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    dx, dx_ref = ours.backprop(cache, dy), builtin.backprop(cache_ref, dy)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-9, atol=1e-12)
    for name, ref in zip(ours.grads, builtin.grads):
        np.testing.assert_allclose(ours.grads[name], builtin.grads[ref], rtol=1e-9, atol=1e-12, err_msg=name)


def test_tutorial_layer_passes_gradcheck():
    rng = np.random.default_rng(1)
    ours, _ = _pair(rng, T=4, d=3)
    gradcheck(ours, rng.standard_normal((2, 4, 3)))


def _tutorial_model(attention, T=8, vocab=30):
    """The tutorial's model: Embedding, LSTM(return_sequences=True), attention, Dense sigmoid."""
    inp = attnx.Input((T,), dtype="int64")
    h = layers.Embedding(vocab, 8, dtype=F64)(inp)
    h = layers.LSTM(6, return_sequences=True, dtype=F64)(h)
    out = layers.Dense(1, activation="sigmoid", dtype=F64)(attention(h))
    return attnx.Model(inp, out)


def test_tutorial_layer_trains_in_the_tutorials_model_as_attention_pooling_does():
    rng = np.random.default_rng(2)
    x = rng.integers(1, 30, (64, 8))
    y = (np.sum(x < 10, axis=1) > 2).astype(F64)
    ours = _tutorial_model(TutorialAttention(dtype=F64))
    builtin = _tutorial_model(layers.AttentionPooling(dtype=F64))
    builtin.set_weights(ours.get_weights())
    histories = []
    for model in (ours, builtin):
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        attnx.set_random_seed(7)  # the same shuffles
        histories.append(model.fit(x, y, epochs=4, batch_size=16, verbose=0).history["loss"])
    assert histories[0][-1] < histories[0][0]
    np.testing.assert_allclose(histories[0], histories[1], rtol=1e-9)
    for w, w_ref in zip(ours.get_weights(), builtin.get_weights()):
        np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours.predict(x), builtin.predict(x), rtol=1e-9, atol=1e-12)


def test_symbolic_build_uses_call_for_the_output_shape():
    h = attnx.Input((7, 5))
    out = TutorialAttention()(h)
    assert out.shape == (None, 5)


# ------------------------------------------------------------------------- the contract
def test_a_shared_layer_gets_the_sum_of_its_calls_gradients():
    """Two calls of one layer in a model equal two twins holding the same weights (the battery of
    test_layer_contract.py), and two direct calls keep two tapes, backpropagated in any order."""
    rng = np.random.default_rng(3)
    shared = TutorialAttention(dtype=F64)
    a, b = attnx.Input((6, 4)), attnx.Input((6, 4))
    model = attnx.Model([a, b], [shared(a), shared(b)])
    twins = [TutorialAttention(dtype=F64) for _ in range(2)]
    a2, b2 = attnx.Input((6, 4)), attnx.Input((6, 4))
    twin_model = attnx.Model([a2, b2], [twins[0](a2), twins[1](b2)])
    for twin in twins:
        twin.set_weights([rng.standard_normal((4, 1)), rng.standard_normal((6, 1))])
    shared.set_weights(twins[0].get_weights())
    twins[1].set_weights(twins[0].get_weights())
    feed = [rng.standard_normal((3, 6, 4)), rng.standard_normal((3, 6, 4))]
    dys = [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]
    results = []
    for m in (model, twin_model):
        m.zero_grad()
        outs, cache = m.apply(feed, training=True)
        results.append((outs, m.backprop(cache, dys)))
    for got, expected in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    for name in shared.grads:
        np.testing.assert_allclose(shared.grads[name], twins[0].grads[name] + twins[1].grads[name], rtol=1e-12)

    x1, x2 = feed
    shared.zero_grad()
    (y1, c1), (y2, c2) = shared.apply(x1, training=True), shared.apply(x2, training=True)
    d2, d1 = shared.backprop(c2, dys[1]), shared.backprop(c1, dys[0])
    np.testing.assert_allclose(d1, twins[0].backprop(twins[0].apply(x1, training=True)[1], dys[0]), rtol=1e-12)
    np.testing.assert_allclose(d2, twins[1].backprop(twins[1].apply(x2, training=True)[1], dys[1]), rtol=1e-12)


class Gate(layers.Layer):
    """Lists in and out, an integer input, `training` and `mask` arguments, a weight used twice."""

    def build(self, input_shape):
        self.scale = self.add_weight("scale", (input_shape[0][-1],), "random_normal")

    def call(self, inputs, training=False, mask=None):
        x, ids = inputs
        gated = x * K.sigmoid(x * self.scale) * self.scale + ids
        if mask is not None:
            gated = K.where(mask[..., None], gated, 0.0)
        return [gated * (2.0 if training else 1.0), K.mean(gated, axis=1)]


def test_lists_integers_training_and_mask():
    rng = np.random.default_rng(4)
    layer = Gate(dtype=F64)
    x, ids = rng.standard_normal((2, 3, 4)), rng.integers(0, 5, (2, 3, 1))
    mask = np.array([[True, True, False], [True, False, False]])
    inference = layer([x, ids], mask=mask)
    (y, pooled), cache = layer.apply([x, ids], training=True, mask=mask)
    np.testing.assert_allclose(y, 2 * inference[0])
    assert not y[0, 2].any() and not y[1, 1:].any()
    dx, dids = layer.backprop(cache, [rng.standard_normal(y.shape), rng.standard_normal(pooled.shape)])
    assert dids is None and dx.shape == x.shape
    gradcheck(layer, [x, ids], call_kwargs={"mask": mask})


class Residual(layers.Layer):
    """A call-only layer calling another inside its own call (a sublayer as an attribute)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = TutorialAttention(dtype=kwargs.get("dtype", "float32"))

    def build(self, input_shape):
        self.w = self.add_weight("w", (input_shape[-1],), "random_normal")

    def call(self, x, training=False):
        return self.inner(x, training=training) * self.w + K.mean(x, axis=1)


def test_a_call_layer_inside_another_records_on_the_outer_tape():
    rng = np.random.default_rng(5)
    layer = Residual(dtype=F64)
    x = rng.standard_normal((2, 4, 3))
    layer(x)
    layer.inner.set_weights([rng.standard_normal((3, 1)), rng.standard_normal((4, 1))])
    gradcheck(layer, x)  # checks the outer weight and the input
    layer.zero_grad()
    layer.inner.zero_grad()
    y, cache = layer.apply(x, training=True)
    dy = rng.standard_normal(y.shape)
    layer.backprop(cache, dy)
    ref = TutorialAttention(dtype=F64)
    ref(x)  # builds it
    ref.set_weights(layer.inner.get_weights())
    ref.backprop(ref.apply(x, training=True)[1], dy * layer.params["w"])
    for name in ref.grads:
        np.testing.assert_allclose(layer.inner.grads[name], ref.grads[name], rtol=1e-12, atol=1e-14)


def test_a_layer_with_neither_call_nor_forward_says_so():
    class Empty(layers.Layer):
        pass
    with pytest.raises(NotImplementedError, match="define `call`"):
        Empty()(np.ones((2, 3)))


# ------------------------------------------------------------------------- losses
def _mse(y_true, y_pred):
    return K.mean(K.square(y_true - y_pred), axis=-1)


def _bce(y_true, y_pred):
    # Keras' binary cross-entropy on probabilities
    p = K.clip(y_pred, 1e-7, 1 - 1e-7)
    return -K.mean(y_true * K.log(p + 1e-7) + (1 - y_true) * K.log(1 - p + 1e-7), axis=-1)


class BinaryCrossentropyByCall(losses.Loss):
    def call(self, y_true, y_pred):
        return _bce(y_true, y_pred)


@pytest.mark.parametrize("custom,builtin,activation", [
    (lambda y_true, y_pred: _mse(y_true, y_pred), "mse", "linear"),
    (_bce, "binary_crossentropy", "sigmoid"),
    (BinaryCrossentropyByCall(), "binary_crossentropy", "sigmoid"),
])
def test_a_custom_loss_trains_to_the_weights_of_the_builtin_loss(custom, builtin, activation):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 5))
    y = (x[:, :2] @ rng.standard_normal((2, 2)) > 0).astype(F64)
    sample_weight = rng.random(40)
    weights = None
    trained = []
    for loss in (custom, builtin):
        model = attnx.Sequential([layers.Dense(4, activation="tanh", dtype=F64, input_shape=(5,)),
                                  layers.Dense(2, activation=activation, dtype=F64)])
        if weights is None:
            weights = model.get_weights()
        model.set_weights(weights)
        model.compile("adam", loss)
        attnx.set_random_seed(0)
        history = model.fit(x, y, sample_weight=sample_weight, epochs=3, batch_size=8, verbose=0).history["loss"]
        trained.append((history, model.get_weights()))
    np.testing.assert_allclose(trained[0][0], trained[1][0], rtol=1e-9)
    for w, w_ref in zip(trained[0][1], trained[1][1]):
        np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-12)


def test_custom_loss_value_and_gradient_with_weights_and_mask():
    rng = np.random.default_rng(7)
    pred, target = rng.random((6, 3)), (rng.random((6, 3)) > 0.5).astype(F64)
    sample_weight, mask = rng.random(6), rng.random(6) > 0.3
    custom, builtin = losses.get(_bce), losses.get("binary_crossentropy")
    assert custom.name == "_bce" and isinstance(losses.get(lambda t, p: t - p), losses.Loss)
    for extra in ({}, {"sample_weight": sample_weight}, {"sample_weight": sample_weight, "mask": mask}):
        value, grad = custom.compute(target, pred, **extra)
        value_ref, grad_ref = builtin.compute(target, pred, **extra)
        np.testing.assert_allclose(value, value_ref, rtol=1e-9)
        np.testing.assert_allclose(grad, grad_ref, rtol=1e-9, atol=1e-12)
    # labels (B,) for predictions (B, 1), as the built-in losses take them
    np.testing.assert_allclose(losses.get(_mse)(target[:, 0], pred[:, :1]), losses.mse(target[:, 0], pred[:, :1]))


def test_function_metric_is_its_mean_over_samples():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((32, 3)).astype("float32"), rng.standard_normal((32, 1)).astype("float32")

    def mean_abs_error(y_true, y_pred):
        return np.mean(np.abs(y_true - y_pred), axis=-1)
    model = attnx.Sequential([attnx.layers.Dense(1, input_shape=(3,))])
    model.compile("sgd", "mse", metrics=[mean_abs_error])
    logs = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    assert np.isclose(logs["mean_abs_error"], np.mean(np.abs(y - model.predict(x))), rtol=1e-6)


def test_tutorial_normal_initializer_name():
    assert isinstance(attnx.initializers.get("normal"), attnx.initializers.RandomNormal)


# ------------------------------------------------------------------ sublayer tracking (issue 38)
class DeepHolder(attnx.Model):
    """Sublayers at every depth Keras tracks: nested lists, a dict of lists, a tuple of lists, a set,
    and a `_private` attribute."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.nested = [[layers.Dense(units, activation="tanh")], [[layers.Dense(units, activation="tanh")]]]
        self.by_name = {"a": [layers.Dense(units, activation="tanh")]}
        self.pair = ([layers.Dense(units, activation="tanh")], [])
        self.group = {layers.Dense(units, activation="tanh"), layers.Dense(units, activation="tanh")}
        self._head = layers.Dense(1)

    def call(self, x):
        for layer in [self.nested[0][0], self.nested[1][0][0], self.by_name["a"][0], self.pair[0][0],
                      *sorted(self.group, key=lambda l: l._created)]:
            x = layer(x)
        return self._head(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_sublayers_at_any_depth_are_trained_saved_and_loaded(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 4)).astype("float32"), rng.standard_normal((32, 1)).astype("float32")
    model = DeepHolder()
    model.compile("adam", "mse")
    model(x[:2])
    assert len(model.layers) == 7
    assert len(model.trainable_variables) == 14
    before = [w.copy() for w in model.trainable_variables]
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    assert all(not np.array_equal(b, w) for b, w in zip(before, model.trainable_variables))  # every one trained
    path = str(tmp_path / "deep.attnx")
    model.save(path)
    loaded = attnx.load_model(path, custom_objects={"DeepHolder": DeepHolder})
    assert sorted(loaded.params) == sorted(model.params)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_a_call_layer_tracks_sublayers_in_nested_containers():
    class Stack(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._blocks = {"inner": ([layers.Dense(3)], [layers.Dense(2)])}

        def call(self, x):
            return self._blocks["inner"][1][0](self._blocks["inner"][0][0](x))
    layer = Stack()
    layer(np.ones((2, 5), "float32"))
    assert sorted(layer.params) == ["_blocks/inner/0/0/bias", "_blocks/inner/0/0/kernel",
                                    "_blocks/inner/1/0/bias", "_blocks/inner/1/0/kernel"]


def test_a_container_holding_itself_is_walked_once():
    class Loop(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.items = [layers.Dense(2)]
            self.items.append(self.items)

        def call(self, x):
            return self.items[0](x)
    layer = Loop()
    layer(np.ones((1, 3), "float32"))
    assert sorted(layer.params) == ["items/0/bias", "items/0/kernel"]
