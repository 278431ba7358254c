"""The unjitted reference of the GRPO update: the padded math the trainer ran before the one
train layout (rows = sequences, prompt left-padded to Lp | completion right-padded to N), kept
here so the layout's loss and gradients are checked against it; plus ragged test rollouts.

Position Lp + t - 1 of a padded row predicts completion token t.
"""

from __future__ import annotations

import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.models.lora import split_trainable
from sagc_jax.rl.advantages import group_advantages, scored_rows
from sagc_jax.rl.losses import entropy_threshold, loss_norms, token_logprobs_and_entropy
from sagc_jax.rl.train_step import LossSettings


def rollout(seed: int, *, g: int, prompts: int, lp: int, n: int, vocab: int,
            drop: tuple[int, ...] = (1,), unscored: tuple[int, ...] = (),
            truncate: bool = True) -> types.SimpleNamespace:
    """A ragged rollout (the fields `rl.batch.make_batch` reads): prompt lengths 1..lp,
    completion lengths 0..n, groups `drop` dropped (valid False), rows `unscored` scored by no
    reward function, some full-length rows truncated."""
    rng = np.random.default_rng(seed)
    rows = prompts * g
    plens = rng.integers(1, lp + 1, prompts)
    lengths = rng.integers(0, n + 1, rows).astype(np.int32)
    valid = np.ones(rows, bool)
    for d in drop:
        valid[d * g:(d + 1) * g] = False
    scored = np.ones(rows, bool)
    scored[list(unscored)] = False
    return types.SimpleNamespace(
        group_size=g, row_offset=0,
        examples=[{"prompt_ids": rng.integers(3, vocab, p).tolist()} for p in plens],
        tokens=rng.integers(3, vocab, (rows, n)).astype(np.int32),
        # Near an untrained model's uniform log-prob, so ratios sit around 1.
        logprobs=rng.normal(-np.log(vocab), 0.05, (rows, n)).astype(np.float32),
        lengths=lengths, truncated=(lengths == n) & (rng.random(rows) < 0.5) & truncate,
        rewards=rng.integers(0, 2, rows).astype(np.float32), valid=valid, scored=scored)


def reorder(ro: types.SimpleNamespace, order: list[int]) -> types.SimpleNamespace:
    """The same rollout with its groups in `order` (each group's rows moved together)."""
    g = ro.group_size
    rows = np.concatenate([np.arange(i * g, (i + 1) * g) for i in order])
    per_row = {k: getattr(ro, k)[rows] for k in ("tokens", "logprobs", "lengths", "truncated",
                                                 "rewards", "valid", "scored")}
    return types.SimpleNamespace(group_size=g, row_offset=0,
                                 examples=[ro.examples[i] for i in order], **per_row)


def padded_batch(ro: Any, *, lp: int, n: int, mask_truncated: bool = True) -> dict[str, Any]:
    """The rollout as padded rows: tokens [R, lp + n] (left-padded prompt | completion)."""
    g, rows = ro.group_size, len(ro.lengths)
    tokens = np.zeros((rows, lp + n), np.int32)
    pad = np.zeros(rows, np.int32)
    for r in range(rows):
        ids = np.asarray(ro.examples[r // g]["prompt_ids"], np.int32)
        tokens[r, lp - len(ids):lp] = ids
        pad[r] = lp - len(ids)
    tokens[:, lp:] = ro.tokens[:, :n]
    loss_rows = ro.valid & ~ro.truncated if mask_truncated else ro.valid.copy()
    return {"tokens": tokens, "prompt_pad": pad, "lengths": ro.lengths.astype(np.int32),
            "old_logprobs": ro.logprobs[:, :n].astype(np.float32),
            "ref_logprobs": np.zeros((rows, n), np.float32),
            "rewards": np.where(ro.scored, ro.rewards, np.float32(np.nan)),
            "group_ids": (np.arange(rows) // g).astype(np.int32), "valid": ro.valid,
            "loss_rows": loss_rows}


def padded_logprobs(graphdef: nnx.GraphDef, params: Any, batch: dict[str, Any], lp: int,
                    temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """(log-probs, entropies) [R, N] of the completion tokens of padded rows."""
    tokens, pad, lengths = (jnp.asarray(batch[k]) for k in ("tokens", "prompt_pad", "lengths"))
    slots = jnp.arange(tokens.shape[1])[None, :]
    positions = jnp.maximum(slots - pad[:, None], 0)
    kv_mask = (slots >= pad[:, None]) & (slots < lp + lengths[:, None])
    logits = nnx.merge(graphdef, params)(tokens[:, :-1], positions=positions[:, :-1],
                                         kv_mask=kv_mask[:, :-1])[:, lp - 1:]
    logp, ent = token_logprobs_and_entropy(logits, tokens[:, lp:], temperature)
    return logp, ent


def reference_loss(graphdef: nnx.GraphDef, params: Any, batch: dict[str, Any],
                   settings: LossSettings, *, num_groups: int, lp: int
                   ) -> tuple[jax.Array, dict[str, jax.Array], Any]:
    """(loss, loss metrics, gradient of the trainable params) of one padded batch, unjitted."""
    s = settings
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    adv = group_advantages(b["rewards"], b["group_ids"], b["valid"], num_groups=num_groups,
                           scale=s.scale_rewards, eps=s.adv_eps, ddof=s.std_ddof)
    scored = scored_rows(b["rewards"], b["valid"])
    n = b["old_logprobs"].shape[1]
    mask = (jnp.arange(n)[None, :] < b["lengths"][:, None]) & (b["loss_rows"] & scored)[:, None]
    norms = loss_norms(mask, scored.sum())
    train, frozen = split_trainable(params)

    def loss_fn(t):
        logp, ent = padded_logprobs(graphdef, nnx.merge_state(t, frozen), batch, lp,
                                    s.temperature)
        ent_min = None
        if s.top_entropy_quantile < 1.0:
            ent_min = entropy_threshold(jax.lax.stop_gradient(ent), mask,
                                        s.top_entropy_quantile)
        return s.loss(logp, b["old_logprobs"], adv, mask, ref_logprobs=b["ref_logprobs"],
                      entropy=ent, entropy_min=ent_min, norms=norms)

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(train)
    return loss, metrics, grads
