"""What the gradient noise scale's terms (`rl.noise_scale`) cost the update, measured.

    python benchmarks/noise_terms_cost.py [--repeats 30]

The grad program of one chunk compiled twice over the same model and batch: as shipped (each
chunk adds |c_i|², w_i, w_i² to the accumulator) and with `chunk_sums` replaced by constants
(XLA then computes none of it), timed interleaved. Model: the main job's shape
(`configs/tiny_cpu.yaml`, every parameter trained: the most parameters per FLOP of forward, so
the worst case for a pass over the gradients) and a wider one; chunks of 4 rows x 256 slots.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference_step import rollout

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.sharding import state_shardings
from sagc_jax.parallel import make_mesh
from sagc_jax.rl import noise_scale, train_step
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.shapes import TrainLayout
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import init_opt_state

SHAPES = {"tiny_cpu (h 128, 4 layers)": dict(vocab_size=512, hidden_size=128,
                                               intermediate_size=384, num_layers=4, num_heads=4,
                                               num_kv_heads=2, head_dim=32),
          "h 512, 8 layers": dict(vocab_size=2048, hidden_size=512, intermediate_size=1536,
                                  num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64)}
LP, N, PACK, G, P = 64, 192, 256, 4, 4


def _zeros(grads, mask, norms, loss_agg, max_tokens):
    z = jnp.zeros((), jnp.float32)
    return {"noise_chunk_grad_sq": z, "noise_weight": z, "noise_weight_sq": z}


def _program(cfg: ModelConfig, without: bool):
    """(jitted grad step of one 4-row chunk, its arguments)."""
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    shard = state_shardings(params, mesh)
    opt = optax.adamw(1e-4)
    p = jax.device_put(params, shard)
    o, o_shard = init_opt_state(opt, p, mesh)
    layout = TrainLayout(seqs=P * G, num_groups=P, completion_len=N, pack_len=PACK,
                         chunk_sizes=(4,), share_prompts=True)
    settings = LossSettings(max_tokens=N)
    saved = train_step.chunk_sums
    train_step.chunk_sums = _zeros if without else noise_scale.chunk_sums
    try:
        learner = Learner(graphdef, opt, settings, mesh, shard, o_shard, layout)
        learner.warm_up(p, o)
    finally:
        train_step.chunk_sums = saved
    ro = rollout(0, g=G, prompts=P, lp=LP, n=N, vocab=cfg.vocab_size, drop=())
    chunks, seqs = learner.to_device(make_batch(ro, layout))
    grad = learner._compiled[("grad", 4)]
    zeros = learner._compiled[("zeros", 0)]
    return grad, zeros, p, chunks[0], seqs, learner._chunk_index(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {a.repeats} interleaved calls each\n")
    print("| model | chunk grad, shipped (ms) | without the noise terms (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for name, kw in SHAPES.items():
        progs = {w: _program(ModelConfig(**kw), w) for w in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        for i in range(a.repeats + 2):
            for w in ((False, True) if i % 2 else (True, False)):
                grad, zeros, p, chunk, seqs, idx = progs[w]
                acc = zeros(p)
                t0 = time.perf_counter()
                jax.block_until_ready(grad(p, acc, chunk, seqs, idx))
                if i >= 2:  # the first two calls of each: warm caches
                    times[w].append(time.perf_counter() - t0)
        ms = {w: 1e3 * statistics.median(v) for w, v in times.items()}
        print(f"| {name} | {ms[False]:.1f} | {ms[True]:.1f} | {ms[False] / ms[True]:.3f} |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
