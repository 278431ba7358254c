"""Held-out accuracy against seconds on both clocks (`sagc-jax compare --curves`, issue 49).

The user's question: which policy reaches a given held-out accuracy in the fewest seconds, and
which is most accurate when the seconds run out? Every kept checkpoint of a run is evaluated
(greedy, the config's held-out split; `runs.eval_run` caches each step) and placed on each clock
at the end of its step (`budget.cumulative_clock`; step 0 = the start, 0 s). Then per clock:

- **accuracy at budget**: a run's accuracy at its newest evaluated checkpoint within the budget
  (`auto`: the smallest final clock over all runs, so every run is read at the same seconds);
- **time to target**: the first evaluated checkpoint at or above the target accuracy (`auto`:
  80 % of the way from the mean step-0 accuracy to the best policy's mean accuracy at budget).
  A seed that never reaches it is *censored*: it counts at its final clock, a lower bound on its
  time, so the policy's mean becomes a lower bound too (shown as `≥`, with the count). Dropping
  such seeds instead would make a policy look faster the more of its seeds fail;
- mean and standard error (sample std / sqrt(n)) over seeds per policy.

A checkpoint only approximates the budget's cut from below: checkpoints every k steps place
each run's reading up to k - 1 steps early, the same rule for every policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.experiments.budget import CLOCKS
from sagc_jax.experiments.verdict import paired_md, verdict_md

__all__ = [
    "CurvePoint",
    "PolicyStat",
    "accuracy_at_budget",
    "benefit_per_second",
    "checkpoint_steps",
    "curve",
    "mean_se",
    "mix_curves",
    "mix_runs",
    "read_on",
    "run_curves",
    "summarize_curves",
    "time_to_accuracy",
    "time_to_target_stat",
]


@dataclass(frozen=True)
class CurvePoint:
    """One evaluated checkpoint: its step, the clock at the end of that step (s) and its
    held-out accuracy (fraction)."""

    step: int
    seconds: float
    accuracy: float


@dataclass(frozen=True)
class PolicyStat:
    """Mean and standard error over seeds of one number (None: no seed has it). `censored`:
    how many of the `n` values are lower bounds (seeds that ran out of clock first), which
    makes `mean` a lower bound whenever it is > 0."""

    mean: float | None
    se: float | None
    n: int
    of: int
    censored: int = 0


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Steps of a run's kept checkpoints, 0 for `checkpoints/initial`, ascending."""
    ck = Path(run_dir) / "checkpoints"
    if not ck.is_dir():
        return []
    steps = {int(p.name) for p in ck.iterdir() if p.name.isdigit() and p.is_dir()}
    if (ck / "initial").is_dir():
        steps.add(0)
    return sorted(steps)


def curve(accuracy_by_step: Mapping[int, float], clock_s: Sequence[float],
          steps: Sequence[int]) -> list[CurvePoint]:
    """Accuracy points on one clock. `clock_s[i]`: cumulative seconds at the end of metrics row
    i, whose step number is `steps[i]`; step 0 sits at 0 s. Checkpoints past the rows (none in
    a finished run) are dropped."""
    at = {int(s): float(c) for s, c in zip(steps, clock_s, strict=True)}
    at[0] = 0.0
    return [CurvePoint(k, at[k], float(a)) for k, a in sorted(accuracy_by_step.items())
            if k in at]


def accuracy_at_budget(points: Sequence[CurvePoint], budget_s: float) -> float | None:
    """Accuracy of the newest point with seconds <= `budget_s` (None: none is)."""
    inside = [p for p in points if p.seconds <= budget_s + 1e-9]
    return inside[-1].accuracy if inside else None


def time_to_accuracy(points: Sequence[CurvePoint], target: float) -> float | None:
    """Seconds of the first point with accuracy >= `target` (None: never)."""
    return next((p.seconds for p in points if p.accuracy >= target - 1e-12), None)


