"""Peers on the real model (SmolLM2-135M-Instruct, the wheel's GGUF), side by side in one run.

    python benchmarks/real_model.py rates       # matmul FLOP/s and memory bandwidth only
    python benchmarks/real_model.py sampling [--prompts 4 --G 8 --cap 256 --repeats 2]
    python benchmarks/real_model.py grpo [--steps 2 --repeats 2 --trl-python PY]
    python benchmarks/real_model.py all

sampling: our sampler vs transformers `generate` (both from the same GGUF file; transformers
dequantises it to f32, we read the same f32 weights), the same chat-templated reasoning-gym
prompts x G, temperature 1, every row run to the cap (EOS off in both, so both do identical
work), interleaved A B A B; s per call and generated tok/s, best run each. Our decode step is
set against this machine's roofline for the model at that row count: weight + KV-cache bytes
read per step / measured read bandwidth + matmul FLOPs per step / measured f32 matmul rate
with the weights in cache (both measured in this run, at the decode step's own shapes).
`--dtypes float32 bfloat16 f32-bf16mm` adds a bf16 pair (params and compute in bf16 on both
sides) and ours in float32 with bfloat16 matmuls (`model.matmul_dtype`: decode reads bf16
weight copies), and compares each side at its fastest.

grpo: whole GRPO steps (rollout + rewards + update) of our trainer (`sagc-jax train` on
configs/smollm2-135m_rg_cpu.yaml, static G, no eval / checkpoints) vs TRL's `GRPOTrainer`
(benchmarks/trl_grpo.py in its own venv), the same model, prompts per step, G, cap, loss
settings (beta 0, clip 0.2/0.28, token-mean, group-scaled advantages), each launched as a
subprocess, alternating ours / TRL `--repeats` times; start-up (load, compile) excluded. Each
part is reported where both expose it. `os.getloadavg()` beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "smollm2-135m_rg_cpu.yaml"


def _gguf() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))
    from smollm2_task_probe import gguf_path

    return gguf_path()


GGUF = _gguf()


def load() -> str:
    return "load " + "/".join(f"{x:.1f}" for x in os.getloadavg()[:2])


# ------------------------------------------------------------------------------ prompts
def rg_prompts(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` chat prompts from the probe's chosen mix, in order: messages, entry, dataset."""
    from smollm2_task_probe import CANDIDATES, make_problems, messages

    names = MIX
    per = -(-n // len(names))
    probs = {k: make_problems(k, per, seed) for k in names}
    out = []
    for i in range(n):
        name = names[i % len(names)]
        p = probs[name][i // len(names)]
        entry = {k: v for k, v in p.items() if k != "_ds"}
        out.append(dict(messages=messages(p["question"], STYLE), entry=entry,
                        dataset=CANDIDATES[name].dataset, settings=CANDIDATES[name].settings))
    return out


# The reasoning-gym mix of configs/smollm2-135m_rg_cpu.yaml (docs/results/smollm2/
# task_selection.md) and the trainer's prompt form (`system_prompt: default` in the user turn).
MIX = ["chain_sum_1d", "basic_arith_1d", "products_1d"]
STYLE = "rg-default"


# ------------------------------------------------------------------------------ machine rates
def machine_rates(rows: int, hidden: int, inter: int, dtype: str = "float32",
                  streamed: bool = False) -> tuple[float, float]:
    """(read bytes/s of a jitted sum over 256 MB, FLOP/s of a `dtype` [rows, H] x [H, I]
    matmul chain of 30 layers as in a decode step), best of 5 each.

    The roofline adds bytes / bandwidth to FLOPs / rate, so its rate is measured with the
    weights in cache (two [H, I] weights, cycled): a rate measured while streaming the weights
    from memory (`streamed`: 30 distinct weights) already contains their read, which the
    roofline would then count twice. Weights are arguments, as the decode step gets its params
    (`decode_weights`): a closure constant can be re-laid out or cast at compile time.
    """
    import jax
    import jax.numpy as jnp

    x = jnp.ones((64 << 20,), jnp.float32)
    a = jnp.ones((rows, hidden), dtype) * 1e-3
    ws = [jnp.full((hidden, inter), 1e-3, dtype) for _ in range(30 if streamed else 2)]

    @jax.jit
    def chain(a: jax.Array, ws: list[jax.Array]) -> jax.Array:
        for i in range(30):
            a = a + (a @ ws[i % len(ws)]).sum(-1, keepdims=True) * 1e-9
        return a

    out = []
    for f, args, work in ((jax.jit(jnp.sum), (x,), x.nbytes),
                          (chain, (a, ws), 2 * rows * hidden * inter * 30)):
        jax.block_until_ready(f(*args))
        times = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - t)
        out.append(work / min(times))
    return out[0], out[1]


def torch_rate(rows: int, hidden: int, inter: int, dtype: str) -> float:
    """torch's FLOP/s for `machine_rates`' streamed matmul chain (30 distinct weights), best
    of 5."""
    import torch

    a = torch.full((rows, hidden), 1e-3, dtype=getattr(torch, dtype))
    w1 = torch.full((30, hidden, inter), 1e-3, dtype=a.dtype)
    times = []
    with torch.no_grad():
        for _ in range(6):
            t, x = time.perf_counter(), a
            for i in range(w1.shape[0]):
                x = x + (x @ w1[i]).sum(-1, keepdim=True) * 1e-9
            times.append(time.perf_counter() - t)
    return 2 * rows * hidden * inter * w1.shape[0] / min(times[1:])


def bench_rates(args: argparse.Namespace) -> list[str]:
    """This machine's f32 matmul rate (square, and a decode step's [rows, H] x [H, I] chain at
    SmolLM2-135M's H = 576, I = 1536) and memory bandwidth (a sum over 256 MB; a 256 MB copy)."""
    import jax
    import jax.numpy as jnp

    def best(f: Any, *a: Any) -> float:
        jax.block_until_ready(f(*a))
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(f(*a))
            ts.append(time.perf_counter() - t)
        return min(ts)

    n = 2048
    sq = jnp.ones((n, n), jnp.float32)
    out = ["| measure | value | load |", "|---|---:|---|"]
    t = best(jax.jit(lambda x: x @ x), sq)
    out.append(f"| f32 matmul {n}^3 | {2 * n ** 3 / t / 1e9:.0f} GFLOP/s | {load()} |")
    for rows in (16, 32, 64, 128):
        _, rate = machine_rates(rows, 576, 1536)
        out.append(f"| f32 matmul [{rows}, 576] x [576, 1536] x 30, in cache (roofline) | "
                   f"{rate / 1e9:.0f} GFLOP/s | {load()} |")
    _, rate = machine_rates(16, 576, 1536, streamed=True)
    out.append(f"| f32 matmul [16, 576] x [576, 1536] x 30, weights streamed (106 MB) | "
               f"{rate / 1e9:.0f} GFLOP/s | {load()} |")
    # bf16 at the decode shape, XLA:CPU against torch (oneDNN: AVX512-BF16 or AMX where the CPU
    # has it): why `generate` gains from bf16 throughout and ours only from bf16 weights.
    _, rate = machine_rates(16, 576, 1536, "bfloat16", streamed=True)
    out.append(f"| bf16 matmul [16, 576] x [576, 1536] x 30, streamed (XLA) | "
               f"{rate / 1e9:.0f} GFLOP/s | {load()} |")
    import torch

    torch.set_num_threads(args.torch_threads)
    for dt, name in (("float32", "f32"), ("bfloat16", "bf16")):
        out.append(f"| {name} matmul [16, 576] x [576, 1536] x 30, streamed (torch) | "
                   f"{torch_rate(16, 576, 1536, dt) / 1e9:.0f} GFLOP/s | {load()} |")
    x = jnp.ones((64 << 20,), jnp.float32)
    t = best(jax.jit(jnp.sum), x)
    out.append(f"| read (sum of 256 MB) | {x.nbytes / t / 1e9:.1f} GB/s | {load()} |")
    t = best(jax.jit(lambda v: v * 1.0001), x)
    out.append(f"| copy (256 MB read + 256 MB written) | {2 * x.nbytes / t / 1e9:.1f} GB/s | "
               f"{load()} |")
    print("\n".join(out), flush=True)
    return out


def roofline_s(cfg: Any, prompts: int, rows: int, lp: int, new: int, bw: float,
               rate: float, weight_b: int = 4, cache_b: int = 4) -> tuple[float, dict[str, float]]:
    """Seconds per decode step at the measured rates: every weight but the embedding gather
    (the tied head is read whole) at `weight_b` bytes each, our cache as stored (prompt K/V
    once per prompt, a generated buffer per row, read whole each step) at `cache_b` bytes a
    value; matmul + attention FLOPs."""
    h, v, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    qd, kvd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    dense = L * (h * (2 * qd + 2 * kvd) + 3 * h * cfg.intermediate_size) + h * v
    weight_bytes = weight_b * dense + 4 * (L * 2 * h + h)
    cache_bytes = 2 * L * kvd * cache_b * (prompts * lp + rows * new)
    flops = 2 * rows * dense + 4 * rows * L * qd * (lp + new)
    s = weight_bytes / bw + cache_bytes / bw + flops / rate
    return s, dict(weight_MB=weight_bytes / 1e6, cache_MB=cache_bytes / 1e6, GFLOP=flops / 1e9,
                   dense_GFLOP=2 * rows * dense / 1e9)


def streamed_floor_s(cfg: Any, prompts: int, rows: int, lp: int, new: int, bw: float,
                     torch_threads: int) -> tuple[float, float]:
    """(seconds, FLOP/s): a decode step whose dense matmuls ran at the fastest rate XLA or torch
    reaches on a decode-shaped chain with its weights streamed from memory (f32 or bf16; the
    read is inside that rate), plus a bf16 KV cache read at `bw`. What any sampler built on
    either library's matmul could reach at this shape."""
    import torch

    h, i = cfg.hidden_size, cfg.intermediate_size
    torch.set_num_threads(torch_threads)
    rate = max(machine_rates(rows, h, i, "float32", streamed=True)[1],
               machine_rates(rows, h, i, "bfloat16", streamed=True)[1],
               torch_rate(rows, h, i, "float32"), torch_rate(rows, h, i, "bfloat16"))
    _, parts = roofline_s(cfg, prompts, rows, lp, new, bw, rate, 2, 2)
    return parts["dense_GFLOP"] * 1e9 / rate + parts["cache_MB"] * 1e6 / bw, rate


# ------------------------------------------------------------------------------ sampling
class Ours:
    def __init__(self, prompts: list[list[int]], g: int, new: int, bucket: int,
                 dtype: str = "float32", matmul_dtype: str | None = None):
        import dataclasses

        import jax

        from sagc_jax.sampling import Sampler, SamplingConfig

        self.dtype, self.matmul_dtype = dtype, matmul_dtype
        self.name = f"ours {dtype}" + (f", {matmul_dtype} matmuls" if matmul_dtype else "")
        self.model, self.cfg = load_ours(dtype)
        self.model.cfg = dataclasses.replace(self.model.cfg, matmul_dtype=matmul_dtype)
        cfg = SamplingConfig(group_sizes=(g,), prompts_per_step=len(prompts),
                             prompt_buckets=(bucket,), max_new_tokens=new, decode_chunk=16)
        self.s = Sampler(self.model, cfg, pad_id=0, eos_ids=())  # no EOS: rows run `new`
        self.prompts, self.g, self.new, self.calls = prompts, g, new, 0
        self.decode_step_s: list[float] = []
        self.prefill_s: list[float] = []
        self._key = jax.random.key

    def warm(self) -> None:
        self.s.compile_all(progress=False)

    def run(self) -> float:
        self.calls += 1
        t = time.perf_counter()
        out = self.s.generate(self.prompts, group_size=self.g, key=self._key(self.calls),
                              max_new_tokens=self.new, temperature=1.0)
        wall = time.perf_counter() - t
        assert out.stats.compiles == 0 and int(out.lengths.sum()) == len(out.lengths) * self.new
        self.decode_step_s.append(out.stats.decode_s / out.stats.decode_steps)
        self.prefill_s.append(out.stats.prefill_s)
        return wall


class HF:
    def __init__(self, prompts: list[list[int]], g: int, new: int, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM

        self.name, self.dtype = f"transformers {dtype}", dtype
        # Dequantised to f32 by transformers' GGUF loader, then cast (as `.to(bfloat16)` would).
        self.hf = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF), dtype=torch.float32)
        self.hf = self.hf.to(getattr(torch, dtype)).eval()
        rows = [p for p in prompts for _ in range(g)]
        width = max(map(len, rows))
        self.ids = torch.zeros((len(rows), width), dtype=torch.long)
        self.mask = torch.zeros_like(self.ids)
        for i, p in enumerate(rows):  # left padding, as generate expects for decoder-only
            self.ids[i, width - len(p):] = torch.tensor(p)
            self.mask[i, width - len(p):] = 1
        self.width, self.new, self.calls = width, new, 0
        self.kw = dict(attention_mask=self.mask, do_sample=True, temperature=1.0, top_k=0,
                       top_p=1.0, max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                       pad_token_id=0)

    def warm(self) -> None:
        import torch

        with torch.no_grad():
            self.hf.generate(self.ids, **{**self.kw, "max_new_tokens": 2, "min_new_tokens": 2})

    def run(self) -> float:
        import torch

        self.calls += 1
        torch.manual_seed(self.calls)
        t = time.perf_counter()
        with torch.no_grad():
            out = self.hf.generate(self.ids, **self.kw)
        wall = time.perf_counter() - t
        assert out.shape[1] - self.width == self.new
        return wall


