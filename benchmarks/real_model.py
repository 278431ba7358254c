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
(both measured in this run, at the decode step's own shapes).

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
    sys.path.insert(0, str(ROOT / "scripts"))
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
def machine_rates(rows: int, hidden: int, inter: int) -> tuple[float, float]:
    """(read bytes/s of a jitted sum over 256 MB, f32 FLOP/s of a [rows, H] x [H, I] matmul
    chain as in a decode step), best of 5 each."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((64 << 20,), jnp.float32)
    a = jnp.ones((rows, hidden), jnp.float32) * 1e-3
    w1 = jnp.ones((30, hidden, inter), jnp.float32) * 1e-3  # 30 layers: weights not in cache

    @jax.jit
    def chain(a: jax.Array) -> jax.Array:
        for i in range(w1.shape[0]):
            a = a + (a @ w1[i]).sum(-1, keepdims=True) * 1e-9
        return a

    out = []
    for f, arg, work in ((jax.jit(jnp.sum), x, x.nbytes),
                         (chain, a, 2 * rows * hidden * inter * w1.shape[0])):
        jax.block_until_ready(f(arg))
        times = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(f(arg))
            times.append(time.perf_counter() - t)
        out.append(work / min(times))
    return out[0], out[1]


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
        out.append(f"| f32 matmul [{rows}, 576] x [576, 1536] x 30 | {rate / 1e9:.0f} GFLOP/s "
                   f"| {load()} |")
    x = jnp.ones((64 << 20,), jnp.float32)
    t = best(jax.jit(jnp.sum), x)
    out.append(f"| read (sum of 256 MB) | {x.nbytes / t / 1e9:.1f} GB/s | {load()} |")
    t = best(jax.jit(lambda v: v * 1.0001), x)
    out.append(f"| copy (256 MB read + 256 MB written) | {2 * x.nbytes / t / 1e9:.1f} GB/s | "
               f"{load()} |")
    print("\n".join(out), flush=True)
    return out


def roofline_s(cfg: Any, prompts: int, rows: int, lp: int, new: int, bw: float,
               rate: float) -> tuple[float, dict[str, float]]:
    """Seconds per decode step at the measured rates: every weight but the embedding gather
    (the tied head is read whole), our cache as stored (prompt K/V once per prompt, a
    generated buffer per row, read whole each step); matmul + attention FLOPs."""
    h, v, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    qd, kvd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    dense = L * (h * (2 * qd + 2 * kvd) + 3 * h * cfg.intermediate_size) + h * v
    weight_bytes = 4 * (dense + L * 2 * h + h)
    cache_bytes = 2 * L * kvd * 4 * (prompts * lp + rows * new)
    flops = 2 * rows * dense + 4 * rows * L * qd * (lp + new)
    s = weight_bytes / bw + cache_bytes / bw + flops / rate
    return s, dict(weight_MB=weight_bytes / 1e6, cache_MB=cache_bytes / 1e6, GFLOP=flops / 1e9)


# ------------------------------------------------------------------------------ sampling
class Ours:
    name = "ours"

    def __init__(self, prompts: list[list[int]], g: int, new: int, bucket: int):
        import jax

        from sagc_jax.sampling import Sampler, SamplingConfig

        self.model, self.cfg = load_ours()
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
    name = "transformers"

    def __init__(self, prompts: list[list[int]], g: int, new: int):
        import torch
        from transformers import AutoModelForCausalLM

        self.hf = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF), dtype=torch.float32).eval()
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


def load_ours() -> tuple[Any, Any]:
    """Our model from the GGUF (main's loader)."""
    from sagc_jax.models import from_pretrained

    return from_pretrained(GGUF)


def chat_ids(prompts: list[dict[str, Any]]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))
    return [list(tok.apply_chat_template(p["messages"], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"])
            for p in prompts]


def bench_sampling(args: argparse.Namespace) -> list[str]:
    import torch

    torch.set_num_threads(args.torch_threads)
    ids = chat_ids(rg_prompts(args.prompts, args.seed))
    lp = max(map(len, ids))
    bucket = -(-lp // 32) * 32
    rows = args.prompts * args.G
    runners = [Ours(ids, args.G, args.cap, bucket), HF(ids, args.G, args.cap)]
    for r in runners:
        t = time.perf_counter()
        r.warm()
        print(f"# sampling {r.name}: warm-up {time.perf_counter() - t:.1f}s ({load()})",
              flush=True)
    walls: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(args.repeats):
        for r in runners:
            w = r.run()
            walls[r.name].append(w)
            print(f"  {r.name:12s} run {i}: {w:7.1f} s/call, {rows * args.cap / w:6.0f} tok/s "
                  f"({load()})", flush=True)
    best = {k: min(v) for k, v in walls.items()}
    ours = runners[0]
    bw, rate = machine_rates(rows, ours.cfg.hidden_size, ours.cfg.intermediate_size)
    rs, parts = roofline_s(ours.cfg, args.prompts, rows, bucket, args.cap, bw, rate)
    step = min(ours.decode_step_s)
    ceiling = best["transformers"] / (min(ours.prefill_s) + args.cap * rs)
    head = ("| prompts x G | cap | ours s/call | HF s/call | ours tok/s | HF tok/s | ours/HF "
            "| ours decode ms/step | roofline ms/step | step/roofline | ours/HF at the "
            "roofline (ceiling) | load |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            "---:|---|")
    line = (f"| {args.prompts} x {args.G} | {args.cap} | {best['ours']:.1f} | "
            f"{best['transformers']:.1f} | {rows * args.cap / best['ours']:.0f} | "
            f"{rows * args.cap / best['transformers']:.0f} | "
            f"{best['transformers'] / best['ours']:.2f} | {step * 1e3:.0f} | {rs * 1e3:.0f} "
            f"({bw / 1e9:.1f} GB/s, {rate / 1e9:.0f} GFLOP/s; {parts['weight_MB']:.0f}+"
            f"{parts['cache_MB']:.0f} MB, {parts['GFLOP']:.1f} GFLOP) | {step / rs:.2f} | "
            f"{ceiling:.2f} | {load()} |")
    print(head + "\n" + line, flush=True)
    return [head, line]


# ------------------------------------------------------------------------------ GRPO step
def run_trl(args: argparse.Namespace, prompts: list[dict[str, Any]], tmp: str,
            i: int) -> list[dict[str, Any]]:
    spec = dict(model_dir=os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF),
                prompts=prompts, prompts_per_step=args.prompts, G=args.G, cap=args.cap,
                steps=args.steps + 1, lr=args.lr, threads=args.torch_threads, seed=args.seed + i,
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
    ap.add_argument("--trl-python", default="/work/trl-venv/bin/python")
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
