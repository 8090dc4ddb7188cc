"""Callbacks on evaluate and predict, and on fit's validation, in Keras 3's order (issue 41): the same
hooks, called in the same order with the same batch indices and log keys, as Keras' own fit / evaluate /
predict on its PyTorch backend."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")

import attnx  # noqa: E402
from attnx import layers  # noqa: E402

HOOKS = ["on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
         "on_train_batch_end", "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
         "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end"]


def _recorder(base):
    calls = []

    def hook(name):
        def record(*args, logs=None):  # Keras passes logs by keyword, attnx by position
            if logs is None and args and isinstance(args[-1], dict):
                args, logs = args[:-1], args[-1]
            index = args[0] if args else None
            calls.append((name, index, tuple(sorted(logs)) if isinstance(logs, dict) else ()))
        return record
    cb = base()
    for name in HOOKS:
        setattr(cb, name, hook(name))
    return cb, calls


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((10, 3)).astype("float32"), rng.standard_normal((10, 1)).astype("float32")


def _run(make_model, callback_class):
    x, y = _data()
    model = make_model()
    runs = {}
    cb, calls = _recorder(callback_class)
    model.fit(x, y, batch_size=4, epochs=2, validation_data=(x[:6], y[:6]), callbacks=[cb], verbose=0,
              shuffle=False)
    runs["fit"] = list(calls)
    cb, calls = _recorder(callback_class)
    model.evaluate(x, y, batch_size=4, callbacks=[cb], verbose=0)
    runs["evaluate"] = list(calls)
    cb, calls = _recorder(callback_class)
    model.predict(x, batch_size=4, callbacks=[cb], verbose=0)
    runs["predict"] = list(calls)
    return runs


def _keras_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    return model


def _attnx_model():
    model = attnx.Sequential([layers.Dense(1, input_shape=(3,))])
    model.compile("sgd", "mse", metrics=["mae"])
    return model


@pytest.mark.parametrize("entry", ["fit", "evaluate", "predict"])
def test_callback_order_matches_keras(entry):
    theirs = _run(_keras_model, keras.callbacks.Callback)[entry]
    ours = _run(_attnx_model, attnx.callbacks.Callback)[entry]
    # hooks and indices in the same order; log keys the same (Keras' predict batch logs: {"outputs"})
    assert [(n, i) for n, i, _ in ours] == [(n, i) for n, i, _ in theirs]
    for (name, index, keys), (_, _, keras_keys) in zip(ours, theirs):
        assert keys == keras_keys, f"{entry}: {name}({index}) logs {keys}, Keras {keras_keys}"


def test_predict_batch_end_gets_the_outputs():
    x, _ = _data()
    model = _attnx_model()
    seen = []
    cb = attnx.callbacks.LambdaCallback(on_predict_batch_end=lambda batch, logs: seen.append(logs["outputs"]))
    out = model.predict(x, batch_size=4, callbacks=[cb])
    np.testing.assert_array_equal(np.concatenate(seen), out)
