"""Paper-style experiment: SAGC against static group sizes on one task, same everything else.

`sagc-jax compare --config configs/compare_cpu.yaml [--out-dir DIR] [--seeds 0,1]
[--policies static-4,static-8,static-16,sagc] [key=value ...]` trains one run per
policy x seed from the same base config, evaluates every final checkpoint on the held-out split,
and writes `results.md`, `results.json` and PNG plots to the output directory.

Protocol:

- **Policies.** `static-<g>`: `sagc.enabled=false`, `sagc.initial_group_size=g` and
  `sagc.group_sizes=[g]` (only the one shape it runs is compiled; this changes compile time,
  which is reported apart, and nothing else). `sagc`: `sagc.enabled=true` with the config's rungs.
- **Same budget.** Every run gets the same seeds, the same prompts per step (the config's
  `sagc.batch_policy`, `prompts` by default) and the same number of GRPO steps. A fixed step
  budget gives every policy the same prompts in the same order; wall-clock is *measured*, not
  budgeted, and reported as time-to-target and total time. (A wall-clock budget would tie the
  result to this machine's load at the moment and give policies different data.)
- **Wall-clock** of a run = sum of `step_s` over its steps (rollout + rewards + update; any
  in-training eval time is subtracted). The SFT warm start (identical for every policy of a
  seed) and the compile warm-up are not counted; compile time is reported in its own column.
- **Shared SFT.** The SFT warm start depends only on the seed and the model/data/init/sampling
  sections, not on the policy, so the first run of each seed saves its post-SFT params under
  `<out>/sft/s<seed>/` (with a fingerprint of those sections) and later runs of that seed
  restore them instead of re-running SFT. Each run still writes its own `checkpoints/initial`.
- **Resumable.** Run directories are `<out>/<policy>-s<seed>`. A run whose final checkpoint
  (`checkpoints/<run.steps>`) exists is skipped; a partial one resumes from its checkpoint (the
  trainer does that by itself). Evaluations are cached in `<run>/eval.json`.

The summary math lives in small pure functions (`moving_average`, `time_to_target`,
`summarize_run`, `spread`, `aggregate`, `auto_target`) so it can be unit-tested on synthetic rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_POLICIES",
    "Policy",
    "aggregate",
    "auto_target",
    "compare_main",
    "cumulative_seconds",
    "format_results_md",
    "moving_average",
    "parse_policies",
    "parse_seeds",
    "plot_comparison",
    "run_comparison",
    "spread",
    "step_seconds",
    "summarize_run",
    "time_to_target",
]

DEFAULT_POLICIES = "static-4,static-8,static-16,sagc"
TIMING_FILE = "compare_timing.json"
EVAL_FILE = "eval.json"
SFT_FINGERPRINT = "fingerprint.json"

# Table columns: (key in a run summary, header, number format).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("time_to_target_s", "wall-clock to target (s)", "{:.0f}"),
    ("steps_to_target", "steps to target", "{:.0f}"),
    ("total_s", "total wall-clock (s)", "{:.0f}"),
    ("straggler_rate", "straggler rate", "{:.3f}"),
    ("final_reward", "final train reward", "{:.3f}"),
    ("eval_accuracy", "held-out accuracy", "{:.3f}"),
    ("len_mean", "completion length (tok)", "{:.1f}"),
    ("mean_group_size", "mean G", "{:.2f}"),
    ("compile_s", "compile warm-up (s)", "{:.0f}"),
)


# ----------------------------------------------------------------------------- policies


@dataclasses.dataclass(frozen=True)
class Policy:
    """A group-size policy: `static-<g>` (fixed G = g) or `sagc` (adaptive)."""

    name: str
    group_size: int | None  # None = SAGC

    def overrides(self) -> list[str]:
        """Config overrides that select this policy on top of the base config."""
        if self.group_size is None:
            return ["sagc.enabled=true"]
        g = self.group_size
        return ["sagc.enabled=false", f"sagc.initial_group_size={g}", f"sagc.group_sizes=[{g}]"]


def parse_policies(text: str) -> list[Policy]:
    """`"static-4,static-8,sagc"` -> Policies; ValueError naming a bad or repeated entry."""
    out: list[Policy] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        m = re.fullmatch(r"static-(\d+)", name)
        if m:
            g = int(m.group(1))
            if g < 2:
                raise ValueError(f"policy {raw.strip()!r}: a group needs G >= 2")
            pol = Policy(f"static-{g}", g)
        elif name == "sagc":
            pol = Policy("sagc", None)
        else:
            raise ValueError(f"unknown policy {raw.strip()!r}: expected static-<G> or sagc")
        if pol in out:
            raise ValueError(f"policy {pol.name!r} listed twice")
        out.append(pol)
    if not out:
        raise ValueError("no policies given")
    return out


def parse_seeds(text: str) -> list[int]:
    """`"0,1"` -> [0, 1]; ValueError on a non-integer or repeated seed."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers") from None
    if not seeds:
        raise ValueError("no seeds given")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: a seed is repeated")
    return seeds


