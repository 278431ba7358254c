"""The GRPO/DAPO update and SFT step as pure functions (jitted in `train.learner`).

Advantages are computed inside the step (per group, with that step's G),
so nothing on the host needs a compile when G changes.

Sequence layout of a rollout batch (all [R, ...], rows prompt-major):
    tokens [R, Lp + N] = left-padded prompt (Lp = prompt bucket) | completion right-padded to N
    Position Lp + t - 1 predicts completion token t.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sagc_jax.models.lora import BASE, split_trainable
from sagc_jax.rl.advantages import (
    DEFAULT_ADV_EPS,
    frac_reward_zero_std,
    group_advantages,
    scored_rows,
)
from sagc_jax.rl.losses import (
    METRICS,
    entropy_threshold,
    loss_norms,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Static (hashable) loss settings: a change means a different compiled step.

    See docs/algorithms.md for the formulas; names follow the `algo.*` config keys.
    """

    epsilon: float = 0.2
    epsilon_high: float = 0.28
    clip_delta: float | None = None
    importance_sampling: str = "token"
    loss_agg: str = "token-mean"
    beta: float = 0.0
    kl_estimator: str = "k3"
    kl_bias_correction: bool = False
    scale_rewards: str = "group"
    std_ddof: int = 0
    adv_eps: float = DEFAULT_ADV_EPS
    top_entropy_quantile: float = 1.0
    off_policy_threshold: float | None = None
    temperature: float = 1.0
    max_tokens: int = 128  # Dr. GRPO's constant normaliser (max_new_tokens)

    def advantages(self, rewards: jax.Array, group_ids: jax.Array, valid: jax.Array,
                   num_groups: int) -> jax.Array:
        """`f32[R]` group advantages under these settings (the padded and packed steps')."""
        return group_advantages(rewards, group_ids, valid, num_groups=num_groups,
                                scale=self.scale_rewards, eps=self.adv_eps, ddof=self.std_ddof)

    def loss(self, logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
             mask: jax.Array, *, ref_logprobs: jax.Array, entropy: jax.Array,
             entropy_min: jax.Array | None, norms: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        """`policy_loss` under these settings (the KL only with `beta > 0`), the one call of
        both train steps."""
        return policy_loss(
            logprobs, old_logprobs, advantages, mask, epsilon=self.epsilon,
            epsilon_high=self.epsilon_high, clip_delta=self.clip_delta,
            importance_sampling=self.importance_sampling, loss_agg=self.loss_agg,
            ref_logprobs=ref_logprobs if self.beta > 0 else None, beta=self.beta,
            kl_estimator=self.kl_estimator, kl_bias_correction=self.kl_bias_correction,
            entropy=entropy, entropy_min=entropy_min,
            off_policy_threshold=self.off_policy_threshold, norms=norms,
            max_tokens=self.max_tokens)


# Names and ranks of the arrays a rollout batch carries into the step.
BATCH_FIELDS = {
    "tokens": 2, "prompt_pad": 1, "lengths": 1, "old_logprobs": 2, "ref_logprobs": 2,
    "rewards": 1, "group_ids": 1, "valid": 1, "loss_rows": 1,
}


def sequence_inputs(tokens: jax.Array, prompt_pad: jax.Array, lengths: jax.Array,
                    prompt_len: int) -> tuple[jax.Array, jax.Array]:
    """positions [R, T] and kv_mask [R, T] for a left-padded prompt + right-padded completion."""
    slots = jnp.arange(tokens.shape[1])[None, :]
    positions = jnp.maximum(slots - prompt_pad[:, None], 0)
    kv_mask = (slots >= prompt_pad[:, None]) & (slots < prompt_len + lengths[:, None])
    return positions, kv_mask


def completion_logits(graphdef: nnx.GraphDef, params: Any, tokens: jax.Array,
                      prompt_pad: jax.Array, lengths: jax.Array, prompt_len: int,
                      rows_sharding: Any = None) -> jax.Array:
    """Logits [R, N, V] at the positions that predict the N completion tokens.

    `rows_sharding`: the model's residual-stream sharding (see `Transformer.__call__`)."""
    model = nnx.merge(graphdef, params)
    positions, kv_mask = sequence_inputs(tokens, prompt_pad, lengths, prompt_len)
    logits = model(tokens[:, :-1], positions=positions[:, :-1], kv_mask=kv_mask[:, :-1],
                   rows_sharding=rows_sharding)
    return logits[:, prompt_len - 1:]


def completion_logprobs(graphdef: nnx.GraphDef, params: Any, tokens: jax.Array,
                        prompt_pad: jax.Array, lengths: jax.Array, prompt_len: int,
                        temperature: float, rows_sharding: Any = None) -> jax.Array:
    """Log-probs [R, N] of the completion tokens under softmax(logits / temperature)."""
    logits = completion_logits(graphdef, params, tokens, prompt_pad, lengths, prompt_len,
                               rows_sharding)
    return token_logprobs(logits, tokens[:, prompt_len:], temperature)


def completion_mask(lengths: jax.Array, loss_rows: jax.Array, n: int) -> jax.Array:
    """`bool[R, n]`: completion tokens of loss rows (t < length)."""
    return (jnp.arange(n)[None, :] < lengths[:, None]) & loss_rows[:, None]


def apply_update(optimizer: optax.GradientTransformation, train: Any, frozen: Any,
                 opt_state: Any, grads: Any, loss: jax.Array, metrics: dict[str, jax.Array],
                 adv: jax.Array, scored: jax.Array, norms: Any, rewards: jax.Array,
                 group_ids: jax.Array, valid: jax.Array, *, num_groups: int,
                 ddof: int) -> tuple[Any, Any, dict[str, jax.Array]]:
    """One optimizer update from a full-batch gradient, shared by the padded and packed steps.

    A non-finite loss or gradient norm keeps the old params and optimizer state and reports
    `finite = 0`. Adds the batch metrics (grad norm, |advantage| over scored rows [R], the
    zero-std group fraction, loss tokens) to the summed loss `metrics`.
    """
    grad_norm = optax.tree.norm(grads)
    updates, new_opt = optimizer.update(grads, opt_state, train)
    new_train = optax.apply_updates(train, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    w = scored.astype(jnp.float32)
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm,
               "finite": finite.astype(jnp.float32),
               "adv_abs_mean": (jnp.abs(adv) * w).sum() / jnp.maximum(w.sum(), 1.0),
               "frac_reward_zero_std": frac_reward_zero_std(
                   rewards, group_ids, valid, num_groups=num_groups, ddof=ddof),
               "loss_tokens": norms.tokens}
    return nnx.merge_state(keep(new_train, train), frozen), keep(new_opt, opt_state), metrics


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    settings: LossSettings, *, num_groups: int, prompt_len: int,
                    micro_batches: int = 1, rows_sharding: Any = None) -> Callable:
    """Returns `step(params, opt_state, batch) -> (params, opt_state, metrics)` (not jitted).

    `num_groups` (prompts in the batch), `prompt_len` (Lp) and `micro_batches` are static.
    Micro-batch losses use full-batch normalisers (and a full-batch entropy threshold), so
    accumulated gradients equal the full-batch gradient exactly. Rows whose reward is NaN (every
    reward function returned None) are out of the advantages' statistics and out of the loss. A
    non-finite loss or gradient leaves params and optimizer state unchanged and reports
    `finite = 0`; the host turns that into an error after saving the last good state.
    Only `lora.split_trainable(params)[0]` is differentiated and updated (the adapters when the
    model has LoRA adapters, else every param); `opt_state` is the optimizer's state of it.
    """
    s = settings
    mask_entropy = s.top_entropy_quantile < 1.0

    def forward(params, mb):
        """(log-probs, entropies, loss mask) of one (micro-)batch, all [rows, N]."""
        logits = completion_logits(graphdef, params, mb["tokens"], mb["prompt_pad"],
                                   mb["lengths"], prompt_len, rows_sharding)
        logp, ent = token_logprobs_and_entropy(logits, mb["tokens"][:, prompt_len:],
                                               s.temperature)
        return logp, ent, completion_mask(mb["lengths"], mb["loss_rows"], logp.shape[1])

    def loss_fn(params, mb, norms, ent_min):
        logp, ent, mask = forward(params, mb)
        if mask_entropy and micro_batches == 1:
            ent_min = entropy_threshold(ent, mask, s.top_entropy_quantile)  # the full batch
        return s.loss(logp, mb["old_logprobs"], mb["advantages"], mask,
                      ref_logprobs=mb["ref_logprobs"], entropy=ent,
                      entropy_min=ent_min if mask_entropy else None, norms=norms)

    def full_batch_entropy_min(params, split):
        """The entropy threshold over every micro-batch: one extra forward pass, no gradient."""
        def body(_, mb):
            _, ent, mask = forward(jax.lax.stop_gradient(params), mb)
            return None, (ent, mask)

        _, (ent, mask) = jax.lax.scan(body, None, split)
        return entropy_threshold(ent, mask, s.top_entropy_quantile)

    def step(params, opt_state, batch):
        train, frozen = split_trainable(params)
        adv = s.advantages(batch["rewards"], batch["group_ids"], batch["valid"], num_groups)
        scored = scored_rows(batch["rewards"], batch["valid"])
        loss_rows = batch["loss_rows"] & scored
        n = batch["old_logprobs"].shape[1]
        norms = loss_norms(completion_mask(batch["lengths"], loss_rows, n), scored.sum())
        data = {k: batch[k] for k in BATCH_FIELDS if k not in ("rewards", "group_ids", "valid")}
        data["advantages"] = adv
        data["loss_rows"] = loss_rows
        # Micro-batch k takes rows k, k + M, k + 2M, ... (M = micro_batches): each device's
        # contiguous block of rows then feeds every micro-batch equally, so a micro-batch stays
        # sharded over data x fsdp. A contiguous split ([M, R/M]) leaves each micro-batch on a
        # few devices, and GSPMD replicates it: every device computed every row. Any row split
        # gives the same gradient (the normalisers are the full batch's).
        split = jax.tree.map(
            lambda x: x.reshape(-1, micro_batches, *x.shape[1:]).swapaxes(0, 1), data)
        ent_min = jnp.zeros((), jnp.float32)
        if mask_entropy and micro_batches > 1:
            ent_min = full_batch_entropy_min(params, split)
        grad_fn = jax.value_and_grad(
            lambda t, *a: loss_fn(nnx.merge_state(t, frozen), *a), has_aux=True)

        def accumulate(carry, mb):
            grads, loss, metrics = carry
            (l, m), g = grad_fn(train, mb, norms, ent_min)
            return (jax.tree.map(jnp.add, grads, g), loss + l,
                    jax.tree.map(jnp.add, metrics, m)), None

        zeros = jax.tree.map(jnp.zeros_like, train)
        zero_m = {k: jnp.zeros((), jnp.float32) for k in METRICS}
        (grads, loss, metrics), _ = jax.lax.scan(
            accumulate, (zeros, jnp.zeros((), jnp.float32), zero_m), split)
        return apply_update(optimizer, train, frozen, opt_state, grads, loss, metrics, adv,
                            scored, norms, batch["rewards"], batch["group_ids"], batch["valid"],
                            num_groups=num_groups, ddof=s.std_ddof)

    return step


