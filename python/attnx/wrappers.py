"""scikit-learn estimators around attnx models, with Keras 3's names and arguments: `SKLearnClassifier`,
`SKLearnRegressor` (usable in `GridSearchCV`, `Pipeline`, `cross_val_score`, `sklearn.clone`).

    def make_model(X, y, hidden=16):
        model = attnx.Sequential([attnx.layers.Dense(hidden, activation="relu"),
                                  attnx.layers.Dense(y.shape[1], activation="softmax")])
        model.compile("adam", "categorical_crossentropy")
        return model

    clf = attnx.wrappers.SKLearnClassifier(make_model, model_kwargs={"hidden": 8}, fit_kwargs={"epochs": 20})
    GridSearchCV(clf, {"model_kwargs": [{"hidden": 4}, {"hidden": 16}]}, cv=3).fit(X, y)

Needs scikit-learn (imported with this module).
"""
import os
import tempfile

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_array, check_is_fitted, check_X_y

from .models import Model


def _clone(model):
    """A copy of a compiled model with its weights (its config, compile settings and weights, through the
    .attnx format)."""
    from .models import load_model
    if not model.compiled:
        raise ValueError("SKLearnClassifier / SKLearnRegressor: the model must be compiled (Keras' rule)")
    if not (model.built and model.params):
        raise ValueError("SKLearnClassifier / SKLearnRegressor: a model given as an instance must have its weights "
                         "(give its first layer input_shape, or an attnx.Input); or pass a function making the model")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.attnx")
        model.save(path)
        return load_model(path)


class _SKLearnBase(BaseEstimator):
    """What the two estimators share (Keras' SKLBase).

    Args:
        model: a compiled attnx Model (copied, weights and all, before each fit unless `warm_start`), or a function
            ``model(X=..., y=..., **model_kwargs)`` returning a compiled model; y is as the model trains on
            (a classifier's one-hot rows, a regressor's 2-D targets).
        warm_start: keep training the model of the previous fit.
        model_kwargs: keyword arguments of `model` when it is a function.
        fit_kwargs: keyword arguments of ``Model.fit`` (epochs, batch_size, ...); `fit`'s own keyword
            arguments take precedence.

    Attributes after `fit`: ``model_`` (the trained model), ``history_`` (its History's dict),
    ``n_features_in_``.
    """

    def __init__(self, model, warm_start=False, model_kwargs=None, fit_kwargs=None):
        self.model = model
        self.warm_start = warm_start
        self.model_kwargs = model_kwargs
        self.fit_kwargs = fit_kwargs

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = True
        return tags

    def _new_model(self, X, y):
        if self.warm_start and hasattr(self, "model_"):
            return self.model_
        if isinstance(self.model, Model):
            model = _clone(self.model)
        elif callable(self.model):
            model = self.model(X=X, y=y, **(self.model_kwargs or {}))
        else:
            raise TypeError(f"{type(self).__name__}: model must be an attnx Model or a function returning one, got "
                            f"{type(self.model).__name__}")
        if not isinstance(model, Model) or not model.compiled:
            raise ValueError(f"{type(self).__name__}: model must be a compiled attnx Model (call compile before "
                             f"returning it), got {type(model).__name__}")
        return model

    def fit(self, X, y, **kwargs):
        """Trains a new model (or the previous one with `warm_start`) on X (n_samples, n_features) and y."""
        X, y = check_X_y(X, y, multi_output=True, dtype=np.float32, y_numeric=isinstance(self, RegressorMixin))
        targets = self._targets(y, reset=True)
        model = self._new_model(X, targets)
        self.n_features_in_ = X.shape[1]
        self.history_ = model.fit(X, targets, **{**(self.fit_kwargs or {}), "verbose": 0, **kwargs}).history
        self.model_ = model
        return self

    def _checked(self, X):
        check_is_fitted(self)
        X = check_array(X, dtype=np.float32)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"{type(self).__name__}: X has {X.shape[1]} features, but the estimator was fitted with "
                             f"{self.n_features_in_}")
        return X


class SKLearnClassifier(ClassifierMixin, _SKLearnBase):
    """A scikit-learn classifier (Keras' SKLearnClassifier): the model trains on one-hot targets (one column
    per class of ``classes_``, sorted) and `predict` gives the class of the largest output. Arguments as
    `_SKLearnBase`'s."""

    def _targets(self, y, reset=False):
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise ValueError(f"SKLearnClassifier: expects one label per sample, got targets of shape {y.shape}")
        if reset:
            self.classes_ = np.unique(y)
            if len(self.classes_) < 2:
                raise ValueError("SKLearnClassifier: the targets hold a single class; a classifier needs two or more")
        return (y[:, None] == self.classes_[None, :]).astype(np.float32)

    def decision_function(self, X):
        """The model's raw outputs, one column per class."""
        X = self._checked(X)  # before self.model_ is read: NotFittedError, as scikit-learn says it
        return self.model_.predict(X)

    def predict_proba(self, X):
        return self.decision_function(X)

    def predict(self, X):
        scores = self.decision_function(X)  # checks that the estimator was fitted
        return self.classes_[np.argmax(scores, axis=1)]


class SKLearnRegressor(RegressorMixin, _SKLearnBase):
    """A scikit-learn regressor (Keras' SKLearnRegressor): the model trains on 2-D targets; `predict`
    gives them in the shape `fit` was given (1-D for 1-D targets). Arguments as `_SKLearnBase`'s."""

    def _targets(self, y, reset=False):
        y = np.asarray(y, dtype=np.float32)
        if reset:
            self._one_target = y.ndim == 1
        return y[:, None] if y.ndim == 1 else y

    def predict(self, X):
        X = self._checked(X)  # before self.model_ is read: NotFittedError, as scikit-learn says it
        out = self.model_.predict(X)
        return out.reshape(len(out)) if self._one_target and out.ndim == 2 and out.shape[1] == 1 else out
