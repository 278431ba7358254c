"""Group-relative advantages (GRPO / Dr. GRPO / batch-scaled) over batches whose G changes.

Rows are laid out prompt-major (the ``G`` completions of prompt ``p`` are rows ``p*G .. p*G+G-1``)
but nothing here relies on it: statistics are segment sums over explicit group ids, so one
compiled function serves any ``G`` as long as the padded row count and ``num_groups`` (the
bucket's shape) stay the same. Groups may be ragged (rows missing from some groups).

Which rows count ("scored" rows): ``valid & isfinite(reward)``. Padding rows are not valid; a
NaN reward is the TRL convention for "every reward function returned ``None``" (not applicable):
such a row is left out of its group's mean and std, gets advantage 0, and should be left out of
the loss too (:func:`scored_rows`).

Formulas (``r`` = reward, ``g`` = the row's group, statistics over scored rows)::

    group:  A = (r − mean_g) / (std_g + eps)      GRPO (DeepSeekMath), TRL scale_rewards="group"
    batch:  A = (r − mean_g) / (std_B + eps)      std over the whole batch ("PPO Lite"), TRL "batch"
    none:   A =  r − mean_g                       Dr. GRPO, TRL scale_rewards="none"

``std`` uses ``ddof`` (0 = population std, our default; 1 = unbiased, what TRL's
``torch.std`` computes). ``eps = 1e-4`` is TRL's value. Rows of a group whose rewards are all
equal (std ≈ 0: no learning signal) get exactly 0 in every mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp

ScaleRewards = Literal["group", "batch", "none"]
DEFAULT_ADV_EPS = 1e-4  # TRL's constant

#: An advantage estimator (the choices of ``algo.scale_rewards``):
#: ``fn(centred, std, ids, r, scored, eps, ddof) -> f32[R]``, with ``centred = r − mean_g`` per
#: row, ``std`` the groups' stds ``[num_groups]`` and ``ids`` the rows' groups, ``r`` the rewards
#: (0 where not ``scored``). Rows not scored and zero-std groups are zeroed by the caller.
AdvantageFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, float, int],
                       jax.Array]


def _scale_by_group(centred: jax.Array, std: jax.Array, ids: jax.Array, r: jax.Array,
                    scored: jax.Array, eps: float, ddof: int) -> jax.Array:
    """GRPO: (r − mean_g) / (std_g + eps)."""
    return centred / (std[ids] + eps)


def _scale_by_batch(centred: jax.Array, std: jax.Array, ids: jax.Array, r: jax.Array,
                    scored: jax.Array, eps: float, ddof: int) -> jax.Array:
    """PPO Lite: (r − mean_g) / (std over the whole batch + eps)."""
    n = scored.sum().astype(jnp.float32)
    batch_mean = r.sum() / jnp.maximum(n, 1.0)
    dev = jnp.where(scored, r - batch_mean, 0.0)
    return centred / (jnp.sqrt((dev * dev).sum() / jnp.maximum(n - ddof, 1.0)) + eps)


def _no_scale(centred: jax.Array, std: jax.Array, ids: jax.Array, r: jax.Array,
              scored: jax.Array, eps: float, ddof: int) -> jax.Array:
    """Dr. GRPO: r − mean_g."""
    return centred


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "group": _scale_by_group,
    "batch": _scale_by_batch,
    "none": _no_scale,
}
SCALE_REWARDS = tuple(ADVANTAGE_ESTIMATORS)


def scored_rows(rewards: jax.Array, valid: jax.Array) -> jax.Array:
    """``bool[R]``: rows that enter the statistics and the loss (valid and a finite reward)."""
    return jnp.asarray(valid, bool) & jnp.isfinite(jnp.asarray(rewards))


def _zero_std(std: jax.Array, mean: jax.Array) -> jax.Array:
    """Std that is 0 up to float32 rounding of the mean (identical rewards, e.g. 0.9 × 3)."""
    return std <= 1e-8 + 1e-6 * jnp.abs(mean)


def _group_stats(rewards: jax.Array, group_ids: jax.Array, scored: jax.Array, num_groups: int,
                 ddof: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """(clipped ids [R], masked rewards [R], count, mean, std [num_groups]) over scored rows."""
    # Padded rows may carry any id (e.g. -1 or num_groups); clip so gathers stay in range, and
    # zero their contribution via `scored` rather than relying on out-of-range segment dropping.
    ids = jnp.clip(group_ids.astype(jnp.int32), 0, num_groups - 1)
    r = jnp.where(scored, rewards.astype(jnp.float32), 0.0)  # where, not *: NaN must not leak
    count = jax.ops.segment_sum(scored.astype(jnp.float32), ids, num_segments=num_groups)
    mean = jax.ops.segment_sum(r, ids, num_segments=num_groups) / jnp.maximum(count, 1.0)
    # Two-pass variance: numerically safer than E[r^2] - E[r]^2 in float32.
    dev = jnp.where(scored, r - mean[ids], 0.0)
    ssq = jax.ops.segment_sum(dev * dev, ids, num_segments=num_groups)
    std = jnp.sqrt(ssq / jnp.maximum(count - ddof, 1.0))
    return ids, r, count, mean, std


@functools.partial(jax.jit, static_argnames=("num_groups", "scale", "ddof"))
def group_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    valid: jax.Array,
    num_groups: int,
    scale: ScaleRewards = "group",
    eps: float = DEFAULT_ADV_EPS,
    ddof: int = 0,
) -> jax.Array:
    """Per-row advantage relative to the row's group.

    Args:
        rewards: ``f32[R]`` scalar reward per completion (any units); NaN = not scored.
        group_ids: ``i32[R]`` group index of each row in ``[0, num_groups)``; ids of rows that
            are not scored are ignored (any value is fine).
        valid: ``bool[R]``; False for padding rows.
        num_groups: static number of segments (bucket capacity in prompts).
        scale: ``"group"`` | ``"batch"`` | ``"none"`` (module docstring). Advantages are unitless
            for the first two, in reward units for ``"none"``.
        eps: added to the std (not the variance), the TRL/DeepSeek form.
        ddof: std delta degrees of freedom, 0 or 1.

    Returns:
        ``f32[R]`` advantages; exactly 0 for unscored rows and for zero-std groups.
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"group_advantages: scale must be one of {SCALE_REWARDS}, got {scale!r}")
    if ddof not in (0, 1):
        raise ValueError(f"group_advantages: ddof must be 0 or 1, got {ddof!r}")
    scored = scored_rows(rewards, valid)
    ids, r, _, mean, std = _group_stats(jnp.asarray(rewards), jnp.asarray(group_ids), scored,
                                        num_groups, ddof)
    adv = ADVANTAGE_ESTIMATORS[scale](r - mean[ids], std, ids, r, scored, eps, ddof)
    flat = _zero_std(std, mean)[ids]
    return jnp.where(scored & ~flat, adv, 0.0)


@functools.partial(jax.jit, static_argnames=("num_groups", "ddof"))
def frac_reward_zero_std(
    rewards: jax.Array, group_ids: jax.Array, valid: jax.Array, num_groups: int, ddof: int = 0
) -> jax.Array:
    """Fraction of groups (with ≥1 scored row) whose scored rewards are all equal.

    Those groups carry no policy-gradient signal (DAPO's dynamic sampling drops them). TRL logs
    the same quantity per row; for equal group sizes the two agree.

    Returns:
        ``f32[]`` in [0, 1]; 0 when no group has a scored row.
    """
    scored = scored_rows(rewards, valid)
    _, _, count, mean, std = _group_stats(jnp.asarray(rewards), jnp.asarray(group_ids), scored,
                                          num_groups, ddof)
    present = count > 0
    flat = present & _zero_std(std, mean)
    return flat.sum().astype(jnp.float32) / jnp.maximum(present.sum(), 1).astype(jnp.float32)
