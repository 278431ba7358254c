"""Optimizer and learning-rate schedule: global-norm clipping + AdamW with warmup.

``cfg`` is any object with attributes ``lr, warmup_steps, schedule ("cosine" | "constant"),
min_lr_ratio, weight_decay, b1, b2, eps, max_grad_norm`` (normally ``config.OptimConfig``).
Steps count optimizer updates (not micro-batches).
"""

from __future__ import annotations

from typing import Any

import optax


def make_schedule(cfg: Any, total_steps: int) -> optax.Schedule:
    """Learning rate (per update step) as a function of the step count.

    ``"cosine"``: linear warmup 0 → lr over ``warmup_steps``, then cosine decay to
    ``lr · min_lr_ratio`` at ``total_steps``. ``"constant"``: linear warmup, then ``lr``.
    With ``warmup_steps == 0`` the first step already uses ``lr``.
    """
    lr = float(cfg.lr)
    warmup = int(cfg.warmup_steps)
    if warmup < 0 or total_steps <= 0:
        raise ValueError(f"need warmup_steps >= 0 and total_steps > 0, got {warmup}, {total_steps}")
    if cfg.schedule == "cosine":
        # optax's decay_steps is the total length incl. warmup; it must exceed warmup.
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=lr,
            warmup_steps=warmup,
            decay_steps=max(int(total_steps), warmup + 1),
            end_value=lr * float(cfg.min_lr_ratio),
        )
    if cfg.schedule == "constant":
        if warmup == 0:
            return optax.constant_schedule(lr)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup]
        )
    raise ValueError(f"optim.schedule must be 'cosine' or 'constant', got {cfg.schedule!r}")


def make_optimizer(
    cfg: Any, total_steps: int, weight_decay_mask: Any = None
) -> optax.GradientTransformation:
    """``clip_by_global_norm(max_grad_norm)`` → ``adamw(schedule, b1, b2, eps, weight_decay)``.

    Clipping is disabled (identity, same state structure) when ``max_grad_norm`` is None or ≤ 0.
    ``weight_decay_mask`` (a pytree of
    bools or a callable, as in ``optax.adamw``) optionally limits decay to some params.
    """
    adamw = optax.adamw(
        make_schedule(cfg, total_steps),
        b1=float(cfg.b1),
        b2=float(cfg.b2),
        eps=float(cfg.eps),
        weight_decay=float(cfg.weight_decay),
        mask=weight_decay_mask,
    )
    max_norm = cfg.max_grad_norm
    clip = (
        optax.identity()
        if max_norm is None or max_norm <= 0
        else optax.clip_by_global_norm(float(max_norm))
    )
    return optax.chain(clip, adamw)


def make_sft_optimizer(init: Any) -> optax.GradientTransformation:
    """The SFT warm start's optimizer (``init`` section): clip 1.0 → AdamW with a warm-up to
    ``sft_lr`` over min(20, steps / 4) steps, cosine decay to a tenth by ``sft_steps``. Its
    state covers the base params (with LoRA too: the warm start trains the base)."""
    n, lr = int(init.sft_steps), float(init.sft_lr)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, lr, min(20, n // 4), max(n, 2), lr * 0.1)))


def sft_seq_len(cfg: Any) -> int:
    """Tokens of an SFT row at most: the largest prompt bucket + ``sampling.max_new_tokens``."""
    return int(cfg.sampling.prompt_buckets[-1]) + int(cfg.sampling.max_new_tokens)
