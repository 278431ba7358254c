"""PNG plots of one run's training curves (matplotlib, Agg backend, imported only when plotting;
a comparison's plots: `experiments/plots.py`). Smoothing is `metrics.moving_average`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.metrics import moving_average, read_jsonl


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(metrics_path: Path, out_dir: Path) -> list[Path]:
    """PNGs of reward, completion length, group size and straggler rate over steps."""
    if not metrics_path.exists():
        return []
    plt = pyplot()
    rows = read_jsonl(metrics_path)
    if not rows:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = np.array([r["step"] for r in rows])
    panels = [("reward_mean", "training reward"), ("len_mean", "mean completion length"),
              ("group_size", "group size G"), ("straggler_rate", "straggler rate"),
              ("step_s", "seconds per step"), ("sagc_queue", "SAGC virtual queue"),
              ("train_s", "train-step seconds"),
              ("train_token_util", "train token utilisation (real / computed)")]
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(11, 12), sharex=True)
    for ax, (key, title) in zip(axes.ravel(), panels):
        y = np.array([float(r.get(key, np.nan)) if not isinstance(r.get(key), str) else np.nan
                      for r in rows])
        ax.plot(steps, y, lw=0.8, alpha=0.5)
        if len(y) >= 10 and key not in ("group_size",):
            w = max(len(y) // 20, 5)
            ax.plot(steps[w - 1:], moving_average(np.nan_to_num(y), w), lw=2)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    path = out_dir / "training.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]
