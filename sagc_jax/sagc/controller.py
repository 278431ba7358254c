"""SAGC controller: the pure state, ``observe`` and ``choose`` (DESIGN.md §5).

The config is ``SAGCConfig`` (declared once in ``config/sagc.py``). The controller is tiny and
runs on the host in numpy. Its whole state is a flat ``dict`` of numpy arrays with static shapes
(a pytree that round-trips through Orbax ``StandardSave/Restore``). Every random draw comes from
``numpy.random.default_rng((seed, step, salt))``, so decisions are a deterministic function of
(config, state, observations). The estimators it reads live in ``estimators.py``, the event
definition in ``events.py``, the trainer-facing wrappers in ``policy.py``; the math is in
docs/sagc.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sagc_jax.config.sagc import SAGCConfig as SAGCConfig  # re-export (declared there)
from sagc_jax.sagc.estimators import (
    State,
    benefit_rate,
    binom_llr2,
    expected_decode_steps,
    posterior_risk,
    predicted_benefit,
    predicted_cost,
    realised_benefit,
    ring_put,
    ring_view,
    truncation_rate,
)
from sagc_jax.sagc.events import Observation as Observation  # re-export (trainer)
from sagc_jax.sagc.events import counterfactual_risk, straggler_events

# Reason codes stored in the state (strings are not pytree leaves).
REASONS: tuple[str, ...] = ("init", "warmup", "score", "no_feasible", "toward_feasible", "static")
_SALT_OBSERVE = 0x5A6C


def init_state(cfg: SAGCConfig) -> State:
    """Fresh controller state: a flat dict of numpy arrays with static shapes (K candidates)."""
    k = len(cfg.group_sizes)
    f64 = np.float64
    return {
        "step": np.array(0, np.int64),  # observations folded in so far (also the RNG counter)
        "seed": np.array(cfg.seed, np.int64),
        "g_idx": np.array(cfg.group_sizes.index(cfg.initial_group_size), np.int64),
        "queue": np.array(0.0, f64),  # virtual queue Q (budget debt)
        "credit": np.array(0.0, f64),  # unused budget saved for later, <= credit_cap
        "last_rate": np.array(0.0, f64),  # s_t of the last step
        "risk_a": np.zeros(k, f64),  # discounted event pseudo-counts (prior added on read)
        "risk_b": np.zeros(k, f64),  # discounted non-event pseudo-counts
        "risk_last": np.zeros(k, f64),  # last step's counterfactual estimate (diagnostic)
        "prefill_s": np.zeros(k, f64),  # EMA per compiled shape (seconds)
        "decode_step_s": np.zeros(k, f64),  # EMA seconds per decode step per shape
        "measured": np.zeros(k, bool),
        "exp_steps": np.zeros(k, f64),  # bootstrap E[decode steps] at each g (0 = unknown)
        "prompts": np.array(0, np.int64),  # last observed prompts per step (prompts policy)
        "max_new_tokens": np.array(0, np.int64),
        "decode_chunk": np.array(1, np.int64),
        # Discounted count of groups with k passes, per rung: [K, max g + 1] (benefit model)
        "pass_hist": np.zeros((k, max(cfg.group_sizes) + 1), f64),
        "eps_ring": np.ones(cfg.window_rows, f64),  # untruncated row length / its group median
        "trunc_s": np.zeros(2, f64),  # discounted sums: rows, truncated rows
        "trunc_total": np.zeros(2, f64),  # the same over the whole run (the prior's mean)
        "rows_seen": np.array(0, np.int64),
        "med_ring": np.ones(cfg.window_groups, f64),  # recent group medians (tokens)
        "groups_seen": np.array(0, np.int64),
        "last_reason": np.array(0, np.int64),  # index into REASONS
        "last_choice": np.array(-1, np.int64),
        "last_score": np.zeros(k, f64),
        # The last change_window steps' own sums, newest first (change detection):
        "hist_a": np.zeros((cfg.change_window, k), f64),  # weighted events per rung
        "hist_n": np.zeros((cfg.change_window, k), f64),  # weighted groups per rung
        "hist_tr": np.zeros((cfg.change_window, 3), f64),  # rows, truncated rows, groups
        "rate_s": np.zeros(2, f64),  # discounted realised benefit, seconds (λ)
        "total_s": np.zeros(2, f64),  # the same, undiscounted, over the whole run
        "rate_now": np.zeros(3, f64),  # benefit, seconds, steps; recent (half_life)
        # Discounted sums of 1, t, t^2, y, t*y, y^2; y = log median length of step t (λ's trend)
        "trend_s": np.zeros(6, f64),
        "changes": np.array(0, np.int64),  # change points detected so far
        "change_step": np.array(0, np.int64),  # first step of the current regime
        "last_llr": np.array(0.0, f64),  # largest change statistic of the last step
        "rows_since": np.array(0, np.int64),  # rows_seen / groups_seen at the last change:
        "groups_since": np.array(0, np.int64),  # the length model reads only what came after
    }


def observe(cfg: SAGCConfig, state: State, obs: Observation) -> State:
    """Fold one step's observation into the state (pure: returns a new dict)."""
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
    step = int(state["step"])
    rng = np.random.default_rng((int(state["seed"]) & 0xFFFFFFFF, step, _SALT_OBSERVE))
    lam = 0.5 ** (1.0 / cfg.half_life)
    new = {k: np.array(v, copy=True) for k, v in state.items()}

    # 1) realised straggler rate and the virtual queue.
    rate = float(straggler_events(lengths, truncated, cfg.tau, cfg.count_truncated).mean())
    new["last_rate"] = np.array(rate)
    # After a "no_feasible" decision the step ran at the most conservative g there is; debt
    # accrued then could only be repaid by over-throttling once the tail lightens, so the queue
    # does not grow on such steps (it still drains).
    held = REASONS[int(state["last_reason"])] == "no_feasible"
    excess = min(rate - cfg.delta, 0.0) if held else rate - cfg.delta
    # One signed balance: debt is the queue, savings (up to credit_cap) are credit.
    balance = min(float(state["credit"]) - float(state["queue"]) - excess, cfg.credit_cap)
    new["queue"] = np.array(max(0.0, -balance))
    new["credit"] = np.array(max(0.0, balance))

    # 2) the "median x residual" length model: recent untruncated residuals, group medians,
    #    and a discounted per-row truncation rate.
    med = np.median(lengths, axis=-1)
    eps = (lengths / med[:, None])[~truncated]
    seen = int(state["rows_seen"])
    if len(eps):
        new["eps_ring"] = ring_put(state["eps_ring"], seen, eps)
        new["rows_seen"] = np.array(seen + len(eps), np.int64)
    lam_len = 0.5 ** (1.0 / cfg.length_half_life)
    tr_step = np.array([rows, truncated.sum()], np.float64)
    new["trunc_s"] = lam_len * state["trunc_s"] + tr_step
    new["trunc_total"] = state["trunc_total"] + tr_step
    new["hist_tr"] = np.roll(state["hist_tr"], 1, axis=0)
    new["hist_tr"][0] = [rows, truncated.sum(), p_groups]
    new["hist_a"] = np.roll(state["hist_a"], 1, axis=0)
    new["hist_n"] = np.roll(state["hist_n"], 1, axis=0)
    gseen = int(state["groups_seen"])
    new["med_ring"] = ring_put(state["med_ring"], gseen, med)
    new["groups_seen"] = np.array(gseen + p_groups, np.int64)
    pool_eps = ring_view(new["eps_ring"], new["rows_seen"], state["rows_since"])
    if len(pool_eps) == 0:  # nothing untruncated seen yet: residual 1 (tight groups)
        pool_eps = np.ones(1)
    p_tr = truncation_rate(new)

    # 3) counterfactual risk for every candidate, folded into discounted Beta pseudo-counts.
    #    A group of G rows extended by the length model to g > G rows carries (G/g)^p groups'
    #    worth of evidence about g (p = extrapolation_power): G/g if the model were exact, less
    #    because it is not, so direct observations of g override it within a few steps.
    for i, gc in enumerate(sizes):
        r = counterfactual_risk(
            lengths,
            truncated,
            gc,
            tau=cfg.tau,
            count_truncated=cfg.count_truncated,
            rng=rng,
            mc=cfg.mc_samples,
            pool_eps=pool_eps,
            trunc_rate=p_tr,
            max_new_tokens=max_new,
        )
        w = min(1.0, g / gc) ** cfg.extrapolation_power
        new["risk_a"][i] = lam * state["risk_a"][i] + w * r.sum()
        new["risk_b"][i] = lam * state["risk_b"][i] + w * (1.0 - r).sum()
        new["hist_a"][0, i] = w * r.sum()
        new["hist_n"][0, i] = w * len(r)
        new["risk_last"][i] = r.mean()
    i_g = sizes.index(g)
    _detect_change(cfg, state, new, i_g)
    # The length trend lives within one regime: a detected change starts it afresh.
    lam_tr = 0.5 ** (1.0 / cfg.trend_half_life) if cfg.trend_half_life else 0.0
    fresh = int(new["changes"]) != int(state["changes"])
    y = float(np.log(np.median(lengths)))
    term = np.array([1.0, step, step * step, y, step * y, y * y])
    new["trend_s"] = term + (0.0 if fresh else lam_tr) * state["trend_s"]

    # 4) pass counts: every rung's histogram is discounted, the observed rung's gains the step.
    k = (rewards > cfg.pass_threshold).sum(-1)
    new["pass_hist"] = lam * state["pass_hist"]
    new["pass_hist"][i_g, : g + 1] += np.bincount(k, minlength=g + 1)

    # 5) per-shape timing EMAs and λ's sums (only when the step was timed).
    if obs.decode_steps > 0 and obs.decode_s > 0:
        lam_r = 0.5 ** (1.0 / cfg.rate_half_life)
        sec = float(obs.decode_s) + max(float(obs.prefill_s), 0.0)
        ben = realised_benefit(rewards, cfg.pass_threshold)
        new["rate_s"] = lam_r * state["rate_s"] + np.array([ben, sec])
        new["total_s"] = state["total_s"] + np.array([ben, sec])
        lam = 0.5 ** (1.0 / cfg.half_life)
        new["rate_now"] = lam * state["rate_now"] + np.array([ben, sec, 1.0])
        per_step = float(obs.decode_s) / int(obs.decode_steps)
        pre = max(float(obs.prefill_s), 0.0)
        a = cfg.cost_ema if state["measured"][i_g] else 1.0
        new["decode_step_s"][i_g] = (1 - a) * state["decode_step_s"][i_g] + a * per_step
        new["prefill_s"][i_g] = (1 - a) * state["prefill_s"][i_g] + a * pre
        new["measured"][i_g] = True

    # 6) bookkeeping, then the expected decode steps at every g for the next choose().
    new["prompts"] = np.array(obs.prompts or p_groups, np.int64)
    new["max_new_tokens"] = np.array(max_new, np.int64)
    new["decode_chunk"] = np.array(max(int(obs.decode_chunk), 1), np.int64)
    new["g_idx"] = np.array(i_g, np.int64)
    new["step"] = np.array(step + 1, np.int64)
    new["exp_steps"] = expected_decode_steps(cfg, new, rng)
    return new


