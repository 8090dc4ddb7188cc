"""Files attnx reads are untrusted input (issue 31): a backup's backup.json, an .attnx model file, a
Keras file. Each crafted case is a clear ValueError naming the file and the field, never a file read
or deleted outside the folder it belongs to, never a hang on a FIFO."""
import itertools
import json
import os
import threading

import numpy as np
import pytest

import attnx
from attnx import callbacks, layers, optimizers, saving


def _data(n=40, d=6):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, (x[:, :1] > 0).astype(np.float32)


def _model():
    attnx.set_random_seed(7)
    model = attnx.Sequential([layers.Dense(8, activation="relu", input_shape=(6,)), layers.Dropout(0.3),
                              layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizers.Adam(0.01), loss="binary_crossentropy")
    return model


class _Crash(RuntimeError):
    pass


def _crash_after(batches):
    count = itertools.count()

    def hook(batch, logs):
        if next(count) == batches:
            raise _Crash("killed")
    return callbacks.LambdaCallback(on_train_batch_end=hook)


FIT = dict(epochs=4, batch_size=10, shuffle=True, verbose=0)  # 4 batches an epoch


@pytest.fixture
def backup(tmp_path):
    """A backup folder left by a fit killed after 6 batches (epoch 1, step 2), and its state."""
    folder = tmp_path / "backup"
    with pytest.raises(_Crash):
        _model().fit(*_data(), callbacks=[callbacks.BackupAndRestore(folder, save_freq=1), _crash_after(5)], **FIT)
    state = json.loads((folder / "backup.json").read_text())
    assert state["model_file"] == "model-5.attnx" and state["training"]["epoch"] == 1
    return folder, state


def _resume(folder, data=None, **fit_kwargs):
    model = _model()
    model.fit(*(data or _data()), callbacks=[callbacks.BackupAndRestore(folder)], **{**FIT, **fit_kwargs})
    return model


def _tampered(folder, state, change):
    state = json.loads(json.dumps(state))
    change(state)
    (folder / "backup.json").write_text(json.dumps(state))


def test_an_untampered_backup_resumes(backup):
    folder, _ = backup
    _resume(folder)
    assert os.listdir(folder) == []


@pytest.mark.parametrize("outside", ["absolute", "relative", "link"])
def test_backup_model_file_outside_the_folder_is_neither_loaded_nor_deleted(backup, tmp_path, outside):
    folder, state = backup
    planted = tmp_path / "planted.attnx"  # a valid model file outside the backup folder
    _model().save(planted)
    if outside == "link":  # the right name, but a link to the planted file
        os.remove(folder / state["model_file"])
        os.symlink(planted, folder / state["model_file"])
        change = None
    else:
        name = str(planted) if outside == "absolute" else os.path.join("..", "planted.attnx")

        def change(s):
            s["model_file"] = name
    if change is not None:
        _tampered(folder, state, change)
    with pytest.raises(ValueError, match=r"backup\.json: field 'model_file'"):
        _resume(folder)
    assert planted.exists()


@pytest.mark.parametrize("field, value, message", [
    (("training", "epoch"), 10 ** 18, r"field 'training.epoch' is 1000000000000000000, expected 0 .. 4"),
    (("training", "epoch"), -5, r"field 'training.epoch' is -5, expected 0 .. 4"),
    (("training", "epoch"), "1", r"field 'training.epoch' should be an integer, got '1'"),
    (("training", "epoch"), True, r"field 'training.epoch' should be an integer, got True"),
    (("training", "step"), 99, r"field 'training.step' is 99, expected 0 .. 4"),
    (("training", "data", "drawn"), 10 ** 12, r"field 'training.data.drawn' is 1000000000000, expected 0 .. 6"),
    (("number",), -1, r"field 'number' is -1"),
    (("number",), 2 ** 70, r"field 'model_file' is 'model-5.attnx', expected 'model-1180591620717411303424"),
    (("rng", "state", "state"), -1, r"field 'rng' is not a state of PCG64"),
    (("rng", "state", "state"), 2 ** 200, r"field 'rng' is not a state of PCG64"),
    (("rng", "bit_generator"), "MT19937", r"field 'rng' is not a state of PCG64"),
    (("rng",), [1, 2], r"field 'rng' should be an object, got \[1, 2\]"),
    (("training", "data", "pass_key"), "x", r"field 'training.data.pass_key' should be an integer, got 'x'"),
    (("training", "data", "pass_key"), 2 ** 64, r"field 'training.data.pass_key' is 18446744073709551616"),
    (("random", "seed"), -1, r"field 'random.seed' is -1"),
    (("random", "step"), "3", r"field 'random.step' should be an integer, got '3'"),
    (("random",), {"seed": 1}, r"field 'random' should hold 'seed' and 'step'"),
    (("training",), None, r"field 'training' should be an object, got None"),
])
def test_every_backup_field_is_checked_with_the_file_and_field_named(backup, field, value, message):
    folder, state = backup

    def change(s):
        for key in field[:-1]:
            s = s[key]
        s[field[-1]] = value
    _tampered(folder, state, change)
    with pytest.raises(ValueError, match=r"backup\.json: " + message):
        _resume(folder)
    assert (folder / state["model_file"]).exists()  # nothing deleted


@pytest.mark.parametrize("missing", [("number",), ("rng",), ("training", "step"), ("training", "data", "drawn")])
def test_a_missing_backup_field_is_named(backup, missing):
    folder, state = backup

    def change(s):
        for key in missing[:-1]:
            s = s[key]
        del s[missing[-1]]
    _tampered(folder, state, change)
    with pytest.raises(ValueError, match=r"backup\.json: field 'training.data' has no 'drawn'|"
                                         rf"backup\.json: field '{'.'.join(missing)}' should be"):
        _resume(folder)


def test_drawn_beyond_what_an_infinite_generator_fit_trained_is_refused(tmp_path):
    x, y = _data()

    def batches():  # endless as far as the fit can tell (bounded so that a regression fails, not hangs)
        for i in range(100000):
            yield x[(i * 8) % 32:(i * 8) % 32 + 8], y[(i * 8) % 32:(i * 8) % 32 + 8]
    fit = dict(epochs=3, steps_per_epoch=4, verbose=0)
    with pytest.raises(_Crash):
        _model().fit(batches(), callbacks=[callbacks.BackupAndRestore(tmp_path, save_freq=1), _crash_after(5)],
                     **fit)
    state = json.loads((tmp_path / "backup.json").read_text())
    assert state["training"]["data"]["drawn"] == 6
    state["training"]["data"]["drawn"] = 10 ** 12
    (tmp_path / "backup.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"field 'training.data.drawn' is 1000000000000, expected 0 .. 6"):
        _model().fit(batches(), callbacks=[callbacks.BackupAndRestore(tmp_path)], **fit)


@pytest.mark.parametrize("content, message", [
    (b"{not json", r"backup\.json: not a backup this BackupAndRestore wrote \(JSONDecodeError"),
    (b"\xff\xfe{}", r"backup\.json: not a backup this BackupAndRestore wrote \(UnicodeDecodeError"),
    (b"[1, 2]", r"backup\.json: should hold a JSON object, got list"),
    (b"[" * 100000, r"backup\.json: not a backup this BackupAndRestore wrote"),
], ids=["not JSON", "not UTF-8", "a list", "nested too deep"])
def test_backup_json_that_is_not_a_state_is_named(backup, content, message):
    folder, state = backup
    (folder / "backup.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        _resume(folder)
    assert (folder / state["model_file"]).exists()


def test_backup_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "plain").write_text("a file")
    with pytest.raises(ValueError, match=r"BackupAndRestore: backup_dir .*plain is not a folder"):
        _resume(tmp_path / "plain")


def _refused_without_blocking(call):
    """Runs `call` on a thread: it must return (here: raise) within seconds, not wait on a FIFO."""
    outcome = {}

    def run():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        pytest.fail("blocked on a FIFO")
    return outcome.get("error")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_fifos_and_folders_are_refused_not_waited_on(backup, tmp_path):
    fifo = tmp_path / "model.attnx"
    os.mkfifo(fifo)
    try:
        error = _refused_without_blocking(lambda: attnx.load_model(fifo))
        assert isinstance(error, ValueError) and "model.attnx: is a FIFO, not a attnx file" in str(error)
        error = _refused_without_blocking(lambda: _model().load_weights(fifo))
        assert isinstance(error, ValueError) and "is a FIFO" in str(error)
        folder, _ = backup
        os.remove(folder / "backup.json")
        os.mkfifo(folder / "backup.json")
        error = _refused_without_blocking(lambda: _resume(folder))
        assert isinstance(error, ValueError) and "backup.json: is a FIFO, not a backup state file" in str(error)
    finally:
        # a regression would leave a thread blocked in open(): a writer releases it
        for f in (fifo, backup[0] / "backup.json"):
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
    with pytest.raises(ValueError, match="is a folder"):
        attnx.load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="No attnx file at"):
        attnx.load_model(tmp_path / "nothing.attnx")


def _with_optimizer_config(tmp_path, change):
    model = _model()
    model.fit(*_data(), epochs=1, batch_size=20, verbose=0)
    path = tmp_path / "m.attnx"
    model.save(path)
    header, _ = saving.read_model(path)
    compile_config = header["compile"]
    change(compile_config["optimizer"]["config"])
    # rewrite the archive with the changed header: the same members, a new attnx.json
    import zipfile
    out = tmp_path / "evil.attnx"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "attnx.json":
                raw = json.loads(data)
                raw["compile"] = compile_config
                data = json.dumps(raw).encode()
            dst.writestr(info.filename, data)
    return out


@pytest.mark.parametrize("key, value, message", [
    ("learning_rate", "evil", r"compile.optimizer learning_rate should be a finite number >= 0, got 'evil'"),
    ("learning_rate", float("nan"), r"compile.optimizer learning_rate should be a finite number >= 0, got nan"),
    ("learning_rate", float("inf"), r"learning_rate should be a finite number >= 0, got inf"),
    ("learning_rate", -0.1, r"learning_rate should be a finite number >= 0, got -0.1"),
    ("learning_rate", {"class_name": "LearningRateSchedule", "config": {}}, r"not a learning-rate schedule"),
    ("learning_rate", {"class_name": "ExponentialDecay",
                       "config": {"initial_learning_rate": float("nan"), "decay_steps": 10, "decay_rate": 0.5,
                                  "staircase": False}}, r"learning_rate.initial_learning_rate should be a finite"),
    ("learning_rate", {"class_name": "SGD", "config": {}}, r"learning_rate should be a finite number"),
    ("clipnorm", "1", r"compile.optimizer clipnorm should be a finite number >= 0, got '1'"),
    ("beta_1", 10 ** 400, r"compile settings this attnx cannot rebuild \(OverflowError"),
], ids=["lr evil", "lr NaN", "lr inf", "lr negative", "abstract schedule", "schedule NaN", "optimizer as schedule",
        "clipnorm string", "beta_1 10**400"])
def test_load_model_refuses_bad_optimizer_numbers(tmp_path, key, value, message):
    path = _with_optimizer_config(tmp_path, lambda config: config.__setitem__(key, value))
    with pytest.raises(ValueError, match=r"evil\.attnx: .*" + message):
        attnx.load_model(path)


# ------------------------------------------------------------------------------ Keras files
def _keras_dense_config(units=4):
    return {"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [None, 3], "dtype": "float32"}},
        {"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense", "units": units,
                                                                     "activation": "linear", "use_bias": True}}]}}


