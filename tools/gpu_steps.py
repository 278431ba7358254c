"""The device parts of `tools/gpu_bench.py`: the packed train step and prefix-sharing decode.

Both build the project's own objects (`Learner`, `Sampler`) from
configs/qwen2.5-0.5b_gsm8k_gpu.yaml (its `model.preset` architecture, dtype, remat, buckets,
micro-batch / pack chunk rows, loss and optimizer), with random weights: the cost of a step does
not depend on their values. `--cpu-smoke` shrinks the model and the batch, nothing else.

Train FLOPs (model FLOPs, the usual MFU convention: remat's recompute not counted) of the packed
layout as it is computed: each unit's prompt once per row (prefix sharing), every completion's
own tokens, and the LM head on scored slots only. 6 x layer matmul params per real slot (forward
2, backward 4; the layers' projections, not the embedding gather or norms), 6 x vocab x hidden
per scored token (the head), and 12 x layers x q_dim per attended (query, key) pair (QK^T and PV,
2 q_dim each forward, x3 with the backward; a lone sequence of n tokens has ~n^2 / 2 pairs).
Pack padding is overhead, not work.

Decode bytes per step (the HBM roofline; decode is memory-bound): bf16 weights (all params,
the tied LM head once) + the KV the step reads: the prompt's K/V once per PROMPT (prefix
sharing keeps it once for the group's G rows) + every row's own generated K/V buffer, read
whole each step (masked past the current slot). `roofline_frac_valid` counts only the valid
generated slots instead (mean (steps + 1) / 2), i.e. what reading the whole buffer costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.config import load_config
from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.sharding import state_shardings
from sagc_jax.optim import make_optimizer
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.sampling import Sampler, SamplingConfig
from sagc_jax.shapes import ShapePlan
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import init_opt_state

ROOT = Path(__file__).resolve().parent.parent
GPU_CONFIG = ROOT / "configs" / "qwen2.5-0.5b_gsm8k_gpu.yaml"
# The smoke's model (one layer: compile time is the smoke's cost) and batch: 2 prompts x G in
# {2, 4}, 16-token prompt bucket and completions, one packed chunk size. 32 query heads per kv
# head: decode's attention then takes the batched-`einsum` form a GPU takes (XLA:CPU switches
# to multiply-reduce at <= 16 query rows per kv head, models/decode.py).
TINY = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=32,
            num_kv_heads=1, head_dim=4)
SMOKE_OVERRIDES = ["data.prompts_per_step=2", "sagc.group_sizes=[2,4]",
                   "sagc.initial_group_size=2", "sampling.max_new_tokens=16",
                   "sampling.prompt_buckets=[16]", "sampling.decode_chunk=8",
                   "algo.micro_batch_rows=4", "algo.pack_chunk_rows=[4]"]
# The device run: the config as it is, but two packed chunk sizes instead of its five (16 ... 1):
# every size met is a compile of the 24-layer update, and ~107 packed rows would meet four.
# Padding stays under 4 rows (of ~108); MFU counts real tokens only, so padding costs MFU.
GPU_OVERRIDES = ["algo.pack_chunk_rows=[16,4]"]


# The second train shape: the same batch in 64-row packed chunks (smoke: 8), so one chunk's
# matmuls are 4x taller: how far the step is from the GPU's peak when the batch fills it.
FILL_OVERRIDES = {True: ["algo.pack_chunk_rows=[8]"], False: ["algo.pack_chunk_rows=[64,16]"]}


def bench_config(smoke: bool, extra: tuple[str, ...] = ()) -> tuple[Any, ModelConfig]:
    """(run Config, model config): the GPU config and its preset (as the dry run resolves it:
    compute dtype, param dtype and remat from `model.*`), or the tiny smoke shapes; `extra`
    overrides last."""
    cfg = load_config(GPU_CONFIG, [*(SMOKE_OVERRIDES if smoke else GPU_OVERRIDES), *extra])
    m = cfg.model
    if smoke:
        mcfg = ModelConfig(model_type="qwen2", **TINY, rope_theta=1e6,
                           max_position_embeddings=4096, tie_word_embeddings=True,
                           qkv_bias=True)
    else:
        from sagc_jax.models.presets import load_preset

        mcfg = load_preset(m.preset)
    return cfg, dataclasses.replace(mcfg, dtype=m.dtype, param_dtype=m.param_dtype,
                                    remat=m.remat)


def layer_params(cfg: ModelConfig) -> int:
    """Parameters in a matmul per token in the layers: projections, not norms or biases."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    return cfg.num_layers * (attn + 3 * h * cfg.intermediate_size)


