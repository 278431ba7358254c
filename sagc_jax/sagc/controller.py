"""SAGC controller: the pure state, ``observe`` and ``choose`` (DESIGN.md §5).

The config is ``SAGCConfig`` (declared once in ``config/sagc.py``); the fixed internals are
``config/sagc_constants.py``. The controller is tiny and runs on the host in numpy. Its whole
state is a nested ``dict`` — one sub-dict of numpy arrays with static shapes per sub-model
(:data:`LAYOUT`) — a pytree that round-trips through Orbax ``StandardSave/Restore``. Every
random draw comes from ``numpy.random.default_rng((seed, step, salt))``, so decisions are a
deterministic function of (config, state, observations). ``observe`` composes one small pure
update per sub-model (``updates.py``); the estimators it reads live in ``estimators.py``, the
event definition in ``events.py``, the trainer-facing wrappers in ``policy.py``; the math is in
docs/sagc.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sagc_jax.config.sagc import SAGCConfig as SAGCConfig  # re-export (declared there)
from sagc_jax.config.sagc_constants import (
    constants,
    credit_horizon,
    length_half_life,
    rate_half_life,
    trend_half_life,
    window_rows,
)
from sagc_jax.sagc.estimators import (
    State,
    benefit_rate,
    expected_decode_steps,
    posterior_risk,
    predicted_benefit,
    predicted_cost,
)
from sagc_jax.sagc.events import Observation as Observation  # re-export (trainer)
from sagc_jax.sagc.events import straggler_cost
from sagc_jax.sagc.updates import (
    benefit_update,
    budget_update,
    change_update,
    cost_update,
    length_update,
    risk_update,
    step_benefit,
    trend_update,
)

# Reason codes stored in the state (strings are not pytree leaves).
REASONS: tuple[str, ...] = ("init", "warmup", "score", "no_feasible", "toward_feasible", "static")
_SALT_OBSERVE = 0x5A6C

#: Sub-model -> its keys (the state's layout; ``init_state`` gives shapes and units).
LAYOUT: dict[str, tuple[str, ...]] = {
    "decision": ("step", "seed", "horizon", "g_idx", "last_reason", "last_choice", "last_score"),
    "budget": ("queue", "credit", "last_rate"),
    "risk": ("a", "b", "last", "hist_a", "hist_n"),
    "length": ("eps_ring", "rows_seen", "med_ring", "groups_seen", "trunc_s", "trunc_total",
               "hist_tr", "rows_since", "groups_since", "exp_steps", "trend_s"),
    "benefit": ("pass_hist", "rate_s", "total_s", "rate_now"),
    "cost": ("prefill_s", "decode_step_s", "measured", "prompts", "max_new_tokens",
             "decode_chunk"),
    "change": ("changes", "change_step", "last_llr"),
}


def init_state(cfg: SAGCConfig, *, horizon: int | None = None, seed: int | None = None) -> State:
    """Fresh controller state: one sub-dict of numpy arrays with static shapes per sub-model.

    ``horizon``: steps in the run (the trainer passes run.steps, the simulator its steps);
    None = unknown (λ is then the discounted realised rate). ``seed``: of the Monte-Carlo draws
    (None = the constant seed, 0; the simulator passes its own). Both are kept in the state, so
    a resumed run keeps them. K = len(group_sizes) candidates.
    """
    c = constants()
    k = len(cfg.group_sizes)
    f64 = np.float64
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    if horizon is not None and int(horizon) < 1:
        raise ValueError(f"SAGC horizon: must be >= 1 steps or None, got {horizon}")
    win = c.change_window
    return {
        "decision": {
            "step": i64(0),  # observations folded in so far (also the RNG counter)
            "seed": i64(c.seed if seed is None else seed),
            "horizon": i64(0 if horizon is None else horizon),  # steps in the run; 0 = unknown
            "g_idx": i64(cfg.group_sizes.index(cfg.initial_group_size)),
            "last_reason": i64(0),  # index into REASONS
            "last_choice": i64(-1),
            "last_score": np.zeros(k, f64),
        },
        "budget": {
            "queue": np.array(0.0, f64),  # virtual queue Q (budget debt)
            "credit": np.array(0.0, f64),  # unused budget saved for later, <= credit_cap
            "last_rate": np.array(0.0, f64),  # s_t of the last step
        },
        "risk": {
            "a": np.zeros(k, f64),  # discounted event pseudo-counts (prior added on read)
            "b": np.zeros(k, f64),  # discounted non-event pseudo-counts
            "last": np.zeros(k, f64),  # last step's counterfactual estimate (diagnostic)
            # The last change_window steps' own sums, newest first (change detection):
            "hist_a": np.zeros((win, k), f64),  # weighted events per rung
            "hist_n": np.zeros((win, k), f64),  # weighted groups per rung
        },
        "length": {
            "eps_ring": np.ones(window_rows(cfg), f64),  # untruncated row length / group median
            "rows_seen": i64(0),
            "med_ring": np.ones(c.window_groups, f64),  # recent group medians (tokens)
            "groups_seen": i64(0),
            "trunc_s": np.zeros(2, f64),  # discounted sums: rows, truncated rows
            "trunc_total": np.zeros(2, f64),  # the same over the whole run (the prior's mean)
            "hist_tr": np.zeros((win, 3), f64),  # per step: rows, truncated rows, groups
            "rows_since": i64(0),  # rows_seen / groups_seen at the last change:
            "groups_since": i64(0),  # the length model reads only what came after
            "exp_steps": np.zeros(k, f64),  # bootstrap E[decode steps] at each g (0 = unknown)
            # Discounted sums of 1, t, t^2, y, t*y, y^2; y = log median length of step t
            "trend_s": np.zeros(6, f64),
        },
        "benefit": {
            # Discounted count of groups with k passes, per rung: [K, max g + 1]
            "pass_hist": np.zeros((k, max(cfg.group_sizes) + 1), f64),
            "rate_s": np.zeros(2, f64),  # discounted realised benefit, seconds (λ)
            "total_s": np.zeros(2, f64),  # the same, undiscounted, over the whole run
            "rate_now": np.zeros(3, f64),  # benefit, seconds, steps; recent (half_life)
        },
        "cost": {
            "prefill_s": np.zeros(k, f64),  # EMA per compiled shape (seconds)
            "decode_step_s": np.zeros(k, f64),  # EMA seconds per decode step per shape
            "measured": np.zeros(k, bool),
            "prompts": i64(0),  # last observed prompts per step (prompts policy)
            "max_new_tokens": i64(0),
            "decode_chunk": i64(1),
        },
        "change": {
            "changes": i64(0),  # change points detected so far
            "change_step": i64(0),  # first step of the current regime
            "last_llr": np.array(0.0, f64),  # largest change statistic of the last step
        },
    }


def observe(cfg: SAGCConfig, state: State, obs: Observation) -> State:
    """Fold one step's observation into the state (pure: returns a new nested dict).

    The composition of one update per sub-model, in the order the random draws are taken:
    budget, length, risk, change detection, length trend, benefit, cost, then the decision
    clock and E[decode steps] for the next ``choose``.
    """
    sizes = cfg.group_sizes
    g = int(obs.group_size)
    if g not in sizes:
        raise ValueError(f"observation group_size {g} not in sagc.group_sizes {list(sizes)}")
    lengths = np.asarray(obs.lengths, dtype=np.float64).reshape(-1)
    rows = len(lengths)
    if rows == 0 or rows % g:
        raise ValueError(f"observation rows {rows} is not a positive multiple of group_size {g}")
    p_groups = rows // g
    lengths = np.maximum(lengths.reshape(p_groups, g), 1.0)
    truncated = np.asarray(obs.truncated, dtype=bool).reshape(p_groups, g)
    rewards = np.asarray(obs.rewards, dtype=np.float64).reshape(p_groups, g)
    max_new = int(obs.max_new_tokens)
    dec = state["decision"]
    step = int(dec["step"])
    rng = np.random.default_rng((int(dec["seed"]) & 0xFFFFFFFF, step, _SALT_OBSERVE))
    lam = 0.5 ** (1.0 / cfg.half_life)
    i_g = sizes.index(g)

    rate = float(straggler_cost(cfg, lengths, truncated).mean())
    held = REASONS[int(dec["last_reason"])] == "no_feasible"
    budget = budget_update(state["budget"], rate, cfg.delta, held)
    length, pool_eps, p_tr = length_update(
        state["length"], lengths, truncated, 0.5 ** (1.0 / length_half_life(cfg))
    )
    risk = risk_update(cfg, state["risk"], lengths, truncated, rng, pool_eps, p_tr, max_new, lam)
    change = dict(state["change"])
    if constants().change_threshold > 0 and step >= cfg.warmup_steps:
        risk, length, change = change_update(
            state["risk"], risk, state["length"], length, change, i_g, step
        )
    else:
        change["last_llr"] = np.array(0.0)
    fresh = int(change["changes"]) != int(state["change"]["changes"])
    t_hl = trend_half_life(cfg)
    lam_tr = 0.5 ** (1.0 / t_hl) if t_hl else 0.0
    length = trend_update(
        length, state["length"]["trend_s"], lengths, step, 0.0 if fresh else lam_tr
    )
    timed = obs.decode_steps > 0 and obs.decode_s > 0
    sec = float(obs.decode_s) + max(float(obs.prefill_s), 0.0)
    benefit = benefit_update(
        state["benefit"], rewards, i_g, lam, (step_benefit(rewards), sec) if timed else None,
        0.5 ** (1.0 / rate_half_life(cfg)),
    )
    cost = cost_update(state["cost"], obs, i_g, p_groups, timed)
    decision = dict(dec)
    decision["g_idx"] = np.array(i_g, np.int64)
    decision["step"] = np.array(step + 1, np.int64)
    new = {"decision": decision, "budget": budget, "risk": risk, "length": length,
           "benefit": benefit, "cost": cost, "change": change}
    new["length"] = {**length, "exp_steps": expected_decode_steps(cfg, new, rng)}
    return new


def choose(cfg: SAGCConfig, state: State) -> tuple[int, dict[str, Any]]:
    """Next group size and diagnostics. Pure and deterministic (no randomness).

    score(g) = V * u(g) - Q * risk(g) with u(g) = (benefit - λ·cost) / max benefit (benefit/s
    over the run is a ratio of sums: a step adds benefit - λ·seconds to it, Dinkelbach; scaled
    by the largest benefit so V stays dimensionless). Feasible g have risk(g) <= delta +
    credit / credit_horizon (the smallest judged on its mean risk; every g without a budget);
    eligible g are the feasible ones within max_rung_step rungs up of the current G, plus the
    budget-sharing rung just above the feasible ones. The choice is the best-scoring eligible g.
    """
    c = constants()
    sizes = np.array(cfg.group_sizes)
    n = len(sizes)
    dec = state["decision"]
    cur = int(dec["g_idx"])
    risk = posterior_risk(cfg, state)
    cost = predicted_cost(cfg, state)
    benefit = predicted_benefit(cfg, state)
    lam_rate = benefit_rate(cfg, state, benefit, cost)
    j = (benefit - lam_rate * cost) / max(float(benefit.max()), 1e-12)
    q = float(state["budget"]["queue"])
    score = cfg.V * j - q * risk
    # The budget is a long-run average: credit saved in light phases raises the per-step cap,
    # to be spent over about credit_horizon steps (0 credit: the cap is delta). No budget
    # (delta None): every rung is feasible, the queue stays 0 and the score is V * u alone.
    cap = (np.inf if cfg.delta is None
           else cfg.delta + float(state["budget"]["credit"]) / credit_horizon(cfg))
    feasible = risk <= cap
    if c.floor_on_mean:
        # The quantile guards moves *up* into rungs we know little about; below the smallest
        # rung there is nothing safer, so it is feasible when its risk is, on the mean.
        feasible[0] = posterior_risk(cfg, state, mean=True)[0] <= cap
    step = c.max_rung_step or n
    # max_rung_step limits moves up only: a larger rung is tried one step at a time, but a rung
    # that has become too risky is left at once.
    reach = (np.arange(n) - cur) <= step
    eligible = np.zeros(n, bool)  # stays empty when no score decision is made
    if int(dec["step"]) < cfg.warmup_steps:
        idx, reason = sizes.tolist().index(cfg.initial_group_size), "warmup"
    elif not feasible.any():
        idx, reason = 0, "no_feasible"  # the smallest g, held
    else:
        eligible = reach & feasible if c.hard_filter else reach.copy()
        top = int(np.flatnonzero(feasible).max()) + 1
        if c.share_budget and top < n:
            # Spend unused budget: the rung just above the feasible ones competes on score, so
            # the queue time-shares the two rungs that bracket delta (the optimal stationary
            # constrained policy) instead of leaving budget unused.
            eligible[top] = reach[top]
        if eligible.any():
            idx, reason = int(np.argmax(np.where(eligible, score, -np.inf))), "score"
        else:  # feasible rungs exist but are out of reach: move toward the nearest one
            target = int(
                np.flatnonzero(feasible)[np.argmin(np.abs(np.flatnonzero(feasible) - cur))]
            )
            idx, reason = cur + int(np.clip(target - cur, -n, step)), "toward_feasible"
    info = {
        "g": int(sizes[idx]),
        "reason": reason,
        "group_sizes": sizes.tolist(),
        "risk": risk.tolist(),
        "cost": cost.tolist(),
        "benefit": benefit.tolist(),
        "J": j.tolist(),
        "score": score.tolist(),
        "queue": q,
        "risk_cap": None if cfg.delta is None else cap,
        "benefit_rate": lam_rate,
        "feasible": feasible.tolist(),
        "reachable": reach.tolist(),
        "eligible": eligible.tolist(),
    }
    return int(sizes[idx]), info


def record_choice(state: State, info: dict[str, Any]) -> State:
    """Store the last decision's diagnostics in the state (pure)."""
    dec = dict(state["decision"])
    dec["last_choice"] = np.array(info["group_sizes"].index(info["g"]), np.int64)
    dec["last_reason"] = np.array(REASONS.index(info["reason"]), np.int64)
    dec["last_score"] = np.asarray(info["score"], np.float64)
    return {**state, "decision": dec}


