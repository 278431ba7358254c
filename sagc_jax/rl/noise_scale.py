"""The gradient noise scale of an update, from the chunks it already accumulates over.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): with per-example
gradient covariance Σ and true gradient G, a step on a batch of B examples makes progress in
proportion to B / (B + B_noise), B_noise = tr(Σ) / |G|² (their "simple" noise scale). Below
B_noise a larger batch buys almost proportionally more per step; above it, almost nothing, and
more, smaller steps win. That is the question SAGC's benefit model has to answer (a larger G is
a larger batch), so the learner reports what estimates it on every update, at no extra pass.

The update's gradient is a weighted sum of its chunks' gradients, g = Σ_i c_i with c_i = w_i ĝ_i
(ĝ_i the chunk's own estimate, w_i its share of the loss's normaliser: `chunk_weight`). With
E|ĝ_i|² = |G|² + σ²/n_i and w_i ∝ n_i (rows or tokens, whichever the loss averages over):

    A = Σ_i |c_i|²,  F = |g|²,  s = Σ w_i² / (Σ w_i)²
    E[A] = s |G|² + σ²/N,  E[F] = |G|² + σ²/N
    => |G|² = (F − A) / (1 − s),  σ²/N = (A − s F) / (1 − s),  B_noise = N (A − s F) / (F − A)

in units of the loss's own examples; `noise_scale_rows` states it in rows of the batch. One
update's estimate is noisy (a ratio of two differences, either may be negative): average the
numerator and denominator over steps before dividing (McCandlish et al., appendix A.1), as
`noise_scale_rows` does when given sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from sagc_jax.rl.losses import LOSS_AGGREGATIONS, LossNorms

#: Per-chunk sums the update accumulates (`rl.train_step`): Σ|c_i|², Σ w_i, Σ w_i².
NOISE_SUMS = ("noise_chunk_grad_sq", "noise_weight", "noise_weight_sq")


def chunk_weight(mask: jax.Array, norms: LossNorms, loss_agg: str, max_tokens: int) -> jax.Array:
    """A chunk's share of the loss's normaliser, f32 []: the aggregation ``loss_agg`` of ones
    over the chunk's loss mask ``[R, T]`` under the full batch's ``norms`` (token-mean: its
    loss tokens ÷ the batch's; seq-mean-token-mean: its sequences ÷ the batch's)."""
    m = mask.astype(jnp.float32)
    agg = LOSS_AGGREGATIONS[loss_agg]
    one = jnp.asarray(1.0, jnp.float32)
    return agg(m, m.sum(-1), jnp.maximum(norms.tokens, one), jnp.maximum(norms.seqs, one),
               jnp.maximum(norms.rows, one), max_tokens)


def chunk_sums(grads: Any, mask: jax.Array, norms: LossNorms, loss_agg: str,
               max_tokens: int) -> dict[str, jax.Array]:
    """A chunk's `NOISE_SUMS` terms: |c_i|² of its gradient pytree, w_i and w_i²."""
    w = chunk_weight(mask, norms, loss_agg, max_tokens)
    return {"noise_chunk_grad_sq": optax.tree.norm(grads, squared=True), "noise_weight": w,
            "noise_weight_sq": w * w}


def with_noise_terms(sums: dict[str, jax.Array], norms: LossNorms) -> dict[str, jax.Array]:
    """The update's summed metrics with its chunks' `NOISE_SUMS` replaced by the logged terms:
    ``noise_chunk_grad_sq`` (A), ``noise_weight_share`` (s = Σw² / (Σw)²) and ``scored_rows``;
    F is ``grad_norm``²."""
    return {**{k: v for k, v in sums.items() if k not in NOISE_SUMS},
            "noise_chunk_grad_sq": sums["noise_chunk_grad_sq"],
            "noise_weight_share": sums["noise_weight_sq"]
            / jnp.maximum(sums["noise_weight"] ** 2, 1e-30),
            "scored_rows": norms.rows}


def noise_scale_rows(grad_sq: float | Sequence[float], chunk_grad_sq: float | Sequence[float],
                     weight_share: float | Sequence[float],
                     rows: float | Sequence[float]) -> float | None:
    """B_noise in rows of the batch, from one update's or several updates' terms.

    grad_sq: F, |g|² of the whole update's gradient (the square of the logged ``grad_norm``);
    chunk_grad_sq: A, Σ_i |c_i|² (``noise_chunk_grad_sq``); weight_share: s = Σ w_i² / (Σ w_i)²
    (``noise_weight_share``); rows: the rows the loss scored. Sequences: one entry per update,
    whose numerators N(A − sF)/(1 − s) and denominators (F − A)/(1 − s) are summed before the
    ratio. None when the sums are not positive (one chunk: s = 1 and nothing to compare; or too
    few updates to average out the noise).
    """
    seq = (grad_sq, chunk_grad_sq, weight_share, rows)
    f, a, s, n = ([float(x)] if isinstance(x, (int, float)) else [float(v) for v in x]
                  for x in seq)
    if not (len(f) == len(a) == len(s) == len(n)):
        raise ValueError("noise_scale_rows: grad_sq, chunk_grad_sq, weight_share and rows "
                         f"must have one entry per update, got lengths {len(f)}, {len(a)}, "
                         f"{len(s)}, {len(n)}")
    num = den = 0.0
    for fi, ai, si, ni in zip(f, a, s, n):
        if si >= 1.0 - 1e-9:  # one chunk: no second batch size to compare with
            continue
        num += ni * (ai - si * fi) / (1.0 - si)
        den += (fi - ai) / (1.0 - si)
    return num / den if num > 0.0 and den > 0.0 else None
