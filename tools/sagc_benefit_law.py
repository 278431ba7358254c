"""Issue 49: SAGC's benefit model against the world's per-step law, in the simulator.

    python -m tools.sagc_benefit_law              # runs what is missing, prints the table
    python -m tools.sagc_benefit_law --table-only # the table from the committed JSONs

The real runs' held-out accuracy per step is nearly flat in G (docs/sagc.md, "What one step is
worth"), which reads like "a step is worth one step if some group in it is informative" rather
than today's "informative groups x (1 - 1/g)". Which benefit model should SAGC carry depends on
which law holds, and a wrong model costs something either way. This measures the cost, at the
real runs' shape (48 steps, 2 prompts a step, no budget, every suite workload, 40 seeds, common
random numbers): for each world law (simulator ``progress: groups | any_group``) and each clock
(each workload's own accelerator-like time model, and this CPU's fit,
`benchmarks/cpu_time_model.py`), shipped SAGC (``sagc.benefit: groups``) and the alternative
(``any_group``) as a ratio to the best static G's pooled benefit/s under that law. Raw suite JSONs:
benchmarks/results/sagc_benefit_law/<law>_<clock>.json (`tools/sagc_suite.py`). Then the
warm-up rung: both models warming up at the smallest rung instead of the largest, in every
cell (<law>_<clock>_init4.json), and at the rung the prior prices best
(<law>_<clock>_prior.json). Last, the three benefit models (shipped ``any_group``, ``groups`` and
``diminishing``: n informative groups worth n / (n + 1)) in a world of each of the three laws
(<law>_<clock>_dim.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "sagc_benefit_law"
SEEDS = 40
SHAPE = ("steps=48", "workload.prompts_per_step=2")
#: This CPU's time model (benchmarks/results/cpu_time_model.json's fit; the one the real
#: cpuclock runs use): the world's clock and SAGC's time model alike.
CPU = {"decode_a": 0.0558904, "decode_b": 0.00253875, "prefill_a": 0.36022,
       "prefill_b": 0.00178673}
CLOCKS = {
    "model": (),
    "cpu": tuple(f"{sec}.{k}={v}" for k, v in CPU.items() for sec in ("timing", "sagc.time_model")),
}
LAWS = ("groups", "any_group")
#: Every law `sagc.benefit` can carry, each a world in the last table (`<law>_<clock>_dim.json`).
DIM_LAWS = ("groups", "any_group", "diminishing")
#: The last table's variants beside `sagc`, which is `groups` here: the suite's workloads pin
#: `benefit: groups` (configs/sim/*.yaml), so their committed figures keep their meaning.
DIM = ("any=benefit=any_group", "dim=benefit=diminishing")


#: The warm-up rung: both benefit models warming up at the smallest rung (4) instead of the
#: shipped largest (16), in every (law, clock) cell: `<law>_<clock>_init4.json`, whose `any` is
#: the same as the law file's (common random numbers) and `groups4` / `any4` the new variants.
INIT4 = ("any=benefit=any_group", "groups4=initial_group_size=4",
         "any4=benefit=any_group,initial_group_size=4")
#: The clock-aware warm-up rung: both benefit models warming up where the prior prices best
#: (the `prior_start` constant: uniform pass rate, every group's longest row at the cap, off
#: the time model), in every cell: `<law>_<clock>_prior.json`. All of these JSONs were run
#: before `prior_start` became the default (commits up to 8d0307c), so their `sagc` and `any`
#: start at the largest rung; a rerun on a later commit starts them at the prior's rung unless
#: given `prior_start=false` (the other two tables' JSONs likewise).
PRIOR = ("any=benefit=any_group", "groupsP=prior_start=true",
         "anyP=benefit=any_group,prior_start=true")


def run(law: str, clock: str, workers: int, cache: Path, name: str | None = None,
        extra: tuple[str, ...] = ("any=benefit=any_group",)) -> Path:
    """One suite run (skipped when its JSON exists); returns the JSON's path. `extra`: the
    variants beside the statics and shipped SAGC."""
    out = OUT / f"{name or f'{law}_{clock}'}.json"
    if out.exists():
        return out
    OUT.mkdir(parents=True, exist_ok=True)
    variants = [a for v in extra for a in ("--variant", v)]
    cmd = [sys.executable, "-m", "tools.sagc_suite", "--seeds", str(SEEDS), "--pop-seeds", "2",
           "--workers", str(workers), "--no-budget", "--cache", str(cache), *variants,
           "--json", str(out), "--set", *SHAPE, f"progress={law}", *CLOCKS[clock]]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return out


def _over_best(w: dict, policies: tuple[str, ...]) -> tuple[list[float], str]:
    """One workload's pooled benefit/s of `policies` over its best static's, and that static's G."""
    pol = w["policies"]
    best = pol[w["best_static"]]["benefit_per_s"]
    return [pol[p]["benefit_per_s"] / best for p in policies], w["best_static"].removeprefix(
        "static-")


