"""`attnx.wrappers.SKLearnClassifier` / `SKLearnRegressor` (Keras 3's names): scikit-learn's parameter
protocol, clone, GridSearchCV and Pipeline, and the predictions of the model inside."""
import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import attnx  # noqa: E402
from attnx import layers  # noqa: E402
from attnx.wrappers import SKLearnClassifier, SKLearnRegressor  # noqa: E402


def classifier_model(X, y, hidden=8):
    model = attnx.Sequential([layers.Dense(hidden, activation="tanh"), layers.Dense(y.shape[1], activation="softmax")])
    model.compile(attnx.optimizers.Adam(0.05), "categorical_crossentropy")
    return model


def regressor_model(X, y, hidden=8):
    model = attnx.Sequential([layers.Dense(hidden, activation="tanh"), layers.Dense(y.shape[1])])
    model.compile(attnx.optimizers.Adam(0.05), "mse")
    return model


def _blobs(n=90):
    rng = np.random.default_rng(0)
    y = np.repeat(["a", "b", "c"], n // 3)
    centers = {"a": (-2, 0), "b": (2, 0), "c": (0, 3)}
    X = np.array([centers[c] for c in y]) + 0.5 * rng.standard_normal((n, 2))
    return X, y


def test_classifier_fits_predicts_and_names_classes():
    X, y = _blobs()
    clf = SKLearnClassifier(classifier_model, fit_kwargs={"epochs": 30, "batch_size": 16})
    clf.fit(X, y)
    assert list(clf.classes_) == ["a", "b", "c"] and clf.n_features_in_ == 2
    assert clf.predict(X).dtype == y.dtype and clf.score(X, y) > 0.9
    assert clf.predict_proba(X).shape == (90, 3)
    assert len(clf.history_["loss"]) == 30


def test_get_params_set_params_and_clone():
    clf = SKLearnClassifier(classifier_model, model_kwargs={"hidden": 4}, fit_kwargs={"epochs": 2})
    params = clf.get_params()
    assert params["model"] is classifier_model and params["model_kwargs"] == {"hidden": 4}
    clf.set_params(warm_start=True, fit_kwargs={"epochs": 3})
    assert clf.warm_start and clf.fit_kwargs == {"epochs": 3}
    twin = clone(clf)
    assert twin.get_params()["fit_kwargs"] == {"epochs": 3} and not hasattr(twin, "model_")


def test_grid_search_and_pipeline():
    X, y = _blobs()
    search = GridSearchCV(SKLearnClassifier(classifier_model, fit_kwargs={"epochs": 10}),
                          {"model_kwargs": [{"hidden": 2}, {"hidden": 8}]}, cv=3)
    search.fit(X, y)
    assert search.best_params_["model_kwargs"]["hidden"] in (2, 8) and search.best_score_ > 0.5
    pipe = make_pipeline(StandardScaler(), SKLearnRegressor(regressor_model, fit_kwargs={"epochs": 40}))
    rng = np.random.default_rng(1)
    Xr = rng.standard_normal((60, 3))
    yr = Xr @ np.array([1.0, -2.0, 0.5])
    pipe.fit(Xr, yr)
    assert pipe.predict(Xr).shape == (60,) and pipe.score(Xr, yr) > 0.8


def test_warm_start_keeps_training_the_same_model():
    X, y = _blobs()
    clf = SKLearnClassifier(classifier_model, warm_start=True, fit_kwargs={"epochs": 2})
    clf.fit(X, y)
    first = clf.model_
    clf.fit(X, y)
    assert clf.model_ is first


def test_a_model_instance_is_copied():
    X, y = _blobs()
    model = classifier_model(X, np.zeros((1, 3)))
    with pytest.raises(ValueError, match="must have its weights"):
        SKLearnClassifier(model).fit(X, y)
    model.predict(X[:1])  # built
    before = model.get_weights()
    clf = SKLearnClassifier(model, fit_kwargs={"epochs": 2}).fit(X, y)
    assert clf.model_ is not model and clf.score(X, y) > 0.3
    for a, b in zip(model.get_weights(), before):  # the given model is not trained
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make,match", [
    (lambda: SKLearnClassifier(lambda X, y: attnx.Sequential([layers.Dense(3)])), "compiled attnx Model"),
    (lambda: SKLearnClassifier(3), "must be an attnx Model or a function"),
])
def test_bad_models_are_clear_errors(make, match):
    X, y = _blobs()
    with pytest.raises((TypeError, ValueError), match=match):
        make().fit(X, y)


def test_predict_before_fit_and_wrong_features():
    from sklearn.exceptions import NotFittedError
    X, y = _blobs()
    with pytest.raises(NotFittedError):
        SKLearnClassifier(classifier_model).predict(X)
    clf = SKLearnClassifier(classifier_model, fit_kwargs={"epochs": 1}).fit(X, y)
    with pytest.raises(ValueError, match="3 features"):
        clf.predict(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="single class"):
        SKLearnClassifier(classifier_model).fit(X, np.zeros(len(X)))
