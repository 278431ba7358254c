"""Check that the docs cite only files, modules and link targets that exist.

Read: ``README.md``, ``benchmarks/*.md`` and every ``docs/**/*.md``. Checked:

* **Module paths** in backticks: ``sagc_jax/sampling/engine.py``, ``models/llama.py`` (relative to
  ``sagc_jax/``), ``tests/test_x.py``; any backticked path ending in ``.py`` must be a file under
  the repository root or under ``sagc_jax/``; a bare ``name.py`` must name some file of the
  package, ``tools/``, ``benchmarks/``, ``tests/`` or ``launch/``.
* **Dotted module names** in backticks: ``sagc_jax.sagc.config`` (or ``sagc_jax.evaluate``, or
  ``sagc_jax.config.Config``): each part must be a subpackage or module, or a name that the
  package's ``__init__.py`` mentions.
* **Repository files** in backticks whose first folder is a tracked top-level folder
  (``configs/``, ``launch/``, ``tools/``, ``benchmarks/``, ``docs/``, ``tests/``): they must
  exist (a ``*`` glob must match something).
* **Markdown files named** anywhere in the text as a path (``docs/sagc.md``) or an upper-case
  name (``DESIGN.md``; a lower-case ``results.md`` is usually a file a command writes): they must
  exist beside the file, under the root or under ``docs/`` (not checked in the generated
  ``docs/config.md``, whose text is the schema's doc strings).
* **Module tables** (``| `train/state.py` | `RunState` ... |``): a class-like name in a row
  must be defined in the row's modules, a called name (``build_run(cfg)``) must occur there.
* **Relative markdown links** ``[text](path#anchor)``: the path, resolved from the linking file,
  must exist.

Usage::

    python -m tools.check_docs        # prints one line per broken reference; exit 1 if any
"""

from __future__ import annotations

import pathlib
import re
import sys
from collections.abc import Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "sagc_jax"
# Top-level folders whose paths in backticks must exist (run outputs such as runs/ are not).
CHECKED_DIRS = ("configs", "launch", "tools", "benchmarks", "docs", "tests", PACKAGE)

_CODE = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"^[\w.\-/*]+$")
_DOTTED = re.compile(rf"^{PACKAGE}(\.\w+)+$")
# A markdown file named in prose: a path (`docs/sagc.md`) or an upper-case name (`DESIGN.md`);
# a bare lower-case name (`results.md`) is usually a file a command writes.
_MD_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]*\w\.md|[A-Z][A-Z0-9_-]*\.md)\b")
# Generated from the schema's doc strings: a stale name there is fixed in the code.
GENERATED = ("docs/config.md",)


