"""Rollout workload models for the SAGC simulator and property tests.

A workload draws, per step, a *maximal* block of rollouts ``[P_max, G_max]`` from a generator
seeded by ``(seed, step)``; a policy running B prompts at group size g uses the block's top-left
``[:B, :g]`` corner. Every policy therefore sees the same randomness (common random numbers), and
a prompt's first g rollouts are the same whatever g is.

Synthetic model (per step, per prompt j, per row i):
  median_j = median_length * exp(prompt_spread * z_j)          z_j ~ N(0, 1)
  L_ji     = ceil(median_j * exp(group_spread * z_ji))         z_ji ~ N(0, 1), clipped to >= 1
  with prob loop_prob the row loops: L_ji = max_new_tokens (truncated)
  L_ji >= max_new_tokens  -> truncated, L_ji = max_new_tokens
  p_j ~ Beta(pass_rate.a, pass_rate.b);  reward_ji ~ Bernoulli(p_j), 0 if truncated.
Bimodal difficulty (``hard_frac`` > 0): each prompt is "hard" with probability hard_frac; a hard
prompt uses hard_median_length, hard_loop_prob and p_j ~ Beta(hard_pass_rate) instead.
Drift: piecewise-constant entries, or ``ramp: true`` entries whose numeric fields move linearly
from the previous entry's values (at its at_step) to their own (at theirs).

Trace model: bootstrap over groups recorded in a run's ``trace.jsonl``; see ``TraceWorkload``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import binom

_SALT_WORKLOAD = 0x3D1
PASS_GRID = np.linspace(0.0, 1.0, 101)  # support of a trace's pass-rate prior
# EM steps of that prior's maximum-likelihood fit: on the G = 16 recording cut to 8 rows, the
# extended groups' informative fraction is 0.80 at 50-500 steps (benchmarks/replay_extension.py).
_PRIOR_EM_STEPS = 200


def pass_rate_posteriors(k: np.ndarray, n: np.ndarray, steps: int = _PRIOR_EM_STEPS) -> np.ndarray:
    """Empirical-Bayes pass-rate posteriors of recorded groups, as CDFs on ``PASS_GRID``.

    k, n: int [N], each group's passes and rows. The prior is the trace's own distribution of
    pass rates: the maximum-likelihood mixture on the grid (EM from uniform) of N binomial
    counts. Each group's posterior is that prior times its binomial likelihood. Returns float
    [N, len(PASS_GRID)], each row nondecreasing to 1. Why not the group's k / n: a group with
    k in {0, n} would then never yield a differing extra row, and groups recorded with n rows
    would be no more informative at 16 than at n (0.63 of real groups are at 8 rows, 0.875 at 16).
    """
    lik = binom.pmf(np.asarray(k)[:, None], np.asarray(n)[:, None], PASS_GRID[None, :])
    w = np.full(len(PASS_GRID), 1.0 / len(PASS_GRID))
    for _ in range(steps):
        post = lik * w
        w = (post / post.sum(1, keepdims=True)).mean(0)
    post = lik * w
    return np.cumsum(post / post.sum(1, keepdims=True), 1)


@dataclass(frozen=True)
class StepDraw:
    """One step's maximal rollout block. lengths int [P, G]; truncated bool; rewards float;
    turns int [P, G, T]: each episode's tokens per turn (an episode trace), None for single
    turns."""

    lengths: np.ndarray
    truncated: np.ndarray
    rewards: np.ndarray
    max_new_tokens: int
    turns: np.ndarray | None = None


@dataclass(frozen=True)
class WorkloadParams:
    """Synthetic workload parameters (see module docstring); ``drift`` entries override them."""

    median_length: float = 120.0
    prompt_spread: float = 0.3
    group_spread: float = 0.4
    loop_prob: float = 0.02
    pass_a: float = 1.0
    pass_b: float = 1.0
    max_new_tokens: int = 512
    hard_frac: float = 0.0  # fraction of prompts from the "hard" mode (bimodal difficulty)
    hard_median_length: float = 480.0
    hard_loop_prob: float = 0.01
    hard_pass_a: float = 0.3
    hard_pass_b: float = 3.0


_RAMPED = ("median_length", "prompt_spread", "group_spread", "loop_prob", "hard_frac")


class SyntheticWorkload:
    """Lognormal lengths + looping completions + Beta pass rates, with piecewise-constant drift."""

    def __init__(
        self,
        params: WorkloadParams,
        drift: list[tuple[int, WorkloadParams]],
        prompts_max: int,
        group_max: int,
        seed: int,
        ramps: frozenset[int] = frozenset(),
    ):
        self.base = params
        self.drift = sorted(drift, key=lambda d: d[0])
        self.ramps = ramps  # at_step of drift entries reached by a linear ramp
        self.prompts_max, self.group_max, self.seed = prompts_max, group_max, seed

    def params_at(self, step: int) -> WorkloadParams:
        """Parameters in force at ``step``: the last drift entry with at_step <= step, or, inside
        a ramp, the previous entry's values moved linearly toward the ramp entry's."""
        p, prev_at = self.base, 0
        for at, q in self.drift:
            if step >= at:
                p, prev_at = q, at
            elif at in self.ramps:
                f = (step - prev_at) / max(at - prev_at, 1)
                upd = {k: (1 - f) * getattr(p, k) + f * getattr(q, k) for k in _RAMPED}
                return dataclasses.replace(p, **upd)
            else:
                break
        return p

    def draw(self, step: int) -> StepDraw:
        """Maximal block for ``step``; deterministic in (seed, step)."""
        p = self.params_at(step)
        rng = np.random.default_rng((self.seed & 0xFFFFFFFF, step, _SALT_WORKLOAD))
        shape = (self.prompts_max, self.group_max)
        z_prompt = rng.standard_normal((self.prompts_max, 1))
        z_row = rng.standard_normal(shape)
        u_loop = rng.random(shape)
        pass_p = rng.beta(p.pass_a, p.pass_b, size=(self.prompts_max, 1))
        u_rew = rng.random(shape)
        med = p.median_length * np.exp(p.prompt_spread * z_prompt)
        loop = np.full((self.prompts_max, 1), p.loop_prob)
        if p.hard_frac > 0:  # drawn after the rest: a unimodal workload's draws are unchanged
            hard = rng.random((self.prompts_max, 1)) < p.hard_frac
            hard_p = rng.beta(p.hard_pass_a, p.hard_pass_b, size=(self.prompts_max, 1))
            med = np.where(hard, med * (p.hard_median_length / p.median_length), med)
            loop = np.where(hard, p.hard_loop_prob, loop)
            pass_p = np.where(hard, hard_p, pass_p)
        lengths = np.maximum(np.ceil(med * np.exp(p.group_spread * z_row)), 1.0)
        truncated = (u_loop < loop) | (lengths >= p.max_new_tokens)
        lengths = np.where(truncated, p.max_new_tokens, lengths).astype(np.int64)
        rewards = ((u_rew < pass_p) & ~truncated).astype(np.float64)
        return StepDraw(lengths, truncated, rewards, int(p.max_new_tokens))


class TraceWorkload:
    """Bootstrap replay of a trainer ``trace.jsonl``.

    Each step draws P_max recorded groups uniformly (with replacement) from all steps. A group
    contributes its rows in a random order, so size g <= G_rec uses a uniform g-subset. Above the
    recorded size the extra rows follow the controller's "median x residual" model: the group's
    median times a residual (L / group median, truncated flag) drawn from all recorded rows, and a
    Bernoulli reward (0 if truncated) at a pass rate drawn per replay from the group's
    empirical-Bayes posterior (``pass_rate_posteriors``; reward > 0.5 counts as a pass). This is
    the one modelling assumption of trace replay; it matters only for g above what was recorded.

    With ``steps`` (``workload.trace_order: time``) the replay keeps the run's time order
    instead: simulated step t of ``steps`` draws only from the recorded steps within
    ``window`` of trace position t * n / steps (n recorded steps), so a run whose tail
    lightened (or grew) as it trained replays as a drifting workload, stretched to ``steps``.
    """

    def __init__(
        self,
        path: str | Path,
        prompts_max: int,
        group_max: int,
        seed: int,
        steps: int | None = None,
        window: int = 1,
    ):
        self.groups, self.trace_steps = load_trace_groups(path)
        if not self.groups:
            raise ValueError(f"workload.trace: no groups in {path}")
        self.order = np.unique(self.trace_steps)  # recorded steps, ascending
        self.steps, self.window = steps, window
        self.max_new_tokens = max(gr.max_new_tokens for gr in self.groups)
        # An episode trace replays whole recorded episodes (their turns set the decode steps);
        # rows beyond a group's recorded ones would need invented turns, so it must be recorded
        # at the largest rung.
        episodes = [gr.turns is not None for gr in self.groups]
        self.turn_max = 0
        if any(episodes):
            short = min(len(gr.lengths) for gr in self.groups)
            if not all(episodes) or short < group_max:
                raise ValueError(
                    f"workload.trace: {path}: an episode trace (groups with 'turns') needs "
                    f"'turns' in every group and every group recorded at the largest rung "
                    f"({group_max} rows); its smallest group has {short}")
            self.turn_max = max(gr.turns.shape[1] for gr in self.groups)
        eps, trs = [], []
        for gr in self.groups:
            med = max(float(np.median(gr.lengths)), 1.0)
            eps.append(gr.lengths / med)
            trs.append(gr.truncated)
        self.pool_eps = np.concatenate(eps)
        self.pool_tr = np.concatenate(trs)
        self.pass_cdf = pass_rate_posteriors(
            np.array([int((gr.rewards > 0.5).sum()) for gr in self.groups]),
            np.array([len(gr.rewards) for gr in self.groups]))
        self.prompts_max, self.group_max, self.seed = prompts_max, group_max, seed

    def _pick(self, step: int, rng: np.random.Generator) -> np.ndarray:
        """Indices of the recorded groups replayed at ``step``: int [prompts_max]."""
        if self.steps is None:
            return rng.integers(0, len(self.groups), self.prompts_max)
        n = len(self.order)
        pos = min(int(step * n / self.steps), n - 1)
        lo, hi = self.order[max(pos - self.window, 0)], self.order[min(pos + self.window, n - 1)]
        pool = np.flatnonzero((self.trace_steps >= lo) & (self.trace_steps <= hi))
        return pool[rng.integers(0, len(pool), self.prompts_max)]

    def draw(self, step: int) -> StepDraw:
        rng = np.random.default_rng((self.seed & 0xFFFFFFFF, step, _SALT_WORKLOAD))
        gmax, mx = self.group_max, self.max_new_tokens
        lengths = np.empty((self.prompts_max, gmax), np.int64)
        truncated = np.empty((self.prompts_max, gmax), bool)
        rewards = np.empty((self.prompts_max, gmax), np.float64)
        turns = (np.zeros((self.prompts_max, gmax, self.turn_max), np.int64)
                 if self.turn_max else None)
        for j, gi in enumerate(self._pick(step, rng)):
            gl, gt, gr, _, gturns = self.groups[gi]
            perm = rng.permutation(len(gl))[:gmax]
            n = len(perm)
            lengths[j, :n], truncated[j, :n], rewards[j, :n] = gl[perm], gt[perm], gr[perm]
            if turns is not None:
                turns[j, :, :gturns.shape[1]] = gturns[perm]
            if n < gmax:
                med = max(float(np.median(gl)), 1.0)
                k = rng.integers(0, len(self.pool_eps), gmax - n)
                ln = med * self.pool_eps[k]
                tr = self.pool_tr[k] | (ln >= mx)
                lengths[j, n:] = np.where(tr, mx, np.maximum(np.ceil(ln), 1)).astype(np.int64)
                truncated[j, n:] = tr
                cdf = self.pass_cdf[gi]
                p = PASS_GRID[min(int(np.searchsorted(cdf, rng.random())), len(cdf) - 1)]
                rewards[j, n:] = ((rng.random(gmax - n) < p) & ~tr).astype(np.float64)
        return StepDraw(lengths, truncated, rewards, int(mx), turns)


class TraceGroup(NamedTuple):
    """One recorded group of a trace (G rows)."""

    lengths: np.ndarray  # int [G]: tokens (an episode's: model and environment)
    truncated: np.ndarray  # bool [G]
    rewards: np.ndarray  # float [G], raw
    max_new_tokens: int
    turns: np.ndarray | None = None  # int [G, T]: an episode's tokens per turn; None: one turn


def load_trace_groups(path: str | Path) -> tuple[list[TraceGroup], np.ndarray]:
    """Parse trace.jsonl -> ([TraceGroup], each group's recorded step int [N]; the line number
    where a record has no "step").

    Format, one JSON object per line: {"step", "group_size", "max_new_tokens",
    "groups": [{"lengths": [...], "truncated": [...], "rewards": [...]}, ...]}; an episode run's
    groups also have "turns" (per row, its tokens per turn). Traces of several runs may be
    concatenated: groups with the same "step" replay together.
    """
    out, steps = [], []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                max_new = int(rec["max_new_tokens"])
                for grp in rec["groups"]:
                    lengths = np.asarray(grp["lengths"], np.int64)
                    truncated = np.asarray(grp["truncated"], bool)
                    rewards = np.asarray(grp["rewards"], np.float64)
                    if not (len(lengths) == len(truncated) == len(rewards) >= 2):
                        raise ValueError("group arrays must have equal length >= 2")
                    turns = None
                    if "turns" in grp:
                        turns = np.asarray(grp["turns"], np.int64)
                        if (turns.ndim != 2 or len(turns) != len(lengths) or (turns < 0).any()
                                or (turns.sum(1) != lengths).any()):
                            raise ValueError("'turns' must be one list of per-turn token "
                                             "counts (>= 0) per row, summing to its length")
                    out.append(TraceGroup(lengths, truncated, rewards, max_new, turns))
                    steps.append(int(rec.get("step", lineno)))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"workload.trace: {path}:{lineno}: {e}") from None
    return out, np.asarray(steps, np.int64)


def params_from_dict(d: dict[str, Any], base: WorkloadParams, where: str) -> WorkloadParams:
    """Apply workload keys from a mapping (``pass_rate: {a, b}`` nested), validating each."""
    upd: dict[str, Any] = {}
    for key, val in d.items():
        name = f"{where}.{key}"
        if key == "pass_rate":
            if not isinstance(val, dict) or set(val) - {"a", "b"}:
                raise ValueError(f"{name}: a mapping {{a: >0, b: >0}}, got {val!r}")
            for ab in ("a", "b"):
                if ab in val:
                    upd[f"pass_{ab}"] = _num(val[ab], f"{name}.{ab}", lo=0.0, lo_open=True)
        elif key == "hard_pass_rate":
            if not isinstance(val, dict) or set(val) - {"a", "b"}:
                raise ValueError(f"{name}: a mapping {{a: >0, b: >0}}, got {val!r}")
            for ab in ("a", "b"):
                if ab in val:
                    upd[f"hard_pass_{ab}"] = _num(val[ab], f"{name}.{ab}", lo=0.0, lo_open=True)
        elif key in ("median_length", "max_new_tokens", "hard_median_length"):
            upd[key] = _num(val, name, lo=1.0)
        elif key in ("prompt_spread", "group_spread"):
            upd[key] = _num(val, name, lo=0.0)
        elif key in ("loop_prob", "hard_loop_prob"):
            upd[key] = _num(val, name, lo=0.0, hi=1.0)
        elif key == "hard_frac":
            upd[key] = _num(val, name, lo=0.0, hi=1.0 + 1e-12)
        else:
            raise ValueError(f"{name}: unknown key")
    if "max_new_tokens" in upd:
        if upd["max_new_tokens"] != int(upd["max_new_tokens"]):
            raise ValueError(f"{where}.max_new_tokens: an integer >= 1, got {d['max_new_tokens']}")
        upd["max_new_tokens"] = int(upd["max_new_tokens"])
    return dataclasses.replace(base, **upd)


def _num(
    v: Any, name: str, lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False
) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and v < hi
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo}, {hi})"
        raise ValueError(f"{name}: a number in {rng}, got {v!r}")
    return float(v)
