"""Fault injection for the .attnx format.

Saving: a save that dies at any byte (the disk fills up: OSError(ENOSPC) from the file's write at
every offset; an exception raised inside the zip writer, at fsync or at the final rename; a
KeyboardInterrupt) leaves the previous file byte-for-byte intact and loadable, and no temporary
file behind. Loading: a file truncated at many offsets, with one bit flipped at many positions,
of another format version, of the other kind (weights vs model), empty or not a zip raises a
ValueError that says what is wrong - or, for a flipped bit in bytes no reader depends on (zip
timestamps, say), loads the very same weights; never different weights, never another exception.
"""
import errno
import glob
import io
import json
import os
import zipfile

import numpy as np
import pytest

import attnx
from attnx import layers, saving


def _model(seed):
    attnx.set_random_seed(seed)
    model = attnx.Sequential([layers.Dense(6, activation="relu", input_shape=(4,), name="hidden"),
                              layers.Dense(2, activation="softmax", name="out")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    r = np.random.default_rng(seed)
    model.fit(r.normal(size=(16, 4)).astype(np.float32), r.integers(0, 2, 16), epochs=1, verbose=0)
    return model


X = np.random.default_rng(99).normal(size=(5, 4)).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(path of a saved model, its bytes, its predictions on X, the weights)."""
    folder = tmp_path_factory.mktemp("saved")
    model = _model(1)
    path = folder / "model.attnx"
    model.save(path)
    return path, path.read_bytes(), model.predict(X), model.get_weights()


def _leftovers(folder):
    return glob.glob(os.path.join(folder, ".attnx-*")) + glob.glob(os.path.join(folder, "*.tmp"))


def _assert_intact(path, data, pred):
    assert path.read_bytes() == data
    np.testing.assert_array_equal(attnx.load_model(path).predict(X), pred)
    assert _leftovers(path.parent) == []


def _offsets(n, count=48):
    """Offsets spread over [0, n), plus both ends."""
    return sorted({0, 1, 2, n - 2, n - 1} | {int(v) for v in np.linspace(0, n - 1, count)})


# ----------------------------------------------------------------------- interrupted saves
class _FailingFile:
    """Wraps the temporary file: writes go through until `limit` bytes, then `exc` is raised (after
    a partial write, as a full disk gives)."""

    def __init__(self, f, limit, exc):
        self.f, self.limit, self.exc, self.written = f, limit, exc, 0

    def write(self, b):
        b = bytes(b)
        room = self.limit - self.written
        if room < len(b):
            self.f.write(b[:max(room, 0)])
            self.written = self.limit
            raise self.exc
        self.written += len(b)
        return self.f.write(b)

    def __getattr__(self, name):  # tell, seek, seekable, flush, fileno, close ...
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _patch_disk(monkeypatch, limit, exc):
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        return _FailingFile(real_fdopen(fd, *args, **kwargs), limit, exc)
    monkeypatch.setattr(saving.os, "fdopen", fdopen)


def test_disk_full_at_every_offset_keeps_the_previous_file(saved, tmp_path, monkeypatch):
    path0, data, pred, _ = saved
    path = tmp_path / "model.attnx"
    path.write_bytes(data)
    newer = _model(2)
    for limit in _offsets(len(data) + 200):
        with monkeypatch.context() as m:
            _patch_disk(m, limit, OSError(errno.ENOSPC, "No space left on device"))
            with pytest.raises(OSError) as info:
                newer.save(path)
            assert info.value.errno == errno.ENOSPC
        _assert_intact(path, data, pred)
    newer.save(path)  # and the disk recovered: the new model is saved
    np.testing.assert_array_equal(attnx.load_model(path).predict(X), newer.predict(X))


def test_keyboard_interrupt_mid_write_keeps_the_previous_file(saved, tmp_path, monkeypatch):
    _, data, pred, _ = saved
    path = tmp_path / "model.attnx"
    path.write_bytes(data)
    newer = _model(3)
    for limit in _offsets(len(data), count=8):
        with monkeypatch.context() as m:
            _patch_disk(m, limit, KeyboardInterrupt())
            with pytest.raises(KeyboardInterrupt):
                newer.save(path)
        _assert_intact(path, data, pred)


@pytest.mark.parametrize("where", ["writestr", "fsync", "replace", "npy"])
def test_exception_inside_the_writer_keeps_the_previous_file(saved, tmp_path, monkeypatch, where):
    _, data, pred, _ = saved
    path = tmp_path / "model.attnx"
    path.write_bytes(data)
    newer = _model(4)
    calls = {"n": 0}

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected failure in {where}")
    if where == "writestr":  # fail at the 3rd member, after some were written
        real = zipfile.ZipFile.writestr

        def writestr(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                boom()
            return real(self, *args, **kwargs)
        monkeypatch.setattr(zipfile.ZipFile, "writestr", writestr)
    elif where == "fsync":
        monkeypatch.setattr(saving.os, "fsync", boom)
    elif where == "replace":
        monkeypatch.setattr(saving.os, "replace", boom)
    else:
        monkeypatch.setattr(saving, "_npy_bytes", boom)
    with pytest.raises(RuntimeError, match="injected"):
        newer.save(path)
    monkeypatch.undo()
    _assert_intact(path, data, pred)


def test_failed_first_save_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "fresh.attnx"
    _patch_disk(monkeypatch, 100, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError):
        _model(5).save(path)
    assert not path.exists() and _leftovers(tmp_path) == []


def test_save_weights_interrupted_keeps_previous(tmp_path, monkeypatch):
    model = _model(6)
    path = tmp_path / "w.attnx"
    model.save_weights(path)
    data = path.read_bytes()
    other = _model(7)
    for limit in _offsets(len(data), count=10):
        with monkeypatch.context() as m:
            _patch_disk(m, limit, OSError(errno.ENOSPC, "No space left on device"))
            with pytest.raises(OSError):
                other.save_weights(path)
        assert path.read_bytes() == data and _leftovers(tmp_path) == []
    fresh = _model(8)
    fresh.load_weights(path)
    for a, b in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------- corrupted files
def test_truncated_files_raise_value_error(saved, tmp_path):
    _, data, _, _ = saved
    path = tmp_path / "cut.attnx"
    for cut in _offsets(len(data), count=64):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"cut\.attnx"):
            attnx.load_model(path)


def test_bit_flips_raise_or_load_identical_weights(saved, tmp_path):
    _, data, pred, weights = saved
    path = tmp_path / "flip.attnx"
    rejected = 0
    positions = _offsets(len(data), count=160)
    for pos in positions:
        for bit in (0, 5):
            corrupt = bytearray(data)
            corrupt[pos] ^= 1 << bit
            path.write_bytes(bytes(corrupt))
            try:
                model = attnx.load_model(path)
            except ValueError as exc:
                assert "flip.attnx" in str(exc)
                rejected += 1
                continue
            # accepted: the flip hit bytes nothing depends on; the weights must be the saved ones
            for a, b in zip(model.get_weights(), weights):
                np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(model.predict(X), pred)
    assert rejected > len(positions)  # most flips are caught (CRCs, checksums, JSON)


def _rewrite_header(data, change):
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            blob = src.read(info.filename)
            if info.filename == "attnx.json":
                header = json.loads(blob)
                change(header)
                blob = json.dumps(header).encode()
            dst.writestr(info.filename, blob)
    return out.getvalue()


@pytest.mark.parametrize("case", ["newer_version", "no_version", "string_version", "weights_file", "other_format",
                                  "checksum", "shape", "missing_member", "empty", "not_zip", "json_garbage"])
def test_wrong_files_raise_clear_value_errors(saved, tmp_path, case):
    _, data, _, _ = saved
    path = tmp_path / "bad.attnx"
    expected = {"newer_version": "format version 2 is not supported", "no_version": "format version None",
                "string_version": "format version 1 is not supported", "weights_file": "not an attnx-model file",
                "other_format": "not an attnx-model file", "checksum": "corrupted", "shape": "header says",
                "missing_member": "truncated or corrupted", "empty": "truncated or corrupted",
                "not_zip": "truncated or corrupted", "json_garbage": "truncated or corrupted"}[case]
    if case == "newer_version":
        blob = _rewrite_header(data, lambda h: h.update(format_version=2))
    elif case == "no_version":
        blob = _rewrite_header(data, lambda h: h.pop("format_version"))
    elif case == "string_version":
        blob = _rewrite_header(data, lambda h: h.update(format_version="1"))
    elif case == "weights_file":
        blob = _rewrite_header(data, lambda h: h.update(format=saving.WEIGHTS_FORMAT))
    elif case == "other_format":
        blob = _rewrite_header(data, lambda h: h.update(format="keras"))
    elif case == "checksum":
        blob = _rewrite_header(data, lambda h: h["weights"][0].update(sha256="0" * 64))
    elif case == "shape":
        blob = _rewrite_header(data, lambda h: h["weights"][0].update(shape=[1, 2, 3]))
    elif case == "missing_member":
        blob = _rewrite_header(data, lambda h: h["weights"].append(dict(h["weights"][0])))
    elif case == "empty":
        blob = b""
    elif case == "not_zip":
        blob = b"PK\x03\x04" + os.urandom(300)
    else:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("attnx.json", b"{not json")
        blob = out.getvalue()
    path.write_bytes(blob)
    with pytest.raises(ValueError, match=expected):
        attnx.load_model(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        attnx.load_model(tmp_path / "nope.attnx")
    with pytest.raises((ValueError, IsADirectoryError)):
        attnx.load_model(tmp_path)