def _keras_weights(path, external=None):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        group = f.create_group("layers/dense/vars")
        if external is None:
            group["0"] = np.arange(12, dtype=np.float32).reshape(3, 4)
        else:
            group.create_dataset("0", shape=(3, 4), dtype=np.float32, external=[(str(external), 0, 48)])
        group["1"] = np.zeros(4, np.float32)


def test_keras_weight_file_of_plain_datasets_loads(tmp_path):
    _keras_weights(tmp_path / "m.weights.h5")
    model = attnx.interop.from_keras(tmp_path / "m.weights.h5", config=_keras_dense_config())
    np.testing.assert_array_equal(model.layers[-1].params["kernel"], np.arange(12).reshape(3, 4))


def test_keras_weight_with_external_storage_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"  # a file outside the weight file, whose bytes must not be read
    secret.write_bytes(np.full(12, 7.0, np.float32).tobytes())
    _keras_weights(tmp_path / "m.weights.h5", external=secret)
    with pytest.raises(ValueError, match=r"m\.weights\.h5: weight 'layers/dense/vars/0' keeps its data outside "
                                         r"the weight file \(HDF5 external storage\)"):
        attnx.interop.from_keras(tmp_path / "m.weights.h5", config=_keras_dense_config())
    assert secret.exists()


