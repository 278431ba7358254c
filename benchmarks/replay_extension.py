"""Is a replay's G = 16 rung trustworthy when its trace recorded fewer rows per group?

    python benchmarks/replay_extension.py                 # ~3 CPU-min at --seeds 40
    python benchmarks/replay_extension.py --seeds 10 --pop-seeds 20

A trace replay (`sagc_jax/sagc/workload.py`, `TraceWorkload`) plays a recorded group's own rows
and, for rungs above its recorded size n, adds rows by a rule: length = the group's median x a
residual pooled over all groups, reward ~ Bernoulli(p), p drawn from the group's empirical-Bayes
posterior (the trace's own pass-rate distribution as the prior; until 2026-12-03 the plug-in
k / n). The
probe and run replays (`configs/sim/real/`) record 4-8 rows a group, so their G = 16 rung is
built by that rule. The one recording with 16 real rows a group
(`configs/sim/traces/smollm2_static16_trace.jsonl`) checks it two ways:

1. **The rule against real rows.** Keep n of each group's 16 rows (a random subset, 200 times),
   extend back to 16 by the rule, and compare the informative fraction (pass counts not all
   equal) and the tail share with the real 16 rows. Beside the rule: the plug-in k / n and the
   pass rate drawn from Beta(k + 0.5, n - k + 0.5) (Jeffreys).
2. **The suite's verdict with and without the rule.** The same recording cut to its first 8 rows
   a group (a temporary trace under runs/, replayed exactly like the probe replay), against the
   full recording (`smollm2_static16_replay`): SAGC against the known-parameter causal plan and
   the best in-budget static G, 40 seeds, `tools/sagc_suite.py`'s own jobs and cache.

The figures are in benchmarks/sagc_sim.md ("Replays above the recorded group size").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for `tools`

from sagc_jax.sagc.events import tail_share  # noqa: E402
from sagc_jax.sagc.workload import PASS_GRID, pass_rate_posteriors  # noqa: E402
from tools import sagc_suite as suite  # noqa: E402

TRACE = ROOT / "configs" / "sim" / "traces" / "smollm2_static16_trace.jsonl"
FULL = ROOT / "configs" / "sim" / "real" / "smollm2_static16_replay.yaml"
PASS = 0.5  # the suite's pass threshold (sagc_constants.PASS_THRESHOLD)


def _records() -> list[dict]:
    return [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]


def _informative(passes: np.ndarray) -> np.ndarray:
    return passes.any(-1) & ~passes.all(-1)


def rule_check(reps: int = 200, seed: int = 0) -> list[str]:
    """Part 1: the extension rule from n of 16 real rows back to 16, against the real rows."""
    groups = [g for r in _records() for g in r["groups"]]
    cap = max(r["max_new_tokens"] for r in _records())
    passes = np.array([np.asarray(g["rewards"]) > PASS for g in groups])
    lengths = np.array([g["lengths"] for g in groups], np.float64)
    trunc = np.array([g["truncated"] for g in groups], bool)
    rng = np.random.default_rng(seed)
    out = ["| rows kept n | informative at 16: real | plug-in k/n | Jeffreys | empirical Bayes "
           "(the rule) | informative at n (real) | tail share at 16: real | rule | group median at "
           "16: real | rule |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in (4, 8):
        acc: dict[str, list[float]] = {k: [] for k in ("plug", "jeff", "eb", "at_n", "tail",
                                                       "median")}
        for _ in range(reps):
            perm = np.argsort(rng.random(passes.shape), axis=1)
            p_n = np.take_along_axis(passes, perm, 1)[:, :n]
            l_n = np.take_along_axis(lengths, perm, 1)[:, :n]
            t_n = np.take_along_axis(trunc, perm, 1)[:, :n]
            k = p_n.sum(1)
            acc["at_n"].append(_informative(p_n).mean())
            cdf = pass_rate_posteriors(k, np.full(len(k), n))
            eb = PASS_GRID[np.minimum((cdf < rng.random((len(k), 1))).sum(1), len(PASS_GRID) - 1)]
            for name, p in (("plug", k / n), ("jeff", rng.beta(k + 0.5, n - k + 0.5)),
                            ("eb", eb)):
                extra = rng.random((len(p_n), 16 - n)) < p[:, None]
                acc[name].append(_informative(np.concatenate([p_n, extra], 1)).mean())
            # Lengths as TraceWorkload extends them: median x pooled residual, pooled truncation.
            med = np.maximum(np.median(l_n, 1), 1.0)
            eps, tr_pool = (l_n / med[:, None]).ravel(), t_n.ravel()
            idx = rng.integers(0, len(eps), (len(l_n), 16 - n))
            ln = med[:, None] * eps[idx]
            tr = tr_pool[idx] | (ln >= cap)
            ext = np.where(tr, cap, np.maximum(np.ceil(ln), 1.0))
            acc["tail"].append(tail_share(np.concatenate([l_n, ext], 1)).mean())
            acc["median"].append(np.median(np.concatenate([l_n, ext], 1), 1).mean())
        m = {k: float(np.mean(v)) for k, v in acc.items()}
        out.append(f"| {n} | {_informative(passes).mean():.3f} | {m['plug']:.3f} | "
                   f"{m['jeff']:.3f} | {m['eb']:.3f} | {m['at_n']:.3f} | "
                   f"{tail_share(lengths).mean():.3f} | "
                   f"{m['tail']:.3f} | {np.median(lengths, 1).mean():.1f} | {m['median']:.1f} |")
    return out


def cut_replay(rows: int = 8, folder: Path = ROOT / "runs" / "replay_extension") -> Path:
    """Part 2's workload: the recording cut to its first ``rows`` rows a group, replayed as the
    full one is (same steps, prompts, timing, rungs); its trace and config go to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / f"static16_first{rows}.jsonl"
    recs = _records()
    for r in recs:
        r["group_size"] = rows
        r["groups"] = [{k: v[:rows] for k, v in g.items()} for g in r["groups"]]
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = FULL.read_text().replace("../traces/smollm2_static16_trace.jsonl", trace.name)
    assert cfg != FULL.read_text(), "the full replay's trace path moved"
    path = folder / f"static16_first{rows}_replay.yaml"
    path.write_text(cfg)
    return path