def time_to_target_stat(seeds: Mapping[int, Sequence[CurvePoint]],
                        target: float | None) -> PolicyStat:
    """Time to `target` (s) over seeds, mean ± se, a seed that never reaches it counted at its
    final clock (censored; see the module docstring). No target: no values."""
    if target is None:
        return PolicyStat(None, None, 0, len(seeds))
    times = [time_to_accuracy(pts, target) for pts in seeds.values() if pts]
    finals = [pts[-1].seconds for pts in seeds.values() if pts]
    st = mean_se([f if t is None else t for t, f in zip(times, finals, strict=True)])
    return PolicyStat(st.mean, st.se, st.n, len(seeds), sum(t is None for t in times))


def mean_se(values: Sequence[float | None]) -> PolicyStat:
    """Mean and standard error (ddof 1; 0 with one value) of the finite values given."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return PolicyStat(None, None, 0, len(values))
    a = np.asarray(vals)
    se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0
    return PolicyStat(float(a.mean()), se, len(a), len(values))


def read_on(policy: str, clock: str) -> bool:
    """Whether a policy's runs are read on ``clock``: a static G serves both clocks; SAGC that
    decided on one clock (`sagc-model`, `sagc-measured`) only that one."""
    _, _, decided = policy.partition("sagc-")
    return not policy.startswith("sagc-") or decided == clock


def summarize_curves(curves: Mapping[str, Mapping[str, Mapping[int, list[CurvePoint]]]],
                     lengths: Mapping[str, Mapping[int, Callable[[float, str], float | None]]]
                     | None = None, target: float | None = None,
                     budgets: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Per clock: budget, target, and per policy accuracy at budget, time to target and (with
    `lengths[policy][seed](budget, clock)`, the mean completion length in the steps inside the
    budget) length at budget, each as mean ± se over seeds. `curves[clock][policy][seed]`."""
    out: dict[str, Any] = {}
    for clock in CLOCKS:
        runs = {p: v for p, v in (curves.get(clock) or {}).items() if read_on(p, clock)}
        if not runs:
            continue
        finals = [pts[-1].seconds for seeds in runs.values() for pts in seeds.values() if pts]
        budget = (budgets or {}).get(clock, min(finals) if finals else math.nan)
        at_b = {p: {s: accuracy_at_budget(pts, budget) for s, pts in seeds.items()}
                for p, seeds in runs.items()}
        tgt = target
        if tgt is None:
            start = mean_se([pts[0].accuracy for seeds in runs.values()
                             for pts in seeds.values() if pts and pts[0].step == 0]).mean
            best = max((m for m in (mean_se(list(v.values())).mean for v in at_b.values())
                        if m is not None), default=None)
            tgt = (None if start is None or best is None
                   else round(start + 0.8 * max(best - start, 0.01), 3))
        pols: dict[str, Any] = {}
        for p, seeds in runs.items():
            row = {"accuracy_at_budget": asdict(mean_se(list(at_b[p].values()))),
                   "time_to_target_s": asdict(time_to_target_stat(seeds, tgt)),
                   "per_seed_accuracy_at_budget": {str(s): v for s, v in at_b[p].items()},
                   # [seconds to the target or None (never), the run's final clock]
                   "per_seed_time_to_target_s": {
                       str(s): [time_to_accuracy(pts, tgt), pts[-1].seconds]
                       for s, pts in seeds.items() if pts and tgt is not None}}
            if lengths and p in lengths:
                row["len_at_budget"] = asdict(mean_se(
                    [lengths[p][s](budget, clock) for s in seeds if s in lengths[p]]))
            pols[p] = row
        out[clock] = {"budget_s": budget, "target": tgt, "policies": pols}
    return out


