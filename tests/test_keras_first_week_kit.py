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


# ---- PyDataset, Sequence-like objects, DataLoader lists ---------------------------------------------------------

def _regression(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype("float32")


class _Batches(attnx.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size
        self.epochs_ended = 0

    def __len__(self):
        return int(np.ceil(len(self.x) / self.batch_size))

    def __getitem__(self, i):
        rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.epochs_ended += 1


class _SequenceLike:  # Keras 2's Sequence by duck type: no base class
    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return int(np.ceil(len(self.x) / self.batch_size))

    def __getitem__(self, i):
        return self.x[i * self.batch_size:(i + 1) * self.batch_size], self.y[i * self.batch_size:(i + 1) * self.batch_size]


def _model(seed=0):
    attnx.set_random_seed(seed)
    model = attnx.Sequential([layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=attnx.optimizers.SGD(0.05), loss="mse")
    return model


@pytest.mark.parametrize("make", [lambda x, y: _Batches(x, y, 8), lambda x, y: _SequenceLike(x, y, 8)])
def test_a_sequence_of_batches_trains_as_the_arrays_do(make):
    x, y = _regression()
    a, b = _model(), _model()
    ha = a.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    data = make(x, y)
    hb = b.fit(data, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(hb.history["loss"], ha.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(b.evaluate(data, verbose=0), a.evaluate(x, y, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(b.predict(data, verbose=0), a.predict(x, verbose=0), rtol=1e-6)
    if isinstance(data, _Batches):
        assert data.epochs_ended == 3 + 1 + 1  # after each pass of fit, evaluate and predict, as Keras


def test_a_pydataset_is_shuffled_by_batch_as_keras_does():
    x, y = _regression()
    seen = []

    class Recording(_Batches):
        def __getitem__(self, i):
            seen.append(i)
            return super().__getitem__(i)
    _model().fit(Recording(x, y, 8), epochs=2, verbose=0)  # fit's shuffle=True
    assert sorted(seen[:4]) == sorted(seen[4:]) == [0, 1, 2, 3]
    assert seen[:4] != seen[4:] or seen[:4] != [0, 1, 2, 3]


def test_pydataset_matches_keras_pydataset_training():
    x, y = _regression()
    ours = _model()

    class KerasBatches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]
    theirs = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    theirs.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    ours.set_weights([np.asarray(w) for w in theirs.get_weights()])
    hk = theirs.fit(KerasBatches(), epochs=3, shuffle=False, verbose=0)
    ha = ours.fit(_Batches(x, y, 8), epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(ha.history["loss"], hk.history["loss"], rtol=1e-5)


def test_pydataset_base_names_what_to_implement():
    with pytest.raises(NotImplementedError, match="__len__"):
        len(attnx.utils.PyDataset())
    assert attnx.utils.Sequence is attnx.utils.PyDataset


def test_torch_dataloader_batches_as_lists():
    torch = pytest.importorskip("torch")
    x, y = _regression()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y)),
                                         batch_size=8)
    assert isinstance(next(iter(loader)), list)  # [x, y]: the default collate
    a, b = _model(), _model()
    ha = a.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    hb = b.fit(loader, epochs=2, verbose=0)
    np.testing.assert_allclose(hb.history["loss"], ha.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(b.evaluate(loader, verbose=0), a.evaluate(x, y, verbose=0), rtol=1e-6)
    # predict reads [x, y] as (x, y) too, as Keras 3 does, and predicts x
    np.testing.assert_allclose(b.predict(loader, verbose=0), b.predict(x, verbose=0), rtol=1e-6)


# ---- dict inputs -----------------------------------------------------------------------------------------------

def test_dict_inputs_fit_predict_and_round_trip(tmp_path):
    ia, ib = attnx.Input((3,), name="first"), attnx.Input((2,), name="second")
    merged = layers.Concatenate()([layers.Dense(4)(ia), ib])
    model = attnx.Model(inputs={"a": ia, "b": ib}, outputs=layers.Dense(1)(merged))
    rng = np.random.default_rng(0)
    data = {"a": rng.standard_normal((16, 3)).astype("float32"), "b": rng.standard_normal((16, 2)).astype("float32")}
    y = rng.standard_normal((16, 1)).astype("float32")
    model.compile(optimizer="adam", loss="mse")
    model.fit(data, y, batch_size=4, epochs=1, verbose=0)
    out = model.predict(data, verbose=0)
    np.testing.assert_allclose(out, model.predict([data["a"], data["b"]], verbose=0), rtol=1e-6)
    np.testing.assert_allclose(out, model(data), rtol=1e-6)
    with pytest.raises(ValueError, match=r"missing inputs \['b'\]"):
        model.predict({"a": data["a"]}, verbose=0)
    model.save(tmp_path / "m.attnx")
    back = attnx.load_model(tmp_path / "m.attnx")
    np.testing.assert_allclose(back.predict(data, verbose=0), out, rtol=1e-6)

    # Keras takes the same dict and gives the same numbers on the same weights
    ka, kb = keras.Input((3,), name="first"), keras.Input((2,), name="second")
    kmerged = keras.layers.Concatenate()([keras.layers.Dense(4)(ka), kb])
    kmodel = keras.Model(inputs={"a": ka, "b": kb}, outputs=keras.layers.Dense(1)(kmerged))
    kmodel.set_weights(model.get_weights())
    np.testing.assert_allclose(kmodel.predict(data, verbose=0), out, rtol=1e-5, atol=1e-6)


# ---- class_weight with sample_weight ------------------------------------------------------------------------

def test_class_weight_with_sample_weight_is_refused_as_keras_3_does():
    x, y = _regression(8)
    labels = (y > 0).astype("float32")
    theirs = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    theirs.compile(optimizer="sgd", loss="binary_crossentropy")
    with pytest.raises(ValueError, match="class_weight.*sample_weight"):
        theirs.fit(x, labels, sample_weight=np.ones(8), class_weight={0: 1.0, 1: 2.0}, verbose=0)
    ours = attnx.Sequential([layers.Dense(1, activation="sigmoid", input_shape=(3,))])
    ours.compile(optimizer="sgd", loss="binary_crossentropy")
    with pytest.raises(ValueError, match="class_weight.*sample_weight"):
        ours.fit(x, labels, sample_weight=np.ones(8), class_weight={0: 1.0, 1: 2.0}, verbose=0)


# ---- summary of a subclassed model ---------------------------------------------------------------------------

class MyModel(attnx.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = layers.Dense(4)
        self.out = layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x))


def test_subclassed_summary_names_the_class_and_shows_shapes_after_a_call():
    model = MyModel()
    assert model.name.startswith("my_model")
    before = []
    model.summary(print_fn=before.append)
    assert any("?" in line for line in before)
    model(np.zeros((3, 5), "float32"))
    lines = []
    model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert f'Model: "{model.name}"' in text
    assert "(None, 4)" in text and "(None, 2)" in text and "?" not in text
    assert "Total params: 34" in text
    assert "forward" not in vars(model.hidden)  # summary's recording call leaves nothing on the layers


# ---- plot_model -----------------------------------------------------------------------------------------------

def _functional():
    inputs = attnx.Input((4,), name="x")
    hidden = layers.Dense(3, name="hidden")(inputs)
    return attnx.Model(inputs, layers.Dense(1, name="out")(hidden))


def test_plot_model_writes_the_graph_with_pydot(tmp_path):
    pydot = pytest.importorskip("pydot")
    path = tmp_path / "model.dot"
    attnx.utils.plot_model(_functional(), to_file=path, show_shapes=True)
    (graph,) = pydot.graph_from_dot_file(str(path))
    labels = sorted(n.get_label().strip('"') for n in graph.get_nodes() if n.get_label())
    assert labels == ["hidden (Dense)|(None, 3)", "out (Dense)|(None, 1)", "x (InputLayer)|(None, 4)"]
    assert len(graph.get_edges()) == 2


def test_plot_model_without_pydot_names_the_package(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_pydot(name, *args, **kwargs):
        if name == "pydot":
            raise ImportError("No module named 'pydot'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_pydot)
    with pytest.raises(ImportError, match=r"pip install pydot"):
        attnx.utils.plot_model(_functional(), to_file="unused.png")


def test_plot_model_without_graphviz_names_graphviz(tmp_path, monkeypatch):
    pytest.importorskip("pydot")
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` program on the path
    with pytest.raises(ImportError, match="graphviz"):
        attnx.utils.plot_model(_functional(), to_file=tmp_path / "model.png")


# ---- the kernel-layer arguments: one helper for Dense, Conv1D, Conv2D ---------------------------------------------

_KERNEL_LAYERS = [(lambda **kw: layers.Dense(3, **kw), (4, 5)),
                  (lambda **kw: layers.Conv1D(3, 2, **kw), (4, 6, 5)),
                  (lambda **kw: layers.Conv2D(3, (2, 2), **kw), (4, 5, 5, 2))]


@pytest.mark.parametrize("make, shape", _KERNEL_LAYERS)
def test_kernel_layers_share_the_argument_block_and_match_keras_after_a_step(make, shape):
    from attnx import constraints, interop, regularizers
    kwargs = dict(activation="relu", kernel_regularizer=regularizers.L2(0.01), bias_regularizer=regularizers.L1(0.1),
                  kernel_constraint=constraints.MaxNorm(0.4, axis=0), bias_constraint="non_neg")
    layer = make(**kwargs)
    config = layer.get_config()
    assert {"activation", "use_bias", "kernel_initializer", "bias_initializer", "kernel_regularizer",
            "bias_regularizer", "kernel_constraint", "bias_constraint"} <= set(config)
    assert type(layer).from_config(config).get_config() == config
    inputs = attnx.Input(shape[1:])
    model = attnx.Model(inputs, layers.Flatten()(layer(inputs)))
    model.compile(optimizer=attnx.optimizers.SGD(0.5), loss="mse")
    kmodel = interop.to_keras(model)
    klayer = kmodel.layers[1]
    assert type(klayer.kernel_constraint).__name__ == "MaxNorm" and type(klayer.bias_constraint).__name__ == "NonNeg"
    kmodel.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    y = rng.standard_normal((shape[0],) + model.outputs[0].shape[1:]).astype("float32")
    model.fit(x, y, batch_size=shape[0], epochs=2, shuffle=False, verbose=0)
    kmodel.fit(x, y, batch_size=shape[0], epochs=2, shuffle=False, verbose=0)
    for a, k in zip(model.get_weights(), kmodel.get_weights()):
        np.testing.assert_allclose(a, np.asarray(k), rtol=1e-4, atol=1e-5)
    assert np.all(model.get_weights()[1] >= 0)


_AUC_WORKER = '''
import json, sys
import numpy as np
import attnx
from attnx import layers
dist = attnx.distributed.DataParallel() if sys.argv[1] == "dist" else None
attnx.set_random_seed(0)
rng = np.random.default_rng(1)
x = rng.standard_normal((96, 4)).astype("float32")
y = (x[:, :1] + 0.5 * rng.standard_normal((96, 1)) > 0).astype("float32")
model = attnx.Sequential([layers.Dense(1, activation="sigmoid", input_shape=(4,))])
model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["auc"], distribute=dist)
result = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
if dist is None or dist.rank == 0:
    print(json.dumps(result))
'''


def test_auc_sums_its_threshold_counts_over_data_parallel_ranks(tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec (pip install mpich) is not installed")
    script = tmp_path / "worker.py"
    script.write_text(_AUC_WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, str(script), "one"], capture_output=True, text=True, env=env, timeout=300)
    two = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script), "dist"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    single, ranks = json.loads(one.stdout.strip().splitlines()[-1]), json.loads(two.stdout.strip().splitlines()[-1])
    assert ranks["auc"] == pytest.approx(single["auc"], rel=1e-9)
    assert 0.5 < single["auc"] <= 1.0
