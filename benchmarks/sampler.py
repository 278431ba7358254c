"""Sampler throughput: ours vs google-tunix 0.1.7 vs transformers `generate`, plus a roofline.

    pip install -e '.[bench]'   # or: pip install --no-deps google-tunix==0.1.7 (see README)
    python benchmarks/sampler.py [--models 5M,60M] [--prompts long,short] [--repeats 2]
    python benchmarks/sampler.py --compile-depth      # compile s per shape, Qwen2.5-0.5B shape

Protocol: identical random Qwen2 weights (HF `save_pretrained`, loaded by each system), 8 prompts
x G=16 = 128 rows, 128 new tokens, EOS never hit (an id outside the vocab), temperature 1
sampling everywhere. Timed runs interleave the systems (A B C A B C ...); warm-up (compile) is
excluded and reported on its own; best run per system; `os.getloadavg()` is printed beside
every figure. Tunix has no group API, so each prompt is passed G times (as its GRPO learner
does). torch uses 2 threads.

Roofline (decode ms/step): bytes read per step / read bandwidth + matmul FLOPs per step / matmul
rate, both measured in the same run (a jitted reduction over 256 MB; a jitted [rows, H] x [H, V]
f32 matmul). Bytes: every weight but the embedding table (a gather of `rows` rows), plus our
cache as stored (prompt K/V once per prompt, generated K/V buffer per row, read whole each step).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax
import jax.numpy as jnp
import numpy as np
import torch
from decode_parts import best_ms, dense_chain  # benchmarks/ (the script's directory)
from flax import nnx
from transformers import Qwen2Config, Qwen2ForCausalLM

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.hf import from_pretrained
from sagc_jax.sampling import Sampler, SamplingConfig

PROMPTS, G, NEW = 8, 16, 128
ROWS = PROMPTS * G
MODELS = {  # name -> Qwen2Config kwargs
    "5M": dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
               num_attention_heads=8, num_key_value_heads=2),
    "60M": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=2),
}
PROMPT_SETS = {"long": (100, 190, 192), "short": (8, 32, 32)}  # (min len, max len, bucket)


def load() -> str:
    a = os.getloadavg()
    return f"load {a[0]:.1f}/{a[1]:.1f}"


def _prompts(vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, rng.integers(lo, hi + 1)).tolist() for _ in range(PROMPTS)]


def _best(times: list[float]) -> float:
    return min(times) if times else float("nan")


class Ours:
    name = "ours"

    def __init__(self, path: str, prompts: list[list[int]], bucket: int):
        self.model, self.cfg = from_pretrained(path)
        cfg = SamplingConfig(group_sizes=(G,), prompts_per_step=PROMPTS, prompt_buckets=(bucket,),
                             max_new_tokens=NEW, decode_chunk=16)
        self.s = Sampler(self.model, cfg, pad_id=0, eos_ids=())  # no EOS: rows run NEW tokens
        self.prompts, self.calls, self.decode_step_s = prompts, 0, []

    def warm(self) -> None:
        self.s.compile_all(progress=False)

    def run(self) -> float:
        self.calls += 1
        t = time.perf_counter()
        out = self.s.generate(self.prompts, group_size=G, key=jax.random.key(self.calls),
                              max_new_tokens=NEW)
        wall = time.perf_counter() - t
        assert out.lengths.sum() == ROWS * NEW and out.stats.compiles == 0
        self.decode_step_s.append(out.stats.decode_s / out.stats.decode_steps)
        self.last_stats = out.stats
        return wall


class Tunix:
    name = "tunix"

    def __init__(self, path: str, prompts: list[list[int]], bucket: int, hf_kw: dict):
        from tunix.generate import sampler as tsampler
        from tunix.models.qwen2 import model as tmodel
        from tunix.models.qwen2 import params as tparams

        tcfg = tmodel.ModelConfig(
            num_layers=hf_kw["num_hidden_layers"], vocab_size=hf_kw["vocab_size"],
            embed_dim=hf_kw["hidden_size"], hidden_dim=hf_kw["intermediate_size"],
            num_heads=hf_kw["num_attention_heads"],
            head_dim=hf_kw["hidden_size"] // hf_kw["num_attention_heads"],
            num_kv_heads=hf_kw["num_key_value_heads"], rope_theta=10000, norm_eps=1e-6,
            use_tied_embedding=False)
        model = tparams.create_model_from_safe_tensors(path, tcfg)
        cache = tsampler.CacheConfig(cache_size=bucket + NEW, num_layers=tcfg.num_layers,
                                     num_kv_heads=tcfg.num_kv_heads, head_dim=tcfg.head_dim)
        self.s = tsampler.Sampler(model, _IdTokenizer(), cache)
        self.strings = [" ".join(map(str, p)) for p in prompts for _ in range(G)]
        self.bucket, self.calls = bucket, 0

    def _call(self, seed: int) -> Any:
        return self.s(self.strings, max_generation_steps=NEW, max_prompt_length=self.bucket,
                      temperature=1.0, top_p=1.0, seed=seed, eos_tokens=[-1])

    def warm(self) -> None:
        self._call(0)

    def run(self) -> float:
        self.calls += 1
        t = time.perf_counter()
        out = self._call(self.calls)
        wall = time.perf_counter() - t
        assert sum(len(x.split()) for x in out.text) == ROWS * NEW, "tunix stopped early"
        return wall


class _IdTokenizer:
    """Tunix needs a tokenizer: prompts travel as space-separated token ids."""

    def encode(self, text: str, **_: Any) -> list[int]:
        return [int(x) for x in text.split()]

    def decode(self, ids: list[int], **_: Any) -> str:
        return " ".join(map(str, ids))

    def bos_id(self) -> int:
        return 0  # falsy: Tunix then prepends no BOS

    def eos_id(self) -> int:
        return -1

    def pad_id(self) -> int:
        return 0


class HF:
    name = "transformers"

    def __init__(self, hf: torch.nn.Module, prompts: list[list[int]]):
        rows = [p for p in prompts for _ in range(G)]
        width = max(map(len, rows))
        self.ids = torch.zeros((len(rows), width), dtype=torch.long)
        self.mask = torch.zeros_like(self.ids)
        for i, p in enumerate(rows):  # left padding, as generate expects for decoder-only models
            self.ids[i, width - len(p):] = torch.tensor(p)
            self.mask[i, width - len(p):] = 1
        self.hf, self.width, self.calls = hf, width, 0
        self.kw = dict(attention_mask=self.mask, do_sample=True, temperature=1.0, top_k=0,
                       top_p=1.0, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
                       pad_token_id=0)

    def warm(self) -> None:
        with torch.no_grad():
            self.hf.generate(self.ids, **{**self.kw, "max_new_tokens": 2, "min_new_tokens": 2})

    def run(self) -> float:
        self.calls += 1
        torch.manual_seed(self.calls)
        t = time.perf_counter()
        with torch.no_grad():
            out = self.hf.generate(self.ids, **self.kw)
        wall = time.perf_counter() - t
        assert out.shape[1] - self.width == NEW
        return wall


def machine_rates(hidden: int, vocab: int) -> tuple[float, float]:
    """(read bytes/s of a jitted reduction over 256 MB, f32 FLOP/s of [ROWS,H] x [H,V])."""
    x = jnp.ones((64 << 20,), jnp.float32)
    a = jnp.ones((ROWS, hidden), jnp.float32)
    b = jnp.ones((hidden, vocab), jnp.float32)
    out = []
    for f, args, work in ((jax.jit(jnp.sum), (x,), x.nbytes),
                          (jax.jit(jnp.dot), (a, b), 2 * ROWS * hidden * vocab)):
        jax.block_until_ready(f(*args))
        times = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - t)
        out.append(work / min(times))
    return out[0], out[1]


def roofline_s(cfg: ModelConfig, lp: int, bw: float, flops_rate: float) -> tuple[float, dict]:
    """Seconds per decode step of our sampler at the machine's rates, and the byte/FLOP counts."""
    h, v, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    qd, kvd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = h * (2 * qd + 2 * kvd) + 3 * h * cfg.intermediate_size  # matmul weights
    dense = L * layer + h * v  # + LM head
    weight_bytes = 4 * (dense + L * 2 * h + h)
    kv_tok = 2 * L * kvd * 4  # K and V bytes per cached token, all layers
    cache_bytes = kv_tok * (PROMPTS * lp + ROWS * NEW)
    attn_flops = 4 * ROWS * L * qd * (lp + NEW)
    flops = 2 * ROWS * dense + attn_flops
    s = (weight_bytes + cache_bytes) / bw + flops / flops_rate
    return s, dict(weight_MB=weight_bytes / 1e6, cache_MB=cache_bytes / 1e6, GFLOP=flops / 1e9)


