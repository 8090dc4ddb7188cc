"""Models: Sequential and functional training, whole-model gradient checks, shared layers,
determinism, validation, callbacks, verbosity, metrics, summary and masking."""
import os

import numpy as np
import pytest

import attnx
from attnx import callbacks, layers, metrics, optimizers
from attnx.testing import assert_close, gradcheck


def separable(n=1200, d=10, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d)
    y = (x @ w + 0.5 * np.sin(3 * x[:, 0]) > 0).astype(np.float32)
    return x, y


def small_mlp(d=10, seed=1):
    attnx.set_random_seed(seed)
    return attnx.Sequential([layers.Dense(16, activation="relu", input_shape=(d,)),
                             layers.Dense(1, activation="sigmoid")])


# ------------------------------------------------------------------------- Sequential
def test_sequential_mlp_reaches_97_percent():
    x, y = separable()
    attnx.set_random_seed(0)
    model = attnx.Sequential([layers.Dense(32, activation="relu", input_shape=(10,)),
                              layers.Dense(32, activation="tanh"),
                              layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x[:1000], y[:1000], batch_size=32, epochs=15, verbose=0)
    assert history.history["accuracy"][-1] >= 0.97
    loss, acc = model.evaluate(x[1000:], y[1000:], verbose=0)
    assert acc >= 0.97, acc
    pred = model.predict(x[1000:])
    assert pred.shape == (200, 1) and pred.dtype == np.float32
    assert np.mean((pred[:, 0] > 0.5) == (y[1000:] > 0.5)) == pytest.approx(acc)


def test_sequential_built_from_data_and_softmax_classifier():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 4)) * 4
    labels = rng.integers(0, 3, 300)
    x = (centers[labels] + rng.standard_normal((300, 4))).astype(np.float32)
    model = attnx.Sequential([layers.Dense(16, activation="relu"), layers.Dense(3, activation="softmax")])
    assert not model.built
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, labels, epochs=20, verbose=0, batch_size=16)
    assert model.built and model.layers[0].params["kernel"].shape == (4, 16)
    assert model.evaluate(x, labels, verbose=0, return_dict=True)["accuracy"] > 0.95


# ------------------------------------------------------------------------- functional
def two_in_two_out(dtype="float32", seed=3):
    attnx.set_random_seed(seed)
    a = attnx.Input(shape=(5,), name="a")
    b = attnx.Input(shape=(3,), name="b")
    ha = layers.Dense(4, activation="tanh", dtype=dtype, name="ha")(a)
    hb = layers.Dense(4, activation="sigmoid", dtype=dtype, name="hb")(b)
    cat = layers.Concatenate(dtype=dtype, name="cat")([ha, hb])
    summed = layers.Add(dtype=dtype, name="add")([ha, hb])
    out1 = layers.Dense(1, activation="sigmoid", dtype=dtype, name="out1")(cat)
    out2 = layers.Dense(2, activation="gelu", dtype=dtype, name="out2")(summed)
    return attnx.Model([a, b], [out1, out2], dtype=dtype, name="two_by_two")


def test_functional_two_inputs_two_outputs_trains():
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((256, 5)).astype(np.float32)
    x2 = rng.standard_normal((256, 3)).astype(np.float32)
    y1 = (x1[:, 0] + x2[:, 1] > 0).astype(np.float32)
    y2 = np.stack([x1[:, 1], x2[:, 0]], 1).astype(np.float32) * 0.5
    model = two_in_two_out()
    model.compile(optimizer=optimizers.Adam(0.02), loss=["binary_crossentropy", "mse"], loss_weights=[1.0, 0.5],
                  metrics=[["accuracy"], []])
    before = model.evaluate([x1, x2], [y1, y2], verbose=0, return_dict=True)
    hist = model.fit([x1, x2], [y1, y2], epochs=30, batch_size=32, verbose=0)
    after = model.evaluate([x1, x2], [y1, y2], verbose=0, return_dict=True)
    assert set(hist.history) == {"loss", "out1_accuracy"}
    assert after["loss"] < 0.5 * before["loss"]
    assert after["out1_accuracy"] > 0.9
    # the total loss is the weighted sum of each output's loss
    p1, p2 = model.predict([x1, x2])
    expected = attnx.losses.binary_crossentropy(y1, p1) + 0.5 * attnx.losses.mse(y2, p2)
    assert after["loss"] == pytest.approx(expected, rel=1e-4)
    # inputs by name
    p1b, _ = model.predict({"a": x1, "b": x2})
    assert np.array_equal(p1, p1b)


