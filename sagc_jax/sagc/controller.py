"""SAGC controller: pure host-side state + update functions (DESIGN.md §5; math in docs/sagc.md).

The controller is tiny and runs on the host in numpy. Its whole state is a flat ``dict`` of numpy
arrays with static shapes (a pytree that round-trips through Orbax ``StandardSave/Restore``).
Every random draw comes from ``numpy.random.default_rng((seed, step, salt))``, so decisions are a
deterministic function of (config, state, observations).

Public pieces:
  * ``SAGCConfig`` — the ``sagc:`` config section (declared in ``sagc_jax.sagc.config``).
  * ``Observation`` — what one training step saw (lengths/truncated/rewards per row, timings).
  * ``init_state`` / ``observe`` / ``choose`` / ``record_choice`` — pure functions.
  * ``SAGCPolicy`` / ``StaticPolicy`` / ``make_policy`` — stateful wrappers for the trainer.
  * ``prompts_for`` — the batch policy (prompts per step at group size g).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sagc_jax.sagc.betaq import beta_quantile
from sagc_jax.sagc.config import SAGCConfig, risk_level

State = dict[str, np.ndarray]

# Reason codes stored in the state (strings are not pytree leaves).
REASONS: tuple[str, ...] = ("init", "warmup", "score", "no_feasible", "toward_feasible", "static")
_SALT_OBSERVE = 0x5A6C


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def prompts_for(cfg: SAGCConfig, g: int, prompts_per_step: int) -> int:
    """Prompts per step at group size ``g``: fixed B ("prompts") or rollouts_per_step // g."""
    if cfg.batch_policy == "prompts":
        return int(prompts_per_step)
    n = cfg.rollouts_per_step
    if n is None or n % g:
        raise ValueError(f"sagc.rollouts_per_step: must be divisible by group size {g}, got {n!r}")
    return n // g


# --------------------------------------------------------------------------------------------
# Observation + event definition
# --------------------------------------------------------------------------------------------


@dataclass
class Observation:
    """One step's rollouts. Rows are prompt-major: row r belongs to group r // group_size.

    lengths: int [rows], generated tokens incl. EOS; truncated: bool [rows] (hit max_new_tokens);
    rewards: float [rows]; prefill_s / decode_s: seconds; decode_steps: decode steps run
    (a multiple of decode_chunk). Timings <= 0 mean "not measured" (e.g. a compile step).
    """

    group_size: int
    lengths: np.ndarray
    truncated: np.ndarray
    rewards: np.ndarray
    max_new_tokens: int
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    rows: int = 0  # 0 = len(lengths)
    prompts: int = 0  # 0 = rows // group_size
    decode_chunk: int = 1


def straggler_events(
    lengths: np.ndarray, truncated: np.ndarray, tau: float, count_truncated: bool
) -> np.ndarray:
    """Straggler event per group. lengths/truncated: [..., g] -> bool [...].

    Event: ``max L > tau * median L`` (numpy median: mean of the two middle values for even g),
    or, when ``count_truncated``, any member truncated.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    ev = lengths.max(-1) > tau * np.median(lengths, axis=-1)
    if count_truncated:
        ev = ev | np.asarray(truncated, dtype=bool).any(-1)
    return ev


def step_straggler_rate(cfg: SAGCConfig, obs: Observation) -> float:
    """Fraction of the step's groups with a straggler event (the constrained quantity s_t)."""
    g = int(obs.group_size)
    lengths = np.asarray(obs.lengths).reshape(-1, g)
    truncated = np.asarray(obs.truncated, dtype=bool).reshape(-1, g)
    return float(straggler_events(lengths, truncated, cfg.tau, cfg.count_truncated).mean())


def hypergeom_none(n: int, k: np.ndarray, g: int) -> np.ndarray:
    """P(a uniform random g-subset of n items, k of them marked, contains no marked item).

    = C(n-k, g) / C(n, g) = prod_{i<g} (n-k-i)/(n-i); k: int [...] -> float [...]. Requires g<=n.
    """
    k = np.asarray(k, dtype=np.float64)
    p = np.ones_like(k)
    for i in range(g):
        p = p * np.clip((n - k - i) / (n - i), 0.0, None)
    return p


