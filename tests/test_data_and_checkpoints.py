"""`attnx.data.Dataset`, `attnx.train.Checkpoint` / `CheckpointManager` / `latest_checkpoint`, the ops a
tutorial uses, and `save_weights` into a new folder (issue 41)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnx
from attnx import layers, ops
from attnx.data import Dataset
from attnx.train import Checkpoint, CheckpointManager, latest_checkpoint

PYTHON_DIR = str(Path(attnx.__file__).resolve().parents[1])


# -------------------------------------------------------------------------------------- Dataset
def test_from_tensor_slices_batch_and_take():
    x, y = np.arange(10).reshape(10, 1), np.arange(10) * 2
    ds = Dataset.from_tensor_slices((x, y))
    assert len(ds) == 10
    first = next(iter(ds))
    assert isinstance(first, tuple) and first[0].shape == (1,) and first[1] == 0
    batches = list(ds.batch(4))
    assert [b[0].shape for b in batches] == [(4, 1), (4, 1), (2, 1)]
    assert len(ds.batch(4)) == 3 and len(ds.batch(4, drop_remainder=True)) == 2
    assert [b[0].shape for b in ds.batch(4, drop_remainder=True)] == [(4, 1), (4, 1)]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)
    assert [int(v) for v in Dataset.range(5).take(3)] == [0, 1, 2]
    assert len(ds.batch(4).take(2)) == 2 and len(list(ds.batch(4).take(2))) == 2
    assert [int(e[1]) for e in ds.skip(8)] == [16, 18]


def test_dicts_and_lists_as_tf_data_reads_them():
    ds = Dataset.from_tensor_slices({"a": np.zeros((3, 2)), "b": [1, 2, 3]}).batch(2)
    first = next(iter(ds))
    assert first["a"].shape == (2, 2) and first["b"].tolist() == [1, 2]
    assert len(Dataset.from_tensor_slices([1, 2, 3])) == 3  # a list is one array


def test_shuffle_is_a_permutation_reproducible_by_seed_and_new_each_pass():
    ds = Dataset.from_tensor_slices(np.arange(20)).shuffle(20, seed=3)
    first, second = [int(v) for v in ds], [int(v) for v in ds]
    assert sorted(first) == list(range(20)) and sorted(second) == list(range(20))
    assert first != list(range(20)) and first != second  # a new order each pass, as tf.data
    again = Dataset.from_tensor_slices(np.arange(20)).shuffle(20, seed=3)
    assert [int(v) for v in again] == first and [int(v) for v in again] == second
    fixed = Dataset.from_tensor_slices(np.arange(20)).shuffle(20, seed=3, reshuffle_each_iteration=False)
    assert [int(v) for v in fixed] == [int(v) for v in fixed]
    small = [int(v) for v in Dataset.from_tensor_slices(np.arange(20)).shuffle(2, seed=0)]
    assert sorted(small) == list(range(20))
    assert all(abs(v - i) <= 2 or v < i for i, v in enumerate(small))  # a buffer of 2 moves elements little


def test_shuffle_without_seed_follows_attnx_seed():
    def order():
        attnx.set_random_seed(7)
        return [int(v) for v in Dataset.from_tensor_slices(np.arange(10)).shuffle(10)]
    assert order() == order()


def test_map_unpacks_tuples():
    ds = Dataset.from_tensor_slices((np.arange(4), np.arange(4) * 10)).map(lambda a, b: (a + b, b))
    assert [(int(a), int(b)) for a, b in ds] == [(0, 0), (11, 10), (22, 20), (33, 30)]
    with pytest.raises(TypeError, match="map_func must be callable"):
        ds.map(3)


@pytest.mark.parametrize("call,match", [
    (lambda: Dataset.from_tensor_slices((np.zeros(3), np.zeros(4))), "different first axes"),
    (lambda: Dataset.from_tensor_slices(np.float32(1)), "scalar"),
    (lambda: Dataset.range(3).batch(0), "batch_size must be an integer >= 1"),
    (lambda: Dataset.range(3).shuffle(0), "buffer_size"),
    (lambda: Dataset.range(3).take(-2), "take count"),
])
def test_dataset_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_batch_of_ragged_elements_is_a_clear_error():
    ds = Dataset.range(3).map(lambda i: np.zeros(int(i) + 1)).batch(3)
    with pytest.raises(ValueError, match="different shapes"):
        list(ds)


def _model(seed=0):
    attnx.set_random_seed(seed)
    model = attnx.Sequential([layers.Dense(8, activation="tanh", input_shape=(3,)), layers.Dense(1)])
    model.compile("adam", "mse")
    return model


def test_fit_evaluate_predict_take_a_dataset():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 3)).astype("float32"), rng.standard_normal((40, 1)).astype("float32")
    ds = Dataset.from_tensor_slices((x, y)).batch(8)
    with_dataset, with_arrays = _model(), _model()
    h1 = with_dataset.fit(ds, epochs=3, verbose=0).history["loss"]
    h2 = with_arrays.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(h1, h2, rtol=1e-6)
    np.testing.assert_allclose(with_dataset.evaluate(ds, verbose=0), with_arrays.evaluate(x, y, verbose=0),
                               rtol=1e-6)
    np.testing.assert_allclose(with_dataset.predict(Dataset.from_tensor_slices(x).batch(8)),
                               with_arrays.predict(x), rtol=1e-6)
    shuffled = Dataset.from_tensor_slices((x, y)).shuffle(40, seed=1).batch(8, drop_remainder=True)
    assert len(_model().fit(shuffled, epochs=2, verbose=0).history["loss"]) == 2


# ------------------------------------------------------------------------------------------- ops
def test_tutorial_ops():
    a = np.array([[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]], np.float32)
    assert ops.zeros((2, 3)).dtype == np.float32 and ops.ones(3, dtype="int32").tolist() == [1, 1, 1]
    np.testing.assert_array_equal(ops.equal(a, 0), a == 0)
    np.testing.assert_array_equal(ops.not_equal(a, 0), a != 0)
    np.testing.assert_array_equal(ops.logical_and(a > 0, a < 4), (a > 0) & (a < 4))
    np.testing.assert_array_equal(ops.logical_or(a > 4, a == 1), (a > 4) | (a == 1))
    np.testing.assert_array_equal(ops.logical_not(a > 0), a <= 0)
    assert ops.argmax(a, axis=-1).tolist() == [2, 1] and ops.argmin(a, axis=1).tolist() == [1, 0]
    assert ops.argmax(a).dtype == np.int64 and int(ops.argmax(a)) == 4
    assert ops.cast(np.array([1.7, -1.7]), "int32").tolist() == [1, -1]
    assert ops.cast(a > 0, "float32").dtype == np.float32
    np.testing.assert_array_equal(ops.where(a > 0, a, -1.0), np.where(a > 0, a, -1))


def test_cast_keeps_the_gradient_of_floats():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with attnx.GradientTape() as tape:
        tape.watch(x)
        y = ops.sum(ops.square(ops.cast(x, "float64")) * ops.cast(ops.not_equal(x, 2.0), "float64"))
    g = tape.gradient(y, x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, [2.0, 0.0, 6.0])


# ----------------------------------------------------------------------------------- checkpoints
def _step(model, opt, x, y):
    with attnx.GradientTape() as tape:
        loss = ops.mean(ops.square(model(x, training=True) - y))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return float(ops.untraced(loss))


class Net(attnx.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layers.Dense(6, activation="tanh")
        self.norm = layers.BatchNormalization()
        self.out = layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.norm(self.hidden(x), training=training))


def test_checkpoint_restores_model_and_optimizer_and_continues_the_same(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 3)).astype("float32"), rng.standard_normal((16, 1)).astype("float32")
    attnx.set_random_seed(0)
    model, opt = Net(), attnx.optimizers.Adam(0.01)
    for _ in range(3):
        _step(model, opt, x, y)
    ckpt = Checkpoint(model=model, optimizer=opt)
    path = ckpt.save(str(tmp_path / "run" / "ckpt"))
    assert path == str(tmp_path / "run" / "ckpt-1") and os.path.isfile(path + ".attnx")
    assert latest_checkpoint(str(tmp_path / "run")) == path
    uninterrupted = [_step(model, opt, x, y) for _ in range(3)]

    attnx.set_random_seed(5)  # other initial weights
    fresh_model, fresh_opt = Net(), attnx.optimizers.Adam(0.01)
    status = Checkpoint(model=fresh_model, optimizer=fresh_opt).restore(latest_checkpoint(str(tmp_path / "run")))
    with pytest.raises(AssertionError, match="not restored yet"):
        status.assert_consumed()  # a subclassed model has no weights before its first call
    fresh_model(x)  # builds, then the deferred restore runs
    status.assert_consumed()
    assert fresh_opt.iterations == 3
    for a, b in zip(fresh_model.get_weights(), Checkpoint(model=model).model.get_weights()):
        assert a.shape == b.shape
    resumed = [_step(fresh_model, fresh_opt, x, y) for _ in range(3)]
    np.testing.assert_allclose(resumed, uninterrupted, rtol=1e-6)


def test_checkpoint_manager_keeps_the_newest(tmp_path):
    model = _model()
    model.predict(np.zeros((1, 3), np.float32))
    ckpt = Checkpoint(model=model, optimizer=model.optimizer)
    manager = CheckpointManager(ckpt, str(tmp_path / "ckpts"), max_to_keep=2)
    assert manager.latest_checkpoint is None and manager.restore_or_initialize() is None
    paths = [manager.save() for _ in range(4)]
    assert manager.checkpoints == paths[-2:] and manager.latest_checkpoint == paths[-1]
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["checkpoint", "ckpt-3.attnx", "ckpt-4.attnx"]
    again = Checkpoint(model=_model(1), optimizer=attnx.optimizers.Adam())
    again.restore(manager.latest_checkpoint)
    assert again.save_counter == 4  # the next save is ckpt-5, as TensorFlow counts


def test_checkpoint_refuses_what_does_not_match(tmp_path):
    model = _model()
    model.predict(np.zeros((1, 3), np.float32))
    path = Checkpoint(model=model).save(str(tmp_path / "c"))
    with pytest.raises(ValueError, match="holds the layer or model 'model'"):
        Checkpoint(other=_model()).restore(path)
    other = attnx.Sequential([layers.Dense(2, input_shape=(3,))])
    with pytest.raises(ValueError, match="holds 4 weights"):
        Checkpoint(model=other).restore(path)
    with pytest.raises(TypeError, match="must be an attnx layer, model or optimizer"):
        Checkpoint(model="m")
    (tmp_path / "checkpoint").write_text(json.dumps({"checkpoints": ["../../etc/passwd"]}))
    with pytest.raises(ValueError, match="not a checkpoint index"):
        latest_checkpoint(str(tmp_path))
    (tmp_path / "bad.attnx").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="bad.attnx"):
        Checkpoint(model=model).restore(str(tmp_path / "bad"))


def test_restore_none_does_nothing():
    Checkpoint(model=_model()).restore(None).assert_consumed()


def test_save_weights_creates_its_folder(tmp_path):
    model = _model()
    model.predict(np.zeros((1, 3), np.float32))
    path = tmp_path / "new" / "folder" / "w.attnx"
    model.save_weights(str(path))
    other = _model(3)
    other.predict(np.zeros((1, 3), np.float32))
    other.load_weights(str(path))
    for a, b in zip(model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)


RESUME_SCRIPT = r"""
import sys
import numpy as np
import attnx
from attnx import layers
from attnx.data import Dataset
from attnx.train import Checkpoint, latest_checkpoint

