"""Rollouts: sample groups, score them, refill (DAPO dynamic sampling)."""

from sagc_jax.rollout.collect import (
    CollectSettings,
    FirstRound,
    Rollout,
    collect,
    global_view,
    rollout_key,
)

__all__ = ["CollectSettings", "FirstRound", "Rollout", "collect", "global_view",
           "rollout_key"]
