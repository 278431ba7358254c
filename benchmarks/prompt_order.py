"""Does the time-ordered G = 16 replay's verdict depend on the order the prompts were recorded in?

    python benchmarks/prompt_order.py --workers 2      # ~4 min on 2 cores, the suite's cache warm

`configs/sim/real/smollm2_static16_replay_time.yaml` replays the rollout-only G = 16 recording
(32 prompts, no training between them) in its recorded order, which is the task generator's
order and carries no information. The known-parameter plan is solved per 100-step window, so it
knows which of the 32 prompts each window holds. This replays the same records in shuffled
orders (seeds 1..N) through `tools/sagc_suite.py`'s own jobs, 40 seeds each, beside the
recorded order and the bootstrap replay. The figures are in benchmarks/sagc_sim.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for `tools`

from tools import sagc_suite as suite  # noqa: E402

TIME = "smollm2_static16_replay_time"
TRACE = ROOT / "configs" / "sim" / "traces" / "smollm2_static16_trace.jsonl"


def shuffled_replay(order_seed: int, folder: Path) -> Path:
    """The time-ordered replay's config on the recording's records in a shuffled order (their
    `step` renumbered); trace and config are written to ``folder``."""
    recs = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    perm = np.random.default_rng(order_seed).permutation(len(recs))
    trace = folder / f"order{order_seed}.jsonl"
    trace.write_text("".join(json.dumps({**recs[i], "step": k + 1}) + "\n"
                             for k, i in enumerate(perm)))
    src = ROOT / "configs" / "sim" / "real" / f"{TIME}.yaml"
    cfg = src.read_text().replace("../traces/smollm2_static16_trace.jsonl", trace.name)
    assert cfg != src.read_text(), "the time-ordered replay's trace path moved"
    path = folder / f"order{order_seed}.yaml"
    path.write_text(cfg)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=3, help="shuffled orders, seeds 1..N")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--pop-seeds", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    folder = ROOT / "runs" / "prompt_order"
    folder.mkdir(parents=True, exist_ok=True)
    wls = suite.workloads(f"smollm2_static16_replay,{TIME}")
    for s in range(1, a.orders + 1):
        wls[f"shuffled order {s}"] = {**wls[TIME], "path": shuffled_replay(s, folder)}
    res, _ = suite.run_suite(wls, a.seeds, {}, 0, a.pop_seeds, a.workers,
                             ROOT / "runs" / "sim_cache", progress=False)
    print("| replay | static-4 benefit/s | static-16 benefit/s | plan / best static | "
          "SAGC / best static | SAGC / causal plan | SAGC mean G | SAGC cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, w in res["workloads"].items():
        pol = w["policies"]
        s, plan = pol["sagc"], pol["plan-causal"]
        print(f"| {name} | {pol['static-4']['benefit_per_s']:.4f} | "
              f"{pol['static-16']['benefit_per_s']:.4f} | {plan['vs_best_static'][0]:.3f} | "
              f"{s['vs_best_static'][0]:.3f} | {s['vs_plan_causal'][0]:.4f} | "
              f"{s['mean_g']:.2f} | {s['cost']:.3f} |")


if __name__ == "__main__":
    main()
