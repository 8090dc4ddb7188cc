"""The layer contract, for every public layer: state belongs to a call.

A layer called N times in a functional model (directly, or inside a nested model) must receive the
sum of its N calls' parameter gradients and give each call its own input gradients: exactly what N
unshared twins holding the same weights give. The battery runs every layer of `attnx.layers` that
way over fuzzed shapes, masks and training flags, in float64.

Also here: every model entry point builds a fresh model, inference in one thread never disturbs
training in another, and every masked layer follows the one mask rule (`attnx.masking`).
"""
import threading

import numpy as np
import pytest

import attnx
import keras_layer_cases
from layer_inputs import mask as _mask, sequence as _seq
from attnx import layers

F64 = "float64"


# ----------------------------------------------------------------------------- the cases
# Each case: a factory of the layer (float64, deterministic in training: dropout comes from the
# global generator, reseeded before each forward pass, so twins draw the same masks in the same
# order), and a function (rng, B, T) -> one call's inputs as a list of (array, how it is passed):
# "x" (the call's inputs; several "x" make a list input), "arg" (a positional argument) or a
# keyword name.
def _image(rng, B, T, C=2):
    return rng.standard_normal((B, T, T + 1, C))


def _ids(rng, B, T, vocab=7):
    return rng.integers(0, vocab, (B, T))


