"""The package's structure: the imports of python/attnx form a graph without cycles, layer modules
do not import interop, models or saving, and the code's design references point at a file that
exists (ARCHITECTURE.md)."""
import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "attnx"
ROOT = PACKAGE.parents[1]


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    found = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found["attnx._core"] = PACKAGE / "_core.pyi"  # the extension module: imports nothing of ours
    return found


def _imports(name, path, modules):
    """The attnx modules `name` imports anywhere in its file (function-level imports included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    if path.suffix == ".pyi":
        return found
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from . import x` imports the submodule x when there is one, else a name of the package
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import attnx.layers.core.Dense`-like: the longest module prefix
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph):
    """One import cycle as a list of module names, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("layer_module", sorted(m for m in _modules() if m.startswith("attnx.layers")))
def test_layers_do_not_import_interop_models_or_saving(layer_module):
    graph = _graph()
    banned = {m for m in graph[layer_module]
              if m.startswith(("attnx.interop", "attnx.models", "attnx.saving", "attnx.seq2seq"))}
    assert not banned, f"{layer_module} imports {sorted(banned)}"


def test_design_references_point_at_architecture_md():
    assert (ROOT / "ARCHITECTURE.md").is_file()
    stale = []
    for path in list(PACKAGE.rglob("*.py")) + list((ROOT / "cpp").rglob("*.[hc]pp")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bDESIGN\.md\b", line):
                stale.append(f"{path.relative_to(ROOT)}:{i}")
    assert not stale, f"references to a DESIGN.md the repository does not have: {stale}"


def _architecture_sections():
    return {line.lstrip("#").strip() for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines()
            if line.startswith("## ")}


def test_code_names_only_sections_architecture_md_has():
    """Comments like `(ARCHITECTURE.md, "The mask rule")` name a section that exists."""
    sections, stale = _architecture_sections(), []
    for path in list(PACKAGE.rglob("*.py")) + list((ROOT / "cpp").rglob("*.[hc]pp")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for name in re.findall(r'ARCHITECTURE\.md,? (?:section )?"([^"]+)"', line):
                if not any(s == name or s.startswith(name + " (") for s in sections):  # "Interop (`attnx.interop`)"
                    stale.append(f"{path.relative_to(ROOT)}:{i}: {name!r}")
    assert not stale, f"sections ARCHITECTURE.md does not have: {stale}; it has {sorted(sections)}"


def test_files_architecture_md_names_exist():
    """Every `path` in backquotes that looks like a repository file (python/, cpp/, tests/, ...) exists,
    and so does every module file it names under python/attnx (`layers/core.py`, `seq2seq.hpp`)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    missing = []
    for ref in sorted(set(re.findall(r"`([\w./-]+\.(?:py|hpp|cpp|c|md|toml|sh|pyi))`", text))):
        candidates = [ROOT / ref, PACKAGE / ref, ROOT / "cpp" / "include" / "attnx" / ref, ROOT / "cpp" / "bindings" / ref,
                      ROOT / "cpp" / ref, ROOT / "tests" / ref, ROOT / "benchmarks" / ref, ROOT / "examples" / ref]
        # a bare file name may be one of a package's modules (`graph.py` of attnx.models)
        if not any(c.exists() for c in candidates) and not ("/" not in ref and any(PACKAGE.rglob(ref))):
            missing.append(ref)
    assert not missing, f"ARCHITECTURE.md names files that do not exist: {missing}"


def test_model_code_reaches_the_kernels_through_attnx_kernels():
    """Layers, ops, the decoders and the tape call the C++ kernels through one module, attnx.kernels;
    only it, the optimizers, the losses and the process settings import _core (ARCHITECTURE.md)."""
    allowed = {"attnx", "attnx.kernels", "attnx.optimizers", "attnx.losses", "attnx.backend"}
    graph = _graph()
    direct = sorted(m for m, imported in graph.items() if "attnx._core" in imported and m not in allowed)
    assert not direct, f"modules calling _core directly instead of attnx.kernels: {direct}"


# ----------------------------------------------------------------------------- no twins
def _shape_lines(source):
    """The lines of Python `source` as token shapes (names, strings and numbers as placeholders;
    keywords kept), without comments, imports, docstring or string-table lines and lone brackets:
    [(line number, shape)]."""
    import io
    import keyword
    import tokenize
    kept = set(keyword.kwlist) | {"self", "cls", "np", "None", "True", "False"}
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines = {}
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type in skip:
            continue
        if t.type == tokenize.NAME and t.string not in kept:
            shape = "N"
        elif t.type in (tokenize.STRING, tokenize.NUMBER):
            shape = "S" if t.type == tokenize.STRING else "0"
        else:
            shape = t.string
        lines.setdefault(t.start[0], []).append(shape)
    return [(n, " ".join(tokens)) for n, tokens in sorted(lines.items())
            if len(tokens) > 2 and tokens[0] not in ("import", "from", "S")]


def _repeated_blocks(sources, lines=10):
    """Pairs of places (file, line) where `lines` consecutive lines of the same shape stand twice."""
    windows = {}
    for name, source in sources.items():
        shapes = _shape_lines(source)
        for i in range(len(shapes) - lines + 1):
            key = "\n".join(s for _, s in shapes[i:i + lines])
            windows.setdefault(key, []).append((name, shapes[i][0], shapes[i + lines - 1][0]))
    pairs = set()
    for places in windows.values():
        for i, (file_a, start_a, end_a) in enumerate(places):
            for file_b, start_b, _ in places[i + 1:]:
                if file_a != file_b or start_b > end_a:  # overlapping windows of one run are not a twin
                    pairs.add((f"{file_a}:{start_a}", f"{file_b}:{start_b}"))
    return sorted(pairs)


def test_no_block_of_ten_lines_is_written_twice():
    """Issue 38: no block of 10 or more lines stands twice in python/attnx, the same lines or the same shape
    with other names, strings and numbers (one home per piece of logic)."""
    sources = {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}
    assert _repeated_blocks(sources) == []


def test_the_twin_detector_finds_a_renamed_copy():
    body = "\n".join(f"    total_{i} = weights[{i}] * inputs.sum(axis={i}) + bias" for i in range(12))
    renamed = body.replace("total", "acc").replace("weights", "kernel").replace("bias", "offset")
    assert _repeated_blocks({"a.py": f"def f(weights, inputs, bias):\n{body}\n",
                             "b.py": f"def g(kernel, inputs, offset):\n{renamed}\n"})
    assert not _repeated_blocks({"a.py": f"def f(weights, inputs, bias):\n{body}\n"})


# ----------------------------------------------------------------------------- one home per concept
_HOME = re.compile(r"^\| (?P<concept>[^|]+) \| `(?P<path>[^`:]+)(?:::(?P<name>\w+))?`")


def _homes():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## One home per concept", 1)[1].split("\n## ", 1)[0]
    return [m.groupdict() for m in map(_HOME.match, section.splitlines()) if m]


def _defined(name, source):
    return re.search(rf"^\s*(def|class) {name}\b|^{name} = ", source, re.M) is not None


def test_every_concept_has_its_one_home():
    """ARCHITECTURE.md's table names one home per concept (issue 38): the home defines the name, and no
    other module of the package defines a module-level function or class of that name (a second home;
    methods of that name are the models' and layers' own API over the home, as `Seq2Seq.beam_search`)."""
    homes = _homes()
    assert len(homes) >= 15
    sources = {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in PACKAGE.rglob("*.py")}
    for home in homes:
        assert home["path"] in sources, f"{home['concept']}: {home['path']} does not exist"
        if not home["name"]:
            continue
        assert _defined(home["name"], sources[home["path"]]), f"{home['path']} does not define {home['name']}"
        others = [path for path, source in sources.items() if path != home["path"] and
                  re.search(rf"^(def|class) {home['name']}\b", source, re.M)]
        assert not others, f"{home['concept']}: {home['name']} is also defined in {others}"
