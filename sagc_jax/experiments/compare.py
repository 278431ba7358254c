"""Paper-style experiment: SAGC against static group sizes on one task, same everything else.

`sagc-jax compare --config configs/compare_cpu.yaml [--out-dir DIR] [--seeds 0,1]
[--policies static-4,static-8,static-16,sagc] [key=value ...]` (arguments parsed in `cli.py`)
trains one run per policy x seed from the same base config, evaluates every final checkpoint on
the held-out split, and writes `results.md`, `results.json` and PNG plots to the output directory.

Protocol:

- **Policies.** `static-<g>`: `sagc.enabled=false`, `sagc.initial_group_size=g` and
  `sagc.group_sizes=[g]` (only the one shape it runs is compiled; this changes compile time,
  which is reported apart, and nothing else). `sagc`: `sagc.enabled=true` with the config's rungs.
- **Same budget.** Every run gets the same seeds, the same prompts per step (the config's
  `sagc.batch_policy`, `prompts` by default) and the same number of GRPO steps. A fixed step
  budget gives every policy the same prompts in the same order; wall-clock is *measured*, not
  budgeted, and reported as time-to-target and total time.
- **Wall-clock** of a run = sum of `step_s` over its steps (rollout + rewards + update; any
  in-training eval time is subtracted). The SFT warm start (identical for every policy of a
  seed) and the compile warm-up are not counted; compile time is reported in its own column.
- **Shared SFT.** The SFT warm start depends only on the warm-start seed (`init.seed`, else
  the run seed) and the model/data/init/sampling sections, so the first run that needs it keeps
  its post-SFT params under `<out>/sft/s<warm-start seed>/` (with a fingerprint of those
  sections) and later runs start from them via `init.params` instead of re-running SFT. With
  `init.seed` set, every seed starts from one warm start (as runs from one pretrained
  checkpoint do) and the seeds vary the RL part only. Each run still writes its own
  `checkpoints/initial`.
- **Equal wall-clock budgets** (`--budget-s SECONDS|auto`, `--clock model|measured`, see
  `budget.py`): every run is read up to the same clock budget instead of to its last step;
  `--max-steps static-4=40,...` gives each policy its own step cap (cheap-clock policies need
  more steps to spend the budget). The clock is named in results.md/json: `model` = modelled
  accelerator rollout seconds (deterministic), `measured` = this machine's real clock; the
  real CPU seconds are reported beside a `model` budget too. Without `--budget-s` the
  comparison is the step budget above.
- **Accuracy against seconds** (`--curves`, `curves.py`): every kept checkpoint evaluated
  and placed on both clocks; accuracy at an equal budget and time to a target accuracy per
  clock, mean ± standard error over seeds, in results.md and `curves.json`.
- **Resumable.** Run directories are `<out>/<policy>-s<seed>`. A run whose final checkpoint
  exists is skipped; a partial one resumes from its checkpoint. Evaluations are cached in
  `<run>/eval.json`.

Modules: `policies` (parsing), `summary` (the math), `report` (results.md), `runs` (one run),
this one (orchestration), `plots` (the PNGs).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.experiments.budget import (
    CLOCKS,
    cumulative_clock,
    cut_at_budget,
    resolve_budget,
)
from sagc_jax.experiments.policies import Policy, run_name
from sagc_jax.experiments.report import format_results_md
from sagc_jax.experiments.runs import TIMING_FILE, eval_run, train_run
from sagc_jax.experiments.summary import COLUMNS, aggregate, auto_target, num, summarize_run
from sagc_jax.sagc.timing import TimeModel

logger = logging.getLogger("sagc_jax.experiments")


def _machine() -> str:
    import jax

    devs = jax.devices()
    return (f"{os.cpu_count()} CPU cores visible, JAX {jax.__version__} on "
            f"{len(devs)} {devs[0].platform} device(s)")


def run_comparison(config: str, out_dir: str | os.PathLike[str], *, seeds: Sequence[int],
                   policies: Sequence[Policy], overrides: Sequence[str] = (),
                   target: float | None = None, window: int = 10, num_samples: int = 0,
                   eval_limit: int | None = None, eval_batch: int = 50,
                   train: bool = True, share_sft: bool = True,
                   budget_s: float | str | None = None, clock: str = "measured",
                   max_steps: Mapping[str, int] | None = None,
                   curves: bool = False) -> dict[str, Any]:
    """Trains every policy x seed (seed-major, so an interrupted comparison has whole seeds),
    evaluates, and writes results.md / results.json / plots under `out_dir`.

    `target=None` picks `auto_target` (80 % of the way from the initial to the best final
    reward). `train=False` only re-summarises existing run directories. `budget_s` (seconds on
    `clock`, or "auto") reads every run up to the same budget; `max_steps` maps a policy name
    to its own `run.steps` cap. `curves` evaluates every kept checkpoint and adds held-out
    accuracy against seconds on both clocks (`curves.py`; `curves.json`). Returns results.json.
    """
    from sagc_jax.config import load_config
    from sagc_jax.experiments.plots import plot_comparison, plot_length_tails
    from sagc_jax.metrics import read_jsonl

    t_start = time.perf_counter()
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    common = [*overrides, "run.eval_every=0"]

    if clock not in CLOCKS:
        raise ValueError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    caps = dict(max_steps or {})
    unknown = set(caps) - {p.name for p in policies}
    if unknown:
        raise ValueError(f"--max-steps names {', '.join(sorted(unknown))}, not among the policies")

    def cfg_for(pol: Policy, seed: int) -> Any:
        cap = [f"run.steps={caps[pol.name]}"] if pol.name in caps else []
        return load_config(config, [*common, *pol.overrides(), *cap, f"run.seed={seed}",
                                    f"run.dir={out / run_name(pol, seed)}"])

    cfgs = {(p.name, s): cfg_for(p, s) for s in seeds for p in policies}  # validate all first
    timings: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:
        for pol in policies:
            cfg = cfgs[(pol.name, seed)]
            if train:
                timings[(pol.name, seed)] = train_run(
                    cfg, out / "sft" / f"s{cfg.warm_start_seed}" if share_sft else None)
            else:
                tp = Path(cfg.run.dir) / TIMING_FILE
                timings[(pol.name, seed)] = json.loads(tp.read_text()) if tp.is_file() else {}
    rows = {p.name: {s: read_jsonl(Path(cfgs[(p.name, s)].run.dir) / "metrics.jsonl")
                     for s in seeds} for p in policies}
    tms = {k: TimeModel.from_sagc(c.sagc) for k, c in cfgs.items()}
    clocks = {p.name: {s: cumulative_clock(rows[p.name][s], clock, tms[(p.name, s)])
                       for s in seeds} for p in policies}
    curve_summary = (_accuracy_curves(cfgs, rows, tms, policies, seeds, num_samples, eval_limit,
                                      eval_batch, out) if curves else None)
    budget = resolve_budget(budget_s, [c[-1] if len(c) else math.nan
                                       for sd in clocks.values() for c in sd.values()])
    if budget is not None:
        for p in policies:
            for s in seeds:
                n = cut_at_budget(rows[p.name][s], budget, clock, tms[(p.name, s)])
                rows[p.name][s], clocks[p.name][s] = rows[p.name][s][:n], clocks[p.name][s][:n]
    evals = {(p.name, s): eval_run(
        Path(cfgs[(p.name, s)].run.dir), num_samples=num_samples, limit=eval_limit,
        batch_prompts=eval_batch, at_step=int(rows[p.name][s][-1]["step"])
        if budget is not None and rows[p.name][s] else None) for s in seeds for p in policies}
    target_note = "fixed by --target"
    if target is None:
        target, target_note = _auto_target(rows, window)
    per_run = {p.name: {s: _run_summary(rows[p.name][s], clocks[p.name][s], target, window,
                                        evals[(p.name, s)], timings[(p.name, s)], num_samples)
                        for s in seeds} for p in policies}
    keys = [k for k, _, _ in COLUMNS] + ([f"pass@{num_samples}"] if num_samples else [])
    agg = aggregate(per_run, keys)

    base = cfgs[(policies[0].name, seeds[0])]
    sagc_cfg = next((cfgs[(p.name, seeds[0])] for p in policies if p.group_size is None), base)
    shared_by = ("per seed" if base.init.seed is None
                 else f"by every seed (`init.seed` {base.init.seed})")
    sft_times = [t.get("sft_s") for t in timings.values()
                 if t.get("sft_s") and not t.get("sft_shared")]
    meta = {
        "config": config, "overrides": list(overrides),
        "overrides_note": f" with `{' '.join(overrides)}`" if overrides else "",
        "task": base.data.task or base.data.train_file, "steps": base.run.steps,
        "prompts_per_step": base.data.prompts_per_step,
        "batch_policy": base.sagc.batch_policy, "seeds": list(seeds),
        "policies": [p.name for p in policies], "sagc_timing": sagc_cfg.sagc.timing,
        "delta": sagc_cfg.sagc.delta, "rungs": list(sagc_cfg.sagc.group_sizes),
        "target": target, "target_note": target_note, "window": window,
        "num_samples": num_samples,
        "eval_prompts": next(iter(evals.values())).get("num_prompts"),
        "sft_note": (f"{np.mean(sft_times):.0f}s per warm start, run once and shared {shared_by}"
                     if sft_times else "no time in this invocation: restored or skipped"),
        "machine": _machine(), "elapsed_s": time.perf_counter() - t_start,
        "clock": clock, "budget_s": budget,
        "budget_note": ("none: every run read to its last step" if budget is None else
                        f"{budget:.1f} s on the `{clock}` clock"
                        + (" (auto: the smallest run total)" if budget_s == "auto" else "")),
        "max_steps": caps, "lr_schedule": base.optim.schedule,
    }
    result = {"meta": meta, "policies": agg, "runs": per_run}
    md = format_results_md(agg, meta)
    if curve_summary is not None:
        from sagc_jax.experiments.curves import format_curves_md

        result["curves"] = curve_summary
        md += "\n".join(format_curves_md(curve_summary)) + "\n"
    (out / "results.json").write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    (out / "results.md").write_text(md)
    plot_comparison(rows, out, target=target, window=window, delta=sagc_cfg.sagc.delta,
                    seconds=clocks, clock=clock)
    plot_length_tails({p: {s: Path(cfgs[(p, s)].run.dir) / "trace.jsonl" for s in seeds}
                       for p in rows}, {p: {s: len(rs) for s, rs in sd.items()}
                                        for p, sd in rows.items()},
                      out / "length_distribution.png", cap=base.sampling.max_new_tokens)
    logger.info("compare: wrote %s, results.json and plots (%.1f min)", out / "results.md",
                meta["elapsed_s"] / 60)
    return result


def _accuracy_curves(cfgs: Mapping[tuple[str, int], Any], rows: Mapping[str, Mapping[int, list]],
                     tms: Mapping[tuple[str, int], TimeModel], policies: Sequence[Policy],
                     seeds: Sequence[int], num_samples: int, eval_limit: int | None,
                     eval_batch: int, out: Path) -> dict[str, Any]:
    """Every kept checkpoint of every run evaluated, placed on both clocks (whole runs, before
    any budget cut), summarised by `curves.summarize_curves`; points in `curves.json`."""
    from dataclasses import asdict

    from sagc_jax.experiments.curves import checkpoint_steps, curve, summarize_curves

    pts: dict[str, dict[str, dict[int, list]]] = {c: {} for c in CLOCKS}
    lengths: dict[str, dict[int, Any]] = {}
    for pol in policies:
        for seed in seeds:
            run_dir = Path(cfgs[(pol.name, seed)].run.dir)
            rs, tm = rows[pol.name][seed], tms[(pol.name, seed)]
            acc = {k: eval_run(run_dir, num_samples=num_samples, limit=eval_limit,
                               batch_prompts=eval_batch, at_step=k)["accuracy"]
                   for k in checkpoint_steps(run_dir)}
            steps = [int(r["step"]) for r in rs]
            for c in CLOCKS:
                pts[c].setdefault(pol.name, {})[seed] = curve(
                    acc, cumulative_clock(rs, c, tm), steps)

            def length_at(budget: float, c: str, rs: list = rs, tm: TimeModel = tm) -> float:
                inside = rs[:cut_at_budget(rs, budget, c, tm)]
                vals = [num(r.get("len_mean")) for r in inside]
                return float(np.nanmean(vals)) if vals else math.nan

            lengths.setdefault(pol.name, {})[seed] = length_at
    summary = summarize_curves(pts, lengths)
    (out / "curves.json").write_text(json.dumps(
        {c: {p: {str(s): [asdict(x) for x in v] for s, v in sd.items()} for p, sd in pd.items()}
         for c, pd in pts.items()}, indent=1) + "\n")
    return summary


def _auto_target(rows: Mapping[str, Mapping[int, list]], window: int) -> tuple[float, str]:
    """`auto_target` over every run's first `window` steps and each policy's mean final
    reward; returns (target, the note results.md prints)."""
    first = [float(np.mean([num(r["reward_mean"]) for r in rs[:window]]))
             for seeds_ in rows.values() for rs in seeds_.values() if rs]
    finals = {p: float(np.mean([summarize_run(rs, target=math.inf)["final_reward"]
                                for rs in seeds_.values()])) for p, seeds_ in rows.items()}
    return auto_target(first, finals), (
        "auto: 80 % of the way from the mean initial reward (first "
        f"{window} steps) to the best policy's mean final reward")


def _run_summary(rows: list, seconds: Any, target: float, window: int, ev: Mapping[str, Any],
                 timing: Mapping[str, Any], num_samples: int) -> dict[str, Any]:
    """One run's `summarize_run` plus its held-out eval and its SFT / compile timings."""
    summ = summarize_run(rows, target=target, window=window, seconds=seconds)
    summ["eval_step"] = ev.get("step")
    summ["eval_accuracy"] = ev.get("accuracy")
    if num_samples:
        summ[f"pass@{num_samples}"] = ev.get(f"pass@{num_samples}")
    for k in ("compile_s", "sft_s", "sft_shared"):
        summ[k] = timing.get(k)
    return summ


def _json_default(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
