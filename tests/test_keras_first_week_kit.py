"""The kit around a Keras user's model (issue 41), against Keras 3 itself on its PyTorch backend where Keras
has the piece: metrics.AUC, utils.plot_model, utils.PyDataset and Sequence-like objects, DataLoader batches as
lists, dict inputs, class_weight with sample_weight, a subclassed model's summary."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")

import attnx  # noqa: E402
from attnx import layers, metrics  # noqa: E402


# ---- metrics.AUC ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("curve", ["ROC", "PR"])
@pytest.mark.parametrize("summation_method", ["interpolation", "minoring", "majoring"])
@pytest.mark.parametrize("num_thresholds", [3, 10, 200])
def test_auc_matches_keras(curve, summation_method, num_thresholds):
    rng = np.random.default_rng(num_thresholds)
    ours = metrics.AUC(num_thresholds=num_thresholds, curve=curve, summation_method=summation_method)
    theirs = keras.metrics.AUC(num_thresholds=num_thresholds, curve=curve, summation_method=summation_method)
    for _ in range(3):  # running sums over batches, with sample weights
        y_true = rng.integers(0, 2, (16, 1)).astype("float32")
        y_pred = np.clip(0.6 * y_true + 0.5 * rng.random((16, 1)), 0, 1).astype("float32")
        w = rng.random(16).astype("float32")
        ours.update_state(y_true, y_pred, sample_weight=w)
        theirs.update_state(y_true, y_pred, sample_weight=w)
    np.testing.assert_allclose(ours.result(), float(theirs.result()), rtol=1e-5, atol=1e-6)
    ours.reset_state()
    assert ours.result() == 0.0


def test_auc_thresholds_logits_and_errors_as_keras():
    rng = np.random.default_rng(0)
    y_true, logits = rng.integers(0, 2, 50).astype("float32"), rng.standard_normal(50).astype("float32")
    ours = metrics.AUC(thresholds=[0.2, 0.5, 0.7], from_logits=True)
    theirs = keras.metrics.AUC(thresholds=[0.2, 0.5, 0.7], from_logits=True)
    ours.update_state(y_true, logits)
    theirs.update_state(y_true, logits)
    np.testing.assert_allclose(ours.result(), float(theirs.result()), rtol=1e-5)
    for kwargs, match in [({"curve": "XY"}, "Invalid AUC curve value"), ({"summation_method": "x"}, "summation method"),
                          ({"num_thresholds": 1}, "num_thresholds")]:
        with pytest.raises(ValueError, match=match):
            keras.metrics.AUC(**kwargs)
        with pytest.raises(ValueError, match=match):
            metrics.AUC(**kwargs)


def test_auc_in_fit_logs_as_keras_names_it():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 4)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    model = attnx.Sequential([layers.Dense(1, activation="sigmoid", input_shape=(4,))])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc", metrics.AUC(curve="PR", name="pr")])
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, validation_data=(x, y))
    assert {"auc", "pr", "val_auc", "val_pr"} <= set(history.history)
    assert 0.5 < history.history["auc"][-1] <= 1.0
