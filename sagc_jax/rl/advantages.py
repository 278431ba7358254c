"""Group-relative advantages (GRPO / Dr. GRPO) over batches whose group size changes step to step.

Rows are laid out prompt-major: the ``G`` completions of prompt ``p`` are rows ``p*G .. p*G+G-1``
(see :func:`group_ids_for`). Statistics are computed with segment sums over explicit group ids, so
one compiled function serves any ``G`` as long as the padded row count and ``num_groups`` (the
bucket's shape) stay the same; padded rows are marked invalid and excluded.

Standard-deviation convention: ``ddof=0`` (population std) by default. Note that TRL's
``GRPOTrainer`` uses ``torch.Tensor.std`` which is the *unbiased* (Bessel, ``ddof=1``) estimator;
pass ``ddof=1`` for numeric parity with TRL.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

AdvantageKind = Literal["grpo", "dr_grpo"]


def group_ids_for(num_prompts: int, group_size: int) -> np.ndarray:
    """Prompt-major group ids: row ``r`` belongs to group ``r // group_size``.

    Returns:
        ``int32[num_prompts * group_size]``.
    """
    if num_prompts < 0 or group_size <= 0:
        raise ValueError(f"need num_prompts >= 0, group_size > 0; got {num_prompts}, {group_size}")
    return np.repeat(np.arange(num_prompts, dtype=np.int32), group_size)


def _group_stats(
    rewards: jax.Array, group_ids: jax.Array, valid: jax.Array, num_groups: int, ddof: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Per-group count, mean and std over valid rows; also the clipped ids used for gathering."""
    # Padded rows may carry any id (e.g. -1 or num_groups); clip so gathers stay in range, and
    # zero their contribution via `valid` rather than relying on out-of-range segment dropping.
    ids = jnp.clip(group_ids.astype(jnp.int32), 0, num_groups - 1)
    w = valid.astype(jnp.float32)
    r = jnp.where(valid, rewards.astype(jnp.float32), 0.0)  # where, not *: padded rows may be NaN
    count = jax.ops.segment_sum(w, ids, num_segments=num_groups)
    mean = jax.ops.segment_sum(r, ids, num_segments=num_groups) / jnp.maximum(count, 1.0)
    # Two-pass variance: numerically safer than E[r^2] - E[r]^2 in float32.
    dev = jnp.where(valid, r - mean[ids], 0.0)
    ssq = jax.ops.segment_sum(dev * dev, ids, num_segments=num_groups)
    std = jnp.sqrt(ssq / jnp.maximum(count - ddof, 1.0))
    return ids, count, mean, std


@functools.partial(jax.jit, static_argnames=("num_groups", "kind", "ddof"))
def group_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    valid: jax.Array,
    num_groups: int,
    kind: AdvantageKind = "grpo",
    eps: float = 1e-4,
    ddof: int = 0,
) -> jax.Array:
    """Per-row advantage relative to the row's group.

    Args:
        rewards: ``f32[R]`` scalar reward per completion (any units; advantages are unitless for
            ``grpo``, reward units for ``dr_grpo``).
        group_ids: ``i32[R]`` group index of each row in ``[0, num_groups)``; ids of invalid rows
            are ignored (any value is fine).
        valid: ``bool[R]``; False for padding rows. Invalid rows get advantage 0 and do not count
            in the group statistics.
        num_groups: static number of segments (bucket capacity in prompts).
        kind: ``"grpo"`` → ``(r − mean_g) / (std_g + eps)``; ``"dr_grpo"`` → ``r − mean_g``
            (Dr. GRPO drops the std normalisation).
        eps: added to the std (not the variance) — the TRL/DeepSeek form.
        ddof: std delta degrees of freedom; 0 = population std (default), 1 = unbiased (TRL).

    Returns:
        ``f32[R]`` advantages; exactly 0 for invalid rows and for zero-variance groups.
    """
    if kind not in ("grpo", "dr_grpo"):
        raise ValueError(f"kind must be 'grpo' or 'dr_grpo', got {kind!r}")
    valid = jnp.asarray(valid, dtype=bool)
    ids, _, mean, std = _group_stats(
        jnp.asarray(rewards), jnp.asarray(group_ids), valid, num_groups, ddof
    )
    adv = jnp.asarray(rewards, jnp.float32) - mean[ids]
    if kind == "grpo":
        adv = adv / (std[ids] + eps)
    return jnp.where(valid, adv, 0.0)


def zero_variance_groups(
    rewards: jax.Array | np.ndarray,
    group_ids: jax.Array | np.ndarray,
    num_groups: int,
    valid: jax.Array | np.ndarray | None = None,
) -> np.ndarray:
    """Groups whose valid rewards are all identical — no learning signal (DAPO dynamic sampling).

    Host-side (NumPy), exact comparison (max == min), so no float tolerance is involved.

    Args:
        rewards: ``f32[R]``.
        group_ids: ``i32[R]`` in ``[0, num_groups)`` for valid rows.
        num_groups: number of groups.
        valid: optional ``bool[R]``; invalid rows are ignored.

    Returns:
        ``bool[num_groups]``; True for zero-variance groups, including empty groups (no valid rows)
        and single-row groups.
    """
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(group_ids, dtype=np.int64)
    v = np.ones(r.shape, bool) if valid is None else np.asarray(valid, dtype=bool)
    r, g = r[v], g[v]
    if g.size and (g.min() < 0 or g.max() >= num_groups):
        raise ValueError(f"valid group ids must lie in [0, {num_groups}), got {g.min()}..{g.max()}")
    hi = np.full(num_groups, -np.inf)
    lo = np.full(num_groups, np.inf)
    np.maximum.at(hi, g, r)
    np.minimum.at(lo, g, r)
    # Empty groups: hi=-inf < lo=+inf → treated as zero-variance (nothing to learn from).
    return ~(hi > lo)
