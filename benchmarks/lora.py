"""LoRA vs full fine-tuning on the same model: optimizer-state bytes, train-step time, and the
sampler's decode with adapters merged once per call vs applied unmerged every token.

    python benchmarks/lora.py [--hidden 256 --layers 4 --rows 16 --seq 96 --repeats 5]

Train step: the trainer's GRPO update (`Learner`, one sequence per row, AdamW via
`make_optimizer`) on a random batch; full = every param trained, LoRA = rank-16 adapters on all
7 weights (the base frozen). The two run interleaved (order alternating), compiles excluded;
best of `--repeats`.
Decode: `--decode-steps` one-token steps of `models.decode.decode_step` over `--rows` rows,
weights from `decode_weights` (LoRA merged once per call: the sampler's path) vs the same
weights left unmerged (x @ W + s * (x @ A) @ B inside every token step).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.config.schema import OptimConfig
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.decode import (
    DecodeWeights,
    PrefixKV,
    decode_step,
    decode_weights,
    init_gen,
)
from sagc_jax.models.llama import Transformer
from sagc_jax.models.lora import LORA_TARGETS, trainable
from sagc_jax.models.sharding import state_shardings
from sagc_jax.optim import make_optimizer
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.shapes import TrainLayout
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import init_opt_state


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _rollout(mcfg: ModelConfig, rows: int, lp: int, n: int) -> types.SimpleNamespace:
    """Groups of 4 rows, prompts of `lp` tokens, completions of `n` (what `make_batch` reads)."""
    rng = np.random.default_rng(0)
    return types.SimpleNamespace(
        group_size=4, row_offset=0, scored=None,
        examples=[{"prompt_ids": rng.integers(3, mcfg.vocab_size, lp).tolist()}
                  for _ in range(rows // 4)],
        tokens=rng.integers(3, mcfg.vocab_size, (rows, n)).astype(np.int32),
        logprobs=np.full((rows, n), -np.log(mcfg.vocab_size), np.float32),
        lengths=np.full(rows, n, np.int32), truncated=np.zeros(rows, bool),
        rewards=np.tile([0.0, 1.0], rows // 2).astype(np.float32), valid=np.ones(rows, bool))


def _trainer(mcfg: ModelConfig, rows: int, lp: int, n: int):
    """(step() running one jitted GRPO update in place, optimizer-state bytes, params bytes)."""
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    graphdef, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
    shard = state_shardings(params, mesh)
    params = jax.device_put(params, shard)
    opt = make_optimizer(OptimConfig(lr=1e-4, warmup_steps=0), 100)
    opt_state, opt_shard = init_opt_state(opt, trainable(params), mesh)
    layout = TrainLayout(seqs=rows, num_groups=rows // 4, completion_len=n, pack_len=lp + n,
                         chunk_sizes=(rows,), share_prompts=False)
    steps = Learner(graphdef, opt, LossSettings(max_tokens=n), mesh, shard, opt_shard, layout)
    chunks, seqs = steps.to_device(make_batch(_rollout(mcfg, rows, lp, n), layout))
    state = {"p": params, "o": opt_state}

    def step() -> None:
        state["p"], state["o"], m = steps.step(state["p"], state["o"], chunks, seqs)
        jax.block_until_ready(m)

    return step, _bytes(opt_state), _bytes(params), state


def _decoder(mcfg: ModelConfig, params, rows: int, lp: int, steps: int, merged: bool):
    """A jitted `steps`-token decode from a zero prefix; weights merged once or unmerged."""
    graphdef = nnx.graphdef(Transformer(mcfg, rngs=nnx.Rngs(0)))
    dt = jnp.dtype(mcfg.dtype)

    def run(params, tokens):
        model = nnx.merge(graphdef, params)
        if merged:
            w = decode_weights(model)
        else:  # the adapters stay in each layer's dict: decode_step applies them per token
            stacked = nnx.to_pure_dict(nnx.state(model.layers))
            w = DecodeWeights(model.embed[...], tuple(
                {k: v[i].astype(dt) for k, v in stacked.items()}
                for i in range(mcfg.num_layers)), model.final_norm[...],
                model.lm_head[...].astype(dt))
        kv = (mcfg.num_layers, rows, mcfg.num_kv_heads)
        prefix = PrefixKV(tuple(jnp.zeros((*kv[1:], mcfg.head_dim, lp), dt)
                                for _ in range(kv[0])),
                          tuple(jnp.zeros((*kv[1:], lp, mcfg.head_dim), dt)
                                for _ in range(kv[0])))
        mask = jnp.ones((rows, lp), bool)
        gen = init_gen(mcfg, rows, steps)

        def body(carry, t):
            tok, gen = carry
            logits, gen = decode_step(mcfg, w, tok, lp + t + jnp.zeros_like(tok), prefix, mask,
                                      gen, t, 1)
            return (jnp.argmax(logits, -1).astype(jnp.int32), gen), None

        (tok, _), _ = jax.lax.scan(body, (tokens, gen), jnp.arange(steps))
        return tok

    fn = jax.jit(run)
    tokens = jnp.arange(rows, dtype=jnp.int32) % mcfg.vocab_size
    fn(params, tokens).block_until_ready()
    return lambda: fn(params, tokens).block_until_ready()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--seq", type=int, default=96, help="prompt 32 + completion (seq - 32)")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    h = args.hidden
    full = ModelConfig(vocab_size=args.vocab, hidden_size=h, intermediate_size=3 * h,
                       num_layers=args.layers, num_heads=max(h // 64, 1),
                       num_kv_heads=max(h // 128, 1), head_dim=64)
    lora = dataclasses.replace(full, lora_rank=args.rank, lora_alpha=2.0 * args.rank,
                               lora_targets=LORA_TARGETS)
    lp, n = 32, args.seq - 32
    print(f"model {full.num_params() / 1e6:.2f}M params, LoRA rank {args.rank} on "
          f"{len(LORA_TARGETS)} weights = {lora.num_lora_params() / 1e6:.3f}M; rows {args.rows} "
          f"x seq {args.seq}; load before {_load()}", flush=True)
    runs = {}
    for name, mc in (("full", full), ("lora", lora)):
        step, opt_b, par_b, state = _trainer(mc, args.rows, lp, n)
        step()  # compile + first run
        runs[name] = (step, opt_b, par_b, state)
    times = {"full": [], "lora": []}
    for r in range(args.repeats):
        for name in (("full", "lora") if r % 2 == 0 else ("lora", "full")):
            times[name].append(_timed(runs[name][0]))
    for name in ("full", "lora"):
        _, opt_b, par_b, _ = runs[name]
        print(f"train {name:4s}: optimizer state {opt_b / 2**20:8.2f} MiB, params "
              f"{par_b / 2**20:7.2f} MiB, step {min(times[name]):.3f}s (best of {args.repeats})",
              flush=True)
    print(f"train lora/full step time {min(times['lora']) / min(times['full']):.2f}x, optimizer "
          f"state {runs['lora'][1] / runs['full'][1]:.4f}x; load {_load()}", flush=True)

    params = runs["lora"][3]["p"]  # trained adapters (B != 0)
    dec = {m: _decoder(lora, params, args.rows, lp, args.decode_steps, m) for m in (True, False)}
    dt = {True: [], False: []}
    for r in range(args.repeats):
        for m in ((True, False) if r % 2 == 0 else (False, True)):
            dt[m].append(_timed(dec[m]))
    print(f"decode {args.decode_steps} tokens x {args.rows} rows: merged once "
          f"{min(dt[True]):.3f}s, unmerged per token {min(dt[False]):.3f}s "
          f"({min(dt[False]) / min(dt[True]):.2f}x); load {_load()}", flush=True)


if __name__ == "__main__":
    main()
