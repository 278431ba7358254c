"""What a run writes: metrics.jsonl, trace.jsonl, TensorBoard events and PNG plots.

Only process 0 writes (`enabled=False` elsewhere); every writer appends, so a resumed run
continues the same files (rows past the restored step are dropped first, see `truncate_after`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

# Keys that depend on wall-clock time; excluded when comparing runs for exact resume.
TIMING_KEYS = ("rollout_s", "reward_s", "train_s", "step_s", "prefill_s", "decode_s",
               "tokens_per_s", "compile_s", "time_s", "compiles", "eval_s")


def _clean(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def truncate_after(path: Path, step: int) -> None:
    """Drops JSONL rows with `step` > step (written after the checkpoint a resume starts from)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a row cut short by a kill
    path.write_text("".join(x + "\n" for x in keep))


class RunWriter:
    """Appends per-step metrics and per-group traces; TensorBoard scalars; plots at the end."""

    def __init__(self, run_dir: str | os.PathLike, *, enabled: bool = True,
                 tensorboard: bool = True):
        self.dir = Path(run_dir)
        self.enabled = enabled
        self.metrics_path = self.dir / "metrics.jsonl"
        self.trace_path = self.dir / "trace.jsonl"
        self._tb = None
        if enabled and tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"))

    def resume_from(self, step: int) -> None:
        if self.enabled:
            truncate_after(self.metrics_path, step)
            truncate_after(self.trace_path, step)

    def write(self, row: dict[str, Any], trace: dict[str, Any] | None = None) -> None:
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in row.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if trace is not None:
            with self.trace_path.open("a") as f:
                f.write(json.dumps(trace) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, row["step"])

    def close(self, plots: bool = True) -> None:
        if not self.enabled:
            return
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if plots:
            plot_run(self.metrics_path, self.dir / "plots")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def plot_run(metrics_path: Path, out_dir: Path) -> list[Path]:
    """PNGs of reward, completion length, group size and straggler rate over steps."""
    if not metrics_path.exists():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(metrics_path)
    if not rows:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = np.array([r["step"] for r in rows])
    panels = [("reward_mean", "training reward"), ("len_mean", "mean completion length"),
              ("group_size", "group size G"), ("straggler_rate", "straggler rate"),
              ("step_s", "seconds per step"), ("sagc_queue", "SAGC virtual queue")]
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(11, 9), sharex=True)
    for ax, (key, title) in zip(axes.ravel(), panels):
        y = np.array([float(r.get(key, np.nan)) if not isinstance(r.get(key), str) else np.nan
                      for r in rows])
        ax.plot(steps, y, lw=0.8, alpha=0.5)
        if len(y) >= 10 and key not in ("group_size",):
            w = max(len(y) // 20, 5)
            ax.plot(steps[w - 1:], np.convolve(np.nan_to_num(y), np.ones(w) / w, "valid"), lw=2)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    path = out_dir / "training.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]