def test_functional_model_gradcheck_float64():
    model = two_in_two_out(dtype="float64")
    rng = np.random.default_rng(1)
    x1, x2 = rng.standard_normal((3, 5)), rng.standard_normal((3, 3))
    report = gradcheck(model, [x1, x2])
    assert {"inputs[0]", "inputs[1]", "ha/kernel", "hb/bias", "out1/kernel", "out2/bias"} <= set(report)


def test_shared_layer_gets_sum_of_gradients():
    attnx.set_random_seed(0)
    a, b = attnx.Input(shape=(4,)), attnx.Input(shape=(4,))
    shared = layers.Dense(3, activation="tanh", dtype="float64", name="shared")
    out = layers.Add(dtype="float64")([shared(a), shared(b)])
    model = attnx.Model([a, b], out, dtype="float64")
    assert len(model.layers) == 2 and model.count_params() == 15
    rng = np.random.default_rng(2)
    x1, x2 = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    dy = rng.standard_normal((5, 3))
    model.zero_grad()
    model(  [x1, x2], training=True)
    dx1, dx2 = model.backward(dy)
    total = shared.grads["kernel"].copy()
    # each call alone
    expected = np.zeros_like(total)
    for x in (x1, x2):
        shared.zero_grad()
        shared(x, training=True)
        shared.backward(dy)
        expected += shared.grads["kernel"]
    assert_close(total, expected, atol=1e-12)
    shared.zero_grad()
    shared(x1, training=True)
    assert_close(dx1, shared.backward(dy), atol=1e-12)
    gradcheck(model, [x1, x2])


def test_same_tensor_used_twice_sums_input_gradient():
    x_in = attnx.Input(shape=(3,))
    h = layers.Dense(3, dtype="float64")(x_in)
    out = layers.Add(dtype="float64")([h, h])
    model = attnx.Model(x_in, out, dtype="float64")
    gradcheck(model, np.random.default_rng(0).standard_normal((2, 3)))


# ------------------------------------------------------------------------- determinism
def _train_once(seed):
    x, y = separable(300)
    attnx.set_random_seed(seed)
    model = attnx.Sequential([layers.Dense(8, activation="relu", input_shape=(10,)), layers.Dropout(0.3),
                              layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, epochs=3, batch_size=16, validation_split=0.2, verbose=0, shuffle=True)
    return model.get_weights(), hist.history


def test_same_seed_same_weights_and_history():
    w1, h1 = _train_once(42)
    w2, h2 = _train_once(42)
    w3, _ = _train_once(43)
    assert all(np.array_equal(a, b) for a, b in zip(w1, w2))
    assert h1 == h2
    assert not all(np.array_equal(a, b) for a, b in zip(w1, w3))


# ------------------------------------------------------------------------- validation
def test_validation_split_takes_last_fraction():
    x, y = separable(100)
    y = y[:, None].copy()
    y_nan = y.copy()
    y_nan[80:] = np.nan  # only the held-out tail has NaN targets
    model = small_mlp()
    model.compile(optimizer="sgd", loss="mse")
    hist = model.fit(x, y_nan, epochs=2, batch_size=10, validation_split=0.2, verbose=0)
    assert all(np.isfinite(hist.history["loss"]))
    assert all(np.isnan(hist.history["val_loss"]))
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    # with clean targets val_loss is exactly the loss on the last 20 samples
    model = small_mlp()
    model.compile(optimizer="sgd", loss="mse")
    hist = model.fit(x, y, epochs=2, batch_size=10, validation_split=0.2, verbose=0)
    assert hist.history["val_loss"][-1] == pytest.approx(model.evaluate(x[80:], y[80:], verbose=0), rel=1e-6)


def test_validation_data_and_history_keys():
    x, y = separable(200)
    model = small_mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy", "precision"])
    hist = model.fit(x[:150], y[:150], epochs=3, batch_size=32, validation_data=(x[150:], y[150:]), verbose=0)
    assert set(hist.history) == {"loss", "accuracy", "precision", "val_loss", "val_accuracy", "val_precision"}
    assert all(len(v) == 3 for v in hist.history.values())
    assert hist.epoch == [0, 1, 2]
    val = model.evaluate(x[150:], y[150:], verbose=0, return_dict=True)
    assert hist.history["val_loss"][-1] == pytest.approx(val["loss"], rel=1e-6)
    assert hist.history["val_accuracy"][-1] == pytest.approx(val["accuracy"])
    assert model.history is hist


def test_shuffle():
    x, y = separable(96)

    def run(shuffle, seed):
        model = small_mlp()
        model.compile(optimizer=optimizers.SGD(0.1), loss="binary_crossentropy")
        attnx.set_random_seed(seed)
        model.fit(x, y, epochs=2, batch_size=8, shuffle=shuffle, verbose=0)
        return model.get_weights()[0]

    # without shuffling the order is the data order: the same as manual train_on_batch steps
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.1), loss="binary_crossentropy")
    for _ in range(2):
        for s in range(0, 96, 8):
            model.train_on_batch(x[s:s + 8], y[s:s + 8])
    manual = model.get_weights()[0]
    assert np.array_equal(run(False, 1), manual)
    assert np.array_equal(run(False, 2), manual)
    assert not np.array_equal(run(True, 1), manual)
    assert not np.array_equal(run(True, 1), run(True, 2))


