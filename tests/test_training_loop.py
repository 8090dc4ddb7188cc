"""The training loop's per-batch shortcuts keep what they skip: batch hooks (and their logs) run for every
callback that has one, and the optimizer's check of (param, grad) pairs, skipped for the same arrays as the
last step's, still refuses any other pair that does not match."""
import numpy as np
import pytest

import attnx
from attnx import callbacks, layers


def _model():
    attnx.set_random_seed(0)
    model = attnx.Sequential([layers.Dense(4, activation="relu", input_shape=(3,)), layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((20, 3)).astype(np.float32), rng.standard_normal((20, 1)).astype(np.float32)


class _BatchEnds(callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append((batch, dict(logs)))


class _EpochEnds(callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


def test_calls_names_the_hooks_a_callback_implements():
    lam = callbacks.LambdaCallback(on_test_batch_begin=lambda batch, logs: None)
    cbs = callbacks.CallbackList([_EpochEnds(), callbacks.History()], None, {})
    assert not cbs.calls("on_train_batch_begin", "on_train_batch_end", "on_test_batch_end")
    assert cbs.calls("on_epoch_end")
    assert callbacks.CallbackList([_BatchEnds()], None, {}).calls("on_train_batch_begin", "on_train_batch_end")
    assert callbacks.CallbackList([lam], None, {}).calls("on_test_batch_begin")
    assert not callbacks.CallbackList([lam], None, {}).calls("on_test_batch_end")


@pytest.mark.parametrize("extra", [[], [_EpochEnds()]])
def test_batch_hooks_get_every_batch_with_its_logs(extra):
    x, y = _data()
    seen = _BatchEnds()
    tests = []
    test_hook = callbacks.LambdaCallback(on_test_batch_end=lambda batch, logs: tests.append((batch, dict(logs))))
    history = _model().fit(x, y, batch_size=8, epochs=2, verbose=0, validation_split=0.2,
                           callbacks=extra + [seen, test_hook])
    assert [b for b, _ in seen.logs] == [0, 1, 0, 1]
    for _, logs in seen.logs:
        assert set(logs) == {"loss", "mae"} and all(np.isfinite(v) for v in logs.values())
    assert [b for b, _ in tests] == [0, 0] and set(tests[0][1]) == {"loss", "mae"}
    assert set(history.history) == {"loss", "mae", "val_loss", "val_mae"}


def test_fit_without_batch_hooks_trains_the_same():
    x, y = _data()
    a, b = _model(), _model()
    ha = a.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    hb = b.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[_BatchEnds()])
    assert ha.history == hb.history
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


def test_optimizer_checks_any_new_pairs_after_a_step():
    p, g = np.ones((2, 3), np.float32), np.full((2, 3), 0.5, np.float32)
    opt = attnx.optimizers.Adam(0.1)
    opt.apply([(p, g)])
    opt.apply([(p, g)])  # the same arrays: checked once
    assert opt.iterations == 2 and np.all(p < 1)
    with pytest.raises(ValueError, match="does not match parameter"):
        opt.apply([(p, np.zeros((3, 2), np.float32))])
    with pytest.raises(ValueError, match="does not match parameter"):
        opt.apply([(p, g.astype(np.float64))])
    with pytest.raises(TypeError, match="NumPy arrays"):
        opt.apply([(p, g.tolist())])
    with pytest.raises(ValueError, match="does not match parameter"):  # one more pair: checked again
        opt.apply([(p, g), (np.ones(2, np.float32), np.ones(3, np.float32))])
    before = p.copy()
    opt.apply([(p, g)])  # back to the first pairs: they train as before
    assert opt.iterations == 3 and np.all(p < before)
