"""SAGC before and after a controller change: two simulator-suite JSONs side by side.

    python -m tools.sagc_suite_diff benchmarks/results/sagc_suite_nobudget_p2_rowmem.json \\
        benchmarks/results/sagc_suite_nobudget_p2.json

Both files are ``python -m tools.sagc_suite --json`` outputs over the same workloads and seeds
(common random numbers, so the statics are identical and the ratio is SAGC's change alone).
Prints one markdown row per workload: SAGC / best static before and after (pooled), the
after / before ratio of SAGC's pooled benefit per second, mean G before -> after; and, for every
SAGC variant the second file holds (``--variant``), its benefit per second / the first file's
SAGC. A workload in one file only is an error (exit 2): the two runs must be comparable;
``--common`` compares the workloads both hold instead and names the others under the table (a
suite run after a workload was added).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Policies of a suite JSON that are not SAGC variants.
_NOT_VARIANTS = frozenset({"causal", "oracle", "plan-causal", "plan-oracle"})


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())["workloads"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a sagc_suite --json file ({e})") from e


def _ratio(pol: dict) -> str:
    """SAGC / best static (pooled), or n/a where no static meets the budget."""
    r = pol["vs_best_static"]
    return "n/a" if r is None or r[0] is None else f"{r[0]:.3f}"


def diff_md(before: dict, after: dict, common: bool = False) -> str:
    """The markdown table (see the module docstring) of two suites' ``workloads`` sections;
    ``common``: of the workloads both hold (else differing workloads are an error)."""
    only = sorted(set(before) ^ set(after))
    if only and not common:
        raise ValueError(f"the two suites' workloads differ: {only}")
    before = {k: v for k, v in before.items() if k in after}
    first = next(iter(after.values()))["policies"]
    variants = [p for p in first if p != "sagc" and not p.startswith("static-")
                and p not in _NOT_VARIANTS]
    head = ["workload", "best static", "SAGC / best static, before", "after",
            "after / before", "mean G", *(f"`{v}` / before" for v in variants)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, wb in before.items():
        sb, pa = wb["policies"]["sagc"], after[name]["policies"]
        sa = pa["sagc"]
        cells = [name, wb["best_static"] or "none in budget", _ratio(sb), _ratio(sa),
                 f"{sa['benefit_per_s'] / sb['benefit_per_s']:.4f}",
                 f"{sb['mean_g']:.2f} -> {sa['mean_g']:.2f}",
                 *(f"{pa[v]['benefit_per_s'] / sb['benefit_per_s']:.4f}" for v in variants)]
        lines.append("| " + " | ".join(cells) + " |")
    if only:
        lines.append(f"\nIn one suite only (not compared): {', '.join(only)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--common", action="store_true",
                    help="compare the workloads both suites hold; name the others")
    a = ap.parse_args(argv)
    try:
        md = diff_md(_load(a.before), _load(a.after), a.common)
    except ValueError as e:
        print(f"sagc_suite_diff: {e}", file=sys.stderr)
        return 2
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
