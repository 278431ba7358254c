"""Issue 49's check of the benefit model against learning, for several per-step benefit forms.

    python benchmarks/sagc_benefit_forms.py

For each committed real-model cell (arith1 and arith2 on the `model` clock, arith1 on this CPU's
time model), the static-G runs' realised benefit per second under each form (summed over the
run's steps from `trace.jsonl`'s rewards at SAGC's pass threshold, divided by the run's final
clock: `curves.benefit_per_second`) beside their held-out accuracy at the cell's budget
(`curves.mix_curves`). A form that ranks the static Gs as accuracy does in every cell would be a
candidate for SAGC's `benefit(g)`; read on the runs it would then be judged on, it could only be
a candidate. Then the per-step view: held-out accuracy at each checkpoint step, mean ± standard
error over each static G's seeds (does a step at a larger G learn more?). Markdown on stdout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from sagc_jax.config.sagc_constants import SAGCConstants
from sagc_jax.experiments import curves
from sagc_jax.sagc.updates import step_benefit


def _informative(r: np.ndarray) -> int:
    """Groups of rewards r [P, g] whose pass counts (at SAGC's pass threshold) are mixed."""
    k = (r > SAGCConstants().pass_threshold).sum(1)
    return int(((k > 0) & (k < r.shape[1])).sum())


#: form -> benefit of one step from its rewards r [P, g] (`curves.benefit_per_second`).
FORMS: dict[str, Callable[[np.ndarray], float]] = {
    "informative groups × (1 − 1/g) (SAGC's)": step_benefit,
    "informative groups": lambda r: float(_informative(r)),
    "informative rows × (1 − 1/g)": lambda r: _informative(r) * (r.shape[1] - 1.0),
    "√(informative rows × (1 − 1/g))": lambda r: float(np.sqrt(_informative(r)
                                                               * (r.shape[1] - 1.0))),
    # `sagc.benefit: any_group`'s realised value: 1 if any group of the step is informative.
    "any group informative (1 / 0)": lambda r: step_benefit(r, form="any_group"),
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
        runs, tm = curves.mix_runs(mix, statics)
        per: dict[str, list[dict[str, float]]] = {}
        for run in runs:
            policy = run.name.rpartition("-s")[0]
            if policy.startswith("static-"):
                per.setdefault(policy, []).append(
                    {f: curves.benefit_per_second(run, tm, fn)["model"]
                     for f, fn in FORMS.items()})
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
