"""Saving: save -> load -> predict identical, compile state preserved, atomic writes, corrupted
files rejected with ValueError, save_weights / load_weights."""
import json
import os
import zipfile

import numpy as np
import pytest

import attnx
from attnx import layers, optimizers, regularizers, saving
from attnx.testing import assert_close


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    return x, (x[:, 0] - x[:, 1] > 0).astype(np.float32)


def sequential():
    model = attnx.Sequential([layers.Dense(8, activation="relu", input_shape=(6,),
                                           kernel_regularizer=regularizers.L2(1e-3)),
                              layers.Dropout(0.2), layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizers.Adam(learning_rate=0.005, epsilon=1e-6), loss="binary_crossentropy",
                  metrics=["accuracy", "f1"])
    return model


def functional():
    a = attnx.Input(shape=(6,), name="feats")
    ids = attnx.Input(shape=(5,), dtype="int64", name="ids")
    e = layers.GlobalAveragePooling1D()(layers.Embedding(20, 4, mask_zero=True)(ids))
    h = layers.Concatenate()([layers.Dense(4, activation="tanh")(a), e])
    out1 = layers.Dense(1, activation="sigmoid", name="cls")(h)
    out2 = layers.Dense(2, name="reg")(layers.Add()([e, layers.Dense(4)(a)]))
    model = attnx.Model([a, ids], [out1, out2])
    model.compile(optimizer=optimizers.SGD(0.05, momentum=0.9), loss=["binary_crossentropy", "mse"],
                  loss_weights=[1.0, 0.3], metrics=[["accuracy"], []])
    return model


def functional_data(n=64):
    x, y = data(n)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 20, (n, 5))
    ids[:, 3:] = 0
    return [x, ids], [y, rng.standard_normal((n, 2)).astype(np.float32)]


def test_sequential_save_load_predict_identical(tmp_path):
    x, y = data()
    model = sequential()
    model.fit(x, y, epochs=2, verbose=0)
    path = tmp_path / "seq.attnx"
    model.save(path)
    loaded = attnx.load_model(path)
    assert type(loaded) is attnx.Sequential
    assert np.array_equal(loaded.predict(x), model.predict(x))
    assert [type(l).__name__ for l in loaded.layers] == ["Dense", "Dropout", "Dense"]
    assert loaded.layers[0].kernel_regularizer.l2 == pytest.approx(1e-3)
    # compile state: optimizer config, loss, metrics
    assert loaded.compiled and isinstance(loaded.optimizer, optimizers.Adam)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(model.evaluate(x, y, verbose=0))
    hist = loaded.fit(x, y, epochs=2, verbose=0)  # can continue training
    assert set(hist.history) == {"loss", "accuracy", "f1_score"}
    assert not np.array_equal(loaded.predict(x), model.predict(x))


def test_functional_save_load_predict_identical(tmp_path):
    xs, ys = functional_data()
    model = functional()
    model.fit(xs, ys, epochs=2, verbose=0)
    path = tmp_path / "fn.attnx"
    model.save(path)
    loaded = attnx.load_model(str(path))
    for a, b in zip(loaded.predict(xs), model.predict(xs)):
        assert np.array_equal(a, b)
    assert [l.name for l in loaded.layers] == [l.name for l in model.layers]
    assert loaded.loss_weights == [1.0, 0.3]
    assert loaded.get_layer("cls") is not None
    assert loaded.evaluate(xs, ys, verbose=0, return_dict=True) == pytest.approx(
        model.evaluate(xs, ys, verbose=0, return_dict=True))
    before = loaded.get_weights()
    loaded.fit(xs, ys, epochs=1, verbose=0)
    assert not all(np.array_equal(a, b) for a, b in zip(before, loaded.get_weights()))


@pytest.mark.parametrize("make_opt", [lambda: optimizers.Adam(0.01), lambda: optimizers.SGD(0.05, momentum=0.9),
                                      lambda: optimizers.RMSprop(0.01, momentum=0.5, centered=True),
                                      lambda: optimizers.AdamW(0.01)], ids=["adam", "sgd", "rmsprop", "adamw"])