@pytest.mark.parametrize("units", [float("inf"), float("nan"), 10 ** 30, -3, [4]])
def test_keras_config_numbers_attnx_cannot_take_name_the_file(tmp_path, units):
    _keras_weights(tmp_path / "m.weights.h5")
    config = json.dumps(_keras_dense_config()).replace('"units": 4', f'"units": {json.dumps(units)}')
    with pytest.raises(ValueError, match=r"m\.weights\.h5: "):
        attnx.interop.from_keras(tmp_path / "m.weights.h5", config=config)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_keras_fifo_is_refused_not_waited_on(tmp_path):
    pytest.importorskip("h5py")
    _keras_weights(tmp_path / "m.weights.h5")
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    weights_fifo = tmp_path / "w.h5"
    os.mkfifo(weights_fifo)
    try:
        error = _refused_without_blocking(lambda: attnx.interop.from_keras(tmp_path / "m.weights.h5", config=fifo))
        assert isinstance(error, ValueError) and "config.json: is a FIFO, not a Keras config file" in str(error)
        error = _refused_without_blocking(lambda: attnx.interop.from_keras(weights_fifo,
                                                                           config=_keras_dense_config()))
        assert isinstance(error, ValueError) and "w.h5: is a FIFO, not a Keras file" in str(error)
    finally:
        for f in (fifo, weights_fifo):
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


