"""The straggler event and its counterfactual: what one step's groups say about every g.

Pure numpy, no controller state. ``Observation`` is what the trainer hands the controller after
each step; ``straggler_events`` is the constrained event (DESIGN.md §5) and ``tail_share`` the
continuous alternative (``sagc.straggler``, docs/results/sagc_straggler_definition.md);
``counterfactual_risk`` / ``counterfactual_tail_share`` turn each observed group into the expected
cost of a group of any candidate size (docs/sagc.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sagc_jax.config.sagc_constants import SAGCConstants, resolve


@dataclass
class Observation:
    """One step's rollouts. Rows are prompt-major: row r belongs to group r // group_size.

    lengths: int [rows], generated tokens incl. EOS; truncated: bool [rows] (hit max_new_tokens);
    rewards: float [rows]; prefill_s / decode_s: seconds; decode_steps: decode steps run
    (a multiple of decode_chunk; for episodes the sum over turns of each turn's longest row,
    more than the longest episode's). Timings <= 0 mean "not measured" (e.g. a compile step).
    env_s: seconds in environment calls (episodes, `timing: measured`; 0 otherwise).
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
    env_s: float = 0.0


def last_axis_median(x: np.ndarray) -> np.ndarray:
    """``np.median(x, axis=-1)`` (mean of the two middle values for even sizes), via one sort:
    several times faster than np.median on the small trailing axes used here."""
    s = np.sort(x, axis=-1)
    n = s.shape[-1]
    return 0.5 * (s[..., (n - 1) // 2] + s[..., n // 2])


def straggler_events(
    lengths: np.ndarray, truncated: np.ndarray, tau: float, count_truncated: bool
) -> np.ndarray:
    """Straggler event per group. lengths/truncated: [..., g] -> bool [...].

    Event: ``max L > tau * median L`` (numpy median: mean of the two middle values for even g),
    or, when ``count_truncated``, any member truncated.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    ev = lengths.max(-1) > tau * last_axis_median(lengths)
    if count_truncated:
        ev = ev | np.asarray(truncated, dtype=bool).any(-1)
    return ev


def tail_share(lengths: np.ndarray) -> np.ndarray:
    """Tail share per group: ``(max L - median L) / max L``. lengths: [..., g] -> float [...].

    The share of the group's decode steps run only for the rows longer than its median (what a
    group-synchronous decode spends on its tail), in [0, 1). Truncation counts through length:
    a row at the cap is long. Lengths below 1 count as 1 (an empty completion still takes its
    EOS step).
    """
    lengths = np.maximum(np.asarray(lengths, dtype=np.float64), 1.0)
    mx = lengths.max(-1)
    return (mx - last_axis_median(lengths)) / mx


def straggler_cost(
    cfg: Any, lengths: np.ndarray, truncated: np.ndarray, consts: SAGCConstants | None = None
) -> np.ndarray:
    """Per-group straggler cost under ``cfg.straggler``. lengths/truncated [..., g] -> [...].

    "group_ratio": the 0/1 event of ``straggler_events`` (tau; a truncated member counts, the
    constant ``count_truncated`` of ``consts``, None = the shipped ones); "tail_share": the
    continuous ``tail_share`` (tau unused), a fraction of the group's decode steps.
    """
    if cfg.straggler == "tail_share":
        return tail_share(lengths)
    events = straggler_events(lengths, truncated, cfg.tau, resolve(consts).count_truncated)
    return events.astype(np.float64)


def step_straggler_rate(cfg: Any, obs: Observation, consts: SAGCConstants | None = None) -> float:
    """Mean straggler cost of the step's groups (the constrained quantity s_t): the fraction of
    groups with an event ("group_ratio") or their mean tail share ("tail_share").

    ``cfg`` needs ``straggler`` and ``tau`` (an SAGCConfig)."""
    g = int(obs.group_size)
    lengths = np.asarray(obs.lengths).reshape(-1, g)
    truncated = np.asarray(obs.truncated, dtype=bool).reshape(-1, g)
    return float(straggler_cost(cfg, lengths, truncated, consts).mean())


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
        ratio = (sub.max(-1) > tau * last_axis_median(sub)).mean(0)
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


def counterfactual_tail_share(
    lengths: np.ndarray,
    g: int,
    *,
    rng: np.random.Generator,
    mc: int,
    pool_eps: np.ndarray,
    trunc_rate: float,
    max_new_tokens: int,
) -> np.ndarray:
    """E[tail share] of a group of size g, estimated from each observed group. [P, G] -> [P].

    g == G: exact; g < G: Monte-Carlo mean over ``mc`` uniform g-subsets of the group's rows;
    g > G: each group extended by g - G "median x residual" model rows (as ``counterfactual_risk``),
    each also sent to the cap with probability ``trunc_rate`` (a truncated row is a long one).
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    p_groups, big_g = lengths.shape
    if g == big_g:
        return tail_share(lengths)
    if g < big_g:
        idx = np.argsort(rng.random((mc, p_groups, big_g)), axis=-1)[..., :g]
        sub = np.take_along_axis(np.broadcast_to(lengths, (*idx.shape[:-1], big_g)), idx, -1)
        return tail_share(sub).mean(0)
    extra = g - big_g
    cap = float(max_new_tokens)
    med = np.maximum(np.median(lengths, axis=-1), 1.0)
    new_len = med[None, :, None] * pool_eps[rng.integers(0, len(pool_eps), (mc, p_groups, extra))]
    new_tr = (new_len >= cap) | (rng.random(new_len.shape) < trunc_rate)
    new_len = np.where(new_tr, cap, np.maximum(np.ceil(new_len), 1.0))
    full = np.concatenate([np.broadcast_to(lengths, (mc, p_groups, big_g)), new_len], -1)
    return tail_share(full).mean(0)