def run_name(policy: Policy, seed: int) -> str:
    return f"{policy.name}-s{seed}"


# ----------------------------------------------------------------------------- summary math


def _num(v: Any) -> float:
    """A metrics value as float (NaN for missing / non-numeric, e.g. 'nan' strings)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over full windows: out[i] = mean(values[i : i + window]).

    Units: those of `values`. Length `len(values) - window + 1` (empty if too short); out[i]
    belongs to the step at index `i + window - 1`, the last one it averages.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    v = np.asarray(values, dtype=float)
    if len(v) < window:
        return np.zeros(0)
    c = np.cumsum(np.concatenate([[0.0], v]))
    return (c[window:] - c[:-window]) / window


def step_seconds(row: Mapping[str, Any]) -> float:
    """Training seconds of one step: `step_s` minus any in-training eval time (`eval_s`)."""
    s = _num(row.get("step_s"))
    ev = _num(row.get("eval_s"))
    return s - ev if math.isfinite(ev) else s


def cumulative_seconds(rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Wall-clock seconds at the end of each step (cumulative `step_seconds`)."""
    return np.cumsum([step_seconds(r) for r in rows]) if rows else np.zeros(0)


def time_to_target(rows: Sequence[Mapping[str, Any]], target: float, window: int = 10,
                   key: str = "reward_mean") -> tuple[int | None, float | None]:
    """First step whose trailing `window`-step mean of `key` is >= `target`.

    Returns `(step, seconds)`: the step number (the row's `step`) and the cumulative training
    wall-clock (s) at the end of that step; `(None, None)` when the target is never reached.
    """
    ma = moving_average([_num(r.get(key)) for r in rows], window)
    hit = np.flatnonzero(ma >= target)
    if len(hit) == 0:
        return None, None
    i = int(hit[0]) + window - 1
    return int(rows[i]["step"]), float(cumulative_seconds(rows)[i])


def _tail_mean(rows: Sequence[Mapping[str, Any]], key: str, n: int) -> float:
    vals = [_num(r.get(key)) for r in rows[-n:]]
    vals = [v for v in vals if math.isfinite(v)]
    return float(np.mean(vals)) if vals else math.nan