def counterfactual_risk(
    lengths: np.ndarray,
    truncated: np.ndarray,
    g: int,
    *,
    tau: float,
    count_truncated: bool,
    rng: np.random.Generator,
    mc: int,
    pool_eps: np.ndarray,
    trunc_rate: float,
    max_new_tokens: int,
) -> np.ndarray:
    """P(straggler event) for a group of size g, estimated from each observed group.

    lengths, truncated: [P, G] observed groups. Returns float [P].

    g <= G: the truncation part is exact (hypergeometric); the tau-ratio part, conditioned on the
    subset holding no truncated row, is a Monte-Carlo average over ``mc`` uniform g-subsets of the
    untruncated rows (exact when g == G). g > G: each group is extended by g - G rows of the
    "median x residual" model: residuals ``pool_eps`` [N] of recent untruncated rows (length /
    group median) times this group's median, and a per-row truncation rate ``trunc_rate``
    (applied analytically when count_truncated, i.e. Rao-Blackwellised; sampled otherwise).
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    truncated = np.asarray(truncated, dtype=bool)
    p_groups, big_g = lengths.shape
    if g == big_g:
        return straggler_events(lengths, truncated, tau, count_truncated).astype(np.float64)
    if g < big_g:
        keys = rng.random((mc, p_groups, big_g))
        if count_truncated:
            keys = keys + 2.0 * truncated[None]  # untruncated rows sort first
        idx = np.argsort(keys, axis=-1)[..., :g]
        sub = np.take_along_axis(np.broadcast_to(lengths, keys.shape), idx, axis=-1)
        ratio = (sub.max(-1) > tau * np.median(sub, axis=-1)).mean(0)
        if not count_truncated:
            return ratio
        p_none = hypergeom_none(big_g, truncated.sum(-1), g)
        return (1.0 - p_none) + p_none * ratio
    # g > G: extend every group with g - G model rows.
    extra = g - big_g
    cap = float(max_new_tokens)
    med = np.maximum(np.median(lengths, axis=-1), 1.0)  # [P]
    new_len = med[None, :, None] * pool_eps[rng.integers(0, len(pool_eps), (mc, p_groups, extra))]
    new_tr = new_len >= cap  # a long residual on a long prompt can itself hit the cap
    if not count_truncated:
        new_tr = new_tr | (rng.random(new_len.shape) < trunc_rate)
    new_len = np.where(new_tr, cap, np.maximum(np.ceil(new_len), 1.0))
    full_len = np.concatenate([np.broadcast_to(lengths, (mc, p_groups, big_g)), new_len], -1)
    full_tr = np.concatenate([np.broadcast_to(truncated, (mc, p_groups, big_g)), new_tr], -1)
    ev = straggler_events(full_len, full_tr, tau, count_truncated).mean(0)
    if not count_truncated:
        return ev
    # P(event) = 1 - P(no truncation among the extra rows) * P(no other event).
    return 1.0 - (1.0 - trunc_rate) ** extra * (1.0 - ev)


# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------


def init_state(cfg: SAGCConfig) -> State:
    """Fresh controller state: a flat dict of numpy arrays with static shapes (K candidates)."""
    k = len(cfg.group_sizes)
    f64 = np.float64
    return {
        "step": np.array(0, np.int64),  # observations folded in so far (also the RNG counter)
        "seed": np.array(cfg.seed, np.int64),
        "g_idx": np.array(cfg.group_sizes.index(cfg.initial_group_size), np.int64),
        "queue": np.array(0.0, f64),  # virtual queue Q
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
        "pass_s": np.zeros(3, f64),  # discounted sums: groups, E[p] est., E[p^2] est.
        "eps_ring": np.ones(cfg.window_rows, f64),  # untruncated row length / its group median
        "trunc_s": np.zeros(2, f64),  # discounted sums: rows, truncated rows
        "rows_seen": np.array(0, np.int64),
        "med_ring": np.ones(cfg.window_groups, f64),  # recent group medians (tokens)
        "groups_seen": np.array(0, np.int64),
        "last_reason": np.array(0, np.int64),  # index into REASONS
        "last_choice": np.array(-1, np.int64),
        "last_score": np.zeros(k, f64),
    }


def _ring_put(ring: np.ndarray, seen: int, values: np.ndarray) -> np.ndarray:
    """Write ``values`` into a ring buffer after ``seen`` total writes (keeps the newest)."""
    ring = ring.copy()
    pos = (seen + np.arange(len(values))) % len(ring)
    n = min(len(values), len(ring))
    ring[pos[len(values) - n :]] = values[len(values) - n :]
    return ring


def _ring_view(ring: np.ndarray, seen: int) -> np.ndarray:
    """Valid entries of a ring buffer (order irrelevant: used for bootstrap draws)."""
    return ring[: min(int(seen), len(ring))]


def _batch_prompts(cfg: SAGCConfig, state: State) -> np.ndarray:
    """Prompts per step B(g) for every candidate: int [K]."""
    b = max(int(state["prompts"]), 1)
    return np.array([prompts_for(cfg, g, b) for g in cfg.group_sizes], np.int64)


def truncation_rate(state: State) -> float:
    """Per-row truncation rate from discounted counts.

    Prior: 0.1 pseudo-truncations in 1 pseudo-row. Truncations are rare (~1e-3/row), so a
    Jeffreys 0.5 would bias the rate (and the cost of large g) upward by 0.5 / effective rows.
    """
    rows, trunc = state["trunc_s"]
    return float((trunc + 0.1) / (rows + 1.0))


def expected_decode_steps(
    cfg: SAGCConfig, state: State, rng: np.random.Generator, mc: int = 64
) -> np.ndarray:
    """E[decode steps] at each candidate g: float [K].

    A batch at g has n = B(g)*g rows. E[steps] = P_tr(n) * cap + (1 - P_tr(n)) * E[max | none
    truncated], with P_tr(n) = 1 - (1 - p_tr)^n analytic (rare loops dominate the tail; sampling
    them would be noisy) and the untruncated max bootstrapped: B(g) medians drawn from recent
    group medians, g residuals each from recent untruncated rows. Steps are rounded up to
    decode_chunk; common random numbers across candidates keep their comparison low-noise.
    """
    eps = _ring_view(state["eps_ring"], state["rows_seen"])
    eps = eps if len(eps) else np.ones(1)
    meds = _ring_view(state["med_ring"], state["groups_seen"])
    chunk = float(max(int(state["decode_chunk"]), 1))
    cap = math.ceil(float(state["max_new_tokens"]) / chunk) * chunk
    p_tr = truncation_rate(state)
    bs = _batch_prompts(cfg, state)
    gmax, bmax = max(cfg.group_sizes), int(bs.max())
    m = meds[rng.integers(0, len(meds), size=(mc, bmax, 1))]
    lens = np.ceil(m * eps[rng.integers(0, len(eps), size=(mc, bmax, gmax))])
    out = np.empty(len(cfg.group_sizes))
    for i, (g, b) in enumerate(zip(cfg.group_sizes, bs)):
        mx = lens[:, :b, :g].max(axis=(1, 2))
        untr = np.minimum(np.ceil(mx / chunk) * chunk, cap).mean()
        p_any = 1.0 - (1.0 - p_tr) ** (int(b) * g)
        out[i] = p_any * cap + (1.0 - p_any) * untr
    return out


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
    new["queue"] = np.array(max(0.0, float(state["queue"]) + excess))

    # 2) the "median x residual" length model: recent untruncated residuals, group medians,
    #    and a discounted per-row truncation rate.
    med = np.median(lengths, axis=-1)
    eps = (lengths / med[:, None])[~truncated]
    seen = int(state["rows_seen"])
    if len(eps):
        new["eps_ring"] = _ring_put(state["eps_ring"], seen, eps)
        new["rows_seen"] = np.array(seen + len(eps), np.int64)
    lam_len = 0.5 ** (1.0 / cfg.length_half_life)
    new["trunc_s"] = lam_len * state["trunc_s"] + np.array([rows, truncated.sum()], np.float64)
    gseen = int(state["groups_seen"])
    new["med_ring"] = _ring_put(state["med_ring"], gseen, med)
    new["groups_seen"] = np.array(gseen + p_groups, np.int64)
    pool_eps = _ring_view(new["eps_ring"], new["rows_seen"])
    if len(pool_eps) == 0:  # nothing untruncated seen yet: residual 1 (tight groups)
        pool_eps = np.ones(1)
    p_tr = truncation_rate(new)

    # 3) counterfactual risk for every candidate, folded into discounted Beta pseudo-counts.
    #    A group of G rows carries ~G/g groups' worth of evidence about size g > G.
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
        w = min(1.0, g / gc)
        new["risk_a"][i] = lam * state["risk_a"][i] + w * r.sum()
        new["risk_b"][i] = lam * state["risk_b"][i] + w * (1.0 - r).sum()
        new["risk_last"][i] = r.mean()

    # 4) pass-rate moments: unbiased per-group estimates of E[p] and E[p^2] (any G >= 2).
    k = (rewards > cfg.pass_threshold).sum(-1).astype(np.float64)
    s = np.array([p_groups, (k / g).sum(), (k * (k - 1) / (g * (g - 1))).sum()])
    new["pass_s"] = lam * state["pass_s"] + s

    # 5) per-shape timing EMAs (only when the step was timed).
    i_g = sizes.index(g)
    if obs.decode_steps > 0 and obs.decode_s > 0:
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


# --------------------------------------------------------------------------------------------
# Risk, cost, benefit, decision
# --------------------------------------------------------------------------------------------


def posterior_risk(cfg: SAGCConfig, state: State) -> np.ndarray:
    """Risk per candidate: Beta posterior mean or upper quantile. float [K]."""
    a = cfg.prior_a + state["risk_a"]
    b = cfg.prior_b + state["risk_b"]
    q = risk_level(cfg.risk)
    if q is None:
        return a / (a + b)
    return beta_quantile(q, a, b)


def _interp_rows(rows: np.ndarray, measured: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per-shape value: measured EMA where available, else a least-squares line in rows.

    0 measured shapes -> NaN (caller substitutes); 1 -> flat (optimistic: the accelerator case;
    a larger shape gets measured once tried); >=2 -> linear fit, floored at half the smallest
    measured value so a noisy negative slope cannot make a shape look free.
    """
    out = np.full(len(rows), np.nan)
    if not measured.any():
        return out
    xr, yr = rows[measured].astype(np.float64), values[measured]
    if len(np.unique(xr)) >= 2:
        slope, icpt = np.polyfit(xr, yr, 1)
        fit = np.maximum(icpt + slope * rows, 0.5 * yr.min())
    else:
        fit = np.full(len(rows), yr.mean())
    return np.where(measured, values, fit)


