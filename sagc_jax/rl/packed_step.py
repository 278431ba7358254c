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

from sagc_jax.models.lora import split_trainable, trainable
from sagc_jax.rl.advantages import scored_rows
from sagc_jax.rl.losses import (
    METRICS,
    LossNorms,
    entropy_threshold,
    loss_norms,
    token_logprobs_and_entropy,
)
from sagc_jax.rl.packing import unpack
from sagc_jax.rl.train_step import LossSettings, apply_update, completion_mask

# Per-sequence arrays [S, ...] (name -> rank); `chunk`, `row`, `hstart` come from the PackPlan.
# `entropy` [S, N] is filled by an entropy pass only for `top_entropy_quantile < 1` (the
# threshold is a full-batch quantile, so it must be known before any chunk's gradient).
SEQ_FIELDS = {
    "lengths": 1, "loss_rows": 1, "old_logprobs": 2, "ref_logprobs": 2, "rewards": 1,
    "group_ids": 1, "valid": 1, "chunk": 1, "row": 1, "hstart": 1, "entropy": 2,
}
SEQ_FLOAT = ("old_logprobs", "ref_logprobs", "rewards", "entropy")
SEQ_BOOL = ("loss_rows", "valid")
# Packed arrays of one chunk, int32 [chunk rows, pack_len]; `head_slots` / `head_targets`:
# [chunk rows, loss_cap], each row's scored slots and the tokens they score (`rl.packing`).
CHUNK_FIELDS = ("tokens", "positions", "segment_ids", "branch_ids", "head_slots", "head_targets")
HEAD_FIELDS = ("head_slots", "head_targets")
SUM_METRICS = ("loss", *METRICS)


def packed_logprobs(graphdef: nnx.GraphDef, params: Any, chunk: dict[str, jax.Array],
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


def _scored_mask_and_norms(seqs: dict[str, jax.Array]
                           ) -> tuple[jax.Array, jax.Array, LossNorms]:
    """(scored rows [S], full-batch loss mask [S, N], its normalisers), as the unpacked step:
    rows with a NaN reward (unscored) are out of the loss and of the Dr. GRPO row count."""
    n = seqs["old_logprobs"].shape[1]
    scored = scored_rows(seqs["rewards"], seqs["valid"])
    rows = seqs["loss_rows"] & scored
    mask = completion_mask(seqs["lengths"], rows, n)
    return scored, mask, loss_norms(mask, scored.sum())


def _advantages(seqs: dict[str, jax.Array], settings: LossSettings, num_groups: int) -> jax.Array:
    return settings.advantages(seqs["rewards"], seqs["group_ids"], seqs["valid"], num_groups)


def make_grad_step(graphdef: nnx.GraphDef, settings: LossSettings, *,
                   num_groups: int) -> Callable:
    """`grad_step(params, acc, chunk, seqs, index) -> acc`: adds chunk `index`'s loss gradient
    and summed metrics to `acc = (grads, sums)` (not jitted; `num_groups` is static). Grads are
    of `lora.trainable(params)` (the adapters when the model has them)."""
    s = settings
    mask_entropy = s.top_entropy_quantile < 1.0

    def grad_step(params, acc, chunk, seqs, index):
        adv = _advantages(seqs, s, num_groups)
        _, full, norms = _scored_mask_and_norms(seqs)
        mask = full & (seqs["chunk"] == index)[:, None]
        n = mask.shape[1]
        ent_min = (entropy_threshold(seqs["entropy"], full, s.top_entropy_quantile)
                   if mask_entropy else None)

        train, frozen = split_trainable(params)

        def loss_fn(t):
            p = nnx.merge_state(t, frozen)
            logp, ent = packed_logprobs(graphdef, p, chunk, s.temperature, entropy=True)
            logp = unpack(logp, seqs["row"], seqs["hstart"], n)
            ent = unpack(ent, seqs["row"], seqs["hstart"], n)
            return s.loss(logp, seqs["old_logprobs"], adv, mask,
                          ref_logprobs=seqs["ref_logprobs"], entropy=ent, entropy_min=ent_min,
                          norms=norms)

        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(train)
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
        train, frozen = split_trainable(params)
        grads, sums = acc
        scored, _, norms = _scored_mask_and_norms(seqs)
        return apply_update(optimizer, train, frozen, opt_state, grads, sums["loss"], sums,
                            _advantages(seqs, settings, num_groups), scored, norms,
                            seqs["rewards"], seqs["group_ids"], seqs["valid"],
                            num_groups=num_groups, ddof=settings.std_ddof)

    return apply


def make_logprob_step(graphdef: nnx.GraphDef, temperature: float,
                      entropy: bool = False) -> Callable:
    """`step(params, out, chunk, seqs, index) -> out`: writes the completion log-probs [S, N]
    (old / reference passes), or with `entropy` the token entropies (nats), of chunk `index`'s
    sequences into `out`."""

    def step(params, out, chunk, seqs, index):
        logp, ent = packed_logprobs(graphdef, params, chunk, temperature, entropy=entropy)
        x = unpack(ent if entropy else logp, seqs["row"], seqs["hstart"], out.shape[1])
        return jnp.where((seqs["chunk"] == index)[:, None], x, out)

    return step


def zero_acc(params: Any) -> tuple[Any, dict[str, jax.Array]]:
    """An empty accumulator (zero grads like the trainable params, zero metric sums)."""
    return (jax.tree.map(jnp.zeros_like, trainable(params)),
            {k: jnp.zeros((), jnp.float32) for k in SUM_METRICS})