def breakdown(model: Any, step_s: float, steps: int = 32) -> str:
    """Where a decode step's time goes: the step's dense matmuls alone (`decode_parts.
    dense_chain` with this model's weights at ROWS rows) against the measured step; the rest is
    attention over the cache, norms, RoPE, sampling and loop overhead."""
    layers = model.layers
    mats = [jnp.asarray(getattr(layers, n)[...]) for n in
            ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    head = jnp.asarray(model.lm_head[...]) if hasattr(model, "lm_head") else \
        jnp.asarray(model.embed[...]).T
    x = jnp.ones((ROWS, head.shape[0]), jnp.float32) * 1e-3
    dense = best_ms(dense_chain(mats, head, steps), x, steps, repeats=3) / 1e3
    return (f"decode step {step_s * 1e3:.1f} ms = dense matmuls {dense * 1e3:.1f} ms "
            f"({dense / step_s:.0%}) + the rest {(step_s - dense) * 1e3:.1f} ms")


def bench_model(name: str, prompt_sets: list[str], repeats: int, systems: set[str]) -> list[str]:
    hf_kw = MODELS[name]
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(**hf_kw, max_position_embeddings=512, pad_token_id=0,
                                      tie_word_embeddings=False)).eval()
    rows_md = []
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        for pname in prompt_sets:
            lo, hi, bucket = PROMPT_SETS[pname]
            prompts = _prompts(hf_kw["vocab_size"], lo, hi, seed=1)
            runners = []
            if "ours" in systems:
                runners.append(Ours(d, prompts, bucket))
            if "tunix" in systems:
                runners.append(Tunix(d, prompts, bucket, hf_kw))
            if "hf" in systems:
                runners.append(HF(hf, prompts))
            warm = {}
            for r in runners:
                t = time.perf_counter()
                r.warm()
                warm[r.name] = time.perf_counter() - t
                t = time.perf_counter()
                first = r.run()  # the first call after warm-up, reported on its own
                print(f"# {name} {pname} {r.name}: warm-up {warm[r.name]:.1f}s, first call "
                      f"{first:.2f}s ({load()})", flush=True)
            walls: dict[str, list[float]] = {r.name: [] for r in runners}
            for i in range(repeats):  # interleaved: A B C A B C
                for r in runners:
                    w = r.run()
                    walls[r.name].append(w)
                    print(f"  {name} {pname} {r.name:12s} run {i}: {ROWS * NEW / w:8.0f} tok/s "
                          f"({load()})", flush=True)
            tok = {k: ROWS * NEW / _best(v) for k, v in walls.items()}
            line = f"| {name} | {pname} | " + " | ".join(
                f"{tok.get(k, float('nan')):.0f}" for k in ("ours", "tunix", "transformers"))
            ratios = [tok["ours"] / tok[k] if "ours" in tok and k in tok else float("nan")
                      for k in ("tunix", "transformers")]
            roof = ""
            if "ours" in tok:
                ours = runners[0]
                bw, rate = machine_rates(hf_kw["hidden_size"], hf_kw["vocab_size"])
                rs, parts = roofline_s(ours.cfg, bucket, bw, rate)
                step = min(ours.decode_step_s)
                st = ours.last_stats
                roof = (f" | {st.prefill_s:.2f} | {step * 1e3:.1f} | {rs * 1e3:.1f} "
                        f"({bw / 1e9:.1f} GB/s, {rate / 1e9:.0f} GFLOP/s; "
                        f"{parts['weight_MB']:.0f}+{parts['cache_MB']:.0f} MB, "
                        f"{parts['GFLOP']:.1f} GFLOP) | {step / rs:.2f}")
                # The best ours/HF any sampler could show here: our prefill plus every decode
                # step at the roofline, against HF's measured call.
                if "transformers" in walls:
                    ceiling = _best(walls["transformers"]) / (st.prefill_s + NEW * rs)
                    roof += f" | {ceiling:.2f}"
                print(f"# {name} {pname} breakdown: {breakdown(ours.model, step)} ({load()})",
                      flush=True)
            line += f" | {ratios[0]:.2f} | {ratios[1]:.2f}{roof} | {load()} |"
            print(line, flush=True)
            rows_md.append(line)
    return rows_md


