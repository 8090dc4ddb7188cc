"""Composition equals the graph, for every public layer: the layer called inside a custom layer's
`call`, inside a model written as a class, and under an `attnx.GradientTape`, gives the outputs and
the parameter and input gradients the same layer gives in a functional model (float64, 1e-9).
Nested `call` layers are trained, counted, saved and loaded; the bad-input cases name the layer."""
import numpy as np
import pytest

import attnx
from attnx import layers, ops as K
from test_layer_contract import CASES, TRAINING_EXEMPT, _twin

F64 = "float64"
TOL = dict(rtol=1e-9, atol=1e-10)


def _split(spec, values):
    """(inputs, args, kwargs) of one call from its spec [(array, how)] and the values to pass."""
    xs = [v for v, (_, how) in zip(values, spec) if how == "x"]
    args = [v for v, (_, how) in zip(values, spec) if how == "arg"]
    kwargs = {how: v for v, (_, how) in zip(values, spec) if how not in ("x", "arg")}
    return (xs if len(xs) > 1 else xs[0]), args, kwargs


class Wrapper(layers.Layer):
    """A custom layer whose `call` calls the wrapped layer (a sublayer) on its list input."""

    def __init__(self, inner, spec, **kwargs):
        super().__init__(**kwargs)
        self.inner, self._spec = inner, spec

    def call(self, values, training=None):
        inputs, args, kwargs = _split(self._spec, values)
        return self.inner(inputs, *args, **kwargs)


class Subclassed(attnx.Model):
    """A model written as a class whose `call` calls the layer."""

    def __init__(self, inner, spec, **kwargs):
        super().__init__(**kwargs)
        self.inner, self._spec = inner, spec

    def call(self, values, training=None):
        inputs, args, kwargs = _split(self._spec, values)
        return self.inner(inputs, *args, **kwargs)


def _functional(layer, spec):
    tensors = [attnx.Input(a.shape[1:], dtype=a.dtype) for a, _ in spec]
    inputs, args, kwargs = _split(spec, tensors)
    return attnx.Model(tensors, layer(inputs, *args, **kwargs))


def _float_positions(spec):
    return [i for i, (a, _) in enumerate(spec) if a.dtype.kind == "f"]


def _reference(layer, spec, feed, dys, training, seed):
    """Outputs, input gradients (None for non-float inputs) and weight gradients in a functional model."""
    model = _functional(layer, spec)
    attnx.set_random_seed(seed)
    layer.zero_grad()
    outs, cache = model.apply(feed, training=training)
    if not training:
        return outs, None, None
    d_inputs = model.backprop(cache, dys if isinstance(outs, list) else dys[0])
    return outs, d_inputs, {n: g.copy() for n, g in layer.grads.items()}


def _through_layer_or_model(kind, layer, spec, feed, dys, training, seed):
    outer = (Wrapper if kind == "layer" else Subclassed)(layer, spec, dtype=F64)
    model = outer if kind == "model" else _wrapped_model(outer, spec)
    attnx.set_random_seed(seed)
    model.zero_grad()
    outs, cache = model.apply(feed, training=training)
    if not training:
        return outs, None, None
    d_inputs = model.backprop(cache, list(dys) if isinstance(outs, (list, tuple)) else dys[0])
    return outs, d_inputs, {n: g.copy() for n, g in layer.grads.items()}


def _wrapped_model(outer, spec):
    tensors = [attnx.Input(a.shape[1:], dtype=a.dtype) for a, _ in spec]
    return attnx.Model(tensors, outer(tensors))


def _through_tape(layer, spec, feed, dys, training, seed):
    attnx.set_random_seed(seed)
    floats = _float_positions(spec)
    with attnx.GradientTape() as tape:
        for i in floats:
            tape.watch(feed[i])
        inputs, args, kwargs = _split(spec, feed)
        outs = layer(inputs, *args, training=training, **kwargs)
        flat = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        target = sum(K.sum(o * dy) for o, dy in zip(flat, dys))
    values = [K.untraced(o) for o in flat]
    if not training:
        return values, None, None
    weights = list(layer.params.values())
    grads = tape.gradient(target, [feed[i] for i in floats] + weights)
    d_inputs = [None] * len(feed)
    for i, g in zip(floats, grads):
        d_inputs[i] = g
    return values, d_inputs, dict(zip(layer.params, grads[len(floats):]))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("kind", ["layer", "model", "tape"])
