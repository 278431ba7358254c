"""One step's multi-turn rollouts: G episodes per example against an environment.

`collect_episodes` is `collect`'s counterpart when the config has an `env:` section. Each row
plays one episode (its own environment instance, `envs.EnvSpec`): the model's turn ends at a
stop string or EOS (`sampling.turns.TurnSampler`), its text goes to `env.step`, the reply is
tokenised (`data.tokenizer.encode_reply`: the chat template when `data.chat_template`) and fed
at the start of the next turn, continuing from the KV cache. An episode ends when the
environment says done, after `env.max_turns` model turns, or when its tokens (model and
environment together) reach `sampling.max_new_tokens` (then it counts as truncated).

The episode's reward is the run's `rewards:` on its whole text (model and environment tokens,
as TRL passes a tool-using completion) plus `env.reward_weight` times the environment's return:
the final step's reward (`env.reward: final`, TRL's convention: the reward the last step
reported) or the sum over its steps (`sum`). A group is the G episodes of one example, so the
advantages are per episode, as for completions. `Rollout.env_mask` marks the environment's
tokens: context for the model, never scored by the loss (`rl.batch.make_batch`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from sagc_jax.data.prompt_stream import PromptStream
from sagc_jax.data.tokenizer import encode_prompt, encode_reply
from sagc_jax.envs import EnvError, EnvSpec
from sagc_jax.rewards import RewardFn, score_groups
from sagc_jax.rl.shaping import overlong_penalty
from sagc_jax.rollout.collect import (
    CollectSettings,
    FirstRound,
    Rollout,
    rollout_key,
)
from sagc_jax.sampling.turns import TurnSampler


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
    """The `env:` section's episode rules and the reply's rendering (`data.chat_template`)."""

    spec: EnvSpec
    max_turns: int = 4
    reward: str = "final"
    reward_weight: float = 1.0
    chat_template: bool = False

    @classmethod
    def from_config(cls, cfg: Any) -> EpisodeSettings:
        e = cfg.env
        return cls(EnvSpec.from_config(e), e.max_turns, e.reward, e.reward_weight,
                   cfg.data.chat_template)


@dataclasses.dataclass
class Played:
    """Episodes' host results, rows prompt-major ([R] unless noted).

    tokens / logprobs / env_mask [R, n]: each episode's tokens (model and environment), their
    sampling log-probs (0 on environment tokens) and which are the environment's; lengths: its
    tokens; truncated: ended by the token budget; texts: its decoded text; env_return: the
    environment's return (`EpisodeSettings.reward`); turns: model turns played; turn_tokens
    [R, max_turns]: tokens each turn added (its reply's and the model's; 0 after the last), so
    a step's decode steps are the sum over turns of each turn's longest row (chunk-rounded).
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    env_mask: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    texts: list[str]
    env_return: np.ndarray
    turns: np.ndarray
    stats: dict[str, float]
    turn_tokens: np.ndarray