CASES = {
    "Dense": (lambda: layers.Dense(3, activation="tanh", dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "Embedding": (lambda: layers.Embedding(7, 3, dtype=F64), lambda r, B, T: [(_ids(r, B, T), "x")]),
    "Activation": (lambda: layers.Activation("sigmoid", dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "Dropout": (lambda: layers.Dropout(0.4, dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "Flatten": (lambda: layers.Flatten(dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "Reshape": (lambda: layers.Reshape((-1, 2), dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "Concatenate": (lambda: layers.Concatenate(dtype=F64),
                    lambda r, B, T: [(_seq(r, B, T), "x"), (_seq(r, B, T, 2), "x")]),
    "Add": (lambda: layers.Add(dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x"), (_seq(r, B, T), "x")]),
    "Multiply": (lambda: layers.Multiply(dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x"), (_seq(r, B, T), "x")]),
    "SpatialDropout1D": (lambda: layers.SpatialDropout1D(0.4, dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "RepeatVector": (lambda: layers.RepeatVector(3, dtype=F64), lambda r, B, T: [(r.standard_normal((B, 4)), "x")]),
    "Masking": (lambda: layers.Masking(dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "GlobalAveragePooling1D": (lambda: layers.GlobalAveragePooling1D(dtype=F64),
                               lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "SimpleRNN": (lambda: layers.SimpleRNN(5, dtype=F64),
                  lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "GRU": (lambda: layers.GRU(5, return_sequences=True, dropout=0.3, recurrent_dropout=0.2, dtype=F64),
            lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "LSTM": (lambda: layers.LSTM(5, return_sequences=True, return_state=True, num_layers=2, dtype=F64),
             lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "Bidirectional": (lambda: layers.Bidirectional(layers.LSTM(4, return_sequences=True, dtype=F64), dtype=F64),
                      lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "SimpleRNNCell": (lambda: layers.SimpleRNNCell(5, dtype=F64), lambda r, B, T: [(r.standard_normal((B, 4)), "x")]),
    "GRUCell": (lambda: layers.GRUCell(5, dtype=F64), lambda r, B, T: [(r.standard_normal((B, 4)), "x")]),
    "LSTMCell": (lambda: layers.LSTMCell(5, dtype=F64), lambda r, B, T: [(r.standard_normal((B, 4)), "x")]),
    "Attention": (lambda: layers.Attention(use_scale=True, dtype=F64),
                  lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "AdditiveAttention": (lambda: layers.AdditiveAttention(dtype=F64),
                          lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "BahdanauAdditiveAttention": (lambda: layers.BahdanauAdditiveAttention(dtype=F64),
                                  lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "LuongAttention": (lambda: layers.LuongAttention(score="general", dtype=F64),
                       lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "LocalAttention": (lambda: layers.LocalAttention(1, dtype=F64),
                       lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "HardAttention": (lambda: layers.HardAttention(dtype=F64),
                      lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "AttentionPooling": (lambda: layers.AttentionPooling(dtype=F64),
                         lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "LayerNormalization": (lambda: layers.LayerNormalization(dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "PositionalEncoding": (lambda: layers.PositionalEncoding(dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "PositionEmbedding": (lambda: layers.PositionEmbedding(8, dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "FeedForward": (lambda: layers.FeedForward(6, dropout=0.2, dtype=F64), lambda r, B, T: [(_seq(r, B, T), "x")]),
    "MultiHeadAttention": (lambda: layers.MultiHeadAttention(2, 3, dropout=0.2, dtype=F64),
                           lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "arg"),
                                            (_mask(r, B, T), "key_padding_mask")]),
    "TransformerEncoderLayer": (lambda: layers.TransformerEncoderLayer(2, 6, dropout=0.1, dtype=F64),
                                lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "padding_mask")]),
    "TransformerDecoderLayer": (lambda: layers.TransformerDecoderLayer(2, 6, dtype=F64),
                                lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x"),
                                                 (_mask(r, B, T), "encoder_padding_mask")]),
    "TransformerEncoder": (lambda: layers.TransformerEncoder(2, 2, 6, dtype=F64),
                           lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "padding_mask")]),
    "TransformerDecoder": (lambda: layers.TransformerDecoder(2, 2, 6, dtype=F64),
                           lambda r, B, T: [(_seq(r, B, 3), "x"), (_seq(r, B, T), "x")]),
    "Conv2D": (lambda: layers.Conv2D(3, (2, 3), strides=(2, 1), padding="same", activation="tanh", dtype=F64),
               lambda r, B, T: [(_image(r, B, T), "x")]),
    "MaxPooling2D": (lambda: layers.MaxPooling2D(2, strides=1, dtype=F64), lambda r, B, T: [(_image(r, B, T), "x")]),
    "AveragePooling2D": (lambda: layers.AveragePooling2D(2, padding="same", dtype=F64),
                         lambda r, B, T: [(_image(r, B, T), "x")]),
    "LSTMN": (lambda: layers.LSTMN(5, return_sequences=True, return_state=True, num_layers=2, dropout=0.2, dtype=F64),
              lambda r, B, T: [(_seq(r, B, T), "x"), (_mask(r, B, T), "mask")]),
    "FilterbankRead": (lambda: layers.FilterbankRead(2, dtype=F64),
                       lambda r, B, T: [(r.random((B, T, T + 1)), "x"), (0.3 * r.standard_normal((B, 5)), "x")]),
    "FilterbankWrite": (lambda: layers.FilterbankWrite(5, 6, dtype=F64),
                        lambda r, B, T: [(r.standard_normal((B, 3, 3)), "x"), (0.3 * r.standard_normal((B, 5)), "x")]),
}
CASES.update(keras_layer_cases.CASES)  # issue 41's layers (tests/keras_layer_cases.py)
# HardAttention trains by REINFORCE: each training call needs its reward (`set_reward(rewards, cache)`)
# before backprop, which a generic model does not give it; its shared-call gradients are checked
# with rewards in test_attention.py. Here: inference only.
TRAINING_EXEMPT = {"HardAttention"}


def test_every_public_layer_has_a_case():
    public = {name for name in layers.__all__ if name != "Layer"}
    assert public == set(CASES), f"layers without a contract case: {sorted(public - set(CASES))}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_backprop_takes_need_dx_and_the_layer_keeps_no_call_state(name):
    """Every public layer's backward takes what it needs as arguments (``backprop(cache, dy, need_dx)``):
    nothing about a call is set on the layer around it (issue 38), and need_dx=False changes no weight
    gradient."""
    import inspect
    cls = type(CASES[name][0]())
    assert "need_dx" in inspect.signature(cls.backprop).parameters, f"{name}.backprop takes no need_dx"
    assert not hasattr(cls, "input_gradient_needed"), f"{name} keeps an input_gradient_needed flag"
    if name in TRAINING_EXEMPT:
        return
    make, spec = CASES[name]
    spec = spec(np.random.default_rng(5), 2, 4)
    layer = make()
    tensors, outs = _symbolic_call(layer, spec)
    model = attnx.Model(tensors, outs)  # every input is a model input: the model passes need_dx=False
    feed = [a for a, _ in spec]
    grads = {}
    for need_dx in (True, False):
        attnx.set_random_seed(12)
        model.zero_grad()
        outputs, cache = model.apply(feed, training=True)
        model.backprop(cache, [np.ones_like(o) for o in _list(outputs)], need_dx=need_dx)
        grads[need_dx] = {n: g.copy() for n, g in layer.grads.items()}
    for n, g in grads[True].items():
        np.testing.assert_allclose(grads[False][n], g, rtol=1e-12, atol=1e-12, err_msg=f"{name} d {n}")


def _list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


# ------------------------------------------------------------------------ the battery
def _symbolic_call(layer, spec):
    """`layer` called on symbolic inputs shaped like `spec` (one call's [(array, how), ...]);
    returns (the call's Input tensors in spec order, its outputs as a list)."""
    tensors = [attnx.Input(a.shape[1:], dtype=a.dtype) for a, _ in spec]
    xs = [t for t, (_, how) in zip(tensors, spec) if how == "x"]
    args = [t for t, (_, how) in zip(tensors, spec) if how == "arg"]
    kwargs = {how: t for t, (_, how) in zip(tensors, spec) if how not in ("x", "arg")}
    out = layer(xs if len(xs) > 1 else xs[0], *args, **kwargs)
    return tensors, out if isinstance(out, list) else [out]


def _twin(layer):
    """A new layer of the same class and config with the same weights."""
    return type(layer).from_config({**layer.get_config(), "name": None})


def _build(name, specs, nested):
    make, _ = CASES[name]
    shared = make()
    inputs, outputs = [], []
    inner = None
    if nested:
        tensors, outs = _symbolic_call(shared, specs[0])
        inner = attnx.Model(tensors, outs)
    for spec in specs:
        if nested:
            tensors = [attnx.Input(a.shape[1:], dtype=a.dtype) for a, _ in spec]
            outs = inner(tensors)
            outs = outs if isinstance(outs, list) else [outs]
        else:
            tensors, outs = _symbolic_call(shared, spec)
        inputs += tensors
        outputs += outs
    shared_model = attnx.Model(inputs, outputs)
    twins, t_inputs, t_outputs = [], [], []
    for spec in specs:
        twin = _twin(shared)
        tensors, outs = _symbolic_call(twin, spec)
        twin.set_weights(shared.get_weights())
        twins.append(twin)
        t_inputs += tensors
        t_outputs += outs
    return shared, shared_model, twins, attnx.Model(t_inputs, t_outputs)


def _run(model, feed, dys, training, seed):
    attnx.set_random_seed(seed)
    model.zero_grad()
    outs, cache = model.apply(feed, training=training)
    if not training:
        return outs, None
    return outs, model.backprop(cache, dys)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("calls,nested", [(2, False), (3, False), (2, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_shared_layer_equals_unshared_twins(name, calls, nested, seed):
    rng = np.random.default_rng(seed * 100 + calls + 10 * nested)
    B, T = int(rng.integers(1, 4)), int(rng.integers(2, 6))
    specs = [CASES[name][1](rng, B, T) for _ in range(calls)]
    shared, model, twins, twin_model = _build(name, specs, nested)
    feed = [a for spec in specs for a, _ in spec]
    training_flags = [False] if name in TRAINING_EXEMPT else [False, True]
    for training in training_flags:
        outs, _ = _run(model, feed, None, False, seed)
        dys = [rng.standard_normal(np.shape(o)) for o in outs]
        outs, d_shared = _run(model, feed, dys, training, seed)
        t_outs, d_twins = _run(twin_model, feed, dys, training, seed)
        for o, t in zip(outs, t_outs):
            np.testing.assert_allclose(o, t, rtol=1e-12, atol=1e-12, err_msg=f"{name}: outputs differ")
        if not training:
            continue
        for i, (g, t) in enumerate(zip(d_shared, d_twins)):
            if g is None or t is None:
                assert g is None and t is None, f"{name}: input {i} has a gradient in one model only"
                continue
            np.testing.assert_allclose(g, t, rtol=1e-9, atol=1e-10, err_msg=f"{name}: gradient of input {i}")
        for pname, g in shared.grads.items():
            expected = sum(twin.grads[pname] for twin in twins)
            np.testing.assert_allclose(g, expected, rtol=1e-9, atol=1e-10,
                                       err_msg=f"{name}: gradient of weight '{pname}' over {calls} calls")


def test_direct_calls_keep_each_call_apart():
    """Outside a model: two training calls through `apply`, backpropagated in either order."""
    rng = np.random.default_rng(3)
    lstm = layers.LSTM(4, return_sequences=True, dtype=F64)
    x1, x2 = rng.standard_normal((2, 5, 3)), rng.standard_normal((3, 4, 3))
    y1, c1 = lstm.apply(x1, training=True)
    y2, c2 = lstm.apply(x2, training=True)
    d1, d2 = rng.standard_normal(y1.shape), rng.standard_normal(y2.shape)
    dx1_first = lstm.backprop(c1, d1)
    dx2 = lstm.backprop(c2, d2)
    lstm.zero_grad()
    dx2_again = lstm.backprop(c2, d2)
    dx1_again = lstm.backprop(c1, d1)
    np.testing.assert_allclose(dx1_first, dx1_again, rtol=1e-12)
    np.testing.assert_allclose(dx2, dx2_again, rtol=1e-12)


# ------------------------------------------------------------------- building on first use
def _fresh_sequential():
    return attnx.Sequential([layers.Dense(4, activation="relu"), layers.Dense(1)])


@pytest.mark.parametrize("entry", ["fit", "evaluate", "predict", "train_on_batch", "test_on_batch",
                                   "predict_on_batch"])
def test_fresh_sequential_builds_on_any_first_entry_point(entry):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3)).astype("float32"), rng.standard_normal((8, 1)).astype("float32")
    model = _fresh_sequential()
    model.compile("sgd", "mse")
    calls = {"fit": lambda: model.fit(x, y, epochs=1, verbose=0), "evaluate": lambda: model.evaluate(x, y, verbose=0),
             "predict": lambda: model.predict(x), "train_on_batch": lambda: model.train_on_batch(x, y),
             "test_on_batch": lambda: model.test_on_batch(x, y), "predict_on_batch": lambda: model.predict_on_batch(x)}
    calls[entry]()
    assert model.built
    assert model.predict(x).shape == (8, 1)
    assert np.isfinite(model.evaluate(x, y, verbose=0))


@pytest.mark.parametrize("entry", ["fit", "evaluate", "predict", "train_on_batch", "test_on_batch",
                                   "predict_on_batch"])
def test_functional_model_accepts_any_first_entry_point(entry):
    rng = np.random.default_rng(1)
    inp = attnx.Input((3,))
    model = attnx.Model(inp, layers.Dense(1)(layers.Dense(4, activation="relu")(inp)))
    model.compile("sgd", "mse")
    x, y = rng.standard_normal((8, 3)).astype("float32"), rng.standard_normal((8, 1)).astype("float32")
    result = {"fit": lambda: model.fit(x, y, epochs=1, verbose=0).history["loss"][0],
              "evaluate": lambda: model.evaluate(x, y, verbose=0), "predict": lambda: model.predict(x),
              "train_on_batch": lambda: model.train_on_batch(x, y), "test_on_batch": lambda: model.test_on_batch(x, y),
              "predict_on_batch": lambda: model.predict_on_batch(x)}[entry]()
    assert np.all(np.isfinite(result))


def test_test_on_batch_equals_evaluate_on_one_batch():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, 3)).astype("float32"), (rng.random((8, 1)) > 0.5).astype("float32")
    model = attnx.Sequential([layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    loss, acc = model.test_on_batch(x, y)
    assert np.allclose([loss, acc], model.evaluate(x, y, batch_size=8, verbose=0))


# ---------------------------------------------------------- inference beside training
def _threaded_models():
    rng_seed = 5

    def dense():
        return attnx.Sequential([layers.Dense(8, activation="tanh", input_shape=(6,)), layers.Dense(1)]), (6,)

    def lstm():
        return attnx.Sequential([layers.LSTM(8, input_shape=(5, 6)), layers.Dense(1)]), (5, 6)

    def bigru():
        return attnx.Sequential([layers.Bidirectional(layers.GRU(6), input_shape=(5, 6)), layers.Dense(1)]), (5, 6)

    def transformer():
        inp = attnx.Input((5, 6))
        h = layers.TransformerEncoderLayer(2, 12)(inp)
        return attnx.Model(inp, layers.Dense(1)(layers.GlobalAveragePooling1D()(h))), (5, 6)
    return rng_seed, {"dense": dense, "lstm": lstm, "bigru": bigru, "transformer": transformer}


@pytest.mark.parametrize("kind", ["dense", "lstm", "bigru", "transformer"])
def test_predicting_thread_does_not_disturb_training(kind):
    seed, makers = _threaded_models()

    def train(with_predictor):
        attnx.set_random_seed(seed)
        model, shape = makers[kind]()
        model.compile("adam", "mse")
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((64,) + shape).astype("float32")
        y = rng.standard_normal((64, 1)).astype("float32")
        stop = threading.Event()
        errors = []

        def predict_loop():
            try:
                while not stop.is_set():
                    model.predict(x[:7])
            except Exception as exc:  # reported below: the predicting thread must not fail either
                errors.append(exc)
        thread = threading.Thread(target=predict_loop)
        if with_predictor:
            thread.start()
        try:
            for _ in range(40):
                for start in range(0, 64, 16):
                    model.train_on_batch(x[start:start + 16], y[start:start + 16])
        finally:
            stop.set()
            if with_predictor:
                thread.join()
        assert not errors, errors
        return model.get_weights()

    quiet, busy = train(False), train(True)
    for a, b in zip(quiet, busy):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------ one mask rule
# Every masked layer, fed the same masks, lengths and bad masks, accepts the same ones and words the
# same errors. (layer factory, call with inputs x (B, T, C) and a mask keyword)
B, T, C = 3, 5, 4
MASKED = {
    "GlobalAveragePooling1D": (lambda: layers.GlobalAveragePooling1D(), lambda l, x, m: l(x, mask=m)),
    "SimpleRNN": (lambda: layers.SimpleRNN(3), lambda l, x, m: l(x, mask=m)),
    "GRU": (lambda: layers.GRU(3), lambda l, x, m: l(x, mask=m)),
    "LSTM": (lambda: layers.LSTM(3), lambda l, x, m: l(x, mask=m)),
    "Bidirectional": (lambda: layers.Bidirectional(layers.LSTM(3)), lambda l, x, m: l(x, mask=m)),
    "LSTMN": (lambda: layers.LSTMN(3), lambda l, x, m: l(x, mask=m)),
    "AttentionPooling": (lambda: layers.AttentionPooling(), lambda l, x, m: l(x, mask=m)),
    "Attention (value mask)": (lambda: layers.Attention(), lambda l, x, m: l([x, x], mask=[None, m])),
    "AdditiveAttention (value mask)": (lambda: layers.AdditiveAttention(), lambda l, x, m: l([x, x], mask=[None, m])),
    "BahdanauAdditiveAttention (value mask)": (lambda: layers.BahdanauAdditiveAttention(),
                                               lambda l, x, m: l([x, x], mask=[None, m])),
    "LuongAttention (value mask)": (lambda: layers.LuongAttention(), lambda l, x, m: l([x, x], mask=[None, m])),
    "MultiHeadAttention (key_padding_mask)": (lambda: layers.MultiHeadAttention(2, 2),
                                              lambda l, x, m: l(x, x, key_padding_mask=m)),
    "TransformerEncoderLayer (padding_mask)": (lambda: layers.TransformerEncoderLayer(2, 8),
                                               lambda l, x, m: l(x, padding_mask=m)),
    "HardAttention (value mask)": (lambda: layers.HardAttention(), lambda l, x, m: l([x, x], mask=[None, m])),
    "LocalAttention (value mask)": (lambda: layers.LocalAttention(1), lambda l, x, m: l([x, x], mask=[None, m])),
    "TransformerEncoder (padding_mask)": (lambda: layers.TransformerEncoder(2, 2, 8),
                                          lambda l, x, m: l(x, padding_mask=m)),
    "TransformerDecoderLayer (decoder_padding_mask)": (lambda: layers.TransformerDecoderLayer(2, 8),
                                                       lambda l, x, m: l([x, x], decoder_padding_mask=m)),
    "TransformerDecoderLayer (encoder_padding_mask)": (lambda: layers.TransformerDecoderLayer(2, 8),
                                                       lambda l, x, m: l([x, x], encoder_padding_mask=m)),
    "TransformerDecoder (encoder_padding_mask)": (lambda: layers.TransformerDecoder(2, 2, 8),
                                                  lambda l, x, m: l([x, x], encoder_padding_mask=m)),
}
MASKED.update(keras_layer_cases.MASKED)  # issue 41's layers (tests/keras_layer_cases.py)


def test_every_masked_layer_is_in_the_mask_table():
    import inspect
    masked = {name for name in layers.__all__ if name != "Layer" and any(
        p == "mask" or p.endswith("padding_mask") for p in inspect.signature(getattr(layers, name).forward).parameters)}
    covered = {key.split(" ")[0] for key in MASKED}
    assert masked <= covered, f"masked layers missing from the mask-rule table: {sorted(masked - covered)}"

@pytest.mark.parametrize("name", sorted(k for k in MASKED if " " not in k))  # the layers masked on one tensor
def test_mask_propagated_through_a_functional_graph_equals_the_mask_given(name):
    """A mask an Embedding(mask_zero=True) makes reaches the next layer of a functional model as if
    the call had been given it (the graph looks a one-tensor call's input and mask up directly)."""
    make, call = MASKED[name]
    ids = np.array([[4, 2, 7, 0, 0], [1, 3, 5, 2, 6], [0, 0, 0, 0, 0]])
    inp = attnx.Input((T,), dtype="int64")
    embedding, layer = layers.Embedding(9, C, mask_zero=True), make()
    model = attnx.Model(inp, layer(embedding(inp)))
    # to float32 noise: model(ids) runs the compiled inference plan (attnx.models.plan) where it holds the model
    np.testing.assert_allclose(model(ids), call(layer, embedding(ids), ids != 0), rtol=1e-5, atol=1e-7, err_msg=name)


GOOD = {
    "bool": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=bool),
    "int 0/1": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.int32),
    "uint8 0/1": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.uint8),
    "lengths": np.array([3, 5, 0]),
}
BAD = {
    "float mask": (np.ones((B, T), dtype=np.float32), TypeError, r"expected a bool mask .*got dtype float32"),
    "int mask with 2": (np.full((B, T), 2), ValueError, r"must hold only 0 and 1"),
    "wrong shape": (np.ones((B, T + 1), dtype=bool), ValueError, r"expected a mask of shape .*got shape \(3, 6\)"),
    "wrong batch": (np.ones((B + 1, T), dtype=bool), ValueError, r"expected a mask of shape .*got shape \(4, 5\)"),
    "lengths too long": (np.array([1, 6, 2]), ValueError, r"expected lengths in \[0, 5\], got 1\.\.6"),
    "negative lengths": (np.array([1, -1, 2]), ValueError, r"expected lengths in \[0, 5\], got -1\.\.2"),
    "lengths of wrong size": (np.array([1, 2]), ValueError, r"expected lengths of shape \(3,\), got shape \(2,\)"),
    "string mask": (np.array([["a"] * T] * B), TypeError, r"expected a bool mask .*got dtype <U1"),
}


@pytest.mark.parametrize("name", sorted(MASKED))
def test_one_mask_rule(name):
    make, call = MASKED[name]
    x = np.random.default_rng(0).standard_normal((B, T, C)).astype("float32")
    layer = make()
    results = {}
    for kind, m in GOOD.items():
        out = call(layer, x, m)
        out = out[0] if isinstance(out, list) else out
        assert np.all(np.isfinite(out)), f"{name}: {kind} mask gave non-finite outputs"
        results[kind] = out
    for kind in ("int 0/1", "uint8 0/1", "lengths"):
        np.testing.assert_array_equal(results[kind], results["bool"], err_msg=f"{name}: {kind} differs from bool")
    for kind, (m, error, pattern) in BAD.items():
        with pytest.raises(error, match=pattern) as info:
            call(layer, x, m)
        assert f"Layer '{layer.name}'" in str(info.value), f"{name}: the {kind} error does not name the layer"
