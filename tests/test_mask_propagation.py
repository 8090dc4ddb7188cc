"""Mask propagation has one home (issue 38): `attnx.masking.call_mask` / `output_masks`, used by the
functional graph, the ONNX export, layers called on arrays inside `call` / GradientTape, and the Keras
file reader. A second copy of the rule (a comprehension over masks deciding whether any is set) fails here."""
import ast
import pathlib

import numpy as np

import attnx
from attnx import layers, masking

ROOT = pathlib.Path(attnx.__file__).parent
USERS = ["models/graph.py", "export/model.py", "layers/base.py", "interop/keras_file.py"]


def _propagation_copies(tree):
    """Comprehensions that look up the mask each input tensor carries, the shape of the propagation rule:
    ``[masks.get(id(t)) for t in inputs]``, ``[propagated.get(id(t)) ...]``, ``[_mask_of(x) for x in inputs]``,
    ``any(ref in masked for ...)``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            continue
        element = ast.unparse(node.elt)
        lookup = isinstance(node.elt, ast.Call) and ("mask_of" in element or (".get(id(" in element and any(
            word in element.lower() for word in ("mask", "propagated"))))
        membership = isinstance(node.elt, ast.Compare) and isinstance(node.elt.ops[0], ast.In) and \
            "mask" in ast.unparse(node.elt.comparators[0]).lower()
        if lookup or membership:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_mask_propagation_is_written_once():
    copies = {str(p.relative_to(ROOT)): hits for p in sorted(ROOT.rglob("*.py")) if p.name != "masking.py"
              for hits in [_propagation_copies(ast.parse(p.read_text()))] if hits}
    assert not copies, f"mask propagation written outside attnx/masking.py: {copies}"


def test_the_copy_detector_finds_the_old_copies():
    old = [
        "def f(masks, spec):\n    m = [masks.get(id(t)) for t in spec]\n    return any(v is not None for v in m)",
        "def g(inputs):\n    return [_mask_of(x) for x in inputs]",
        "def k(model, propagated):\n    return [propagated.get(id(t)) for t in model.outputs]",
        "def h(refs, masked):\n    return any(ref in masked for ref in refs)",
    ]
    assert all(_propagation_copies(ast.parse(code)) for code in old)


def test_every_propagating_module_asks_masking():
    for name in USERS:
        text = (ROOT / name).read_text()
        assert "call_mask(" in text, f"{name} does not propagate masks with attnx.masking.call_mask"
    assert "_masks = {}" not in (ROOT / "layers/base.py").read_text()  # the global table keyed by id went


def test_call_mask_rule():
    a, b = np.ones((2, 3), bool), np.zeros((2, 3), bool)
    masks = {1: a, 2: b}
    assert masking.call_mask(1, masks.get) is a
    assert masking.call_mask([1, 3], masks.get) == [a, None]
    assert masking.call_mask([3, 4], masks.get) is None
    assert masking.call_mask(1, masks.get, given=b) is b  # a mask given to the call wins
    assert masking.output_masks(["x", "y"], a) == [("x", a), ("y", None)]
    assert masking.output_masks(["x"], None) == [("x", None)]


def test_a_mask_reaches_the_next_layer_in_eager_calls_and_in_the_graph():
    ids = np.array([[3, 4, 0, 0], [5, 0, 0, 0]])
    embedding, pooling = layers.Embedding(10, 4, mask_zero=True), layers.GlobalAveragePooling1D()
    eager = pooling(embedding(ids))
    inp = attnx.Input((4,), dtype="int64")
    graph = attnx.Model(inp, pooling(embedding(inp))).predict(ids, verbose=0)
    vectors = embedding.params["embeddings"]
    expected = np.stack([vectors[[3, 4]].mean(0), vectors[[5]].mean(0)])
    np.testing.assert_allclose(eager, expected, rtol=1e-6)
    np.testing.assert_allclose(graph, expected, rtol=1e-6)
