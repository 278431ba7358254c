"""Dry run: validate a config against a mesh and size per-device memory, with no weights.

``dry_run(cfg)`` builds the policy abstractly (``nnx.eval_shape``: shapes only, nothing is
allocated) from ``model.path``'s ``config.json`` alone, else ``model.preset`` (a shipped
architecture), else the ``model.*`` fields; resolves the mesh for the current (or a given)
device count, lists the compiled shape set (sampler and train step) and estimates the bytes
every device holds (``sagc_jax.memory_estimate``, with the effect of each memory option). When
this process has the target's devices it can also compile the largest shapes and print XLA's
own plan beside the estimate (``sagc_jax.compiled_memory``); ``--devices N`` gives it N fake CPU
devices in a subprocess (``sagc_jax.fakepod``), so a pod config is checked on a laptop::

    python -m sagc_jax.dryrun --config configs/qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml \\
        --devices 16 --num-processes 4 --device-memory-gib 16

Paths that do not exist here (tokenizer, data files) are reported as ``not checked (path
missing)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh

from sagc_jax.config import Config, ConfigError
from sagc_jax.dryrun_inputs import DryRunError, model_and_inputs
from sagc_jax.dryrun_report import format_report
from sagc_jax.memory_estimate import (
    MemoryInputs,
    abstract_params,
    activation_bytes,
    estimate,
    lora_comparison,
    lora_elems,
    option_effects,
    param_bytes_per_device,
    per_device,
)
from sagc_jax.models import ModelConfig
from sagc_jax.models.decode import kv_layer_slots
from sagc_jax.optim import sft_seq_len
from sagc_jax.parallel import BATCH_AXES, MESH_AXES
from sagc_jax.shapes import ShapePlan

__all__ = ["DryRunError", "dry_run", "format_report", "main"]

def _ways(mesh: AbstractMesh, axes: Sequence[str]) -> int:
    return math.prod(mesh.shape[a] for a in axes)


# --------------------------------------------------------------------------------------------
# The dry run
# --------------------------------------------------------------------------------------------


def dry_run(cfg: Config, *, num_devices: int | None = None,
            num_processes: int | None = None, device_memory_bytes: int | None = None,
            compile: bool | None = False) -> dict[str, Any]:
    """Validate ``cfg`` against a mesh and estimate sizes; returns a JSON-able dict.

    Args:
      cfg: a validated config.
      num_devices: total devices of the target (default ``jax.device_count()``), so a TPU pod
        config can be checked anywhere.
      num_processes: hosts of the target (default: ``jax.process_count()`` when ``num_devices``
        is not given, else ``distributed.num_processes`` or 1).
      device_memory_bytes: per-device memory to compare the estimate with (default: the local
        accelerator's ``bytes_limit`` when checking this machine, else unchecked).
      compile: also compile the largest train-step and sampler shapes and report XLA's memory
        plan (``sagc_jax.compiled_memory``); needs this process to have the target's devices
        (fake CPU devices will do). ``None``: only up to ``COMPILE_AUTO_MAX_PARAMS`` params.

    Returns:
      ``{"ok", "errors", "warnings", "mesh", "model", "checks", "sampler_shapes",
      "train_layout", "train_shapes", "memory", ...}``; byte counts are per device;
      ``train_layout`` is the trainer's ``ShapePlan.train_layout`` (S, N, pack_len, chunk
      sizes), ``train_shapes`` one entry per chunk size.

    Raises:
      DryRunError: the mesh does not fit the device count, or the model config is unreadable.
    """
    errors: list[str] = []
    warnings: list[str] = []
    local = num_devices is None
    n_dev = jax.device_count() if local else int(num_devices)
    if num_processes is None:
        num_processes = jax.process_count() if local else (cfg.distributed.num_processes or 1)
    if n_dev < 1 or num_processes < 1 or n_dev % num_processes:
        raise DryRunError(f"{n_dev} devices do not split evenly over {num_processes} processes")
    try:
        shape = cfg.mesh.shape(n_dev)
    except ConfigError as e:
        raise DryRunError(str(e)) from None
    mesh = AbstractMesh(shape, MESH_AXES)
    data, fsdp, tensor = shape
    batch_ways = _ways(mesh, BATCH_AXES)

    # ---- model, tokenizer, data paths ------------------------------------------------------
    (mcfg, source), checks, input_errors = model_and_inputs(cfg)
    errors += input_errors
    params = abstract_params(mcfg)
    n_params = sum(math.prod(x.shape) for x in params.values())
    dt_bytes = jnp.dtype(mcfg.dtype).itemsize

    # ---- static memory ---------------------------------------------------------------------
    p_elems, replicated = param_bytes_per_device(params, mesh, 1)
    if replicated:
        warnings.append(f"params replicated instead of sharded (dim does not divide the mesh "
                        f"axis): "
                        f"{', '.join(replicated)}")

    # ---- compiled shapes -------------------------------------------------------------------
    plan, plan_errors = _plan(cfg, batch_ways, num_processes)
    errors += plan_errors
    plan_err, plan_warn = plan.problems()
    errors += plan_err
    warnings += plan_warn
    kv_tok = mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim * 2 * dt_bytes
    sampler_shapes = _sampler_shapes(plan, mcfg, kv_tok // mcfg.num_layers)
    layout = plan.train_layout
    train_shapes = _train_shapes(plan, mcfg, tensor)
    longest = max(x["cache_bucket"] for x in sampler_shapes)
    if longest > mcfg.max_position_embeddings:
        warnings.append(f"cache bucket {longest} exceeds max_position_embeddings "
                        f"{mcfg.max_position_embeddings}")

    if device_memory_bytes is None and local:
        device_memory_bytes = _local_device_memory()
    big_s = max(sampler_shapes, key=lambda x: x["kv_cache_bytes"])
    inputs = MemoryInputs(
        mcfg=mcfg, param_elems=p_elems, param_elems_unsharded=n_params,
        kv_elems=big_s["kv_cache_bytes"] // dt_bytes, decode_rows=big_s["rows_per_device"],
        chunk_rows=max(layout.chunk_sizes), batch_shards=batch_ways, pack_len=layout.pack_len,
        completion_len=layout.completion_len, seqs=layout.seqs,
        vocab_ways=tensor if mcfg.vocab_size % tensor == 0 else 1, beta=cfg.algo.beta,
        sft_rows=cfg.init.sft_batch_size if _warm_start(cfg) else 0, sft_seq=sft_seq_len(cfg),
        **dict(zip(("lora_elems", "lora_elems_unsharded"), lora_elems(params, mesh),
                   strict=True)))
    memory = estimate(inputs)
    options = option_effects(inputs, sorted({x["rows"] for x in sampler_shapes}),
                             device_memory_bytes)
    if device_memory_bytes is not None and memory["peak"] > device_memory_bytes:
        warnings.append(f"estimated peak {memory['peak'] / 2**30:.1f} GiB per device exceeds "
                        f"the {device_memory_bytes / 2**30:.1f} GiB available")
    if mcfg.param_dtype == "bfloat16" and cfg.optim.lr < 1e-4:
        warnings.append(f"model.param_dtype=bfloat16 with optim.lr={cfg.optim.lr:g}: updates "
                        "smaller than ~2^-8 of a weight round away in bf16 storage")
    compiled, compiled_note = _compiled(cfg, mcfg, plan, shape, n_dev, local, compile)
    a = cfg.algo
    n_prog = len(sampler_shapes) * 2 + len(layout.programs(
        logprobs=a.beta > 0 or a.num_iterations > 1, entropy=a.top_entropy_quantile < 1))
    return {
        "ok": not errors, "errors": errors, "warnings": warnings,
        "devices": n_dev, "processes": num_processes,
        "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor}, "batch_shards": batch_ways,
        "model": {"source": source, "model_type": mcfg.model_type,
                  "vocab_size": mcfg.vocab_size, "hidden_size": mcfg.hidden_size,
                  "intermediate_size": mcfg.intermediate_size, "num_layers": mcfg.num_layers,
                  "num_heads": mcfg.num_heads, "num_kv_heads": mcfg.num_kv_heads,
                  "head_dim": mcfg.head_dim, "tied": mcfg.tie_word_embeddings,
                  "dtype": mcfg.dtype, "param_dtype": mcfg.param_dtype, "remat": mcfg.remat,
                  "num_params": n_params, "lora_rank": mcfg.lora_rank,
                  "kv_bytes_per_token": kv_tok},
        "checks": checks, "sampler_shapes": sampler_shapes,
        "train_layout": dataclasses.asdict(layout), "train_shapes": train_shapes,
        "compiled_programs": n_prog, "memory": memory, "memory_options": options,
        "lora": lora_comparison(cfg.model.lora, mcfg, mesh, inputs),
        "compiled_memory": compiled, "compiled_note": compiled_note,
        "device_memory_bytes": device_memory_bytes,
    }


def _warm_start(cfg: Config) -> bool:
    """Does a fresh run do the SFT warm start (`init.sft_steps`, no `init.params`)?"""
    return cfg.init.sft_steps > 0 and not cfg.init.params


# Above this many params `compile=None` (auto) keeps the estimate only: compiling the train step
# and sampler of the 1.5B preset on 16 fake CPU devices takes ~2.5 min on a loaded 2-core box.
COMPILE_AUTO_MAX_PARAMS = 2_000_000_000


def _compiled(cfg: Config, mcfg: ModelConfig, plan: ShapePlan, shape: tuple[int, int, int],
              n_dev: int, local: bool, compile: bool | None
              ) -> tuple[dict[str, Any] | None, str]:
    """XLA's memory plan of the largest shapes, when asked/affordable; (result, why/what)."""
    if compile is False:
        return None, "not compiled (--no-compile)"
    if not local or jax.device_count() != n_dev:
        return None, (f"not compiled: {n_dev} devices are not this process's "
                      f"{jax.device_count()} (use --devices {n_dev} for a fake-device pod)")
    if compile is None and mcfg.num_params() > COMPILE_AUTO_MAX_PARAMS:
        return None, (f"not compiled: {mcfg.num_params() / 1e9:.1f}B params is slow to compile "
                      "here (--compile forces it)")
    from sagc_jax.compiled_memory import compiled_memory
    from sagc_jax.parallel import make_mesh

    out = compiled_memory(cfg, mcfg, make_mesh(*shape), plan=plan)
    return out, (f"XLA {jax.default_backend()} memory_analysis(), compiled in "
                 f"{out['compile_s']:.0f} s")


