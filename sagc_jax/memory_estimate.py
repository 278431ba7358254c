"""Hand estimate of per-device memory for a run, and the effect of each memory option.

Pure arithmetic on shapes (no compile): fast enough for every shipped config and every variant.
:mod:`sagc_jax.compiled_memory` gives XLA's own plan where compiling is affordable; the dry run
prints both. The terms below follow what the compiled programs hold (measured on the 0.5B and
1.5B presets, see docs/scale.md):

- static (always resident): params at ``param_dtype``, AdamW ``mu`` + ``nu`` at the same dtype
  and sharding (``opt_state_shardings``), a frozen reference copy when ``algo.beta > 0``; with
  LoRA (``lora_elems``) AdamW state and gradients cover the float32 adapters only and the
  reference is the base itself (no copy);
- train step: the grad program of the largest chunk of the one train layout
  (``shapes.TrainLayout``: ``chunk_rows`` rows of ``pack_len`` slots, the LM head on at most
  ``completion_len`` scored slots a row): gradients at ``param_dtype`` x2 (the accumulator it
  is passed and this chunk's), the compute-dtype weight copy each forward makes (the backward
  of ``model.matmul_dtype`` matmuls re-rounds the compute-dtype operands it keeps anyway: no
  copy of its own), f32 logits of the scored slots x2 (value and gradient), activations of
  ``chunk_rows x pack_len`` tokens (residual stream per layer + one layer's intermediates with
  ``model.remat``; every layer's intermediates incl. the pack_len^2 attention scores without)
  and the batch itself (the chunk's arrays and the per-sequence ``[S, N]`` ones);
- sampling: the KV cache x2 (decode carries a copy through its loop), the weight copy decode
  reads (``model.matmul_dtype``, else the compute dtype; none when it is the storage dtype)
  and the f32 decode logits x2 (logits and log-softmax).
Peak = static + max(train, sampling): the two phases do not overlap. The params per device
come from the sharding rules (`param_bytes_per_device`, of `abstract_params`: no weights).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh

from sagc_jax.config.model import LoRASection
from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.build import with_lora
from sagc_jax.models.lora import A_SUFFIX, B_SUFFIX
from sagc_jax.models.sharding import LLAMA_PARAM_AXES, LOGICAL_TO_MESH, spec_for

__all__ = ["MemoryInputs", "abstract_params", "activation_bytes", "chunk_row_bytes", "estimate",
           "largest_micro_batch", "lora_comparison", "lora_elems", "option_effects",
           "param_bytes_per_device", "per_device", "seq_row_bytes"]


@dataclasses.dataclass(frozen=True)
class MemoryInputs:
    """Everything the estimate needs, per device.

    ``param_elems``: elements of one copy of the params on a device (sharded);
    ``param_elems_unsharded``: the same, fully replicated (for the replicated-optimizer variant);
    ``kv_elems``: KV-cache elements per device of the largest sampler shape;
    ``decode_rows``: rows per device of that shape; ``chunk_rows``: global rows of the train
    layout's largest chunk (``algo.pack_chunk_rows``, default from ``algo.micro_batch_rows``);
    ``batch_shards``: data x fsdp; ``pack_len``: slots per row; ``completion_len``: N, scored
    slots a row and the per-sequence width; ``seqs``: S, sequences of the largest batch;
    ``vocab_ways``: shards of the vocabulary (tensor).
    """

    mcfg: ModelConfig
    param_elems: int
    param_elems_unsharded: int
    kv_elems: int
    decode_rows: int
    chunk_rows: int
    batch_shards: int
    pack_len: int
    completion_len: int
    seqs: int
    vocab_ways: int
    beta: float
    # LoRA (`model.lora`): per-device elements of the adapters, included in `param_elems` and
    # stored float32. Only they get gradients and AdamW state; the KL reference is the base
    # with adapters off (no copy). 0 = full fine-tuning.
    lora_elems: int = 0
    lora_elems_unsharded: int = 0
    # The SFT warm start (`init.sft_steps` without `init.params`): rows of its batch (not split
    # over devices: the trainer passes the batch unsharded) and tokens a row; 0 = no warm start.
    sft_rows: int = 0
    sft_seq: int = 0


# The train step's batch arguments (`rl.batch`), bytes per row: a chunk row holds 4 int32
# [pack_len] arrays (tokens, positions, segment / branch ids) and 2 int32 [N] ones (scored slots,
# their targets); a sequence 3 float32 [N] (old / reference log-probs, entropies), 6 four-byte
# and 2 bool scalars. tests/test_dryrun.py checks them against the Learner's abstract inputs.
def chunk_row_bytes(pack_len: int, completion_len: int) -> int:
    """Bytes of one chunk row of the train layout's packed arrays."""
    return 4 * (4 * pack_len + 2 * completion_len)


