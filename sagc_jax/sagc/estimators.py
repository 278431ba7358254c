"""SAGC estimators: what the controller's state predicts for every candidate g.

Risk (Beta posteriors per rung), cost (seconds per step from per-shape timings and the
"median x residual" length model), benefit (informative groups per step from a pass-rate
mixture refined from a Beta), the batch policy, and the ring buffers they read. Pure functions
of (config, state); the config is an ``SAGCConfig`` (typed loosely here to keep the import graph
acyclic), the state an ``SAGCState`` (``state.py``: one typed sub-state per sub-model) or, where
a function reads one sub-model only, that sub-state. The fixed internals
(priors, EM steps, memories) are :mod:`sagc_jax.config.sagc_constants`: every function that
reads one takes ``consts`` (an ``SAGCConstants``; None = the shipped ones, ``resolve``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy.special import betainc, betaincinv

from sagc_jax.config.sagc import risk_level
from sagc_jax.config.sagc_constants import SAGCConstants, resolve, trend_half_life, window_steps
from sagc_jax.sagc.state import Length, State
from sagc_jax.sagc.timing import TimeModel
from sagc_jax.shapes import prompts_for


def ring_put(ring: np.ndarray, seen: int, values: np.ndarray) -> np.ndarray:
    """Write ``values`` into a ring buffer after ``seen`` total writes (keeps the newest)."""
    ring = ring.copy()
    pos = (seen + np.arange(len(values))) % len(ring)
    n = min(len(values), len(ring))
    ring[pos[len(values) - n :]] = values[len(values) - n :]
    return ring


def ring_view(ring: np.ndarray, seen: int, since: int = 0) -> np.ndarray:
    """The valid entries of a ring buffer written after write number ``since`` (the last change
    point), newest last; all valid entries if none was written since. Used for bootstrap draws."""
    seen, cap = int(seen), len(ring)
    n = min(seen - int(since), cap)
    if n <= 0:
        n = min(seen, cap)
    return ring[(seen - n + np.arange(n)) % cap]


def recent_since(length: Length, consts: SAGCConstants | None = None) -> tuple[int, int]:
    """Where the length model's rings are read from: (rows, groups) write counts of the later of
    the last change and the start of the last ``window_steps`` steps (per-step counts from
    ``hist_tr``; the residual ring holds untruncated rows only)."""
    w = window_steps(len(length.hist_tr), consts)
    if w <= 0:
        return int(length.rows_since), int(length.groups_since)
    h = length.hist_tr[: min(w, len(length.hist_tr))]
    untruncated, groups = int((h[:, 0] - h[:, 1]).sum()), int(h[:, 2].sum())
    return (max(int(length.rows_since), int(length.rows_seen) - untruncated),
            max(int(length.groups_since), int(length.groups_seen) - groups))


def batch_prompts(cfg: Any, state: State) -> np.ndarray:
    """Prompts per step B(g) for every candidate: int [K]."""
    b = max(int(state.cost.prompts), 1)
    return np.array([prompts_for(cfg, g, b) for g in cfg.group_sizes], np.int64)


def _trunc_beta(length: Length, consts: SAGCConstants | None = None) -> tuple[float, float]:
    """Beta posterior (a, b) of the per-row truncation rate in the current regime.

    Prior: the whole run's pooled rate (itself with ``trunc_pooled_prior`` pseudo-counts),
    worth ``trunc_prior_rows`` rows (`sagc_constants`); empirical Bayes: a regime that has just
    begun is a priori like the run so far, not free of loops.
    """
    c = resolve(consts)
    all_rows, all_trunc = length.trunc_total
    p_a, p_n = c.trunc_pooled_prior
    p0 = (float(all_trunc) + p_a) / (float(all_rows) + p_n)
    rows, trunc = length.trunc_s
    a = float(trunc) + c.trunc_prior_rows * p0
    b = max(float(rows - trunc), 0.0) + c.trunc_prior_rows * (1.0 - p0)
    return a, b


def truncation_rate(length: Length, consts: SAGCConstants | None = None) -> float:
    """Per-row truncation rate (the length model's sub-state -> a probability): the posterior
    mean of ``_trunc_beta``."""
    a, b = _trunc_beta(length, consts)
    return a / (a + b)


def expected_decode_steps(
    cfg: Any,
    state: State,
    rng: np.random.Generator,
    mc: int | None = None,
    consts: SAGCConstants | None = None,
) -> np.ndarray:
    """E[decode steps] at each candidate g: float [K].

    A batch at g has n = B(g)*g rows. E[steps] = P_tr(n) * cap + (1 - P_tr(n)) * E[max | none
    truncated], with P_tr(n) = 1 - (1 - p_tr)^n analytic (rare loops dominate the tail; sampling
    them would be noisy) and the untruncated max bootstrapped: B(g) medians drawn from recent
    group medians, g residuals each from recent untruncated rows. Steps are rounded up to
    decode_chunk; common random numbers across candidates keep their comparison low-noise.
    `mc` bootstrap draws (None: the constant ``mc_samples``).
    """
    c = resolve(consts)
    mc = c.mc_samples if mc is None else mc
    ln, co = state.length, state.cost
    rows_from, groups_from = recent_since(ln, c)
    eps = ring_view(ln.eps_ring, ln.rows_seen, rows_from)
    eps = eps if len(eps) else np.ones(1)
    meds = ring_view(ln.med_ring, ln.groups_seen, groups_from)
    chunk = float(max(int(co.decode_chunk), 1))
    cap = math.ceil(float(co.max_new_tokens) / chunk) * chunk
    p_tr = truncation_rate(ln, c)
    bs = batch_prompts(cfg, state)
    gmax, bmax = max(cfg.group_sizes), int(bs.max())
    m = meds[rng.integers(0, len(meds), size=(mc, bmax, 1))]
    lens = np.ceil(m * eps[rng.integers(0, len(eps), size=(mc, bmax, gmax))])
    out = np.empty(len(cfg.group_sizes))
    for i, (g, b) in enumerate(zip(cfg.group_sizes, bs)):
        mx = lens[:, :b, :g].max(axis=(1, 2))
        untr = np.minimum(np.ceil(mx / chunk) * chunk, cap).mean()
        p_any = 1.0 - (1.0 - p_tr) ** (int(b) * g)
        out[i] = p_any * cap + (1.0 - p_any) * untr
    return out * steps_factor(cfg, state)


def steps_factor(cfg: Any, state: State) -> np.ndarray:
    """Realised decode steps per step / those of the longest row, per candidate: float [K], >= 1.

    1 for single turns (a step decodes until its longest row ends). An episode runs every turn to
    that turn's longest row, so its step costs more decode steps than its longest episode has
    tokens, the more so the more rows (issue 53): the discounted least-squares line of the ratio
    on log2(rows) over every step seen (``cost.steps_fit``; flat while one batch size has been
    seen: the optimistic guess a larger G then checks), never below 1.
    """
    w, sx, sxx, sy, sxy = (float(v) for v in state.cost.steps_fit)
    if w <= 0.0 or (sy == 0.0 and sxy == 0.0):
        return np.ones(len(cfg.group_sizes))  # single turns: exactly 1
    x = np.log2(np.maximum(batch_prompts(cfg, state) * np.array(cfg.group_sizes), 1))
    mx, my = sx / w, sy / w
    var = sxx / w - mx * mx
    slope = (sxy / w - mx * my) / var if var > 1e-9 else 0.0
    return np.maximum(1.0 + my + slope * (x - mx), 1.0)


def posterior_risk(
    cfg: Any, state: State, mean: bool = False, consts: SAGCConstants | None = None
) -> np.ndarray:
    """Risk per candidate: Beta posterior mean or upper quantile (``cfg.risk``; ``mean=True``
    forces the mean) of the discounted pseudo-counts ``state.risk.a`` / ``.b`` plus the
    Jeffreys prior. Probabilities (or mean tail shares), float [K]."""
    c = resolve(consts)
    a = c.prior_a + state.risk.a
    b = c.prior_b + state.risk.b
    q = None if mean else risk_level(cfg.risk)
    if q is None:
        return a / (a + b)
    return np.asarray(betaincinv(a, b, q), np.float64)


def _interp_rows(
    rows: np.ndarray, measured: np.ndarray, values: np.ndarray, floor_frac: float,
    per_row_below: bool = True,
) -> np.ndarray:
    """Per-shape value learned from the shapes run: measured EMA where available, else a line
    in rows.

    0 measured shapes -> NaN (caller substitutes); 1 -> flat above the measured shape
    (optimistic: the accelerator case; a larger shape gets measured once tried) and, with
    ``per_row_below``, proportional to rows below it, floored at ``floor_frac`` of it
    (optimistic there: the CPU case, where a row costs nearly its full price; flat below priced
    every smaller shape at the measured one's seconds, so a run started at its largest rung
    never left it); >=2 -> least-squares line, floored at ``floor_frac`` (the constant
    cost_floor_frac) of the smallest measured value so a noisy negative slope cannot make a
    shape look free.
    """
    out = np.full(len(rows), np.nan)
    if not measured.any():
        return out
    xr, yr = rows[measured].astype(np.float64), values[measured]
    if len(np.unique(xr)) >= 2:
        slope, icpt = np.polyfit(xr, yr, 1)
        fit = np.maximum(icpt + slope * rows, floor_frac * yr.min())
    else:
        share = np.clip(rows / xr[0], floor_frac, 1.0) if per_row_below else np.ones(len(rows))
        fit = yr.mean() * share
    return np.where(measured, values, fit)


def predicted_cost(cfg: Any, state: State, consts: SAGCConstants | None = None) -> np.ndarray:
    """Predicted rollout seconds per step at each g: prefill(rows_g) + E[steps_g] x t_dec(rows_g)
    (+ environment seconds(rows_g) for episodes timed on the measured clock).

    With ``timing: model`` the clock is the time model itself, so every rung's prefill and
    decode-step seconds are read off it, tried or not. Measured: learned per shape, and without
    any timing yet t_dec = 1 and prefill = 0 (cost in decode-step units).
    """
    rows = batch_prompts(cfg, state) * np.array(cfg.group_sizes)
    co = state.cost
    c = resolve(consts)
    env = np.zeros(len(rows))
    model = cfg.timing == "model"
    if model and c.model_cost_known:  # (the model clock prices the rollout only: no env)
        tm = TimeModel.from_sagc(cfg)
        pre = np.array([tm.prefill_s(int(r)) for r in rows])
        dec = np.array([tm.decode_step_s(int(r)) for r in rows])
    else:
        meas, frac = co.measured, c.cost_floor_frac
        pre = np.nan_to_num(_interp_rows(rows, meas, co.prefill_s, frac, not model), nan=0.0)
        dec = np.nan_to_num(_interp_rows(rows, meas, co.decode_step_s, frac, not model), nan=1.0)
        if (co.env_s > 0).any():  # episodes on the measured clock: environment seconds too
            env = np.nan_to_num(_interp_rows(rows, meas, co.env_s, frac), nan=0.0)
    steps = state.length.exp_steps
    if not (steps > 0).all():
        steps = np.full(len(rows), float(max(int(co.max_new_tokens), 1)))
    return pre + steps * dec + env


def pass_rate_beta(cfg: Any, state: State) -> tuple[float, float]:
    """Method-of-moments Beta(a, b) over per-prompt pass rates (prior: Beta(1,1) as 2 groups).

    Moments are the unbiased per-group estimates k/g and k(k-1)/(g(g-1)) summed over the
    discounted pass-count histograms ``pass_hist`` [K, max g + 1] of every rung.
    """
    s0, s1, s2 = 2.0, 1.0, 2.0 / 3.0
    for i, g in enumerate(cfg.group_sizes):
        h, k = state.benefit.pass_hist[i, : g + 1], np.arange(g + 1.0)
        s0 += h.sum()
        s1 += (h * k).sum() / g
        s2 += (h * k * (k - 1)).sum() / (g * (g - 1))
    m = float(np.clip(s1 / s0, 1e-4, 1 - 1e-4))
    var = float(np.clip(s2 / s0 - m * m, 1e-6, m * (1 - m) * (1 - 1e-3)))
    nu = m * (1 - m) / var - 1.0
    return m * nu, (1 - m) * nu


PASS_GRID = np.linspace(0.0, 1.0, 101)  # support of the pass-rate mixture
_PASS_EDGES = np.concatenate([[0.0], (PASS_GRID[1:] + PASS_GRID[:-1]) / 2.0, [1.0]])  # its cells


def _beta_cdf(a: float, b: float, x: np.ndarray) -> np.ndarray:
    return np.asarray(betainc(a, b, x), np.float64)


@functools.lru_cache(maxsize=8)
def _binom_table(sizes: tuple[int, ...]) -> np.ndarray:
    """P(k passes of g | p) for every rung, k and grid point: [K, max g + 1, len(PASS_GRID)]."""
    p = PASS_GRID[None, :]
    out = np.zeros((len(sizes), max(sizes) + 1, len(PASS_GRID)))
    for i, g in enumerate(sizes):
        k = np.arange(g + 1)[:, None]
        comb = np.array([math.comb(g, int(j)) for j in k[:, 0]], np.float64)[:, None]
        out[i, : g + 1] = comb * p**k * (1.0 - p) ** (g - k)
    out.setflags(write=False)  # cached and shared: a constant of the rung set
    return out


def pass_rate_mixture(
    cfg: Any, state: State, consts: SAGCConstants | None = None
) -> np.ndarray:
    """Distribution of per-prompt pass rates on ``PASS_GRID``: weights [M], summing to 1.

    Starts at the method-of-moments Beta and takes ``pass_em_iters`` (a constant) EM steps toward
    the maximum-likelihood mixture of the observed pass counts (every rung's histogram, each group a
    binomial draw at its prompt's p). Why: real pass rates are not Beta — a lump near but below
    1 decays like p^g, a J-shaped Beta far more slowly — and a two-moment fit then under-predicts
    the benefit of large g by 12-16 % on the ramble replay (docs/sagc.md). Few steps from the Beta
    keep it a smoothed fit: moments the data pin down (up to the largest rung seen) move, the
    rest stay near the Beta; on Beta-distributed pass rates the Beta is already near the
    likelihood's optimum, so little moves.
    """
    a, b = pass_rate_beta(cfg, state)
    w = np.diff(_beta_cdf(a, b, _PASS_EDGES))
    w = np.maximum(w, 1e-300) / w.sum()
    hist = state.benefit.pass_hist
    n = float(hist.sum())
    iters = resolve(consts).pass_em_iters
    if n <= 0.0 or iters == 0:
        return w
    lik = _binom_table(tuple(cfg.group_sizes))
    live = hist > 0
    for _ in range(iters):
        mix = np.maximum(np.einsum("ikm,m->ik", lik, w), 1e-300)
        r = np.where(live, hist / mix, 0.0)
        w = w * np.einsum("ik,ikm->m", r, lik) / n
        w /= w.sum()
    return w


def p_informative(g: int, w: np.ndarray) -> float:
    """P(a group of g has rewards not all equal) with p ~ the mixture ``w`` on ``PASS_GRID``."""
    p = PASS_GRID
    return max(0.0, 1.0 - float((w * (p**g + (1.0 - p) ** g)).sum()))


def benefit_per_prompt(g: int, w: np.ndarray) -> float:
    """P(rewards not all equal | g) x (1 - 1/g) with p ~ the mixture ``w`` on ``PASS_GRID``."""
    return p_informative(g, w) * (1.0 - 1.0 / g)


def expected_diminishing(b: float, q: float) -> float:
    """E[N / (N + 1)] for N ~ Binomial(b, q): the `diminishing` law's expected benefit of a step
    of b groups, each informative with probability q. Closed form, from E[1 / (N + 1)] =
    (1 - (1 - q)^(b + 1)) / ((b + 1) q) (integrate the generating function); 0 when q = 0."""
    if q <= 0.0 or b <= 0.0:
        return 0.0
    q = min(q, 1.0)
    tail = 1.0 if q >= 1.0 else -np.expm1((b + 1.0) * np.log1p(-q))  # 1 - (1 - q)^(b + 1)
    return float(1.0 - tail / ((b + 1.0) * q))


def predicted_benefit(cfg: Any, state: State, consts: SAGCConstants | None = None) -> np.ndarray:
    """Expected benefit of one step at each g, under ``cfg.benefit``. [K]

    groups: B(g) x benefit_per_prompt (informative groups x (1 - 1/g)); any_group: P(at least
    one of the step's B(g) groups is informative) = 1 - (1 - p_informative)^B, in [0, 1]
    (prompts drawn independently); diminishing: E[N / (N + 1)] for the step's informative
    groups N ~ Binomial(B, p_informative), in [0, 1) (`expected_diminishing`)."""
    w = pass_rate_mixture(cfg, state, consts)
    bs = batch_prompts(cfg, state)
    if cfg.benefit == "any_group":
        return np.array([1.0 - (1.0 - p_informative(g, w)) ** bs[i]
                         for i, g in enumerate(cfg.group_sizes)])
    if cfg.benefit == "diminishing":
        return np.array([expected_diminishing(float(bs[i]), p_informative(g, w))
                         for i, g in enumerate(cfg.group_sizes)])
    return np.array([bs[i] * benefit_per_prompt(g, w) for i, g in enumerate(cfg.group_sizes)])


# --------------------------------------------------------------------------------------------
# Change detection and the long-run benefit rate
# --------------------------------------------------------------------------------------------


def binom_llr(k: np.ndarray, n: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Log-likelihood-ratio statistic 2·log(L(k/n) / L(p)) of k events in n trials. [...]

    Fractional (discounted) counts are allowed. Under "no change" it is about chi-square(1), so a
    threshold of 15 has a false-alarm rate near 1e-4 per test.
    """
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    p = np.clip(np.asarray(p, np.float64), 1e-9, 1 - 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(n > 0, k / np.maximum(n, 1e-12), p)
        t1 = np.where(k > 0, k * np.log(np.maximum(q, 1e-300) / p), 0.0)
        t2 = np.where(n - k > 0, (n - k) * np.log(np.maximum(1 - q, 1e-300) / (1 - p)), 0.0)
    return 2.0 * np.maximum(t1 + t2, 0.0)


def binom_llr2(k1: np.ndarray, n1: np.ndarray, k2: np.ndarray, n2: np.ndarray) -> np.ndarray:
    """Two-sample LLR that k1/n1 and k2/n2 have different rates (about chi-square(1) if not)."""
    pool = (np.asarray(k1) + k2) / np.maximum(np.asarray(n1) + n2, 1e-12)
    return binom_llr(k1, n1, pool) + binom_llr(k2, n2, pool)


def realised_benefit(rewards: np.ndarray, threshold: float, form: str = "groups") -> float:
    """One step's benefit from its rewards [P, g] (binarised at threshold, as the benefit model
    is). form groups: Σ over groups [passes not all equal] x (1 - 1/g); any_group: 1.0 if some
    group's passes are mixed, else 0.0; diminishing: n / (n + 1) of its n mixed groups
    (``SAGCConfig.benefit``)."""
    g = rewards.shape[-1]
    k = (rewards > threshold).sum(-1)
    return step_worth(int(((k > 0) & (k < g)).sum()), g, form)


def step_worth(informative: int, g: int, form: str = "groups") -> float:
    """One step's benefit from its count of informative groups of size g, under ``form``
    (groups: informative x (1 - 1/g); any_group: 1.0 if any, else 0.0; diminishing:
    informative / (informative + 1), each further group worth less: 1/2, 2/3, 3/4, ...). Shared
    by the controller's realised benefit and the simulator's world law."""
    if form == "any_group":
        return float(informative > 0)
    if form == "diminishing":
        return informative / (informative + 1.0)
    return informative * (1.0 - 1.0 / g)


def length_trend(
    length: Length,
    min_weight: float | None = None,
    z: float | None = None,
    consts: SAGCConstants | None = None,
) -> float:
    """Per-step growth rate of the median completion length within the regime, 1/step.

    The slope of the discounted least-squares fit of log median length on step
    (``trend_s``), shrunk by its noise: ρ (1 - z² se²/ρ²)⁺, so a slope within z standard
    errors of 0 counts as none (extrapolated over the rest of a run, a noise slope would move
    λ by tens of percent). 0 with fewer than ``min_weight`` steps of weight. None: the
    constants ``trend_min_weight`` and ``trend_z`` (`sagc_constants`, with the reason).
    """
    c = resolve(consts)
    min_weight = c.trend_min_weight if min_weight is None else min_weight
    z = c.trend_z if z is None else z
    w, st, stt, sy, sty, syy = length.trend_s
    sxx = stt - st * st / max(w, 1e-12)
    if w < min_weight or sxx <= 1e-9 * max(stt, 1.0):
        return 0.0
    rho = (sty - st * sy / w) / sxx
    resid = max(syy - sy * sy / w - rho * rho * sxx, 0.0) / max(w - 2.0, 1.0)
    se2 = resid / sxx
    return float(rho * max(0.0, 1.0 - z * z * se2 / max(rho * rho, 1e-300)))


def cost_growth(cfg: Any, state: State, h: int, consts: SAGCConstants | None = None) -> float:
    """Σ_{k=1..h} f_k, the future steps' cost in units of the current step's: f_k = 1 without
    a trend; with a trend memory (3 x half_life), f_k = exp(ρ k) for the length trend ρ, clipped to
    [chunk / E[steps], cap / E[steps]] at the current rung (decode can neither end before one
    chunk nor run past max_new_tokens)."""
    rho = length_trend(state.length, consts=consts) if trend_half_life(cfg, consts) else 0.0
    if rho == 0.0:
        return float(h)
    steps_now = float(state.length.exp_steps[int(state.decision.g_idx)])
    chunk = float(max(int(state.cost.decode_chunk), 1))
    cap = math.ceil(float(state.cost.max_new_tokens) / chunk) * chunk
    if steps_now <= 0:
        return float(h)
    bound = cap / steps_now if rho > 0 else chunk / steps_now
    if (rho > 0 and bound <= 1.0) or (rho < 0 and bound >= 1.0):
        return float(h)
    k_sat = min(math.log(bound) / rho, float(h))  # steps until the bound is reached
    n = int(k_sat)
    grown = math.exp(rho) * math.expm1(rho * n) / math.expm1(rho)  # Σ_{k=1..n} e^{ρk}
    return float(grown + (h - n) * bound)


def benefit_rate(
    cfg: Any,
    state: State,
    benefit: np.ndarray,
    cost: np.ndarray,
    consts: SAGCConstants | None = None,
) -> float:
    """λ, the price of a second in the run-long objective Σ benefit / Σ seconds (Dinkelbach).

    benefit, cost: predicted per-step benefit and seconds at each rung, float [K] (used only
    before the first timed step: then λ is the best predicted benefit/cost). With a known
    horizon (``state.decision.horizon`` > 0, the run's steps): the rate the run would
    end at if the recent past (``rate_now``, half-life
    ``half_life``) lasted for the H = horizon - step steps left, (B + H b) / (C + H c) with
    B, C the run's realised totals and b, c the recent per-step means — the certainty
    equivalence the causal ceiling plans by (oracle.py): early in a run λ is about the current
    regime's rate, late in it the run's own. (Projecting the *predicted* best rung instead is
    biased up by the max over noisy predictions; docs/sagc.md.) Without a horizon: the
    discounted realised rate (``rate_s``, half-life 5 x half_life).
    """
    ratio = float((benefit / np.maximum(cost, 1e-12)).max())
    bf, dec = state.benefit, state.decision
    ben_now, sec_now, n_now = bf.rate_now
    horizon = int(dec.horizon)
    if horizon > 0 and sec_now > 0:
        big_b, big_c = bf.total_s
        h = max(horizon - int(dec.step), 1)
        future_c = sec_now / n_now * cost_growth(cfg, state, h, consts)
        return float((big_b + h * ben_now / n_now) / (big_c + future_c))
    ben, sec = bf.rate_s
    return float(ben / sec) if sec > 0 and ben > 0 else ratio
