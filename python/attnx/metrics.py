"""Stateful metrics with Keras' names: ``update_state(y_true, y_pred)``, ``result()``, ``reset_state()``.

"accuracy" in ``compile(metrics=[...])`` resolves by the loss as Keras does: binary accuracy for
binary cross-entropy, sparse categorical accuracy for sparse labels, categorical otherwise.
"""
import numpy as np


class Metric:
    # the running sums the result is made of: summing them over data-parallel ranks gives the
    # metric of the whole data (attnx.distributed)
    state_names = ("total", "count")

    def __init__(self, name=None):
        self.name = name or type(self).__name__.lower()
        self.reset_state()

    def reset_state(self):
        self.total = 0.0
        self.count = 0.0

    def update_state(self, y_true, y_pred, sample_weight=None, mask=None):
        values = self._values(np.asarray(y_true), np.asarray(y_pred))
        weights = np.ones(values.shape, dtype=np.float64)
        for extra in (sample_weight, mask):
            if extra is not None:
                e = np.asarray(extra, dtype=np.float64)
                weights = weights * e.reshape(e.shape + (1,) * (values.ndim - e.ndim))
        self.total += float(np.sum(values * weights))
        self.count += float(np.sum(np.broadcast_to(weights, values.shape)))

    def _values(self, y_true, y_pred):
        raise NotImplementedError

    def result(self):
        return self.total / self.count if self.count else 0.0

    def __call__(self, y_true, y_pred, sample_weight=None):
        self.reset_state()
        self.update_state(y_true, y_pred, sample_weight)
        return self.result()


def _match_binary(y_true, y_pred):
    if y_true.shape != y_pred.shape:
        if y_pred.shape[-1:] == (1,) and y_true.shape == y_pred.shape[:-1]:
            y_true = y_true.reshape(y_pred.shape)
        else:
            raise ValueError(f"metric: y_true shape {y_true.shape} does not match y_pred shape {y_pred.shape}")
    return y_true, y_pred


class BinaryAccuracy(Metric):
    """Fraction of predictions on the right side of `threshold` (0.5: probabilities)."""

    def __init__(self, name="binary_accuracy", threshold=0.5):
        self.threshold = threshold
        super().__init__(name)

    def _values(self, y_true, y_pred):
        y_true, y_pred = _match_binary(y_true, y_pred)
        return ((y_pred > self.threshold) == (y_true > 0.5)).astype(np.float64)


class SparseCategoricalAccuracy(Metric):
    def __init__(self, name="sparse_categorical_accuracy"):
        super().__init__(name)

    def _values(self, y_true, y_pred):
        if y_true.shape == y_pred.shape[:-1] + (1,):
            y_true = y_true.reshape(y_pred.shape[:-1])
        if y_true.shape != y_pred.shape[:-1]:
            raise ValueError(f"{self.name}: labels shape {y_true.shape} does not match predictions {y_pred.shape}")
        return (np.argmax(y_pred, axis=-1) == y_true).astype(np.float64)


class CategoricalAccuracy(Metric):
    def __init__(self, name="categorical_accuracy"):
        super().__init__(name)

    def _values(self, y_true, y_pred):
        if y_true.shape != y_pred.shape:
            raise ValueError(f"{self.name}: y_true shape {y_true.shape} does not match y_pred shape {y_pred.shape}")
        return (np.argmax(y_pred, axis=-1) == np.argmax(y_true, axis=-1)).astype(np.float64)


class Accuracy(Metric):
    """Exact match of values."""

    def __init__(self, name="accuracy"):
        super().__init__(name)

    def _values(self, y_true, y_pred):
        y_true, y_pred = _match_binary(y_true, y_pred)
        return (y_true == y_pred).astype(np.float64)


class _Confusion(Metric):
    """Binary true/false positive counts at `threshold`; subclasses combine them."""

    state_names = ("tp", "fp", "fn")

    def __init__(self, name=None, threshold=0.5):
        self.threshold = threshold
        super().__init__(name)

    def reset_state(self):
        self.tp = self.fp = self.fn = 0.0

    def update_state(self, y_true, y_pred, sample_weight=None, mask=None):
        y_true, y_pred = _match_binary(np.asarray(y_true), np.asarray(y_pred))
        w = np.ones(y_true.shape)
        for extra in (sample_weight, mask):
            if extra is not None:
                e = np.asarray(extra, dtype=np.float64)
                w = w * e.reshape(e.shape + (1,) * (y_true.ndim - e.ndim))
        pred, true = y_pred > self.threshold, y_true > 0.5
        self.tp += float(np.sum(w * (pred & true)))
        self.fp += float(np.sum(w * (pred & ~true)))
        self.fn += float(np.sum(w * (~pred & true)))


