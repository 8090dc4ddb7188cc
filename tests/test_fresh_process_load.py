"""The fresh-process load contract (issue 43): every public layer and model class of attnx, saved in
this process, loads in another one that imported nothing but ``attnx`` (one subprocess for all the
files), and predicts exactly what it predicted here.

The cases: every layer of `attnx.layers` (the layer-contract cases, each in a functional model of its
one call), the layers of the other public modules (`hierarchical.ContextAttention`) and every model
class (Sequential, functional, Seq2Seq with either decoder, Transformer, ImageCaptioner, HAN, DRAW, an
int8 model). `test_every_public_class_is_covered` fails when a public class appears in no saved file.
"""
import importlib
import inspect
import json
import pickle
import pkgutil
import subprocess
import sys

import numpy as np
import pytest

import attnx
import test_fuzz_loaders
import test_layer_contract
from attnx import layers
from attnx.layers.base import Layer

LAZY_MODULES = ("attnx.draw", "attnx.hierarchical")  # not imported by `import attnx`


# ----------------------------------------------------------------------------- the cases
# Each case: () -> (model, how the loaded model is used: [(method, args, kwargs), ...]).
def _layer_case(name):
    def make():
        make_layer, spec = test_layer_contract.CASES[name]
        spec = spec(np.random.default_rng(7), 2, 4)
        tensors, outputs = test_layer_contract._symbolic_call(make_layer(), spec)
        return attnx.Model(tensors, outputs), [("predict", ([a for a, _ in spec],), {"verbose": 0})]
    return make


def _context_attention():
    from attnx.hierarchical import ContextAttention
    inputs = attnx.Input((5, 4))
    pooled, _ = ContextAttention(3)(inputs)
    model = attnx.Model(inputs, layers.Dense(2)(pooled))
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    return model, [("predict", (x,), {"verbose": 0})]


def _model_case(name):
    def make():
        model, x = test_fuzz_loaders.MODELS[name]()
        if x is None:  # the Transformer: its tokenizers are saved with it
            return model, [("translate_batch", (["the cat sat .", "a dog"],), {})]
        uses = [("predict", (x,), {"verbose": 0})]
        if name == "DRAW":  # trained as its docstring says, fit(images); its default compile's loss (kl_mean)
            model.fit(x, epochs=1, batch_size=2, verbose=0)  # is then found without custom_objects
            uses.append(("evaluate", (x,), {"verbose": 0}))
        return model, uses
    return make


def _seq2seq_luong():
    from attnx.seq2seq import Seq2Seq
    model = Seq2Seq(13, 13, embedding_dim=8, units=8, attention="luong", cell="lstm", bidirectional=True,
                    start_token=1, end_token=2, max_length=6)
    model.compile("adam")
    return model, [("predict", (np.array([[3, 4, 5, 0], [6, 7, 0, 0]]),), {"verbose": 0})]


def _int8():
    model, x = test_fuzz_loaders.MODELS["Sequential"]()
    model.quantize("int8")
    return model, [("predict", (x,), {"verbose": 0})]


# ContextAttention first: the file that once needed `import attnx.hierarchical` before load_model
CASES = {"ContextAttention": _context_attention}
CASES.update({name: _layer_case(name) for name in sorted(test_layer_contract.CASES)})
# (not the loader fuzzer's "subclassed" model: a class of yours loads where its module is imported, as in Keras)
CASES.update({name: _model_case(name) for name in test_fuzz_loaders.MODELS if name != "subclassed"})
CASES.update({"Seq2Seq(luong)": _seq2seq_luong, "int8 Sequential": _int8})


_LOAD_ALL = r"""
import json, pickle, sys
import numpy as np
import attnx

fresh = sorted(m for m in sys.argv[3].split(",") if m in sys.modules)
results = {}
for name, path, uses in json.load(open(sys.argv[1])):
    try:
        attnx.set_random_seed(0)
        model = attnx.load_model(path)
        out = []
        for method, args, kwargs in pickle.load(open(uses, "rb")):
            attnx.set_random_seed(0)
            out.append(getattr(model, method)(*args, **kwargs))
        results[name] = out
    except Exception as exc:  # reported per class, not the first one only
        results[name] = f"{type(exc).__name__}: {exc}"
pickle.dump({"imported_at_start": fresh, "results": results}, open(sys.argv[2], "wb"))
"""


def _public_classes():
    """Every public Layer subclass (models included) defined in attnx's modules."""
    found = set()
    for info in pkgutil.walk_packages(attnx.__path__, "attnx."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, Layer) and obj is not Layer and not name.startswith("_")
                    and obj.__module__ == module.__name__):
                found.add(obj)
    return found


