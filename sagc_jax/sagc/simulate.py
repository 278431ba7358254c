"""Offline SAGC simulator: every static g in ``sagc.group_sizes`` vs SAGC on the same workload,
beside the causal (no-foresight) ceiling and the hindsight oracle (``oracle.py``).

``sagc-jax simulate --config FILE [key=value ...] [--out result.json] [--plot out.png]`` (the
command line and report: ``simulate_cli.py``). Config schema (all keys optional, defaults in
``DEFAULT_SIM``): ``steps, seed, tolerance, plot_window, workload: {...}, timing: {...}, sagc:
{...}``; see docs/sagc.md. Policies see identical workload randomness (``workload.py``).

Per step and policy: rollout seconds = prefill(rows) + decode_steps x t_decode(rows), with
decode_steps the batch's longest row rounded up to ``timing.decode_chunk``; realised benefit = Σ
over groups [rewards not all equal] x (1 - 1/g) (``progress: any_group``: 1 if any group's rewards
are mixed, else 0; ``diminishing``: n / (n + 1) of n mixed groups); straggler rate = the mean
straggler cost of the step's groups under ``sagc.straggler`` (the controller's definition). The
controller's horizon is ``steps`` and the seed of its draws ``seed`` (passed to it, as the trainer
passes run.steps)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.config import apply_overrides, read_yaml
from sagc_jax.config.errors import ConfigError
from sagc_jax.config.sagc import SAGCConfig
from sagc_jax.config.sagc_constants import SAGCConstants
from sagc_jax.sagc.estimators import step_worth
from sagc_jax.sagc.events import Observation
from sagc_jax.sagc.oracle import oracle_from_trajectories, phase_bounds
from sagc_jax.sagc.policy import SAGCPolicy, StaticPolicy
from sagc_jax.sagc.timing import TimeModel, time_model_from_dict
from sagc_jax.sagc.workload import (
    StepDraw,
    SyntheticWorkload,
    TraceWorkload,
    WorkloadParams,
    params_from_dict,
)
from sagc_jax.shapes import prompts_for

DEFAULT_SIM: dict[str, Any] = {
    "steps": 1500,
    "seed": 0,
    "tolerance": 0.01,  # meets_delta: straggler_rate <= sagc.delta + tolerance
    "plot_window": 50,  # rolling window (steps) of the straggler-rate plot
    "oracle_window": 100,  # steps per oracle phase inside a ramp (piecewise phases are whole)
    # What a step is worth in the simulated world (the judged benefit, not the controller's
    # model): groups = informative groups x (1 - 1/g); any_group = 1 if any group is.
    "progress": "groups",
    "workload": {
        "prompts_per_step": 16,
        "max_new_tokens": 512,
        "median_length": 120,
        "prompt_spread": 0.3,
        "group_spread": 0.4,
        "loop_prob": 0.02,
        "pass_rate": {"a": 1.0, "b": 1.0},
        "hard_frac": 0.0,
        "hard_median_length": 480,
        "hard_loop_prob": 0.01,
        "hard_pass_rate": {"a": 0.3, "b": 3.0},
        "drift": [],
    },
    "timing": {},
    "sagc": {},
}


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Validated simulator config."""

    steps: int
    seed: int
    tolerance: float
    plot_window: int
    prompts_per_step: int
    workload: SyntheticWorkload | TraceWorkload
    timing: TimeModel
    sagc: SAGCConfig
    drift_steps: tuple[int, ...]
    ramps: tuple[tuple[int, int], ...] = ()  # [start, end) of linear drift ramps
    oracle_window: int = 100
    # A device's timings are not a line: per-step log-normal noise (sigma of the log) on every
    # prefill and decode second, and a linear drift of the log over the run (e.g. 0.3: the
    # last step 35 % slower, thermal throttling); both 0 = the noiseless model. Shared by all
    # policies at a step (common random numbers).
    time_noise: float = 0.0
    time_drift: float = 0.0
    # Host seconds per environment call (episode traces): the rollout calls env.step once per
    # played model turn and row, one after another, so a step's environment seconds grow with
    # rows x turns. Not device time: neither noise nor drift scales it.
    env_call_s: float = 0.0
    progress: str = "groups"  # the judged per-step benefit law (DEFAULT_SIM["progress"])


