"""Are SAGC's predictions right? Predicted vs realised benefit and step seconds at every rung.

    python benchmarks/sagc_calibration.py --config configs/sim/ramble_replay.yaml --seed 0 \
        --windows 100:300,700:1000

Runs the shipped SAGC policy through the workload and, at every step, records what its state
predicts for each candidate g (`predicted_benefit`, `predicted_cost`; the benefit also with
the constant `pass_em_iters` passed in as 0, the moments Beta alone) and what each g would have
realised on the same draw (`simulate.run_step` at every rung: common random numbers). Prints
the per-window means and the ratio of the top two rungs, which is what a choice between them
turns on.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sagc_jax.config.sagc_constants import CONSTANTS  # noqa: E402
from sagc_jax.sagc.estimators import predicted_benefit, predicted_cost  # noqa: E402
from sagc_jax.sagc.simulate import load_sim_config, run_step, sagc_policy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--windows", default="", help="from:to,... (default: 4 equal windows)")
    ap.add_argument("--set", nargs="*", default=[], help="simulator overrides (key=value)")
    args = ap.parse_args(argv)
    sim = load_sim_config(args.config, [f"seed={args.seed}", *args.set])
    cfg = sim.sagc
    sizes = list(cfg.group_sizes)
    pol = sagc_policy(sim)
    beta_only = dataclasses.replace(CONSTANTS, pass_em_iters=0)  # the moments Beta, no EM
    rec: dict[str, list[np.ndarray]] = {k: [] for k in ("ben", "beta", "cost", "real", "sec")}
    for t in range(sim.steps):
        g = pol.choose()
        draw = sim.workload.draw(t)
        runs = [run_step(sim, draw, x) for x in sizes]
        rec["ben"].append(predicted_benefit(cfg, pol.state))
        rec["beta"].append(predicted_benefit(cfg, pol.state, beta_only))
        rec["cost"].append(predicted_cost(cfg, pol.state))
        rec["real"].append(np.array([r[2] for r in runs]))
        rec["sec"].append(np.array([r[1] for r in runs]))
        pol.observe(runs[sizes.index(g)][0])
    arr = {k: np.array(v) for k, v in rec.items()}
    if args.windows:
        wins = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    else:
        edges = np.linspace(0, sim.steps, 5).astype(int)
        wins = list(itertools.pairwise(edges))
    fmt = lambda v: " ".join(f"{x:7.2f}" for x in v)  # noqa: E731
    print(f"{args.config} seed {args.seed}; rungs {sizes}; last column: g={sizes[-1]} / "
          f"g={sizes[-2]}")
    for a, b in wins:
        m = {k: v[a:b].mean(0) for k, v in arr.items()}
        print(f"steps {a}-{b}")
        for label, key in (("realised benefit", "real"), ("predicted (shipped)", "ben"),
                           ("predicted (Beta alone)", "beta")):
            print(f"  {label:24s} {fmt(m[key])}   {m[key][-1] / m[key][-2]:.3f}")
        cost_err = 100 * (m["cost"] / m["sec"] - 1)
        print(f"  {'step s realised':24s} {fmt(m['sec'])}   predicted error % "
              + " ".join(f"{e:+.1f}" for e in cost_err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