def seq_row_bytes(completion_len: int) -> int:
    """Bytes of one sequence's per-sequence arrays (`rl.batch.SEQ_FIELDS`): three float32
    [N] (old / reference logprobs, entropy), the bool [N] loss mask, six int32 / float32
    scalars and two bools."""
    return 3 * 4 * completion_len + completion_len + 6 * 4 + 2


def per_device(rows: int, shards: int) -> int:
    """Rows one device holds: rows over the batch shards when they split, else all of them
    (the trainer replicates rows that do not split)."""
    return rows // shards if rows % shards == 0 else rows


def activation_bytes(mcfg: ModelConfig, rows: int, seq: int) -> int:
    """Rough activations kept for the backward pass of ``rows x seq`` tokens on one device."""
    dt = jnp.dtype(mcfg.dtype).itemsize
    h, i, hd = mcfg.hidden_size, mcfg.intermediate_size, mcfg.head_dim
    qd, kvd = mcfg.num_heads * hd, mcfg.num_kv_heads * hd
    tok = rows * seq
    per_layer_full = (tok * (4 * h + 2 * qd + 2 * kvd + 3 * i) * dt
                      + rows * mcfg.num_heads * seq * seq * (4 + dt))
    if mcfg.remat:  # residual stream per layer + one layer recomputed at a time
        return mcfg.num_layers * tok * h * dt + per_layer_full
    return mcfg.num_layers * per_layer_full


def estimate(x: MemoryInputs, *, shard_optimizer: bool = True) -> dict[str, int]:
    """Per-device bytes: ``params, optimizer, reference, static, gradients, weights_copy,
    logits, activations, batch, train_peak, kv_cache, decode_logits, sampler_peak, peak``."""
    m = x.mcfg
    store = jnp.dtype(m.param_dtype).itemsize
    comp = jnp.dtype(m.dtype).itemsize
    lora = x.lora_elems
    params = (x.param_elems - lora) * store + lora * 4
    if lora:  # adapters only (float32): optimizer state and gradients; reference = the base
        train_bytes = lora * 4
        opt = 2 * (lora if shard_optimizer else x.lora_elems_unsharded) * 4
        ref = 0
    else:
        train_bytes = params
        opt = 2 * (x.param_elems if shard_optimizer else x.param_elems_unsharded) * store
        ref = params if x.beta > 0 else 0
    mm = jnp.dtype(m.matmul_dtype or m.dtype).itemsize  # `model.matmul_dtype`
    copy = x.param_elems * comp if comp != store else 0
    dec_copy = x.param_elems * mm if mm != store else 0
    rows = per_device(x.chunk_rows, x.batch_shards)
    grads = 2 * train_bytes  # the accumulator the grad program is passed, and this chunk's
    logits = 2 * rows * x.completion_len * m.vocab_size * 4 // x.vocab_ways
    act = activation_bytes(m, rows, x.pack_len)
    batch = (rows * chunk_row_bytes(x.pack_len, x.completion_len)
             + per_device(x.seqs, x.batch_shards) * seq_row_bytes(x.completion_len))
    kv = 2 * x.kv_elems * comp
    dec_logits = 2 * x.decode_rows * m.vocab_size * 4
    out = {"params": params, "optimizer": opt, "reference": ref, "static": params + opt + ref,
           "gradients": grads, "weights_copy": copy, "logits": logits, "activations": act,
           "batch": batch, "train_peak": grads + copy + logits + act + batch, "kv_cache": kv,
           "decode_logits": dec_logits, "sampler_peak": kv + dec_copy + dec_logits}
    out["peak"] = out["static"] + max(out["train_peak"], out["sampler_peak"])
    out.update(sft_estimate(x, params, opt))
    out["peak"] = max(out["peak"], out["sft_total"])
    return out