# ------------------------------------------------------------------------- callbacks
class Scripted(callbacks.Callback):
    """Overwrites the monitored value with a scripted sequence and records the weights."""

    def __init__(self, values):
        super().__init__()
        self.values, self.weights = values, []

    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = self.values[epoch]
        self.weights.append(self.model.get_weights())


def test_early_stopping_patience():
    x, y = separable(64)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.05), loss="binary_crossentropy")
    script = Scripted([1.0, 0.8, 0.9, 0.85, 0.95, 0.7, 0.6])
    stop = callbacks.EarlyStopping(monitor="val_loss", patience=2)
    hist = model.fit(x, y, epochs=7, verbose=0, callbacks=[script, stop])
    assert len(hist.history["loss"]) == 4  # best at epoch 1, no improvement at 2 and 3
    assert stop.stopped_epoch == 3 and stop.best == 0.8


def test_early_stopping_restore_best_weights():
    x, y = separable(64)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.05), loss="binary_crossentropy")
    script = Scripted([1.0, 0.5, 0.9, 0.85, 0.95])
    stop = callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    model.fit(x, y, epochs=5, verbose=0, callbacks=[script, stop])
    best = script.weights[1]
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), best))
    assert not all(np.array_equal(a, b) for a, b in zip(script.weights[-1], best))


def test_early_stopping_on_real_loss():
    x, y = separable(64)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.0), loss="binary_crossentropy")  # loss never improves
    hist = model.fit(x, y, epochs=10, verbose=0, callbacks=[callbacks.EarlyStopping(monitor="loss", patience=2)])
    assert len(hist.history["loss"]) == 3


def test_model_checkpoint(tmp_path):
    x, y = separable(64)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.05), loss="binary_crossentropy")
    script = Scripted([1.0, 0.5, 0.7, 0.4])
    pattern = str(tmp_path / "m-{epoch:02d}-{val_loss:.2f}.attnx")
    ckpt = callbacks.ModelCheckpoint(pattern, monitor="val_loss", save_best_only=True)
    model.fit(x, y, epochs=4, verbose=0, callbacks=[script, ckpt])
    assert sorted(os.listdir(tmp_path)) == ["m-01-1.00.attnx", "m-02-0.50.attnx", "m-04-0.40.attnx"]
    loaded = attnx.load_model(tmp_path / "m-02-0.50.attnx")
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), script.weights[1]))
    every = callbacks.ModelCheckpoint(str(tmp_path / "all" / "w{epoch}.attnx"), save_weights_only=True)
    os.makedirs(tmp_path / "all")
    model.fit(x, y, epochs=2, verbose=0, callbacks=[every])
    assert sorted(os.listdir(tmp_path / "all")) == ["w1.attnx", "w2.attnx"]
    fresh = small_mlp(seed=9)
    fresh.load_weights(tmp_path / "all" / "w2.attnx")
    assert all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))