def _detect_change(cfg: SAGCConfig, old: State, new: State, i_g: int) -> None:
    """Change detection (in place on ``new``), a windowed generalised likelihood-ratio test.

    For the last 1, 2, 4, ... steps (up to change_window), compare the window's own sums with
    the long-memory sums of the previous state (a two-sample test, so a memory that just
    restarted and holds little evidence does not trigger again on noise): the per-row truncation
    rate, and the risk of every rung <= the observed G (exact subsets, not extrapolation). On a
    change (largest LLR > change_threshold) the long-memory statistics restart from the
    triggering window's sums alone and the length model reads only rows since that window began,
    so the controller follows a new regime within a few steps, yet averages long within one.
    """
    if cfg.change_threshold <= 0 or int(old["step"]) < cfg.warmup_steps:
        new["last_llr"] = np.array(0.0)
        return
    reg_a, reg_n = old["risk_a"], old["risk_a"] + old["risk_b"]
    reg_rows, reg_tr = old["trunc_s"]
    # Windows never reach back past the last change: that data belongs to the old regime.
    age = int(old["step"]) - int(old["change_step"]) + 1
    filled = min(age, cfg.change_window)
    best, best_w = 0.0, 0
    w = 1
    while w <= filled:
        a, n = new["hist_a"][:w].sum(0), new["hist_n"][:w].sum(0)
        rows, trunc, _ = new["hist_tr"][:w].sum(0)
        # The regime's sums without the window's earlier steps (they are in ``old`` already;
        # their small discount is ignored), so the two samples do not overlap.
        ra = np.maximum(reg_a - new["hist_a"][1:w].sum(0), 0.0)
        rn = np.maximum(reg_n - new["hist_n"][1:w].sum(0), ra)
        r_rows, r_tr, _ = new["hist_tr"][1:w].sum(0)
        r_rows, r_tr = max(reg_rows - r_rows, 0.0), max(reg_tr - r_tr, 0.0)
        llr = max(
            float(binom_llr2(a, n, ra, rn)[: i_g + 1].max()),
            float(binom_llr2(trunc, rows, r_tr, max(r_rows, r_tr))),
        )
        if llr > best:
            best, best_w = llr, w
        w *= 2
    new["last_llr"] = np.array(best)
    if best > cfg.change_threshold:
        a, n = new["hist_a"][:best_w].sum(0), new["hist_n"][:best_w].sum(0)
        new["risk_a"], new["risk_b"] = a, n - a
        rows_w, trunc_w, groups_w = new["hist_tr"][:best_w].sum(0)
        new["trunc_s"] = np.array([rows_w, trunc_w])
        new["changes"] = np.array(int(old["changes"]) + 1, np.int64)
        new["change_step"] = np.array(int(old["step"]) + 1 - best_w, np.int64)
        # The length model forgets the old regime too: it reads only rows since the window.
        untruncated = int(rows_w - trunc_w)  # the residual ring holds untruncated rows only
        new["rows_since"] = np.array(max(int(new["rows_seen"]) - untruncated, 0), np.int64)
        new["groups_since"] = np.array(max(int(new["groups_seen"]) - int(groups_w), 0), np.int64)