# --------------------------------------------------------------------------------------------
# Config parsing
# --------------------------------------------------------------------------------------------


def _int(v: Any, name: str, lo: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name}: an integer >= {lo}, got {v!r}")
    return v


_TRACE_KEYS = ("trace", "trace_order", "trace_window")


def parse_sim_config(raw: dict[str, Any], base_dir: Path | None = None) -> SimConfig:
    """Validate a raw simulate config mapping; errors are ``ValueError("<key>: ..., got ..")``."""
    if not isinstance(raw, dict):
        raise ValueError(f"config: a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in DEFAULT_SIM:
            raise ValueError(f"{key}: unknown key (allowed: {', '.join(DEFAULT_SIM)})")
    steps = _int(raw.get("steps", DEFAULT_SIM["steps"]), "steps", 1)
    seed = _int(raw.get("seed", DEFAULT_SIM["seed"]), "seed", 0)
    tol = raw.get("tolerance", DEFAULT_SIM["tolerance"])
    if not isinstance(tol, int | float) or isinstance(tol, bool) or not 0 <= tol < 1:
        raise ValueError(f"tolerance: a number in [0, 1), got {tol!r}")
    window = _int(raw.get("plot_window", DEFAULT_SIM["plot_window"]), "plot_window", 1)
    owin = _int(raw.get("oracle_window", DEFAULT_SIM["oracle_window"]), "oracle_window", 1)
    progress = raw.get("progress", DEFAULT_SIM["progress"])
    laws = typing.get_args(SAGCConfig.model_fields["benefit"].annotation)  # sagc.benefit's
    if progress not in laws:
        raise ValueError(f"progress: one of {', '.join(laws)}, got {progress!r}")
    sagc_raw = raw.get("sagc") or {}
    if not isinstance(sagc_raw, dict):
        raise ValueError(f"sagc: a mapping, got {sagc_raw!r}")
    sagc = SAGCConfig.from_dict(sagc_raw)

    wl = raw.get("workload") or {}
    if not isinstance(wl, dict):
        raise ValueError(f"workload: a mapping, got {wl!r}")
    wl_defaults = DEFAULT_SIM["workload"]
    for key in wl:
        if key not in wl_defaults and key not in _TRACE_KEYS:
            raise ValueError(
                f"workload.{key}: unknown key (allowed: {', '.join(wl_defaults)}, "
                f"{', '.join(_TRACE_KEYS)})"
            )
    pps = _int(
        wl.get("prompts_per_step", wl_defaults["prompts_per_step"]), "workload.prompts_per_step", 1
    )
    gmax = max(sagc.group_sizes)
    pmax = max(prompts_for(sagc, g, pps) for g in sagc.group_sizes)
    drift_steps: list[int] = []
    ramps: list[tuple[int, int]] = []
    if wl.get("trace") is not None:
        path = Path(str(wl["trace"]))
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        if not path.exists():
            raise ValueError(f"workload.trace: file not found, got {str(wl['trace'])!r}")
        order = wl.get("trace_order", "random")
        if order not in ("random", "time"):
            raise ValueError(f"workload.trace_order: 'random' or 'time', got {order!r}")
        twin = _int(wl.get("trace_window", 1), "workload.trace_window", 0)
        timed = steps if order == "time" else None
        workload: SyntheticWorkload | TraceWorkload = TraceWorkload(
            path, pmax, gmax, seed, timed, twin
        )
        if timed:  # a drifting replay: the oracle's phases are oracle_window-step windows
            ramps.append((0, steps))
    else:
        for key in _TRACE_KEYS[1:]:
            if key in wl:
                raise ValueError(f"workload.{key}: only with workload.trace, got {wl[key]!r}")
        scalars = {k: v for k, v in wl.items() if k not in ("prompts_per_step", "drift")}
        base = params_from_dict(scalars, WorkloadParams(), "workload")
        drift_raw = wl.get("drift") or []
        if not isinstance(drift_raw, list):
            raise ValueError(
                f"workload.drift: a list of {{at_step: int, <key>: value}}, got {drift_raw!r}"
            )
        drift: list[tuple[int, WorkloadParams]] = []
        cur, prev_at = base, 0
        for i, d in enumerate(
            sorted(drift_raw, key=lambda d: d.get("at_step", 0) if isinstance(d, dict) else 0)
        ):
            where = f"workload.drift[{i}]"
            if not isinstance(d, dict) or "at_step" not in d:
                raise ValueError(f"{where}: a mapping with at_step, got {d!r}")
            at = _int(d["at_step"], f"{where}.at_step", 0)
            ramp = d.get("ramp", False)
            if not isinstance(ramp, bool):
                raise ValueError(f"{where}.ramp: true or false, got {ramp!r}")
            keys = {k: v for k, v in d.items() if k not in ("at_step", "ramp")}
            cur = params_from_dict(keys, cur, where)
            drift.append((at, cur))
            if ramp:
                ramps.append((prev_at, at))
            else:
                drift_steps.append(at)
            prev_at = at
        ramp_ends = frozenset(b for _, b in ramps)
        workload = SyntheticWorkload(base, drift, pmax, gmax, seed, ramp_ends)
    timing_raw = dict(raw.get("timing") or {})
    # The simulator's own timing keys (not the time model's): noise, drift, environment seconds.
    extra = {k: timing_raw.pop(k, 0.0) for k in ("noise", "drift", "env_call_s")}
    for k, v in extra.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or (
                k != "drift" and v < 0):
            raise ValueError(f"timing.{k}: a number{' >= 0' if k != 'drift' else ''}, got {v!r}")
    if extra["env_call_s"] and not (isinstance(workload, TraceWorkload) and workload.turn_max):
        raise ValueError("timing.env_call_s: only an episode trace (workload.trace whose rows "
                         "record `turns`) calls an environment")
    timing = time_model_from_dict(timing_raw, base_dir)
    return SimConfig(
        steps,
        seed,
        float(tol),
        window,
        pps,
        workload,
        timing,
        sagc,
        tuple(drift_steps),
        tuple(ramps),
        owin,
        float(extra["noise"]),
        float(extra["drift"]),
        float(extra["env_call_s"]),
        progress,
    )


def load_sim_config(path: str | Path, overrides: list[str] | None = None) -> SimConfig:
    """Read YAML, apply overrides, validate."""
    path = Path(path)
    try:
        raw = read_yaml(path)
    except ConfigError as e:
        raise ConfigError(f"--config: {e}") from None
    return parse_sim_config(apply_overrides(raw, overrides or []), path.parent)


# --------------------------------------------------------------------------------------------
# Running policies
# --------------------------------------------------------------------------------------------


_SALT_TIME = 0x71E5


def time_factor(sim: SimConfig, step: int) -> float:
    """Multiplier of step `step`'s seconds: exp(noise z + drift step / steps), z ~ N(0, 1)
    from (seed, step); 1.0 without noise and drift."""
    if not sim.time_noise and not sim.time_drift:
        return 1.0
    z = np.random.default_rng((sim.seed, step, _SALT_TIME)).standard_normal()
    return float(np.exp(sim.time_noise * z + sim.time_drift * step / max(sim.steps, 1)))


def run_step(sim: SimConfig, draw: StepDraw, g: int, factor: float = 1.0
             ) -> tuple[Observation, float, float]:
    """Slice the step's block for group size g; returns (observation, step seconds, benefit).
    `factor` scales the step's seconds (`time_factor`)."""
    b = prompts_for(sim.sagc, g, sim.prompts_per_step)
    lengths = draw.lengths[:b, :g]
    truncated = draw.truncated[:b, :g]
    rewards = draw.rewards[:b, :g]
    rows = b * g
    tm = sim.timing
    steps = (tm.episode_decode_steps(draw.turns[:b, :g]) if draw.turns is not None
             else tm.decode_steps(int(lengths.max()), draw.max_new_tokens))
    pre, dec = factor * tm.prefill_s(rows), factor * steps * tm.decode_step_s(rows)
    env = 0.0
    if draw.turns is not None and sim.env_call_s:
        # env.step gets every played turn's text but that of a row cut at the token cap (the
        # rare cut by an over-long reply is counted as no call: a slight under-count).
        calls = int((draw.turns[:b, :g] > 0).sum()) - int(truncated.sum())
        env = sim.env_call_s * max(calls, 0)
    benefit = step_worth(int((rewards.max(-1) != rewards.min(-1)).sum()), g, sim.progress)
    obs = Observation(
        group_size=g,
        lengths=lengths.reshape(-1),
        truncated=truncated.reshape(-1),
        rewards=rewards.reshape(-1),
        max_new_tokens=draw.max_new_tokens,
        prefill_s=pre,
        decode_s=dec,
        decode_steps=steps,
        rows=rows,
        prompts=b,
        decode_chunk=tm.decode_chunk,
        # as the trainer's observation_from: the `model` clock prices the accelerator only
        env_s=env if sim.sagc.timing == "measured" else 0.0,
    )
    return obs, pre + dec + env, benefit


def sagc_policy(sim: SimConfig, sagc: SAGCConfig | None = None,
                consts: SAGCConstants | None = None) -> SAGCPolicy:
    """SAGC on this simulation: the run's length is its horizon (as the trainer's run.steps) and
    the simulator's seed seeds its draws; the step's shape (prompts, the first step's
    max_new_tokens) is known before it, as the trainer's. ``sagc``: another section (default
    ``sim.sagc``); ``consts``: the controller's constants (default: the shipped ones)."""
    cfg = (sim.sagc if sagc is None else sagc).model_copy(update={"enabled": True})
    wl = sim.workload
    cap = wl.max_new_tokens if isinstance(wl, TraceWorkload) else wl.params_at(0).max_new_tokens
    return SAGCPolicy(cfg, horizon=sim.steps, seed=sim.seed, prompts=sim.prompts_per_step,
                      max_new_tokens=cap, consts=consts)


def make_policies(sim: SimConfig) -> dict[str, SAGCPolicy | StaticPolicy]:
    """static-g for every candidate g, then "sagc" (:func:`sagc_policy`)."""
    sagc = sim.sagc
    pols: dict[str, SAGCPolicy | StaticPolicy] = {}
    for g in sagc.group_sizes:
        pols[f"static-{g}"] = StaticPolicy(
            sagc.model_copy(update={"enabled": False, "initial_group_size": g}),
            horizon=sim.steps, seed=sim.seed,
        )
    pols["sagc"] = sagc_policy(sim)
    return pols


def run_policies(
    sim: SimConfig, policies: dict[str, Any], steps: int | None = None, start: int = 0
) -> dict[str, dict[str, np.ndarray]]:
    """Run policies step-synchronously on common random numbers.

    Returns per policy: group_size int [T], straggler_rate float [T], step_s [T], benefit [T],
    and for SAGC-like policies reason (str [T]).
    """
    steps = sim.steps if steps is None else steps
    traj: dict[str, dict[str, list[Any]]] = {
        n: {"group_size": [], "straggler_rate": [], "step_s": [], "benefit": [], "reason": []}
        for n in policies
    }
    for t in range(start, start + steps):
        draw = sim.workload.draw(t)
        factor = time_factor(sim, t)
        for name, pol in policies.items():
            g = pol.choose()
            obs, sec, ben = run_step(sim, draw, g, factor)
            m = pol.observe(obs)
            tr = traj[name]
            tr["group_size"].append(g)
            tr["straggler_rate"].append(m["straggler_rate"])
            tr["step_s"].append(sec)
            tr["benefit"].append(ben)
            tr["reason"].append(pol.last_reason)
    return {n: {k: np.asarray(v) for k, v in d.items()} for n, d in traj.items()}


def in_budget(rate: float, delta: float | None, tolerance: float) -> bool:
    """Mean straggler cost ``rate`` within ``delta + tolerance`` (always, without a budget)."""
    return delta is None or bool(rate <= delta + tolerance)


def summarize(sim: SimConfig, traj: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """Per-policy metrics (the JSON written by ``--out``)."""
    delta = sim.sagc.delta
    bounds = oracle_phases(sim)
    out: dict[str, Any] = {}
    for name, tr in traj.items():
        rate = float(tr["straggler_rate"].mean())
        res: dict[str, Any] = {
            "straggler_rate": rate,
            "step_s": float(tr["step_s"].mean()),
            "benefit_per_s": float(tr["benefit"].sum() / tr["step_s"].sum()),
            "benefit_per_step": float(tr["benefit"].mean()),
            "mean_group_size": float(tr["group_size"].mean()),
            "meets_delta": in_budget(rate, delta, sim.tolerance),
        }
        if len(bounds) > 2:
            res["phases"] = [
                {
                    "from_step": a,
                    "to_step": b,
                    "straggler_rate": float(tr["straggler_rate"][a:b].mean()),
                    "benefit_per_s": float(tr["benefit"][a:b].sum() / tr["step_s"][a:b].sum()),
                    "mean_group_size": float(tr["group_size"][a:b].mean()),
                }
                for a, b in itertools.pairwise(bounds)
                if b > a
            ]
        if name == "sagc":
            res["group_size_trajectory"] = tr["group_size"].astype(int).tolist()
            reasons, counts = np.unique(tr["reason"], return_counts=True)
            res["reasons"] = {str(r): int(c) for r, c in zip(reasons, counts)}
        out[name] = res
    return out


def oracle_phases(sim: SimConfig) -> list[int]:
    """Phase boundaries: drift change points, ramps cut into ``oracle_window``-step windows."""
    return phase_bounds(sim.steps, list(sim.drift_steps), list(sim.ramps), sim.oracle_window)


def oracle_summary(
    sim: SimConfig, traj: dict[str, dict[str, np.ndarray]], causal: bool = False
) -> dict[str, Any]:
    """The hindsight oracle (or, ``causal``, the no-foresight ceiling; oracle.py) over the
    static-g trajectories, as a policy entry."""
    sched, phases = oracle_from_trajectories(
        traj, sim.sagc.group_sizes, oracle_phases(sim), sim.sagc.delta, causal=causal
    )
    res: dict[str, Any] = {
        "straggler_rate": sched.straggler_rate,
        "step_s": sched.step_s,
        "benefit_per_s": sched.benefit_per_s,
        "benefit_per_step": sched.benefit_per_step,
        "mean_group_size": sched.mean_group_size,
        "meets_delta": in_budget(sched.straggler_rate, sim.sagc.delta, sim.tolerance),
        "feasible": sched.feasible,
    }
    res["phases"] = phases
    return res


def simulate(sim: SimConfig) -> dict[str, Any]:
    """Run all static policies and SAGC, then the causal ceiling and the hindsight oracle;
    returns {"policies": ..., ...}."""
    traj = run_policies(sim, make_policies(sim))
    policies = summarize(sim, traj)
    policies["causal"] = oracle_summary(sim, traj, causal=True)
    policies["oracle"] = oracle_summary(sim, traj)
    return {
        "policies": policies,
        "delta": sim.sagc.delta,
        "tolerance": sim.tolerance,
        "steps": sim.steps,
        "sagc_config": {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in sim.sagc.model_dump().items()
        },
        "_trajectories": traj,
    }


def best_static_in_budget(result: dict[str, Any]) -> float:
    """Highest benefit_per_s among static policies that meet delta (NaN if none does)."""
    return max(
        (
            v["benefit_per_s"]
            for k, v in result["policies"].items()
            if k.startswith("static-") and v["meets_delta"]
        ),
        default=float("nan"),
    )