def summarize_run(rows: Sequence[Mapping[str, Any]], *, target: float, window: int = 10,
                  final_window: int = 10, len_window: int = 20) -> dict[str, Any]:
    """Headline numbers of one run from its metrics rows.

    - `time_to_target_s` (s) / `steps_to_target`: see `time_to_target` (None = not reached);
    - `total_s` (s): sum of `step_seconds`;
    - `straggler_rate`: mean per-step fraction of groups with a straggler event;
    - `final_reward`: mean `reward_mean` over the last `final_window` steps;
    - `len_mean` (tokens): mean completion length over the last `len_window` steps;
    - `mean_group_size`: mean G over all steps; `steps`: number of rows.
    """
    step, secs = time_to_target(rows, target, window)
    return {
        "steps": len(rows),
        "time_to_target_s": secs,
        "steps_to_target": step,
        "total_s": float(cumulative_seconds(rows)[-1]) if rows else math.nan,
        "straggler_rate": _tail_mean(rows, "straggler_rate", len(rows)),
        "final_reward": _tail_mean(rows, "reward_mean", final_window),
        "len_mean": _tail_mean(rows, "len_mean", len_window),
        "mean_group_size": _tail_mean(rows, "group_size", len(rows)),
    }


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and spread over seeds, ignoring None/NaN (e.g. 'not reached').

    Returns `mean`, `std` (sample std, ddof=1; 0 with one value), `min`, `max`, `n` (values
    used) and `of` (values given); the statistics are None when `n == 0`. Units: the inputs'.
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {"n": len(vals), "of": len(values)}
    if not vals:
        return {**out, "mean": None, "std": None, "min": None, "max": None}
    a = np.asarray(vals)
    return {**out, "mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def aggregate(per_run: Mapping[str, Mapping[int, Mapping[str, Any]]],
              keys: Sequence[str] = tuple(k for k, _, _ in COLUMNS)) -> dict[str, dict[str, Any]]:
    """`{policy: {seed: run summary}}` -> `{policy: {key: spread over seeds}}`."""
    return {pol: {k: spread([runs[s].get(k) for s in sorted(runs)]) for k in keys}
            for pol, runs in per_run.items()}


def auto_target(initial: Sequence[float], finals: Mapping[str, float], frac: float = 0.8,
                min_gain: float = 0.05) -> float:
    """A reward target relative to the runs, the same for every policy. Unitless (reward).

    `r0` = mean of `initial` (each run's first-window mean reward), `best` = the best policy's
    mean final reward; the target is `r0 + frac * max(best - r0, min_gain)`, rounded to 0.01.
    `min_gain` keeps it above the starting level when no policy improved (then nobody reaches
    it, which is the honest answer).
    """
    vals = [float(v) for v in initial if math.isfinite(float(v))]
    r0 = float(np.mean(vals)) if vals else 0.0
    best = max((v for v in finals.values() if math.isfinite(v)), default=r0)
    return round(r0 + frac * max(best - r0, min_gain), 2)


def format_cell(s: Mapping[str, Any], fmt: str, reached: bool = False) -> str:
    """`mean ± std` of a `spread` dict; 'not reached' / 'n/a' when it has no values; with
    `reached`, notes how many seeds reached the target when not all did."""
    if s["n"] == 0:
        return f"not reached (0/{s['of']})" if reached else "n/a"
    cell = f"{fmt.format(s['mean'])} ± {fmt.format(s['std'])}"
    if reached and s["n"] < s["of"]:
        cell += f" ({s['n']}/{s['of']} reached)"
    return cell


# ----------------------------------------------------------------------------- reporting


