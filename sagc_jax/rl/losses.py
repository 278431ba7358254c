"""GRPO / DAPO / Dr. GRPO / GSPO policy loss, token log-probabilities and entropies.

Per token ``t`` of completion ``i`` (advantage ``A_i``, importance weight ``w``)::

    pg   = −min(min(w, δ)·A_i, clip(w, 1−ε, 1+ε_high)·A_i)   × entropy mask (optional)
    loss = pg + β·KL_t                                       then aggregated (``loss_agg``)

Importance weight ``w`` (``importance_sampling``):
  * ``"token"`` (GRPO/DAPO): ``w = π_θ(y_t)/π_old(y_t)``.
  * ``"sequence"`` (GSPO, Zheng et al. 2025): ``s_i = exp(mean_t log(π_θ(y_t)/π_old(y_t)))``,
    the length-normalised sequence ratio, in the paper's GSPO-token form
    ``w = sg[s_i] · π_θ(y_t)/sg[π_θ(y_t)]``: the value (and so every clip decision) is ``s_i``, the
    gradient of token t is ``s_i·∇log π_θ(y_t)``. Summed over a sequence this equals the gradient
    of GSPO's sequence objective for every aggregation here (their weights are constant within a
    sequence); it differs from TRL's broadcast ``[R, 1]`` form only where tokens are masked
    individually (``top_entropy_quantile``): here a masked token contributes nothing.

``δ`` (``clip_delta``, INTELLECT-2's two-sided clipping) caps the unclipped branch, so a token with
``A < 0`` and a huge ratio no longer dominates the loss. KL to the reference, ``d = ref − logp``:
``k1 = −d``, ``k3 = e^d − d − 1`` (DeepSeekMath); with ``kl_bias_correction`` it is multiplied by
the *token* ratio ``π_θ/π_old`` (DeepSeek-V3.2's unbiased estimator under off-policy samples,
TRL's ``use_bias_correction_kl``; TRL multiplies by its sequence weight under GSPO).

Gradient accumulation is exact by construction: every aggregation divides a *sum over this batch*
by normalisers (:class:`LossNorms`) the caller computes once over the FULL batch; the full-batch
loss, its gradient and the metrics are then plain sums over micro-batches. The entropy threshold
of ``top_entropy_quantile`` is likewise a full-batch quantity (:func:`entropy_threshold`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k3"]
ImportanceSampling = Literal["token", "sequence"]
METRICS = ("pg_loss", "kl", "clip_ratio", "clip_ratio_low", "clip_ratio_high", "ratio_mean",
           "entropy", "off_policy_masked")


class LossNorms(NamedTuple):
    """Full-batch normalisers (f32 scalars), so micro-batch losses sum to the full-batch loss.

    tokens: Σ of the loss mask (token-mean, and every token-mean metric).
    seqs:   sequences with ≥1 loss token (seq-mean-token-mean: a mean over the kept sequences).
    rows:   sampled rows: every scored row, truncation-masked ones included (Dr. GRPO's constant:
            its normaliser must not depend on how many completions were truncated).
    """

    tokens: jax.Array
    seqs: jax.Array
    rows: jax.Array


# ---- registries: the choices of `algo.loss_agg`, `algo.importance_sampling`, `algo.kl_estimator`
#: An aggregation ``fn(xm, tok_per_seq, n_tok, n_seq, n_row, max_tokens) -> f32[]``: ``xm`` the
#: masked per-token values ``f32[R, T]``, ``tok_per_seq`` loss tokens per row ``f32[R]``, the
#: full-batch normalisers (each >= 1) and Dr. GRPO's constant length.
AggFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, int], jax.Array]
#: An importance weight ``fn(log_ratio, tok_ratio, logprobs, keep, tok_per_seq) -> f32[R, T]``:
#: the ratio the surrogate clips (``log_ratio`` / ``tok_ratio`` are 0 / 1 where not ``keep``).
WeightFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
#: A KL estimator ``fn(d) -> f32[R, T]`` of ``d = ref − logp`` per token (nats).
KLFn = Callable[[jax.Array], jax.Array]


def _token_mean(xm: jax.Array, tok_per_seq: jax.Array, n_tok: jax.Array, n_seq: jax.Array,
                n_row: jax.Array, max_tokens: int) -> jax.Array:
    """DAPO: Σ_tokens / tokens."""
    return xm.sum() / n_tok


def _seq_mean_token_mean(xm: jax.Array, tok_per_seq: jax.Array, n_tok: jax.Array,
                         n_seq: jax.Array, n_row: jax.Array, max_tokens: int) -> jax.Array:
    """Original GRPO: Σ_seq (Σ_tok / len_seq) / sequences."""
    return (xm.sum(-1) / jnp.maximum(tok_per_seq, 1.0)).sum() / n_seq


def _seq_mean_token_sum_norm(xm: jax.Array, tok_per_seq: jax.Array, n_tok: jax.Array,
                             n_seq: jax.Array, n_row: jax.Array, max_tokens: int) -> jax.Array:
    """Dr. GRPO: Σ_tokens / (rows · max_tokens)."""
    return xm.sum() / (n_row * max_tokens)


def _token_weight(log_ratio: jax.Array, tok_ratio: jax.Array, logprobs: jax.Array,
                  keep: jax.Array, tok_per_seq: jax.Array) -> jax.Array:
    """GRPO / DAPO: the token ratio π_θ(y_t)/π_old(y_t)."""
    return tok_ratio


def _sequence_weight(log_ratio: jax.Array, tok_ratio: jax.Array, logprobs: jax.Array,
                     keep: jax.Array, tok_per_seq: jax.Array) -> jax.Array:
    """GSPO-token: the sequence's mean log-ratio as the value, the token's own gradient."""
    sg = jax.lax.stop_gradient
    logp = jnp.where(keep, logprobs, 0.0)
    seq_log_ratio = log_ratio.sum(-1) / jnp.maximum(tok_per_seq, 1.0)  # [R]
    return jnp.exp(sg(seq_log_ratio)[:, None] + logp - sg(logp))


LOSS_AGGREGATIONS: dict[str, AggFn] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
IMPORTANCE_WEIGHTS: dict[str, WeightFn] = {"token": _token_weight, "sequence": _sequence_weight}
KL_ESTIMATORS: dict[str, KLFn] = {
    "k1": lambda d: -d,  # Schulman's k1
    "k3": lambda d: jnp.exp(d) - d - 1.0,  # k3 (DeepSeekMath)
}
LOSS_AGGS = tuple(LOSS_AGGREGATIONS)
IMPORTANCE_SAMPLING = tuple(IMPORTANCE_WEIGHTS)


def loss_norms(mask: jax.Array, rows: jax.Array | float) -> LossNorms:
    """:class:`LossNorms` of a full batch: ``mask [R, T]`` the final loss mask (padding, EOS,
    truncation masking and unscored rows applied), ``rows`` the number of scored rows."""
    tok = mask.astype(jnp.float32).sum(-1)
    return LossNorms(tokens=tok.sum(), seqs=(tok > 0).sum().astype(jnp.float32),
                     rows=jnp.asarray(rows, jnp.float32))


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
    return token_logprobs_and_entropy(logits, targets, temperature, entropy=False)[0]


def token_logprobs_and_entropy(
    logits: jax.Array, targets: jax.Array, temperature: float = 1.0, *, entropy: bool = True
) -> tuple[jax.Array, jax.Array | None]:
    """:func:`token_logprobs` plus the entropy of each position's distribution.

    Returns:
        ``(logp f32[R, T], H f32[R, T] | None)``: ``H = −Σ_v p_v log p_v`` (nats) of
        ``softmax(logits / temperature)``, under ``stop_gradient`` (a statistic and a mask input,
        never differentiated); None when ``entropy=False``.
    """
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    scaled = logits.astype(jnp.float32) / temperature
    # logsumexp written out so the entropy reuses its exponentials: with an exp of its own
    # inside the reduction, XLA:CPU's fused exp-multiply-sum ran at ~20 M elements/s (1.6-2.5 s
    # of a 4-row SmolLM2 chunk gradient, benchmarks/README.md).
    top = jax.lax.stop_gradient(scaled.max(axis=-1, keepdims=True))
    e = jnp.exp(scaled - top)
    total = e.sum(-1)
    lse = top[..., 0] + jnp.log(total)
    picked = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ent = None
    if entropy:
        # H = lse − Σ p·z with p = e / total: no second exp pass, no log p tensor.
        ent = jax.lax.stop_gradient(lse - (e * scaled).sum(-1) / total)
    return picked - lse, ent


def entropy_threshold(entropy: jax.Array, mask: jax.Array, top_quantile: float) -> jax.Array:
    """Entropy at quantile ``1 − top_quantile`` of the masked tokens (linear interpolation, as
    ``torch.quantile``); tokens at or above it are kept by ``top_entropy_quantile`` masking
    ("Beyond the 80/20 rule", Wang et al. 2025). Call on the FULL batch.

    Args:
        entropy: ``f32[R, T]`` token entropies (nats).
        mask: ``[R, T]`` loss mask.
        top_quantile: fraction of tokens to keep, in [0, 1]; 1 keeps all, 0 only the maximum.

    Returns:
        ``f32[]`` threshold (nats); NaN when the mask is empty (then no token is kept).
    """
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"entropy_threshold: top_quantile must be in [0, 1], got {top_quantile}")
    vals = jnp.where(mask.astype(bool), entropy.astype(jnp.float32), jnp.nan)
    return jnp.nanquantile(vals.reshape(-1), 1.0 - top_quantile)


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    clip_delta: float | None = None,
    importance_sampling: ImportanceSampling = "token",
    loss_agg: LossAgg = "token-mean",
    ref_logprobs: jax.Array | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_bias_correction: bool = False,
    entropy: jax.Array | None = None,
    entropy_min: jax.Array | float | None = None,
    off_policy_threshold: float | None = None,
    norms: LossNorms | None = None,
    max_tokens: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate policy loss (module docstring) with KL, entropy masking and aggregation.

    Args:
        logprobs: ``f32[R, T]`` current-policy log-probs of the sampled tokens (nats); the
            differentiable input.
        old_logprobs: ``f32[R, T]`` log-probs under the sampling policy (treated as constants).
        advantages: ``f32[R]`` per-sequence advantage, broadcast over tokens.
        mask: ``[R, T]`` completion-token weights (bool or {0,1} float): 1 on loss tokens, 0 on
            padding / after EOS / masked rows. Masked positions may hold any value (even ±inf/NaN).
        epsilon: lower clip ε (ratio floor ``1 − ε``).
        epsilon_high: upper clip ε_high (ratio ceiling ``1 + ε_high``; DAPO clip-higher). None → ε.
        clip_delta: δ > 1, cap of the unclipped branch (two-sided clipping); None = off.
        importance_sampling: ``"token"`` or ``"sequence"`` (GSPO).
        loss_agg: ``"token-mean"`` Σ_tokens / norms.tokens (DAPO);
            ``"seq-mean-token-mean"`` Σ_seq (Σ_tok / len_seq) / norms.seqs (original GRPO);
            ``"seq-mean-token-sum-norm"`` Σ_tokens / (norms.rows · max_tokens) (Dr. GRPO).
        ref_logprobs: ``f32[R, T]`` reference-policy log-probs, or None.
        beta: KL coefficient, a static Python float; the KL is not computed when ``beta == 0``
            or ``ref_logprobs is None``.
        kl_estimator: ``"k1"`` or ``"k3"``.
        kl_bias_correction: multiply the KL estimate by the token ratio (DeepSeek-V3.2).
        entropy: ``f32[R, T]`` token entropies (nats) for the ``entropy`` metric, or None.
        entropy_min: keep the policy-gradient term only on tokens with ``entropy >= entropy_min``
            (:func:`entropy_threshold`); the KL term stays on every token. None = no masking.
        off_policy_threshold: δ ≥ 0 of off-policy sequence masking (DeepSeek-V3.2, TRL's
            ``off_policy_mask_threshold``): a sequence with negative advantage whose mean token
            ``log π_old − log π_θ`` (nats) exceeds δ gets no policy-gradient term (its KL term
            stays). None = off.
        norms: full-batch :class:`LossNorms`; None → this batch's, with every row counted.
        max_tokens: Dr. GRPO's constant length normaliser (``max_new_tokens``). None → ``T``.

    Returns:
        ``(loss, metrics)``: scalar loss and scalar metrics (all token-means over
        ``norms.tokens``, so they sum over micro-batches): ``pg_loss`` (the surrogate, same
        aggregation as the loss), ``kl``, ``clip_ratio`` (tokens whose surrogate gradient a clip
        zeroes: low, high or δ), ``clip_ratio_low`` / ``clip_ratio_high`` (TRL's definitions),
        ``ratio_mean`` (mean importance weight), ``off_policy_masked`` (fraction of loss tokens
        in off-policy-masked sequences), and ``entropy`` when given.
    """
    _check_options(loss_agg, importance_sampling, kl_estimator, clip_delta)
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high

    m = mask.astype(jnp.float32)
    keep = m > 0
    tok_per_seq = m.sum(axis=-1)  # [R]
    if norms is None:
        norms = loss_norms(m, m.shape[0])
    n_tok = jnp.maximum(jnp.asarray(norms.tokens, jnp.float32), 1.0)
    n_seq = jnp.maximum(jnp.asarray(norms.seqs, jnp.float32), 1.0)
    n_row = jnp.maximum(jnp.asarray(norms.rows, jnp.float32), 1.0)
    if max_tokens is None:
        max_tokens = logprobs.shape[-1]

    agg_fn = LOSS_AGGREGATIONS[loss_agg]

    def agg(x: jax.Array) -> jax.Array:
        """Masked aggregation of a per-token quantity ``[R, T]`` to a scalar (``loss_agg``)."""
        return agg_fn(x * m, tok_per_seq, n_tok, n_seq, n_row, max_tokens)

    def tok_mean(x: jax.Array) -> jax.Array:
        return (x * m).sum() / n_tok

    log_ratio, tok_ratio, ratio = _importance_ratios(logprobs, old_logprobs, keep, tok_per_seq,
                                                     importance_sampling)
    adv = advantages.astype(jnp.float32)[:, None]
    unclipped = ratio if clip_delta is None else jnp.minimum(ratio, clip_delta)
    pg_tok = -jnp.minimum(unclipped * adv, jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    if entropy_min is not None:
        ent_keep = jax.lax.stop_gradient(entropy) >= entropy_min  # NaN threshold → keep none
        pg_tok = jnp.where(ent_keep, pg_tok, 0.0)
    if off_policy_threshold is not None:
        drift = jax.lax.stop_gradient(-log_ratio.sum(-1) / jnp.maximum(tok_per_seq, 1.0))  # [R]
        off = (advantages < 0) & (drift > off_policy_threshold)
        pg_tok = jnp.where(off[:, None], 0.0, pg_tok)
        metrics_off = tok_mean(jnp.broadcast_to(off[:, None], m.shape).astype(jnp.float32))
    else:
        metrics_off = jnp.zeros((), jnp.float32)
    per_tok = pg_tok

    metrics: dict[str, jax.Array] = {}
    if ref_logprobs is not None and beta != 0.0:
        kl_tok = _kl_per_token(logprobs, ref_logprobs, keep, kl_estimator,
                               tok_ratio if kl_bias_correction else None)
        per_tok = per_tok + beta * kl_tok
        metrics["kl"] = tok_mean(kl_tok)
    else:
        metrics["kl"] = jnp.zeros((), jnp.float32)

    metrics.update(_clip_metrics(adv, ratio, eps_low, eps_high, clip_delta, tok_mean))
    metrics["off_policy_masked"] = metrics_off
    metrics["pg_loss"] = agg(pg_tok)
    if entropy is not None:
        metrics["entropy"] = tok_mean(jnp.where(keep, entropy, 0.0))
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    return agg(per_tok), metrics


def _check_options(loss_agg: str, importance_sampling: str, kl_estimator: str,
                   clip_delta: float | None) -> None:
    """ValueError naming `policy_loss` and the bad option."""
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"policy_loss: loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    if importance_sampling not in IMPORTANCE_SAMPLING:
        raise ValueError(f"policy_loss: importance_sampling must be one of {IMPORTANCE_SAMPLING}, "
                         f"got {importance_sampling!r}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"policy_loss: kl_estimator must be 'k1' or 'k3', got {kl_estimator!r}")
    if clip_delta is not None and clip_delta <= 1.0:
        raise ValueError(f"policy_loss: clip_delta must be > 1, got {clip_delta}")


def _importance_ratios(logprobs: jax.Array, old_logprobs: jax.Array, keep: jax.Array,
                       tok_per_seq: jax.Array, importance_sampling: str
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(log_ratio, token ratio, the ratio the surrogate uses)``, each ``f32[R, T]``, 0 / 1 on
    masked positions. ``"sequence"`` is GSPO-token: the sequence's mean log-ratio as the value,
    the token's own gradient."""
    # Sanitise before exp: on masked positions the values may be inf/NaN, and a where applied
    # *after* exp would still leak 0·inf = NaN into the gradient.
    sg = jax.lax.stop_gradient
    log_ratio = jnp.where(keep, logprobs - sg(old_logprobs), 0.0)
    tok_ratio = jnp.exp(log_ratio)
    weight = IMPORTANCE_WEIGHTS[importance_sampling]
    return log_ratio, tok_ratio, weight(log_ratio, tok_ratio, logprobs, keep, tok_per_seq)


def _kl_per_token(logprobs: jax.Array, ref_logprobs: jax.Array, keep: jax.Array,
                  kl_estimator: str, bias_weight: jax.Array | None) -> jax.Array:
    """``f32[R, T]`` KL(π_θ ‖ π_ref) estimate per token (nats), 0 on masked positions; times
    ``bias_weight`` (the token ratio: DeepSeek-V3.2's bias correction) when given."""
    d = jnp.where(keep, jax.lax.stop_gradient(ref_logprobs) - logprobs, 0.0)  # ref − logp
    kl_tok = KL_ESTIMATORS[kl_estimator](d)
    return kl_tok if bias_weight is None else kl_tok * bias_weight


def _clip_metrics(adv: jax.Array, ratio: jax.Array, eps_low: float, eps_high: float,
                  clip_delta: float | None, tok_mean: Callable[[jax.Array], jax.Array]
                  ) -> dict[str, jax.Array]:
    """Token fractions where the min picks a flat (clipped) branch, i.e. a zero surrogate
    gradient (``clip_ratio``: low, high or δ; TRL's ``clip_ratio_low`` / ``_high``), and the
    mean importance weight. ``adv`` ``f32[R, 1]``, ``ratio`` ``f32[R, T]``."""
    low = (adv < 0) & (ratio < 1.0 - eps_low)
    high = (adv > 0) & (ratio > 1.0 + eps_high)
    capped = (adv < 0) & (ratio > clip_delta) if clip_delta is not None else False
    return {"clip_ratio": tok_mean((low | high | capped).astype(jnp.float32)),
            "clip_ratio_low": tok_mean(low.astype(jnp.float32)),
            "clip_ratio_high": tok_mean(high.astype(jnp.float32)),
            "ratio_mean": tok_mean(ratio)}