def predicted_cost(cfg: SAGCConfig, state: State) -> np.ndarray:
    """Predicted rollout seconds per step at each g: prefill(rows_g) + E[steps_g] x t_dec(rows_g).

    Without any timing yet, t_dec = 1 and prefill = 0 (cost in decode-step units).
    """
    rows = _batch_prompts(cfg, state) * np.array(cfg.group_sizes)
    meas = state["measured"]
    pre = np.nan_to_num(_interp_rows(rows, meas, state["prefill_s"]), nan=0.0)
    dec = np.nan_to_num(_interp_rows(rows, meas, state["decode_step_s"]), nan=1.0)
    steps = state["exp_steps"]
    if not (steps > 0).all():
        steps = np.full(len(rows), float(max(int(state["max_new_tokens"]), 1)))
    return pre + steps * dec


def pass_rate_beta(state: State) -> tuple[float, float]:
    """Method-of-moments Beta(a, b) over per-prompt pass rates (prior: Beta(1,1) as 2 groups)."""
    s0, s1, s2 = state["pass_s"] + np.array([2.0, 1.0, 2.0 / 3.0])
    m = float(np.clip(s1 / s0, 1e-4, 1 - 1e-4))
    var = float(np.clip(s2 / s0 - m * m, 1e-6, m * (1 - m) * (1 - 1e-3)))
    nu = m * (1 - m) / var - 1.0
    return m * nu, (1 - m) * nu


