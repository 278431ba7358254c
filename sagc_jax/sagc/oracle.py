"""The hindsight oracle: the best phase-by-rung schedule that meets the long-run straggler budget.

DESIGN.md §5. A workload is split into K phases of T_k steps. For every phase k and rung g the
simulator measures (by running static g on the same common random numbers) the mean per-step
straggler rate r_kg, benefit b_kg and seconds c_kg. The oracle picks time fractions x_kg >= 0,
Σ_g x_kg = 1, to

    maximise   Σ_k T_k Σ_g x_kg b_kg / Σ_k T_k Σ_g x_kg c_kg        (benefit per second)
    subject to Σ_k T_k Σ_g x_kg r_kg <= delta Σ_k T_k               (long-run straggler rate)

a linear-fractional program. The Charnes–Cooper substitution y_kg = s T_k x_kg (s > 0 scales the
denominator to 1) makes it one LP in y and s, solved with ``scipy.optimize.linprog`` (HiGHS;
scipy ships with jax). At an optimum at most one phase mixes two rungs.

The hindsight oracle knows the future: in a light phase it already prices time at the whole
run's (lower) benefit rate, so it runs larger g there than any online controller could justify.
``solve_causal`` is the ceiling for a controller *without* foresight: at the start of each phase
it knows that phase's r, b, c exactly (perfect estimation, instant change detection) and what it
ran so far, assumes the current phase lasts to the end of the run (certainty equivalence), solves
the same program with the past fixed, and runs the current phase's part of that plan. The gap
hindsight - causal is the price of not knowing the future; causal - SAGC is what estimation
costs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OracleSchedule:
    """The oracle's schedule and what it realises.

    fractions: float [K, G] time fraction of each rung in each phase (rows sum to 1).
    straggler_rate: step-averaged rate; benefit_per_s: total benefit / total seconds;
    feasible: False when even the least risky rung in every phase exceeds delta (then the
    schedule is that least-risk one).
    """

    fractions: np.ndarray
    straggler_rate: float
    benefit_per_s: float
    benefit_per_step: float
    step_s: float
    mean_group_size: float
    feasible: bool


def _realised(
    x: np.ndarray, steps: np.ndarray, b: np.ndarray, c: np.ndarray, r: np.ndarray, sizes
) -> tuple[float, float, float, float, float]:
    w = steps[:, None] * x  # steps spent at each (phase, rung)
    total = float(steps.sum())
    ben, sec = float((w * b).sum()), float((w * c).sum())
    rate = float((w * r).sum()) / total
    return rate, ben / sec, ben / total, sec / total, float((w * np.asarray(sizes)).sum()) / total


def _fractions(
    t: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    r: np.ndarray,
    delta: float | None,
    fixed: np.ndarray | None = None,
) -> np.ndarray | None:
    """Optimal time fractions x [K, G] of the program above, or None if no schedule meets delta.

    fixed: optional [K', G] fractions of the first K' phases, held as given (the past).
    """
    from scipy.optimize import linprog

    k, g = b.shape
    n_fix = 0 if fixed is None else len(fixed)
    # Variables: y [K*G] then s. maximise Σ y b  <=>  minimise -Σ y b.
    n = k * g
    obj = np.concatenate([-b.reshape(-1), [0.0]])
    a_eq = np.zeros((1 + k + n_fix * g, n + 1))
    a_eq[0, :n] = c.reshape(-1)  # Σ y c = 1
    for i in range(k):  # Σ_g y_kg = s T_k
        a_eq[1 + i, i * g : (i + 1) * g] = 1.0
        a_eq[1 + i, n] = -t[i]
    for i in range(n_fix):  # y_kg = s T_k x_kg for the fixed phases
        for j in range(g):
            row = 1 + k + i * g + j
            a_eq[row, i * g + j] = 1.0
            a_eq[row, n] = -t[i] * float(fixed[i, j])  # type: ignore[index]
    b_eq = np.zeros(len(a_eq))
    b_eq[0] = 1.0
    # Σ y r <= delta s Σ T; no budget (delta None): no such row.
    ub = {} if delta is None else {
        "A_ub": np.concatenate([r.reshape(-1), [-delta * t.sum()]])[None], "b_ub": [0.0]}
    res = linprog(obj, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), **ub)
    if res.status != 0 or res.x[n] <= 0:
        return None
    x = np.clip(res.x[:n].reshape(k, g) / (res.x[n] * t[:, None]), 0.0, None)
    return x / x.sum(1, keepdims=True)


def _inputs(
    steps: np.ndarray, benefit: np.ndarray, seconds: np.ndarray, rate: np.ndarray, who: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    t = np.asarray(steps, np.float64)
    b, c, r = (np.asarray(a, np.float64) for a in (benefit, seconds, rate))
    if not (c > 0).all():
        raise ValueError(f"{who}: every phase x rung needs seconds > 0")
    return t, b, c, r


def solve_oracle(
    steps: np.ndarray,
    benefit: np.ndarray,
    seconds: np.ndarray,
    rate: np.ndarray,
    delta: float | None,
    sizes: tuple[int, ...] | list[int],
) -> OracleSchedule:
    """Solve the linear-fractional program above (the hindsight oracle).

    steps: [K] steps per phase; benefit, seconds, rate: [K, G] per-step means of static rung g in
    phase k (seconds > 0); delta: the long-run budget (None: none); sizes: the G rung sizes
    (for mean g).
    """
    t, b, c, r = _inputs(steps, benefit, seconds, rate, "solve_oracle")
    x = _fractions(t, b, c, r, delta)
    feasible = x is not None
    if x is None:  # no schedule meets delta: the least risky rung in every phase
        x = np.zeros(b.shape)
        x[np.arange(len(b)), r.argmin(1)] = 1.0
    rate_, bps, bpstep, step_s, mean_g = _realised(x, t, b, c, r, sizes)
    return OracleSchedule(x, rate_, bps, bpstep, step_s, mean_g, feasible)


def solve_causal(
    steps: np.ndarray,
    benefit: np.ndarray,
    seconds: np.ndarray,
    rate: np.ndarray,
    delta: float | None,
    sizes: tuple[int, ...] | list[int],
) -> OracleSchedule:
    """The no-foresight ceiling (module docstring): phase by phase, re-plan with the past fixed
    and the current phase's figures assumed for the rest of the run. Same arguments as
    ``solve_oracle``. ``feasible`` is False when some phase found no plan meeting delta (it then
    ran its least risky rung)."""
    t, b, c, r = _inputs(steps, benefit, seconds, rate, "solve_causal")
    k = len(t)
    x = np.zeros(b.shape)
    feasible = True
    for i in range(k):
        # Phases 0..i-1 as run, then one phase: the current one, lasting to the end of the run.
        tt = np.concatenate([t[:i], [t[i:].sum()]])
        xi = _fractions(tt, b[: i + 1], c[: i + 1], r[: i + 1], delta, fixed=x[:i])
        if xi is None:
            x[i, r[i].argmin()] = 1.0
            feasible = False
        else:
            x[i] = xi[i]
    rate_, bps, bpstep, step_s, mean_g = _realised(x, t, b, c, r, sizes)
    return OracleSchedule(x, rate_, bps, bpstep, step_s, mean_g, feasible)


def phase_bounds(steps: int, change_points: list[int], ramps: list[tuple[int, int]], window: int):
    """Phase boundaries [0, ..., steps] for the oracle.

    change_points: steps where piecewise-constant parameters jump; ramps: [start, end) ranges in
    which parameters change continuously, split into windows of at most ``window`` steps
    (equal lengths). Returns a sorted list of ints.
    """
    cuts = {0, steps} | {s for s in change_points if 0 < s < steps}
    for a, b in ramps:
        a, b = max(a, 0), min(b, steps)
        if b - a <= 0:
            continue
        cuts |= {a, b}
        n = int(np.ceil((b - a) / window))
        cuts |= {a + round(i * (b - a) / n) for i in range(1, n)}
    return sorted(cuts)


def oracle_from_trajectories(
    traj: dict[str, dict[str, np.ndarray]],
    sizes: tuple[int, ...],
    bounds: list[int],
    delta: float | None,
    causal: bool = False,
) -> tuple[OracleSchedule, list[dict[str, object]]]:
    """Measure r_kg, b_kg, c_kg from the static-g trajectories and solve.

    traj: per policy name "static-{g}" arrays straggler_rate / benefit / step_s [T];
    bounds: phase boundaries; causal: ``solve_causal`` instead of the hindsight ``solve_oracle``.
    Returns the schedule and per-phase rows for the JSON.
    """
    pairs = list(itertools.pairwise(bounds))
    steps = np.array([b - a for a, b in pairs], np.float64)
    stat = {
        key: np.array([[traj[f"static-{g}"][key][a:b].mean() for g in sizes] for a, b in pairs])
        for key in ("straggler_rate", "benefit", "step_s")
    }
    solve = solve_causal if causal else solve_oracle
    sched = solve(steps, stat["benefit"], stat["step_s"], stat["straggler_rate"], delta, sizes)
    phases = []
    for i, (a, b) in enumerate(pairs):
        x = sched.fractions[i]
        phases.append(
            {
                "from_step": a,
                "to_step": b,
                "fractions": {str(g): round(float(f), 4) for g, f in zip(sizes, x) if f > 1e-4},
                "straggler_rate": float(x @ stat["straggler_rate"][i]),
                "benefit_per_s": float(x @ stat["benefit"][i]) / float(x @ stat["step_s"][i]),
                "mean_group_size": float(x @ np.asarray(sizes, np.float64)),
            }
        )
    return sched, phases
