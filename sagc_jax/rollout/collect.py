"""One step's rollouts: prompts -> sampler -> completions -> rewards, with DAPO refill.

`collect(sampler, prompts, g, rewards, ...)` samples `num_prompts` groups of `g` completions,
scores them, and (with `algo.dynamic_sampling`) drops zero-variance groups and refills them from
fresh prompts for up to `dynamic_sampling_rounds` extra rounds. The result is a `Rollout` in
prompt-major row order; what SAGC needs of it (the first round, over all processes) rides along
as `Rollout.first_round`, turned into an `Observation` by `sagc.observation.observation_from`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from sagc_jax.data.prompt_stream import PromptStream
from sagc_jax.data.tokenizer import decode_completion
from sagc_jax.hosts import Hosts
from sagc_jax.rewards import RewardFn, score_groups
from sagc_jax.rl.shaping import overlong_penalty
from sagc_jax.sampling import Sampler


def rollout_key(seed: int, step: int, round_: int) -> jax.Array:
    """The sampling key of one rollout round: fold_in(fold_in(key(seed), step), round)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), round_)


@dataclasses.dataclass(frozen=True)
class CollectSettings:
    """Sampling and DAPO settings of `collect` (from `sampling.*`, `algo.*`, `run.seed`)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    dynamic_sampling: bool = False
    dynamic_sampling_rounds: int = 0
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0
    reward_on_error: str = "raise"
    seed: int = 0
    pad_id: int = 0

    @classmethod
    def from_config(cls, cfg: Any, pad_id: int) -> CollectSettings:
        s, a = cfg.sampling, cfg.algo
        return cls(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                   top_p=s.top_p, dynamic_sampling=a.dynamic_sampling,
                   dynamic_sampling_rounds=a.dynamic_sampling_rounds,
                   overlong_buffer=a.overlong_buffer, overlong_penalty=a.overlong_penalty,
                   reward_on_error=cfg.reward_on_error, seed=cfg.run.seed, pad_id=pad_id)


@dataclasses.dataclass
class FirstRound:
    """The first sampling round over all processes: what SAGC observes (DAPO refills are not
    part of the group-size decision). Arrays are [global rows]; seconds are this host's."""

    lengths: np.ndarray
    truncated: np.ndarray
    rewards: np.ndarray  # raw (before overlong shaping)
    prompts: int
    decode_steps: int
    prefill_s: float
    decode_s: float
    env_s: float = 0.0  # seconds in environment calls (episodes)


@dataclasses.dataclass
class Rollout:
    """One step's sampled groups, in prompt-major row order."""

    examples: list[dict[str, Any]]  # one per group
    group_size: int
    tokens: np.ndarray  # [R, N]
    logprobs: np.ndarray  # [R, N]
    lengths: np.ndarray  # [R]
    truncated: np.ndarray  # [R]
    rewards: np.ndarray  # [R] (shaped)
    raw_rewards: np.ndarray  # [R] (before overlong shaping)
    valid: np.ndarray  # [R] rows in kept groups
    completions: list[str]
    stats: dict[str, float]
    first_round: FirstRound | None = None
    reward_errors: int = 0
    row_offset: int = 0  # global index of this process's first row (multi-process)
    # [R] False where every reward function returned None (not applicable); None = all scored.
    scored: np.ndarray | None = None
    # [R, N] True on an environment's tokens (multi-turn episodes, `rollout.episodes`): context
    # the loss never scores. None = every completion token is the model's.
    env_mask: np.ndarray | None = None
    # [R, max_turns] tokens each turn of an episode added (`rollout.episodes.Played`); None for
    # single turns. Recorded in trace.jsonl so the simulator can replay episodes' decode steps.
    turn_tokens: np.ndarray | None = None

    @property
    def prompt_len(self) -> int:
        """Longest prompt (tokens) of this process's groups."""
        return max(len(ex["prompt_ids"]) for ex in self.examples)


_STAT_KEYS = ("prefill_s", "decode_s", "decode_steps", "padding_waste", "compiles")


class KeptGroup(NamedTuple):
    """One sampled group kept for the update: its example and its G rows' arrays ([G, N] for
    tokens / logprobs, [G] for the rest) and completion texts."""

    example: dict[str, Any]
    scored: np.ndarray  # [G] bool: some reward function applied
    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    rewards: np.ndarray  # shaped
    raw_rewards: np.ndarray  # before overlong shaping
    completions: list[str]


