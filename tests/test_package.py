"""Package-level requirements: import time, no heavy imports, extension size, public names,
and the C++ unit tests (ctest)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnx

REPO = Path(__file__).resolve().parents[1]
PACKAGE_PARENT = str(Path(attnx.__file__).resolve().parents[1])


def _python(code, timeout=60):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [PACKAGE_PARENT, env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


IMPORT_PROBE = """
import sys
calls = [0]
def count(frame, event, arg):
    if event == "call":
        calls[0] += 1
sys.setprofile(count)
import attnx
sys.setprofile(None)
heavy = sorted(m for m in ("torch", "matplotlib", "tqdm", "pandas", "scipy") if m in sys.modules)
print(calls[0], ",".join(heavy) or "-", attnx.__file__)
"""

# Python function calls of `import attnx` (56,000 in November 2026, when it took 0.12-0.16 s of CPU on
# this project's machines): the work of importing, counted rather than timed so that the test does not
# depend on the machine's load. Importing torch alone makes several hundred thousand.
IMPORT_CALL_BUDGET = 100_000


def test_import_is_fast_and_light():
    """`import attnx` stays light (issue 2: under 0.3 s): no heavy package, and a bounded amount of
    Python work, counted in function calls in a fresh interpreter (deterministic, unlike a time)."""
    calls, heavy, path = _python(IMPORT_PROBE).split()
    assert path.startswith(PACKAGE_PARENT)  # the checkout under test, not another install
    assert heavy == "-", f"import attnx pulled in {heavy}"
    assert int(calls) < IMPORT_CALL_BUDGET, f"import attnx made {int(calls):,} Python calls"


def test_lazy_submodules_do_not_import_torch_or_matplotlib():
    out = _python("import sys, attnx\n"
                  "attnx.interop.from_torch, attnx.plot.attention_heatmap, attnx.testing.gradcheck\n"
                  "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    assert out.split() == ["False", "False"]


def test_extension_under_10_mb():
    ext = Path(attnx._core.__file__)  # wherever the install put it (editable installs keep it apart)
    assert ext.suffix in (".so", ".pyd") and ext.name.startswith("_core"), ext
    size = ext.stat().st_size
    assert 0 < size < 10 * 1024 * 1024, f"{ext}: {size} bytes"


def test_public_names():
    from attnx import callbacks, datasets, layers, losses, metrics, optimizers, text
    for name in ("Dense", "Embedding", "Dropout", "Activation", "Concatenate", "Add", "Flatten", "Reshape",
                 "GlobalAveragePooling1D", "Layer"):
        assert isinstance(getattr(layers, name), type), name
        assert name in layers.__all__
    assert attnx.Sequential and attnx.Model and callable(attnx.Input) and callable(attnx.load_model)
    assert issubclass(attnx.Sequential, attnx.Model) and issubclass(attnx.Model, layers.Layer)
    for name in ("SGD", "Adam", "AdamW", "RMSprop", "ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay"):
        assert isinstance(getattr(optimizers, name), type), name
    for name in ("BinaryCrossentropy", "SparseCategoricalCrossentropy", "CategoricalCrossentropy",
                 "MeanSquaredError", "binary_crossentropy", "mse"):
        assert hasattr(losses, name), name
    for name in ("BinaryAccuracy", "Precision", "Recall", "F1Score", "SparseCategoricalAccuracy"):
        assert hasattr(metrics, name), name
    for name in ("Callback", "History", "EarlyStopping", "ModelCheckpoint"):
        assert hasattr(callbacks, name), name
    assert callable(text.Tokenizer) and callable(text.pad_sequences)
    assert callable(datasets.load_uci_sentiment)
    assert callable(attnx.interop.from_torch) and callable(attnx.interop.to_torch)
    assert callable(attnx.plot.attention_heatmap)
    assert callable(attnx.testing.gradcheck) and callable(attnx.testing.torch_parity)
    assert callable(attnx.set_random_seed) and isinstance(attnx.__version__, str)
    with pytest.raises(AttributeError):
        attnx.no_such_name


def test_attention_heatmap_draws(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    ax = attnx.plot.attention_heatmap([[0.7, 0.3], [0.1, 0.9]], source_tokens=["a", "b"], target_tokens=["x", "y"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    ax.figure.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 0
    import matplotlib.pyplot as plt
    plt.close("all")


def test_ctest_cpp_unit_tests():
    cmake, ctest = shutil.which("cmake"), shutil.which("ctest")
    assert cmake and ctest, "cmake/ctest are required to build and run the C++ unit tests"
    build = REPO / "build" / "ctest"
    configure = subprocess.run([cmake, "-S", str(REPO), "-B", str(build), "-DATTNX_BUILD_TESTS=ON",
                                "-DCMAKE_POLICY_VERSION_MINIMUM=3.5", "-DCMAKE_BUILD_TYPE=Release"],
                               capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    built = subprocess.run([cmake, "--build", str(build), "-j", str(os.cpu_count() or 2)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-3000:]
    run = subprocess.run([ctest, "--test-dir", str(build), "--output-on-failure", "--no-tests=error",
                          "-j", str(os.cpu_count() or 2)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert "100% tests passed" in run.stdout
    n_sources = len(list((REPO / "cpp" / "tests").glob("test_*.cpp")))
    assert n_sources >= 1 and f"out of {n_sources}" in run.stdout