def fake_pod_size(cfg: Config, devices: int | None) -> int | None:
    """Fake CPU devices to re-run the dry run on, or None to run here.

    ``devices`` (``--devices N``) wins; otherwise the mesh size when the config fixes it
    (``mesh.data != -1``) and this single process has a different number of devices.
    """
    from sagc_jax.fakepod import in_fake_pod, mesh_devices

    n = devices if devices is not None else mesh_devices(cfg.mesh)
    if n is None or in_fake_pod(n):
        return None
    if devices is None and (jax.process_count() > 1 or jax.device_count() == n):
        return None
    return n


def _plan(cfg: Config, batch_ways: int, num_processes: int) -> tuple[ShapePlan, list[str]]:
    """The run's ShapePlan over the rungs whose prompt count is valid, and the others' errors."""
    ok, errors = ShapePlan.rungs(cfg)
    if not ok:
        raise DryRunError("; ".join(errors) or "no group sizes")
    return ShapePlan.from_config(cfg, batch_ways=batch_ways, num_processes=num_processes,
                                 group_sizes=ok), errors


def _sampler_shapes(plan: ShapePlan, mcfg: ModelConfig,
                    kv_slot: int) -> list[dict[str, Any]]:
    """Every (G, prompt bucket) sampler program with its per-device KV cache and logits bytes
    (`kv_slot`: bytes of one layer's key and value for one token; sliding-window layers hold
    at most about two windows, `kv_layer_slots`)."""
    try:
        shapes = plan.sampler_shapes()
    except ValueError as e:
        raise DryRunError(f"sampling.cache_buckets: {e}") from None
    out = []
    for s in shapes:
        per_dev = per_device(s.rows, plan.batch_ways)
        out.append({"group_size": s.group_size, "prompts": s.prompts, "rows": s.rows,
                    "prompt_bucket": s.prompt_bucket, "cache_bucket": s.cache_bucket,
                    "rows_per_device": per_dev,
                    "kv_cache_bytes": per_dev * kv_slot * kv_layer_slots(mcfg, s.prompt_bucket,
                                                                         s.cache_bucket),
                    "decode_logits_bytes": per_dev * mcfg.vocab_size * 4})
    return out