def format_curves_md(summary: Mapping[str, Any]) -> list[str]:
    """The results.md section: one table per clock (mean ± se over seeds)."""

    def cell(st: Mapping[str, Any], fmt: str) -> str:
        if st["n"] == 0:
            return f"n/a (0/{st['of']})"
        c = f"{fmt.format(st['mean'])} ± {fmt.format(st['se'])}"
        if st.get("censored"):
            # A lower bound: some seeds ran out of clock before the target.
            return f"≥ {c} ({st['censored']} of {st['n']} never reached)"
        return c + (f" ({st['n']}/{st['of']})" if st["n"] < st["of"] else "")

    lines = ["## Held-out accuracy against seconds", "",
             "Every kept checkpoint evaluated (greedy, held-out split); cells are mean ± "
             "standard error over seeds. Budget: the smallest final clock over all runs; "
             "target: 80 % of the way from the step-0 accuracy to the best policy's mean "
             "accuracy at budget; a seed that never reaches the target counts at its final "
             "clock, so such a mean is a lower bound, marked ≥ "
             "(`sagc_jax/experiments/curves.py`).", ""]
    for clock, s in summary.items():
        tgt = "n/a" if s["target"] is None else f"{s['target']:.3f}"
        lines += [f"Clock `{clock}`: budget {s['budget_s']:.1f} s, target accuracy {tgt}.", "",
                  "| policy | accuracy at budget | time to target (s) | length at budget "
                  "(tok) |", "|---|---|---|---|"]
        for p, r in s["policies"].items():
            ln = cell(r["len_at_budget"], "{:.1f}") if "len_at_budget" in r else "n/a"
            lines.append(f"| {p} | {cell(r['accuracy_at_budget'], '{:.3f}')} | "
                         f"{cell(r['time_to_target_s'], '{:.0f}')} | {ln} |")
        lines.append("")
    return lines


def run_curves(run_dir: str | Path) -> dict[str, list[CurvePoint]]:
    """A run's accuracy points on both clocks from its raw files alone (`eval.json`'s greedy
    results by step, `metrics.jsonl`, `config.yaml` for the time model): what a page that
    commits only those files regenerates its table from. {clock: points}."""
    return _committed_run(Path(run_dir))[0]


#: A run folder holding only its `config.yaml` and this file stands for a run that was not
#: trained because it provably is another one: a SAGC run whose controller, replayed over a
#: static run's logged observations under the SAGC run's own config, chooses that static G at
#: every step gets the same rollouts step for step (same seed, same G), so it *is* that run
#: (tests/test_real_runs.py checks both the replay and that the configs differ only in the
#: policy). `{"run": "<sibling folder>"}`.
SAME_AS = "same_as.json"


def data_dir(run_dir: Path) -> Path:
    """Where a run's `eval.json`, `metrics.jsonl` and `trace.jsonl` are: its own folder, or for a
    folder with `SAME_AS` the sibling run it names."""
    import json

    f = run_dir / SAME_AS
    return run_dir.parent / json.loads(f.read_text())["run"] if f.is_file() else run_dir


def _time_model(run_dir: Path) -> Any:
    """The time model of a committed run's saved config (its `model` clock)."""
    from sagc_jax.config import load_saved_config
    from sagc_jax.sagc.timing import TimeModel

    return TimeModel.from_sagc(load_saved_config(run_dir / "config.yaml").sagc)


def _rows_and_time_model(run_dir: Path, tm: Any = None) -> tuple[list[dict[str, Any]], Any]:
    """A committed run's metrics rows and its `model` clock: `tm`, else its own config's."""
    from sagc_jax.metrics import read_jsonl

    return read_jsonl(data_dir(run_dir) / "metrics.jsonl"), tm or _time_model(run_dir)