def test_resumed_training_matches_uninterrupted(tmp_path, make_opt):
    """Optimizer state (step count, moments) is saved: save + load + fit == fit straight on."""
    x, y = data()
    model = sequential()
    model.compile(optimizer=make_opt(), loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    model.save(tmp_path / "mid.attnx")
    loaded = attnx.load_model(tmp_path / "mid.attnx")
    assert loaded.optimizer.iterations == model.optimizer.iterations == 8
    attnx.set_random_seed(7)
    h1 = model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    attnx.set_random_seed(7)
    h2 = loaded.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    assert h1.history == h2.history
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.get_weights()))


def test_current_learning_rate_is_saved(tmp_path):
    model = sequential()
    model.optimizer.learning_rate = 0.123
    model.save(tmp_path / "lr.attnx")
    assert attnx.load_model(tmp_path / "lr.attnx").optimizer.learning_rate == pytest.approx(0.123)


def test_uncompiled_model_round_trip(tmp_path):
    model = attnx.Sequential([layers.Dense(3, input_shape=(2,))])
    model.save(tmp_path / "u.attnx")
    loaded = attnx.load_model(tmp_path / "u.attnx")
    assert not loaded.compiled
    x = np.ones((2, 2), dtype=np.float32)
    assert np.array_equal(loaded.predict(x), model.predict(x))


def test_format_is_documented_zip(tmp_path):
    model = sequential()
    path = tmp_path / "m.attnx"
    model.save(path)
    with zipfile.ZipFile(path) as zf:
        header = json.loads(zf.read("attnx.json"))
        assert header["format"] == "attnx-model" and header["format_version"] == 1
        assert [w["name"] for w in header["weights"]] == list(model.params)
        assert sorted(n for n in zf.namelist() if n.startswith("weights/")) == [
            f"weights/{i:05d}.npy" for i in range(len(model.params))]


