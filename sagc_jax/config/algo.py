"""The training sections: ``algo:`` (the objective), ``optim:`` and ``init:`` (warm start)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from sagc_jax.config.base import Bool, Float, Int, PosInt, Section, Str, field, rule_error

__all__ = ["AlgoConfig", "InitConfig", "OptimConfig"]


class AlgoConfig(Section):
    """GRPO / DAPO / Dr. GRPO / GSPO objective (docs/algorithms.md)."""

    section_key = "algo"
    beta: Float = field(0.0, "KL weight; 0 = no reference model.", ge=0)
    kl_estimator: Literal["k1", "k3"] = field("k3", "KL estimator (Schulman's k1 or k3).")
    epsilon: Float = field(0.2, "Lower PPO clip range (ratio >= 1 - epsilon).", gt=0, lt=1)
    epsilon_high: Float = field(
        0.28, "Upper clip range (ratio <= 1 + epsilon_high); DAPO clip-higher.", gt=0
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = field(
        "token-mean", "How per-token losses are aggregated."
    )
    num_iterations: Int = field(1, "Optimisation passes (mu) per batch of rollouts.", ge=1)
    importance_sampling: Literal["token", "sequence"] = field(
        "token", "Importance ratio per token (GRPO) or per sequence, length-normalised (GSPO)."
    )
    clip_delta: Float | None = field(
        None, "Two-sided clipping: cap of the unclipped ratio (> 1 + epsilon_high); None = off.",
        gt=1,
    )
    kl_bias_correction: Bool = field(
        False, "Multiply the KL estimate by the token ratio (DeepSeek-V3.2 unbiased estimator)."
    )
    scale_rewards: Literal["group", "batch", "none"] = field(
        "group", "Advantage (r - group mean) / std of the group, of the batch, or none (Dr. GRPO)."
    )
    std_ddof: Int = field(
        0, "Reward std estimator: 0 population, 1 unbiased (TRL).", ge=0, le=1
    )
    adv_eps: Float = field(1e-4, "Epsilon added to the reward std (TRL's 1e-4).", gt=0)
    top_entropy_quantile: Float = field(
        1.0, "Policy loss only on the top fraction of tokens by entropy (0.2 in the 80/20 "
        "paper); 1 = all.", ge=0, le=1,
    )
    off_policy_mask_threshold: Float | None = field(
        None, "Drop the policy-gradient term of negative-advantage sequences whose mean token "
        "log(pi_old / pi) exceeds this (nats; DeepSeek-V3.2, TRL's off_policy_mask_threshold); "
        "None = off.", ge=0,
    )
    micro_batch_rows: Int | None = field(
        None, "Rows per gradient-accumulation micro-batch; None = whole batch.", ge=1
    )
    dynamic_sampling: Bool = field(False, "DAPO: drop groups whose rewards are all equal.")
    dynamic_sampling_rounds: Int = field(
        0, "Extra sampling rounds to refill dropped groups (0 = none).", ge=0
    )
    overlong_buffer: Int = field(
        0, "DAPO soft overlong punishment window (tokens before the limit); 0 = off.", ge=0
    )
    overlong_penalty: Float = field(1.0, "Maximum overlong penalty (reached at the limit).", ge=0)
    mask_truncated: Bool = field(False, "Exclude truncated completions from the loss.")
    packing: Bool = field(
        True,
        "Pack several (prompt + completion) sequences into each row of pack_len slots for the "
        "train step and the log-prob passes, a group's prompt once per row (exact); false = "
        "one sequence per row (the same steps, more slots computed).",
    )
    pack_len: PosInt | None = field(
        None, "Slots per packed row; None = largest prompt bucket + max_new_tokens - 1, rounded "
        "up to 8."
    )
    pack_chunk_rows: tuple[PosInt, ...] | None = field(
        None,
        "Declared packed-row counts of the compiled chunks an update runs (one compile each); "
        "None = micro_batch_rows (or 8 x data x fsdp) halved while a multiple of data x fsdp.",
    )

    @model_validator(mode="after")
    def _clip(self) -> AlgoConfig:
        if self.epsilon_high < self.epsilon:
            raise rule_error(
                "epsilon_high", f"must be >= algo.epsilon ({self.epsilon}), got {self.epsilon_high}"
            )
        if self.clip_delta is not None and self.clip_delta <= 1 + self.epsilon_high:
            raise rule_error(
                "clip_delta",
                f"must be > 1 + algo.epsilon_high ({1 + self.epsilon_high}), got {self.clip_delta}",
            )
        return self


class OptimConfig(Section):
    """AdamW with warm-up and cosine/constant schedule."""

    section_key = "optim"
    lr: Float = field(1e-4, "Peak learning rate.", gt=0)
    warmup_steps: Int = field(10, "Linear warm-up steps.", ge=0)
    schedule: Literal["cosine", "constant"] = field("cosine", "Decay after warm-up.")
    min_lr_ratio: Float = field(0.1, "Final lr as a fraction of peak (cosine).", ge=0, le=1)
    weight_decay: Float = field(0.0, "Decoupled weight decay.", ge=0)
    b1: Float = field(0.9, "Adam beta1.", ge=0, lt=1)
    b2: Float = field(0.99, "Adam beta2.", ge=0, lt=1)
    eps: Float = field(1e-8, "Adam epsilon.", gt=0)
    max_grad_norm: Float = field(1.0, "Global-norm gradient clipping; 0 = off.", ge=0)


class InitConfig(Section):
    """Optional supervised warm start before RL (built-in tasks)."""

    section_key = "init"
    sft_steps: Int = field(0, "SFT steps before GRPO; 0 = none.", ge=0)
    sft_lr: Float = field(1e-3, "SFT learning rate.", gt=0)
    sft_batch_size: Int = field(32, "SFT examples per step.", ge=1)
    sft_format_noise: Float = field(
        0.0,
        "Fraction of SFT solutions whose answer line is written 'answer: N' instead of "
        "'#### N' (which the exact_answer reward needs): GRPO then has a format habit to fix.",
        ge=0,
        lt=1,
    )
    params: Str | None = field(
        None,
        "Orbax params dir to start from instead of the SFT warm start (e.g. another run's "
        "checkpoints/initial): comparisons then share one warm start.",
    )
    seed: Int | None = field(
        None,
        "Seed of the warm start (random model weights, SFT data order and format noise); "
        "None = run.seed. Runs that set it share one warm start across run seeds, as runs "
        "from one pretrained checkpoint do; run.seed then varies only the RL part.",
    )