def format_results_md(agg: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """The results table plus the protocol in words (`meta`: target, window, steps, seeds...)."""
    head = ["policy", *[h for _, h, _ in COLUMNS]]
    lines = [
        "# SAGC vs static group sizes", "",
        f"Config `{meta['config']}`{meta.get('overrides_note', '')}; task `{meta['task']}`; "
        f"{meta['steps']} GRPO steps x {meta['prompts_per_step']} prompts per step "
        f"(batch policy `{meta['batch_policy']}`); seeds {meta['seeds']}; "
        f"SAGC timing `{meta['sagc_timing']}`, delta {meta['delta']}, rungs {meta['rungs']}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for pol, stats in agg.items():
        cells = [format_cell(stats[k], fmt, reached=k in ("time_to_target_s", "steps_to_target"))
                 for k, _, fmt in COLUMNS]
        lines.append("| " + " | ".join([pol, *cells]) + " |")
    lines += [
        "",
        f"Cells are mean ± sample std over seeds (min and max are in `results.json`). "
        f"Reward target: **{meta['target']:.2f}** ({meta['target_note']}); reached = first step "
        f"whose trailing {meta['window']}-step mean of `reward_mean` is >= the target, and "
        f"time-to-target is the training wall-clock at that step (mean over the seeds that "
        f"reached it).",
        "",
        "- **Why a step budget, not a wall-clock budget:** every policy sees the same prompts in "
        "the same order (same seeds, same prompts per step, same number of steps), so the "
        "comparison differs only in G. Wall-clock is measured and reported as it came out, "
        "on a machine that may be shared: read it relative to the other policies of the same "
        "comparison.",
        "- **Wall-clock** = sum of `step_s` (rollout + rewards + update; in-training eval time "
        "excluded). The SFT warm start is identical across policies and not counted "
        f"(it took {meta['sft_note']}); compile warm-up is in its own column (static runs "
        "compile one G, SAGC every rung).",
        f"- **Straggler rate** = mean over steps of the fraction of groups with a straggler "
        f"event (budget delta = {meta['delta']} for SAGC). **Final train reward** = mean "
        "`reward_mean` over the last 10 steps. **Completion length** = mean over the last 20 "
        "steps. **Mean G** over all steps.",
        f"- **Held-out accuracy** = greedy accuracy on {meta['eval_prompts']} held-out "
        "problems at the final checkpoint (`sagc_jax.evaluate`"
        + (f", pass@{meta['num_samples']} in results.json" if meta["num_samples"] else "")
        + ").",
        "",
        f"Machine: {meta['machine']}. Total time of this comparison (training, SFT, compiles "
        f"and evals, this invocation): {meta['elapsed_s'] / 60:.1f} min.",
        "",
        "Plots: `reward_vs_wallclock.png`, `group_size.png`, `straggler_rate.png`, "
        "`completion_length.png`.",
        "",
    ]
    return "\n".join(lines)


def plot_comparison(runs: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                    out_dir: Path, *, target: float, window: int = 10,
                    delta: float | None = None) -> list[Path]:
    """PNGs: reward vs wall-clock, G over steps, straggler rate and completion length over
    steps (trailing `window`-step means; one line per run, a colour per policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(runs)}
    paths: list[Path] = []

    def smooth(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
        y = np.array([_num(r.get(key)) for r in rows])
        w = min(window, len(y)) or 1
        return np.arange(w - 1, len(y)), moving_average(y, w)

    def figure(name: str, title: str, xlabel: str, ylabel: str, draw,
               which: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
               hline: float | None = None) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for pol, seeds in which.items():
            for j, (seed, rows) in enumerate(sorted(seeds.items())):
                if rows:
                    draw(ax, rows, dict(color=colors[pol], lw=1.5, alpha=0.85,
                                        ls=("-", "--", ":", "-.")[j % 4], label=f"{pol} s{seed}"))
        if hline is not None:
            ax.axhline(hline, color="k", lw=0.8, ls=":")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)

    def reward(ax, rows, kw):
        idx, ma = smooth(rows, "reward_mean")
        ax.plot(cumulative_seconds(rows)[idx], ma, **kw)

    def over_steps(key: str, smooth_it: bool):
        def draw(ax, rows, kw):
            steps = np.array([r["step"] for r in rows])
            if smooth_it:
                idx, y = smooth(rows, key)
                ax.plot(steps[idx], y, **kw)
            else:
                ax.step(steps, [_num(r.get(key)) for r in rows], where="post", **kw)
        return draw

    figure("reward_vs_wallclock.png", f"training reward ({window}-step mean) vs wall-clock; "
           f"target {target:.2f}", "training wall-clock (s, cumulative step_s)", "reward",
           reward, runs, hline=target)
    sagc_only = {p: s for p, s in runs.items() if p == "sagc"} or runs  # static G is flat
    figure("group_size.png", "group size G over steps", "step", "G",
           over_steps("group_size", False), sagc_only)
    figure("straggler_rate.png", f"straggler rate ({window}-step mean; dotted: delta)", "step",
           "fraction of groups", over_steps("straggler_rate", True), runs, hline=delta)
    figure("completion_length.png", f"mean completion length ({window}-step mean)", "step",
           "tokens", over_steps("len_mean", True), runs)
    return paths


# ----------------------------------------------------------------------------- running


def sft_fingerprint(cfg: Any) -> dict[str, Any]:
    """The config parts the SFT warm start depends on (seed, model, data, init, sampling)."""
    from sagc_jax.config import config_to_dict

    d = config_to_dict(cfg)
    return {"seed": d["run"]["seed"], **{k: d[k] for k in ("model", "data", "init", "sampling")}}


def _make_trainer(cfg: Any, sft_cache: Path | None):
    """A Trainer that shares its SFT warm start through `sft_cache` and records the SFT and
    compile seconds in `self.compare_timing`."""
    import jax

    from sagc_jax.checkpoint import RunCheckpointer
    from sagc_jax.trainer import Trainer

    class CompareTrainer(Trainer):
        def __init__(self, cfg: Any):
            super().__init__(cfg)
            self.compare_timing: dict[str, Any] = {"sft_s": 0.0, "sft_shared": False,
                                                   "compile_s": None}

        def sft_warm_start(self) -> list[float]:
            t0 = time.perf_counter()
            if sft_cache is None or self.cfg.init.sft_steps == 0:
                losses = super().sft_warm_start()
            else:
                fp = sft_fingerprint(self.cfg)
                store = RunCheckpointer(sft_cache, every=0, keep=1)
                meta = sft_cache / SFT_FINGERPRINT
                if ((sft_cache / "initial").is_dir() and meta.is_file()
                        and json.loads(meta.read_text()) == json.loads(json.dumps(fp))):
                    params = store.restore_initial(self.params)
                    self.params = jax.device_put(params, self.param_shardings)
                    self._sync_model()
                    self.compare_timing["sft_shared"] = True
                    losses = []
                    self._log(f"SFT warm start restored from {sft_cache}")
                else:
                    losses = super().sft_warm_start()
                    meta.unlink(missing_ok=True)
                    store.save_initial(self.params, self.model_cfg)
                    meta.write_text(json.dumps(fp, indent=1))
            self.compare_timing["sft_s"] = time.perf_counter() - t0
            return losses

        def warm_up(self) -> float:
            s = super().warm_up()
            self.compare_timing["compile_s"] = s
            return s

    return CompareTrainer(cfg)


def _final_done(run_dir: Path, steps: int) -> bool:
    return (run_dir / "checkpoints" / str(steps)).is_dir()


def train_run(cfg: Any, sft_cache: Path | None) -> dict[str, Any]:
    """Trains (or resumes, or skips when finished) one run in this process; returns its
    timing record (also written to `<run>/compare_timing.json`)."""
    import jax

    run_dir = Path(cfg.run.dir)
    timing_path = run_dir / TIMING_FILE
    if _final_done(run_dir, cfg.run.steps):
        print(f"[compare] {run_dir.name}: final checkpoint exists, skipped", flush=True)
        return json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    print(f"[compare] {run_dir.name}: training {cfg.run.steps} steps", flush=True)
    trainer = _make_trainer(cfg, sft_cache)
    try:
        trainer.train()
    finally:
        mngr = getattr(trainer.ckpt, "_mngr", None)
        if mngr is not None:
            mngr.close()
    timing = dict(trainer.compare_timing)
    del trainer
    gc.collect()
    jax.clear_caches()  # compiled executables of this run are not reused by the next
    timing_path.write_text(json.dumps(timing, indent=1) + "\n")
    return timing


def eval_run(run_dir: Path, *, num_samples: int, limit: int | None,
             batch_prompts: int) -> dict[str, Any]:
    """Greedy accuracy (and pass@k with num_samples > 0) of a run's newest checkpoint on the
    run config's held-out split; cached in `<run>/eval.json` per checkpoint step."""
    from sagc_jax.evaluate import evaluate, load_eval_examples, load_policy, resolve_checkpoint
    from sagc_jax.rl.rewards import RewardFn

    src = resolve_checkpoint(run_dir)
    path = run_dir / EVAL_FILE
    key = {"step": src.step, "num_samples": num_samples, "limit": limit}
    if path.is_file():
        old = json.loads(path.read_text())
        if {k: old.get(k) for k in key} == key:
            return old
    model, tok, cfg = load_policy(run_dir)
    assert cfg is not None
    examples, _ = load_eval_examples(None, cfg, limit=limit)
    s = cfg.sampling
    res = evaluate(model, tok, examples,
                   reward_fns=[RewardFn.from_name(r.name, r.weight) for r in cfg.rewards],
                   num_samples=num_samples, max_new_tokens=s.max_new_tokens,
                   temperature=s.temperature, batch_prompts=batch_prompts, seed=cfg.run.seed,
                   chat_template=cfg.data.chat_template, prompt_buckets=s.prompt_buckets,
                   decode_chunk=s.decode_chunk)
    out = {**key, **res}
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"[compare] {run_dir.name}: held-out accuracy {res['accuracy']:.3f} "
          f"({res['num_prompts']} problems, {res['eval_s']:.0f}s)", flush=True)
    return out


def _machine() -> str:
    import jax

    devs = jax.devices()
    return (f"{os.cpu_count()} CPU cores visible, JAX {jax.__version__} on "
            f"{len(devs)} {devs[0].platform} device(s)")


def run_comparison(config: str, out_dir: str | os.PathLike[str], *, seeds: Sequence[int],
                   policies: Sequence[Policy], overrides: Sequence[str] = (),
                   target: float | None = None, window: int = 10, num_samples: int = 0,
                   eval_limit: int | None = None, eval_batch: int = 50,
                   train: bool = True, share_sft: bool = True) -> dict[str, Any]:
    """Trains every policy x seed (seed-major, so an interrupted comparison has whole seeds),
    evaluates, and writes results.md / results.json / plots under `out_dir`.

    `target=None` picks `auto_target` (80 % of the way from the initial to the best final
    reward). `train=False` only re-summarises existing run directories. Returns results.json.
    """
    from sagc_jax.config import load_config
    from sagc_jax.metrics import read_jsonl

    t_start = time.perf_counter()
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    common = [*overrides, "run.eval_every=0"]

    def cfg_for(pol: Policy, seed: int) -> Any:
        return load_config(config, [*common, *pol.overrides(), f"run.seed={seed}",
                                    f"run.dir={out / run_name(pol, seed)}"])

    cfgs = {(p.name, s): cfg_for(p, s) for s in seeds for p in policies}  # validate all first
    timings: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:
        for pol in policies:
            cfg = cfgs[(pol.name, seed)]
            if train:
                timings[(pol.name, seed)] = train_run(
                    cfg, out / "sft" / f"s{seed}" if share_sft else None)
            else:
                tp = Path(cfg.run.dir) / TIMING_FILE
                timings[(pol.name, seed)] = json.loads(tp.read_text()) if tp.is_file() else {}
    evals: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:
        for pol in policies:
            evals[(pol.name, seed)] = eval_run(
                Path(cfgs[(pol.name, seed)].run.dir), num_samples=num_samples, limit=eval_limit,
                batch_prompts=eval_batch)

    rows = {p.name: {s: read_jsonl(Path(cfgs[(p.name, s)].run.dir) / "metrics.jsonl")
                     for s in seeds} for p in policies}
    target_note = "fixed by --target"
    if target is None:
        first = [float(np.mean([_num(r["reward_mean"]) for r in rs[:window]]))
                 for seeds_ in rows.values() for rs in seeds_.values() if rs]
        finals = {p: float(np.mean([summarize_run(rs, target=math.inf)["final_reward"]
                                    for rs in seeds_.values()])) for p, seeds_ in rows.items()}
        target = auto_target(first, finals)
        target_note = ("auto: 80 % of the way from the mean initial reward (first "
                       f"{window} steps) to the best policy's mean final reward")
    per_run: dict[str, dict[int, dict[str, Any]]] = {}
    for p in policies:
        for s in seeds:
            summ = summarize_run(rows[p.name][s], target=target, window=window)
            summ["eval_accuracy"] = evals[(p.name, s)].get("accuracy")
            if num_samples:
                summ[f"pass@{num_samples}"] = evals[(p.name, s)].get(f"pass@{num_samples}")
            summ["compile_s"] = timings[(p.name, s)].get("compile_s")
            summ["sft_s"] = timings[(p.name, s)].get("sft_s")
            summ["sft_shared"] = timings[(p.name, s)].get("sft_shared")
            per_run.setdefault(p.name, {})[s] = summ
    keys = [k for k, _, _ in COLUMNS] + ([f"pass@{num_samples}"] if num_samples else [])
    agg = aggregate(per_run, keys)

    base = cfgs[(policies[0].name, seeds[0])]
    sagc_cfg = next((cfgs[(p.name, seeds[0])] for p in policies if p.group_size is None), base)
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
        "sft_note": (f"{np.mean(sft_times):.0f}s per seed, run once per seed and shared"
                     if sft_times else "no time in this invocation: restored or skipped"),
        "machine": _machine(), "elapsed_s": time.perf_counter() - t_start,
    }
    result = {"meta": meta, "policies": agg, "runs": per_run}
    (out / "results.json").write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    (out / "results.md").write_text(format_results_md(agg, meta))
    plot_comparison(rows, out, target=target, window=window, delta=sagc_cfg.sagc.delta)
    print(f"[compare] wrote {out / 'results.md'}, results.json and plots "
          f"({meta['elapsed_s'] / 60:.1f} min)", flush=True)
    return result


