"""`model.matmul_dtype`: float32 vs bfloat16 matmuls side by side, on this machine.

    python benchmarks/matmul_precision.py            # dots + the real model's train chunk
    python benchmarks/matmul_precision.py --no-model # dots only

1. One dense layer's product at the train step's shape ([rows x pack_len, 576] x [576, 1536],
   SmolLM2-135M's MLP) in float32, in bf16 -> f32 with canonical operands, with a transposed
   operand (what autodiff's backward hands XLA), and through `row_major_t`; then the backward
   of `precision.matmul` against the float32 product's.
2. With the wheel's GGUF installed: the loss gradient of one packed 4 x 416 chunk of the real
   model (the trainer's grad step without the packing bookkeeping), float32 vs bfloat16 matmuls,
   interleaved, best of `--repeats`.
Every figure is printed with the load average beside it; ratios come from one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sagc_jax.models.precision import matmul, row_major_t

BF, F32 = jnp.bfloat16, jnp.float32


def best_s(f: Callable, *args, repeats: int = 5) -> float:
    jax.block_until_ready(f(*args))
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        out.append(time.perf_counter() - t)
    return min(out)


def load() -> str:
    return "load {:.1f}/{:.1f}".format(*os.getloadavg()[:2])


def dots(m: int = 1664, k: int = 576, n: int = 1536) -> None:
    rng = np.random.default_rng(0)
    x, w = (jnp.asarray(rng.standard_normal(s), F32) for s in ((m, k), (k, n)))
    g = jnp.asarray(rng.standard_normal((m, n)), F32)
    fl = 2 * m * k * n

    def dot(a, b):
        return jnp.dot(a, b, preferred_element_type=F32)

    cases = {
        "f32 x @ w": (jax.jit(dot), x, w),
        "f32 g @ w.T": (jax.jit(lambda a, b: dot(a, b.T)), g, w),
        "bf16 x @ w (canonical)": (jax.jit(lambda a, b: dot(a.astype(BF), b.astype(BF))), x, w),
        "bf16 g @ w.T (transposed operand)": (
            jax.jit(lambda a, b: dot(a.astype(BF), b.astype(BF).T)), g, w),
        "bf16 g @ row_major_t(w.T)": (
            jax.jit(lambda a, b: dot(a.astype(BF), row_major_t(b.astype(BF)))), g, w),
    }
    print(f"## one dot [{m}, {k}] x [{k}, {n}] ({load()})")
    base = None
    for name, (f, a, b) in cases.items():
        s = best_s(f, a, b)
        base = base or s
        print(f"  {name:36s} {s * 1e3:6.1f} ms  {fl / s / 1e9:5.0f} GFLOP/s  "
              f"f32/this {base / s:.2f}  ({load()})")
    # The vjp's forward product is dead code (a linear map's backward does not need it).
    print(f"## backward (dx = g w^T, dw = x^T g) ({load()})")
    base = None
    for name, dt in (("float32", None), ("bfloat16 (precision.matmul)", "bfloat16")):
        f = jax.jit(lambda a, b, c, dt=dt: jax.vjp(lambda p, q: matmul(p, q, dt), a, b)[1](c))
        s = best_s(f, x, w, g)
        base = base or s
        print(f"  {name:36s} {s * 1e3:6.1f} ms  {2 * fl / s / 1e9:5.0f} GFLOP/s  "
              f"f32/this {base / s:.2f}  ({load()})")


def model_chunk(repeats: int) -> None:
    from flax import nnx

    from sagc_jax.models.gguf import smollm2_path
    from sagc_jax.models.pretrained import from_pretrained
    from sagc_jax.rl.losses import token_logprobs_and_entropy

    model, _ = from_pretrained(smollm2_path())
    rows, length = 4, 416
    rng = np.random.default_rng(0)
    tokens, targets = (jnp.asarray(rng.integers(0, model.cfg.vocab_size, (rows, length)),
                                   jnp.int32) for _ in range(2))
    # Two packed sequences a row, as the packer lays them out.
    seg = jnp.asarray(np.where(np.arange(length) < 200, 1, 2)[None].repeat(rows, 0), jnp.int32)
    pos = jnp.asarray(np.concatenate([np.arange(200), np.arange(length - 200)])[None]
                      .repeat(rows, 0), jnp.int32)
    fns = {}
    for dt in ("float32", "bfloat16"):
        m = nnx.merge(*nnx.split(model))
        m.cfg = dataclasses.replace(m.cfg, matmul_dtype=None if dt == "float32" else dt)
        gd, params = nnx.split(m)

        def loss(p, gd=gd):
            logits = nnx.merge(gd, p)(tokens, positions=pos, segment_ids=seg)
            lp, ent = token_logprobs_and_entropy(logits, targets, 1.0, entropy=True)
            return lp.sum() + ent.sum()

        fns[dt] = (jax.jit(jax.grad(loss)), params)
    flops = 6 * sum(x.size for x in jax.tree.leaves(fns["float32"][1])) * rows * length
    print(f"## real model: loss gradient of one packed {rows} x {length} chunk ({load()})")
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f, p in fns.values():
        jax.block_until_ready(f(p))
    for _ in range(repeats):  # interleaved
        for dt, (f, p) in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f(p))
            times[dt].append(time.perf_counter() - t)
            print(f"  {dt:9s} {times[dt][-1]:6.2f} s  ({load()})", flush=True)
    b32, b16 = min(times["float32"]), min(times["bfloat16"])
    print(f"  best: float32 {b32:.2f} s ({flops / b32 / 1e9:.0f} GFLOP/s dense), bfloat16 "
          f"{b16:.2f} s ({flops / b16 / 1e9:.0f}); float32 / bfloat16 = {b32 / b16:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    dots()
    if not a.no_model:
        model_chunk(a.repeats)


if __name__ == "__main__":
    main()
