"""Every example in attnx's public docstrings runs as written (issue 41): the ``>>>`` examples of every
module, class, function and method of `python/attnx` (doctest: the printed results must match), and any
fenced ```python block in a docstring (run as the README's blocks are). A test that finds no example fails,
so the collection cannot silently go empty."""
import doctest
import importlib
import pkgutil
import re

import pytest

import attnx

_FENCED = re.compile(r"```python\n(.*?)```", re.S)


def _public_modules():
    names = ["attnx"] + [m.name for m in pkgutil.walk_packages(attnx.__path__, "attnx.")
                         if not any(part.startswith("_") for part in m.name.split("."))]
    modules = []
    for name in sorted(names):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:  # a module for an optional package (e.g. ctranslate2) that is not installed
            continue
    return modules


def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {}
    for module in _public_modules():
        for test in finder.find(module):
            if test.examples and test.name not in found:
                found[test.name] = test
    return sorted(found.values(), key=lambda t: t.name)


def _fenced_blocks():
    blocks = []
    for module in _public_modules():
        members = [(f"{module.__name__}.{k}", v) for k, v in vars(module).items()
                   if getattr(v, "__module__", None) == module.__name__]
        for obj_name, obj in [(module.__name__, module)] + members:
            for i, code in enumerate(_FENCED.findall(getattr(obj, "__doc__", None) or "")):
                blocks.append((f"{obj_name}[{i}]", code))
    return blocks


DOCTESTS = _doctests()
FENCED = _fenced_blocks()


def test_the_docstrings_hold_examples():
    assert len(DOCTESTS) >= 3


def _failures(test):
    """The number of failed examples of a DocTest, run in a copy of its globals."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    test.globs = dict(test.globs)
    report = []
    runner.run(test, out=report.append)
    return runner.summarize(verbose=False).failed, "".join(report)


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_docstring_example_runs(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    failed, report = _failures(test)
    assert failed == 0, report


def test_a_wrong_example_fails():
    wrong = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "wrong", None, 0)
    assert _failures(wrong)[0] == 1


def test_docstring_fenced_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, code in FENCED:  # none today: a block added to a docstring runs here
        exec(compile(code, name, "exec"), {"__name__": "__docstring__"})