def _committed_run(run_dir: Path, tm: Any = None) -> tuple[dict[str, list[CurvePoint]],
                                                           Callable[[float, str], float | None]]:
    """(points per clock, the mean completion length within a budget on a clock) of one run
    directory holding `eval.json`, `metrics.jsonl` and `config.yaml` (`tm`: read its `model`
    clock on this time model instead of its config's)."""
    import json

    from sagc_jax.experiments.budget import cumulative_clock, cut_at_budget
    from sagc_jax.experiments.summary import num

    evals = json.loads((data_dir(run_dir) / "eval.json").read_text())
    acc = {int(v["step"]): float(v["accuracy"]) for v in evals.values()
           if v.get("num_samples") == 0}
    rows, tm = _rows_and_time_model(run_dir, tm)
    steps = [int(r["step"]) for r in rows]

    def length_at(budget: float, clock: str) -> float | None:
        vals = [num(r.get("len_mean")) for r in rows[:cut_at_budget(rows, budget, clock, tm)]]
        return float(np.nanmean(vals)) if vals else None

    return {c: curve(acc, cumulative_clock(rows, c, tm), steps) for c in CLOCKS}, length_at


def mix_runs(mix_dir: str | Path, statics: str | Path | None) -> tuple[list[Path], Any]:
    """(the runs of a mix folder, the time model to read them all on: None = each its own).
    With `statics`, the static-G runs of that folder join the mix's runs, all read on the
    `model` clock of the mix's runs (which must share one): a static run's trajectory does not
    depend on the clock, so one set of static runs serves a cell on another time model."""
    runs = [r for r in sorted(Path(mix_dir).glob("*-s*")) if (data_dir(r) / "eval.json").is_file()]
    if not runs:
        raise ValueError(f"{mix_dir}: no committed run (<policy>-s<seed>/eval.json) in it")
    if statics is None:
        return runs, None
    models = {_time_model(r) for r in runs}
    if len(models) != 1:
        raise ValueError(f"{mix_dir}: its runs' sagc.time_model differ (or it has none), so "
                         f"there is no one clock to read the static runs of {statics} on")
    runs += [r for r in sorted(Path(statics).glob("static-*-s*")) if (r / "eval.json").is_file()]
    return runs, models.pop()


def mix_curves(mix_dir: str | Path, statics: str | Path | None = None) -> dict[str, Any]:
    """`summarize_curves` over every committed run `<policy>-s<seed>/` of one task mix (a
    folder like docs/results/sagc_real/arith1): the cross-seed table from raw files alone
    (`statics`: with another folder's static runs on this folder's clock, `mix_runs`)."""
    pts: dict[str, dict[str, dict[int, list[CurvePoint]]]] = {c: {} for c in CLOCKS}
    lengths: dict[str, dict[int, Callable[[float, str], float | None]]] = {}
    runs, tm = mix_runs(mix_dir, statics)
    for run in runs:
        policy, _, seed = run.name.rpartition("-s")
        points, length_at = _committed_run(run, tm)
        for c in CLOCKS:
            pts[c].setdefault(policy, {})[int(seed)] = points[c]
        lengths.setdefault(policy, {})[int(seed)] = length_at
    return summarize_curves(pts, lengths)


def benefit_per_second(run_dir: str | Path, tm: Any = None,
                       benefit: Callable[[np.ndarray], float] | None = None) -> dict[str, float]:
    """SAGC's objective realised by a run, per clock: Σ over steps of the step's benefit
    (`benefit(rewards [P, g])`; None: SAGC's own, informative groups × (1 − 1/g),
    `sagc.updates.step_benefit`), from `trace.jsonl`'s rewards, / the run's final clock (s).
    Beside held-out accuracy per second it answers issue 49's check: does the benefit model
    rank the static Gs as learning does?"""
    import json

    from sagc_jax.experiments.budget import cumulative_clock
    from sagc_jax.sagc.updates import step_benefit

    run_dir = Path(run_dir)
    benefit = step_benefit if benefit is None else benefit
    total = 0.0
    for line in (data_dir(run_dir) / "trace.jsonl").read_text().splitlines():
        groups = json.loads(line)["groups"] if line.strip() else []
        if groups:
            total += benefit(np.array([g["rewards"] for g in groups], np.float64))
    rows, tm = _rows_and_time_model(run_dir, tm)
    return {c: total / float(cumulative_clock(rows, c, tm)[-1]) for c in CLOCKS}


