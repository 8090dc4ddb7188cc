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
        if sample_weight is None and mask is None:  # every value weighs 1 (a training step's usual case)
            # an accuracy's hits are bools: their count is the float64 sum of ones, exactly, in one pass
            hits = np.count_nonzero(values) if values.dtype == bool else np.sum(values.astype(np.float64, copy=False))
            self.total += float(hits)
            self.count += float(values.size)
            return
        weights = np.ones(values.shape, dtype=np.float64)
        for extra in (sample_weight, mask):
            if extra is not None:
                e = np.asarray(extra, dtype=np.float64)
                weights = weights * e.reshape(e.shape + (1,) * (values.ndim - e.ndim))
        self.total += float(np.sum(values * weights))
        self.count += float(np.sum(np.broadcast_to(weights, values.shape)))

    def _values(self, y_true, y_pred):
        """Each prediction's value (bools for a hit or miss: weighed as 0 / 1)."""
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
        return (y_pred > self.threshold) == (y_true > 0.5)


class SparseCategoricalAccuracy(Metric):
    def __init__(self, name="sparse_categorical_accuracy"):
        super().__init__(name)

    def _values(self, y_true, y_pred):
        if y_true.shape == y_pred.shape[:-1] + (1,):
            y_true = y_true.reshape(y_pred.shape[:-1])
        if y_true.shape != y_pred.shape[:-1]:
            raise ValueError(f"{self.name}: labels shape {y_true.shape} does not match predictions {y_pred.shape}")
        return np.argmax(y_pred, axis=-1) == y_true


class CategoricalAccuracy(Metric):
    def __init__(self, name="categorical_accuracy"):
        super().__init__(name)

    def _values(self, y_true, y_pred):
        if y_true.shape != y_pred.shape:
            raise ValueError(f"{self.name}: y_true shape {y_true.shape} does not match y_pred shape {y_pred.shape}")
        return np.argmax(y_pred, axis=-1) == np.argmax(y_true, axis=-1)


class Accuracy(Metric):
    """Exact match of values."""

    def __init__(self, name="accuracy"):
        super().__init__(name)

    def _values(self, y_true, y_pred):
        y_true, y_pred = _match_binary(y_true, y_pred)
        return y_true == y_pred


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