# ------------------------------------------------------------------------- verbosity
def test_verbose_levels(capsys):
    x, y = separable(64)
    model = small_mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    model.evaluate(x, y, verbose=0)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""

    model.fit(x, y, epochs=2, batch_size=16, verbose=2)
    out = capsys.readouterr()
    lines = [l for l in out.out.splitlines() if l.strip()]
    assert len(lines) == 2
    assert lines[0].startswith("Epoch 1/2") and "loss:" in lines[0] and "accuracy:" in lines[0]
    assert lines[1].startswith("Epoch 2/2")
    assert "Epoch" not in out.err

    model.fit(x, y, epochs=2, batch_size=16, verbose=1)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Epoch 1/2" in text and "Epoch 2/2" in text
    assert "4/4" in text and "loss=" in text and "accuracy=" in text


# ------------------------------------------------------------------------- metrics
def test_metric_values_hand_computed():
    y_true = np.array([1, 0, 1, 1, 0, 0, 1, 0], dtype=np.float32)
    y_prob = np.array([0.9, 0.2, 0.4, 0.7, 0.6, 0.1, 0.8, 0.3], dtype=np.float32)
    # predictions: 1 0 0 1 1 0 1 0 -> tp = 3, fp = 1, fn = 1, tn = 3
    assert metrics.BinaryAccuracy()(y_true, y_prob) == pytest.approx(6 / 8)
    assert metrics.Precision()(y_true, y_prob) == pytest.approx(3 / 4)
    assert metrics.Recall()(y_true, y_prob) == pytest.approx(3 / 4)
    assert metrics.F1Score()(y_true, y_prob) == pytest.approx(0.75)
    # (B, 1) predictions against (B,) labels
    assert metrics.BinaryAccuracy()(y_true, y_prob[:, None]) == pytest.approx(6 / 8)
    p = metrics.Precision()
    p.update_state(y_true[:4], y_prob[:4])
    p.update_state(y_true[4:], y_prob[4:])
    assert p.result() == pytest.approx(3 / 4)  # accumulates counts, not a mean of batch values
    y2 = np.array([1, 0, 0, 0], dtype=np.float32)
    p2 = np.array([0.9, 0.8, 0.7, 0.1], dtype=np.float32)  # tp 1, fp 2, fn 0
    assert metrics.Precision()(y2, p2) == pytest.approx(1 / 3)
    assert metrics.Recall()(y2, p2) == pytest.approx(1.0)
    assert metrics.F1Score()(y2, p2) == pytest.approx(2 * (1 / 3) / (1 / 3 + 1))
    assert metrics.Precision()(np.zeros(3), np.zeros(3)) == 0.0  # no positives: 0, not NaN
    labels = np.array([0, 2, 1, 2])
    scores = np.array([[0.8, 0.1, 0.1], [0.1, 0.2, 0.7], [0.5, 0.4, 0.1], [0.3, 0.3, 0.4]])
    assert metrics.SparseCategoricalAccuracy()(labels, scores) == pytest.approx(3 / 4)
    assert metrics.CategoricalAccuracy()(np.eye(3)[labels], scores) == pytest.approx(3 / 4)
    assert metrics.BinaryAccuracy()(y_true, y_prob, sample_weight=np.array([0, 0, 1, 1, 1, 1, 1, 1])) \
        == pytest.approx(4 / 6)