def benefit_per_prompt(g: int, a: float, b: float) -> float:
    """E_p[P(rewards not all equal | g)] x (1 - 1/g) with p ~ Beta(a, b).

    E[p^g] = B(a+g, b)/B(a, b) (closed form via lgamma), likewise E[(1-p)^g].
    """
    lg = math.lgamma

    def moment(x: float, y: float) -> float:
        return math.exp(lg(x + g) + lg(x + y) - lg(x) - lg(x + y + g))

    return max(0.0, 1.0 - moment(a, b) - moment(b, a)) * (1.0 - 1.0 / g)


def predicted_benefit(cfg: SAGCConfig, state: State) -> np.ndarray:
    """Expected informative-group benefit per step at each g: B(g) x benefit_per_prompt. [K]"""
    a, b = pass_rate_beta(state)
    bs = _batch_prompts(cfg, state)
    return np.array([bs[i] * benefit_per_prompt(g, a, b) for i, g in enumerate(cfg.group_sizes)])


def choose(cfg: SAGCConfig, state: State) -> tuple[int, dict[str, Any]]:
    """Next group size and diagnostics. Pure and deterministic (no randomness).

    score(g) = V * J(g) - Q * risk(g), J = (benefit/cost) / max (benefit/cost); eligible g are
    those within max_rung_step of the current G and (hard_filter) with risk(g) <= delta.
    """
    sizes = np.array(cfg.group_sizes)
    n = len(sizes)
    cur = int(state["g_idx"])
    risk = posterior_risk(cfg, state)
    cost = predicted_cost(cfg, state)
    benefit = predicted_benefit(cfg, state)
    ratio = benefit / np.maximum(cost, 1e-12)
    j = ratio / ratio.max() if ratio.max() > 0 else np.zeros(n)
    q = float(state["queue"])
    score = cfg.V * j - q * risk
    feasible = risk <= cfg.delta
    step = cfg.max_rung_step or n
    reach = np.abs(np.arange(n) - cur) <= step
    if int(state["step"]) < cfg.warmup_steps:
        idx, reason = sizes.tolist().index(cfg.initial_group_size), "warmup"
    elif not feasible.any():
        idx, reason = max(0, cur - step), "no_feasible"  # descend to, then hold, the smallest g
    else:
        eligible = reach & feasible if cfg.hard_filter else reach.copy()
        top = int(np.flatnonzero(feasible).max()) + 1
        if cfg.share_budget and top < n:
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
            idx, reason = cur + int(np.clip(target - cur, -step, step)), "toward_feasible"
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
        "feasible": feasible.tolist(),
        "reachable": reach.tolist(),
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
        raise ValueError(f"SAGC state keys mismatch: {sorted(set(restored) ^ set(ref))}")
    out = {}
    for k, v in ref.items():
        arr = np.array(restored[k], dtype=v.dtype)
        if arr.shape != v.shape:
            raise ValueError(f"SAGC state {k!r}: shape {arr.shape}, expected {v.shape}")
        out[k] = arr
    return out