def _ratio_rows(data: dict, cols: list[tuple[str, str]], policies: tuple[str, ...],
                groups: tuple[tuple[int, ...], ...], counts: bool = True) -> list[str]:
    """Markdown rows: per workload, each column's pooled benefit/s of `policies` over the best
    static's (a cell joins `groups` of them, " / " within one and "; " between) with that
    static's G; then the worst workload and (`counts`) how many workloads reach 0.98."""
    def join(vals: list[str]) -> str:
        return "; ".join(" / ".join(vals[i] for i in grp) for grp in groups)

    ratios: dict[tuple[str, str], list[list[float]]] = {c: [] for c in cols}
    lines = []
    for name in data[cols[0]]["workloads"]:
        cells = []
        for c in cols:
            r, g = _over_best(data[c]["workloads"][name], policies)
            ratios[c].append(r)
            cells.append(f"{join([f'{x:.3f}' for x in r])} ({g})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    k = range(len(policies))
    lines.append("| **worst** | " + " | ".join(
        f"**{join([f'{min(r[i] for r in ratios[c]):.3f}' for i in k])}**" for c in cols) + " |")
    if counts:
        lines.append(f"| ≥ 0.98 (of {len(ratios[cols[0]])}) | " + " | ".join(
            join([str(sum(r[i] >= 0.98 for r in ratios[c])) for i in k]) for c in cols) + " |")
    return lines


def table() -> str:
    """Markdown: per workload, SAGC's and the alternative's pooled benefit/s over the best
    static's, under each (law, clock); the last row the worst workload."""
    cols = [(law, clock) for law in LAWS for clock in CLOCKS]
    data = {c: json.loads((OUT / f"{c[0]}_{c[1]}.json").read_text()) for c in cols}
    head = " | ".join(f"law {law}, {clock} clock: groups / any_group (best static)"
                      for law, clock in cols)
    lines = [f"| workload | {head} |", "|---|" + "---|" * len(cols),
             *_ratio_rows(data, cols, ("sagc", "any"), ((0, 1),), counts=False)]
    seeds = {data[c]["meta"]["seeds"] for c in cols}
    return "\n".join(lines) + f"\n\nSeeds: {sorted(seeds)}; commits: " + ", ".join(
        sorted({data[c]["meta"]["commit"] for c in cols}))


def start_table(suffix: str = "init4", label: str = "4") -> str:
    """Markdown: each benefit model warming up at the largest rung (shipped, 16) and at another
    start (`suffix` init4: the smallest rung, 4; prior: the prior's best), pooled benefit/s over
    the best static's, per (law, clock) cell; then the worst workload and how many workloads
    reach 0.98."""
    cols = [(law, clock) for law in LAWS for clock in CLOCKS]
    data = {c: json.loads((OUT / f"{c[0]}_{c[1]}_{suffix}.json").read_text()) for c in cols}
    alt = {"init4": ("groups4", "any4"), "prior": ("groupsP", "anyP")}[suffix]
    head = " | ".join(f"law {law}, {clock} clock: groups 16 / {label}; any_group 16 / {label} "
                      "(best)" for law, clock in cols)
    return "\n".join([f"| workload | {head} |", "|---|" + "---|" * len(cols),
                      *_ratio_rows(data, cols, ("sagc", alt[0], "any", alt[1]),
                                   ((0, 1), (2, 3)))])


def dim_table() -> str:
    """Markdown: per workload, each benefit model's pooled benefit/s over the best static's in
    a world of each law and clock (the JSONs present; `--dim` runs them); then the worst
    workload and how many workloads reach 0.98."""
    cols = [(law, clock) for law in DIM_LAWS for clock in CLOCKS
            if (OUT / f"{law}_{clock}_dim.json").exists()]
    if not cols:
        return "(no <law>_<clock>_dim.json yet: `python -m tools.sagc_benefit_law --dim`)"
    data = {c: json.loads((OUT / f"{c[0]}_{c[1]}_dim.json").read_text()) for c in cols}
    head = " | ".join(f"law {law}, {clock} clock: groups / any_group / diminishing (best)"
                      for law, clock in cols)
    lines = [f"| workload | {head} |", "|---|" + "---|" * len(cols),
             *_ratio_rows(data, cols, ("sagc", "any", "dim"), ((0, 1, 2),))]
    return "\n".join(lines) + "\n\nCommits: " + ", ".join(
        sorted({data[c]["meta"]["commit"] for c in cols}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cache", default=str(ROOT / "runs" / "sim_cache" / "benefit_law"))
    ap.add_argument("--dim", action="store_true",
                    help="also run the three-law table's JSONs (~3-4 CPU-h on 2 cores)")
    a = ap.parse_args()
    if a.dim and not a.table_only:
        for clock in CLOCKS:  # every world on one clock first: a table a partial run can read
            for law in DIM_LAWS:
                run(law, clock, a.workers, Path(a.cache), f"{law}_{clock}_dim", extra=DIM)
    if not a.table_only:
        for law in LAWS:
            for clock in CLOCKS:
                run(law, clock, a.workers, Path(a.cache))
                run(law, clock, a.workers, Path(a.cache), f"{law}_{clock}_init4", extra=INIT4)
                run(law, clock, a.workers, Path(a.cache), f"{law}_{clock}_prior", extra=PRIOR)
    print(table())
    print("\nThe warm-up rung (`initial_group_size` 16, shipped, against 4)\n")
    print(start_table())
    print("\nThe prior's warm-up rung (16, shipped, against the `prior_start` constant's)\n")
    print(start_table("prior", "P"))
    print("\nThe three benefit models in a world of each law\n")
    print(dim_table())


if __name__ == "__main__":
    main()
