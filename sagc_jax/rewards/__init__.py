"""Rewards: host-side Python functions (TRL convention) named in the config, run safely.

``registry`` (names → callables, the config's bundle), ``runner`` (per-call timeouts, value
checks, weighted totals), ``answers`` and ``verifiers`` (the built-ins).
"""

from sagc_jax.rewards.registry import (
    BUILTIN_REWARDS,
    RewardFn,
    RewardNameError,
    build_reward_fns,
    resolve_reward,
)
from sagc_jax.rewards.runner import RewardError, RewardResult, compute_rewards, score_groups

__all__ = ["BUILTIN_REWARDS", "RewardError", "RewardFn", "RewardNameError", "RewardResult",
           "build_reward_fns", "compute_rewards", "resolve_reward", "score_groups"]
