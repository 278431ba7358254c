"""Table of `benchmarks/step_time_layout.sh`'s runs (issue 52: the main job's step time before
and after the one-train-batch refactor, run alternately).

Per pair: over steps 2 .. k (k = the last step where both runs chose the same G, so both
trained on the same rows; step 1 is left out), the median per-step ratio new / old of the update
(`train_s`), of the rollout (`rollout_s`, code the refactor did not change: it shows how fast the
machine ran each run) and of their quotient (the update's ratio with the machine's drift divided
out); then which non-timing metrics differ and from which step.

    python benchmarks/step_time_layout.py [benchmarks/results/step_time_layout]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

TIMING = {"step_s", "train_s", "rollout_s", "eval_s", "load_1m", "decode_s", "prefill_s",
          "reward_s"}


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def ratio(old: list[dict], new: list[dict], key: str) -> float:
    return statistics.median(b[key] / a[key] for a, b in zip(old, new))


def first_difference(old: list[dict], new: list[dict]) -> str:
    for a, b in zip(old, new):
        diff = sorted(k for k in set(a) | set(b) if k not in TIMING and a.get(k) != b.get(k))
        if diff:
            return f"step {a['step']}: {', '.join(diff)}"
    return "none"


def main(root: Path) -> None:
    pairs = sorted({int(p.name.split("-")[1]) for p in root.glob("old-*")})
    print("| pair | commits old / new | load at start old / new | same G through step | "
          "train_s new/old | rollout_s new/old | train ÷ rollout | first non-timing difference |")
    print("|---|---|---|---|---|---|---|---|")
    quotients = []
    for i in pairs:
        d = {k: root / f"{k}-{i}" for k in ("old", "new")}
        old, new = rows(d["old"]), rows(d["new"])
        k = next((j for j, (a, b) in enumerate(zip(old, new))
                  if a["group_size"] != b["group_size"]), len(old))
        o, n = old[1:k], new[1:k]
        t, r = ratio(o, n, "train_s"), ratio(o, n, "rollout_s")
        q = statistics.median((b["train_s"] / a["train_s"]) / (b["rollout_s"] / a["rollout_s"])
                              for a, b in zip(o, n))
        quotients.append(q)
        commits = " / ".join((d[x] / "commit.txt").read_text().strip() for x in d)
        loads = " / ".join((d[x] / "load.txt").read_text().split()[0] for x in d)
        print(f"| {i} | {commits} | {loads} | {k} | {t:.3f} | {r:.3f} | {q:.3f} | "
              f"{first_difference(old, new)} |")
    print(f"\nmedian over {len(pairs)} pairs of the update's ratio with the machine's drift "
          f"divided out: {statistics.median(quotients):.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/step_time_layout"))
