"""SAGC before and after a controller change: two simulator-suite JSONs side by side.

    python -m tools.sagc_suite_diff benchmarks/results/sagc_suite_nobudget_p2_rowmem.json \\
        benchmarks/results/sagc_suite_nobudget_p2.json

Both files are ``python -m tools.sagc_suite --json`` outputs over the same workloads and seeds
(common random numbers, so the statics are identical and the ratio is SAGC's change alone).
Prints one markdown row per workload: SAGC / best static before and after (pooled), the
after / before ratio of SAGC's pooled benefit per second, mean G before -> after; and, for every
SAGC variant the second file holds (``--variant``), its benefit per second / the first file's
SAGC. A workload in one file only is an error (exit 2): the two runs must be comparable.
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


def diff_md(before: dict, after: dict) -> str:
    """The markdown table (see the module docstring) of two suites' ``workloads`` sections."""
    if set(before) != set(after):
        only = sorted(set(before) ^ set(after))
        raise ValueError(f"the two suites' workloads differ: {only}")
    first = next(iter(after.values()))["policies"]
    variants = [p for p in first if p != "sagc" and not p.startswith("static-")
                and p not in _NOT_VARIANTS]
    head = ["workload", "best static", "SAGC / best static, before", "after",
            "after / before", "mean G", *(f"`{v}` / before" for v in variants)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, wb in before.items():
        sb, pa = wb["policies"]["sagc"], after[name]["policies"]
        sa = pa["sagc"]
        cells = [name, wb["best_static"], f"{sb['vs_best_static'][0]:.3f}",
                 f"{sa['vs_best_static'][0]:.3f}",
                 f"{sa['benefit_per_s'] / sb['benefit_per_s']:.4f}",
                 f"{sb['mean_g']:.2f} -> {sa['mean_g']:.2f}",
                 *(f"{pa[v]['benefit_per_s'] / sb['benefit_per_s']:.4f}" for v in variants)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    a = ap.parse_args(argv)
    try:
        md = diff_md(_load(a.before), _load(a.after))
    except ValueError as e:
        print(f"sagc_suite_diff: {e}", file=sys.stderr)
        return 2
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
