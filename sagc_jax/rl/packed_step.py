"""The GRPO update on packed sequences: exact, with static shapes whatever the batch holds.

An update runs the plan's chunks (`rl.packing`) one compiled call each, accumulating gradients,
then applies the optimizer once. Per-sequence arrays (`SEQ_FIELDS`, [S, ...] with S the largest
batch of the run, padded with invalid rows) are the same on every call; chunk i's loss masks in
its own sequences only (`chunk == i`). Every aggregation divides sums by full-batch normalisers
(see `rl.losses`), so the accumulated loss and gradient equal the unpacked step's exactly (up to
float summation order): packing changes where a token sits, never the loss.

Compiled shapes: one grad step and one log-prob step per chunk size, one apply step — none
depends on G, the prompt bucket or the completion lengths. `train.packed.PackedSteps` jits them
over the mesh and runs the host loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sagc_jax.rl.advantages import group_advantages
from sagc_jax.rl.losses import policy_loss, token_logprobs
from sagc_jax.rl.packing import unpack
from sagc_jax.rl.train_step import LossSettings

# Per-sequence arrays [S, ...] (name -> rank); `chunk`, `row`, `start` come from the PackPlan.
SEQ_FIELDS = {
    "lengths": 1, "loss_rows": 1, "old_logprobs": 2, "ref_logprobs": 2, "rewards": 1,
    "group_ids": 1, "valid": 1, "chunk": 1, "row": 1, "start": 1,
}
# Packed arrays of one chunk, int32 [chunk rows, pack_len].
CHUNK_FIELDS = ("tokens", "targets", "positions", "segment_ids")
SUM_METRICS = ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean")


def packed_logprobs(graphdef: nnx.GraphDef, params: Any, chunk: dict[str, jax.Array],
                    temperature: float) -> jax.Array:
    """Log-prob [rows, L] of each slot's target under softmax(logits / temperature)."""
    model = nnx.merge(graphdef, params)
    logits = model(chunk["tokens"], positions=chunk["positions"],
                   segment_ids=chunk["segment_ids"])
    return token_logprobs(logits, chunk["targets"], temperature)


def _mask_and_norms(seqs: dict[str, jax.Array]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Full-batch completion mask [S, N] and its normalisers (tokens, sequences with a token)."""
    n = seqs["old_logprobs"].shape[1]
    mask = (jnp.arange(n)[None, :] < seqs["lengths"][:, None]) & seqs["loss_rows"][:, None]
    return mask, (mask.sum().astype(jnp.float32),
                  (mask.sum(-1) > 0).sum().astype(jnp.float32))


def _advantages(seqs: dict[str, jax.Array], settings: LossSettings, num_groups: int) -> jax.Array:
    return group_advantages(seqs["rewards"], seqs["group_ids"], seqs["valid"],
                            num_groups=num_groups, kind=settings.advantage, eps=settings.adv_eps)


def make_grad_step(graphdef: nnx.GraphDef, settings: LossSettings, *,
                   num_groups: int) -> Callable:
    """`grad_step(params, acc, chunk, seqs, index) -> acc`: adds chunk `index`'s loss gradient
    and summed metrics to `acc = (grads, sums)` (not jitted; `num_groups` is static)."""
    s = settings

    def grad_step(params, acc, chunk, seqs, index):
        adv = _advantages(seqs, s, num_groups)
        full, norms = _mask_and_norms(seqs)
        mask = full & (seqs["chunk"] == index)[:, None]
        n = mask.shape[1]

        def loss_fn(p):
            logp = unpack(packed_logprobs(graphdef, p, chunk, s.temperature), seqs["row"],
                          seqs["start"], n)
            return policy_loss(
                logp, seqs["old_logprobs"], adv, mask, epsilon=s.epsilon,
                epsilon_high=s.epsilon_high, loss_agg=s.loss_agg,
                ref_logprobs=seqs["ref_logprobs"] if s.beta > 0 else None, beta=s.beta,
                kl_estimator=s.kl_estimator, total_tokens=norms[0], total_seqs=norms[1],
                max_tokens=s.max_tokens)

        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        grads, sums = acc
        m = {**m, "loss": loss}
        return (jax.tree.map(jnp.add, grads, g),
                {k: sums[k] + m[k] for k in SUM_METRICS})

    return grad_step


def make_apply_step(optimizer: optax.GradientTransformation, settings: LossSettings, *,
                    num_groups: int) -> Callable:
    """`apply(params, opt_state, acc, seqs) -> (params, opt_state, metrics)`: one optimizer
    update from the accumulated gradient; a non-finite loss or gradient leaves params and
    optimizer state unchanged and reports `finite = 0` (as the unpacked step)."""

    def apply(params, opt_state, acc, seqs):
        grads, sums = acc
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        adv = _advantages(seqs, settings, num_groups)
        valid = seqs["valid"].astype(jnp.float32)
        _, norms = _mask_and_norms(seqs)
        metrics = {**sums, "grad_norm": grad_norm, "finite": finite.astype(jnp.float32),
                   "adv_abs_mean": (jnp.abs(adv) * valid).sum() / jnp.maximum(valid.sum(), 1.0),
                   "loss_tokens": norms[0]}
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    return apply


def make_logprob_step(graphdef: nnx.GraphDef, temperature: float) -> Callable:
    """`step(params, out, chunk, seqs, index) -> out`: writes the completion log-probs [S, N]
    of chunk `index`'s sequences into `out` (old / reference passes)."""

    def step(params, out, chunk, seqs, index):
        logp = unpack(packed_logprobs(graphdef, params, chunk, temperature), seqs["row"],
                      seqs["start"], out.shape[1])
        return jnp.where((seqs["chunk"] == index)[:, None], logp, out)

    return step


def zero_acc(params: Any) -> tuple[Any, dict[str, jax.Array]]:
    """An empty accumulator (zero grads like params, zero metric sums)."""
    return (jax.tree.map(jnp.zeros_like, params),
            {k: jnp.zeros((), jnp.float32) for k in SUM_METRICS})