# --------------------------------------------------------------------------------------------
# Stateful wrappers (the trainer's interface)
# --------------------------------------------------------------------------------------------


class SAGCPolicy:
    """Adaptive group size. ``choose() -> g``; after the step, ``observe(obs) -> metrics``."""

    def __init__(self, cfg: SAGCConfig):
        self.cfg = cfg.validate()
        self.state: State = init_state(cfg)
        self.last_info: dict[str, Any] | None = None

    def choose(self) -> int:
        g, info = choose(self.cfg, self.state)
        self.state = record_choice(self.state, info)
        self.last_info = info
        return g

    def observe(self, obs: Observation) -> dict[str, Any]:
        self.state = observe(self.cfg, self.state, obs)
        risk = posterior_risk(self.cfg, self.state)
        metrics: dict[str, Any] = {
            "straggler_rate": float(self.state["last_rate"]),
            "sagc_queue": float(self.state["queue"]),
            "sagc_reason": REASONS[int(self.state["last_reason"])],
        }
        for g, r in zip(self.cfg.group_sizes, risk):
            metrics[f"risk_g{g}"] = float(r)
        return metrics

    def load_state(self, state: dict[str, Any]) -> None:
        self.state = normalize_state(self.cfg, state)


class StaticPolicy:
    """Always ``initial_group_size``; same interface and straggler-rate metric as SAGCPolicy."""

    def __init__(self, cfg: SAGCConfig):
        self.cfg = cfg.validate()
        self.state: State = init_state(cfg)
        self.last_info: dict[str, Any] | None = None

    def choose(self) -> int:
        self.last_info = {"g": self.cfg.initial_group_size, "reason": "static"}
        return self.cfg.initial_group_size

    def observe(self, obs: Observation) -> dict[str, Any]:
        rate = step_straggler_rate(self.cfg, obs)
        self.state = dict(self.state)
        self.state["step"] = np.array(int(self.state["step"]) + 1, np.int64)
        self.state["last_rate"] = np.array(rate)
        return {"straggler_rate": rate, "sagc_queue": 0.0, "sagc_reason": "static"}

    def load_state(self, state: dict[str, Any]) -> None:
        self.state = normalize_state(self.cfg, state)


def make_policy(cfg: SAGCConfig) -> SAGCPolicy | StaticPolicy:
    """SAGCPolicy when ``cfg.enabled`` else StaticPolicy."""
    return SAGCPolicy(cfg) if cfg.enabled else StaticPolicy(cfg)