def doc_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The markdown files this check reads."""
    files = [root / "README.md", *sorted((root / "benchmarks").glob("*.md")),
             *sorted((root / "docs").rglob("*.md"))]
    return [f for f in files if f.is_file()]


def _strip_fences(text: str) -> str:
    """Drop fenced code blocks (commands and output, not citations)."""
    return _FENCE.sub("", text)


def _py_exists(path: str, root: pathlib.Path, near: str = "") -> bool:
    """A path under the root or the package. A bare ``name.py`` resolves against ``near`` (the
    folder of the last path cited on the same line: ``rl/advantages.py``, ``losses.py``), else
    it must name some file of the checked folders."""
    path = path.removeprefix("./")
    if "/" not in path:
        if near:
            return _py_exists(f"{near}/{path}", root)
        return any(any((root / d).rglob(path)) for d in CHECKED_DIRS if (root / d).is_dir())
    return (root / path).is_file() or (root / PACKAGE / path).is_file()


def _dotted_exists(name: str, root: pathlib.Path) -> bool:
    """``sagc_jax.a.b.C``: walk packages and modules; a part after a package may be a name its
    ``__init__.py`` mentions (a re-export), a part after a module is an attribute."""
    parts = name.split(".")
    here = root / parts[0]
    for part in parts[1:]:
        if (here / part).is_dir():
            here = here / part
        elif (here / f"{part}.py").is_file():
            return True
        else:
            init = here / "__init__.py"
            return init.is_file() and re.search(rf"\b{re.escape(part)}\b", init.read_text())
    return True


def _file_exists(path: str, root: pathlib.Path) -> bool:
    path = path.rstrip("/")
    if any(c in path for c in "*?["):
        return any(root.glob(path))
    return (root / path).exists()


def bad_code_refs(text: str, root: pathlib.Path = ROOT) -> list[str]:
    """Backticked paths and module names in ``text`` that do not exist under ``root``."""
    bad = []
    for line in _strip_fences(text).splitlines():
        near = ""  # folder of the last path cited on this line
        for m in _CODE.finditer(line):
            ref = m.group(1).strip()
            if _DOTTED.match(ref):
                if not _dotted_exists(ref, root):
                    bad.append(ref)
                continue
            # `path.py: function`, `path.py::test` cite a file too.
            ref = ref.split(":", 1)[0].strip()
            if not _PATH.match(ref) or ("/" not in ref and not ref.endswith(".py")):
                continue
            if ref.endswith(".py"):
                if not _py_exists(ref, root, near):
                    bad.append(ref)
            elif ref.split("/", 1)[0] in CHECKED_DIRS and not _file_exists(ref, root):
                bad.append(ref)
            if "/" in ref:
                near = ref.rstrip("/") if ref.endswith("/") else ref.rsplit("/", 1)[0]
    return bad


def _resolve_module(ref: str, root: pathlib.Path, near: str) -> list[pathlib.Path]:
    """The files a module cell cites: ``sampling/sampler.py`` (under the package), ``data/``
    (every module in it), a bare ``losses.py`` beside ``near`` or, if unique, anywhere."""
    ref = ref.removeprefix(f"{PACKAGE}/").rstrip("/")
    if "/" not in ref and near:
        ref = f"{near}/{ref}"
    path = root / PACKAGE / ref
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    if path.is_file():
        return [path]
    if "/" not in ref and ref.endswith(".py"):
        hits = sorted((root / PACKAGE).rglob(ref))
        return hits if len(hits) == 1 else []
    return []


def bad_table_symbols(text: str, root: pathlib.Path = ROOT) -> list[str]:
    """Names a module table says a module holds that the module does not define.

    A row ``| `train/state.py` | `RunState` (...), `build_run(cfg)` |`` cites modules in its
    first cell; each class-like name (``CamelCase``) in the other cells must be defined there
    (``class``/``def``/assignment at any indent), and each called name (``name(...)``) must at
    least occur in their source. Rows whose modules do not resolve are left to
    :func:`bad_code_refs`."""
    bad = []
    for line in _strip_fences(text).splitlines():
        cells = line.split("|")
        if not line.startswith("|") or len(cells) < 4:
            continue
        files: list[pathlib.Path] = []
        near = ""
        for ref in _CODE.findall(cells[1]):
            ref = ref.strip().removeprefix(f"{PACKAGE}/")
            if "/" not in ref and not ref.endswith(".py"):
                continue  # `run`, `data`: a word, not a module path
            files += _resolve_module(ref, root, near)
            if "/" in ref.rstrip("/"):
                near = ref.rsplit("/", 1)[0]
            elif ref.endswith("/"):
                near = ref.rstrip("/")
        if not files:
            continue
        src = "\n".join(f.read_text() for f in files)
        rest = "|".join(cells[2:])
        for name in re.findall(r"`([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)`", rest):
            if not re.search(rf"^\s*(class|def)\s+{name}\b|^\s*{name}\s*[:=]", src, re.M):
                bad.append(name)
        for name in re.findall(r"`([A-Za-z_]\w*)\(", rest):
            if not re.search(rf"\b{name}\b", src):
                bad.append(name)
    return bad


def bad_md_names(text: str, where: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Markdown files named anywhere in ``text`` (``DESIGN.md``, ``docs/sagc.md``) that exist
    neither beside the file, nor under the root, nor under ``docs/``."""
    bad = []
    for name in dict.fromkeys(_MD_NAME.findall(_strip_fences(text))):
        if "://" in name or any(c in name for c in "*?"):
            continue
        if not any((base / name).exists() for base in (where, root, root / "docs")):
            bad.append(name)
    return bad


def bad_links(text: str, where: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Relative link targets in ``text`` (a file in folder ``where``) that do not exist."""
    bad = []
    for m in _LINK.finditer(_strip_fences(text)):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, mailto:, an anchor in the same page
        path = target.split("#", 1)[0]
        if path and not (where / path).exists():
            bad.append(target)
    return bad


def problems(files: Iterable[pathlib.Path] | None = None,
             root: pathlib.Path = ROOT) -> list[str]:
    """One ``file: what`` line per broken reference in ``files`` (default: :func:`doc_files`)."""
    out = []
    for f in doc_files(root) if files is None else files:
        text = f.read_text()
        name = f.relative_to(root) if f.is_relative_to(root) else f
        out += [f"{name}: no such module or file `{r}`" for r in bad_code_refs(text, root)]
        out += [f"{name}: broken link ({t})" for t in bad_links(text, f.parent, root)]
        out += [f"{name}: module table names `{n}`, which its module does not define"
                for n in bad_table_symbols(text, root)]
        if str(name) not in GENERATED:
            out += [f"{name}: names a missing file {n}"
                    for n in bad_md_names(text, f.parent, root)]
    return out


def main() -> int:
    """Print every broken reference; exit 1 if there is one."""
    found = problems()
    for line in found:
        print(line)
    print(f"{len(found)} broken reference(s) in {len(doc_files())} files", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
