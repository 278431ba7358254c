"""SAGC vs static group sizes on real training runs of one config (issue 32).

    python -m tools.compare_real_runs sagc=RUN_A static-4=RUN_B static-16=RUN_C \
        --out docs/results/smollm2 [--copy docs/results/smollm2/run_files]

Each RUN is a run dir of `sagc-jax train` (its `config.yaml`, `metrics.jsonl`, `trace.jsonl`).
Per run and step, from those files only:

* modelled rollout seconds: `TimeModel.from_sagc(run's sagc section).step_seconds(rows,
  decode_steps)`, what `sagc.timing: model` feeds the controller and the simulator counts
  (prefill + decode steps x t_decode(rows); the train step is not in it);
* the straggler cost under `tail_share` (mean over the step's groups of (max L - median L) /
  max L, `sagc.events.tail_share`), recomputed from trace.jsonl for every run (a static run
  logs its config's `sagc.straggler`, which need not be tail_share);
* benefit as `sagc.simulate.run_step` counts it: groups whose rewards are not all equal x
  (1 - 1/g); beside it the controller's `realised_benefit` (passes at reward > pass_threshold
  not all equal).

Writes `<out>/<name>.png` (`--name`, default sagc_vs_static: reward vs cumulative modelled
seconds and vs step, G over steps, tail share per step vs delta, truncated fraction,
completion length) and `<out>/<name>_table.md` (per-run sums); `--copy DIR` copies each
run's config.yaml, metrics.jsonl and trace.jsonl to DIR/<name>/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.config import load_saved_config
from sagc_jax.config.sagc_constants import CONSTANTS
from sagc_jax.sagc.estimators import realised_benefit
from sagc_jax.sagc.events import tail_share
from sagc_jax.sagc.timing import TimeModel

#: The budget is met at a mean cost <= delta + TOLERANCE (as the simulator and issue 32 judge it).
TOLERANCE = 0.01


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def load_run(run_dir: Path) -> dict[str, Any]:
    """Per-step arrays of one run (see the module docstring)."""
    cfg = load_saved_config(run_dir / "config.yaml")
    metrics = [m for m in _jsonl(run_dir / "metrics.jsonl") if "group_size" in m]
    trace = {t["step"]: t for t in _jsonl(run_dir / "trace.jsonl")}
    tm = TimeModel.from_sagc(cfg.sagc)
    out: dict[str, list[float]] = {k: [] for k in (
        "step", "g", "reward", "model_s", "wall_s", "rollout_s", "tail_share", "truncated",
        "len_mean", "len_p90", "benefit", "benefit_ctrl", "logged_rate")}
    for m in metrics:
        t = trace[m["step"]]
        g = t["group_size"]
        lengths = np.array([gr["lengths"] for gr in t["groups"]])
        rewards = np.array([gr["rewards"] for gr in t["groups"]])
        out["step"].append(m["step"])
        out["g"].append(g)
        out["reward"].append(m["reward_mean"])
        out["model_s"].append(tm.step_seconds(m["rows"], m["decode_steps"]))
        out["wall_s"].append(m["step_s"])
        out["rollout_s"].append(m["rollout_s"])
        out["tail_share"].append(float(tail_share(lengths).mean()))
        out["truncated"].append(m["truncated_frac"])
        out["len_mean"].append(float(lengths.mean()))
        out["len_p90"].append(float(np.percentile(lengths, 90)))
        out["benefit"].append(float((rewards.max(-1) != rewards.min(-1)).sum()) * (1 - 1 / g))
        out["benefit_ctrl"].append(realised_benefit(rewards, CONSTANTS.pass_threshold))
        out["logged_rate"].append(m["straggler_rate"])
    run = {k: np.asarray(v) for k, v in out.items()}
    run["cfg"] = cfg
    return run


def table(runs: dict[str, dict[str, Any]], delta: float) -> list[str]:
    """Markdown: one row per run."""
    lines = [
        "| run | steps | G (per step) | reward, mean | first half | last half | tail share, run "
        f"mean (budget: delta {delta} + {TOLERANCE}) | truncated | len mean | modelled rollout s "
        "| measured wall s (rollout) | benefit | benefit / modelled s "
        "| controller benefit / modelled s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        half = len(r["step"]) // 2
        gs = ",".join(str(int(g)) for g in r["g"]) if len(set(r["g"])) > 1 else f"{int(r['g'][0])}"
        ms = r["model_s"].sum()
        lines.append(
            f"| {name} | {len(r['step'])} | {gs} | {r['reward'].mean():.3f} | "
            f"{r['reward'][:half].mean():.3f} | {r['reward'][half:].mean():.3f} | "
            f"{r['tail_share'].mean():.3f} "
            f"{'≤' if r['tail_share'].mean() <= delta + TOLERANCE else '>'} "
            f"{delta + TOLERANCE:g} | {r['truncated'].mean():.1%} | "
            f"{r['len_mean'].mean():.0f} | {ms:.1f} | "
            f"{r['wall_s'].sum():.0f} ({r['rollout_s'].sum():.0f}) | {r['benefit'].sum():.2f} | "
            f"{r['benefit'].sum() / ms:.3f} | {r['benefit_ctrl'].sum() / ms:.3f} |")
    return lines


def step_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: per step, G / reward / tail share / modelled s of every run."""
    names = list(runs)
    head = "| step | " + " | ".join(f"{n}: G, reward, tail share, model s" for n in names) + " |"
    lines = [head, "|---:|" + "---|" * len(names)]
    n = max(len(r["step"]) for r in runs.values())
    for i in range(n):
        cells = []
        for r in runs.values():
            if i < len(r["step"]):
                cells.append(f"{int(r['g'][i])}, {r['reward'][i]:.3f}, {r['tail_share'][i]:.2f}, "
                             f"{r['model_s'][i]:.2f}")
            else:
                cells.append("")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return lines