def compile_depth(layers: tuple[int, ...]) -> None:
    """compile_all seconds for one (G, Lp) shape of a Qwen2.5-0.5B-shaped model (abstract
    weights) at several depths: per-layer decode code must not blow up compile time."""
    print("| layers | prefill + decode compile s (1 shape) | per layer s |")
    print("|---:|---:|---:|")
    for L in layers:
        cfg = ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                          num_layers=L, num_heads=14, num_kv_heads=2, head_dim=64,
                          model_type="qwen2", qkv_bias=True, tie_word_embeddings=True,
                          rope_theta=1e6)
        model = nnx.eval_shape(lambda c=cfg: Transformer(c, rngs=nnx.Rngs(0)))
        s = Sampler(model, SamplingConfig(group_sizes=(16,), prompts_per_step=8,
                                          prompt_buckets=(256,), max_new_tokens=512), pad_id=0)
        t = time.perf_counter()
        n = s.compile_all(progress=False)
        dt = time.perf_counter() - t
        print(f"| {L} | {dt:.1f} ({n} programs; {load()}) | {dt / L:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="5M,60M")
    ap.add_argument("--prompts", default="long,short")
    ap.add_argument("--systems", default="ours,tunix,hf")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compile-depth", action="store_true")
    args = ap.parse_args()
    if args.compile_depth:
        compile_depth((1, 4, 24))
        return
    torch.set_num_threads(2)
    print(f"# jax {jax.__version__}, torch {torch.__version__}, {PROMPTS} prompts x G={G}, "
          f"{NEW} new tokens, {load()}", flush=True)
    table = []
    for name in args.models.split(","):
        table += bench_model(name, args.prompts.split(","), args.repeats,
                             set(args.systems.split(",")))
    print("\n| model | prompts | ours tok/s | Tunix tok/s | HF tok/s | ours/Tunix | ours/HF "
          "| ours prefill s | ours decode ms/step | roofline ms/step | step/roofline "
          "| ours/HF at the roofline (ceiling) | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