def _train_shapes(plan: ShapePlan, mcfg: ModelConfig, tensor: int) -> list[dict[str, Any]]:
    """The train layout's chunk programs (`ShapePlan.train_layout`: one grad, and log-prob /
    entropy, program per chunk size, whatever G or the lengths), each with its per-device
    logits (the LM head runs on at most N scored slots a row) and activation bytes."""
    t = plan.train_layout
    vocab_ways = tensor if mcfg.vocab_size % tensor == 0 else 1
    out = []
    for c in t.chunk_sizes:
        rows = per_device(c, plan.batch_ways)
        out.append({"chunk_rows": c, "rows_per_device": rows, "pack_len": t.pack_len,
                    "head_slots": t.completion_len,
                    "logits_bytes": rows * t.completion_len * mcfg.vocab_size * 4 // vocab_ways,
                    "activation_bytes": activation_bytes(mcfg, rows, t.pack_len)})
    return out


def _local_device_memory() -> int | None:
    """The first device's memory in bytes, or None where the backend does not say (CPU returns
    None; some plugins raise NotImplementedError or an UNIMPLEMENTED runtime error). Any other
    failure is a real problem of the device: it is printed in one line, and the sizes are
    then not compared with a limit."""
    try:
        stats = jax.devices()[0].memory_stats()
    except NotImplementedError:
        return None
    except jax.errors.JaxRuntimeError as e:
        if "UNIMPLEMENTED" not in str(e):
            print(f"dry run: warning: cannot read device memory: {' '.join(str(e).split())[:300]}",
                  file=sys.stderr)
        return None
    limit = stats.get("bytes_limit") if isinstance(stats, dict) else None
    return int(limit) if isinstance(limit, int) and limit > 0 else None


