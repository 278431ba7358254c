"""Expected values over many seeds: is a gap between policies a bias or the luck of the loops?

    python benchmarks/sagc_replicates.py --config configs/sim/drift.yaml --steps 500 --seeds 40

One seed's benefit/s moves by +-6 % with where its rare loops fall (a loop step costs ~7
ordinary ones), so a per-seed comparison of SAGC with a static g, or of one rung with another
inside a phase, mixes the controller's bias with that luck. This runs the chosen policies on
common random numbers for `--seeds` seeds over the first `--steps` steps and prints the pooled
benefit/s (sum of benefit over sum of seconds, all seeds), the per-seed mean and sd, the mean
straggler rate (and whether it is within delta + tolerance), the fraction of steps longer
than 4x the policy's median step (loop steps, mostly), each policy's mean per-seed ratio to the
first one, and the pooled ratio of SAGC to the best static g whose mean rate is in budget.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sagc_jax.sagc.simulate import load_sim_config, make_policies, run_policies  # noqa: E402


def _one(seed: int, config: str, steps: int, names: list[str], sets: list[str]) -> dict:
    sim = load_sim_config(config, [f"seed={seed}", *sets])
    pols = make_policies(sim.sagc)
    missing = [n for n in names if n not in pols]
    if missing:
        raise SystemExit(f"--policies: unknown {missing}; this config has {sorted(pols)}")
    traj = run_policies(sim, {n: pols[n] for n in names}, steps=steps)
    long_s = {n: float(np.median(t["step_s"])) * 4 for n, t in traj.items()}
    return {n: (float(t["benefit"].sum()), float(t["step_s"].sum()),
                float((t["step_s"] > long_s[n]).mean()), float(t["straggler_rate"].mean()),
                sim.sagc.delta + sim.tolerance) for n, t in traj.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--policies", default="static-4,static-8,sagc",
                    help="comma-separated; ratios are to the first")
    ap.add_argument("--set", nargs="*", default=[], help="simulator overrides (key=value)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    names = a.policies.split(",")
    run = partial(_one, config=a.config, steps=a.steps, names=names, sets=a.set)
    if a.workers == 1:
        out = [run(seed) for seed in range(a.seeds)]
    else:
        with ProcessPoolExecutor(a.workers) as ex:
            out = list(ex.map(run, range(a.seeds)))
    base = np.array([o[names[0]][0] / o[names[0]][1] for o in out])
    print(f"{a.config}, steps 0-{a.steps}, seeds 0-{a.seeds - 1} "
          f"(load average {os.getloadavg()[0]:.1f})")
    print("| policy | pooled benefit/s | per-seed mean ± sd | straggler rate | long-step fraction "
          f"| mean ratio to {names[0]} | seeds above {names[0]} |")
    print("|---|---|---|---|---|---|---|")
    pooled, in_budget = {}, {}
    for n in names:
        v = np.array([o[n] for o in out])
        bs = v[:, 0] / v[:, 1]
        pooled[n] = v[:, 0].sum() / v[:, 1].sum()
        rate = v[:, 3].mean()
        in_budget[n] = rate <= v[0, 4]
        print(f"| {n} | {pooled[n]:.4f} | {bs.mean():.4f} ± {bs.std():.4f} "
              f"| {rate:.3f}{'' if in_budget[n] else ' (over)'} | {v[:, 2].mean():.4f} "
              f"| {(bs / base).mean():.3f} | {(bs > base).sum()}/{len(bs)} |")
    statics = [n for n in names if n.startswith("static-") and in_budget[n]]
    if "sagc" in pooled and statics:
        best = max(statics, key=pooled.get)
        print(f"pooled sagc / best in-budget static ({best}): {pooled['sagc'] / pooled[best]:.3f}")


if __name__ == "__main__":
    main()
