"""Per-step figures of one training run, from its `metrics.jsonl` and `trace.jsonl`.

    python -m tools.run_figures runs/smollm2-135m_rg_cpu --out docs/results/smollm2

Writes `<out>/run_figures.md` (a per-step table: G, reward, truncated fraction, straggler rate,
completion length mean / p90 / p99, held-out accuracy where evaluated) and `<out>/lengths.png`
(the curves, and the completion-length histogram of the first vs the last steps). Lengths are
completion tokens per row; a row at `max_new_tokens` ran to the cap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_lengths(trace: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """`{step: int[rows]}`: every row's completion length of that step (all rounds, all groups)."""
    out: dict[int, list[int]] = {}
    for row in trace:
        out.setdefault(row["step"], []).extend(
            n for g in row["groups"] for n in g["lengths"])
    return {s: np.asarray(v) for s, v in out.items()}


def table(metrics: list[dict[str, Any]], lengths: dict[int, np.ndarray]) -> list[str]:
    """Markdown rows, one per step."""
    lines = ["| step | G | reward | truncated | straggler rate | len mean | p90 | p99 | held-out |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in metrics:
        ls = lengths.get(m["step"], np.zeros(1))
        acc = m.get("eval_accuracy")
        lines.append(
            f"| {m['step']} | {m['group_size']} | {m['reward_mean']:.3f} | "
            f"{m['truncated_frac']:.2f} | {m['straggler_rate']:.2f} | {ls.mean():.0f} | "
            f"{np.percentile(ls, 90):.0f} | {np.percentile(ls, 99):.0f} | "
            f"{'' if acc is None else f'{acc:.3f}'} |")
    return lines


def plot(metrics: list[dict[str, Any]], lengths: dict[int, np.ndarray], cap: int,
         out: Path, k: int) -> None:
    """The curves over steps and the length histogram of the first vs last `k` steps."""
    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(2, 3, figsize=(13, 7))
    series = [("reward_mean", "reward"), ("truncated_frac", "truncated fraction"),
              ("straggler_rate", "straggler rate"), ("group_size", "G")]
    for a, (key, title) in zip(ax.flat, series):
        a.plot(steps, [m[key] for m in metrics], marker=".")
        a.set_title(title)
        a.set_xlabel("step")
    a = ax.flat[4]
    for q in (50, 90, 99):
        a.plot(steps, [np.percentile(lengths[s], q) for s in steps], label=f"p{q}")
    a.plot(steps, [lengths[s].mean() for s in steps], label="mean", ls="--")
    a.set_title("completion length (tokens)")
    a.legend()
    a = ax.flat[5]
    first = np.concatenate([lengths[s] for s in steps[:k]])
    last = np.concatenate([lengths[s] for s in steps[-k:]])
    bins = np.linspace(0, cap, 17)
    a.hist(first, bins=bins, alpha=0.5, label=f"steps {steps[0]}-{steps[k - 1]}", density=True)
    a.hist(last, bins=bins, alpha=0.5, label=f"steps {steps[-k]}-{steps[-1]}", density=True)
    a.set_title("length histogram")
    a.legend()
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=int, default=4, help="steps in each histogram")
    args = ap.parse_args(argv)
    metrics = [m for m in _jsonl(args.run_dir / "metrics.jsonl") if "group_size" in m]
    trace = _jsonl(args.run_dir / "trace.jsonl")
    lengths = step_lengths(trace)
    cap = int(trace[0]["max_new_tokens"])
    args.out.mkdir(parents=True, exist_ok=True)
    k = max(1, min(args.window, len(metrics) // 2))
    plot(metrics, lengths, cap, args.out / "lengths.png", k)
    first = np.concatenate([lengths[m["step"]] for m in metrics[:k]])
    last = np.concatenate([lengths[m["step"]] for m in metrics[-k:]])
    summary = [f"first {k} steps: length mean {first.mean():.0f}, at cap "
               f"{(first >= cap).mean():.2f}; last {k} steps: mean {last.mean():.0f}, at cap "
               f"{(last >= cap).mean():.2f}"]
    (args.out / "run_figures.md").write_text("\n".join([*table(metrics, lengths), "",
                                                        *summary]) + "\n")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