def make_sft_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation) -> Callable:
    """`step(params, opt_state, tokens [B,T], loss_mask [B,T]) -> (params, opt_state, loss)`.

    Next-token cross-entropy on right-padded sequences, averaged over loss_mask tokens (the
    solution + EOS), for the supervised warm start. It trains the base (`lora.BASE`: every
    param but LoRA adapters); `opt_state` is the optimizer's state of that part.
    """

    def loss_fn(params, tokens, loss_mask):
        model = nnx.merge(graphdef, params)
        logits = model(tokens[:, :-1])
        logp = token_logprobs(logits, tokens[:, 1:], 1.0)
        m = loss_mask[:, 1:].astype(jnp.float32)
        return -(logp * m).sum() / jnp.maximum(m.sum(), 1.0)

    def step(params, opt_state, tokens, loss_mask):
        base, rest = nnx.split_state(params, BASE, ...)
        loss, grads = jax.value_and_grad(
            lambda b: loss_fn(nnx.merge_state(b, rest), tokens, loss_mask))(base)
        updates, opt_state = optimizer.update(grads, opt_state, base)
        return nnx.merge_state(optax.apply_updates(base, updates), rest), opt_state, loss

    return step


def abstract_batch(rows: int, seq_len: int, completion_len: int) -> dict[str, Any]:
    """ShapeDtypeStructs of a rollout batch (for ahead-of-time compilation)."""
    i32, f32 = jnp.int32, jnp.float32
    return {
        "tokens": jax.ShapeDtypeStruct((rows, seq_len), i32),
        "prompt_pad": jax.ShapeDtypeStruct((rows,), i32),
        "lengths": jax.ShapeDtypeStruct((rows,), i32),
        "old_logprobs": jax.ShapeDtypeStruct((rows, completion_len), f32),
        "ref_logprobs": jax.ShapeDtypeStruct((rows, completion_len), f32),
        "rewards": jax.ShapeDtypeStruct((rows,), f32),
        "group_ids": jax.ShapeDtypeStruct((rows,), i32),
        "valid": jax.ShapeDtypeStruct((rows,), jnp.bool_),
        "loss_rows": jax.ShapeDtypeStruct((rows,), jnp.bool_),
    }