def load_ours(dtype: str = "float32") -> tuple[Any, Any]:
    """Our model from the GGUF (main's loader), params and compute in `dtype`."""
    from sagc_jax.models import from_pretrained

    return from_pretrained(GGUF, dtype=dtype, param_dtype=dtype)


def chat_ids(prompts: list[dict[str, Any]]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))
    return [list(tok.apply_chat_template(p["messages"], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"])
            for p in prompts]


def bench_sampling(args: argparse.Namespace) -> list[str]:
    """Ours vs `generate` at each of `args.dtypes` (params and compute in that dtype on both
    sides; `f32-bf16mm` is ours only: float32 with bfloat16 matmuls, `model.matmul_dtype`,
    decode reading bf16 weight copies), all runners interleaved; one line per runner of ours against
    `generate` at the same compute dtype, then each side at its fastest. Rooflines: f32 for
    float32; bf16 weights (2 bytes, bf16 matmul rate) for f32-bf16mm. The ceiling against
    `generate`'s fastest is a sampler at `streamed_floor_s`: the best streamed matmul rate
    either library reaches at the decode shape, and a bf16 KV cache."""
    import torch

    torch.set_num_threads(args.torch_threads)
    ids = chat_ids(rg_prompts(args.prompts, args.seed))
    lp = max(map(len, ids))
    bucket = -(-lp // 32) * 32
    rows = args.prompts * args.G
    ours: list[Ours] = []
    hfs: list[HF] = []
    for dt in args.dtypes:
        if dt == "f32-bf16mm":
            ours.append(Ours(ids, args.G, args.cap, bucket, "float32", "bfloat16"))
        else:
            ours.append(Ours(ids, args.G, args.cap, bucket, dt))
            hfs.append(HF(ids, args.G, args.cap, dt))
    runners: list[Any] = [*ours, *hfs]
    for r in runners:
        t = time.perf_counter()
        r.warm()
        print(f"# sampling {r.name}: warm-up {time.perf_counter() - t:.1f}s ({load()})", flush=True)
    walls: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(args.repeats):  # interleaved
        for r in runners:
            w = r.run()
            walls[r.name].append(w)
            print(f"  {r.name:30s} run {i}: {w:7.1f} s/call, {rows * args.cap / w:6.0f} tok/s "
                  f"({load()})", flush=True)
    best = {k: min(v) for k, v in walls.items()}
    cfg = ours[0].cfg
    bw, rate = machine_rates(rows, cfg.hidden_size, cfg.intermediate_size)
    _, rate16 = machine_rates(rows, cfg.hidden_size, cfg.intermediate_size, "bfloat16")
    geo = (cfg, args.prompts, rows, bucket, args.cap, bw)
    roofs = {"float32": roofline_s(*geo, rate), "f32-bf16mm": roofline_s(*geo, rate16, 2, 4)}
    head = ("| prompts x G | cap | ours | ours s/call | HF s/call (same compute dtype) | ours "
            "tok/s | HF tok/s | ours/HF | ours decode ms/step | roofline ms/step | "
            "step/roofline | ours/HF at that roofline (ceiling) | load |\n|---|---:|---|---:|"
            "---:|---:|---:|---:|---:|---:|---:|---:|---|")
    lines = [head]
    hf_by_dtype = {h.dtype: h for h in hfs}
    for o in ours:
        h = best[hf_by_dtype[o.dtype].name] if o.dtype in hf_by_dtype else float("nan")
        step = min(o.decode_step_s)
        kind = "f32-bf16mm" if o.matmul_dtype else o.dtype
        roof = ceiling = "n/a"
        if kind in roofs:
            rs, parts = roofs[kind]
            roof = (f"{rs * 1e3:.0f} ({bw / 1e9:.1f} GB/s, "
                    f"{(rate16 if o.matmul_dtype else rate) / 1e9:.0f} GFLOP/s; "
                    f"{parts['weight_MB']:.0f}+{parts['cache_MB']:.0f} MB, "
                    f"{parts['GFLOP']:.1f} GFLOP) | {step / rs:.2f}")
            ceiling = f"{h / (min(o.prefill_s) + args.cap * rs):.2f}"
        else:
            roof += " | n/a"
        lines.append(f"| {args.prompts} x {args.G} | {args.cap} | {o.name} | {best[o.name]:.1f} "
                     f"| {h:.1f} | {rows * args.cap / best[o.name]:.0f} | "
                     f"{rows * args.cap / h:.0f} | {h / best[o.name]:.2f} | {step * 1e3:.0f} | "
                     f"{roof} | {ceiling} | {load()} |")
    o = min(ours, key=lambda r: best[r.name])
    h = min(hfs, key=lambda r: best[r.name])
    floor, frate = streamed_floor_s(cfg, args.prompts, rows, bucket, args.cap, bw,
                                    args.torch_threads)
    ceiling = best[h.name] / (min(o.prefill_s) + args.cap * floor)
    lines.append(f"| each at its fastest: {o.name} vs {h.name} | | | {best[o.name]:.1f} | "
                 f"{best[h.name]:.1f} | | | **{best[h.name] / best[o.name]:.2f}** | "
                 f"{min(o.decode_step_s) * 1e3:.0f} | {floor * 1e3:.0f} (streamed floor: "
                 f"{frate / 1e9:.0f} GFLOP/s, bf16 KV) | "
                 f"{min(o.decode_step_s) / floor:.2f} | {ceiling:.2f} | {load()} |")
    print("\n".join(lines), flush=True)
    return lines


# ------------------------------------------------------------------------------ GRPO step
def run_trl(args: argparse.Namespace, prompts: list[dict[str, Any]], tmp: str,
            i: int) -> list[dict[str, Any]]:
    spec = dict(model_dir=os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF),
                prompts=prompts, prompts_per_step=args.prompts, G=args.G, cap=args.cap,
                steps=args.steps + 1, lr=args.lr, threads=args.torch_threads, seed=args.seed + i,
                bf16=args.trl_bf16,
                datasets={p["dataset"]: p["settings"] for p in prompts})
    spath, out = os.path.join(tmp, f"trl_spec{i}.json"), os.path.join(tmp, f"trl{i}.jsonl")
    Path(spath).write_text(json.dumps(spec))
    subprocess.run([args.trl_python, str(ROOT / "benchmarks" / "trl_grpo.py"), "--spec", spath,
                    "--out", out], check=True, cwd=tmp)
    recs = [json.loads(x) for x in Path(out).read_text().splitlines()]
    return [dict(step_s=r["step_s"], rollout_s=r.get("generate_and_score"),
                 generate_s=r.get("transformers.generate"),
                 update_s=r["step_s"] - r.get("generate_and_score", 0.0),
                 tokens=r["tokens"], load=r["load"]) for r in recs[1:]]  # step 1: warm-up


def run_ours(args: argparse.Namespace, tmp: str, i: int) -> list[dict[str, Any]]:
    d = os.path.join(tmp, f"ours{i}")
    cmd = [sys.executable, "-m", "sagc_jax.cli", "train", "--config", str(CONFIG),
           f"model.path={GGUF}", f"run.dir={d}", f"run.steps={args.steps + 1}",
           f"run.seed={args.seed + i}",
           "run.eval_every=0", "sagc.enabled=false", f"sagc.initial_group_size={args.G}",
           f"sagc.group_sizes=[{args.G}]", "sagc.batch_policy=prompts",
           "sagc.rollouts_per_step=null", f"data.prompts_per_step={args.prompts}",
           f"sampling.max_new_tokens={args.cap}", f"optim.lr={args.lr}",
           "checkpoint.every=0", *args.ours_override]
    subprocess.run(cmd, check=True, cwd=ROOT)
    recs = [json.loads(x) for x in Path(d, "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "step_s" in r][1:]
    return [dict(step_s=r["step_s"], rollout_s=r["rollout_s"], generate_s=r["prefill_s"] +
                 r["decode_s"], update_s=r["train_s"], tokens=int(r["len_mean"] * r["rows"]),
                 load=None) for r in recs]


def bench_grpo(args: argparse.Namespace) -> list[str]:
    prompts = rg_prompts(args.prompts * (args.steps + 1), args.seed)
    res: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name in ("ours", "trl"):
                t = time.perf_counter()
                steps = run_ours(args, tmp, i) if name == "ours" else run_trl(args, prompts,
                                                                              tmp, i)
                res[name] += steps
                ms = np.mean([s["step_s"] for s in steps])
                print(f"  {name:5s} repeat {i}: {ms:6.1f} s/step over {len(steps)} steps, "
                      f"{np.mean([s['tokens'] for s in steps]):.0f} completion tok/step "
                      f"(process {time.perf_counter() - t:.0f}s, {load()})", flush=True)
    med = {k: {f: float(np.median([s[f] for s in v])) for f in
               ("step_s", "rollout_s", "generate_s", "update_s", "tokens")}
           for k, v in res.items()}
    head = ("| part (median over steps) | ours s | TRL s | TRL/ours |\n|---|---:|---:|---:|")
    lines = [head]
    for f, label in (("step_s", "whole step"), ("rollout_s", "rollout + rewards"),
                     ("generate_s", "generate"), ("update_s", "update (+ rest)"),
                     ("tokens", "completion tokens / step")):
        o, t = med["ours"][f], med["trl"][f]
        lines.append(f"| {label} | {o:.1f} | {t:.1f} | {t / o:.2f} |")
    lines.append(f"| {args.prompts} prompts x G={args.G}, cap {args.cap}, lr {args.lr} | | | "
                 f"{load()} |")
    print("\n".join(lines), flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("rates", "sampling", "grpo", "all"))
    ap.add_argument("--prompts", type=int, default=4, help="prompts per call / step")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--cap", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="timed GRPO steps per process")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float32"],
                    choices=("float32", "bfloat16", "f32-bf16mm"),
                    help="sampling: params + compute dtype, both sides, one pair per dtype; "
                         "f32-bf16mm: ours only, float32 with bf16 matmuls")
    ap.add_argument("--trl-python", default="/work/trl-venv/bin/python")
    ap.add_argument("--trl-bf16", action="store_true",
                    help="grpo: TRL with `bf16=True` (bf16 autocast; f32 master weights)")
    ap.add_argument("--ours-override", nargs="*", default=[],
                    help="extra key=value overrides for our trainer")
    args = ap.parse_args()
    print(f"# {args.prompts} prompts x G={args.G}, cap {args.cap}, torch threads "
          f"{args.torch_threads}, {load()}", flush=True)
    if args.part in ("rates", "all"):
        bench_rates(args)
    if args.part in ("sampling", "all"):
        bench_sampling(args)
    if args.part in ("grpo", "all"):
        bench_grpo(args)


if __name__ == "__main__":
    main()