def attended_pairs(segment_ids: np.ndarray, branch_ids: np.ndarray) -> int:
    """(query, key) pairs the packed attention mask admits among real slots (`rl.packing`'s
    rule: same segment, key not after the query, key on the prompt or the query's branch)."""
    total = 0
    for seg, br in zip(segment_ids, branch_ids, strict=True):
        same = (seg[:, None] == seg[None, :]) & (seg > 0)[:, None]
        vis = same & ((br[None, :] == 0) | (br[None, :] == br[:, None]))
        total += int(np.tril(vis).sum())
    return total


def train_flops(cfg: ModelConfig, chunks: list[dict[str, np.ndarray]]) -> float:
    """Model FLOPs (forward + backward) of packed chunks (`rl.packing.pack_chunks`)."""
    slots = sum(int((c["segment_ids"] > 0).sum()) for c in chunks)
    scored = sum(int((c["head_slots"] > 0).sum()) for c in chunks)
    pairs = sum(attended_pairs(c["segment_ids"], c["branch_ids"]) for c in chunks)
    q_dim = cfg.num_heads * cfg.head_dim
    return float(6.0 * layer_params(cfg) * slots + 6.0 * cfg.vocab_size * cfg.hidden_size
                 * scored + 12.0 * cfg.num_layers * q_dim * pairs)


