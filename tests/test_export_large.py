"""ONNX export of models whose weights exceed what one protobuf message holds (2 GiB) writes them as
ONNX external data (issue 31). The threshold is lowered here so that a small model takes that path:
no test allocates gigabytes."""
import numpy as np
import pytest

import attnx
from attnx import layers

ort = pytest.importorskip("onnxruntime")
export = pytest.importorskip("attnx.export")
from attnx.export import graph  # noqa: E402


def _model():
    attnx.set_random_seed(0)
    return attnx.Sequential([layers.Embedding(1000, 8, input_shape=(5,)), layers.GlobalAveragePooling1D(),
                             layers.Dense(3)])


def _run(path, ids):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: ids})[0]


def test_the_default_threshold_keeps_weights_below_2_gib_in_the_file():
    assert graph.EXTERNAL_DATA_BYTES < 2 ** 31 - 1
    # the model: Embedding(2**27 + 16, 4) holds 2 GiB + 256 bytes of float32 weights
    assert (2 ** 27 + 16) * 4 * 4 >= graph.EXTERNAL_DATA_BYTES


def test_small_model_is_one_file(tmp_path):
    model = _model()
    export.to_onnx(model, tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_weights_past_the_threshold_go_to_external_data_and_run(tmp_path, monkeypatch):
    model = _model()
    monkeypatch.setattr(graph, "EXTERNAL_DATA_BYTES", 16 * 1024)  # the 32 KB embedding is past it
    path = tmp_path / "m.onnx"
    (tmp_path / "m.onnx.data").write_bytes(b"stale bytes of an earlier export")
    export.to_onnx(model, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert path.stat().st_size < 16 * 1024 <= (tmp_path / "m.onnx.data").stat().st_size
    ids = np.random.default_rng(0).integers(0, 1000, (4, 5))
    np.testing.assert_allclose(_run(path, ids), model.predict(ids, verbose=0), rtol=1e-5, atol=1e-6)