def _json_default(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def compare_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sagc-jax compare",
        description="Train SAGC and static-G policies on the same config, seeds and step budget, "
                    "evaluate each final checkpoint, and write results.md/json and plots.")
    p.add_argument("--config", required=True, help="base YAML config (e.g. "
                   "configs/compare_cpu.yaml)")
    p.add_argument("--out-dir", default="runs/compare", help="output directory (default "
                   "runs/compare); runs go to <out>/<policy>-s<seed>")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"static-<G> and/or sagc, comma-separated (default {DEFAULT_POLICIES})")
    p.add_argument("--target", default="auto", help="training-reward target for "
                   "time-to-target, or 'auto' (80%% of the way from the initial to the best "
                   "final reward; default)")
    p.add_argument("--window", type=int, default=10, help="moving-average window in steps for "
                   "the target crossing and plots (default 10)")
    p.add_argument("--num-samples", type=int, default=0, help="eval: k samples per prompt for "
                   "pass@k (default 0 = greedy accuracy only)")
    p.add_argument("--eval-limit", type=int, help="eval: only the first N held-out problems")
    p.add_argument("--eval-batch", type=int, default=50, help="eval: prompts per sampler call")
    p.add_argument("--no-share-sft", action="store_true",
                   help="run the SFT warm start in every run instead of once per seed")
    p.add_argument("--summarize-only", action="store_true",
                   help="do not train: evaluate and summarise the existing run directories")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="overrides applied to every run, e.g. run.steps=40")
    args = p.parse_args(argv)
    err = "sagc-jax compare: error:"
    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policies)
        target = None if args.target == "auto" else float(args.target)
        if args.window < 1 or args.num_samples < 0 or args.eval_batch < 1 or (
                args.eval_limit is not None and args.eval_limit < 1):
            raise ValueError("--window, --eval-batch and --eval-limit must be >= 1 and "
                             "--num-samples >= 0")
    except ValueError as e:
        print(f"{err} {e}", file=sys.stderr)
        return 2
    from sagc_jax.config import ConfigError

    try:
        run_comparison(args.config, args.out_dir, seeds=seeds, policies=policies,
                       overrides=args.overrides, target=target, window=args.window,
                       num_samples=args.num_samples, eval_limit=args.eval_limit,
                       eval_batch=args.eval_batch, train=not args.summarize_only,
                       share_sft=not args.no_share_sft)
    except ConfigError as e:
        print(f"{err} config: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError, RuntimeError) as e:  # incl. TrainingError
        print(f"{err} {(str(e) or type(e).__name__).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0