def verdicts(seeds: int, pop_seeds: int, workers: int) -> list[str]:
    """Part 2: SAGC against the plan and the best static, full recording vs cut to 8 rows."""
    wls = suite.workloads("smollm2_static16_replay")
    cut = cut_replay(8)
    wls["static16_first8"] = {**wls["smollm2_static16_replay"], "path": cut}
    res, _ = suite.run_suite(wls, seeds, {}, 0, pop_seeds, workers,
                             ROOT / "runs" / "sim_cache", progress=False)
    out = ["| replay | rung 16 built from | static-8 benefit/s (cost) | static-16 benefit/s "
           "(cost) | best static | SAGC mean G | SAGC / causal plan | SAGC / best static |",
           "|---|---|---:|---:|---|---:|---:|---:|"]
    for name, src in (("smollm2_static16_replay", "16 recorded rows"),
                      ("static16_first8", "8 recorded rows + the rule (empirical Bayes)")):
        w = res["workloads"][name]["policies"]
        s8, s16, s = w["static-8"], w["static-16"], w["sagc"]
        out.append(f"| {name} | {src} | {s8['benefit_per_s']:.4f} ({s8['cost']:.3f}) | "
                   f"{s16['benefit_per_s']:.4f} ({s16['cost']:.3f}) | "
                   f"{res['workloads'][name]['best_static']} | {s['mean_g']:.2f} | "
                   f"{s['vs_plan_causal'][0]:.3f} | {s['vs_best_static'][0]:.3f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--pop-seeds", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    print("\n".join(rule_check()), flush=True)
    print()
    print("\n".join(verdicts(a.seeds, a.pop_seeds, a.workers)), flush=True)


if __name__ == "__main__":
    main()