def synth_batch(rng: np.random.Generator, *, prompts: int, group: int, prompt_len: int,
                max_new: int, vocab: int, median: float) -> types.SimpleNamespace:
    """A rollout (the fields `rl.batch.make_batch` reads): prompts of prompt_len / 2 ..
    prompt_len tokens, one per group, completions log-normal around `median` (sigma 0.5,
    capped at max_new)."""
    rows = prompts * group
    plen = rng.integers(prompt_len // 2, prompt_len + 1, prompts)
    comp = np.clip(np.round(rng.lognormal(np.log(median), 0.5, rows)), 1, max_new)
    return types.SimpleNamespace(
        group_size=group, row_offset=0,
        examples=[{"prompt_ids": rng.integers(3, vocab, p).tolist()} for p in plen],
        tokens=rng.integers(3, vocab, (rows, max_new)).astype(np.int32),
        logprobs=np.full((rows, max_new), -np.log(vocab), np.float32),
        lengths=comp.astype(np.int32), truncated=np.zeros(rows, bool),
        rewards=rng.random(rows).astype(np.float32), valid=np.ones(rows, bool), scored=None)


def apply_variant(name: str) -> None:
    """Patches the model for an exploratory train-step variant (`gpu_bench.py train
    --variant`): 'einsum' keeps the einsum attention on a GPU (`llama.attention_impl`; the
    fused cuDNN kernel is the default there), 'plain_t' lets XLA fold the weight transposes
    into the dots instead of materialising them (`precision.row_major_t`, an XLA:CPU fast-path
    trick; no change on an H200); '+' joins variants."""
    from sagc_jax.models import llama, precision

    for part in name.split("+"):
        if part == "plain_t":
            precision.row_major_t = lambda a: a.T
        elif part == "einsum":
            llama.attention_impl = lambda dtype, head_dim: "einsum"
        elif part != "base":
            raise ValueError(f"unknown variant {part!r}")


def _one_device_mesh() -> Any:
    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


def part_train(args: argparse.Namespace, dev: dict[str, Any],
               save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The config's packed update (saved at once), then the same batch in taller chunks
    (`FILL_OVERRIDES`) under the key `fill`; a timeout keeps the first."""
    apply_variant(args.variant)
    res = train_point(args.cpu_smoke, dev)
    res["variant"] = args.variant
    save(res)
    if args.variant == "base":
        res["fill"] = train_point(args.cpu_smoke, dev, tuple(FILL_OVERRIDES[args.cpu_smoke]))
    return res


def train_point(smoke: bool, dev: dict[str, Any], extra: tuple[str, ...] = (),
                keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """The packed update of the config's largest batch (G = max group size): compile (first
    call), one untimed call, then the median of the timed calls. `keep["update"]` (if given)
    gets the warm update closure (`gpu_profile.py` traces one more call of it)."""
    cfg, mcfg = bench_config(smoke, extra)
    plan = ShapePlan.from_config(cfg)
    mesh = _one_device_mesh()
    graphdef, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
    shard = state_shardings(params, mesh)
    params = jax.device_put(params, shard)
    opt = make_optimizer(cfg.optim, cfg.run.steps)
    opt_state, opt_shard = init_opt_state(opt, params, mesh)
    steps = Learner(graphdef, opt, LossSettings.from_config(cfg), mesh, shard, opt_shard,
                    plan.train_layout)
    g = max(plan.group_sizes)
    lp, n = plan.prompt_buckets[0], plan.max_new_tokens
    ro = synth_batch(np.random.default_rng(0), prompts=plan.prompts_per_g[g], group=g,
                     prompt_len=lp, max_new=n, vocab=mcfg.vocab_size,
                     median=8 if smoke else 200)
    t0 = time.perf_counter()
    pp = make_batch(ro, steps.layout)
    chunks = pp.chunks
    dev_chunks, dev_seqs = steps.to_device(pp)
    jax.block_until_ready(dev_seqs)
    pack_s = time.perf_counter() - t0
    state = {"params": params, "opt": opt_state}

    def update() -> dict[str, Any]:
        state["params"], state["opt"], m = steps.step(state["params"], state["opt"],
                                                      dev_chunks, dev_seqs)
        return jax.device_get(m)  # waits for the whole update

    t0 = time.perf_counter()
    m = update()
    compile_s = time.perf_counter() - t0
    update()
    times = []
    for _ in range(2 if smoke else 5):
        t0 = time.perf_counter()
        m = update()
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    if keep is not None:
        keep["update"] = update
    seq_tokens = np.array([len(ro.examples[r // g]["prompt_ids"])
                           for r in range(len(ro.lengths))]) + ro.lengths - 1
    flops = train_flops(mcfg, chunks)
    slots = pp.real_tokens
    recompute = 2.0 * layer_params(mcfg) * slots if mcfg.remat else 0.0
    peak = dev["peak_flops"] * dev["devices"]
    return {**dev, "model": "tiny" if smoke else cfg.model.preset, "dtype": mcfg.dtype,
            "overrides": list(extra), "remat": mcfg.remat, "rows": len(seq_tokens), "group_size": g,
            "prompts": plan.prompts_per_g[g], "prompt_bucket": lp, "max_new_tokens": n,
            "pack_len": steps.layout.pack_len, "chunks": list(pp.sizes),
            "token_util": pp.token_util,
            "seq_tokens": int(seq_tokens.sum()), "real_tokens": slots,
            "layer_params": layer_params(mcfg), "pack_s": pack_s, "compile_s": compile_s,
            "step_s": step_s, "step_s_all": times,
            "tokens_per_s": float(seq_tokens.sum()) / step_s, "model_tflop": flops / 1e12,
            "tflops_per_s": flops / step_s / 1e12, "mfu": flops / step_s / peak,
            "hfu_with_remat": (flops + recompute) / step_s / peak,
            "loss": float(m["loss"]), "finite": bool(m["finite"] >= 1)}


def decode_bytes(cfg: ModelConfig, *, prompts: int, rows: int, prompt_len: int, slots: int,
                 steps: int) -> dict[str, int]:
    """HBM bytes one decode step reads (see the module docstring)."""
    item = jnp.dtype(cfg.dtype).itemsize
    kv_tok = cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * item  # K and V
    weights = cfg.num_params() * item
    prefix = prompts * prompt_len * kv_tok
    return {"weight_bytes": weights, "prefix_kv_bytes": prefix,
            "gen_kv_bytes": rows * slots * kv_tok,
            "gen_kv_valid_bytes": int(rows * (steps + 1) / 2 * kv_tok),
            "bytes_per_step": weights + prefix + rows * slots * kv_tok,
            "logits_bytes": rows * cfg.vocab_size * 4}


def part_decode(args: argparse.Namespace, dev: dict[str, Any],
                save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Decode points (`decode_points`) at `args.decode_groups` if given, else the default Gs."""
    return decode_points(args.cpu_smoke, dev, save, tuple(args.decode_groups or ()))


def decode_points(smoke: bool, dev: dict[str, Any], save: Callable[[dict[str, Any]], None],
                  groups: tuple[int, ...] = ()) -> dict[str, Any]:
    """Decode at P prompts x G for G in `groups` (default 16, 1, 4, 8; smoke 2, 1, 4; of three
    or more the last is held out of the time model's fit), EOS off so every row runs
    max_new_tokens steps; per G one compile call, then the best of 2 timed calls.
    `save` gets the result after every G (a timeout keeps the points already measured)."""
    cfg, mcfg = bench_config(smoke)
    s = cfg.sampling
    prompts, lp, new, chunk = (cfg.data.prompts_per_step, s.prompt_buckets[0], s.max_new_tokens,
                               s.decode_chunk)
    # Largest G first: the 256-row point is the one the target is set on, and a timeout keeps
    # the points already measured; then the smallest, so two points already span the fit. The
    # last G is held out of the time model's fit (`held_out`): its error is the fit's test.
    groups = groups or ((2, 1, 4) if smoke else (16, 1, 4, 8))
    model = Transformer(mcfg, rngs=nnx.Rngs(0))
    sampler = Sampler(model, SamplingConfig(group_sizes=tuple(sorted(groups)),
                                            prompts_per_step=prompts,
                                            prompt_buckets=(lp,), max_new_tokens=new,
                                            decode_chunk=chunk),
                      pad_id=0, eos_ids=(), mesh=_one_device_mesh())
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, mcfg.vocab_size, lp).tolist() for _ in range(prompts)]
    res: dict[str, Any] = {**dev, "model": "tiny" if smoke else cfg.model.preset,
                           "dtype": mcfg.dtype, "prompts": prompts, "prompt_len": lp,
                           "max_new_tokens": new, "decode_chunk": chunk, "points": []}
    for i, g in enumerate(groups):
        held_out = len(groups) >= 3 and i == len(groups) - 1
        t0 = time.perf_counter()
        sampler.generate(ids, group_size=g, key=jax.random.key(0))
        compile_s = time.perf_counter() - t0
        stats = [sampler.generate(ids, group_size=g, key=jax.random.key(10 * i + r)).stats
                 for r in (1, 2)]
        steps = stats[0].decode_steps
        step_s = min(st.decode_s for st in stats) / steps
        b = decode_bytes(mcfg, prompts=prompts, rows=prompts * g, prompt_len=lp, slots=new,
                         steps=steps)
        roof_s = b["bytes_per_step"] / dev["peak_hbm_bps"]
        valid = b["bytes_per_step"] - b["gen_kv_bytes"] + b["gen_kv_valid_bytes"]
        res["points"].append({
            "rows": prompts * g, "group_size": g, "held_out": held_out, "decode_steps": steps,
            "compile_s": compile_s, "step_ms": 1e3 * step_s,
            "prefill_s": min(st.prefill_s for st in stats), "tokens_per_s": prompts * g / step_s,
            "roofline_step_ms": 1e3 * roof_s, "roofline_frac": roof_s / step_s,
            "roofline_frac_valid": valid / dev["peak_hbm_bps"] / step_s,
            "hbm_gbs": b["bytes_per_step"] / step_s / 1e9, **b})
        res["points"].sort(key=lambda p: p["rows"])
        save(res)
    return res