def test_compiled_metrics_match_hand_computed():
    x, y = separable(100)
    model = small_mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy", "precision", "recall", "f1"])
    result = model.evaluate(x, y, verbose=0, return_dict=True, batch_size=7)
    pred = model.predict(x)[:, 0] > 0.5
    truth = y > 0.5
    tp, fp, fn = np.sum(pred & truth), np.sum(pred & ~truth), np.sum(~pred & truth)
    assert result["accuracy"] == pytest.approx(np.mean(pred == truth))
    assert result["precision"] == pytest.approx(tp / (tp + fp))
    assert result["recall"] == pytest.approx(tp / (tp + fn))
    assert result["f1_score"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert isinstance(model.compiled_metrics[0][0], metrics.BinaryAccuracy)


# ------------------------------------------------------------------------- summary
def test_summary_output():
    model = attnx.Sequential([layers.Dense(16, activation="relu", input_shape=(10,), name="hidden"),
                              layers.Dropout(0.1, name="drop"),
                              layers.Dense(1, activation="sigmoid", name="head")], name="mlp")
    lines = []
    model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert 'Model: "mlp"' in text
    rows = {l.split()[0]: l for l in lines if l.split() and l.split()[0] in ("hidden", "drop", "head")}
    assert "(Dense)" in rows["hidden"] and "(None, 16)" in rows["hidden"] and rows["hidden"].split()[-1] == "176"
    assert "(Dropout)" in rows["drop"] and rows["drop"].split()[-1] == "0"
    assert "(None, 1)" in rows["head"] and rows["head"].split()[-1] == "17"
    assert "Total params: 193" in text and "Trainable params: 193" in text and "Non-trainable params: 0" in text
    model.layers[2].trainable = False
    lines = []
    model.summary(print_fn=lines.append)
    assert "Trainable params: 176" in "\n".join(lines) and "Non-trainable params: 17" in "\n".join(lines)
    with pytest.raises(ValueError, match="not built"):
        attnx.Sequential([layers.Dense(2)]).summary()


def test_summary_lists_shared_layer_once():
    a, b = attnx.Input(shape=(4,), name="in_a"), attnx.Input(shape=(4,), name="in_b")
    shared = layers.Dense(3, name="shared_dense")
    model = attnx.Model([a, b], layers.Add(name="sum")([shared(a), shared(b)]))
    lines = []
    model.summary(print_fn=lines.append)
    rows = [l.split() for l in lines if l.split() and l.split()[0] in ("in_a", "in_b", "shared_dense", "sum")]
    assert [r[0] for r in rows] == ["in_a", "in_b", "shared_dense", "sum"]
    assert sum(int(r[-1]) for r in rows) == 15 and "Total params: 15" in "\n".join(lines)


def test_non_trainable_layer_not_updated():
    x, y = separable(64)
    model = small_mlp()
    model.layers[0].trainable = False
    frozen = model.layers[0].get_weights()
    model.compile(optimizer="adam", loss="binary_crossentropy")
    model.fit(x, y, epochs=2, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(model.layers[0].get_weights(), frozen))
    assert not np.array_equal(model.layers[1].get_weights()[0], small_mlp().layers[1].get_weights()[0])


# ------------------------------------------------------------------------- masking
def test_embedding_mask_reaches_pooling_in_model():
    ids = np.array([[3, 5, 0, 0], [7, 0, 0, 0], [1, 2, 3, 4]], dtype=np.int64)
    inp = attnx.Input(shape=(4,), dtype="int64")
    emb = layers.Embedding(10, 3, mask_zero=True)
    pooled = layers.GlobalAveragePooling1D()(emb(inp))
    model = attnx.Model(inp, pooled)
    out = model.predict(ids)
    table = emb.params["embeddings"]
    expected = np.stack([table[[3, 5]].mean(0), table[[7]].mean(0), table[[1, 2, 3, 4]].mean(0)])
    assert_close(out, expected, atol=1e-6)
    # the mask passes through mask-preserving layers (Dense, Dropout, Activation)
    x = layers.Dense(2)(layers.Dropout(0.5)(emb(inp)))
    model2 = attnx.Model(inp, layers.GlobalAveragePooling1D()(layers.Activation("tanh")(x)))
    out2 = model2.predict(ids)
    full = model2.layers  # embedding, dropout, dense, activation, pooling
    seq = np.tanh(emb.params["embeddings"][ids] @ full[2].params["kernel"] + full[2].params["bias"])
    assert_close(out2[1], seq[1, :1].mean(0), atol=1e-6)
    # and gradients flow only into the embeddings of real tokens
    model(ids, training=True)
    model.zero_grad()
    model.backward(np.ones((3, 3), dtype=np.float32))
    g = emb.grads["embeddings"]
    assert not g[[0, 6, 8, 9]].any() and g[[1, 2, 3, 4, 5, 7]].all()


def test_explicit_mask_input_reaches_the_layer_in_a_functional_model():
    # layer(x, mask=m) on symbolic tensors: m is an input of the call, as in Keras
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    m = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)
    xs, ms = attnx.Input(shape=(5, 2)), attnx.Input(shape=(5,), dtype="bool")
    lstm = layers.LSTM(4)
    model = attnx.Model([xs, ms], lstm(xs, mask=ms))
    out = model.predict([x, m])
    assert_close(out, lstm(x, mask=m), atol=0)
    assert_close(out[1:2], lstm(x[1:2, :1]), atol=1e-6)  # the masked steps change nothing
    assert np.abs(out - lstm(x)).max() > 1e-3  # and the mask was not dropped