def test_layer_composed_equals_the_graph(name, kind):
    rng = np.random.default_rng(7)
    B, T = 3, 4
    spec = CASES[name][1](rng, B, T)
    feed = [a for a, _ in spec]
    reference = CASES[name][0]()
    _functional(reference, spec)  # builds it
    for training in ([False] if name in TRAINING_EXEMPT else [False, True]):
        outs = reference.apply(*(_split(spec, feed)[:1]), *_split(spec, feed)[1], training=False,
                               **_split(spec, feed)[2])[0]
        dys = [rng.standard_normal(np.shape(o)) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
        expected = _reference(reference, spec, feed, dys, training, seed=5)
        layer = _twin(reference)
        _functional(layer, spec)
        layer.set_weights(reference.get_weights())
        got = (_through_tape(layer, spec, feed, dys, training, seed=5) if kind == "tape"
               else _through_layer_or_model(kind, layer, spec, feed, dys, training, seed=5))
        for o, e in zip(_as_list(got[0]), _as_list(expected[0])):
            np.testing.assert_allclose(o, e, **TOL, err_msg=f"{name} in a {kind}: outputs")
        if not training:
            continue
        for i in _float_positions(spec):
            g, e = _as_list(got[1])[i], _as_list(expected[1])[i]
            assert (g is None) == (e is None), f"{name} in a {kind}: input {i} has a gradient in one only"
            if e is not None:
                np.testing.assert_allclose(g, e, **TOL, err_msg=f"{name} in a {kind}: gradient of input {i}")
        for pname, e in expected[2].items():
            g = got[2][pname]
            np.testing.assert_allclose(np.zeros_like(e) if g is None else g, e, **TOL,
                                       err_msg=f"{name} in a {kind}: gradient of weight '{pname}'")


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


# ------------------------------------------------------------------ nested call layers
class Inner(layers.Layer):
    def build(self, input_shape):
        self.w = self.add_weight("w", (input_shape[-1], 4), "glorot_uniform")

    def call(self, x):
        return K.tanh(K.dot(x, self.w))


class Outer(layers.Layer):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.inner = Inner()
        self.blocks = [layers.Dense(units), layers.Dense(units, activation="relu")]

    def build(self, input_shape):
        self.scale = self.add_weight("scale", (self.units,), "ones")

    def call(self, x):
        h = self.inner(x)
        return K.mean(self.blocks[1](self.blocks[0](h)) * self.scale, axis=1)


def _outer_model():
    inp = attnx.Input((5, 6))
    return attnx.Model(inp, layers.Dense(1)(Outer(name="outer")(inp)))


def test_nested_call_layers_are_trained_counted_saved_and_loaded(tmp_path):
    rng = np.random.default_rng(0)
    model = _outer_model()
    outer = model.get_layer("outer")
    # inner (6x4) + two Dense (4x3+3, 3x3+3) + scale (3) + the last Dense (3+1)
    assert model.count_params() == 24 + 15 + 12 + 3 + 4
    assert set(outer.params) == {"scale", "inner/w", "blocks/0/kernel", "blocks/0/bias", "blocks/1/kernel",
                                 "blocks/1/bias"}
    x, y = rng.standard_normal((32, 5, 6)).astype("float32"), rng.standard_normal((32, 1)).astype("float32")
    before = {n: p.copy() for n, p in model.params.items()}
    model.compile("adam", "mse")
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    for name, p in model.params.items():
        assert np.abs(p - before[name]).max() > 1e-4, f"{name} was not trained"
    path = str(tmp_path / "nested.attnx")
    model.save(path)
    loaded = attnx.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))


def test_a_frozen_sublayer_is_not_trained():
    rng = np.random.default_rng(1)
    model = _outer_model()
    outer = model.get_layer("outer")
    model.predict(rng.standard_normal((2, 5, 6)).astype("float32"))
    outer.inner.trainable = False
    frozen = outer.inner.params["w"].copy()
    model.compile("sgd", "mse")
    model.fit(rng.standard_normal((8, 5, 6)).astype("float32"), rng.standard_normal((8, 1)).astype("float32"),
              verbose=0)
    np.testing.assert_array_equal(outer.inner.params["w"], frozen)
    assert model.count_params() == 58 and len(model.trainable_variables) == 7


