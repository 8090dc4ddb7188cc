"""The loss and metric names a Keras user passes to compile ("mae", "mse", "huber", "kl_divergence"):
the same values as Keras' own functions (Keras 3 on its PyTorch backend), and the gradients of the losses
by float64 central differences."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported

import attnx  # noqa: E402
from attnx import layers, losses, metrics  # noqa: E402
from _keras_testing import assert_all_close  # noqa: E402

keras = pytest.importorskip("keras")


@pytest.mark.parametrize("name, keras_name", [("mae", "mean_absolute_error"), ("mse", "mean_squared_error"),
                                              ("huber", "huber"), ("kl_divergence", "kl_divergence")])
def test_loss_and_metric_values_match_keras(name, keras_name):
    rng = np.random.default_rng(0)
    y = rng.random((6, 4))
    p = rng.random((6, 4)) * 2
    expected = float(np.mean(keras.ops.convert_to_numpy(getattr(keras.losses, keras_name)(y, p))))
    assert_all_close(losses.get(name)(y, p), expected, rtol=1e-6)
    metric = metrics.get(name)
    metric.update_state(y, p)
    assert metric.name == name
    assert_all_close(metric.result(), expected, rtol=1e-6)


@pytest.mark.parametrize("name", ["mae", "huber", "kl_divergence"])
def test_loss_gradients(name):
    rng = np.random.default_rng(1)
    y = rng.random((3, 4))
    p = rng.random((3, 4)) * 2 + 0.01
    loss = losses.get(name)
    _, dp = loss.compute(y, p)
    eps, numeric = 1e-6, np.zeros_like(p)
    for i in np.ndindex(p.shape):
        hi, lo = p.copy(), p.copy()
        hi[i] += eps
        lo[i] -= eps
        numeric[i] = (loss(y, hi) - loss(y, lo)) / (2 * eps)
    assert_all_close(dp, numeric, atol=1e-7)


def test_names_in_compile_and_fit():
    attnx.set_random_seed(0)
    model = attnx.Sequential([layers.Dense(1, input_shape=(3,))])
    model.compile("adam", "huber", metrics=["mae", "mse"])
    x = np.random.default_rng(0).random((32, 3)).astype("float32")
    history = model.fit(x, x.sum(axis=1, keepdims=True), epochs=2, verbose=0)
    assert set(history.history) == {"loss", "mae", "mse"}
