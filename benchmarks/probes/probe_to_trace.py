"""Convert SmolLM2 task-probe rows (benchmarks/probes/smollm2_task_probe.py JSONL, one row per
line) into the simulator's trace format (configs/sim/traces/, workload.load_trace_groups).

One trace record per (probe file, candidate), in generation order; one group per problem
(its rows in row order). Rewards: the lenient reward (what the trainer's reasoning_gym reward
gives). Usage: python benchmarks/probes/probe_to_trace.py OUT.jsonl PROBE.jsonl [PROBE.jsonl ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def convert(paths: list[str], max_new_tokens: int = 256) -> list[dict]:
    """Probe row files -> trace records {"step", "group_size", "max_new_tokens", "groups"}."""
    recs: list[dict] = []
    for path in paths:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows.sort(key=lambda r: r["order"])
        by_cand: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            by_cand[r["candidate"]][r["prompt"]].append(r)
        for cand, probs in by_cand.items():
            groups = []
            for _, rs in sorted(probs.items()):
                rs.sort(key=lambda r: r["row"])
                groups.append(
                    {
                        "lengths": [int(r["length"]) for r in rs],
                        "truncated": [bool(r["truncated"]) for r in rs],
                        "rewards": [float(r["reward"]) for r in rs],
                    }
                )
            recs.append(
                {
                    "step": len(recs) + 1,
                    "group_size": len(groups[0]["lengths"]),
                    "max_new_tokens": max_new_tokens,
                    "source": f"{path.split('/')[-1]}:{cand}",
                    "groups": groups,
                }
            )
    return recs


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        for rec in convert(sys.argv[2:]):
            f.write(json.dumps(rec) + "\n")