def test_keras_multi_head_attention_fed_a_propagated_mask_is_refused(tmp_path):
    """Keras' MultiHeadAttention masks the padded keys with the mask of Embedding(mask_zero=True);
    attnx's takes explicit masks only: such a file is refused rather than predicting otherwise."""
    script = tmp_path / "make.py"
    script.write_text(
        "import os, sys\nos.environ['KERAS_BACKEND'] = 'torch'\nimport keras\n"
        "def save(mask_zero, path):\n"
        "    ids = keras.Input((7,), dtype='int32')\n"
        "    h = keras.layers.Embedding(20, 8, mask_zero=mask_zero)(ids)\n"
        "    h = keras.layers.Dropout(0.1)(h)\n"
        "    h = keras.layers.MultiHeadAttention(2, 4)(h, h)\n"
        "    out = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h))\n"
        "    keras.Model(ids, out).save(path)\n"
        "save(True, sys.argv[1]); save(False, sys.argv[2])\n")
    import importlib.util
    import subprocess
    import sys
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed")
    subprocess.run([sys.executable, str(script), str(tmp_path / "masked.keras"), str(tmp_path / "plain.keras")],
                   check=True, capture_output=True, timeout=600)
    with pytest.raises(ValueError, match=r"masked\.keras: MultiHeadAttention '.*' is fed the mask of "
                                         r"Embedding\(mask_zero=True\)"):
        attnx.interop.from_keras(tmp_path / "masked.keras")
    assert attnx.interop.from_keras(tmp_path / "plain.keras").built
