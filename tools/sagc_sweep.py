"""Every shipped simulator workload x seeds: SAGC against the best static g and the oracle.

    python -m tools.sagc_sweep                       # configs/sim/*.yaml, seeds 0-4
    python -m tools.sagc_sweep --seeds 0,1 --only drift,length_growth
    python -m tools.sagc_sweep --sagc half_life=50   # a controller variant (SAGC only)

The static policies and the oracle do not depend on the controller's settings, so they are
computed once per (workload file, seed) and cached under ``--cache`` (keyed by the file's
contents); ``--sagc`` overrides then rerun SAGC alone. Prints the summary table of
benchmarks/sagc_sim.md and the per-run figures; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from sagc_jax.sagc.simulate import (
    load_sim_config,
    make_policies,
    oracle_summary,
    run_policies,
    sagc_policy,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]

CACHE_VERSION = 2  # bump when the static policies, oracle or causal ceiling change
STATIONARY = {"heavy_tail", "bimodal", "trace_replay"}


def workload_key(path: Path) -> bytes:
    """What a workload's cached results depend on: its parsed YAML (comments and layout do
    not count, so a reworded comment keeps the cache) and the bytes of the trace it replays."""
    raw = yaml.safe_load(path.read_text())
    key = json.dumps(raw, sort_keys=True, default=str).encode()
    trace = (raw.get("workload") or {}).get("trace") if isinstance(raw, dict) else None
    if trace:
        t = Path(str(trace))
        if not t.is_absolute() and not t.exists():  # as the simulator resolves it
            t = path.parent / t
        if t.is_file():
            key += hashlib.sha256(t.read_bytes()).digest()
    return key


def _static_part(path: Path, seed: int, sets: list[str], cache: Path,
                 cached_only: bool = False) -> tuple[dict, dict] | None:
    """(static summaries + oracle, static trajectories) for one workload and seed, cached;
    with `cached_only`, None when the cache does not hold it (nothing is computed)."""
    salt = repr((seed, sets, CACHE_VERSION)).encode()
    key = hashlib.sha256(workload_key(path) + salt).hexdigest()[:16]
    f = cache / f"{path.stem}-{seed}-{key}.pkl"
    if f.exists():
        return pickle.loads(f.read_bytes())
    if cached_only:
        return None
    sim = load_sim_config(path, [f"seed={seed}", *sets])
    pols = {k: v for k, v in make_policies(sim).items() if k != "sagc"}
    traj = run_policies(sim, pols)
    summ = summarize(sim, traj)
    summ["causal"] = oracle_summary(sim, traj, causal=True)
    summ["oracle"] = oracle_summary(sim, traj)
    cache.mkdir(parents=True, exist_ok=True)
    f.write_bytes(pickle.dumps((summ, traj)))
    return summ, traj


def run_one(args: tuple[str, int, list[str], list[str], str]) -> dict:
    """One (workload, seed): SAGC with the overrides, against the cached statics and oracle."""
    path_s, seed, sets, overrides, cache_s = args
    path = Path(path_s)
    summ, _ = _static_part(path, seed, sets, Path(cache_s))
    sim = load_sim_config(path, [f"seed={seed}", *sets, *[f"sagc.{o}" for o in overrides]])
    t0 = time.perf_counter()
    sagc_traj = run_policies(sim, {"sagc": sagc_policy(sim)})
    sec = time.perf_counter() - t0
    s = summarize(sim, sagc_traj)["sagc"]
    delta, tol = sim.sagc.delta, sim.tolerance
    statics = {k: v for k, v in summ.items() if k.startswith("static-")}
    in_budget = [v["benefit_per_s"] for v in statics.values() if v["meets_delta"]]
    best = max(in_budget) if in_budget else float("nan")
    orc, cau = summ["oracle"], summ["causal"]
    return {
        "workload": path.stem,
        "seed": seed,
        "sagc_rate": s["straggler_rate"],
        "sagc_meets": s["straggler_rate"] <= delta + tol,
        "vs_static": s["benefit_per_s"] / best,
        "vs_oracle": s["benefit_per_s"] / orc["benefit_per_s"],
        "oracle_vs_static": orc["benefit_per_s"] / best,
        "vs_causal": s["benefit_per_s"] / cau["benefit_per_s"],
        "causal_vs_static": cau["benefit_per_s"] / best,
        "sagc_g": s["mean_group_size"],
        "oracle_g": orc["mean_group_size"],
        "oracle_rate": orc["straggler_rate"],
        "sagc_phases": s.get("phases"),
        "sagc_s": sec,
        "g_traj": sagc_traj["sagc"]["group_size"].astype(int).tolist(),
    }


def _rng(xs: list[float]) -> str:
    xs = [x for x in xs if np.isfinite(x)]
    return f"{min(xs):.3f} – {max(xs):.3f}" if xs else "n/a"


def table(rows: list[dict]) -> str:
    """Summary over seeds, one line per workload (the table of benchmarks/sagc_sim.md)."""
    out = [
        "| workload | kind | seeds | SAGC straggler rate (max) | SAGC / best static in budget "
        "(min – max) | causal / best static | oracle / best static | SAGC / causal | SAGC / oracle "
        "| SAGC / causal (mean) | SAGC mean g | oracle mean g |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == wl]
        seeds = sorted(r["seed"] for r in rs)
        kind = "stationary" if wl in STATIONARY else "non-stationary"
        out.append(
            f"| {wl} | {kind} | {seeds[0]}–{seeds[-1]} | {max(r['sagc_rate'] for r in rs):.3f} | "
            f"{_rng([r['vs_static'] for r in rs])} | {_rng([r['causal_vs_static'] for r in rs])} | "
            f"{_rng([r['oracle_vs_static'] for r in rs])} | {_rng([r['vs_causal'] for r in rs])} | "
            f"{_rng([r['vs_oracle'] for r in rs])} | {np.mean([r['vs_causal'] for r in rs]):.3f} | "
            f"{np.mean([r['sagc_g'] for r in rs]):.2f} | "
            f"{np.mean([r['oracle_g'] for r in rs]):.2f} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=str(ROOT / "configs" / "sim"))
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--sagc", nargs="*", default=[], help="SAGC-only <key>=<value> overrides")
    ap.add_argument(
        "--set", nargs="*", default=[], help="overrides for every policy, e.g. sagc.tau=3"
    )
    ap.add_argument("--cache", default=str(ROOT / "runs" / "sim_cache"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write per-run figures here")
    args = ap.parse_args()
    paths = sorted(Path(args.configs).glob("*.yaml"))
    if args.only:
        want = set(args.only.split(","))
        paths = [p for p in paths if p.stem in want]
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(str(p), s, args.set, args.sagc, args.cache) for p in paths for s in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as ex:
        rows = list(ex.map(run_one, jobs))
    load = os.getloadavg()[0]
    for r in rows:
        print(
            f"{r['workload']:>14} seed {r['seed']}: rate {r['sagc_rate']:.3f} "
            f"vs static {r['vs_static']:.3f} causal {r['vs_causal']:.3f} "
            f"oracle {r['vs_oracle']:.3f} "
            f"(causal/static {r['causal_vs_static']:.3f}, oracle/static "
            f"{r['oracle_vs_static']:.3f}) g {r['sagc_g']:.2f} / {r['oracle_g']:.2f}"
        )
    print(table(rows))
    print(f"({len(rows)} runs in {time.perf_counter() - t0:.0f} s, load average {load:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
