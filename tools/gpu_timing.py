"""The `timing` part of `tools/gpu_bench.py`: the measured time model and the simulator suite
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


def _fit_terms(pts: list[dict[str, Any]]) -> tuple[float, float, float, float]:
    """(decode_a, decode_b, prefill_a, prefill_b) fitted to decode points."""
    rows = np.array([p["rows"] for p in pts], np.float64)
    da, db = fit_linear(rows, np.array([p["step_ms"] / 1e3 for p in pts]))
    pa, pb = fit_linear(rows, np.array([p["prefill_s"] for p in pts]))
    return da, db, pa, pb


def _rel_err(terms: tuple[float, float, float, float], pts: list[dict[str, Any]]
             ) -> dict[str, float]:
    """Worst relative error of the model's decode-step and prefill seconds over `pts`."""
    da, db, pa, pb = terms
    rows = np.array([p["rows"] for p in pts], np.float64)
    dec = np.array([p["step_ms"] / 1e3 for p in pts])
    pre = np.maximum(np.array([p["prefill_s"] for p in pts]), 1e-12)
    return {"decode": float(np.max(np.abs(da + db * rows - dec) / dec)),
            "prefill": float(np.max(np.abs(pa + pb * rows - pre) / pre))}


def fit_time_model(decode: dict[str, Any]) -> dict[str, Any]:
    """The `timing:` block, the `sagc.time_model.*` overrides and the fit's errors, from the
    decode part's result. Points marked `held_out` are not fitted: the error on them
    (`held_out_max_rel_err`) is the model's test; `loo_max_rel_err` is the worst error on each
    fitted point when the line is fitted to the others (needs >= 3 of them)."""
    pts = [p for p in decode["points"] if not p.get("held_out")]
    test = [p for p in decode["points"] if p.get("held_out")]
    if len(pts) < 2:
        raise ValueError(f"decode: {len(pts)} fitted point(s); the fit needs >= 2")
    da, db, pa, pb = terms = _fit_terms(pts)
    timing = {"decode_a": da, "decode_b": db, "prefill_a": pa, "prefill_b": pb,
              "decode_chunk": int(decode["decode_chunk"])}
    time_model_from_dict(timing)  # the simulator accepts it (raises on a bad key or value)
    keys = {f"time_model.{k}": timing[k] for k in TERMS}
    SAGCConfig.from_dict({"time_model": {k: timing[k] for k in TERMS}})  # ... and the trainer's
    loo: dict[str, float] | None = None
    if len(pts) >= 3:
        errs = [_rel_err(_fit_terms(pts[:i] + pts[i + 1:]), [p]) for i, p in enumerate(pts)]
        loo = {k: max(e[k] for e in errs) for k in ("decode", "prefill")}
    inner = ", ".join(f"{k}: {timing[k]:.4g}" for k in TERMS)
    return {"timing": timing, "sagc_overrides": [f"sagc.{k}={v:.6g}" for k, v in keys.items()],
            "yaml": f"timing: {{{inner}, decode_chunk: {timing['decode_chunk']}}}",
            "fit_rows": [int(p["rows"]) for p in pts], "fit_max_rel_err": _rel_err(terms, pts),
            "held_out_rows": [int(p["rows"]) for p in test],
            "held_out_max_rel_err": _rel_err(terms, test) if test else None,
            "loo_max_rel_err": loo}


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