class AUC(Metric):
    """Area under the ROC or the precision-recall curve (Keras' `AUC`), from weighted confusion counts at
    `num_thresholds` thresholds: a prediction above a threshold is positive, a label other than 0 is.

    Args:
        num_thresholds: Keras' default 200: 0 - 1e-7, (i + 1) / (num_thresholds - 1) for i < num_thresholds - 2,
            and 1 + 1e-7.
        curve: "ROC" (true positive rate over false positive rate) or "PR" (precision over recall).
        summation_method: "interpolation" (trapezoids; for PR Davis & Goadrich's interpolation), "minoring" or
            "majoring" (the lower or upper Riemann sum).
        thresholds: explicit thresholds in [0, 1] instead of num_thresholds (Keras adds the two end ones).
        from_logits: predictions are logits (a sigmoid is applied first).
    """

    state_names = ("true_positives", "false_positives", "true_negatives", "false_negatives")

    def __init__(self, num_thresholds=200, curve="ROC", summation_method="interpolation", name=None,
                 thresholds=None, from_logits=False):
        curve, summation_method = str(curve).upper(), str(summation_method).lower()
        if curve not in ("ROC", "PR"):
            raise ValueError(f'AUC: Invalid AUC curve value: "{curve}". Expected values are ["PR", "ROC"]')
        if summation_method not in ("interpolation", "minoring", "majoring"):
            raise ValueError(f'AUC: Invalid AUC summation method value: "{summation_method}". Expected values are '
                             '["interpolation", "majoring", "minoring"]')
        epsilon = 1e-7
        if thresholds is not None:
            inner = sorted(float(t) for t in np.ravel(thresholds))
            if any(not 0.0 <= t <= 1.0 for t in inner):
                raise ValueError(f"AUC: thresholds must be in [0, 1], got {list(thresholds)}")
        else:
            if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, (int, np.integer)) or \
                    num_thresholds <= 1:
                raise ValueError(f"AUC: Argument `num_thresholds` must be an integer > 1. Received: "
                                 f"num_thresholds={num_thresholds!r}")
            inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.thresholds = np.array([0.0 - epsilon] + inner + [1.0 + epsilon])
        self.num_thresholds = len(self.thresholds)
        self.curve, self.summation_method, self.from_logits = curve, summation_method, bool(from_logits)
        super().__init__(name or "auc")

    def reset_state(self):
        for n in self.state_names:
            setattr(self, n, np.zeros(self.num_thresholds))

    def update_state(self, y_true, y_pred, sample_weight=None, mask=None):
        y_true, y_pred = _match_binary(np.asarray(y_true), np.asarray(y_pred, dtype=np.float64))
        if self.from_logits:
            y_pred = 1.0 / (1.0 + np.exp(-y_pred))
        w = np.ones(y_true.shape)
        for extra in (sample_weight, mask):
            if extra is not None:
                e = np.asarray(extra, dtype=np.float64)
                w = w * e.reshape(e.shape + (1,) * (y_true.ndim - e.ndim))
        w, true, pred = w.reshape(-1), y_true.reshape(-1) != 0, y_pred.reshape(-1)
        above = pred[None, :] > self.thresholds[:, None]  # (thresholds, values)
        self.true_positives += (above & true) @ w
        self.false_positives += (above & ~true) @ w
        self.true_negatives += (~above & ~true) @ w
        self.false_negatives += (~above & true) @ w

    def result(self):
        tp, fp, tn, fn = (np.asarray(getattr(self, n), dtype=np.float64) for n in self.state_names)
        if self.curve == "PR" and self.summation_method == "interpolation":
            return self._interpolated_pr_auc(tp, fp, fn)
        recall = _divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = _divide_no_nan(fp, fp + tn), recall
        else:
            x, y = recall, _divide_no_nan(tp, tp + fp)
        heights = {"interpolation": (y[:-1] + y[1:]) / 2, "minoring": np.minimum(y[:-1], y[1:]),
                   "majoring": np.maximum(y[:-1], y[1:])}[self.summation_method]
        return float(np.sum((x[:-1] - x[1:]) * heights))

    @staticmethod
    def _interpolated_pr_auc(tp, fp, fn):
        """Davis & Goadrich (2006): precision interpolated between thresholds along the true positives."""
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        dp = p[:-1] - p[1:]
        slope = _divide_no_nan(dtp, np.maximum(dp, 0))
        intercept = tp[1:] - slope * p[1:]
        both = (p[:-1] > 0) & (p[1:] > 0)
        ratio = np.where(both, _divide_no_nan(p[:-1], np.maximum(p[1:], 0)), 1.0)
        return float(np.sum(_divide_no_nan(slope * (dtp + intercept * np.log(ratio)), np.maximum(tp[1:] + fn[1:], 0))))


def _divide_no_nan(a, b):
    """a / b, and 0 where b is 0."""
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b != 0)


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


def _loss_values(loss_class, name):
    """Keras' metric of a loss's name: the mean of the loss's per-sample values, logged under `name`."""
    def make():
        from . import losses  # on first use: metrics import nothing of attnx at import time
        loss = getattr(losses, loss_class)(reduction="none")
        return MeanMetricWrapper(lambda y_true, y_pred: loss(y_true, np.asarray(y_pred, dtype=np.float64)), name=name)
    return make


