"""python/attnx/_core.pyi matches the built module: a stub for every binding, with the binding's
keyword names in order and a default exactly where the binding has one (pybind11 writes each
function's signature on the first line of its __doc__)."""
import ast
import pathlib
import re

import pytest

import attnx
from attnx import _core

STUB = pathlib.Path(attnx.__file__).with_name("_core.pyi")


def _split_top_level(params):
    """Splits 'a: X[b, c], d: int = 1' at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        depth += ch in "[(" and 1 or 0
        depth -= ch in "])" and 1 or 0
        if ch == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    if params[start:].strip():
        parts.append(params[start:])
    return [p.strip() for p in parts]


def binding_signature(fn):
    """[(name, has_default)] from the first line of a pybind11 function's __doc__."""
    first = fn.__doc__.splitlines()[0]
    m = re.match(rf"{re.escape(fn.__name__)}\((.*)\) -> .+$", first)
    assert m, f"unexpected signature line {first!r}"
    return [(p.split(":")[0].strip(), "=" in p) for p in _split_top_level(m.group(1))]


def stub_signatures():
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            a = node.args
            positional = a.posonlyargs + a.args
            defaulted = set(p.arg for p in positional[len(positional) - len(a.defaults):])
            defaulted |= {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
            out[node.name] = [(p.arg, p.arg in defaulted) for p in positional + a.kwonlyargs]
    return out


BINDINGS = sorted(n for n in dir(_core) if not n.startswith("__") and callable(getattr(_core, n))
                  and not isinstance(getattr(_core, n), type))
CLASSES = sorted(n for n in dir(_core) if isinstance(getattr(_core, n), type))  # e.g. Int8Kernel


def test_every_class_has_a_stub():
    stubbed = {node.name for node in ast.parse(STUB.read_text()).body if isinstance(node, ast.ClassDef)}
    assert sorted(set(CLASSES) - stubbed) == []


def test_stub_ships_with_the_package():
    assert STUB.is_file()
    assert STUB.with_name("py.typed").is_file()


def test_every_stub_is_a_binding():
    assert sorted(set(stub_signatures()) - set(BINDINGS)) == []


@pytest.mark.parametrize("name", BINDINGS)
def test_stub_matches_binding(name):
    stubs = stub_signatures()
    assert name in stubs, f"_core.{name} has no stub in {STUB.name}"
    assert stubs[name] == binding_signature(getattr(_core, name)), f"_core.{name}: stub and binding differ"


def test_every_binding_argument_is_named():
    """Python calls _core with keywords: no binding has pybind11's anonymous arg0, arg1, ..."""
    for name in BINDINGS:
        names = [n for n, _ in binding_signature(getattr(_core, name))]
        assert not any(re.fullmatch(r"arg\d+", n) for n in names), f"_core.{name}: unnamed argument"
