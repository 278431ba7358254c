"""A comparison's PNG plots: policies side by side (reward vs clock, G, straggler rate, length)
and completion-length tails early vs late. Smoothing is `metrics.moving_average`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.experiments.budget import length_samples, tail_stats
from sagc_jax.experiments.summary import cumulative_seconds, num
from sagc_jax.metrics import moving_average
from sagc_jax.plots import pyplot


def plot_comparison(runs: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                    out_dir: Path, *, target: float, window: int = 10,
                    delta: float | None = None,
                    seconds: Mapping[str, Mapping[int, np.ndarray]] | None = None,
                    clock: str = "measured") -> list[Path]:
    """PNGs: reward vs wall-clock, G over steps, straggler rate and completion length over
    steps (trailing `window`-step means; one line per run, a colour per policy).

    `seconds[policy][seed]`: cumulative clock per row for the x axis of the reward plot
    (default: the measured `cumulative_seconds`); `clock` names it on the axis."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(runs)}
    paths: list[Path] = []

    def smooth(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
        y = np.array([num(r.get(key)) for r in rows])
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
        pol, seed = kw["label"].rsplit(" s", 1)
        x = cumulative_seconds(rows) if seconds is None else seconds[pol][int(seed)]
        ax.plot(np.asarray(x)[idx], ma, **kw)

    def over_steps(key: str, smooth_it: bool):
        def draw(ax, rows, kw):
            steps = np.array([r["step"] for r in rows])
            if smooth_it:
                idx, y = smooth(rows, key)
                ax.plot(steps[idx], y, **kw)
            else:
                ax.step(steps, [num(r.get(key)) for r in rows], where="post", **kw)
        return draw

    xlabel = ("modelled accelerator rollout seconds (clock `model`)" if clock == "model"
              else "training wall-clock (s, cumulative step_s)")
    figure("reward_vs_wallclock.png", f"training reward ({window}-step mean) vs wall-clock; "
           f"target {target:.2f}", xlabel, "reward", reward, runs, hline=target)
    sagc_only = {p: s for p, s in runs.items() if p.startswith("sagc")} or runs  # static G is flat
    figure("group_size.png", "group size G over steps", "step", "G",
           over_steps("group_size", False), sagc_only)
    figure("straggler_rate.png", f"straggler rate ({window}-step mean; dotted: delta)", "step",
           "fraction of groups", over_steps("straggler_rate", True), runs, hline=delta)
    figure("completion_length.png", f"mean completion length ({window}-step mean)", "step",
           "tokens", over_steps("len_mean", True), runs)
    return paths


def plot_length_tails(traces: Mapping[str, Mapping[int, Path]],
                      steps: Mapping[str, Mapping[int, int]], path: Path, *, cap: int,
                      first: int = 5) -> Path | None:
    """Completion-length histograms (log density) per policy: the first `first` steps of every
    seed against its last `first` steps (of `steps[policy][seed]`, e.g. within a budget),
    pooled over seeds, from each run's `trace.jsonl`. One panel per policy; dotted: `cap`."""
    pols = [p for p in traces if any(Path(t).is_file() for t in traces[p].values())]
    if not pols:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(pols), figsize=(4.2 * len(pols), 3.8), squeeze=False,
                             sharey=True)
    bins = np.arange(0, cap + 9, 8)
    for ax, pol in zip(axes[0], pols):
        for label, pick, color in (("early", lambda n: (1, first), "tab:red"),
                                   ("late", lambda n: (n - first + 1, n), "tab:blue")):
            parts = [length_samples(t, pick(steps[pol][s])) for s, t in traces[pol].items()
                     if Path(t).is_file() and steps[pol][s] > 0]
            lens = np.concatenate([a for a, _ in parts]) if parts else np.zeros(0, int)
            trunc = np.concatenate([b for _, b in parts]) if parts else np.zeros(0, bool)
            if not len(lens):
                continue
            st = tail_stats(lens, trunc)
            ax.hist(lens, bins=bins, histtype="step", lw=1.6, density=True, color=color,
                    label=f"{label} {first} steps: med {st['median']:.0f}, p99 {st['p99']:.0f},"
                          f" trunc {st['truncated']:.1%}")
        ax.axvline(cap, ls=":", c="k", lw=1)
        ax.set_yscale("log")
        ax.set_title(pol)
        ax.set_xlabel("completion length (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5)
    axes[0][0].set_ylabel("density (log)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
