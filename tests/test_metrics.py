"""Metrics' update_state: the unweighted update (what every training step does) is the weighted one with
every weight 1, to the bit, for every metric `compile(metrics=[...])` resolves."""
import numpy as np
import pytest

from attnx import metrics
from attnx.metrics import _ALIASES

rng = np.random.default_rng(0)
PROBABILITIES = rng.uniform(0.01, 0.99, size=(37, 1)).astype(np.float32)
BINARY_LABELS = (rng.uniform(size=37) > 0.5).astype(np.float32)
SCORES = rng.uniform(size=(37, 5)).astype(np.float32)
CLASSES = rng.integers(0, 5, size=37)


def _batches(name):
    """(y_true, y_pred) batches suited to metric `name`."""
    if name == "sparse_categorical_accuracy":
        return [(CLASSES[:20], SCORES[:20]), (CLASSES[20:], SCORES[20:])]
    if name in ("categorical_accuracy", "kl_divergence"):
        onehot = np.eye(5, dtype=np.float32)[CLASSES]
        scores = SCORES / SCORES.sum(-1, keepdims=True)
        return [(onehot[:20], scores[:20]), (onehot[20:], scores[20:])]
    if name == "accuracy":  # exact matches (no loss given to pick a variant)
        guesses = np.where(PROBABILITIES > 0.5, 1.0, 0.0).astype(np.float32)
        return [(BINARY_LABELS[:20], guesses[:20]), (BINARY_LABELS[20:], guesses[20:])]
    return [(BINARY_LABELS[:20], PROBABILITIES[:20]), (BINARY_LABELS[20:], PROBABILITIES[20:])]


@pytest.mark.parametrize("name", sorted(_ALIASES) + ["accuracy"])
def test_unweighted_update_is_the_update_with_unit_weights(name):
    unweighted, weighted = metrics.get(name), metrics.get(name)
    for y_true, y_pred in _batches(name):
        unweighted.update_state(y_true, y_pred)
        weighted.update_state(y_true, y_pred, sample_weight=np.ones(len(y_true)))
    assert unweighted.result() > 0
    assert float(unweighted.result()).hex() == float(weighted.result()).hex()
    for state in unweighted.state_names:
        assert np.asarray(getattr(unweighted, state)).tobytes() == np.asarray(getattr(weighted, state)).tobytes()


def test_unweighted_update_counts_every_value_and_a_mask_still_weighs():
    metric = metrics.BinaryAccuracy()
    metric.update_state(np.array([1.0, 0.0, 1.0]), np.array([[0.9], [0.8], [0.2]]))
    assert (metric.total, metric.count) == (1.0, 3.0)
    metric.update_state(np.array([1.0, 0.0]), np.array([[0.9], [0.1]]), mask=np.array([True, False]))
    assert (metric.total, metric.count) == (2.0, 4.0)
