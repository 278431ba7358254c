"""GRPO / DAPO / Dr. GRPO policy loss and token log-probabilities.

Gradient accumulation is exact by construction: every aggregation divides a *sum over this batch*
by normalisers (``total_tokens``, ``total_seqs``, ``max_tokens``) that the caller computes once
over the FULL batch. The full-batch loss is then the plain sum of micro-batch losses, and so is its
gradient — no reweighting of micro-batches by their token counts is needed. The returned metrics
use the same normalisers, so they also sum across micro-batches.

Normalisers must be computed from the final mask (after padding and e.g. DAPO truncation masking):
``total_tokens = mask.sum()``, ``total_seqs = (mask.sum(-1) > 0).sum()`` (or the row count, to
match TRL, which counts fully-masked rows too).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k3"]
_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Log-probability of each target token under ``softmax(logits / temperature)``.

    Uses logsumexp + take_along_axis (no ``[R, T, V]`` one-hot), computed in float32.

    Args:
        logits: ``[R, T, V]`` (any float dtype; upcast to f32); position t scores
            ``targets[:, t]``.
        targets: ``int[R, T]`` token ids in ``[0, V)``.
        temperature: sampling temperature (> 0); must match the sampler so ratios are on-policy.
            Use 1.0 for greedy sampling.

    Returns:
        ``f32[R, T]`` log-probabilities (nats).
    """
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(scaled, axis=-1)
    picked = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - lse


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_agg: LossAgg = "token-mean",
    ref_logprobs: jax.Array | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    total_tokens: jax.Array | float | None = None,
    total_seqs: jax.Array | float | None = None,
    max_tokens: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate policy loss with clip-higher, optional KL to a reference, and aggregation.

    Per token: ``−min(ρ·A, clip(ρ, 1−ε, 1+ε_high)·A) + β·KL``, ``ρ = exp(logp − old_logp)``.

    Args:
        logprobs: ``f32[R, T]`` current-policy log-probs of the sampled tokens (nats); the
            differentiable input.
        old_logprobs: ``f32[R, T]`` log-probs under the sampling policy (treated as constants).
        advantages: ``f32[R]`` per-sequence advantage, broadcast over tokens.
        mask: ``[R, T]`` completion-token weights (bool or {0,1} float): 1 on completion tokens,
            0 on prompt/padding/after EOS. Masked positions may hold any value (even ±inf/NaN).
        epsilon: lower clip ε (ratio floor ``1 − ε``).
        epsilon_high: upper clip ε_high (ratio ceiling ``1 + ε_high``; DAPO clip-higher). None → ε.
        loss_agg: ``"token-mean"`` Σ_tokens / total_tokens (DAPO);
            ``"seq-mean-token-mean"`` Σ_seq (Σ_tok / len_seq) / total_seqs (original GRPO);
            ``"seq-mean-token-sum-norm"`` Σ_tokens / (total_seqs · max_tokens) (Dr. GRPO).
        ref_logprobs: ``f32[R, T]`` reference-policy log-probs, or None.
        beta: KL coefficient; a static Python float. KL is skipped entirely (not computed) when
            ``beta == 0`` or ``ref_logprobs is None``.
        kl_estimator: ``"k1"``: ``logp − ref``; ``"k3"``: ``exp(ref − logp) − (ref − logp) − 1``.
        total_tokens: Σ mask over the FULL batch (not this micro-batch). None → this batch's.
        total_seqs: number of sequences in the FULL batch. None → rows of this batch with ≥1 token.
        max_tokens: Dr. GRPO's constant length normaliser (usually ``max_new_tokens``).
            None → ``T``.

    Returns:
        ``(loss, metrics)``: scalar loss, and scalar metrics ``pg_loss`` (surrogate part, same
        aggregation), ``kl`` (token-mean), ``clip_frac`` (fraction of tokens whose gradient the
        clip zeroes), ``ratio_mean`` (token-mean ρ). Token-means divide by ``total_tokens``.
    """
    if loss_agg not in _AGGS:
        raise ValueError(f"loss_agg must be one of {_AGGS}, got {loss_agg!r}")
    if kl_estimator not in ("k1", "k3"):
        raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {kl_estimator!r}")
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high

    m = mask.astype(jnp.float32)
    keep = m > 0
    tok_per_seq = m.sum(axis=-1)  # [R]
    if total_tokens is None:
        total_tokens = tok_per_seq.sum()
    if total_seqs is None:
        total_seqs = (tok_per_seq > 0).sum().astype(jnp.float32)
    if max_tokens is None:
        max_tokens = logprobs.shape[-1]
    total_tokens = jnp.maximum(jnp.asarray(total_tokens, jnp.float32), 1.0)
    total_seqs = jnp.maximum(jnp.asarray(total_seqs, jnp.float32), 1.0)

    def agg(x: jax.Array) -> jax.Array:
        """Masked aggregation of a per-token quantity ``[R, T]`` to a scalar."""
        xm = x * m
        if loss_agg == "token-mean":
            return xm.sum() / total_tokens
        if loss_agg == "seq-mean-token-mean":
            return (xm.sum(-1) / jnp.maximum(tok_per_seq, 1.0)).sum() / total_seqs
        return xm.sum() / (total_seqs * max_tokens)

    def tok_mean(x: jax.Array) -> jax.Array:
        return (x * m).sum() / total_tokens

    # Sanitise before exp: on masked positions the difference may be inf/NaN, and a where applied
    # *after* exp would still leak 0·inf = NaN into the gradient.
    log_ratio = jnp.where(keep, logprobs - jax.lax.stop_gradient(old_logprobs), 0.0)
    ratio = jnp.exp(log_ratio)
    adv = advantages.astype(jnp.float32)[:, None]
    surr = ratio * adv
    surr_clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    pg_tok = -jnp.minimum(surr, surr_clipped)
    per_tok = pg_tok

    metrics: dict[str, jax.Array] = {}
    if ref_logprobs is not None and beta != 0.0:
        d = jnp.where(keep, jax.lax.stop_gradient(ref_logprobs) - logprobs, 0.0)  # ref − logp
        kl_tok = -d if kl_estimator == "k1" else jnp.exp(d) - d - 1.0
        per_tok = per_tok + beta * kl_tok
        metrics["kl"] = tok_mean(kl_tok)
    else:
        metrics["kl"] = jnp.zeros((), jnp.float32)

    # Tokens where the min picks the clipped branch *and* it is flat → zero gradient.
    clipped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
    metrics["clip_frac"] = tok_mean(clipped.astype(jnp.float32))
    metrics["ratio_mean"] = tok_mean(ratio)
    metrics["pg_loss"] = agg(pg_tok)
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    return agg(per_tok), metrics