def test_a_builtin_layer_inside_call_trains():
    """The issue's case: a Dense made in __init__ and called in call (was a TypeError in fit)."""
    class Pool(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.proj = layers.Dense(8)

        def call(self, x):
            return K.mean(self.proj(x), 1)

    rng = np.random.default_rng(2)
    model = attnx.Sequential([Pool(input_shape=(5, 4)), layers.Dense(1)])
    model.compile("adam", "mse")
    x, y = rng.standard_normal((64, 5, 4)).astype("float32"), rng.standard_normal((64, 1)).astype("float32")
    history = model.fit(x, y, epochs=5, verbose=0).history["loss"]
    assert history[-1] < history[0]
    assert model.count_params() == 4 * 8 + 8 + 9


# -------------------------------------------------------------------- subclassed models
class Classifier(attnx.Model):
    def __init__(self, vocab, units=8, **kwargs):
        super().__init__(**kwargs)
        self.vocab, self.units = vocab, units
        self.embedding = layers.Embedding(vocab, 6, mask_zero=True)
        self.rnn = layers.GRU(units, return_sequences=True, return_state=True)
        self.pool = layers.AttentionPooling()
        self.out = layers.Dense(1, activation="sigmoid")

    def call(self, ids, training=None):
        mask = ids != 0
        seq, state = self.rnn(self.embedding(ids), mask=mask)
        return self.out(K.concatenate([self.pool(seq, mask=mask), state], axis=-1))


def test_subclassed_model_fits_saves_and_loads(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(1, 20, (256, 6))
    x[:, 4:] *= rng.random((256, 2)) < 0.5  # some padding
    y = (np.sum(x < 8, axis=1) >= 2).astype("float32")
    model = Classifier(20)
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=15, batch_size=32, verbose=0).history
    assert history["accuracy"][-1] > 0.8 and history["loss"][-1] < history["loss"][0]
    assert [type(l).__name__ for l in model.layers] == ["Embedding", "GRU", "AttentionPooling", "Dense"]
    lines = []
    model.summary(print_fn=lines.append)
    assert any("Total params: " + f"{model.count_params():,}" in line for line in lines)
    path = str(tmp_path / "classifier.attnx")
    model.save(path)
    loaded = attnx.load_model(path)
    assert type(loaded) is Classifier and loaded.vocab == 20
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(model.evaluate(x, y, verbose=0), rel=1e-6)


def test_gradient_tape_loop_equals_fit():
    """The Keras custom-training-loop idiom gives the weights `fit` gives (one batch per step, no shuffle)."""
    rng = np.random.default_rng(4)
    x = rng.integers(1, 20, (64, 6))
    y = (np.sum(x < 8, axis=1) >= 2).astype("float32")[:, None]
    attnx.set_random_seed(0)
    fitted = Classifier(20)
    fitted.compile(attnx.optimizers.Adam(0.01), "binary_crossentropy")
    attnx.set_random_seed(0)
    looped = Classifier(20)
    looped.apply(x[:2])
    fitted.apply(x[:2])
    looped.set_weights(fitted.get_weights())
    fitted.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    optimizer = attnx.optimizers.Adam(0.01)
    loss_fn = attnx.losses.BinaryCrossentropy()
    for _ in range(2):
        for start in range(0, 64, 16):
            xb, yb = x[start:start + 16], y[start:start + 16]
            with attnx.GradientTape() as tape:
                loss = loss_fn(yb, looped(xb, training=True))
            grads = tape.gradient(loss, looped.trainable_variables)
            optimizer.apply_gradients(zip(grads, looped.trainable_variables))
    for a, b in zip(looped.get_weights(), fitted.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_training_none_inherits_and_dropout_follows_training():
    """Under a tape, training=None is inference (no dropout, as Keras); training=True draws masks."""
    x = np.ones((4, 10))
    drop = layers.Dropout(0.5, dtype=F64)
    with attnx.GradientTape() as tape:
        tape.watch(x)
        y = drop(x)
        total = K.sum(y)
    np.testing.assert_array_equal(K.untraced(y), x)
    np.testing.assert_array_equal(tape.gradient(total, x), np.ones_like(x))
    with attnx.GradientTape() as tape:
        tape.watch(x)
        y = drop(x, training=True)
        total = K.sum(y)
    assert 0 < np.count_nonzero(K.untraced(y)) < x.size
    np.testing.assert_array_equal(tape.gradient(total, x), K.untraced(y))


# --------------------------------------------------------------------------- bad input
def test_gradient_twice_on_a_non_persistent_tape_is_an_error():
    x = np.ones((2, 3))
    dense = layers.Dense(2)
    with attnx.GradientTape() as tape:
        y = K.sum(dense(x))
    tape.gradient(y, dense.trainable_variables)
    with pytest.raises(RuntimeError, match="persistent"):
        tape.gradient(y, dense.trainable_variables)
    with attnx.GradientTape(persistent=True) as tape:
        y = K.sum(dense(x))
        z = K.sum(K.square(dense(x)))
    g1, g2 = tape.gradient(y, dense.kernel if hasattr(dense, "kernel") else dense.params["kernel"]), \
        tape.gradient(z, dense.params["kernel"])
    assert not np.allclose(g1, g2)


def test_gradient_of_a_value_not_on_the_tape_is_an_error():
    dense = layers.Dense(2)
    x = np.ones((2, 3))
    outside = dense(x)
    with attnx.GradientTape() as tape:
        dense(x)
    with pytest.raises(ValueError, match="not computed on this tape"):
        tape.gradient(outside, dense.trainable_variables)
    with attnx.GradientTape() as tape:
        y = K.sum(dense(x))
        with pytest.raises(RuntimeError, match="after"):
            tape.gradient(y, dense.trainable_variables)


def test_unconnected_sources_get_none():
    a, b = layers.Dense(2), layers.Dense(2)
    x = np.ones((2, 3), "float32")
    b(x)
    with attnx.GradientTape() as tape:
        y = K.sum(a(x))
    grads = tape.gradient(y, a.trainable_variables + b.trainable_variables)
    assert all(g is not None for g in grads[:2]) and grads[2:] == [None, None]


def test_a_sublayer_called_with_another_shape_names_the_layer():
    class Twice(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = Inner(name="inner_twice")

        def call(self, x):  # the second call's inputs are twice as wide as the first's
            return self.inner(x) + self.inner(K.concatenate([x, x], axis=-1))

    outer = Twice(name="twice")
    with pytest.raises(ValueError, match="'inner_twice' was built for inputs of shape .*6.* called on .*12"):
        outer(np.ones((2, 5, 6), "float32"))
    with pytest.raises(ValueError, match="'twice' was built .* called on shape .*7"):
        outer(np.ones((2, 5, 7), "float32"))


def test_a_call_returning_a_non_array_names_the_layer():
    class Bad(layers.Layer):
        def call(self, x):
            return "oops"

    with pytest.raises(TypeError, match="'bad.*returned str"):
        Bad(name="bad")(np.ones((2, 3)))


def test_a_traced_value_in_an_argument_without_gradient_is_an_error():
    attention = layers.AttentionPooling()
    x = np.ones((2, 4, 3))
    with attnx.GradientTape() as tape:
        traced_mask = tape.watch(np.ones((2, 4)))
        with pytest.raises(ValueError, match="attention_pooling.*other than the inputs"):
            attention(x, mask=traced_mask)


def test_dy_of_the_wrong_shape_names_the_layer():
    layer = Inner(name="inner_dy")
    y, cache = layer.apply(np.ones((4, 2)), training=True)
    with pytest.raises(ValueError, match="inner_dy.*shape"):
        layer.backprop(cache, np.ones((2, 4)))
    with pytest.raises(ValueError, match="inner_dy.*shape"):
        layer.backprop(cache, np.ones((5, 4, 4)))


# --------------------------------------------------------- Keras' train_step and registration
class CustomStep(Classifier):
    """Keras' way of customizing fit: train_step(data) with a GradientTape, compute_loss, compute_metrics."""

    def train_step(self, data):
        x, y = data
        with attnx.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss, **self.compute_metrics(x, y, y_pred)}


def test_overridden_train_step_trains_as_the_built_in_one():
    rng = np.random.default_rng(5)
    x = rng.integers(1, 20, (64, 6))
    y = (np.sum(x < 8, axis=1) >= 2).astype("float32")
    models = []
    for cls in (Classifier, CustomStep):
        attnx.set_random_seed(3)
        model = cls(20)
        model.compile(attnx.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
        attnx.set_random_seed(4)
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0).history
        models.append((model, history))
    (builtin, h1), (custom, h2) = models
    np.testing.assert_allclose(h2["loss"], h1["loss"], rtol=1e-5)
    np.testing.assert_allclose(h2["accuracy"], h1["accuracy"])
    for a, b in zip(custom.get_weights(), builtin.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_compute_loss_includes_regularization_on_the_tape():
    class Regularized(attnx.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = layers.Dense(2, kernel_regularizer=attnx.regularizers.L2(0.5), dtype=F64)

        def call(self, x):
            return self.dense(x)

    rng = np.random.default_rng(6)
    model = Regularized(dtype=F64)
    model.compile("sgd", "mse")
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    model(x)
    with attnx.GradientTape() as tape:
        loss = model.compute_loss(y=y, y_pred=model(x))
    grads = dict(zip(["kernel", "bias"], tape.gradient(loss, model.trainable_variables)))
    w, b = model.dense.params["kernel"], model.dense.params["bias"]
    expected = 2 * x.T @ (x @ w + b - y) / y.size + 2 * 0.5 * w
    assert float(loss) == pytest.approx(np.mean((x @ w + b - y) ** 2) + 0.5 * np.sum(w * w))
    np.testing.assert_allclose(grads["kernel"], expected, rtol=1e-10)


@attnx.register_serializable(package="Tests")
def scaled_mse(y_true, y_pred):
    return K.mean(K.square(y_true - y_pred) * 2.0, axis=-1)


def test_registered_functions_and_custom_objects_load(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.integers(1, 20, (16, 6))
    y = rng.random(16).astype("float32")
    model = Classifier(20)
    model.compile("adam", loss=scaled_mse)
    model.fit(x, y, epochs=1, verbose=0)
    path = str(tmp_path / "registered.attnx")
    model.save(path)
    loaded = attnx.load_model(path)
    assert loaded.loss_functions[0].fn is scaled_mse
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))

    def unregistered(y_true, y_pred):
        return K.mean(K.abs(y_true - y_pred), axis=-1)
    model.compile("adam", loss=unregistered)
    model.save(path)
    with pytest.raises(ValueError, match="not registered.*custom_objects"):
        attnx.load_model(path)
    loaded = attnx.load_model(path, custom_objects={"unregistered": unregistered})
    assert loaded.loss_functions[0].fn is unregistered


def test_a_class_whose_constructor_takes_objects_needs_get_config(tmp_path):
    class Holder(attnx.Model):
        def __init__(self, inner, **kwargs):
            super().__init__(**kwargs)
            self.inner = inner

        def call(self, x):
            return self.inner(x)

    model = Holder(layers.Dense(2))
    model(np.ones((1, 3), "float32"))
    with pytest.raises(NotImplementedError, match="inner=Dense.*get_config"):
        model.save(str(tmp_path / "holder.attnx"))


def test_a_layer_reachable_twice_is_one_set_of_weights():
    """An attribute of the model that is also a sublayer of another sublayer: counted, saved and trained once."""
    class Block(layers.Layer):
        def __init__(self, shared, **kwargs):
            super().__init__(**kwargs)
            self.shared = shared

        def call(self, x):
            return self.shared(x)

    class Twice(attnx.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = layers.Dense(3)
            self.block = Block(self.dense)

        def call(self, x):
            return self.block(x) + self.dense(x)

    model = Twice()
    x = np.ones((4, 2), "float32")
    model(x)
    assert model.count_params() == 9 and len(model.trainable_variables) == 2
    model.compile(attnx.optimizers.SGD(0.1), "mse")
    before = model.dense.params["kernel"].copy()
    with attnx.GradientTape() as tape:
        loss = K.mean(K.square(model(x)))
    grads = tape.gradient(loss, model.trainable_variables)
    model.train_on_batch(x, np.zeros((4, 3), "float32"))
    np.testing.assert_allclose(model.dense.params["kernel"], before - 0.1 * grads[0], rtol=1e-6)


def test_load_model_without_compile_needs_no_custom_loss(tmp_path):
    def unregistered_loss(y_true, y_pred):
        return K.mean(K.abs(y_true - y_pred), axis=-1)

    model = Classifier(20)
    model.compile("adam", loss=unregistered_loss, metrics=["accuracy"])
    assert model.metrics_names == ["loss", "accuracy"]
    x = np.ones((4, 6), np.int64)
    model.predict(x)
    path = str(tmp_path / "uncompiled.attnx")
    model.save(path)
    loaded = attnx.load_model(path, compile=False)
    assert not loaded.compiled
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))


def test_masks_travel_with_their_arrays_inside_call_as_in_the_graph():
    """Embedding(mask_zero=True) inside a class model masks the layers after it, as in a functional model."""
    class Masked(attnx.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.embedding = layers.Embedding(20, 4, mask_zero=True, dtype=F64)
            self.rnn = layers.LSTM(5, return_sequences=True, dtype=F64)
            self.pool = layers.AttentionPooling(dtype=F64)

        def call(self, ids):
            return self.pool(self.rnn(self.embedding(ids)))

    rng = np.random.default_rng(8)
    ids = rng.integers(1, 20, (4, 6))
    ids[1, 3:] = 0
    ids[2, 1:] = 0
    model = Masked(dtype=F64)
    model(ids)
    inp = attnx.Input((6,), dtype="int64")
    graph = attnx.Model(inp, model.pool(model.rnn(model.embedding(inp))))
    np.testing.assert_allclose(model.predict(ids), graph.predict(ids), rtol=1e-12)
    unmasked = ids.copy()
    unmasked[unmasked == 0] = 5
    assert not np.allclose(model.predict(ids)[1], model.predict(unmasked)[1])  # the padding is masked
    dy = rng.standard_normal((4, 5))
    results = []
    for m in (model, graph):
        m.zero_grad()
        out, cache = m.apply(ids, training=True)
        m.backprop(cache, dy)
        results.append({n: g.copy() for n, g in model.rnn.grads.items()})
    for name in results[0]:
        np.testing.assert_allclose(results[0][name], results[1][name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_deterministic_call_repeated_on_one_tape_runs_once():
    """The tutorial's W2(values) at every decoder step: the same inference-mode call on the same arrays is
    recorded once, its backward run once on the summed gradients, and the gradients are unchanged."""
    class CountingDense(layers.Dense):
        forwards = backprops = 0

        def forward(self, inputs, training=False):
            CountingDense.forwards += 1
            return super().forward(inputs, training=training)

        def backprop(self, cache, dy):
            CountingDense.backprops += 1
            return super().backprop(cache, dy)

    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 4))
    dense = CountingDense(2, dtype=F64)
    reference = layers.Dense(2, dtype=F64)
    dense(x), reference(x)
    reference.set_weights(dense.get_weights())
    CountingDense.forwards = 0
    with attnx.GradientTape() as tape:
        tape.watch(x)
        total = sum(K.sum(dense(x) * float(k)) for k in range(1, 4))
        again = dense(x, training=True)  # a training call is never reused (dropout would draw again)
        total = total + K.sum(again)
    grads = tape.gradient(total, [x] + dense.trainable_variables)
    assert CountingDense.forwards == 2 and CountingDense.backprops == 2
    with attnx.GradientTape() as tape:
        tape.watch(x)
        expected_total = K.sum(reference(x)) * 7.0  # 1 + 2 + 3, and the training call's 1
    expected = tape.gradient(expected_total, [x] + reference.trainable_variables)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_compile_refuses_a_strategy_that_is_not_one():
    model = attnx.Sequential([layers.Dense(1, input_shape=(2,))])
    with pytest.raises(TypeError, match="distribute.*DataParallel.*mirrored"):
        model.compile("sgd", "mse", distribute="mirrored")
