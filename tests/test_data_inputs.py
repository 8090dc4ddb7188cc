"""Data for fit / evaluate / predict: arrays, generators and iterables of batches give the same
training (bit for bit), steps_per_epoch / validation_steps / steps are honoured, class_weight is
the matching sample_weight, and wrong data gives a ValueError that says what was expected."""
import itertools

import numpy as np
import pytest

import attnx
from attnx import callbacks, layers, optimizers
from attnx.seq2seq import Seq2Seq


def classification_data(n=40, d=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = (x[:, :1] + 0.3 * x[:, 1:2] > 0).astype(np.float32)
    return x, y


def dropout_mlp(d=6, seed=3):
    """Dropout draws from attnx's generator every step: equal weights need equal random draws too."""
    attnx.set_random_seed(seed)
    model = attnx.Sequential([layers.Dense(8, activation="relu", input_shape=(d,)), layers.Dropout(0.25),
                              layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def array_batches(batch_size, *arrays):
    """The batches fit cuts from arrays with shuffle=False."""
    n = len(arrays[0])
    return [tuple(a[i:i + batch_size] for a in arrays) for i in range(0, n, batch_size)]


def assert_same_weights(a, b):
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


class BatchList:
    """An iterable that can be iterated again (each epoch a new pass), without __len__."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


# ------------------------------------------------------------------- same training
@pytest.mark.parametrize("source", ["generator", "iterable"])
def test_fit_from_batches_equals_fit_from_arrays(source):
    x, y = classification_data()
    xv, yv = classification_data(12, seed=1)
    batches = array_batches(8, x, y)
    from_arrays = dropout_mlp()
    h_arrays = from_arrays.fit(x, y, batch_size=8, epochs=3, shuffle=False, validation_data=(xv, yv), verbose=0)
    from_batches = dropout_mlp()
    if source == "generator":  # one generator for every epoch: steps_per_epoch draws across them
        data, steps = (b for _ in range(3) for b in batches), len(batches)
    else:
        data, steps = BatchList(batches), None
    h_batches = from_batches.fit(data, epochs=3, steps_per_epoch=steps,
                                 validation_data=BatchList(array_batches(5, xv, yv)), verbose=0)
    assert_same_weights(from_arrays, from_batches)
    assert h_arrays.history["loss"] == h_batches.history["loss"]
    assert h_arrays.history["val_accuracy"] == h_batches.history["val_accuracy"]
    assert from_arrays.evaluate(x, y, batch_size=8, verbose=0) == from_batches.evaluate(BatchList(batches), verbose=0)
    np.testing.assert_array_equal(from_arrays.predict(x, batch_size=8),
                                  from_batches.predict(b[0] for b in batches))


def test_generator_with_sample_weights_and_several_inputs():
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((30, 3)).astype(np.float32), rng.standard_normal((30, 2)).astype(np.float32)
    y, sw = rng.standard_normal((30, 1)).astype(np.float32), rng.uniform(0, 2, 30).astype(np.float32)

    def model():
        attnx.set_random_seed(0)
        a, b = attnx.Input(shape=(3,)), attnx.Input(shape=(2,))
        out = layers.Dense(1)(layers.Concatenate()([layers.Dense(4, activation="tanh")(a), b]))
        m = attnx.Model([a, b], out)
        m.compile(optimizer="adam", loss="mse")
        return m
    from_arrays = model()
    from_arrays.fit([x1, x2], y, sample_weight=sw, batch_size=7, epochs=2, shuffle=False, verbose=0)
    from_generator = model()
    gen = (([a1, a2], t, w) for _ in range(2) for a1, a2, t, w in array_batches(7, x1, x2, y, sw))
    from_generator.fit(gen, steps_per_epoch=5, epochs=2, verbose=0)
    assert_same_weights(from_arrays, from_generator)


def test_seq2seq_fit_from_generator_equals_fit_from_arrays():
    rng = np.random.default_rng(0)
    src = rng.integers(3, 13, (24, 5))
    tgt = np.concatenate([np.ones((24, 1), np.int64), rng.integers(3, 13, (24, 4)), np.full((24, 1), 2)], axis=1)

    def model():
        attnx.set_random_seed(0)
        m = Seq2Seq(13, 13, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8)
        m.compile(optimizers.Adam(0.01))
        return m
    from_arrays = model()
    from_arrays.fit(src, tgt, batch_size=6, epochs=2, shuffle=False, verbose=0)
    from_generator = model()
    from_generator.fit(itertools.chain.from_iterable(itertools.repeat(array_batches(6, src, tgt), 2)),
                       steps_per_epoch=4, epochs=2, verbose=0)
    assert_same_weights(from_arrays, from_generator)


def test_sequential_without_input_shape_builds_from_the_first_batch():
    x, y = classification_data()
    model = attnx.Sequential([layers.Dense(4, activation="relu"), layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    model.fit(iter(array_batches(10, x, y)), verbose=0)
    assert model.built and model.inputs[0].shape == (None, 6)


# --------------------------------------------------------------------- class_weight
@pytest.mark.parametrize("targets", ["binary", "sparse", "one_hot"])
def test_class_weight_equals_matching_sample_weight(targets):
    x, y = classification_data(48)
    class_weight = {0: 0.3, 1: 2.5}
    if targets == "binary":
        out, loss = layers.Dense(1, activation="sigmoid"), "binary_crossentropy"
    else:
        y = y[:, 0].astype(np.int64)
        out, loss = layers.Dense(2, activation="softmax"), "sparse_categorical_crossentropy"
        if targets == "one_hot":
            y, loss = np.eye(2, dtype=np.float32)[y], "categorical_crossentropy"
    labels = y.argmax(1) if targets == "one_hot" else y.reshape(-1).astype(int)
    sample_weight = np.where(labels == 1, 2.5, 0.3)

    def model():
        attnx.set_random_seed(0)
        m = attnx.Sequential([layers.Dense(5, activation="tanh", input_shape=(6,)), out.from_config(out.get_config())])
        m.compile(optimizer="adam", loss=loss)
        return m
    weighted_by_class = model()  # each model built and trained from the same seed: the same shuffles
    h_class = weighted_by_class.fit(x, y, class_weight=class_weight, batch_size=8, epochs=2, verbose=0)
    weighted_by_sample = model()
    h_sample = weighted_by_sample.fit(x, y, sample_weight=sample_weight, batch_size=8, epochs=2, verbose=0)
    assert_same_weights(weighted_by_class, weighted_by_sample)
    assert h_class.history["loss"] == h_sample.history["loss"]


def test_class_weight_missing_class_weighs_one_and_applies_to_generator_batches():
    x, y = classification_data(16)
    sample_weight = np.where(y[:, 0] == 1, 4.0, 1.0)
    unweighted = dropout_mlp()
    unweighted.fit(iter(array_batches(4, x, y, sample_weight)), verbose=0)
    weighted = dropout_mlp()
    weighted.fit(iter(array_batches(4, x, y)), class_weight={1: 4.0}, verbose=0)
    assert_same_weights(unweighted, weighted)


# ------------------------------------------------------------------ steps honoured
def counting_generator(x, y, batch_size, drawn):
    """Endless batches; appends the index of each batch drawn."""
    for i in itertools.count():
        drawn.append(i)
        start = (i * batch_size) % (len(x) - batch_size)
        yield x[start:start + batch_size], y[start:start + batch_size]


def test_steps_per_epoch_and_validation_steps_continue_the_generators():
    x, y = classification_data()
    drawn, val_drawn, batches = [], [], []
    model = dropout_mlp()
    history = model.fit(counting_generator(x, y, 4, drawn), steps_per_epoch=3, epochs=4,
                        validation_data=counting_generator(x, y, 5, val_drawn), validation_steps=2, verbose=0,
                        callbacks=[callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))])
    assert len(history.history["val_loss"]) == 4
    assert batches == [0, 1, 2] * 4
    assert drawn == list(range(12)) and val_drawn == list(range(8))
    val_drawn.clear()
    model.evaluate(counting_generator(x, y, 5, val_drawn), steps=3, verbose=0)
    assert val_drawn == [0, 1, 2]
    assert model.predict((b[0] for b in counting_generator(x, y, 5, [])), steps=2).shape == (10, 1)


def test_steps_per_epoch_over_arrays_continues_the_pass_and_starts_the_next():
    x, y = classification_data(20)
    seen = []
    model = dropout_mlp()
    model.fit(x, y, batch_size=5, steps_per_epoch=2, epochs=3, shuffle=False, verbose=0,
              callbacks=[callbacks.LambdaCallback(on_train_batch_begin=lambda b, logs: seen.append(b))])
    assert seen == [0, 1] * 3  # passes of 4 batches: epoch 2 ends the first pass, epoch 3 starts the next
    # two batches of 5 against one of 10: the same samples, summed in another order (float32 rounding)
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=5, steps=2, verbose=0),
                               model.evaluate(x[:10], y[:10], verbose=0), rtol=1e-6)


def test_a_generator_runs_out_after_one_pass_and_training_stops():
    x, y = classification_data(20)
    model = dropout_mlp()
    with pytest.warns(UserWarning, match="ran out in epoch 2"):
        history = model.fit(iter(array_batches(5, x, y)), epochs=3, verbose=0)
    assert len(history.history["loss"]) == 1
    with pytest.warns(UserWarning, match="ran out after 4 of 6 steps"):
        model.fit(iter(array_batches(5, x, y)), steps_per_epoch=6, epochs=1, verbose=0)


# ------------------------------------------------------------------------ bad data
BAD_BATCHES = [
    ([np.zeros((2, 6), np.float32)] * 4, r"must be \(x, y\) or \(x, y, sample_weight\), "
                                         r"got list \(batch 1 of the pass\)"),  # [x, y] is a batch (a DataLoader's)
    (np.zeros((2, 6), np.float32), r"must be \(x, y\).*got ndarray"),
    ((np.zeros((2, 6), np.float32),), r"must be \(x, y\).*got a tuple of 1"),
    ((np.zeros((2, 6), np.float32),) * 4, r"got a tuple of 4"),
    ((np.zeros((2, 6), np.float32), None), r"the y of a batch must be an array.*got NoneType"),
    (("text", np.zeros((2, 1), np.float32)), r"the x of a batch must be an array.*got str"),
    ((np.zeros((2, 6), np.float32), np.zeros((3, 1), np.float32)),
     r"inputs, targets and sample weights have different numbers of samples \(batch 1"),
    ((np.zeros((0, 6), np.float32), np.zeros((0, 1), np.float32)), r"no samples \(empty batch\)"),
]


@pytest.mark.parametrize("batch, message", BAD_BATCHES)
def test_generator_of_wrong_batches_raises(batch, message):
    model = dropout_mlp()
    with pytest.raises(ValueError, match="fit: .*" + message):
        model.fit(iter([batch]), verbose=0)


@pytest.mark.parametrize("steps", [0, -2, 1.5, True, "3"])
def test_bad_steps_raise(steps):
    x, y = classification_data(10)
    model = dropout_mlp()
    with pytest.raises(ValueError, match=r"fit: steps must be a positive integer"):
        model.fit(x, y, steps_per_epoch=steps, verbose=0)
    with pytest.raises(ValueError, match=r"validation_data: steps must be a positive integer"):
        model.fit(x, y, validation_data=(x, y), validation_steps=steps, verbose=0)
    with pytest.raises(ValueError, match=r"evaluate: steps must be a positive integer"):
        model.evaluate(x, y, steps=steps, verbose=0)
    with pytest.raises(ValueError, match=r"predict: steps must be a positive integer"):
        model.predict(x, steps=steps)


def test_wrong_arguments_with_iterables_raise():
    x, y = classification_data(10)
    model = dropout_mlp()
    gen = (lambda: iter(array_batches(5, x, y)))
    cases = [
        (lambda: model.fit(gen(), y, verbose=0), "do not give y when x is a generator"),
        (lambda: model.fit(gen(), batch_size=5, verbose=0), "do not give batch_size"),
        (lambda: model.fit(gen(), validation_split=0.2, verbose=0), "validation_split needs arrays"),
        (lambda: model.fit(iter([]), verbose=0), "fit: the data gave no batch"),
        (lambda: model.evaluate(iter([]), verbose=0), "evaluate: the data gave no batch"),
        (lambda: model.fit(x, y, validation_data=iter([]), verbose=0), "validation_data: the data gave no batch"),
        (lambda: model.fit(x, y, validation_data=x, verbose=0), r"validation_data must be \(x_val, y_val\)"),
        (lambda: model.fit(x, verbose=0), "fit: y is required"),
        (lambda: model.fit(x, y, class_weight={0: 1.0}, sample_weight=np.ones(10), verbose=0),
         "class_weight or sample_weight, not both"),
        (lambda: model.fit(x, y, batch_size=0, verbose=0), "batch_size must be a positive integer"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(TypeError, match="class_weight must be a dict"):
        model.fit(x, y, class_weight=[1.0, 2.0], verbose=0)


def test_class_weight_refuses_sequence_targets():
    attnx.set_random_seed(0)
    model = Seq2Seq(13, 13, embedding_dim=8, units=16, start_token=1, end_token=2, max_length=8)
    model.compile()
    src, tgt = np.full((4, 3), 5), np.array([[1, 4, 5, 2]] * 4)
    with pytest.raises(ValueError, match=r"class_weight needs one class per sample.*sequence of class ids"):
        model.fit(src, tgt, class_weight={4: 2.0}, verbose=0)