def choose(cfg: SAGCConfig, state: State) -> tuple[int, dict[str, Any]]:
    """Next group size and diagnostics. Pure and deterministic (no randomness).

    score(g) = V * J(g) - Q * risk(g), J the normalised objective (``objective``: rate,
    (benefit - λ·cost) / max benefit; ratio, (benefit/cost) / max (benefit/cost)); eligible g are
    those within max_rung_step of the current G and (hard_filter) with risk(g) <= delta. The
    choice is the best-scoring eligible g, or (tie_margin > 0) the largest feasible one scoring
    within tie_margin of it.
    """
    sizes = np.array(cfg.group_sizes)
    n = len(sizes)
    cur = int(state["g_idx"])
    risk = posterior_risk(cfg, state)
    cost = predicted_cost(cfg, state)
    benefit = predicted_benefit(cfg, state)
    ratio = benefit / np.maximum(cost, 1e-12)
    lam_rate = benefit_rate(cfg, state, benefit, cost)
    if cfg.objective == "rate":
        # Benefit/s over the run is a ratio of sums: a step adds benefit - λ·seconds to it
        # (Dinkelbach). Scaled by the largest benefit so V stays dimensionless.
        j = (benefit - lam_rate * cost) / max(float(benefit.max()), 1e-12)
    else:
        j = ratio / ratio.max() if ratio.max() > 0 else np.zeros(n)
    q = float(state["queue"])
    score = cfg.V * j - q * risk
    # The budget is a long-run average: credit saved in light phases raises the per-step cap,
    # to be spent over about credit_horizon steps (0 credit: the cap is delta).
    cap = cfg.delta + float(state["credit"]) / cfg.credit_horizon
    feasible = risk <= cap
    if cfg.floor_on_mean:
        # The quantile guards moves *up* into rungs we know little about; below the smallest
        # rung there is nothing safer, so it is feasible when its risk is, on the mean.
        feasible[0] = posterior_risk(cfg, state, mean=True)[0] <= cap
    step = cfg.max_rung_step or n
    # max_rung_step limits moves up only: a larger rung is tried one step at a time, but a rung
    # that has become too risky is left at once.
    reach = (np.arange(n) - cur) <= step
    eligible = np.zeros(n, bool)  # stays empty when no score decision is made
    if int(state["step"]) < cfg.warmup_steps:
        idx, reason = sizes.tolist().index(cfg.initial_group_size), "warmup"
    elif not feasible.any():
        idx, reason = 0, "no_feasible"  # the smallest g, held
    else:
        eligible = reach & feasible if cfg.hard_filter else reach.copy()
        top = int(np.flatnonzero(feasible).max()) + 1
        if cfg.share_budget and top < n:
            # Spend unused budget: the rung just above the feasible ones competes on score, so
            # the queue time-shares the two rungs that bracket delta (the optimal stationary
            # constrained policy) instead of leaving budget unused.
            eligible[top] = reach[top]
        if eligible.any():
            masked = np.where(eligible, score, -np.inf)
            idx, reason = int(np.argmax(masked)), "score"
            if cfg.tie_margin > 0:
                # Near-ties go to the larger rung: its groups are exact evidence for every
                # smaller rung, and rare loops otherwise flip a 4-vs-8 tie from step to step.
                # Feasible rungs only: the budget-sharing rung is the queue's to time-share.
                near = (masked >= masked.max() - cfg.tie_margin) & feasible
                idx = max(idx, int(np.flatnonzero(near).max())) if near.any() else idx
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
        "risk_cap": cap,
        "benefit_rate": lam_rate,
        "feasible": feasible.tolist(),
        "reachable": reach.tolist(),
        "eligible": eligible.tolist(),
    }
    return int(sizes[idx]), info


def record_choice(state: State, info: dict[str, Any]) -> State:
    """Store the last decision's diagnostics in the state (pure)."""
    new = dict(state)
    new["last_choice"] = np.array(info["group_sizes"].index(info["g"]), np.int64)
    new["last_reason"] = np.array(REASONS.index(info["reason"]), np.int64)
    new["last_score"] = np.asarray(info["score"], np.float64)
    return new


def normalize_state(cfg: SAGCConfig, restored: dict[str, Any]) -> State:
    """Coerce a restored pytree (numpy scalars / jax arrays) back to the exact state layout."""
    ref = init_state(cfg)
    if set(restored) != set(ref):
        missing, extra = sorted(set(ref) - set(restored)), sorted(set(restored) - set(ref))
        raise ValueError(
            f"SAGC state keys mismatch: missing {missing}, unexpected {extra} (a checkpoint "
            "written by another controller version; resume it with that version, or start "
            "the controller afresh)"
        )
    out = {}
    for k, v in ref.items():
        arr = np.array(restored[k], dtype=v.dtype)
        if arr.shape != v.shape:
            raise ValueError(f"SAGC state {k!r}: shape {arr.shape}, expected {v.shape}")
        out[k] = arr
    return out