def collect(sampler: Sampler, prompts: PromptStream, g: int, rewards: Sequence[RewardFn], *,
            step: int, num_prompts: int, params: Any, tokenizer: Any,
            settings: CollectSettings, hosts: Hosts | None = None) -> Rollout:
    """Samples `num_prompts` (global) groups of `g`; see the module docstring.

    With several processes each samples its `num_prompts / processes` share (DAPO refill is
    single-process only); the first round's lengths, flags and rewards are gathered.
    """
    hosts = hosts or Hosts()
    st = settings
    rounds = 1 + (st.dynamic_sampling_rounds if st.dynamic_sampling else 0)
    kept: list[KeptGroup] = []
    stats = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0, "padding_waste": 0,
             "compiles": 0, "rollout_rounds": 0, "reward_s": 0.0}
    first = None
    errors = 0
    local = hosts.local_rows(num_prompts)
    for r in range(rounds):
        need = local - len(kept)
        if need == 0:
            break
        examples = prompts.take(step, num_prompts) if r == 0 else prompts.refill(step, need)
        out = sampler.generate(
            [ex["prompt_ids"] for ex in examples], group_size=g,
            key=rollout_key(st.seed, step, r), max_new_tokens=st.max_new_tokens,
            temperature=st.temperature, top_k=st.top_k, top_p=st.top_p, params=params)
        comps = [decode_completion(tokenizer, row[:n]) for row, n in zip(out.tokens, out.lengths)]
        for k in _STAT_KEYS:
            stats[k] += float(getattr(out.stats, k))
        stats["rollout_rounds"] += 1
        t0 = time.perf_counter()
        res = score_groups(rewards, examples, g, comps, on_error=st.reward_on_error)
        stats["reward_s"] += time.perf_counter() - t0
        errors += res.num_errors
        raw = res.total.astype(np.float32)
        shaped = raw + overlong_penalty(out.lengths, st.max_new_tokens, st.overlong_buffer,
                                        st.overlong_penalty)
        if r == 0:
            # SAGC sees the global rollout so every process makes the same decision.
            glob = hosts.gather({"lengths": np.asarray(out.lengths),
                                 "truncated": np.asarray(out.truncated), "rewards": raw})
            first = FirstRound(np.asarray(glob["lengths"]), np.asarray(glob["truncated"]),
                               np.asarray(glob["rewards"]), len(examples) * hosts.count,
                               int(out.stats.decode_steps), float(out.stats.prefill_s),
                               float(out.stats.decode_s))
        for i, ex in enumerate(examples):
            sl = slice(i * g, (i + 1) * g)
            sc = res.scored[sl]
            if st.dynamic_sampling and (not sc.any() or np.ptp(shaped[sl][sc]) == 0):
                continue  # no learning signal: refilled next round, or dropped after the last
            if len(kept) < local:
                kept.append(KeptGroup(ex, sc, out.tokens[sl], out.logprobs[sl],
                                      out.lengths[sl], out.truncated[sl], shaped[sl], raw[sl],
                                      comps[sl]))
    return _assemble(kept, g, local, st, stats, first, errors, hosts)


def _assemble(kept: list[KeptGroup], g: int, num_prompts: int, st: CollectSettings,
              stats: dict[str, float], first: FirstRound | None, errors: int,
              hosts: Hosts) -> Rollout:
    """Kept groups -> fixed-shape arrays; missing groups stay invalid padding rows, their
    example the first prompt's (so the batch keeps its compiled shape)."""
    pad = num_prompts - len(kept)

    def rows(field: str, dtype: Any, fill: Any = 0, width: tuple[int, ...] = ()) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(k, field), dtype) for k in kept]
                              + [np.full((pad * g, *width), fill, dtype)])

    examples = [k.example for k in kept]
    examples += [examples[0] if examples else {"prompt_ids": [st.pad_id]}] * pad
    n = (st.max_new_tokens,)
    return Rollout(examples, g, rows("tokens", np.int32, st.pad_id, n),
                   rows("logprobs", np.float32, 0, n), rows("lengths", np.int32),
                   rows("truncated", bool), rows("rewards", np.float32),
                   rows("raw_rewards", np.float32), np.arange(num_prompts * g) < len(kept) * g,
                   [c for k in kept for c in k.completions] + [""] * (pad * g), stats, first,
                   errors, row_offset=hosts.index * num_prompts * g, scored=rows("scored", bool))


def global_view(ro: Rollout, hosts: Hosts) -> tuple[Rollout, int]:
    """(the rollout's per-row metrics over all processes, the longest prompt anywhere).

    Single process: the rollout itself. Otherwise lengths, flags and rewards are gathered
    (tokens stay host-local), so metrics and the train step's buckets agree on every host.
    """
    plen = ro.prompt_len
    if hosts.single:
        return ro, plen
    glob = hosts.gather({"lengths": ro.lengths, "truncated": ro.truncated,
                         "rewards": ro.rewards, "raw_rewards": ro.raw_rewards, "valid": ro.valid,
                         "scored": ro.valid if ro.scored is None else ro.scored,
                         "plen": np.asarray([plen], np.int64)})
    stats = dict(ro.stats)
    # Global rows x global decode steps, as a single process would count it.
    stats["padding_waste"] = (len(glob["lengths"]) * int(stats["decode_steps"])
                              - int(glob["lengths"][glob["valid"]].sum()))
    gv = dataclasses.replace(
        ro, lengths=glob["lengths"], truncated=glob["truncated"], rewards=glob["rewards"],
        raw_rewards=glob["raw_rewards"], valid=glob["valid"], scored=glob["scored"], stats=stats,
        row_offset=0)
    return gv, int(glob["plen"].max())
