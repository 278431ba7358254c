"""Issue 49's check of the benefit model against learning, for several per-step benefit forms.

    python -m tools.sagc_benefit_forms

For each committed real-model cell (arith1 and arith2 on the `model` clock, arith1 on this CPU's
time model) and the main job's cell from one warm start, the static-G runs' realised benefit per
second under each form (summed over the run's steps from `trace.jsonl`'s rewards at SAGC's pass
threshold, divided by the run's final clock: `curves.benefit_per_second`) beside their held-out
accuracy at the cell's budget (`curves.mix_curves`). A form that ranks the static Gs as accuracy
does in every cell would be a candidate for SAGC's `benefit(g)`; read on the runs it would then be
judged on, it could only be a candidate. Then the per-step view: held-out accuracy at each
checkpoint step, mean ± standard error over each static G's seeds (does a step at a larger G learn
more?), and for the two mixes and the main job, the informative groups a step carried beside what
the steps learned (could any law of the informative groups alone give both?). Markdown on stdout."""

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
    # `sagc.benefit: diminishing`: n informative groups worth n / (n + 1) (twenty-fifth session).
    "n / (n + 1) of n informative groups": lambda r: step_benefit(r, form="diminishing"),
}
CELLS = (("arith1, `model` clock", "docs/results/sagc_real/arith1", None),
         ("arith2, `model` clock", "docs/results/sagc_real/arith2", None),
         ("arith1, this CPU's time model", "docs/results/sagc_real_cpuclock/arith1",
          "docs/results/sagc_real/arith1"),
         ("main job (init.seed 2), `model` clock", "docs/results/sagc_main_job_init2/arith", None))


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


#: (name, folder of static runs) for the informative-groups view: the static runs of both mixes
#: (one trajectory serves every clock) and the main job's cell from one warm start.
SIGNAL_CELLS = (("arith1", "docs/results/sagc_real/arith1"),
                ("arith2", "docs/results/sagc_real/arith2"),
                ("main job (init.seed 2)", "docs/results/sagc_main_job_init2/arith"))


def _informative_per_step(run: Path) -> list[int]:
    """Informative groups of each step of a committed run, from its `trace.jsonl`."""
    import json

    lines = (curves.data_dir(run) / "trace.jsonl").read_text().splitlines()
    return [_informative(np.array([g["rewards"] for g in json.loads(ln)["groups"]], np.float64))
            for ln in lines if ln.strip()]


def signal_vs_learning() -> None:
    """Per static G: mean informative groups a step over each third of the run (mean over
    seeds), held-out accuracy at each third's end and its mean over every checkpoint after
    step 0 (a per-step learning figure less noisy than one checkpoint; mean ± se over seeds)."""
    print("\n| workload | G | informative groups a step, by third of the run | "
          "held-out accuracy at the thirds' ends | mean held-out accuracy, checkpoints > 0 |")
    print("|---|---|---|---|---|")
    for name, mix in SIGNAL_CELLS:
        by: dict[int, list[Path]] = {}
        for run in sorted(Path(mix).glob("static-*-s*")):
            by.setdefault(int(run.name.split("-")[1]), []).append(run)
        for g, runs in sorted(by.items()):
            inf = np.array([_informative_per_step(r) for r in runs], np.float64)
            n = inf.shape[1]
            ends = [n * k // 3 for k in (1, 2, 3)]
            sig = " / ".join(f"{inf[:, a:b].mean():.2f}" for a, b in zip([0, *ends[:2]], ends))
            acc = [{p.step: p.accuracy for p in curves.run_curves(r)["model"]} for r in runs]
            ends_md = " / ".join(f"{st.mean:.2f} ± {st.se:.2f}" for st in
                                 (curves.mean_se([a.get(s) for a in acc]) for s in ends))
            auc = curves.mean_se([float(np.mean([v for s, v in a.items() if s > 0]))
                                  for a in acc])
            print(f"| {name} | {g} | {sig} | {ends_md} | {auc.mean:.3f} ± {auc.se:.3f} |")


if __name__ == "__main__":
    main()
    per_step()
    signal_vs_learning()