# ------------------------------------------------------------------------- atomic writes
def test_save_is_atomic(tmp_path, monkeypatch):
    x, y = data()
    model = sequential()
    path = tmp_path / "model.attnx"
    model.save(path)
    original = path.read_bytes()
    expected = model.predict(x)
    model.fit(x, y, epochs=1, verbose=0)

    real_writestr = zipfile.ZipFile.writestr
    calls = {"n": 0}

    def failing_writestr(self, name, data, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        return real_writestr(self, name, data, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", failing_writestr)
    with pytest.raises(OSError, match="simulated"):
        model.save(path)
    monkeypatch.undo()
    assert calls["n"] == 3
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["model.attnx"]  # no temporary file left behind
    assert np.array_equal(attnx.load_model(path).predict(x), expected)

    with pytest.raises(KeyboardInterrupt):
        saving._write_atomic(path, lambda zf: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert path.read_bytes() == original and os.listdir(tmp_path) == ["model.attnx"]


# ------------------------------------------------------------------------- corrupted files
@pytest.fixture
def saved(tmp_path):
    model = sequential()
    path = tmp_path / "good.attnx"
    model.save(path)
    return path


def test_truncated_file(saved, tmp_path):
    raw = saved.read_bytes()
    for cut in (10, len(raw) // 2, len(raw) - 30):
        bad = tmp_path / f"trunc{cut}.attnx"
        bad.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match="truncated or corrupted"):
            attnx.load_model(bad)
    empty = tmp_path / "empty.attnx"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="truncated or corrupted"):
        attnx.load_model(empty)


def test_bit_flipped_weights(saved, tmp_path):
    raw = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as zf:
        info = zf.getinfo("weights/00000.npy")
    # the member's data starts after its local header (30 bytes + name + extra)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start + info.file_size - 3] ^= 0x10  # a bit in the last float of the kernel
    bad = tmp_path / "flipped.attnx"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupted"):
        attnx.load_model(bad)


def test_checksum_mismatch_detected_even_with_valid_zip(saved, tmp_path):
    bad = tmp_path / "resaved.attnx"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "weights/00001.npy":
                arr = bytearray(data)
                arr[-1] ^= 0x01
                data = bytes(arr)
            dst.writestr(item.filename, data)
    with pytest.raises(ValueError, match="weight 'dense.*bias' is corrupted"):
        attnx.load_model(bad)


def _rewrite_header(saved, bad, change):
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "attnx.json":
                header = json.loads(data)
                change(header)
                data = json.dumps(header).encode()
            dst.writestr(item.filename, data)


def test_wrong_format_version(saved, tmp_path):
    bad = tmp_path / "v99.attnx"
    _rewrite_header(saved, bad, lambda h: h.update(format_version=99))
    with pytest.raises(ValueError, match="format version 99 is not supported"):
        attnx.load_model(bad)
    other = tmp_path / "other.attnx"
    _rewrite_header(saved, other, lambda h: h.update(format="something-else"))
    with pytest.raises(ValueError, match="not an attnx-model file"):
        attnx.load_model(other)


def test_not_a_zip(tmp_path):
    bad = tmp_path / "junk.attnx"
    bad.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ValueError, match="truncated or corrupted"):
        attnx.load_model(bad)
    with pytest.raises(FileNotFoundError):
        attnx.load_model(tmp_path / "missing.attnx")


# ------------------------------------------------------------------------- weights only
def test_save_weights_load_weights(tmp_path):
    x, y = data()
    model = sequential()
    model.fit(x, y, epochs=1, verbose=0)
    path = tmp_path / "w.attnx"
    model.save_weights(path)
    other = sequential()  # same architecture, other layer names and initial weights
    assert not np.array_equal(other.predict(x), model.predict(x))
    other.load_weights(path)
    assert np.array_equal(other.predict(x), model.predict(x))
    # a different architecture is refused with the shapes named
    wrong = attnx.Sequential([layers.Dense(9, input_shape=(6,)), layers.Dense(1)])
    with pytest.raises(ValueError, match=r"shape \(6, 8\).*expects \(6, 9\)"):
        wrong.load_weights(path)
    fewer = attnx.Sequential([layers.Dense(1, input_shape=(6,))])
    with pytest.raises(ValueError, match="4 weights"):
        fewer.load_weights(path)
    assert not np.array_equal(wrong.layers[0].params["kernel"][:, :8], model.layers[0].params["kernel"])
    # a weights file is not a model file, and the other way round
    with pytest.raises(ValueError, match="not an attnx-model file"):
        attnx.load_model(path)
    model.save(tmp_path / "full.attnx")
    with pytest.raises(ValueError, match="not an attnx-weights file"):
        other.load_weights(tmp_path / "full.attnx")


# ------------------------------------------------------------------------- permissions
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o444], ids=oct)
def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path, mode):
    """Another account reading the served model can still read it after a re-save (mkstemp made it 0600)."""
    model = attnx.Sequential([layers.Dense(2, input_shape=(3,))])
    path = tmp_path / "m.attnx"
    model.save(path)
    os.chmod(path, mode)
    model.save(path)
    assert os.stat(path).st_mode & 0o777 == mode
    model.save_weights(path.with_suffix(".w"))
    os.chmod(path.with_suffix(".w"), mode)
    model.save_weights(path.with_suffix(".w"))
    assert os.stat(path.with_suffix(".w")).st_mode & 0o777 == mode


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=oct)
def test_new_file_gets_the_umask_mode(tmp_path, umask):
    model = attnx.Sequential([layers.Dense(2, input_shape=(3,))])
    previous = os.umask(umask)
    try:
        model.save(tmp_path / "m.attnx")
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "m.attnx").st_mode & 0o777 == 0o666 & ~umask


# ------------------------------------------------------------------ registered names (issue 38)
def _saved_class_names(path):
    with zipfile.ZipFile(path) as archive:
        header = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith(".json"))))
    return [entry["class_name"] for entry in header["model"]["config"]["layers"]]