class Precision(_Confusion):
    def __init__(self, name="precision", threshold=0.5):
        super().__init__(name, threshold)

    def result(self):
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0


class Recall(_Confusion):
    def __init__(self, name="recall", threshold=0.5):
        super().__init__(name, threshold)

    def result(self):
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0


class F1Score(_Confusion):
    """Binary F1 = 2 tp / (2 tp + fp + fn)."""

    def __init__(self, name="f1_score", threshold=0.5):
        super().__init__(name, threshold)

    def result(self):
        denom = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / denom if denom else 0.0


class Mean(Metric):
    """Running (weighted) mean of the values given to ``update_state(value, weight)``."""

    def update_state(self, value, weight=1.0):
        self.total += float(value) * weight
        self.count += weight


class MeanMetricWrapper(Metric):
    """The running (weighted) mean of ``fn(y_true, y_pred)``: a function used as a metric (Keras' wrapper)."""

    def __init__(self, fn, name=None):
        self.fn = fn
        super().__init__(name or getattr(fn, "__name__", "metric"))

    def _values(self, y_true, y_pred):
        return np.asarray(self.fn(y_true, y_pred), dtype=np.float64)


_ALIASES = {
    "binary_accuracy": BinaryAccuracy, "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "categorical_accuracy": CategoricalAccuracy, "precision": Precision, "recall": Recall, "f1": F1Score,
    "f1_score": F1Score,
}


def get(identifier, loss=None):
    """A metric from a name, an instance or a function ``fn(y_true, y_pred)`` (its mean over samples);
    "accuracy"/"acc" picks the variant matching `loss`."""
    if isinstance(identifier, Metric):
        return identifier
    if identifier in ("accuracy", "acc"):
        loss_name = getattr(loss, "name", "")
        if "binary" in loss_name:
            return BinaryAccuracy(name=identifier)
        if "sparse" in loss_name:
            return SparseCategoricalAccuracy(name=identifier)
        if "categorical" in loss_name:
            return CategoricalAccuracy(name=identifier)
        return Accuracy(name=identifier)
    if identifier in _ALIASES:
        return _ALIASES[identifier]()
    if callable(identifier):
        return MeanMetricWrapper(identifier)
    raise ValueError(f"Unknown metric {identifier!r}; expected 'accuracy' or one of {sorted(_ALIASES)}")


def corpus_bleu(references, hypotheses, max_n=4):
    """Corpus BLEU (Papineni et al., 2002) without smoothing, as NLTK's ``corpus_bleu``.

    Args:
        references: for each hypothesis, a list of reference token lists.
        hypotheses: token lists, one per sentence.
        max_n: longest n-gram (4: BLEU-4, uniform weights 1 / max_n).
    Returns:
        ``BP * exp(mean_n log p_n)`` in [0, 1], where p_n is the clipped n-gram precision summed
        over the corpus and BP = exp(1 - r / c) when the hypotheses' total length c is below r,
        the sum of the reference lengths closest to each hypothesis' length (ties: the shorter).
        0 when some p_n is 0.
    """
    from collections import Counter

    references, hypotheses = list(references), list(hypotheses)
    if len(references) != len(hypotheses):
        raise ValueError(f"corpus_bleu: {len(references)} reference lists but {len(hypotheses)} hypotheses")
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
        raise ValueError(f"corpus_bleu: max_n must be a positive integer, got {max_n!r}")
    matches, totals = [0] * max_n, [0] * max_n
    hyp_len = ref_len = 0
    for refs, hyp in zip(references, hypotheses):
        if isinstance(hyp, str) or not refs or any(isinstance(r, str) for r in refs):
            raise TypeError("corpus_bleu: hypotheses are token lists and references lists of token lists")
        hyp_len += len(hyp)
        ref_len += min((abs(len(r) - len(hyp)), len(r)) for r in refs)[1]
        for n in range(1, max_n + 1):
            grams = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
            most = Counter()
            for r in refs:  # clip each n-gram's count by its largest count in one reference
                most |= Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, most[g]) for g, c in grams.items())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    if hyp_len == 0 or min(matches) == 0:
        return 0.0
    log_precision = sum(np.log(m / t) for m, t in zip(matches, totals)) / max_n
    brevity = 1.0 if hyp_len > ref_len else float(np.exp(1 - ref_len / hyp_len))
    return float(brevity * np.exp(log_precision))