def episode_text(tokenizer: Any, ids: np.ndarray) -> str:
    """An episode's (or a turn's) text: its ids decoded without pad and special tokens (an EOS
    may close a turn in the middle of an episode)."""
    pad = tokenizer.pad_token_id
    keep = [int(i) for i in ids if int(i) != pad]
    return tokenizer.decode(keep, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def play(sampler: TurnSampler, settings: EpisodeSettings, examples: Sequence[Mapping[str, Any]],
         g: int, *, tokenizer: Any, key: jax.Array, params: Any, max_new_tokens: int,
         temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         greedy: bool = False) -> Played:
    """Plays G episodes of each example (see the module doc). Environment failures raise
    `EnvError` naming the env, the example (its index in `examples`) and the call."""
    st, spec = settings, settings.spec
    rows = len(examples) * g
    ep = sampler.begin([ex["prompt_ids"] for ex in examples], group_size=g, key=key,
                       params=params)
    envs = [spec.make(r // g) for r in range(rows)]
    replies: list[list[int]] = [
        _reply(sampler, spec, tokenizer, spec.reset(envs[r], examples[r // g], r // g), r // g,
               st.chat_template, first=True, after_eos=False) or [] for r in range(rows)]
    cut_replies = 0
    live = np.ones(rows, bool)
    turns = np.zeros(rows, np.int32)
    truncated = np.zeros(rows, bool)
    returns = np.zeros(rows, np.float32)
    env_s = 0.0
    pos = np.zeros(rows, np.int64)
    turn_tokens = np.zeros((rows, st.max_turns), np.int64)
    while live.any():
        start = pos + np.asarray([len(x) for x in replies])  # this turn's first model slot
        end = sampler.turn(ep, live=live, replies=replies, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
        new_pos = end.pos[:rows].astype(np.int64)
        turn_tokens[live, turns[live]] = (new_pos - pos)[live]
        pos = new_pos
        replies = [[] for _ in range(rows)]
        t0 = time.perf_counter()
        for r in np.flatnonzero(live):
            turns[r] += 1
            if end.full[r]:  # no room for another token: the episode is cut, not finished
                truncated[r], live[r] = True, False
                continue
            action = episode_text(tokenizer, end.tokens[r, start[r]:pos[r]])
            res = spec.step(envs[r], action, r // g, int(turns[r]))
            returns[r] = returns[r] + res.reward if st.reward == "sum" else res.reward
            if res.done or turns[r] >= st.max_turns:
                live[r] = False
                continue
            reply = _reply(sampler, spec, tokenizer, res.observation, r // g, st.chat_template,
                           after_eos=bool(end.eos[r]))
            cut_replies += reply is None
            if reply is None or pos[r] + len(reply) >= max_new_tokens:
                truncated[r], live[r] = True, False  # the reply leaves no room for a turn
                continue
            replies[r] = reply
        env_s += time.perf_counter() - t0
    tokens, logprobs, env_mask, lengths = sampler.outputs(ep, max_new_tokens)
    texts = [episode_text(tokenizer, tokens[r, :lengths[r]]) for r in range(rows)]
    n_tok = max(int(lengths.sum()), 1)
    stats = {"prefill_s": ep.prefill_s, "decode_s": ep.decode_s,
             "decode_steps": ep.decode_steps, "env_s": env_s,
             "padding_waste": rows * ep.decode_steps - int(lengths.sum()),
             "episode_turns": float(turns.mean()),
             "env_token_frac": float(env_mask.sum() / n_tok),
             "env_return_mean": float(returns.mean()),
             "env_replies_cut": float(cut_replies)}
    return Played(tokens, logprobs, env_mask, lengths, truncated, texts, returns, turns, stats,
                  turn_tokens)


def _reply(sampler: TurnSampler, spec: EnvSpec, tokenizer: Any, text: str, index: int,
           chat_template: bool, *, first: bool = False, after_eos: bool = True
           ) -> list[int] | None:
    """The reply's ids ("" = no reply at all, also under a chat template), or None when it is
    longer than the compiled reply buffer (`env.max_reply_tokens`). A first observation (from
    `reset`) that long is the environment's or the config's fault, the same for every episode
    of the example: `EnvError`. A later reply depends on what the model wrote (a calculator
    asked for a huge number): its episode ends there, cut like one over the token budget."""
    ids = encode_reply(tokenizer, text, chat_template, after_eos) if text else []
    if len(ids) <= sampler.reply_width:
        return ids
    if first:
        raise EnvError(f"env {spec.name!r} failed on example {index}: its first observation "
                       f"{text!r:.60} is {len(ids)} tokens, more than env.max_reply_tokens "
                       f"({sampler.reply_width})")
    return None


def collect_episodes(sampler: TurnSampler, prompts: PromptStream, g: int,
                     rewards: Sequence[RewardFn], *, step: int, num_prompts: int, params: Any,
                     tokenizer: Any, settings: CollectSettings,
                     episodes: EpisodeSettings) -> Rollout:
    """`num_prompts` groups of `g` episodes, scored: the step's `Rollout` (single process; one
    sampling round: DAPO's refill is not applied to episodes)."""
    st = settings
    examples = prompts.take(step, num_prompts)
    out = play(sampler, episodes, examples, g, tokenizer=tokenizer,
               key=rollout_key(st.seed, step, 0), params=params,
               max_new_tokens=st.max_new_tokens, temperature=st.temperature, top_k=st.top_k,
               top_p=st.top_p)
    t0 = time.perf_counter()
    res = score_groups(rewards, examples, g, out.texts, on_error=st.reward_on_error)
    raw = (res.total + np.float32(episodes.reward_weight) * out.env_return).astype(np.float32)
    # The environment's return scores every episode, whatever the reward functions say.
    scored = res.scored | (episodes.reward_weight != 0)
    shaped = raw + overlong_penalty(out.lengths, st.max_new_tokens, st.overlong_buffer,
                                    st.overlong_penalty)
    stats = {**out.stats, "rollout_rounds": 1, "reward_s": time.perf_counter() - t0,
             "compiles": 0}
    rows = len(examples) * g
    first = FirstRound(out.lengths, out.truncated, raw, len(examples), out.stats["decode_steps"],
                       out.stats["prefill_s"], out.stats["decode_s"], out.stats["env_s"])
    return Rollout(list(examples), g, out.tokens, out.logprobs, out.lengths, out.truncated,
                   shaped, raw, np.ones(rows, bool), out.texts, stats, first, res.num_errors,
                   scored=scored, env_mask=out.env_mask, turn_tokens=out.turn_tokens)


def episode_accuracy(sampler: TurnSampler, settings: EpisodeSettings, tokenizer: Any,
                     examples: Sequence[Mapping[str, Any]], reward_fns: Sequence[RewardFn], *,
                     params: Any, key: jax.Array, max_new_tokens: int, chat_template: bool,
                     on_error: str = "raise", batch: int = 64,
                     correct_threshold: float = 0.5) -> float:
    """Greedy held-out accuracy of episodes (G = 1): the fraction whose first reward function
    scores >= `correct_threshold` on the episode's text (as `evaluate.greedy_accuracy`)."""
    correct = 0
    first = reward_fns[0].name
    for i in range(0, len(examples), batch):
        chunk = [{**e, "prompt_ids": encode_prompt(tokenizer, e["prompt"], chat_template)}
                 for e in examples[i:i + batch]]
        out = play(sampler, settings, chunk, 1, tokenizer=tokenizer, key=key, params=params,
                   max_new_tokens=max_new_tokens, greedy=True)
        res = score_groups(reward_fns, chunk, 1, out.texts, on_error=on_error)
        correct += int((res.per_fn[first] >= correct_threshold).sum())
    return correct / max(len(examples), 1)
