"""SAGC controller: the pure state, ``observe`` and ``choose`` (DESIGN.md §5).

The config is ``SAGCConfig`` (declared once in ``config/sagc.py``); the fixed internals are
``config/sagc_constants.py``, passed in as ``consts`` (None: the shipped ones). The controller is
tiny and runs on the host in numpy. Its whole state is an ``SAGCState`` (``state.py``) — one
typed NamedTuple of numpy arrays with static shapes per sub-model (:data:`LAYOUT`) — a pytree
that round-trips through Orbax ``StandardSave/Restore``. Every random draw comes from
``numpy.random.default_rng((seed, step, salt))``, so decisions are a deterministic function of
(config, constants, state, observations). ``observe`` composes one small pure
update per sub-model (``updates.py``); the estimators it reads live in ``estimators.py``, the
event definition in ``events.py``, the trainer-facing wrappers in ``policy.py``; the math is in
docs/sagc.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sagc_jax.config.sagc import SAGCConfig as SAGCConfig  # re-export (declared there)
from sagc_jax.config.sagc_constants import (
    SAGCConstants,
    credit_horizon,
    length_half_life,
    rate_half_life,
    resolve,
    trend_half_life,
)
from sagc_jax.sagc.estimators import (
    batch_prompts,
    benefit_rate,
    expected_decode_steps,
    posterior_risk,
    predicted_benefit,
    predicted_cost,
)
from sagc_jax.sagc.events import Observation as Observation  # re-export (trainer)
from sagc_jax.sagc.events import straggler_cost
from sagc_jax.sagc.state import LAYOUT as LAYOUT  # re-exports (declared in state.py)
from sagc_jax.sagc.state import REASONS, SAGCState, State
from sagc_jax.sagc.state import copy_state as copy_state
from sagc_jax.sagc.state import init_state as init_state
from sagc_jax.sagc.state import normalize_state as normalize_state
from sagc_jax.sagc.state import state_layout_error as state_layout_error
from sagc_jax.sagc.timing import TimeModel
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

_SALT_OBSERVE = 0x5A6C


class Choice(NamedTuple):
    """One decision of ``choose`` and why: the chosen ``g`` and ``reason`` (one of ``REASONS``),
    then per rung (arrays [len(group_sizes)]) the posterior straggler ``risk`` (probability),
    predicted ``cost`` (s a step), ``benefit`` (informative groups a step), utility ``j``
    (dimensionless), ``score`` and the ``feasible`` / ``reachable`` / ``eligible`` masks; the
    budget's virtual ``queue``, the per-step ``risk_cap`` (None without a budget) and the
    Dinkelbach ``benefit_rate`` (benefit per s)."""

    g: int
    reason: str
    group_sizes: tuple[int, ...]
    risk: np.ndarray
    cost: np.ndarray
    benefit: np.ndarray
    j: np.ndarray
    score: np.ndarray
    queue: float
    risk_cap: float | None
    benefit_rate: float
    feasible: np.ndarray
    reachable: np.ndarray
    eligible: np.ndarray


def observe(
    cfg: SAGCConfig, state: State, obs: Observation, consts: SAGCConstants | None = None
) -> State:
    """Fold one step's observation into the state (pure: returns a new ``SAGCState``).

    The composition of one update per sub-model, in the order the random draws are taken:
    budget, length, risk, change detection, length trend, benefit, cost, then the decision
    clock and E[decode steps] for the next ``choose``. ``consts``: the controller's constants
    (None: the shipped ``sagc_constants.CONSTANTS``), handed to every part.
    """
    c = resolve(consts)
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
    dec = state.decision
    step = int(dec.step)
    rng = np.random.default_rng((int(dec.seed) & 0xFFFFFFFF, step, _SALT_OBSERVE))
    lam = 0.5 ** (1.0 / cfg.half_life)
    i_g = sizes.index(g)

    rate = float(straggler_cost(cfg, lengths, truncated, c).mean())
    held = REASONS[int(dec.last_reason)] == "no_feasible"
    budget = budget_update(state.budget, rate, cfg.delta, held, c)
    length, pool_eps, p_tr = length_update(
        state.length, lengths, truncated, 0.5 ** (1.0 / length_half_life(cfg)), c
    )
    risk = risk_update(
        cfg, state.risk, lengths, truncated, rng, pool_eps, p_tr, max_new, lam, c
    )
    change = state.change
    if c.change_threshold > 0 and step >= cfg.warmup_steps:
        risk, length, change = change_update(
            state.risk, risk, state.length, length, change, i_g, step, c
        )
    else:
        change = change._replace(last_llr=np.array(0.0))
    fresh = int(change.changes) != int(state.change.changes)
    t_hl = trend_half_life(cfg, c)
    lam_tr = 0.5 ** (1.0 / t_hl) if t_hl else 0.0
    length = trend_update(length, state.length.trend_s, lengths, step, 0.0 if fresh else lam_tr)
    timed = obs.decode_steps > 0 and obs.decode_s > 0
    sec = float(obs.decode_s) + max(float(obs.prefill_s), 0.0) + max(float(obs.env_s), 0.0)
    benefit = benefit_update(
        state.benefit, rewards, i_g, lam,
        (step_benefit(rewards, c, cfg.benefit), sec) if timed else None,
        0.5 ** (1.0 / rate_half_life(cfg, c)), c,
    )
    cost = cost_update(state.cost, obs, i_g, p_groups, timed, c,
                       0.5 ** (1.0 / length_half_life(cfg)))
    decision = dec._replace(g_idx=np.array(i_g, np.int64), step=np.array(step + 1, np.int64))
    new = SAGCState(decision=decision, budget=budget, risk=risk, length=length,
                    benefit=benefit, cost=cost, change=change)
    exp_steps = expected_decode_steps(cfg, new, rng, consts=c)
    return new._replace(length=length._replace(exp_steps=exp_steps))


def choose(
    cfg: SAGCConfig, state: State, consts: SAGCConstants | None = None
) -> Choice:
    """Next group size (``.g``) with its diagnostics, a ``Choice``. Pure and deterministic.

    score(g) = V * u(g) - Q * risk(g) with u(g) = (benefit - λ·cost) / max benefit (benefit/s
    over the run is a ratio of sums: a step adds benefit - λ·seconds to it, Dinkelbach; scaled
    by the largest benefit so V stays dimensionless). Feasible g have risk(g) <= delta +
    credit / credit_horizon (the smallest judged on its mean risk; every g without a budget);
    eligible g are the feasible ones within max_rung_step rungs up of the current G, plus the
    budget-sharing rung just above the feasible ones. The choice is the best-scoring eligible g.
    ``consts``: the controller's constants (None: the shipped ones).
    """
    c = resolve(consts)
    sizes = np.array(cfg.group_sizes)
    n = len(sizes)
    dec = state.decision
    cur = int(dec.g_idx)
    risk = posterior_risk(cfg, state, consts=c)
    cost = predicted_cost(cfg, state, c)
    benefit = predicted_benefit(cfg, state, c)
    lam_rate = benefit_rate(cfg, state, benefit, cost, c)
    j = (benefit - lam_rate * cost) / max(float(benefit.max()), 1e-12)
    q = float(state.budget.queue)
    score = cfg.V * j - q * risk
    # The budget is a long-run average: credit saved in light phases raises the per-step cap,
    # to be spent over about credit_horizon steps (0 credit: the cap is delta). No budget
    # (delta None): every rung is feasible, the queue stays 0 and the score is V * u alone.
    cap = (np.inf if cfg.delta is None
           else cfg.delta + float(state.budget.credit) / credit_horizon(cfg, c))
    feasible = risk <= cap
    if c.floor_on_mean:
        # The quantile guards moves *up* into rungs we know little about; below the smallest
        # rung there is nothing safer, so it is feasible when its risk is, on the mean.
        feasible[0] = posterior_risk(cfg, state, mean=True, consts=c)[0] <= cap
    step = c.max_rung_step or n
    # max_rung_step limits moves up only: a larger rung is tried one step at a time, but a rung
    # that has become too risky is left at once.
    reach = (np.arange(n) - cur) <= step
    eligible = np.zeros(n, bool)  # stays empty when no score decision is made
    if int(dec.step) < cfg.warmup_steps:
        # Warm-up holds the first step's rung (observe records each step's g in g_idx).
        idx = start_index(cfg, state, benefit, c) if int(dec.step) == 0 else cur
        reason = "warmup"
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
    return Choice(
        g=int(sizes[idx]), reason=reason, group_sizes=tuple(sizes.tolist()), risk=risk,
        cost=cost, benefit=benefit, j=j, score=score, queue=q,
        risk_cap=None if cfg.delta is None else float(cap), benefit_rate=float(lam_rate),
        feasible=feasible, reachable=reach, eligible=eligible,
    )


def start_index(cfg: SAGCConfig, state: State, benefit: np.ndarray,
                consts: SAGCConstants | None = None) -> int:
    """Index of the first step's rung: ``initial_group_size``, else (null) the largest rung, or
    with the ``prior_start`` constant the rung of the best prior benefit per second.

    The prior: ``benefit`` [K], the rungs' predicted benefit a step before any observation (a
    uniform pass rate), over the seconds ``sagc.time_model`` gives a step whose every group's
    longest row reaches max_new_tokens: the price of a rung before anything is measured, on
    either clock (the step's shape from ``init_state(prompts=, max_new_tokens=)``; unknown, one
    decode step). With the default accelerator-like model that is the largest rung.
    """
    c = resolve(consts)
    if cfg.initial_group_size is None and c.prior_start:
        tm = TimeModel.from_sagc(cfg)
        steps = max(int(state.cost.max_new_tokens), 1)
        rows = batch_prompts(cfg, state) * np.array(cfg.group_sizes)
        return int(np.argmax(benefit / np.array([tm.step_seconds(int(r), steps) for r in rows])))
    return cfg.group_sizes.index(cfg.start_group_size)


def record_choice(state: State, choice: Choice) -> State:
    """Store the last decision's diagnostics in the state (pure)."""
    dec = state.decision._replace(
        last_choice=np.array(choice.group_sizes.index(choice.g), np.int64),
        last_reason=np.array(REASONS.index(choice.reason), np.int64),
        last_score=np.asarray(choice.score, np.float64),
    )
    return state._replace(decision=dec)