folder, mode = sys.argv[1], sys.argv[2]
attnx.set_random_seed(0)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((48, 3)).astype("float32"), rng.standard_normal((48, 1)).astype("float32")
data = Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
model = attnx.Sequential([layers.Dense(8, activation="tanh", input_shape=(3,)), layers.Dense(1)])
model.compile(attnx.optimizers.Adam(0.01), "mse")
checkpoint = Checkpoint(model=model, optimizer=model.optimizer)
if mode == "first":
    model.fit(data, epochs=2, verbose=0)
    checkpoint.save(folder + "/ckpt")
    losses = model.fit(data, epochs=2, verbose=0).history["loss"]
else:
    checkpoint.restore(latest_checkpoint(folder)).assert_consumed()
    losses = model.fit(data, epochs=2, verbose=0).history["loss"]
print(repr(losses))
"""


def test_a_fresh_process_resumes_from_a_checkpoint_to_the_same_losses(tmp_path):
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR}
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    runs = {}
    for mode in ("first", "resumed"):
        out = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpts"), mode], env=env, check=True,
                             capture_output=True, text=True, timeout=300)
        runs[mode] = eval(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(runs["resumed"], runs["first"], rtol=1e-7)


def test_load_weights_before_the_model_is_built_is_deferred(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype("float32")
    attnx.set_random_seed(0)
    trained = Net()
    trained(x)
    trained.save_weights(str(tmp_path / "w.attnx"))
    attnx.set_random_seed(9)
    fresh = Net()
    fresh.load_weights(str(tmp_path / "w.attnx"))  # no weights yet: Keras defers to the first call
    out = fresh(x)  # built by this call, with its own initial weights, then the saved ones arrive
    for a, b in zip(fresh.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(fresh(x), trained(x), rtol=1e-6)
    assert out.shape == (4, 1)
    with pytest.raises(ValueError, match="truncated or corrupted"):  # a bad file is an error now, not deferred
        Net().load_weights(__file__)
