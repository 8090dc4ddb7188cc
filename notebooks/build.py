"""Builds the tutorial notebooks from their sources and (optionally) runs them.

    python notebooks/build.py            # notebooks/src/*.py -> notebooks/*.ipynb (no outputs)
    python notebooks/build.py --execute  # ... and run each in full mode, keeping the outputs

Sources are Python files in the "percent" format: a line ``# %%`` starts a code cell and
``# %% [markdown]`` a markdown cell whose lines are comments (``# text``).
"""
import pathlib
import sys

import nbformat

HERE = pathlib.Path(__file__).parent


def cells_from_source(text):
    cells, kind, lines = [], None, []

    def flush():
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif kind == "code" and body:
            cells.append(nbformat.v4.new_code_cell(body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def build(source):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_from_source(source.read_text())
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(nb, cwd, timeout=3600):
    from nbclient import NotebookClient
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def main(argv):
    run = "--execute" in argv
    names = [a for a in argv if not a.startswith("--")]
    for source in sorted((HERE / "src").glob("*.py")):
        if names and source.stem not in names:
            continue
        nb = build(source)
        if run:
            print(f"running {source.stem} ...", flush=True)
            execute(nb, HERE)
        nbformat.write(nb, HERE / f"{source.stem}.ipynb")
        print(f"wrote notebooks/{source.stem}.ipynb")


if __name__ == "__main__":
    main(sys.argv[1:])
