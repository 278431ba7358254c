"""One small pure update per SAGC sub-model; ``controller.observe`` composes them.

Each takes the sub-model's sub-state (``state.py``: a NamedTuple of numpy arrays with static
shapes) and one step's observation, and returns a new sub-state built with ``_replace`` (inputs
are never written: an array to be changed in place is copied first). ``consts``: the
controller's constants (``SAGCConstants``; None = the shipped ones, ``sagc_constants.resolve``).
Shapes: K rungs (``sagc.group_sizes``), one step of P groups of G rows (``lengths``,
``truncated``, ``rewards``: [P, G], lengths in tokens floored at 1). The math is in docs/sagc.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sagc_jax.config.sagc_constants import SAGCConstants, resolve
from sagc_jax.sagc.estimators import (
    binom_llr2,
    realised_benefit,
    recent_since,
    ring_put,
    ring_view,
    truncation_rate,
)
from sagc_jax.sagc.events import Observation, counterfactual_risk, counterfactual_tail_share
from sagc_jax.sagc.state import Benefit, Budget, Change, Cost, Length, Risk
from sagc_jax.sagc.timing import chunked_decode_steps


def budget_update(
    budget: Budget,
    rate: float,
    delta: float | None,
    held: bool,
    consts: SAGCConstants | None = None,
) -> Budget:
    """The virtual queue Q and the saved credit (both in units of the straggler cost x steps).

    ``rate``: this step's mean straggler cost s_t (unitless). One signed balance: debt is the
    queue, savings (up to the constant ``credit_cap``) are credit. ``held``: the step ran on a
    "no_feasible" decision, at the most conservative g there is; debt accrued then could only be
    repaid by over-throttling once the tail lightens, so the queue does not grow (it drains).
    ``delta`` None (no budget): only ``last_rate`` is recorded; queue and credit stay 0.
    """
    new = budget._replace(last_rate=np.array(rate))
    if delta is None:
        return new
    excess = min(rate - delta, 0.0) if held else rate - delta
    balance = min(float(budget.credit) - float(budget.queue) - excess, resolve(consts).credit_cap)
    return new._replace(queue=np.array(max(0.0, -balance)), credit=np.array(max(0.0, balance)))


def length_update(
    length: Length,
    lengths: np.ndarray,
    truncated: np.ndarray,
    lam_len: float,
    consts: SAGCConstants | None = None,
) -> tuple[Length, np.ndarray, float]:
    """The "median x residual" length model: residual ring (untruncated row length / its group
    median, unitless), group-median ring (tokens), discounted (factor ``lam_len`` per step) and
    run-long per-row truncation sums [rows, truncated rows], and this step's row of ``hist_tr``
    [rows, truncated rows, groups] for change detection.

    Returns (new sub-state, the residual pool the risk model extends groups with [N], the per-row
    truncation rate in the current regime).
    """
    p_groups, _ = lengths.shape
    rows = lengths.size
    med = np.median(lengths, axis=-1)
    eps = (lengths / med[:, None])[~truncated]
    seen = int(length.rows_seen)
    new = length
    if len(eps):
        new = new._replace(eps_ring=ring_put(length.eps_ring, seen, eps),
                           rows_seen=np.array(seen + len(eps), np.int64))
    tr_step = np.array([rows, truncated.sum()], np.float64)
    hist_tr = np.roll(length.hist_tr, 1, axis=0)
    hist_tr[0] = [rows, truncated.sum(), p_groups]
    gseen = int(length.groups_seen)
    new = new._replace(
        trunc_s=lam_len * length.trunc_s + tr_step,
        trunc_total=length.trunc_total + tr_step,
        hist_tr=hist_tr,
        med_ring=ring_put(length.med_ring, gseen, med),
        groups_seen=np.array(gseen + p_groups, np.int64),
    )
    pool_eps = ring_view(new.eps_ring, new.rows_seen, recent_since(new, consts)[0])
    if len(pool_eps) == 0:  # nothing untruncated seen yet: residual 1 (tight groups)
        pool_eps = np.ones(1)
    return new, pool_eps, truncation_rate(new, consts)


def rung_cost(
    cfg: Any,
    lengths: np.ndarray,
    truncated: np.ndarray,
    g: int,
    rng: np.random.Generator,
    pool_eps: np.ndarray,
    trunc_rate: float,
    max_new: int,
    consts: SAGCConstants | None = None,
) -> np.ndarray:
    """Each observed group's expected straggler cost at size g under ``cfg.straggler``: P(event)
    (group_ratio) or E[tail share] (tail_share, a continuous cost read as fractional
    pseudo-counts). lengths/truncated [P, G] -> float [P]."""
    c = resolve(consts)
    kw = dict(rng=rng, mc=c.mc_samples, pool_eps=pool_eps, trunc_rate=trunc_rate)
    if cfg.straggler == "tail_share":
        return counterfactual_tail_share(lengths, g, max_new_tokens=max_new, **kw)
    return counterfactual_risk(
        lengths,
        truncated,
        g,
        tau=cfg.tau,
        count_truncated=c.count_truncated,
        max_new_tokens=max_new,
        **kw,
    )


def risk_update(
    cfg: Any,
    risk: Risk,
    lengths: np.ndarray,
    truncated: np.ndarray,
    rng: np.random.Generator,
    pool_eps: np.ndarray,
    p_tr: float,
    max_new: int,
    lam: float,
    consts: SAGCConstants | None = None,
) -> Risk:
    """Counterfactual risk of every rung, folded into discounted Beta pseudo-counts ``a`` / ``b``
    [K] (events / non-events, or tail shares / their complement), plus this step's own sums
    (row 0 of ``hist_a`` / ``hist_n`` [change_window, K]) and ``last`` [K] (diagnostic).

    A group of G rows extended by the length model to g > G rows carries (G/g)^p groups' worth
    of evidence about g (p the constant ``extrapolation_power``): G/g if the model were exact,
    less because it is not, so direct observations of g override it within a few steps. The
    draws come from ``rng`` in rung order (the controller's common random numbers).
    """
    g = lengths.shape[1]
    c = resolve(consts)
    power = c.extrapolation_power
    a, b, last = risk.a.copy(), risk.b.copy(), risk.last.copy()
    hist_a = np.roll(risk.hist_a, 1, axis=0)
    hist_n = np.roll(risk.hist_n, 1, axis=0)
    for i, gc in enumerate(cfg.group_sizes):
        r = rung_cost(cfg, lengths, truncated, gc, rng, pool_eps, p_tr, max_new, c)
        w = min(1.0, g / gc) ** power
        a[i] = lam * risk.a[i] + w * r.sum()
        b[i] = lam * risk.b[i] + w * (1.0 - r).sum()
        hist_a[0, i] = w * r.sum()
        hist_n[0, i] = w * len(r)
        last[i] = r.mean()
    return Risk(a=a, b=b, last=last, hist_a=hist_a, hist_n=hist_n)


def change_update(
    risk_old: Risk, risk: Risk, length_old: Length, length: Length, change: Change, i_g: int,
    step: int,
    consts: SAGCConstants | None = None,
) -> tuple[Risk, Length, Change]:
    """Change detection, a windowed generalised likelihood-ratio test.

    For the last 1, 2, 4, ... steps (up to the depth of ``hist_*``, ``change_window(cfg)`` at
    init), compare the window's
    own sums (``hist_*``, already holding this step) with the long-memory sums of the previous
    state (a two-sample test, so a memory that just restarted and holds little evidence does not
    trigger again on noise): the per-row truncation rate, and the risk of every rung <= the
    observed G (exact subsets, not extrapolation). On a change (largest LLR > change_threshold)
    the long-memory statistics restart from the triggering window's sums alone and the length
    model reads only rows since that window began, so the controller follows a new regime within
    a few steps, yet averages long within one. ``step``: the observation's index (0-based), only
    called after warm-up. Returns new (risk, length, change) sub-states.
    """
    c = resolve(consts)
    reg_a, reg_n = risk_old.a, risk_old.a + risk_old.b
    reg_rows, reg_tr = length_old.trunc_s
    # Windows never reach back past the last change: that data belongs to the old regime.
    age = step - int(change.change_step) + 1
    filled = min(age, len(risk.hist_a))
    hist_a, hist_n, hist_tr = risk.hist_a, risk.hist_n, length.hist_tr
    best, best_w = 0.0, 0
    w = 1
    while w <= filled:
        a, n = hist_a[:w].sum(0), hist_n[:w].sum(0)
        rows, trunc, _ = hist_tr[:w].sum(0)
        # The regime's sums without the window's earlier steps (they are in the old state
        # already; their small discount is ignored), so the two samples do not overlap.
        ra = np.maximum(reg_a - hist_a[1:w].sum(0), 0.0)
        rn = np.maximum(reg_n - hist_n[1:w].sum(0), ra)
        r_rows, r_tr, _ = hist_tr[1:w].sum(0)
        r_rows, r_tr = max(reg_rows - r_rows, 0.0), max(reg_tr - r_tr, 0.0)
        llr = max(
            float(binom_llr2(a, n, ra, rn)[: i_g + 1].max()),
            float(binom_llr2(trunc, rows, r_tr, max(r_rows, r_tr))),
        )
        if llr > best:
            best, best_w = llr, w
        w *= 2
    change = change._replace(last_llr=np.array(best))
    if best > c.change_threshold:
        a, n = hist_a[:best_w].sum(0), hist_n[:best_w].sum(0)
        risk = risk._replace(a=a, b=n - a)
        rows_w, trunc_w, groups_w = hist_tr[:best_w].sum(0)
        change = change._replace(changes=np.array(int(change.changes) + 1, np.int64),
                                 change_step=np.array(step + 1 - best_w, np.int64))
        # The length model forgets the old regime too: it reads only rows since the window.
        untruncated = int(rows_w - trunc_w)  # the residual ring holds untruncated rows only
        length = length._replace(
            trunc_s=np.array([rows_w, trunc_w]),
            rows_since=np.array(max(int(length.rows_seen) - untruncated, 0), np.int64),
            groups_since=np.array(max(int(length.groups_seen) - int(groups_w), 0), np.int64),
        )
    return risk, length, change


def trend_update(
    length: Length, trend_old: np.ndarray, lengths: np.ndarray, step: int, lam_tr: float
) -> Length:
    """The discounted sums ``trend_s`` [6] of 1, t, t², y, t·y, y² with y the log median length
    (tokens) of step t: the regression behind the length trend. ``lam_tr`` = 0 restarts them (a
    change was just detected: the trend lives within one regime)."""
    y = float(np.log(np.median(lengths)))
    term = np.array([1.0, step, step * step, y, step * y, y * y])
    return length._replace(trend_s=term + lam_tr * trend_old)


def benefit_update(
    benefit: Benefit,
    rewards: np.ndarray,
    i_g: int,
    lam: float,
    timed: tuple[float, float] | None,
    lam_r: float,
    consts: SAGCConstants | None = None,
) -> Benefit:
    """Pass counts and the realised benefit rate.

    ``pass_hist`` [K, max g + 1]: discounted (``lam``) count of groups with k passes (reward >
    the constant pass_threshold) per rung; the observed rung i_g gains the step's groups. When
    the step was timed (``timed`` = (benefit, seconds)): λ's sums ``rate_s`` [benefit, s]
    (discount ``lam_r``), ``total_s`` (run-long) and ``rate_now`` [benefit, s, steps] (``lam``).
    """
    g = rewards.shape[1]
    k = (rewards > resolve(consts).pass_threshold).sum(-1)
    pass_hist = lam * benefit.pass_hist
    pass_hist[i_g, : g + 1] += np.bincount(k, minlength=g + 1)
    new = benefit._replace(pass_hist=pass_hist)
    if timed is not None:
        ben, sec = timed
        new = new._replace(
            rate_s=lam_r * benefit.rate_s + np.array([ben, sec]),
            total_s=benefit.total_s + np.array([ben, sec]),
            rate_now=lam * benefit.rate_now + np.array([ben, sec, 1.0]),
        )
    return new


def cost_update(
    cost: Cost,
    obs: Observation,
    i_g: int,
    p_groups: int,
    timed: bool,
    consts: SAGCConstants | None = None,
    lam_fit: float = 1.0,
) -> Cost:
    """Per-shape EMAs (seconds: ``prefill_s``, ``decode_step_s`` per decode step, ``env_s``,
    [K]; weight of a new measurement the constant cost_ema, the first one taken as is) and
    the sums ``steps_fit`` of realised decode steps / ``longest_row_steps`` (discount
    ``lam_fit`` per step) when the step was ``timed``, and the step's shape facts (prompts,
    max_new_tokens, decode_chunk)."""
    new = cost
    if timed:
        per_step = float(obs.decode_s) / int(obs.decode_steps)
        pre = max(float(obs.prefill_s), 0.0)
        a = resolve(consts).cost_ema if cost.measured[i_g] else 1.0
        dec, pref, meas = cost.decode_step_s.copy(), cost.prefill_s.copy(), cost.measured.copy()
        env = cost.env_s.copy()
        dec[i_g] = (1 - a) * cost.decode_step_s[i_g] + a * per_step
        pref[i_g] = (1 - a) * cost.prefill_s[i_g] + a * pre
        env[i_g] += a * (max(float(obs.env_s), 0.0) - env[i_g])
        # Every step adds to one line in log rows (not a value per shape: a ratio is noisy per
        # step, and a shape tried once would keep its first draw); a single turn's y is exactly
        # 0, so its sums stay 0 and its factor exactly 1.
        x = math.log2(max(int(obs.rows) or len(obs.lengths), 1))
        y = int(obs.decode_steps) / longest_row_steps(obs) - 1.0
        fit = lam_fit * cost.steps_fit + np.array([1.0, x, x * x, y, x * y])
        meas[i_g] = True
        new = new._replace(decode_step_s=dec, prefill_s=pref, measured=meas, steps_fit=fit,
                           env_s=env)
    return new._replace(
        prompts=np.array(obs.prompts or p_groups, np.int64),
        max_new_tokens=np.array(int(obs.max_new_tokens), np.int64),
        decode_chunk=np.array(max(int(obs.decode_chunk), 1), np.int64),
    )


def longest_row_steps(obs: Observation) -> int:
    """Decode steps a single turn of this step would have run: its longest row, at most
    max_new_tokens, rounded up to a whole decode chunk (>= one chunk)."""
    steps = chunked_decode_steps(int(np.max(obs.lengths)), int(obs.max_new_tokens),
                                 obs.decode_chunk)
    return max(steps, max(int(obs.decode_chunk), 1))


def step_benefit(rewards: np.ndarray, consts: SAGCConstants | None = None,
                 form: str = "groups") -> float:
    """The step's realised benefit at the pass threshold under ``form`` (``SAGCConfig.benefit``;
    groups: informative groups x (1 - 1/g)). rewards: [P, g]."""
    return realised_benefit(rewards, resolve(consts).pass_threshold, form)
