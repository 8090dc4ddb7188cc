"""The translation notebooks against the examples they reuse (issues 41 and 42): the NMT notebook's
tutorial section imports `examples/nmt_tutorial.py` (the tutorial's model line for line) rather than a
copy of it; the transformer notebook reads its pairs and its time budget from `examples/translate_mar.py`,
as the examples do; each committed notebook is its source as `notebooks/build.py` builds it; and the
executed NMT notebook prints its alignment measure. (`test_notebooks.py` runs every notebook.)"""
import ast
import os
import pathlib
import sys

import nbformat
import pytest

import attnx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
sys.path.insert(0, str(ROOT / "examples"))
import build  # noqa: E402  (notebooks/build.py)
import translate_mar  # noqa: E402


def _tree(path):
    return ast.parse(path.read_text(encoding="utf-8"))


def _definitions(path):
    """The names of the classes and functions `path` defines at its top level."""
    return {node.name for node in _tree(path).body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}


def _calls(path, name):
    """The calls of `name` (a function or attribute name) anywhere in `path`."""
    return [node for node in ast.walk(_tree(path)) if isinstance(node, ast.Call) and
            (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)]


def test_nmt_notebook_imports_the_tutorial_instead_of_a_copy():
    notebook, tutorial = ROOT / "notebooks/src/nmt_attention.py", ROOT / "examples/nmt_tutorial.py"
    copied = _definitions(notebook) & _definitions(tutorial)
    assert not copied, f"nmt_attention.py defines the tutorial's {sorted(copied)} again: import nmt_tutorial"
    assert "import nmt_tutorial as tutorial" in notebook.read_text(encoding="utf-8")
    # the tutorial's decoder: its GRU restarts from zeros at every step (`self.gru(x)`)
    assert not [c for c in _calls(notebook, "gru") if c.keywords], "a GRU call with initial_state in the notebook"
    decoder = next(n for n in _tree(tutorial).body if isinstance(n, ast.ClassDef) and n.name == "Decoder")
    gru_calls = [n for n in ast.walk(decoder) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "gru"]
    assert len(gru_calls) == 1 and not gru_calls[0].keywords and len(gru_calls[0].args) == 1


def test_transformer_notebook_and_examples_load_pairs_through_one_helper():
    users = [ROOT / "notebooks/src/transformer_translation.py", ROOT / "examples/translate_mar.py",
             ROOT / "examples/translate_mar_transformer.py"]
    for path in users:
        direct = [c for c in _calls(path, "load_anki_pairs") if path.name != "translate_mar.py"]
        assert not direct, f"{path.name} calls load_anki_pairs itself: use translate_mar.load_pairs"
        assert _calls(path, "load_pairs"), f"{path.name} does not read its pairs with translate_mar.load_pairs"
    # one time-budget callback: the examples'
    notebook = ROOT / "notebooks/src/transformer_translation.py"
    assert not [n for n in _tree(notebook).body if isinstance(n, ast.ClassDef)]
    assert _calls(notebook, "StopAfter")


def test_load_pairs_is_the_examples_split_of_the_pairs():
    if not (pathlib.Path(os.environ["ATTNX_DATA_DIR"]) / "anki" / "mar.txt").exists():
        pytest.skip("no anki/mar.txt in ATTNX_DATA_DIR")
    ours = translate_mar.load_pairs(num_examples=400, raw=True)
    want = attnx.datasets.load_anki_pairs(max_words=10, num_examples=400, split=(0.8, 0.1, 0.1), seed=0, raw=True)
    assert ours == want
    assert [len(part.source) for part in ours] == [320, 40, 40]
    assert translate_mar.load_pairs(num_examples=400, seed=1) != translate_mar.load_pairs(num_examples=400)


@pytest.mark.parametrize("name", ["nmt_attention", "transformer_translation"])
def test_committed_notebook_is_its_source_built(name):
    committed = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    built = build.build(ROOT / "notebooks/src" / f"{name}.py")
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in built.cells], \
        f"notebooks/{name}.ipynb is stale: python notebooks/build.py {name}"


def test_executed_nmt_notebook_prints_the_alignment_measure():
    notebook = nbformat.read(ROOT / "notebooks/nmt_attention.ipynb", as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "nmt_attention.ipynb is not executed: notebooks/build.py --execute"
    cell = next(c for c in code if "word_alignment(alignment_examples" in c.source)
    printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    for name in ("Bahdanau", "Luong (general)"):
        assert name in printed and "aligned" in printed and "mass" in printed, printed
