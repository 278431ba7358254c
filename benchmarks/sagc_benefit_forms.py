"""Issue 49's check of the benefit model against learning, for several per-step benefit forms.

    python benchmarks/sagc_benefit_forms.py

For each committed real-model cell (arith1 and arith2 on the `model` clock, arith1 on this CPU's
time model), the static-G runs' realised benefit per second under each form (summed over the
run's steps from `trace.jsonl`'s rewards, binarised at 0.5 as SAGC's pass counts are, divided
by the run's final clock) beside their held-out accuracy at the cell's budget
(`curves.mix_curves`). A form that ranks the static Gs as accuracy does in every cell would be a
candidate for SAGC's `benefit(g)`; read on the runs it would then be judged on, it could only be
a candidate. Then the per-step view: held-out accuracy at each checkpoint step, mean ± standard
error over each static G's seeds (does a step at a larger G learn more?). Markdown on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sagc_jax.experiments import curves
from sagc_jax.experiments.budget import cumulative_clock

#: form -> benefit of one step from its pass counts k [P] of groups of g.
FORMS: dict[str, Callable[[np.ndarray, int], float]] = {
    "informative groups × (1 − 1/g) (SAGC's)": lambda k, g: ((k > 0) & (k < g)).sum() * (1 - 1 / g),
    "informative groups": lambda k, g: float(((k > 0) & (k < g)).sum()),
    "informative rows × (1 − 1/g)": lambda k, g: ((k > 0) & (k < g)).sum() * (g - 1.0),
    "√(informative rows × (1 − 1/g))": lambda k, g: float(np.sqrt(((k > 0) & (k < g)).sum()
                                                                  * (g - 1.0))),
}
CELLS = (("arith1, `model` clock", "docs/results/sagc_real/arith1", None),
         ("arith2, `model` clock", "docs/results/sagc_real/arith2", None),
         ("arith1, this CPU's time model", "docs/results/sagc_real_cpuclock/arith1",
          "docs/results/sagc_real/arith1"))


def _rank(values: dict[str, float]) -> str:
    return " > ".join(p.removeprefix("static-") for p in sorted(values, key=lambda p: -values[p]))


def main() -> None:
    print("| cell | held-out accuracy at budget | " + " | ".join(FORMS) + " |")
    print("|---|---|" + "---|" * len(FORMS))
    for name, mix, statics in CELLS:
        summ = curves.mix_curves(mix, statics)["model"]
        stat = {p: r["accuracy_at_budget"] for p, r in summ["policies"].items()
                if p.startswith("static-")}
        acc = {p: s["mean"] for p, s in stat.items()}
        acc_md = _rank(acc) + " (" + ", ".join(
            f"{p.removeprefix('static-')}: {s['mean']:.2f} ± {s['se']:.2f}"
            for p, s in sorted(stat.items(), key=lambda x: -x[1]["mean"])) + ")"
        runs, tm = curves._mix_runs(mix, statics)
        per: dict[str, list[dict[str, float]]] = {}
        for run in runs:
            policy = run.name.rpartition("-s")[0]
            if not policy.startswith("static-"):
                continue
            total = dict.fromkeys(FORMS, 0.0)
            for line in (curves.data_dir(run) / "trace.jsonl").read_text().splitlines():
                if line.strip():
                    r = np.array([g["rewards"] for g in json.loads(line)["groups"]])
                    for f, fn in FORMS.items():
                        total[f] += fn((r > 0.5).sum(1), r.shape[1])
            rows, tm_run = curves._rows_and_time_model(run, tm)
            sec = float(cumulative_clock(rows, "model", tm_run)[-1])
            per.setdefault(policy, []).append({f: v / sec for f, v in total.items()})
        cells = [_rank({p: float(np.mean([v[f] for v in vals])) for p, vals in per.items()})
                 for f in FORMS]
        print(f"| {name} | {acc_md} | " + " | ".join(cells) + " |")


def per_step() -> None:
    """Held-out accuracy by checkpoint step per static G (mean ± se over seeds), per mix."""
    for name, mix, _ in CELLS[:2]:
        by: dict[int, dict[int, list[float]]] = {}
        for run in sorted(Path(mix).glob("static-*-s*")):
            g = int(run.name.split("-")[1])
            for p in curves.run_curves(run)["model"]:
                by.setdefault(p.step, {}).setdefault(g, []).append(p.accuracy)
        steps = sorted(s for s in by if s % 8 == 0)
        print(f"\n{name.split(',')[0]}: held-out accuracy by step (mean ± se over seeds)\n")
        print("| G | " + " | ".join(str(s) for s in steps) + " |")
        print("|---|" + "---|" * len(steps))
        for g in sorted({g for s in steps for g in by[s]}):
            cells = []
            for s in steps:
                st = curves.mean_se(by[s].get(g, []))
                cells.append("–" if st.mean is None else f"{st.mean:.2f} ± {st.se:.2f} ({st.n})")
            print(f"| {g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
    per_step()
