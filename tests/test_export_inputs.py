"""Deployment without surprises (issue 31): ids of any integer dtype run through
`attnx.export.OnnxModel`; `to_onnx(dynamic_steps=True)` refuses a model whose AttentionPooling fixes
its steps (ONNX Runtime failed at another length); `to_keras` names a Keras backend that is not
installed instead of saying keras is missing."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import attnx
from attnx import layers

pytest.importorskip("onnxruntime")
export = pytest.importorskip("attnx.export")


def _sentiment_model(length_agnostic=False):
    attnx.set_random_seed(0)
    return attnx.Sequential([layers.Embedding(50, 8, input_shape=(12,)), layers.LSTM(6, return_sequences=True),
                             layers.AttentionPooling(length_agnostic=length_agnostic),
                             layers.Dense(1, activation="sigmoid")])


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "int16", "uint16"])
def test_onnx_model_takes_ids_of_any_integer_dtype(tmp_path, dtype):
    model = _sentiment_model()
    export.to_onnx(model, tmp_path / "m.onnx")
    ids = np.random.default_rng(0).integers(0, 50, (5, 12)).astype(dtype)
    np.testing.assert_allclose(export.OnnxModel(tmp_path / "m.onnx").predict(ids), model.predict(ids, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_onnx_model_refuses_float_ids_and_out_of_range_ids(tmp_path):
    export.to_onnx(_sentiment_model(), tmp_path / "m.onnx")
    runner = export.OnnxModel(tmp_path / "m.onnx")
    with pytest.raises(TypeError, match="takes integer ids, got dtype float64"):
        runner.predict(np.zeros((2, 12)))
    with pytest.raises(ValueError, match="takes 1 inputs"):
        runner.predict([np.zeros((2, 12), np.int64)] * 2)


def test_dynamic_steps_with_a_fixed_length_attention_pooling_is_refused_at_export(tmp_path):
    with pytest.raises(export.UnsupportedLayerError, match=r"per-step bias fixes T=12 steps, which dynamic_steps="
                                                           r"True would leave open"):
        export.to_onnx(_sentiment_model(), tmp_path / "m.onnx", dynamic_steps=True)
    model = _sentiment_model(length_agnostic=True)
    export.to_onnx(model, tmp_path / "open.onnx", dynamic_steps=True)
    ids = np.random.default_rng(1).integers(0, 50, (3, 20))
    np.testing.assert_allclose(export.OnnxModel(tmp_path / "open.onnx").predict(ids), model.predict(ids, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_to_keras_names_a_missing_backend():
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed")
    code = ("import attnx\nfrom attnx import layers\n"
            "m = attnx.Sequential([layers.Dense(2, input_shape=(3,))])\n"
            "attnx.interop.to_keras(m)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERAS_BACKEND": "nosuchbackend"})
    assert done.returncode != 0
    assert "keras is installed but its backend (nosuchbackend) cannot be imported" in done.stderr
    assert "pip install 'attnx[keras]'" not in done.stderr
