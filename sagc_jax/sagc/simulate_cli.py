"""``sagc-jax simulate``: the simulator's command line and report (its table and plot).

``sagc-jax simulate --config FILE [key=value ...] [--out result.json] [--plot out.png]``, also
``python -m sagc_jax.sagc.simulate_cli``; the simulation itself is ``simulate.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.sagc.simulate import SimConfig, best_static_in_budget, load_sim_config, simulate


def format_table(result: dict[str, Any]) -> str:
    """Markdown table of the headline metrics."""
    pols = result["policies"]
    best_static = best_static_in_budget(result)
    oracle = pols.get("oracle", {}).get("benefit_per_s", float("nan"))
    lines = [
        "| policy | straggler_rate | meets_delta | step_s | benefit_per_s | vs best static in "
        "budget | vs oracle | mean_g |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in pols.items():
        ok = math.isfinite(best_static) and best_static > 0
        rel = f"{v['benefit_per_s'] / best_static:.2f}x" if ok else "n/a"
        rel_o = f"{v['benefit_per_s'] / oracle:.2f}x" if oracle > 0 else "n/a"
        lines.append(
            f"| {name} | {v['straggler_rate']:.3f} | {'yes' if v['meets_delta'] else 'no'} | "
            f"{v['step_s']:.2f} | {v['benefit_per_s']:.3f} | {rel} | {rel_o} | "
            f"{v['mean_group_size']:.2f} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], sim: SimConfig, path: str | Path) -> None:
    """PNG: SAGC group size over steps; rolling straggler rate of every policy vs delta."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traj = result["_trajectories"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.step(np.arange(sim.steps), traj["sagc"]["group_size"], where="post", color="C3")
    ax1.set_ylabel("SAGC group size")
    ax1.set_yticks(list(sim.sagc.group_sizes))
    w = min(sim.plot_window, sim.steps)
    kernel = np.ones(w) / w
    for i, (name, tr) in enumerate(traj.items()):
        roll = np.convolve(tr["straggler_rate"], kernel, mode="valid")
        style = (
            {"lw": 2.0, "color": "C3"}
            if name == "sagc"
            else {"lw": 1.0, "color": f"C{i % 3}", "alpha": 0.7}
        )
        ax2.plot(np.arange(w - 1, sim.steps), roll, label=name, **style)
    if sim.sagc.delta is not None:
        ax2.axhline(sim.sagc.delta, color="k", ls="--", lw=1, label="delta")
    ax2.set_ylabel(f"straggler rate ({w}-step mean)")
    ax2.set_xlabel("step")
    ax2.legend(fontsize=8, ncol=3)
    for ax in (ax1, ax2):
        for s in sim.drift_steps:
            ax.axvline(s, color="gray", ls=":", lw=1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def simulate_main(argv: list[str]) -> int:
    """``sagc-jax simulate``: returns the exit code (2 and one line on bad input)."""
    ap = argparse.ArgumentParser(
        prog="sagc-jax simulate",
        description="Compare static group sizes with SAGC on a simulated or replayed workload.",
    )
    ap.add_argument("--config", required=True, help="simulation YAML (see docs/sagc.md)")
    ap.add_argument("overrides", nargs="*", help="dot-path key=value overrides, e.g. steps=300")
    ap.add_argument("--out", help="write the result JSON here")
    ap.add_argument("--plot", help="write a PNG (group size, rolling straggler rate) here")
    args = ap.parse_args(argv)
    try:
        sim = load_sim_config(args.config, args.overrides)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    result = simulate(sim)
    elapsed = time.perf_counter() - t0
    print(format_table(result))
    print(f"({sim.steps} steps, delta={sim.sagc.delta}, tolerance={sim.tolerance}, {elapsed:.1f}s)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        payload = {k: v for k, v in result.items() if not k.startswith("_")}
        Path(args.out).write_text(json.dumps(payload, indent=1))
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(result, sim, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(simulate_main(sys.argv[1:]))