def sft_estimate(x: MemoryInputs, params: int, opt: int) -> dict[str, int]:
    """Per-device bytes of the SFT warm start: ``sft_optimizer`` (its AdamW state over the
    base params), ``sft_peak`` (its gradients and update, logits, activations) and
    ``sft_total`` (with the params and the GRPO optimizer state, which exist already; the KL
    reference does not yet). All 0 without a warm start (``sft_rows == 0``)."""
    if not x.sft_rows:
        return {"sft_optimizer": 0, "sft_peak": 0, "sft_total": 0}
    m = x.mcfg
    store = jnp.dtype(m.param_dtype).itemsize
    base = (x.param_elems - x.lora_elems) * store
    copy = x.param_elems * jnp.dtype(m.dtype).itemsize if m.dtype != m.param_dtype else 0
    tok = x.sft_rows * x.sft_seq
    logits = 2 * tok * m.vocab_size * 4 // x.vocab_ways  # f32 logits and their gradient
    peak = 2 * base + copy + logits + activation_bytes(m, x.sft_rows, x.sft_seq) + 8 * tok
    return {"sft_optimizer": 2 * base, "sft_peak": peak, "sft_total": params + opt + 2 * base
            + peak}


def _chunk_candidates(rows_counts: Sequence[int], batch_shards: int) -> list[int]:
    """Largest-chunk sizes (`algo.micro_batch_rows`) valid for every rows count, largest
    first: common divisors (the config check asks that) that split over the batch shards
    (whole rows per device)."""
    g = math.gcd(*rows_counts)
    divs = [d for d in range(g, 0, -1) if g % d == 0]
    split = [d for d in divs if d % batch_shards == 0]
    return split or divs


def largest_micro_batch(x: MemoryInputs, rows_counts: Sequence[int], device_bytes: int,
                        *, shard_optimizer: bool = True) -> int | None:
    """The largest ``algo.micro_batch_rows`` (the layout's largest chunk) whose estimated
    peak fits ``device_bytes``, or None when not even the smallest does."""
    for d in _chunk_candidates(rows_counts, x.batch_shards):
        if estimate(dataclasses.replace(x, chunk_rows=d),
                    shard_optimizer=shard_optimizer)["peak"] <= device_bytes:
            return d
    return None