def plot(runs: dict[str, dict[str, Any]], delta: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(14, 7.5))
    for i, (name, r) in enumerate(runs.items()):
        kw = {"marker": ".", "color": f"C{i}", "label": name}
        t = np.cumsum(r["model_s"])
        ax[0, 0].plot(t, r["reward"], **kw, alpha=0.5)
        ax[0, 0].plot(t, np.cumsum(r["reward"]) / np.arange(1, len(t) + 1), color=f"C{i}",
                      ls="--", lw=2, label=f"{name}: running mean")
        ax[0, 1].plot(r["step"], r["reward"], **kw)
        ax[0, 2].step(r["step"], r["g"] * (1 + 0.02 * (i - 1)), where="mid", color=f"C{i}",
                      label=name, lw=2.5 if name.startswith("sagc") else 1.2)
        ax[1, 0].plot(r["step"], r["tail_share"], **{**kw, "label": f"{name} (run mean "
                                                       f"{r['tail_share'].mean():.3f})"})
        ax[1, 1].plot(r["step"], r["truncated"], **kw)
        ax[1, 2].plot(r["step"], r["len_mean"], **kw)
    ax[0, 0].set(title="training reward vs cumulative modelled rollout s",
                 xlabel="modelled seconds (sagc time model)",
                 ylabel="reward mean (the step's rows)")
    ax[0, 1].set(title="training reward vs step", xlabel="step")
    ax[0, 2].set(title="group size G (lines offset 2 % to stay apart)", xlabel="step",
                 yticks=[4, 8, 16])
    ax[1, 0].axhline(delta, color="k", ls="--", lw=1, label=f"delta {delta}")
    ax[1, 0].set(title="tail share (mean over the step's groups)", xlabel="step")
    ax[1, 1].set(title="truncated fraction (rows at the cap)", xlabel="step")
    ax[1, 2].set(title="completion length, mean (tokens)", xlabel="step")
    for a in ax.flat:
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    ap.add_argument("--out", required=True)
    ap.add_argument("--delta", type=float, default=None,
                    help="the budget drawn (default: the first run's sagc.delta)")
    ap.add_argument("--name", default="sagc_vs_static",
                    help="output files <out>/<name>.png and <out>/<name>_table.md")
    ap.add_argument("--copy", default=None, metavar="DIR",
                    help="copy each run's config.yaml, metrics.jsonl, trace.jsonl to DIR/NAME/")
    args = ap.parse_args(argv)
    dirs = dict(s.split("=", 1) for s in args.runs)
    runs = {n: load_run(Path(d)) for n, d in dirs.items()}
    # Runs saved before issue 49 left delta out and ran at the then-default 0.6.
    delta = args.delta if args.delta is not None else (
        next(iter(runs.values()))["cfg"].sagc.delta or 0.6)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(runs, delta, out / f"{args.name}.png")
    md = [f"Generated by `python -m tools.compare_real_runs` (see {args.name}.md).", "",
          *table(runs, delta), "", *step_table(runs), ""]
    (out / f"{args.name}_table.md").write_text("\n".join(md))
    print("\n".join(md))
    if args.copy:
        for n, d in dirs.items():
            dst = Path(args.copy) / n
            dst.mkdir(parents=True, exist_ok=True)
            for f in ("config.yaml", "metrics.jsonl", "trace.jsonl"):
                shutil.copy(Path(d) / f, dst / f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
