"""GPU benchmark: train-step MFU, decode tokens/s vs the HBM roofline, and a short SAGC run.

    python benchmarks/gpu_bench.py [--out results.json]      # on an NVIDIA GPU (<= 8 min)
    python benchmarks/gpu_bench.py --smoke                   # tiny shapes, runs on a CPU (CI)

Model: a randomly initialised Qwen2-0.5B-shaped decoder (vocab 151936, hidden 896, 24 layers,
14 heads / 2 kv heads x 64, SwiGLU 4864, tied embeddings, q/k/v bias) in bfloat16 compute with
float32 params, i.e. exactly what `configs/qwen2.5-0.5b_gsm8k_gpu.yaml` trains. No weights or
tokenizer are needed.

1. Train step (the project's `CompiledSteps`, GRPO loss, AdamW, remat, micro-batches):
   MFU = model FLOPs / step time / peak. Model FLOPs per token = 6 x matmul params (incl. the
   LM head) + 12 x layers x seq x q_dim (attention scores and values, fwd + bwd; our attention
   computes the full seq x seq block). Remat recompute is not counted (the usual convention).
2. Decode (the project's `Sampler`, EOS disabled so every row runs `--new-tokens` steps) at
   several row counts: tokens/s = rows x decode steps / decode seconds, against the HBM roofline
   rows / (bytes per decode step / HBM bandwidth), bytes per step = bf16 weights (2 x params)
   + the KV cache the step reads (rows x cache slots x kv bytes per token; the cache bucket is
   read whole every step). Decode is memory-bound: tokens/s should grow ~linearly with rows
   until the KV cache, not the weights, dominates the bytes.
3. A short SAGC training run on the built-in arithmetic task (`configs/tiny_cpu.yaml` with
   `sagc.timing=measured`): group sizes chosen, step seconds, compiles after warm-up (must be 0).

Peaks come from the device kind (H200: 989 TFLOP/s bf16 dense, 4.8 TB/s) or --peak-tflops /
--hbm-tbps. Results print as a table and are written as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sagc_jax.models import ModelConfig, Transformer  # noqa: E402
from sagc_jax.models.sharding import replicated, state_shardings  # noqa: E402
from sagc_jax.parallel import make_mesh  # noqa: E402
from sagc_jax.rl.train_step import LossSettings  # noqa: E402
from sagc_jax.sampling import Sampler, SamplingConfig  # noqa: E402
from sagc_jax.train.learner import CompiledSteps  # noqa: E402

# device kind substring -> (bf16 dense FLOP/s, HBM bytes/s)
PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.0e12),
    "L4": (121e12, 0.3e12),
}
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                 num_heads=14, num_kv_heads=2, head_dim=64)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16)


def model_config(smoke: bool) -> ModelConfig:
    """Qwen2-0.5B shape (or a tiny one for --smoke), bf16 compute, remat on."""
    return ModelConfig(model_type="qwen2", **(TINY if smoke else QWEN2_05B),
                       rope_theta=1e6, max_position_embeddings=32768, tie_word_embeddings=True,
                       qkv_bias=True, dtype="bfloat16", remat=True)


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (all but the embedding gather + norms;
    the tied LM head counts once)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = 3 * h * cfg.intermediate_size
    return cfg.num_layers * (attn + mlp) + cfg.vocab_size * h


def train_flops_per_token(cfg: ModelConfig, seq: int) -> float:
    """Model FLOPs (fwd + bwd) per trained token at sequence length ``seq``."""
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.num_layers * seq * cfg.num_heads * cfg.head_dim


def peaks(args: argparse.Namespace) -> tuple[str, float, float]:
    """(device kind, peak FLOP/s per device, HBM bytes/s per device)."""
    kind = jax.devices()[0].device_kind
    flops, bw = next((v for k, v in PEAKS.items() if k.lower() in kind.lower()), (None, None))
    if args.peak_tflops:
        flops = args.peak_tflops * 1e12
    if args.hbm_tbps:
        bw = args.hbm_tbps * 1e12
    if flops is None or bw is None:  # unknown device (e.g. the CPU smoke run): nominal values
        flops, bw = flops or 1e12, bw or 1e11
    return kind, flops, bw


def _timed(fn, *args, repeats: int) -> tuple[float, Any]:
    out = None
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / repeats, out


# --------------------------------------------------------------------------------------------
# 1. Train step
# --------------------------------------------------------------------------------------------


def bench_train(cfg: ModelConfig, *, rows: int, group: int, prompt_len: int, new_tokens: int,
                micro_batch_rows: int, repeats: int, peak_flops: float) -> dict[str, Any]:
    """MFU of the GRPO update on ``rows`` sequences of ``prompt_len + new_tokens`` tokens."""
    mesh = make_mesh()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    pshard = state_shardings(params, mesh)
    params = jax.device_put(params, pshard)
    optimizer = optax.adamw(1e-6)
    # fsdp = tensor = 1 here, so params are replicated and the AdamW state can be too (a
    # NamedSharding for every leaf: a SingleDeviceSharding scalar would recompile on call 2).
    oshard = jax.tree.map(lambda _: replicated(mesh), optimizer.init(params))
    opt_state = jax.device_put(optimizer.init(params), oshard)
    steps = CompiledSteps(graphdef, optimizer, LossSettings(max_tokens=new_tokens), mesh, pshard,
                          oshard, micro_batch_rows)
    seq = prompt_len + new_tokens
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(1, cfg.vocab_size, (rows, seq), dtype=np.int32),
        "prompt_pad": np.zeros(rows, np.int32),
        "lengths": np.full(rows, new_tokens, np.int32),
        "old_logprobs": np.full((rows, new_tokens), -np.log(cfg.vocab_size), np.float32),
        "ref_logprobs": np.zeros((rows, new_tokens), np.float32),
        "rewards": rng.random(rows).astype(np.float32),
        "group_ids": (np.arange(rows) // group).astype(np.int32),
        "valid": np.ones(rows, bool), "loss_rows": np.ones(rows, bool),
    }
    shard = steps.batch_shardings(rows)
    dev = {k: jax.device_put(v, shard[k]) for k, v in batch.items()}
    fn = steps.train_fn(rows, rows // group, prompt_len)
    t0 = time.perf_counter()
    params, opt_state, m = fn(params, opt_state, dev)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    params, opt_state, m = fn(params, opt_state, dev)  # one untimed step after the compile
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(repeats):
        params, opt_state, m = fn(params, opt_state, dev)
    jax.block_until_ready(m)
    step_s = (time.perf_counter() - t0) / repeats
    flops = train_flops_per_token(cfg, seq) * rows * seq
    n_dev = jax.device_count()
    return {"rows": rows, "seq": seq, "micro_batch_rows": micro_batch_rows,
            "compile_s": compile_s, "step_s": step_s, "tokens_per_s": rows * seq / step_s,
            "model_tflops": flops / 1e12, "tflops_per_s": flops / step_s / 1e12,
            "mfu": flops / step_s / (peak_flops * n_dev), "loss": float(m["loss"])}


# --------------------------------------------------------------------------------------------
# 2. Decode
# --------------------------------------------------------------------------------------------


def bench_decode(cfg: ModelConfig, *, rows_list: list[int], group: int, prompt_len: int,
                 new_tokens: int, decode_chunk: int, hbm_bw: float) -> list[dict[str, Any]]:
    """Decode tokens/s per row count vs the HBM roofline (EOS disabled: full-length rows)."""
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    kv_tok = cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * jnp.dtype(cfg.dtype).itemsize
    out = []
    rng = np.random.default_rng(0)
    for rows in rows_list:
        p = rows // group
        sampler = Sampler(model, SamplingConfig(
            group_sizes=(group,), prompts_per_step=p, prompt_buckets=(prompt_len,),
            max_new_tokens=new_tokens, decode_chunk=decode_chunk), pad_id=0, eos_ids=(),
            mesh=make_mesh())
        prompts = [rng.integers(1, cfg.vocab_size, prompt_len).tolist() for _ in range(p)]
        t0 = time.perf_counter()
        sampler.generate(prompts, group_size=group, key=jax.random.key(0))  # compile
        compile_s = time.perf_counter() - t0
        res = sampler.generate(prompts, group_size=group, key=jax.random.key(1))
        st = res.stats
        cache = st.cache_bucket
        step_bytes = 2 * n_params + rows * cache * kv_tok
        roof_step_s = step_bytes / hbm_bw
        measured = rows * st.decode_steps / st.decode_s
        roof = rows / roof_step_s
        out.append({"rows": rows, "prompts": p, "cache_bucket": cache,
                    "decode_steps": st.decode_steps, "decode_s": st.decode_s,
                    "prefill_s": st.prefill_s, "compile_s": compile_s,
                    "step_ms": 1e3 * st.decode_s / st.decode_steps,
                    "tokens_per_s": measured, "roofline_tokens_per_s": roof,
                    "roofline_frac": measured / roof, "bytes_per_step": step_bytes})
    return out


# --------------------------------------------------------------------------------------------
# 3. Short SAGC run
# --------------------------------------------------------------------------------------------


def run_sagc(*, steps: int, smoke: bool, run_dir: str) -> dict[str, Any]:
    """A few GRPO+SAGC steps of configs/tiny_cpu.yaml with measured timings."""
    from sagc_jax.config import load_config
    from sagc_jax.metrics import read_jsonl
    from sagc_jax.train import train

    overrides = [f"run.dir={run_dir}", f"run.steps={steps}", "run.progress=false",
                 "run.plots=false", "run.eval_every=0", "checkpoint.every=0",
                 "checkpoint.async_save=false", "sagc.timing=measured", "sagc.warmup_steps=2"]
    if smoke:
        overrides += ["model.hidden_size=32", "model.intermediate_size=64",
                      "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=1",
                      "data.task=arith_short", "data.prompts_per_step=2",
                      "sagc.group_sizes=[2,4]", "sagc.initial_group_size=2",
                      "sampling.max_new_tokens=8", "sampling.prompt_buckets=[32]",
                      "sampling.decode_chunk=8", "init.sft_steps=0"]
    else:
        overrides += ["init.sft_steps=200", "model.dtype=bfloat16"]
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", overrides)
    t0 = time.perf_counter()
    train(cfg, progress=False)
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    return {"steps": len(rows), "wall_s": time.perf_counter() - t0,
            "group_sizes": [r["group_size"] for r in rows],
            "step_s": [round(r["step_s"], 4) for r in rows],
            "compiles_after_warmup": int(sum(r["compiles"] for r in rows)),
            "straggler_rate": [r["straggler_rate"] for r in rows],
            "reward_mean_last": rows[-1]["reward_mean"] if rows else None}


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes; runs on a CPU in seconds")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--peak-tflops", type=float, help="override peak bf16 TFLOP/s per device")
    p.add_argument("--hbm-tbps", type=float, help="override HBM TB/s per device")
    p.add_argument("--sagc-steps", type=int, help="SAGC training steps (default 40; smoke 2)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: train,decode,sagc")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    kind, peak_flops, hbm_bw = peaks(args)
    cfg = model_config(args.smoke)
    s = args.smoke
    results: dict[str, Any] = {
        "device": kind, "devices": jax.device_count(), "peak_tflops": peak_flops / 1e12,
        "hbm_tbps": hbm_bw / 1e12, "model": "tiny" if s else "qwen2-0.5b-shape",
        "matmul_params": matmul_params(cfg)}
    print(f"[gpu_bench] {kind} x{jax.device_count()}, peak {peak_flops / 1e12:.0f} TFLOP/s, "
          f"{hbm_bw / 1e12:.2f} TB/s; model {results['model']}", flush=True)
    if "train" not in skip:
        results["train"] = bench_train(
            cfg, rows=8 if s else 64, group=4 if s else 8, prompt_len=16 if s else 128,
            new_tokens=16 if s else 512, micro_batch_rows=4 if s else 16,
            repeats=2 if s else 5, peak_flops=peak_flops)
        t = results["train"]
        print(f"[train]  rows {t['rows']} x seq {t['seq']}: {t['step_s'] * 1e3:.1f} ms/step, "
              f"{t['tflops_per_s']:.1f} TFLOP/s, MFU {100 * t['mfu']:.1f}% "
              f"(compile {t['compile_s']:.1f} s)", flush=True)
    if "decode" not in skip:
        results["decode"] = bench_decode(
            cfg, rows_list=[4, 8] if s else [16, 64, 256], group=4 if s else 16,
            prompt_len=16 if s else 128, new_tokens=16 if s else 512,
            decode_chunk=8 if s else 32, hbm_bw=hbm_bw)
        for d in results["decode"]:
            print(f"[decode] rows {d['rows']:4d}: {d['step_ms']:.2f} ms/step, "
                  f"{d['tokens_per_s']:.0f} tok/s = {100 * d['roofline_frac']:.0f}% of the HBM "
                  f"roofline {d['roofline_tokens_per_s']:.0f} tok/s", flush=True)
    if "sagc" not in skip:
        steps = args.sagc_steps or (2 if s else 40)
        with tempfile.TemporaryDirectory() as d:
            results["sagc"] = run_sagc(steps=steps, smoke=s, run_dir=os.path.join(d, "run"))
        r = results["sagc"]
        print(f"[sagc]   {r['steps']} steps in {r['wall_s']:.0f} s, G {r['group_sizes']}, "
              f"compiles after warm-up {r['compiles_after_warmup']}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