def copy_state(state: State) -> State:
    """A deep copy (every array copied)."""
    return {m: {k: np.array(v, copy=True) for k, v in sub.items()} for m, sub in state.items()}


#: Keys of the flat state before issue 32 (one is named when such a state is refused).
_FLAT_KEYS = frozenset({
    "queue", "credit", "risk_a", "risk_b", "risk_last", "prefill_s", "decode_step_s", "step",
    "seed", "g_idx", "eps_ring", "pass_hist", "trunc_s", "hist_a", "changes", "trend_s",
})


def state_layout_error(keys: Any) -> str | None:
    """One line if ``keys`` (a restored state's top-level keys) are the old flat layout."""
    old = sorted(_FLAT_KEYS & {str(k) for k in keys})
    if not old:
        return None
    return (f"SAGC state key {old[0]!r} is from the old flat layout: the SAGC state layout "
            "changed in the controller core rewrite (issue 32); resume that checkpoint with the "
            "version that wrote it, or start a new run.dir")


def normalize_state(cfg: SAGCConfig, restored: dict[str, Any]) -> State:
    """Coerce a restored pytree (numpy scalars / jax arrays) back to the exact state layout.

    Keeps the restored horizon and seed (a resumed run goes on as it started). Raises
    ValueError (one line) on another layout: the pre-issue-32 flat state, or keys that differ.
    """
    msg = state_layout_error(restored)
    if msg:
        raise ValueError(msg)
    ref = init_state(cfg)
    got = {m: set(v) if isinstance(v, dict) else set() for m, v in restored.items()}
    want = {m: set(v) for m, v in ref.items()}
    if got != want:
        flat = lambda d: {f"{m}/{k}" for m, ks in d.items() for k in ks}  # noqa: E731
        missing, extra = sorted(flat(want) - flat(got)), sorted(flat(got) - flat(want))
        raise ValueError(
            f"SAGC state keys mismatch: missing {missing}, unexpected {extra} (a checkpoint "
            "written by another controller version; resume it with that version, or start "
            "the controller afresh)"
        )
    out: State = {}
    for m, sub in ref.items():
        out[m] = {}
        for k, v in sub.items():
            arr = np.array(restored[m][k], dtype=v.dtype)
            if arr.shape != v.shape:
                raise ValueError(f"SAGC state {m}/{k}: shape {arr.shape}, expected {v.shape}")
            out[m][k] = arr
    return out
