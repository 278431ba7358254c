"""The GRPO/DAPO update over the train layout (`rl.batch`), and the SFT step, as pure functions.

An update runs the batch's chunks one compiled call each (`make_grad_step`), accumulating
gradients, then applies the optimizer once (`make_apply_step`). Per-sequence arrays (`SEQ_FIELDS`,
[S, ...] with S the largest batch of the run, padded with invalid rows) are the same on every
call; chunk i's loss masks in its own sequences only (`chunk == i`). Every aggregation divides
sums by full-batch normalisers (see `rl.losses`), so the accumulated loss and gradient equal
those of one pass over the whole batch (up to float summation order): where a token sits never
changes the loss. Advantages are computed inside the step (per group, from the rewards), so
nothing on the host needs a compile when G changes.

Compiled shapes: one grad step and one log-prob step per chunk size, one apply step — none
depends on G, the prompt bucket or the completion lengths. `train.learner.Learner` compiles them
over the mesh and runs the host loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sagc_jax.models.lora import BASE, split_trainable, trainable
from sagc_jax.rl.advantages import (
    DEFAULT_ADV_EPS,
    frac_reward_zero_std,
    group_advantages,
    scored_rows,
)
from sagc_jax.rl.losses import (
    METRICS,
    LossNorms,
    entropy_threshold,
    loss_norms,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)
from sagc_jax.rl.noise_scale import NOISE_SUMS, chunk_sums, with_noise_terms

SUM_METRICS = ("loss", *METRICS, *NOISE_SUMS)


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

    @classmethod
    def from_config(cls, cfg: Any) -> LossSettings:
        """The loss settings of a Config (`algo.*`, sampling temperature and length)."""
        a, s = cfg.algo, cfg.sampling
        return cls(epsilon=a.epsilon, epsilon_high=a.epsilon_high, clip_delta=a.clip_delta,
                   importance_sampling=a.importance_sampling, loss_agg=a.loss_agg, beta=a.beta,
                   kl_estimator=a.kl_estimator, kl_bias_correction=a.kl_bias_correction,
                   scale_rewards=a.scale_rewards, std_ddof=a.std_ddof, adv_eps=a.adv_eps,
                   top_entropy_quantile=a.top_entropy_quantile,
                   off_policy_threshold=a.off_policy_mask_threshold,
                   temperature=s.temperature, max_tokens=s.max_new_tokens)

    def loss(self, logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
             mask: jax.Array, *, ref_logprobs: jax.Array, entropy: jax.Array,
             entropy_min: jax.Array | None, norms: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        """`policy_loss` under these settings (the KL only with `beta > 0`)."""
        return policy_loss(
            logprobs, old_logprobs, advantages, mask, epsilon=self.epsilon,
            epsilon_high=self.epsilon_high, clip_delta=self.clip_delta,
            importance_sampling=self.importance_sampling, loss_agg=self.loss_agg,
            ref_logprobs=ref_logprobs if self.beta > 0 else None, beta=self.beta,
            kl_estimator=self.kl_estimator, kl_bias_correction=self.kl_bias_correction,
            entropy=entropy, entropy_min=entropy_min,
            off_policy_threshold=self.off_policy_threshold, norms=norms,
            max_tokens=self.max_tokens)


def unpack(values: jax.Array, row: jax.Array, start: jax.Array, n: int) -> jax.Array:
    """Per-slot values [rows, L] -> per-sequence [S, n]: out[s, t] = values[row_s,
    start_s + t]. Slots past the row end are clamped (garbage the caller masks out)."""
    cols = jnp.minimum(start[:, None] + jnp.arange(n)[None, :], values.shape[1] - 1)
    return values[row[:, None], cols]


def layout_logprobs(graphdef: nnx.GraphDef, params: Any, chunk: dict[str, jax.Array],
                    temperature: float, entropy: bool = False
                    ) -> tuple[jax.Array, jax.Array | None]:
    """(log-prob, entropy or None) [rows, loss_cap] of the target of each scored slot
    (`head_slots`) under softmax(logits / temperature): the LM head runs on those slots only."""
    model = nnx.merge(graphdef, params)
    logits = model(chunk["tokens"], positions=chunk["positions"],
                   segment_ids=chunk["segment_ids"], branch_ids=chunk["branch_ids"],
                   logits_at=chunk["head_slots"])
    return token_logprobs_and_entropy(logits, chunk["head_targets"], temperature,
                                      entropy=entropy)


def _batch_terms(seqs: dict[str, jax.Array], s: LossSettings, num_groups: int
                 ) -> tuple[jax.Array, jax.Array, jax.Array, LossNorms]:
    """(advantages [S], scored rows [S], full-batch loss mask [S, N], its normalisers): rows
    with a NaN reward (unscored) are out of the loss and of the Dr. GRPO row count; tokens off
    `loss_mask` (an environment's, in multi-turn episodes) are out of the loss and its counts."""
    adv = group_advantages(seqs["rewards"], seqs["group_ids"], seqs["valid"],
                           num_groups=num_groups, scale=s.scale_rewards, eps=s.adv_eps,
                           ddof=s.std_ddof)
    scored = scored_rows(seqs["rewards"], seqs["valid"])
    n = seqs["old_logprobs"].shape[1]
    mask = ((jnp.arange(n)[None, :] < seqs["lengths"][:, None])
            & (seqs["loss_rows"] & scored)[:, None] & seqs["loss_mask"])
    return adv, scored, mask, loss_norms(mask, scored.sum())


def make_grad_step(graphdef: nnx.GraphDef, settings: LossSettings, *,
                   num_groups: int) -> Callable:
    """`grad_step(params, acc, chunk, seqs, index) -> acc`: adds chunk `index`'s loss gradient
    and summed metrics to `acc = (grads, sums)` (not jitted; `num_groups` is static). Grads are
    of `lora.trainable(params)` (the adapters when the model has them)."""
    s = settings

    def grad_step(params, acc, chunk, seqs, index):
        adv, _, full, norms = _batch_terms(seqs, s, num_groups)
        mask = full & (seqs["chunk"] == index)[:, None]
        n = mask.shape[1]
        ent_min = (entropy_threshold(seqs["entropy"], full, s.top_entropy_quantile)
                   if s.top_entropy_quantile < 1.0 else None)
        train, frozen = split_trainable(params)

        def loss_fn(t):
            logp, ent = layout_logprobs(graphdef, nnx.merge_state(t, frozen), chunk,
                                        s.temperature, entropy=True)
            logp = unpack(logp, seqs["row"], seqs["hstart"], n)
            ent = unpack(ent, seqs["row"], seqs["hstart"], n)
            return s.loss(logp, seqs["old_logprobs"], adv, mask,
                          ref_logprobs=seqs["ref_logprobs"], entropy=ent, entropy_min=ent_min,
                          norms=norms)

        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(train)
        grads, sums = acc
        m = {**m, "loss": loss, **chunk_sums(g, mask, norms, s.loss_agg, s.max_tokens)}
        return (jax.tree.map(jnp.add, grads, g),
                {k: sums[k] + m[k] for k in SUM_METRICS})

    return grad_step


def make_apply_step(optimizer: optax.GradientTransformation, settings: LossSettings, *,
                    num_groups: int) -> Callable:
    """`apply(params, opt_state, acc, seqs) -> (params, opt_state, metrics)`: one optimizer
    update of `lora.trainable(params)` from the gradient accumulated over the chunks.

    A non-finite loss or gradient norm keeps the old params and optimizer state and reports
    `finite = 0` (the host turns that into an error after saving the last good state). Adds the
    batch metrics (grad norm, |advantage| over scored rows, the zero-std group fraction, loss
    tokens) to the summed loss metrics and `rl.noise_scale`'s terms.
    """

    def apply(params, opt_state, acc, seqs):
        train, frozen = split_trainable(params)
        grads, sums = acc
        adv, scored, _, norms = _batch_terms(seqs, settings, num_groups)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = optimizer.update(grads, opt_state, train)
        new_train = optax.apply_updates(train, updates)
        finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        w = scored.astype(jnp.float32)
        metrics = {**with_noise_terms(sums, norms), "grad_norm": grad_norm,
                   "finite": finite.astype(jnp.float32),
                   "adv_abs_mean": (jnp.abs(adv) * w).sum() / jnp.maximum(w.sum(), 1.0),
                   "frac_reward_zero_std": frac_reward_zero_std(
                       seqs["rewards"], seqs["group_ids"], seqs["valid"],
                       num_groups=num_groups, ddof=settings.std_ddof),
                   "loss_tokens": norms.tokens}
        return (nnx.merge_state(keep(new_train, train), frozen), keep(new_opt, opt_state),
                metrics)

    return apply


def make_logprob_step(graphdef: nnx.GraphDef, temperature: float,
                      entropy: bool = False) -> Callable:
    """`step(params, out, chunk, seqs, index) -> out`: writes the completion log-probs [S, N]
    (old / reference passes), or with `entropy` the token entropies (nats), of chunk `index`'s
    sequences into `out`."""

    def step(params, out, chunk, seqs, index):
        logp, ent = layout_logprobs(graphdef, params, chunk, temperature, entropy=entropy)
        x = unpack(ent if entropy else logp, seqs["row"], seqs["hstart"], out.shape[1])
        return jnp.where((seqs["chunk"] == index)[:, None], x, out)

    return step


def zero_acc(params: Any) -> tuple[Any, dict[str, jax.Array]]:
    """An empty accumulator (zero grads like the trainable params, zero metric sums)."""
    return (jax.tree.map(jnp.zeros_like, trainable(params)),
            {k: jnp.zeros((), jnp.float32) for k in SUM_METRICS})


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