# ------------------------------------------------------------------------- more graph cases
def test_nested_model_gradcheck_and_save(tmp_path):
    attnx.set_random_seed(4)
    inner = attnx.Sequential([layers.Dense(4, activation="tanh", input_shape=(3,), dtype="float64"),
                              layers.Dense(2, dtype="float64")], name="inner", dtype="float64")
    a, b = attnx.Input(shape=(3,)), attnx.Input(shape=(3,))
    out = layers.Concatenate(dtype="float64")([inner(a), inner(b)])  # the nested model is shared
    outer = attnx.Model([a, b], out, name="outer", dtype="float64")
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    report = gradcheck(outer, [x1, x2])
    assert any(k.startswith("inner/") for k in report)
    y = outer([x1, x2])
    assert_close(y[:, :2], inner(x1), atol=1e-12)
    outer.compile(optimizer="sgd", loss="mse")
    outer.fit([x1, x2], np.zeros((3, 4)), epochs=1, verbose=0)
    outer.save(tmp_path / "nested.attnx")
    loaded = attnx.load_model(tmp_path / "nested.attnx")
    assert np.array_equal(loaded.predict([x1, x2]), outer.predict([x1, x2]))


def test_sequence_loss_uses_embedding_mask():
    ids = np.array([[4, 2, 0, 0], [1, 3, 5, 0]], dtype=np.int64)
    labels = np.array([[1, 0, 1, 1], [0, 1, 1, 0]], dtype=np.float32)[..., None]
    inp = attnx.Input(shape=(4,), dtype="int64")
    out = layers.Dense(1, activation="sigmoid")(layers.Embedding(6, 3, mask_zero=True)(inp))
    model = attnx.Model(inp, out)
    model.compile(optimizer=optimizers.SGD(0.0), loss="binary_crossentropy", metrics=["accuracy"])
    result = model.evaluate(ids, labels, verbose=0, return_dict=True)
    p = model.predict(ids)
    mask = ids != 0
    bce = -(labels * np.log(p + 1e-7) + (1 - labels) * np.log(1 - p + 1e-7))[..., 0]
    assert result["loss"] == pytest.approx(bce[mask].mean(), rel=1e-5)
    acc = ((p[..., 0] > 0.5) == (labels[..., 0] > 0.5))[mask].mean()
    assert result["accuracy"] == pytest.approx(acc)


def test_regularization_in_reported_loss():
    x, y = separable(64)
    attnx.set_random_seed(0)
    model = attnx.Sequential([layers.Dense(4, input_shape=(10,), kernel_regularizer=attnx.regularizers.L2(0.5)),
                              layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizers.SGD(0.0), loss="binary_crossentropy")
    plain = attnx.losses.binary_crossentropy(y, model.predict(x))
    reg = 0.5 * np.sum(model.layers[0].params["kernel"].astype(np.float64) ** 2)
    assert model.evaluate(x, y, verbose=0) == pytest.approx(plain + reg, rel=1e-5)
    hist = model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    assert hist.history["loss"][0] == pytest.approx(plain + reg, rel=1e-5)
    # and its gradient reaches the weights: with only the penalty, SGD shrinks the kernel
    k0 = model.layers[0].params["kernel"].copy()
    model.compile(optimizer=optimizers.SGD(0.1), loss="binary_crossentropy")
    model.train_on_batch(x, y)
    k1 = model.layers[0].params["kernel"]
    assert np.linalg.norm(k1) < np.linalg.norm(k0)


def test_fit_sample_weight_and_uneven_batches():
    x, y = separable(50)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.0), loss="binary_crossentropy")
    sw = np.zeros(50)
    sw[:10] = 1.0
    hist = model.fit(x, y, epochs=1, batch_size=50, sample_weight=sw, verbose=0, shuffle=False)
    per = np.array([attnx.losses.binary_crossentropy(y[i:i + 1], model.predict(x[i:i + 1])) for i in range(50)])
    assert hist.history["loss"][0] == pytest.approx(per[:10].sum() / 50, rel=1e-5)
    assert model.predict(x, batch_size=7).shape == (50, 1)
    assert np.allclose(model.predict(x, batch_size=7), model.predict(x, batch_size=50), atol=1e-6)
    steps = []
    cb = callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[cb])
    assert steps == [0, 1, 2, 3]  # 16 + 16 + 16 + 2