def _benefit_md(mix_dir: str | Path, statics: str | Path | None = None) -> list[str]:
    """The benefit-per-second table of a mix folder, under both of SAGC's benefit laws
    (`sagc.benefit`: groups, any_group), mean over seeds per policy and clock."""
    from sagc_jax.config.sagc_constants import CONSTANTS
    from sagc_jax.sagc.estimators import realised_benefit

    def any_group(rewards: np.ndarray) -> float:
        return realised_benefit(rewards, CONSTANTS.pass_threshold, "any_group")

    per: dict[str, list[dict[str, float]]] = {}
    runs, tm = mix_runs(mix_dir, statics)
    for run in runs:
        if (data_dir(run) / "trace.jsonl").is_file():
            g, a = benefit_per_second(run, tm), benefit_per_second(run, tm, any_group)
            per.setdefault(run.name.rpartition("-s")[0], []).append(
                {**g, **{f"any_group {c}": v for c, v in a.items()}})
    cols = [*CLOCKS, *(f"any_group {c}" for c in CLOCKS)]
    lines = ["## The benefit model's objective, realised", "",
             "Benefit per second, mean over seeds (`curves.benefit_per_second`), under the "
             "`groups` law (informative groups × (1 − 1/g)) and the `any_group` law (1 if some "
             "group is informative): does either rank the policies as the held-out accuracy "
             "above does?", "", "| policy | " + " | ".join(
                 f"groups / `{c}` s" for c in CLOCKS) + " | " + " | ".join(
                 f"any_group / `{c}` s" for c in CLOCKS) + " | seeds |",
             "|---|" + "---|" * (len(cols) + 1)]
    for pol, vals in per.items():
        cells = " | ".join(f"{np.mean([v[c] for v in vals]):.4f}"
                           if read_on(pol, c.rpartition(" ")[2]) else "–" for c in cols)
        lines.append(f"| {pol} | {cells} | {len(vals)} |")
    return lines


def _main(argv: Sequence[str]) -> int:
    """`python -m sagc_jax.experiments.curves RUN_DIR`: one run's points; `... --mix MIX_DIR
    [--statics DIR]`: the per-clock table over its committed runs (with DIR's static runs,
    read on MIX_DIR's `model` clock). Bad arguments or folders: one line naming them, exit 2."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m sagc_jax.experiments.curves", allow_abbrev=False,
                                 description="Held-out accuracy against seconds, per clock.")
    ap.add_argument("run_dir", nargs="?", help="one committed run's folder")
    ap.add_argument("--mix", help="a task mix's folder of <policy>-s<seed>/ runs")
    ap.add_argument("--statics", help="another folder's static runs, read on MIX's clock")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): argparse has printed why
        return int(e.code or 0)
    if (a.mix is None) == (a.run_dir is None) or (a.statics and not a.mix):
        ap.print_usage(sys.stderr)
        return 2
    try:
        if a.mix:
            summary = mix_curves(a.mix, a.statics)
            print("\n".join([*format_curves_md(summary), *verdict_md(summary),
                             *paired_md(summary), *_benefit_md(a.mix, a.statics)]))
            return 0
        pts = run_curves(a.run_dir)
    except (OSError, ValueError, KeyError) as e:
        print(f"curves: {e}", file=sys.stderr)
        return 2
    first = pts[CLOCKS[0]]
    print("| step | " + " | ".join(str(p.step) for p in first) + " |")
    print("|---|" + "---:|" * len(first))
    print("| held-out accuracy | " + " | ".join(f"{p.accuracy:.2f}" for p in first) + " |")
    for c in CLOCKS:
        print(f"| `{c}` clock, s | " + " | ".join(f"{p.seconds:.0f}" for p in pts[c]) + " |")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
