"""Where a decode step of the 5M benchmark model goes: dense matmuls, cache attention, sampling.

    python benchmarks/decode_parts.py [--prompt-len 192] [--steps 32]

Each part runs alone, jitted, in a `fori_loop` of `--steps` iterations at the shapes of
`benchmarks/sampler.py`'s 5M model (8 prompts x G=16 = 128 rows, hidden 256, 4 layers, 8:2
heads of 32, vocab 4096, 128 generated slots): the layers' and LM head's matmuls (random
weights), `models.decode.decode_attention` over the prompt prefix and the whole generated
buffer for every layer, and `sampling.sample_step` (temperature 1). Best of 5, ms per step,
with the effective rate of each part and the load average. Compare the sum with
`benchmarks/sampler.py`'s measured decode ms/step (the rest is norms, RoPE, cache updates and
loop overhead).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sagc_jax.models.decode import decode_attention
from sagc_jax.sampling.draw import sample_step

P, G, H, L, N, K, D, I, V, M = 8, 16, 256, 4, 8, 2, 32, 704, 4096, 128
R = P * G


def best_ms(f: Callable, x: jax.Array, steps: int, repeats: int = 5) -> float:
    """ms per loop iteration of `f(x)` (a jitted `steps`-iteration loop): best of `repeats`
    after one warm-up call."""
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t)
    return min(times) / steps * 1e3


def sampling_chain(keys: jax.Array, steps: int) -> Callable:
    """A jitted loop of `steps` temperature-1 `sample_step`s over logits [rows, V] (one key per
    row in `keys`), each feeding a trace of its logprobs back so no step is dead code."""

    @jax.jit
    def sampling(logits: jax.Array) -> jax.Array:
        def body(i: jax.Array, lg: jax.Array) -> jax.Array:
            _, lp = sample_step(lg, jax.vmap(lambda k: jax.random.fold_in(k, i))(keys),
                                jnp.float32(1.0), jnp.int32(0), jnp.float32(1.0),
                                jnp.bool_(False), use_top_k=False, use_top_p=False)
            return lg + 1e-6 * lp[:, None]
        return jax.lax.fori_loop(0, steps, body, logits)

    return sampling


def dense_chain(mats: list[jax.Array], head: jax.Array, steps: int,
                dot: Callable = jnp.matmul) -> Callable:
    """A decode step's dense matmuls alone: `mats` = stacked [L, in, out] q, k, v, o, gate, up,
    down kernels, `head` [H, V]; unrolled over layers inside a `steps`-iteration `fori_loop`,
    as the decode body; `dot(x, w)` is the product (bf16 weights under f32 activations:
    `precision.dot_f32` of x cast to bf16, as the decode step runs them). The weights are
    arguments of the jitted loop, as the decode step gets them: closure constants would be
    constant-folded (minutes for a real model's weights) and laid out at compile time. Returns
    x [rows, H] -> x."""
    h = head.shape[0]

    @jax.jit
    def dense(x: jax.Array, mats: list[jax.Array], head: jax.Array) -> jax.Array:
        def body(_: int, x: jax.Array) -> jax.Array:
            for i in range(mats[0].shape[0]):
                wq, wk, wv, wo, wg, wu, wd = (m[i] for m in mats)
                kv = dot(x, wk).sum(-1, keepdims=True) + dot(x, wv).sum(-1, keepdims=True)
                x = x + dot(dot(x, wq), wo) + kv * 1e-9
                x = x + dot(jax.nn.silu(dot(x, wg)) * dot(x, wu), wd)
            return x + 1e-9 * dot(x, head)[:, :h]
        return jax.lax.fori_loop(0, steps, body, x)

    return lambda x: dense(x, mats, head)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    lp, steps = args.prompt_len, args.steps
    ks = iter(jax.random.split(jax.random.key(0), 16))

    def rnd(*shape: int) -> jax.Array:
        return jax.random.normal(next(ks), shape) * 0.02

    dense = dense_chain([rnd(L, H, N * D), rnd(L, H, K * D), rnd(L, H, K * D),
                         rnd(L, N * D, H), rnd(L, H, I), rnd(L, H, I), rnd(L, I, H)],
                        rnd(H, V), steps)

    pk, pv = rnd(L, P, K, D, lp), rnd(L, P, K, lp, D)
    gk, gv = rnd(L, R, K, D, M), rnd(L, R, K, M, D)
    mask = jnp.ones((P, lp), bool)

    @jax.jit
    def attention(q: jax.Array) -> jax.Array:
        def body(i: jax.Array, q: jax.Array) -> jax.Array:
            for layer in range(L):
                o = decode_attention(q, pk[layer], pv[layer], mask, gk[layer], gv[layer],
                                     i + M // 2, G)
                q = q + 1e-6 * o.reshape(q.shape)
            return q
        return jax.lax.fori_loop(0, steps, body, q)

    sampling = sampling_chain(jax.random.split(next(ks), R), steps)

    flops = 2 * R * (L * (H * (N * D + 2 * K * D) + N * D * H + 3 * H * I) + H * V)
    cache = 4 * L * (P * K * D * lp * 2 + R * K * M * D * 2)
    t_dense = best_ms(dense, rnd(R, H), steps)
    t_att = best_ms(attention, rnd(R, N, D), steps)
    t_samp = best_ms(sampling, rnd(R, V) * 50, steps)
    load = "load {:.1f}/{:.1f}".format(*os.getloadavg()[:2])
    print(f"| 5M, prompt {lp} | {t_dense:.1f} ({flops / t_dense / 1e6:.0f} GFLOP/s) | "
          f"{t_att:.1f} ({cache / t_att / 1e6:.1f} GB/s over {cache / 1e6:.0f} MB) | "
          f"{t_samp:.2f} | {t_dense + t_att + t_samp:.1f} | {load} |")


if __name__ == "__main__":
    main()
