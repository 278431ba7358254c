"""A step's rows: the metrics.jsonl row (`metrics_row`) and the trace.jsonl row (`trace_row`)
of its global rollout, written by `train.loop.train_one` (`benchmarks/probes/record_rollouts.py`
writes trace rows too)."""

from __future__ import annotations

from typing import Any

from sagc_jax.rollout import Rollout

#: The learner's metrics copied into the row when present (`Learner.update`).
_LOSS_KEYS = ("loss", "pg_loss", "kl", "grad_norm", "clip_ratio", "clip_ratio_low",
              "clip_ratio_high", "ratio_mean", "adv_abs_mean", "entropy", "frac_reward_zero_std",
              "off_policy_masked", "train_token_util",
              # the gradient noise scale's terms (`rl.noise_scale`)
              "noise_chunk_grad_sq", "noise_weight_share", "scored_rows")


#: Multi-turn rollouts' metrics (`rollout.episodes.play`): model turns per episode, the
#: environment's share of the episodes' tokens, its mean return and its seconds.
_EPISODE_KEYS = ("episode_turns", "env_token_frac", "env_return_mean", "env_s", "env_replies_cut")


def metrics_row(step: int, ro: Rollout, m: dict[str, float], sagc_m: dict[str, Any],
                prompt_len: int, completion_len: int, lr: float) -> dict[str, Any]:
    """The metrics.jsonl row of a step from its global rollout `ro` (`rollout.global_view`),
    the update's metrics `m`, SAGC's `sagc_m` and the step's learning rate `lr` (timings are
    added by the caller)."""
    g = ro.group_size
    v = ro.valid
    lens = ro.lengths[v] if v.any() else ro.lengths
    return {
        "step": step + 1, "group_size": g, "prompts": len(ro.lengths) // g,
        "rows": len(ro.lengths),
        "reward_mean": float(ro.raw_rewards[v].mean()) if v.any() else 0.0,
        "reward_std": float(ro.raw_rewards[v].std()) if v.any() else 0.0,
        "shaped_reward_mean": float(ro.rewards[v].mean()) if v.any() else 0.0,
        "len_mean": float(lens.mean()), "len_max": int(ro.lengths.max()),
        "truncated_frac": float(ro.truncated.mean()),
        "kept_groups": int(v.sum() // g), "rollout_rounds": ro.stats["rollout_rounds"],
        "reward_errors": ro.reward_errors,
        "padding_waste": int(ro.stats["padding_waste"]),
        "decode_steps": int(ro.stats["decode_steps"]), "train_len": completion_len,
        "prompt_len": prompt_len, "lr": lr,
        **{k: m[k] for k in _LOSS_KEYS if k in m},
        **sagc_m,
        "prefill_s": ro.stats["prefill_s"], "decode_s": ro.stats["decode_s"],
        "reward_s": ro.stats["reward_s"],
        **{k: ro.stats[k] for k in _EPISODE_KEYS if k in ro.stats},
    }


def trace_row(step: int, ro: Rollout, max_new_tokens: int) -> dict[str, Any]:
    """trace.jsonl row: per kept group, lengths, truncated flags and raw rewards (and, for
    episodes, each row's tokens per turn: ``turns`` [G][max_turns])."""
    g = ro.group_size

    def group(i: int) -> dict[str, Any]:
        rows = slice(i * g, (i + 1) * g)
        out = {"lengths": ro.lengths[rows].tolist(), "truncated": ro.truncated[rows].tolist(),
               "rewards": ro.raw_rewards[rows].round(6).tolist()}
        if ro.turn_tokens is not None:
            out["turns"] = ro.turn_tokens[rows].tolist()
        return out

    return {"step": step + 1, "group_size": g, "max_new_tokens": max_new_tokens,
            "groups": [group(i) for i in range(len(ro.lengths) // g) if ro.valid[i * g]]}
