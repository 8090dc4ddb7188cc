"""The README's Python code blocks run as written (issue 31), in order, in one namespace (a block
uses what the blocks before it made, as a reader's session would), in a fresh folder. A block is left
out only where the README says so on the line before it: ``<!-- readme-test: skip (reason) -->``
(a file the reader brings, an MPI job, minutes of training); the test checks every such block
gives its reason, and that the blocks that run include the Quick start and the ONNX one."""
import contextlib
import io
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# guides whose blocks run on their own, each in its own namespace (the others need the README's
# model, a file the reader brings, MPI or minutes of training, and say so block by block)
GUIDES = [ROOT / "docs" / "guides" / "layers-and-models.md", ROOT / "docs" / "guides" / "int8.md"]
SKIP = re.compile(r"<!-- readme-test: skip \((.+)\) -->")


def readme_blocks(path=README):
    """[(line number, code, skip reason or None)] of the ```python blocks of a Markdown file."""
    lines, blocks = path.read_text(encoding="utf-8").splitlines(), []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = lines.index("```", i + 1)
            before = lines[i - 1] if i else ""
            reason = SKIP.fullmatch(before.strip())
            blocks.append((i + 1, "\n".join(lines[i + 1:end]), reason.group(1) if reason else None))
            i = end
        i += 1
    return blocks


def test_every_left_out_block_says_why_and_the_main_ones_run():
    blocks = readme_blocks()
    assert all(reason is None or len(reason) > 10 for _, _, reason in blocks)
    running = [code for _, code, reason in blocks if reason is None]
    assert any("model.fit(x, labels" in code for code in running)  # the Quick start
    assert any("OnnxModel" in code for code in running)
    markers = README.read_text(encoding="utf-8").count("<!-- readme-test:")
    assert markers == sum(reason is not None for _, _, reason in blocks)  # no marker off a block


def test_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for line, code, reason in readme_blocks():
        if reason is not None:
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                exec(compile(code, f"README.md (block at line {line})", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"README.md block at line {line} failed: {type(exc).__name__}: {exc}") from exc
    # what the blocks claim: the ONNX model gives predict's numbers, from int32 ids
    ids = namespace["ids"]
    assert ids.dtype.name == "int32"
    expected = namespace["model"].predict(ids, verbose=0)
    assert abs(namespace["probabilities"] - expected).max() < 1e-5
    assert os.path.exists("sentiment.attnx") and os.path.exists("sentiment.onnx")


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide_python_blocks_run_as_written(guide, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__guide__"}
    ran = 0
    for line, code, reason in readme_blocks(guide):
        if reason is not None:
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                exec(compile(code, f"{guide.name} (block at line {line})", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"{guide.name} block at line {line} failed: {type(exc).__name__}: {exc}") from exc
        ran += 1
    assert ran >= 1
