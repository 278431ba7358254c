"""Train step: the layout's two cases, one sequence per row (padded) vs packed with shared
prompts, on the main job's own steps, interleaved.

    python benchmarks/train_step.py --trace runs/tiny_cpu/trace.jsonl [--steps 12] [--repeats 2]

Replays `--steps` steps of a run's trace (G and every completion length, spread over the run)
through the train step of `--config`'s model in both layouts (the same compiled programs), with
prompt lengths drawn from the task's real tokenized prompts. Random weights and token ids: the
cost of a step does not depend on them. Both updates of a step run back to back (order
alternating), compiles excluded, and each time includes building and transferring its batch
(packing is host work the trainer pays for).

Also measured in the same run: the machine's f32 matmul rate (a [2048, 2048] @ [2048, 2048]
product), and the forward / forward+backward split of one packed chunk. The roofline: a step
needs ~6 x params x real tokens FLOPs (forward 2, backward 4); at the measured matmul rate that
is the floor its seconds are compared against.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.config import load_config
from sagc_jax.data.pipeline import load_examples
from sagc_jax.data.tokenizer import encode_prompt, load_tokenizer
from sagc_jax.models.build import model_config
from sagc_jax.models.llama import Transformer
from sagc_jax.models.sharding import state_shardings
from sagc_jax.optim import make_optimizer
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.batch import TrainBatch, make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.shapes import ShapePlan
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import init_opt_state


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def matmul_gflops(n: int = 2048, reps: int = 5) -> float:
    """Best-of-`reps` f32 GFLOP/s of an [n, n] @ [n, n] jitted product."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(reps))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _batches(trace: list[dict], plan: ShapePlan, prompt_lens: np.ndarray, vocab: int,
             steps: int, seed: int) -> list[dict]:
    """Rollouts (the fields `rl.batch.make_batch` reads) of `steps` trace steps spread over
    the run."""
    rng = np.random.default_rng(seed)
    nmax = plan.max_new_tokens
    pick = np.linspace(0, len(trace) - 1, steps).round().astype(int)
    out = []
    for i in pick:
        t = trace[i]
        g = t["group_size"]
        lens = np.concatenate([grp["lengths"] for grp in t["groups"]]).astype(np.int32)
        rewards = np.concatenate([grp["rewards"] for grp in t["groups"]]).astype(np.float32)
        rows = len(lens)
        ro = types.SimpleNamespace(
            group_size=g, row_offset=0, scored=None,
            examples=[{"prompt_ids": rng.integers(3, vocab, p).tolist()}
                      for p in rng.choice(prompt_lens, rows // g)],
            tokens=rng.integers(3, vocab, (rows, nmax)).astype(np.int32),
            logprobs=np.full((rows, nmax), -np.log(vocab), np.float32), lengths=lens,
            truncated=np.zeros(rows, bool), rewards=rewards, valid=np.ones(rows, bool))
        out.append({"step": t["step"], "g": g, "rollout": ro})
    return out


def _setup(args: argparse.Namespace) -> dict:
    """Model, optimizer, both compiled train steps and the replayed batches of `args`."""
    cfg = load_config(args.config)
    tok = load_tokenizer(cfg.model.tokenizer)
    mcfg = model_config(cfg, len(tok), tok)
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    plan = ShapePlan.from_config(cfg)
    graphdef, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
    shard = state_shardings(params, mesh)
    params = jax.device_put(params, shard)
    opt = make_optimizer(cfg.optim, cfg.run.steps)
    opt_state, opt_shard = init_opt_state(opt, params, mesh)
    settings = LossSettings.from_config(cfg)
    t = plan.train_layout
    steps = Learner(graphdef, opt, settings, mesh, shard, opt_shard, t)
    specs = {name: dataclasses.replace(t, share_prompts=name == "packed")
             for name in ("padded", "packed")}
    examples = load_examples(cfg.data, "train", seed=cfg.run.seed)
    prompt_lens = np.array([len(encode_prompt(tok, examples[i]["prompt"],
                                              cfg.data.chat_template)) for i in range(1000)])
    with open(args.trace) as f:
        trace = [json.loads(x) for x in f if x.strip()]
    batches = _batches(trace, plan, prompt_lens, mcfg.vocab_size, args.steps, 0)
    return {"mcfg": mcfg, "plan": plan, "params": params, "opt_state": opt_state,
            "steps": steps, "specs": specs, "batches": batches}


def _compare_steps(env: dict, repeats: int) -> list[dict]:
    """Per trace step: both layouts back to back (order alternating), best of `repeats`."""
    steps = env["steps"]
    print(f"load before compile {_load()}", flush=True)
    t0 = time.perf_counter()
    steps.warm_up(env["params"], env["opt_state"])
    print(f"compiled in {time.perf_counter() - t0:.0f}s; load {_load()}", flush=True)

    def run(b: dict, name: str) -> None:
        batch = make_batch(b["rollout"], env["specs"][name])
        env["params"], env["opt_state"], m = steps.step(
            env["params"], env["opt_state"], *steps.to_device(batch))
        jax.block_until_ready(m)
        b[name] = batch

    rows_out = []
    for i, b in enumerate(env["batches"]):
        ts: dict[str, list[float]] = {"padded": [], "packed": []}
        for r in range(repeats):
            order = ("padded", "packed") if (i + r) % 2 == 0 else ("packed", "padded")
            for name in order:
                ts[name].append(_timed(lambda b=b, name=name: run(b, name)))
        pad, pack = b["padded"], b["packed"]
        rows_out.append({
            "step": b["step"], "G": b["g"], "rows": len(b["rollout"].lengths),
            "real": pad.real_tokens, "util_padded": pad.token_util,
            "util_packed": pack.token_util, "chunks": "+".join(map(str, pack.sizes)),
            "s_padded": min(ts["padded"]), "s_packed": min(ts["packed"])})
        print(json.dumps(rows_out[-1]), flush=True)
    return rows_out


def _chunk_split(env: dict) -> tuple[int, float, float]:
    """(rows, forward s, forward+backward s) of the largest chunk, steady state."""
    plan, steps, params = env["plan"], env["steps"], env["params"]
    c = steps.chunk_sizes[0]
    rng = np.random.default_rng(1)
    L, K, V = plan.pack_len, steps.completion_len, env["mcfg"].vocab_size
    chunk = {"tokens": rng.integers(3, V, (c, L)).astype(np.int32),
             "positions": np.tile(np.arange(L, dtype=np.int32), (c, 1)),
             "segment_ids": np.ones((c, L), np.int32), "branch_ids": np.zeros((c, L), np.int32),
             "head_slots": np.tile(np.arange(L - K, L, dtype=np.int32), (c, 1)),
             "head_targets": rng.integers(3, V, (c, K)).astype(np.int32)}
    b = make_batch(env["batches"][0]["rollout"], env["specs"]["packed"])
    dc, ds = steps.to_device(TrainBatch([chunk], b.seqs, (c,), 0, 0))
    idx = steps._chunk_index(0)
    out = jnp.zeros((steps.seqs, steps.completion_len), jnp.float32)
    logp = steps._fn("logp", c)
    logp(params, out.copy(), dc[0], ds, idx).block_until_ready()
    fwd = min(_timed(lambda: logp(params, out.copy(), dc[0], ds, idx).block_until_ready())
              for _ in range(3))
    acc = steps._fn("zeros")(params)
    grad = steps._fn("grad", c)

    def grad_once():
        nonlocal acc
        acc = grad(params, acc, dc[0], ds, idx)
        jax.block_until_ready(acc)

    grad_once()
    return c, fwd, min(_timed(grad_once) for _ in range(3))


def _report(rows_out: list[dict], n_params: int, gflops: float, pack_len: int,
            split: tuple[int, float, float]) -> None:
    """The markdown table, the roofline line and the chunk's forward/backward split."""
    tot = {k: sum(r[k] for r in rows_out) for k in ("real", "s_padded", "s_packed")}
    ideal = 6 * n_params * tot["real"] / (gflops * 1e9)
    print(f"\nload after {_load()}; params {n_params / 1e6:.2f}M; matmul {gflops:.1f} GFLOP/s")
    print("\n| step | G | rows | real tokens | util padded | util packed | chunks |"
          " padded s | packed s | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in rows_out:
        print(f"| {r['step']} | {r['G']} | {r['rows']} | {r['real']} | "
              f"{r['util_padded']:.2f} | {r['util_packed']:.2f} | {r['chunks']} | "
              f"{r['s_padded']:.2f} | {r['s_packed']:.2f} | {r['s_padded'] / r['s_packed']:.2f} |")
    comp_pad = sum(r["real"] / r["util_padded"] for r in rows_out)
    comp_pack = sum(r["real"] / r["util_packed"] for r in rows_out)
    print(f"| all | | | {tot['real']} | {tot['real'] / comp_pad:.2f} | "
          f"{tot['real'] / comp_pack:.2f} | | {tot['s_padded']:.2f} | {tot['s_packed']:.2f} | "
          f"{tot['s_padded'] / tot['s_packed']:.2f} |")
    print(f"\nroofline: 6 x {n_params / 1e6:.2f}M params x {tot['real']} real tokens = "
          f"{6 * n_params * tot['real'] / 1e9:.1f} GFLOP -> {ideal:.2f}s at {gflops:.1f} GFLOP/s; "
          f"packed {tot['s_packed']:.2f}s = {ideal / tot['s_packed']:.0%} of the limit, "
          f"padded {tot['s_padded']:.2f}s = {ideal / tot['s_padded']:.0%}")
    c, fwd, both = split
    print(f"one {c}-row chunk ({c * pack_len} slots): forward {fwd * 1e3:.0f} ms, "
          f"forward+backward {both * 1e3:.0f} ms (backward = {(both - fwd) / fwd:.1f}x forward)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny_cpu.yaml")
    ap.add_argument("--trace", required=True, help="a run's trace.jsonl (G and lengths)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    env = _setup(args)
    rows_out = _compare_steps(env, args.repeats)
    gflops = matmul_gflops()
    split = _chunk_split(env)
    _report(rows_out, env["mcfg"].num_params(), gflops, env["plan"].pack_len, split)


if __name__ == "__main__":
    main()
