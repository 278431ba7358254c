"""One token per row from a model's logits: the sampler's draw (temperature, top-k, top-p,
greedy) and the sampled token's log-probability. Pure jax functions, traced inside the
sampler's decode loop (`sampler.py`) and the multi-turn sampler (`turns.py`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _last_positive(x: jax.Array) -> jax.Array:
    """x [R, n] >= 0 -> index of the last positive entry per row [R] (0 if none)."""
    n = x.shape[-1]
    return n - 1 - jnp.argmax(x[:, ::-1] > 0, axis=-1)


def categorical_icdf(keys: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits) by inverse CDF, two uniforms per row.

    keys [R] (one PRNG key per row: a row's draw does not depend on the other rows), logits
    [R, V] f32 (-inf = excluded) -> tokens [R] int32. The vocabulary is cut into blocks of b ~
    sqrt(V): a block is drawn by the CDF of block masses, then a token within it — exact, and
    O(V) adds instead of `jax.random.categorical`'s V random numbers per row (the Gumbel draw
    cost more than the model's forward for small models on CPU).
    """
    R, V = logits.shape
    b = 1 << max(0, math.ceil(math.log2(math.sqrt(V))))
    nb = -(-V // b)
    p = jnp.exp(logits - logits.max(-1, keepdims=True))
    p = jnp.pad(p, ((0, 0), (0, nb * b - V))).reshape(R, nb, b)
    u = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys)  # [R, 2] in [0, 1)
    mass = p.sum(-1)
    cb = jnp.cumsum(mass, -1)
    # Clamp to the last block / token with mass: u * total may round up to total.
    blk = jnp.minimum(jnp.sum(cb <= u[:, :1] * cb[:, -1:], -1), _last_positive(mass))
    pin = jnp.take_along_axis(p, blk[:, None, None], axis=1)[:, 0]  # [R, b]
    c = jnp.cumsum(pin, -1)
    j = jnp.minimum(jnp.sum(c <= u[:, 1:] * c[:, -1:], -1), _last_positive(pin))
    return (blk * b + j).astype(jnp.int32)


def sample_step(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_k: jax.Array,
                top_p: jax.Array, greedy: jax.Array, *, use_top_k: bool,
                use_top_p: bool) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row.

    logits [R, V] f32, keys [R] (one PRNG key per row) -> (tokens [R] int32, logprobs [R] f32).
    Order as in HF: temperature, then top-k, then top-p on the top-k-renormalised distribution.
    The logprob is under softmax(logits / T) (unfiltered); T <= 0 counts as 1 (greedy callers).
    """
    V = logits.shape[-1]
    t = jnp.where(temperature > 0, temperature, 1.0)
    scaled = logits / t

    def draw() -> jax.Array:
        if use_top_k or use_top_p:
            # One descending sort serves both filters; the cut is a value threshold per row.
            s = -jnp.sort(-scaled, axis=-1)
            idx = jnp.arange(V)
            in_k = idx[None] < (jnp.clip(top_k, 1, V) if use_top_k else V)
            s = jnp.where(in_k, s, -jnp.inf)
            if use_top_p:
                probs = jax.nn.softmax(s, axis=-1)
                before = jnp.cumsum(probs, axis=-1) - probs
                # in_k: past the top-k cut `before` is ~1 and may round below top_p.
                keep = ((before < top_p) | (idx[None] == 0)) & in_k
            else:
                keep = jnp.broadcast_to(in_k, s.shape)
            last = jnp.sum(keep, axis=-1) - 1
            thresh = jnp.take_along_axis(s, last[:, None], axis=-1)
            filtered = jnp.where(scaled >= thresh, scaled, -jnp.inf)
        else:
            filtered = scaled
        return categorical_icdf(keys, filtered)

    # A traced branch: greedy calls skip the sort and the [R, V] random draw at run time.
    tokens = jax.lax.cond(greedy, lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32), draw)
    return tokens, token_logprob(scaled, tokens)


def token_logprob(scaled: jax.Array, tokens: jax.Array) -> jax.Array:
    """log softmax(scaled)[r, tokens[r]]: scaled [R, V] f32, tokens [R] -> [R] f32.

    `jax.nn.log_softmax`'s arithmetic for the one element per row (bit-equal), without its
    [R, V] output, which XLA:CPU materialised and gathered from: `sample_step` alone at Gemma 3's
    V = 262,144 and 32 rows went from 23 to 15 ms (benchmarks/README.md, issue 51; inside the
    whole decode step the difference was within the loaded machine's noise)."""
    m = jnp.max(scaled, axis=-1, keepdims=True)
    lse = jnp.log(jnp.sum(jnp.exp(scaled - m), axis=-1))
    picked = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    return (picked - m[:, 0]) - lse