_ALIASES = {
    **{name: _loss_values("MeanAbsoluteError", name) for name in ("mae", "mean_absolute_error")},
    **{name: _loss_values("MeanSquaredError", name) for name in ("mse", "mean_squared_error")},
    "huber": _loss_values("Huber", "huber"), "kl_divergence": _loss_values("KLDivergence", "kl_divergence"),
    "binary_accuracy": BinaryAccuracy, "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "categorical_accuracy": CategoricalAccuracy, "precision": Precision, "recall": Recall, "f1": F1Score,
    "f1_score": F1Score, "auc": AUC,
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


_SMOOTHING = (None, "floor", "exp")


def corpus_bleu(references, hypotheses, max_n=4, smoothing=None):
    """Corpus BLEU (Papineni et al., 2002) of token lists, equal to NLTK's ``corpus_bleu`` (uniform
    weights) with the matching smoothing function.

    Args:
        references: for each hypothesis, a list of reference token lists.
        hypotheses: token lists, one per sentence.
        max_n: longest n-gram (4: BLEU-4, weights 1 / max_n).
        smoothing: of n-gram precisions without a match (sacreBLEU's names): None (NLTK's
            ``method0``: the score is 0), "floor" (``method1``: 0.1 matches instead of 0) or
            "exp" (``method3``, NIST's and sacreBLEU's default: 1 / 2^k of the n-gram count, k = 1
            for the first such n, 2 for the next...).

    Returns:
        ``BP * exp(mean_n log p_n)`` in [0, 1], where p_n is the clipped n-gram precision summed
        over the corpus (each sentence counting at least one n-gram in the denominator, as NLTK
        does) and BP = exp(1 - r / c) when the hypotheses' total length c is below r, the sum of the
        reference lengths closest to each hypothesis' length (ties: the shorter). 0 when no
        unigram matches (NLTK returns ~1e-77 where a higher order has no match without smoothing;
        attnx returns 0).
    """
    from collections import Counter

    references, hypotheses = list(references), list(hypotheses)
    if len(references) != len(hypotheses):
        raise ValueError(f"corpus_bleu: {len(references)} reference lists but {len(hypotheses)} hypotheses")
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
        raise ValueError(f"corpus_bleu: max_n must be a positive integer, got {max_n!r}")
    if smoothing not in _SMOOTHING:
        raise ValueError(f"corpus_bleu: smoothing must be one of {_SMOOTHING}, got {smoothing!r}")
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
            totals[n - 1] += max(len(hyp) - n + 1, 1)  # NLTK's denominator: at least 1 per sentence
    if hyp_len == 0 or matches[0] == 0:
        return 0.0
    precisions, k = [], 1
    for m, t in zip(matches, totals):
        if m:
            precisions.append(m / t)
        elif smoothing == "floor":
            precisions.append(0.1 / t)
        elif smoothing == "exp":
            precisions.append(1.0 / (2 ** k * t))
            k += 1
        else:
            return 0.0
    log_precision = sum(np.log(p) for p in precisions) / max_n
    brevity = 1.0 if hyp_len > ref_len else float(np.exp(1 - ref_len / hyp_len))
    return float(brevity * np.exp(log_precision))


class BleuScore(float):
    """A BLEU score in [0, 1] (a float, so existing arithmetic keeps working) that says which scorer
    computed it: ``scorer`` is "sacrebleu" or "attnx", ``signature`` sacreBLEU's signature (which
    tokenizer and smoothing) or attnx's formula."""

    def __new__(cls, value, scorer, signature):
        score = super().__new__(cls, value)
        score.scorer, score.signature = scorer, signature
        return score

    def __repr__(self):
        return f"BleuScore({float(self):.4f}, scorer={self.scorer!r}, signature={self.signature!r})"

    def __str__(self):
        return f"BLEU {100 * float(self):.2f} ({self.scorer}: {self.signature})"


def bleu_score(references, hypotheses, scorer="auto"):
    """Corpus BLEU-4 of tokenized sentences, reported by sacreBLEU when it is installed.

    Args:
        references: for each hypothesis, a list of reference token lists (the same number for
            every hypothesis with sacreBLEU).
        hypotheses: token lists.
        scorer: "sacrebleu" (the `sacrebleu` package's ``corpus_bleu`` on the tokens joined by
            spaces, its defaults: 13a tokenization, "exp" smoothing: the score papers report),
            "attnx" (`corpus_bleu`, NLTK's formula on the tokens as given, no smoothing), or
            "auto" (default): sacreBLEU if installed, else attnx.

    Returns:
        A `BleuScore`: a float in [0, 1] with ``scorer`` and ``signature`` saying how it was computed.
    """
    if scorer not in ("auto", "sacrebleu", "attnx"):
        raise ValueError(f"bleu_score: scorer must be 'auto', 'sacrebleu' or 'attnx', got {scorer!r}")
    references, hypotheses = list(references), list(hypotheses)
    if scorer == "auto":
        try:
            import sacrebleu  # noqa: F401
            scorer = "sacrebleu"
        except ImportError:
            scorer = "attnx"
    if scorer == "attnx":
        return BleuScore(corpus_bleu(references, hypotheses), "attnx", "corpus_bleu: NLTK's formula, max_n=4, "
                                                                        "no smoothing")
    from sacrebleu.metrics import BLEU

    if len(references) != len(hypotheses):
        raise ValueError(f"bleu_score: {len(references)} reference lists but {len(hypotheses)} hypotheses")
    counts = {len(refs) for refs in references}
    if len(counts) > 1:
        raise ValueError(f"bleu_score: sacreBLEU needs the same number of references for every hypothesis, got "
                         f"{sorted(counts)}")
    streams = [[" ".join(refs[i]) for refs in references] for i in range(counts.pop() if counts else 0)]
    metric = BLEU()
    result = metric.corpus_score([" ".join(h) for h in hypotheses], streams)
    return BleuScore(result.score / 100, "sacrebleu", str(metric.get_signature()))
