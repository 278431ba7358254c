"""The `timing` part of `benchmarks/gpu_bench.py`: the measured time model and the simulator suite
rerun with it. No jax: it reads the decode part's JSON and runs on the host's CPUs.

Time model (`sagc_jax/sagc/timing.py`, the simulator's `timing:` section; the trainer's
`sagc.timing: model` uses the same terms as `sagc.time_model.*`): seconds per decode step
`decode_a + decode_b * rows`, seconds per prefill call `prefill_a + prefill_b * rows`, rows =
prompts x G. Fitted by least squares (both terms >= 0) to the decode part's points, which hold
the prompts fixed (the GPU config's 16) and vary G, as `batch_policy: prompts` does in a run.

Simulator suite: every configs/sim/*.yaml, with its own `timing:` (the default guesses) and with
the fitted decode/prefill terms (its `decode_chunk` kept), same seeds and steps; per config the
SAGC and best-static-in-budget benefit per second, SAGC's mean G and straggler rate.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.config import read_yaml
from sagc_jax.sagc import SAGCConfig
from sagc_jax.sagc.simulate import best_static_in_budget, parse_sim_config, simulate
from sagc_jax.sagc.timing import time_model_from_dict

ROOT = Path(__file__).resolve().parent.parent
SIM_DIR = ROOT / "configs" / "sim"
TERMS = ("decode_a", "decode_b", "prefill_a", "prefill_b")


def fit_linear(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x with a, b >= 0 (a negative term is set to 0 and the
    other refitted: a time model must not go below zero)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return float(max(y.mean(), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(y.mean(), 0.0)), 0.0
    if a < 0:
        return 0.0, float(max((x * y).sum() / (x * x).sum(), 0.0))
    return float(a), float(b)


def fit_time_model(decode: dict[str, Any]) -> dict[str, Any]:
    """The `timing:` block, the `sagc.time_model.*` overrides and the fit's worst relative error,
    from the decode part's result."""
    pts = decode["points"]
    if len(pts) < 2:
        raise ValueError(f"decode: {len(pts)} point(s); the fit needs >= 2")
    rows = np.array([p["rows"] for p in pts], np.float64)
    dec = np.array([p["step_ms"] / 1e3 for p in pts])
    pre = np.array([p["prefill_s"] for p in pts])
    da, db = fit_linear(rows, dec)
    pa, pb = fit_linear(rows, pre)
    timing = {"decode_a": da, "decode_b": db, "prefill_a": pa, "prefill_b": pb,
              "decode_chunk": int(decode["decode_chunk"])}
    time_model_from_dict(timing)  # the simulator accepts it (raises on a bad key or value)
    keys = {f"time_model.{k}": timing[k] for k in TERMS}
    SAGCConfig.from_dict({"time_model": {k: timing[k] for k in TERMS}})  # ... and the trainer's
    err = {"decode": float(np.max(np.abs(da + db * rows - dec) / dec)),
           "prefill": float(np.max(np.abs(pa + pb * rows - pre) / np.maximum(pre, 1e-12)))}
    inner = ", ".join(f"{k}: {timing[k]:.4g}" for k in TERMS)
    return {"timing": timing, "sagc_overrides": [f"sagc.{k}={v:.6g}" for k, v in keys.items()],
            "yaml": f"timing: {{{inner}, decode_chunk: {timing['decode_chunk']}}}",
            "fit_rows": rows.astype(int).tolist(), "fit_max_rel_err": err}


def sim_job(job: tuple[str, str, dict[str, float] | None, int | None]) -> dict[str, Any]:
    """One simulation: (config path, label, fitted terms or None = the config's own, steps)."""
    path, label, terms, steps = job
    raw = read_yaml(Path(path))
    if terms is not None:
        raw["timing"] = {**(raw.get("timing") or {}), **terms}
    if steps is not None:
        raw["steps"] = steps
    sim = parse_sim_config(raw, Path(path).parent)
    result = simulate(sim)
    pols = result["policies"]
    best = best_static_in_budget(result)
    s, o = pols["sagc"], pols["oracle"]["benefit_per_s"]
    return {"config": Path(path).stem, "timing": label, "steps": sim.steps,
            "sagc_benefit_per_s": s["benefit_per_s"], "sagc_straggler_rate": s["straggler_rate"],
            "sagc_mean_group_size": s["mean_group_size"], "sagc_meets_delta": s["meets_delta"],
            "best_static_benefit_per_s": best,
            "sagc_vs_best_static": s["benefit_per_s"] / best if best == best else None,
            "sagc_vs_oracle": s["benefit_per_s"] / o if o > 0 else None,
            "static_benefit_per_s": {k: v["benefit_per_s"] for k, v in pols.items()
                                     if k.startswith("static-")}}


def run_suite(terms: dict[str, float], steps: int | None, procs: int) -> list[dict[str, Any]]:
    """Every configs/sim/*.yaml with its own timing and with `terms`, `procs` at a time."""
    paths = sorted(str(p) for p in SIM_DIR.glob("*.yaml"))
    jobs = [(p, label, t, steps) for p in paths for label, t in (("default", None),
                                                                  ("measured", terms))]
    if procs <= 1:
        return [sim_job(j) for j in jobs]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        return pool.map(sim_job, jobs)


def part_timing(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]
                ) -> dict[str, Any]:
    """Fit (saved at once), then the suite (saved when done)."""
    src = Path(args.decode_json or Path(args.out).with_name("decode.json"))
    decode = json.loads(src.read_text())
    res: dict[str, Any] = {"device": decode.get("device"), "source": src.name,
                           **fit_time_model(decode)}
    save(res)
    steps = args.sim_steps or (20 if args.cpu_smoke else None)
    procs = args.sim_procs or min(16, os.cpu_count() or 1)
    terms = {k: res["timing"][k] for k in TERMS}
    res["sim"] = run_suite(terms, steps, procs)
    return res