def test_dict_targets_by_output_name():
    a = attnx.Input(shape=(2,), name="in_a")
    o1 = layers.Dense(1, name="first")(a)
    o2 = layers.Dense(1, name="second")(a)
    model = attnx.Model(a, [o1, o2])
    model.compile(optimizer="sgd", loss={"first": "mse", "second": "mse"}, loss_weights=[1.0, 0.0])
    x = np.ones((4, 2), np.float32)
    y = {"first": np.zeros((4, 1), np.float32), "second": np.full((4, 1), 1e3, np.float32)}
    loss = model.evaluate({"in_a": x}, y, verbose=0)
    assert loss == pytest.approx(attnx.losses.mse(y["first"], model.predict(x)[0]), rel=1e-6)


def test_uncompiled_fit_raises():
    with pytest.raises(RuntimeError, match="compile"):
        small_mlp().fit(*separable(10), verbose=0)


def test_initial_epoch_and_learning_rate_scheduler(capsys):
    x, y = separable(32)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.1), loss="binary_crossentropy")
    seen = []
    sched = callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 * 0.5 ** epoch)
    probe = callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: seen.append(
        (epoch, model.optimizer.current_learning_rate)))
    hist = model.fit(x, y, epochs=4, initial_epoch=1, verbose=2, callbacks=[sched, probe])
    assert hist.epoch == [1, 2, 3] and len(hist.history["loss"]) == 3
    assert seen == [(1, pytest.approx(0.05)), (2, pytest.approx(0.025)), (3, pytest.approx(0.0125))]
    assert hist.history["learning_rate"] == pytest.approx([0.05, 0.025, 0.0125])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("Epoch 2/4")


def test_model_checkpoint_max_mode_on_accuracy(tmp_path):
    x, y = separable(64)
    model = small_mlp()
    model.compile(optimizer=optimizers.SGD(0.05), loss="binary_crossentropy", metrics=["accuracy"])

    class Acc(callbacks.Callback):
        values = [0.5, 0.7, 0.6, 0.9]

        def on_epoch_end(self, epoch, logs=None):
            logs["val_accuracy"] = self.values[epoch]

    ckpt = callbacks.ModelCheckpoint(str(tmp_path / "best-{epoch}.attnx"), monitor="val_accuracy",
                                     save_best_only=True)
    model.fit(x, y, epochs=4, verbose=0, callbacks=[Acc(), ckpt])
    assert sorted(os.listdir(tmp_path)) == ["best-1.attnx", "best-2.attnx", "best-4.attnx"]


# --------------------------------------------------------- symbolic keyword arguments
def test_encoder_decoder_with_initial_state_keywords_trains_through_fit():
    """Keras' encoder-decoder: the decoder LSTM starts from the encoder's states given as
    ``initial_state=[h, c]``; the encoder learns only through those keyword tensors."""
    attnx.set_random_seed(0)
    encoder_inputs, decoder_inputs = attnx.Input(shape=(5, 3)), attnx.Input(shape=(4, 3))
    _, h, c = layers.LSTM(6, return_state=True, name="encoder")(encoder_inputs)
    decoded = layers.LSTM(6, return_sequences=True, name="decoder")(decoder_inputs, initial_state=[h, c])
    model = attnx.Model([encoder_inputs, decoder_inputs], layers.Dense(2, name="head")(decoded))
    model.compile(optimizer=optimizers.Adam(0.01), loss="mse")
    rng = np.random.default_rng(0)
    source, target_in = rng.standard_normal((32, 5, 3)), rng.standard_normal((32, 4, 3))
    target = np.repeat(source[:, -1:, :2], 4, axis=1)  # only the encoder sees what the outputs must be
    encoder_before = [w.copy() for w in model.get_layer("encoder").get_weights()]
    history = model.fit([source, target_in], target, batch_size=8, epochs=15, verbose=0)
    assert history.history["loss"][-1] < 0.6 * history.history["loss"][0]
    assert all(not np.array_equal(a, b) for a, b in zip(encoder_before, model.get_layer("encoder").get_weights()))


def test_initial_state_keyword_inputs_get_gradients():
    attnx.set_random_seed(0)
    x_in, h_in, c_in = attnx.Input(shape=(4, 3)), attnx.Input(shape=(5,)), attnx.Input(shape=(5,))
    out = layers.LSTM(5, dtype="float64")(x_in, initial_state=[h_in, c_in])
    model = attnx.Model([x_in, h_in, c_in], out, dtype="float64")
    rng = np.random.default_rng(1)
    report = gradcheck(model, [rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5)),
                               rng.standard_normal((2, 5))])
    assert {"inputs[0]", "inputs[1]", "inputs[2]"} <= set(report)