def option_effects(x: MemoryInputs, rows_counts: Sequence[int],
                   device_bytes: int | None) -> list[dict[str, Any]]:
    """The estimated peak under each memory option flipped from the run's setting.

    Returns rows ``{"option", "setting", "peak", "delta"}``: ``model.param_dtype`` and
    ``model.remat`` flipped, the AdamW state replicated instead of sharded (what the trainer
    did before it passed ``opt_state_shardings``), and the largest ``algo.micro_batch_rows``
    (the train layout's largest chunk) that fits ``device_bytes`` (when given).
    """
    base = estimate(x)["peak"]
    m = x.mcfg
    rows: list[dict[str, Any]] = []

    def add(option: str, setting: Any, peak: int) -> None:
        rows.append({"option": option, "setting": setting, "peak": peak, "delta": peak - base})

    other = "bfloat16" if m.param_dtype == "float32" else "float32"
    add("model.param_dtype", other,
        estimate(dataclasses.replace(x, mcfg=dataclasses.replace(m, param_dtype=other)))["peak"])
    add("model.remat", not m.remat,
        estimate(dataclasses.replace(x, mcfg=dataclasses.replace(m, remat=not m.remat)))["peak"])
    add("optimizer state", "replicated", estimate(x, shard_optimizer=False)["peak"])
    if device_bytes is not None:
        mb = largest_micro_batch(x, rows_counts, device_bytes)
        if mb is not None:
            peak = estimate(dataclasses.replace(x, chunk_rows=mb))["peak"]
            add("algo.micro_batch_rows", f"{mb} (largest that fits)", peak)
        else:
            rows.append({"option": "algo.micro_batch_rows", "setting": "none fits",
                         "peak": None, "delta": None})
    return rows


# ---- the params per device (from the sharding rules; no weights)


def abstract_params(mcfg: ModelConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Flat {dotted path: ShapeDtypeStruct} of the model's params; nothing is allocated."""
    model = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    flat: dict[str, jax.ShapeDtypeStruct] = {}

    def walk(tree: Any, prefix: str) -> None:
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    walk(pure, "")
    return flat


def param_bytes_per_device(params: dict[str, jax.ShapeDtypeStruct], mesh: AbstractMesh,
                            bytes_per_elem: int) -> tuple[int, list[str]]:
    """Per-device bytes of one copy of the params at ``bytes_per_elem``, and the params a rule
    meant to shard that stay replicated because their dim does not divide the mesh axis."""
    total, replicated = 0, []
    for path, x in params.items():
        spec = spec_for(path, tuple(x.shape), mesh)
        shards = math.prod(mesh.shape[a] for a in spec if a is not None)
        total += math.ceil(math.prod(x.shape) / shards) * bytes_per_elem
        wanted = [LOGICAL_TO_MESH.get(ax) if ax else None for ax in LLAMA_PARAM_AXES[path]]
        if any(w is not None and mesh.shape[w] > 1 and s is None for w, s in zip(wanted, spec)):
            replicated.append(path)
    return total, replicated


def lora_elems(params: dict[str, jax.ShapeDtypeStruct],
                mesh: AbstractMesh) -> tuple[int, int]:
    """(per-device, unsharded) elements of the LoRA adapters among `params` (0, 0 if none)."""
    lora = {k: v for k, v in params.items() if k.endswith((A_SUFFIX, B_SUFFIX))}
    if not lora:
        return 0, 0
    return (param_bytes_per_device(lora, mesh, 1)[0],
            sum(math.prod(x.shape) for x in lora.values()))


def lora_comparison(lora: LoRASection | None, mcfg: ModelConfig, mesh: AbstractMesh,
                    inputs: MemoryInputs) -> dict[str, Any]:
    """Estimated per-device params / gradients / AdamW state / reference / peak for full
    fine-tuning and for LoRA (the run's `model.lora` section `lora`, else the section's
    defaults) on the same model and shapes."""
    base = dataclasses.replace(mcfg, lora_rank=0, lora_alpha=0.0, lora_targets=())
    sec = lora or LoRASection()
    out: dict[str, Any] = {"setting": f"rank {sec.rank}, {len(sec.targets)} targets"}
    for name, mc in (("full", base), ("lora", with_lora(base, sec))):
        params = abstract_params(mc)
        elems, lora = param_bytes_per_device(params, mesh, 1)[0], lora_elems(params, mesh)
        e = estimate(dataclasses.replace(
            inputs, mcfg=mc, param_elems=elems,
            param_elems_unsharded=sum(math.prod(x.shape) for x in params.values()),
            lora_elems=lora[0], lora_elems_unsharded=lora[1]))
        out[name] = {k: e[k] for k in ("params", "gradients", "optimizer", "reference", "peak")}
    return out
