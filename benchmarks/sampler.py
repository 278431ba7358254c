"""Sampler throughput: this sampler vs. itself without prefix sharing vs. transformers on CPU.

    python benchmarks/sampler.py [--models 1M,10M] [--repeats 2]

Same weights (a random HF Llama saved with `save_pretrained`, loaded with our `from_pretrained`),
same prompts: 8 prompts x G=16 rows, 128 new tokens, EOS disabled so every system generates
exactly rows x 128 tokens. Sampling at temperature 1 everywhere. Compile / warm-up time is
excluded from tokens/s and reported on its own. torch uses 2 threads (this machine's cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sagc_jax.models.hf import from_pretrained
from sagc_jax.sampling import Sampler, SamplingConfig

PROMPTS, G, NEW = 8, 16, 128
MODELS = {  # name -> LlamaConfig kwargs
    "1M": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=5,
               num_attention_heads=4, num_key_value_heads=4, head_dim=32),
    "10M": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=10,
                num_attention_heads=8, num_key_value_heads=4, head_dim=32),
}
PROMPT_SETS = {"long": (128, 192, 192), "short": (8, 32, 32)}  # (min len, max len, bucket)


@dataclasses.dataclass
class Row:
    model: str
    prompts: str
    system: str
    tokens_per_s: float
    prefill_s: float
    decode_s: float
    warmup_s: float


def _prompts(vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, rng.integers(lo, hi + 1)).tolist() for _ in range(PROMPTS)]


def bench_ours(model, prompts, bucket: int, sharing: bool, repeats: int) -> tuple[float, ...]:
    cfg = SamplingConfig(group_sizes=(G,), prompts_per_step=PROMPTS, prompt_buckets=(bucket,),
                         max_new_tokens=NEW, decode_chunk=16, prefix_sharing=sharing)
    s = Sampler(model, cfg, pad_id=0, eos_ids=())  # no EOS: every row runs NEW tokens
    t0 = time.perf_counter()
    s.compile_all(progress=False)
    s.generate(prompts, group_size=G, key=jax.random.key(0), max_new_tokens=NEW)
    warm = time.perf_counter() - t0
    best = None
    for i in range(repeats):
        t = time.perf_counter()
        out = s.generate(prompts, group_size=G, key=jax.random.key(i + 1), max_new_tokens=NEW)
        wall = time.perf_counter() - t
        assert out.lengths.sum() == PROMPTS * G * NEW and out.stats.compiles == 0
        cand = (PROMPTS * G * NEW / wall, out.stats.prefill_s, out.stats.decode_s)
        best = cand if best is None or cand[0] > best[0] else best
    return (*best, warm)


def bench_hf(hf, prompts, repeats: int) -> tuple[float, ...]:
    rows = [p for p in prompts for _ in range(G)]
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):  # left padding, as generate expects for decoder-only models
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kw = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    t0 = time.perf_counter()
    with torch.no_grad():
        hf.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
    warm = time.perf_counter() - t0
    best = 0.0
    for i in range(repeats):
        torch.manual_seed(i)
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(ids, **kw)
        wall = time.perf_counter() - t
        assert out.shape[1] - width == NEW
        best = max(best, len(rows) * NEW / wall)
    return best, float("nan"), float("nan"), warm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1M,10M")
    ap.add_argument("--prompts", default="long,short")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(2)
    results: list[Row] = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        hf = LlamaForCausalLM(LlamaConfig(**MODELS[name], max_position_embeddings=512,
                                          pad_token_id=0)).eval()
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            model, cfg = from_pretrained(d)
        print(f"# {name}: {cfg.num_params() / 1e6:.2f}M params, jax {jax.__version__}, "
              f"torch {torch.__version__}, {PROMPTS} prompts x G={G}, {NEW} new tokens",
              flush=True)
        for pname in args.prompts.split(","):
            lo, hi, bucket = PROMPT_SETS[pname]
            prompts = _prompts(cfg.vocab_size, lo, hi, seed=1)
            systems = (("a: sampler", functools.partial(bench_ours, model, prompts, bucket, True)),
                       ("b: no prefix sharing",
                        functools.partial(bench_ours, model, prompts, bucket, False)),
                       ("c: transformers", functools.partial(bench_hf, hf, prompts)))
            for system, fn in systems:
                r = Row(name, pname, system, *fn(repeats=args.repeats))
                results.append(r)
                print(f"  {pname:5s} {system:22s} {r.tokens_per_s:9.0f} tok/s  prefill "
                      f"{r.prefill_s:6.3f}s decode {r.decode_s:6.3f}s  warm-up {r.warmup_s:5.1f}s",
                      flush=True)
    print("\n| model | prompts | system | tokens/s | prefill s | decode s | warm-up s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.model} | {r.prompts} | {r.system} | {r.tokens_per_s:.0f} | "
              f"{r.prefill_s:.3f} | {r.decode_s:.3f} | {r.warmup_s:.1f} |")
    print("\n| model | prompts | a/c (target >= 3) | a/b (target >= 1.5, long) |")
    print("|---|---|---:|---:|")
    by = {(r.model, r.prompts, r.system[0]): r.tokens_per_s for r in results}
    for m, p in dict.fromkeys((r.model, r.prompts) for r in results):
        a = by[(m, p, "a")]
        print(f"| {m} | {p} | {a / by[(m, p, 'c')]:.2f} | {a / by[(m, p, 'b')]:.2f} |")


if __name__ == "__main__":
    main()