def _classes_in(model):
    """The classes of `model` and of every layer it holds, at any depth."""
    seen, todo = set(), [model]
    while todo:
        layer = todo.pop()
        if id(layer) in {id(s) for s in seen}:
            continue
        seen.add(layer)
        todo += list(getattr(layer, "layers", []) or [])
        todo += [sub for _, sub in layer._sublayers()]
    return {type(layer) for layer in seen}


def _assert_equal(got, expected, what):
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), what
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_equal(g, e, f"{what}[{i}]")
    elif isinstance(expected, np.ndarray):
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        assert got == expected, what


@pytest.fixture(scope="module")
def saved_and_loaded(tmp_path_factory):
    """Every case saved here, loaded in one fresh process: {name: (expected, got, classes)}, and the
    lazy modules the fresh process held before its first load."""
    folder = tmp_path_factory.mktemp("fresh")
    manifest, expected, classes = [], {}, {}
    for i, (name, make) in enumerate(CASES.items()):
        attnx.set_random_seed(0)
        model, uses = make()
        path, uses_path = folder / f"{i}.attnx", folder / f"{i}.uses.pkl"
        model.save(path)
        uses_path.write_bytes(pickle.dumps(uses))
        expected[name] = []
        for method, args, kwargs in uses:
            attnx.set_random_seed(0)
            expected[name].append(getattr(model, method)(*args, **kwargs))
        classes[name] = _classes_in(model)
        manifest.append((name, str(path), str(uses_path)))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    done = subprocess.run([sys.executable, "-c", _LOAD_ALL, str(folder / "manifest.json"), str(folder / "out.pkl"),
                           ",".join(LAZY_MODULES)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = pickle.loads((folder / "out.pkl").read_bytes())
    return expected, out, classes


def test_the_loading_process_starts_without_the_lazy_modules(saved_and_loaded):
    _, out, _ = saved_and_loaded
    assert out["imported_at_start"] == [], "the fresh process imported them before load_model: the check is void"


@pytest.mark.parametrize("name", list(CASES))
def test_a_saved_class_loads_in_a_fresh_process_and_predicts_the_same(saved_and_loaded, name):
    expected, out, _ = saved_and_loaded
    got = out["results"][name]
    assert not isinstance(got, str), f"{name} did not load in a fresh process: {got}"
    _assert_equal(got, expected[name], f"{name} after loading in a fresh process")


def test_every_public_class_is_covered(saved_and_loaded):
    _, _, classes = saved_and_loaded
    covered = set().union(*classes.values())
    missing = sorted(f"{c.__module__}.{c.__name__}" for c in _public_classes() - covered)
    assert not missing, f"public classes saved by no fresh-process case: {missing}"


def test_arrays_from_another_process_reach_the_kernels():
    """Arrays that crossed a process boundary (pickled, as multiprocessing and a DataLoader's workers
    send them) carry a dtype object equal to NumPy's own but not it: the kernels take them (they were
    refused as "expected float32 or float64, got float32"); byte-swapped ones are converted or refused."""
    from attnx import _core
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    kernel, bias = rng.standard_normal((4, 2)).astype(np.float32), np.zeros(2, np.float32)
    moved = pickle.loads(pickle.dumps((x, kernel, bias)))
    assert moved[0].dtype is not x.dtype and moved[0].dtype == x.dtype  # what made the kernels refuse them
    want, _ = _core.dense_forward(x=x, kernel=kernel, bias=bias, activation="linear")
    got, _ = _core.dense_forward(x=moved[0], kernel=moved[1], bias=moved[2], activation="linear")
    np.testing.assert_array_equal(got, want)
    ids = pickle.loads(pickle.dumps(np.array([[1, 2], [0, 3]], np.int64)))
    table = pickle.loads(pickle.dumps(rng.standard_normal((4, 3)).astype(np.float64)))
    np.testing.assert_array_equal(_core.embedding_forward(ids=ids, table=table), table[ids])
    model = attnx.Sequential([layers.Embedding(4, 3, input_shape=(2,)), layers.LSTM(2), layers.Dense(1)])
    np.testing.assert_array_equal(model.predict(ids, verbose=0), model.predict(ids.copy(), verbose=0))
    swapped = x.astype(">f4")
    with pytest.raises(TypeError, match="dense_forward"):
        _core.dense_forward(x=swapped, kernel=kernel, bias=bias, activation="linear")
    dense = layers.Dense(2)
    np.testing.assert_array_equal(dense(swapped), dense(x))  # the layer converts it
