"""Issue 49 probe: shipped any_group SAGC on one workload at 2 prompts a step (seed 0): its G,
its end state's predicted benefit and seconds per rung, and each rung run alone, realised.

    python benchmarks/probes/sagc_own_world.py configs/sim/real/smollm2_run_replay.yaml
"""

import sys

import numpy as np

from sagc_jax.config import sagc_constants as sc
from sagc_jax.sagc.controller import choose
from sagc_jax.sagc.simulate import load_sim_config, run_policies, sagc_policy, summarize

SETS = ["seed=0", "sagc.delta=null", "sagc.benefit=any_group", "progress=any_group",
        "workload.prompts_per_step=2"]


def main(path: str) -> None:
    sim = load_sim_config(path, SETS)
    pol = sagc_policy(sim, consts=sc.CONSTANTS)
    g = np.asarray(run_policies(sim, {"sagc": pol})["sagc"]["group_size"])
    print("G counts", {int(k): int(v) for k, v in zip(*np.unique(g, return_counts=True))})
    ch = choose(sim.sagc, pol.state, sc.CONSTANTS)
    print("predicted benefit", np.round(ch.benefit, 3), "seconds", np.round(ch.cost, 3))
    for size in sim.sagc.group_sizes:
        one = load_sim_config(path, [*SETS, f"sagc.group_sizes=[{size}]",
                                     f"sagc.initial_group_size={size}"])
        s = summarize(one, run_policies(one, {"s": sagc_policy(one, consts=sc.CONSTANTS)}))["s"]
        print(size, "realised benefit/step", round(s["benefit_per_step"], 3),
              "step_s", round(s["step_s"], 3))


if __name__ == "__main__":
    main(sys.argv[1])