# --------------------------------------------------------------------------------------------
# Printing and the command line
# --------------------------------------------------------------------------------------------


def _on_fake_pod(cfg: Config, devices: int | None, argv: list[str], prog: str) -> int | None:
    """The one fake-pod dispatch: re-runs ``python -m sagc_jax.dryrun argv --devices N`` on the
    N devices :func:`fake_pod_size` asks for and returns its exit code (a line on stderr says
    so); None when the dry run belongs in this process."""
    from sagc_jax.fakepod import run_with_devices

    fake = fake_pod_size(cfg, devices)
    if fake is None:
        return None
    print(f"{prog}: re-running on {fake} fake CPU devices", file=sys.stderr)
    return run_with_devices(fake, "sagc_jax.dryrun", [*argv, "--devices", str(fake)])


def run_dry_run(cfg: Config, child_argv: list[str], *, prog: str, devices: int | None = None,
                num_devices: int | None = None, num_processes: int | None = None,
                device_memory_bytes: int | None = None, compile: bool | None = None,
                as_json: bool = False) -> int:
    """The dry-run command, for ``sagc-jax train --dry-run`` and ``python -m sagc_jax.dryrun``
    alike: the report (text, or JSON with `as_json`) on process 0, or, when a fake pod is asked
    for (`devices`, or a fixed mesh this process does not have), the command re-run there with
    ``child_argv`` (:func:`main`'s arguments; ``--devices N`` is appended). `num_devices` sizes
    for N devices without having them (an estimate here). Exit code 0 ok, 1 errors in the
    report, 2 bad config or input (one line on stderr)."""
    if num_devices is None:
        rc = _on_fake_pod(cfg, devices, child_argv, prog)
        if rc is not None:
            return rc
    try:
        report = dry_run(cfg, num_devices=num_devices, num_processes=num_processes,
                         device_memory_bytes=device_memory_bytes, compile=compile)
    except (DryRunError, ValueError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if jax.process_index() == 0:
        print(json.dumps(report, indent=1) if as_json else format_report(report))
    return 0 if report["ok"] else 1


def _parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m sagc_jax.dryrun``."""
    p = argparse.ArgumentParser(
        prog="python -m sagc_jax.dryrun",
        description="Dry run: validate a config against a mesh and size per-device memory, "
                    "with no weights.")
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--devices", type=int,
                   help="re-run on N fake CPU devices (a subprocess), so the programs are "
                   "compiled on the target mesh (default: the config's mesh size when it is "
                   "fixed and differs from this machine's)")
    p.add_argument("--num-devices", type=int,
                   help="size for N devices without having them (estimate only)")
    p.add_argument("--num-processes", type=int, help="target host count")
    p.add_argument("--device-memory-gib", type=float, help="per-device memory to compare with")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the largest shapes for XLA's memory plan (default: models up "
                   "to 2B params)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m sagc_jax.dryrun --config FILE [--devices N] [key=value ...]``: exit code 0
    ok, 1 errors in the report, 2 bad config or input."""
    from sagc_jax.config import load_config

    args = _parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as e:  # ConfigError included
        print(f"dry run: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    mem = None if args.device_memory_gib is None else int(args.device_memory_gib * 2**30)
    return run_dry_run(cfg, list(sys.argv[1:] if argv is None else argv), prog="dry run",
                       devices=args.devices, num_devices=args.num_devices,
                       num_processes=args.num_processes, device_memory_bytes=mem,
                       compile=args.compile, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
