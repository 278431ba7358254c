"""The import graph of ``sagc_jax/``: no cycles, no import back up a layer, no class defined twice,
and modules / classes / functions within the house's sizes (600 / 400 / 120 lines).

Every import counts, also those inside functions (a lazy import that dodges a cycle is still a
cycle). The layer order is documented in docs/architecture.md ("Layers"); a module may import
only from its own layer or the layers below. Run as a script to print the graph's violations.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "sagc_jax"

#: Layers, lowest first: a module or package (dotted, under ``sagc_jax``) per entry. A module
#: belongs to the longest entry that prefixes it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "checksum", "runlock", "fakepod", "hostmem"),
    ("config",),
    ("parallel", "hosts", "shapes", "optim", "models", "memory_estimate", "metrics", "plots"),
    ("sagc", "data", "sampling", "rl", "rewards", "restore", "checkpoint", "envs"),
    ("rollout", "open_run", "evaluate", "export"),
    ("train", "compiled_memory", "dryrun_report", "dryrun_inputs", "dryrun"),
    ("experiments",),
    ("cli", "cli_errors"),
)


def modules(pkg: Path = PKG) -> dict[str, Path]:
    """Dotted module name (``sagc_jax.x.y``; a package by its ``__init__``) -> file."""
    out = {}
    for f in sorted(pkg.rglob("*.py")):
        parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _targets(cur: str, is_pkg: bool, node: ast.Import | ast.ImportFrom,
             mods: dict[str, Path]) -> set[str]:
    """The ``sagc_jax`` modules one import statement runs (``from a import b``: ``a``, and
    ``a.b`` too when ``b`` is a module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = cur.split(".") if is_pkg else cur.split(".")[:-1]
            pkg = pkg[:len(pkg) - node.level + 1]
            base = ".".join([*pkg, *([base] if base else [])])
        names = [base, *(f"{base}.{a.name}" for a in node.names)]
    out = set()
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != cur and name != "sagc_jax" and not cur.startswith(name + "."):
            out.add(name)
    return out


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (functions included).

    A package's own ``__init__`` is not counted as imported by its submodules (Python runs it
    first anyway, and it may re-export them)."""
    mods = modules(pkg)
    graph = {}
    for m, f in mods.items():
        is_pkg = f.name == "__init__.py"
        graph[m] = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[m] |= _targets(m, is_pkg, node, mods)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of ``sagc_jax.<...>`` (the longest matching entry wins)."""
    rel = module.removeprefix("sagc_jax.")
    best, best_len = None, -1
    for i, layer in enumerate(LAYERS):
        for entry in layer:
            if (rel == entry or rel.startswith(entry + ".")) and len(entry) > best_len:
                best, best_len = i, len(entry)
    if best is None:
        raise KeyError(f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)")
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import from a higher layer than the importer's."""
    return [f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})"
            for a, targets in sorted(graph.items()) for b in sorted(targets)
            if layer_of(b) > layer_of(a)]


def class_definitions(pkg: Path = PKG) -> Counter[str]:
    """How many times each top-level or nested class name is defined in the package."""
    names: Counter[str] = Counter()
    for f in sorted(pkg.rglob("*.py")):
        names.update(n.name for n in ast.walk(ast.parse(f.read_text()))
                     if isinstance(n, ast.ClassDef))
    return names


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_import_up_a_layer():
    assert upward_imports(import_graph()) == []


def test_every_module_has_a_layer():
    for m in modules():
        if m != "sagc_jax":
            layer_of(m)


def test_no_class_defined_twice():
    assert [n for n, k in class_definitions().items() if k > 1] == []


def oversized(pkg: Path = PKG) -> list[str]:
    """Modules over 600 lines, classes over 400, functions over 120 (the house rules)."""
    out = []
    for f in sorted(pkg.rglob("*.py")):
        src = f.read_text()
        rel = f.relative_to(pkg.parent)
        if len(src.splitlines()) > 600:
            out.append(f"{rel}: {len(src.splitlines())} lines")
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = 400 if isinstance(n, ast.ClassDef) else 120
                if n.end_lineno - n.lineno + 1 > limit:
                    out.append(f"{rel}: {n.name} {n.end_lineno - n.lineno + 1} lines")
    return out


def test_modules_classes_and_functions_stay_small():
    assert oversized() == []


