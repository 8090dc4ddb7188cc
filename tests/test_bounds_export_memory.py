"""ONNX export within a memory bound (issue 43): a model of W bytes of weights exports with a process peak
of at most 1.5 W + 200 MiB (its weights stream into external data as the graph is built, no full copy;
the gradient buffers stay unwritten, so unmapped, until a backward),
and under an address-space limit (RLIMIT_AS) the export raises MemoryError and leaves no partial file,
never a signal. The tests run at a scale CI affords; the figures for large models:

    PYTHONPATH=python python tests/test_bounds_export_memory.py 512 2048     # W in MiB
"""
import json
import subprocess
import sys

import numpy as np
import pytest

import attnx
from attnx import layers

ort = pytest.importorskip("onnxruntime")
export = pytest.importorskip("attnx.export")
from attnx.export import graph  # noqa: E402

MIB = 1 << 20
WIDTH = 256  # the embedding's width: W = rows * WIDTH * 4 bytes

# Builds the model of `mib` MiB of weights (an Embedding of them, an LSTM whose gates the converter
# reorders, a Dense), then exports it, measuring the resident peak of the export alone (VmHWM reset
# through /proc/self/clear_refs), and prints JSON.
_MEASURE = r"""
import json, sys
import numpy as np
import attnx
import attnx.export
from attnx import layers

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

mib, path = int(sys.argv[1]), sys.argv[2]
base = status("VmRSS:")
rows = mib * (1 << 20) // (WIDTH * 4)
model = attnx.Sequential([layers.Embedding(rows, WIDTH, input_shape=(4,), embeddings_initializer="ones"),
                          layers.LSTM(32), layers.Dense(1)])
model.build((None, 4))
weights = sum(w.nbytes for w in model.weights)
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS: the peak from here on is the export's
attnx.export.to_onnx(model, path)
print(json.dumps({"weights": weights, "base": base, "before": before, "peak": status("VmHWM:")}))
""".replace("WIDTH", str(WIDTH))


def measure(mib, path):
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(mib), str(path)], capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_large_export_peaks_below_one_and_a_half_times_its_weights(tmp_path):
    """128 MiB of weights (past EXTERNAL_DATA_BYTES): the export's resident peak is at most 1.5 W + 200 MiB
    beyond the interpreter and its libraries (an export that copies the weights into its messages takes
    4 W). The model holds its weights once: its gradient buffers are allocated unwritten, so no page of
    them is resident until a backward writes it."""
    figures = measure(128, tmp_path / "m.onnx")
    w, export_own = figures["weights"], figures["peak"] - figures["before"]
    assert w >= graph.EXTERNAL_DATA_BYTES
    assert export_own <= 0.5 * w + 200 * MIB, {k: v / MIB for k, v in figures.items()}
    assert figures["before"] - figures["base"] <= 1.1 * w, {k: v / MIB for k, v in figures.items()}  # W, not 2 W
    assert figures["peak"] - figures["base"] <= 1.5 * w + 200 * MIB, {k: v / MIB for k, v in figures.items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx").stat().st_size < MIB <= w <= (tmp_path / "m.onnx.data").stat().st_size


def _model():
    attnx.set_random_seed(0)
    return attnx.Sequential([layers.Embedding(300, 8, input_shape=(5,), mask_zero=True),
                             layers.Bidirectional(layers.GRU(6, return_sequences=True)), layers.LSTM(5),
                             layers.Dense(3)])


def test_streamed_weights_run_as_the_model_predicts(tmp_path, monkeypatch):
    """Weights written to the side file as the graph is built (the threshold lowered so that a small
    model streams): every weight of 1 KiB or more is external, and ONNX Runtime predicts as attnx."""
    model = _model()
    monkeypatch.setattr(graph, "EXTERNAL_DATA_BYTES", 4096)
    path = tmp_path / "m.onnx"
    (tmp_path / "m.onnx.data").write_bytes(b"stale bytes of an earlier export" * 1000)
    export.to_onnx(model, path)
    import onnx
    proto = onnx.load(str(path), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inline = [t for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert external and all(len(t.raw_data) < graph.INLINE_TENSOR_BYTES for t in inline)
    ends = [int(dict((e.key, e.value) for e in t.external_data)["offset"]) +
            int(dict((e.key, e.value) for e in t.external_data)["length"]) for t in external]
    assert max(ends) == (tmp_path / "m.onnx.data").stat().st_size  # the stale bytes are gone
    ids = np.random.default_rng(0).integers(0, 300, (4, 5))
    ids[1, 3:] = 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: ids})[0],
                               model.predict(ids, verbose=0), rtol=1e-5, atol=1e-6)


# Exports a 48 MiB model (streamed, and with the threshold raised, as one message) under address-space
# limits from the process's size upward; prints each attempt's outcome and the files left by a failure.
_UNDER_LIMIT = r"""
import json, resource, sys, pathlib
import attnx
import attnx.export
from attnx import layers
from attnx.export import graph

folder = pathlib.Path(sys.argv[1])
model = attnx.Sequential([layers.Embedding(48 * 1024, 256, input_shape=(4,), embeddings_initializer="ones"),
                          layers.LSTM(32), layers.Dense(1)])
model.build((None, 4))
outcomes = []
for threshold in (1 << 20, 1 << 40):  # streamed; one message
    graph.EXTERNAL_DATA_BYTES = threshold
    for margin_mib in (0, 16, 30, 34, 64, 128, 192, 226, 230, 256, 512):  # about the claims too
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        path = folder / f"m{threshold}_{margin_mib}.onnx"
        resource.setrlimit(resource.RLIMIT_AS, (size + margin_mib * (1 << 20), resource.RLIM_INFINITY))
        try:
            attnx.export.to_onnx(model, path)
            outcome = "ok"
        except MemoryError:
            outcome = "MemoryError"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        left = sorted(p.name for p in folder.glob(path.name + "*"))
        outcomes.append([threshold, margin_mib, outcome, left])
print(json.dumps(outcomes))
"""


def test_under_an_address_space_limit_the_export_raises_memory_error(tmp_path):
    done = subprocess.run([sys.executable, "-c", _UNDER_LIMIT, str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"the export ended by signal {-done.returncode}" if done.returncode < 0 else \
        done.stderr[-3000:]
    outcomes = json.loads(done.stdout.splitlines()[-1])
    for threshold, margin, outcome, left in outcomes:
        assert outcome in ("ok", "MemoryError"), (threshold, margin, outcome)
        if outcome == "MemoryError":
            assert left == [], f"a failed export left {left}"
    for threshold in {t for t, *_ in outcomes}:  # both outcomes happen: the limits bracket the export
        assert {o for t, _, o, _ in outcomes if t == threshold} == {"ok", "MemoryError"}, outcomes


if __name__ == "__main__":  # the figures for large models: W in MiB as arguments
    import tempfile
    for mib in map(int, sys.argv[1:]):
        with tempfile.TemporaryDirectory() as folder:
            f = measure(mib, f"{folder}/m.onnx")
        w = f["weights"]
        print(f"W = {w / MIB:.0f} MiB: peak {f['peak'] / MIB:.0f} MiB (bound 1.5 W + 200 MiB = "
              f"{(1.5 * w + 200 * MIB) / MIB:.0f} MiB; before the export {f['before'] / MIB:.0f} MiB, interpreter "
              f"and libraries {f['base'] / MIB:.0f} MiB), the export's own {(f['peak'] - f['before']) / MIB:.0f} MiB")