def test_a_class_of_yours_named_like_a_built_in_does_not_replace_it(tmp_path):
    class LSTM(layers.Layer):  # noqa: N801 - a user's class that happens to share the built-in's name
        def call(self, x):
            return x * 2.0
    inp = attnx.Input((5, 3))
    model = attnx.Model(inp, layers.Dense(1)(layers.LSTM(4)(inp)))
    path = str(tmp_path / "builtin.attnx")
    model.save(path)
    assert _saved_class_names(path)[0] == "LSTM"
    loaded = attnx.load_model(path)
    assert type(loaded.layers[0]) is layers.LSTM
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))

    mine = attnx.Model(inp, LSTM()(inp))  # saved under Custom>LSTM, loaded as the user's class
    path = str(tmp_path / "mine.attnx")
    mine.save(path)
    assert _saved_class_names(path) == ["Custom>LSTM"]
    assert type(attnx.load_model(path).layers[0]) is LSTM


def test_registered_names_are_package_qualified_and_a_collision_names_both(tmp_path):
    @attnx.register_serializable(package="pkg_a")
    class Scale(layers.Layer):
        def call(self, x):
            return x * 3.0
    first = Scale

    with pytest.raises(ValueError, match=r"pkg_a>Scale.*already registered.*test_saving.*Other"):
        @attnx.register_serializable(package="pkg_a", name="Scale")
        class Other(layers.Layer):
            def call(self, x):
                return x

    @attnx.register_serializable(package="pkg_b")
    class Scale(layers.Layer):  # noqa: F811 - another package's class of the same name
        def call(self, x):
            return x * 5.0
    inp = attnx.Input((2,))
    for cls, factor in ((first, 3.0), (Scale, 5.0)):
        path = str(tmp_path / f"{factor}.attnx")
        attnx.Model(inp, cls()(inp)).save(path)
        assert _saved_class_names(path) == [attnx.serialization.registered_name(cls)]
        loaded = attnx.load_model(path)
        assert type(loaded.layers[0]) is cls
        np.testing.assert_array_equal(loaded.predict(np.ones((1, 2), "float32"), verbose=0), [[factor, factor]])
    with pytest.raises(ValueError, match="attnx.*own"):
        attnx.register_serializable(package="attnx")(Scale)


def test_bare_names_of_older_files_still_resolve():
    class Doubler(layers.Layer):  # saved as "Doubler" by older versions, "Custom>Doubler" now
        def call(self, x):
            return x * 2.0
    registry = layers.Layer.registry
    assert registry.name_of(Doubler) == "Custom>Doubler"
    assert registry["Doubler"] is Doubler and registry["Custom>Doubler"] is Doubler
    assert registry["LSTM"] is layers.LSTM and registry.name_of(layers.LSTM) == "LSTM"
    with attnx.custom_object_scope({"LSTM": Doubler}):  # explicit custom_objects may name any class
        assert registry["LSTM"] is Doubler
    with pytest.raises(ValueError, match="Unknown layer class 'Elsewhere>Doubler'"):
        registry["Elsewhere>Doubler"]


def test_a_bare_name_two_packages_registered_is_an_error_naming_both():
    @attnx.register_serializable(package="twin_a", name="twin")
    def first(y_true, y_pred):
        return y_pred

    @attnx.register_serializable(package="twin_b", name="twin")
    def second(y_true, y_pred):
        return y_pred
    with pytest.raises(ValueError, match=r"twin_a>twin, twin_b>twin"):
        attnx.serialization.get_registered_object("twin")
    assert attnx.serialization.get_registered_object("twin_b>twin") is second
    with attnx.custom_object_scope({"twin": first}):
        assert attnx.serialization.get_registered_object("twin") is first


def test_an_unregistered_class_cannot_be_saved_under_a_name_registered_to_another():
    @attnx.register_serializable()
    class Shadowed(layers.Layer):
        def call(self, x):
            return x

    def elsewhere():
        class Shadowed(layers.Layer):  # unregistered, the same class name, defined elsewhere
            def call(self, x):
                return x
        return Shadowed
    assert layers.Layer.registry.name_of(Shadowed) == "Custom>Shadowed"
    with pytest.raises(ValueError, match=r"Custom>Shadowed.*registered to .*Shadowed"):
        layers.Layer.registry.name_of(elsewhere())