def test_the_checks_catch_what_they_guard(tmp_path):
    """A lazy import inside a function closes a cycle; a relative import resolves."""
    pkg = tmp_path / "sagc_jax"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "data" / "a.py").write_text("from .b import f\n")
    (pkg / "data" / "b.py").write_text("def f():\n    from sagc_jax.data import a\n")
    (pkg / "cli.py").write_text("class X: ...\n")
    (pkg / "errors.py").write_text("import sagc_jax.cli\nclass X: ...\n")
    g = import_graph(pkg)
    assert g["sagc_jax.data.a"] == {"sagc_jax.data.b"}
    assert cycles(g) == [["sagc_jax.data.a", "sagc_jax.data.b"]]
    assert upward_imports(g) == ["sagc_jax.errors (layer 0) -> sagc_jax.cli (layer 7)"]
    assert class_definitions(pkg)["X"] == 2


#: Issue 52's core path: the loop, the learner, the step, the batch layout, the rollout and the
#: rewards (docs/architecture.md, "The core path"). At the issue's filing the same roles took
#: 2,415 lines; `CORE_PATH_MAX` is what they take now, so the path cannot grow back unnoticed.
CORE_PATH = ("train/loop.py", "train/learner.py", "rl/train_step.py", "rl/batch.py",
             "rl/packing.py", "rollout/collect.py", "rewards/__init__.py", "rewards/registry.py",
             "rewards/runner.py", "rewards/answers.py")
CORE_PATH_MAX = 1879


def core_path_lines() -> int:
    """`wc -l` of the core path (blank lines and docstrings included)."""
    return sum(len((PKG / f).read_text().splitlines()) for f in CORE_PATH)


def test_core_path_stays_short():
    assert core_path_lines() <= CORE_PATH_MAX, (
        f"the core path grew to {core_path_lines()} lines (cap {CORE_PATH_MAX}): shorten it, "
        "or raise the cap here and in docs/architecture.md with a reason")
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The core path"):]
    section = section[:section.find("\n## ", 1)]
    assert all(f"sagc_jax/{f}" in section for f in CORE_PATH)
    assert f"{CORE_PATH_MAX:,}" in section


def test_architecture_doc_names_the_layers():
    """docs/architecture.md's layer list names every entry of LAYERS, in order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layers"):]
    section = section[:section.find("\n## ", 1)]
    pos = [section.find(f"`{e}") for layer in LAYERS for e in layer]
    assert all(p >= 0 for p in pos), [e for layer in LAYERS for e in layer
                                      if section.find(f"`{e}") < 0]



def test_architecture_doc_cites_real_modules():
    """Every ``x.py`` / ``dir/x.py`` docs/architecture.md names in backticks is a file of the
    package (a bare name may sit in any sub-package, as in "`rl/advantages.py`, `losses.py`")
    or of the repository (``tests/...``)."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    files = {f.relative_to(PKG).as_posix() for f in PKG.rglob("*.py")}
    cited = set(re.findall(r"`([\w/]+\.py)", text))
    missing = [c for c in sorted(cited) if not (ROOT / c).is_file()
               and not any(f == c or f.endswith("/" + c) for f in files)]
    assert cited and missing == []


def top_level_imports(files: list[Path]) -> dict[str, set[str]]:
    """File (relative to the root) -> the top-level names of its absolute imports."""
    out = {}
    for f in files:
        names = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        out[f.relative_to(ROOT).as_posix()] = names
    return out


def test_research_code_stays_out_of_the_way():
    """Issue 52: the product imports neither the tested tools nor the research code; the tests
    and the tools never import the research code (benchmarks/, run by hand)."""
    product = top_level_imports(sorted(PKG.rglob("*.py")))
    assert {f: n & {"tools", "benchmarks"} for f, n in product.items()
            if n & {"tools", "benchmarks"}} == {}
    others = top_level_imports(sorted([*(ROOT / "tests").glob("*.py"),
                                       *(ROOT / "tools").rglob("*.py")]))
    assert [f for f, n in others.items() if "benchmarks" in n] == []
    assert any("tools" in n for f, n in others.items() if f.startswith("tests/"))


def test_research_code_uses_public_names_only():
    """benchmarks/ imports only public names of sagc_jax (no ``_private`` module or name): what
    it measures is what a user can call, and a refactor of internals does not break it."""
    bad = []
    for f in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sagc_jax"):
                names = [*node.module.split("."), *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [p for a in node.names if a.name.startswith("sagc_jax")
                         for p in a.name.split(".")]
            else:
                continue
            bad += [f"{f.relative_to(ROOT)}:{node.lineno}" for n in names if n.startswith("_")]
    assert bad == []


if __name__ == "__main__":
    g = import_graph()
    for c in cycles(g):
        print("import cycle:", " <-> ".join(c))
    for line in upward_imports(g):
        print("up a layer:", line)
    for line in oversized():
        print("too long:", line)
    print(f"core path: {core_path_lines()} lines (cap {CORE_PATH_MAX})")
    for name, k in sorted(class_definitions().items()):
        if k > 1:
            print(f"class {name} defined {k} times")
    sys.exit(0)
