"""Issue 49 probe: is a replay one world across G? P(informative) of 4-row subsets of the
world's 16-row groups against its own 4-row groups, seeds 0-2, 2 prompts a step.

    python benchmarks/probes/sagc_replay_consistency.py configs/sim/real/smollm2_run_replay.yaml
"""

import sys
from math import comb

import numpy as np

from sagc_jax.sagc.simulate import load_sim_config, run_step

SETS = ["sagc.delta=null", "progress=any_group", "workload.prompts_per_step=2"]


def main(path: str) -> None:
    for seed in range(3):
        sim = load_sim_config(path, [f"seed={seed}", *SETS])
        sub, real4 = [], []
        for t in range(sim.steps):
            draw = sim.workload.draw(t)
            r16 = np.asarray(run_step(sim, draw, 16)[0].rewards).reshape(-1, 16) > 0.5
            r4 = np.asarray(run_step(sim, draw, 4)[0].rewards).reshape(-1, 4) > 0.5
            for k in r16.sum(-1):
                sub.append(1 - (comb(int(k), 4) + comb(16 - int(k), 4)) / comb(16, 4))
            real4 += [float(0 < k < 4) for k in r4.sum(-1)]
        print(seed, "4-subsets of 16-groups", round(np.mean(sub), 3),
              "own 4-groups", round(np.mean(real4), 3))


if __name__ == "__main__":
    main(sys.argv[1])
