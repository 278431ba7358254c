"""The text a dry run prints: a :func:`sagc_jax.dryrun.dry_run` result as a report."""

from __future__ import annotations

from typing import Any

__all__ = ["format_report"]


def _gib(n: float) -> str:
    """Bytes as a fixed-width GiB (>= 1 GiB) or MiB string."""
    return f"{n / 2**30:8.2f} GiB" if n >= 2**30 else f"{n / 2**20:8.1f} MiB"


def format_report(r: dict[str, Any]) -> str:
    """Human-readable text of a :func:`dry_run` result."""
    m, mesh, t = r["model"], r["mesh"], r["train_layout"]
    lines = [
        f"dry run: {r['devices']} devices, {r['processes']} process(es), mesh data={mesh['data']} "
        f"fsdp={mesh['fsdp']} tensor={mesh['tensor']} (batch rows over {r['batch_shards']})",
        f"model: {m['model_type']} from {m['source']}: {m['num_params'] / 1e6:.1f}M params, "
        f"{m['num_layers']} layers, hidden {m['hidden_size']}, heads {m['num_heads']}/"
        f"{m['num_kv_heads']} kv x {m['head_dim']}, vocab {m['vocab_size']}, {m['dtype']}, "
        f"remat={m['remat']}",
        "checks:",
        *[f"  {k:22s} {v}" for k, v in r["checks"].items()],
        "sampler shapes (G, prompts, rows, prompt bucket, cache bucket -> KV cache/device):",
        *[f"  G={x['group_size']:<3d} P={x['prompts']:<4d} rows={x['rows']:<5d} "
          f"Lp={x['prompt_bucket']:<5d} cache={x['cache_bucket']:<6d} "
          f"{_gib(x['kv_cache_bytes'])}" for x in r["sampler_shapes"]],
        "train layout (one for every G: S sequences x N completion slots; chunks of rows x "
        "pack_len slots, N scored a row -> logits, activations per device):",
        f"  S={t['seqs']} N={t['completion_len']} pack_len={t['pack_len']} "
        f"chunks={list(t['chunk_sizes'])} "
        f"{'shared prompts' if t['share_prompts'] else 'one sequence a row'}",
        *[f"  chunk rows={x['chunk_rows']:<5d} ({x['rows_per_device']}/device) "
          f"x {x['pack_len']} slots  logits {_gib(x['logits_bytes'])}"
          f"  act~{_gib(x['activation_bytes'])}" for x in r["train_shapes"]],
        f"compiled programs: {r['compiled_programs']}",
        *_memory_lines(r),
    ]
    lines += [f"warning: {w}" for w in r["warnings"]]
    lines += [f"error: {e}" for e in r["errors"]]
    lines.append("dry run: OK" if r["ok"] else f"dry run: {len(r['errors'])} error(s)")
    return "\n".join(lines)


def _memory_lines(r: dict[str, Any]) -> list[str]:
    """The memory table: the estimate, XLA's compiled plan beside it when there is one, and the
    effect of each memory option on the estimated peak."""
    mem, c, m = r["memory"], r["compiled_memory"], r["model"]
    pdt = "f32" if m["param_dtype"] == "float32" else "bf16"
    cell = (lambda k: f"  {_gib(c[k])}" if c and k in c else "")  # noqa: E731
    head = "memory per device: estimate" + (" | compiled (XLA)" if c else "")
    lines = [head,
             f"  params {pdt:5s}         {_gib(mem['params'])}{cell('params')}",
             f"  AdamW state 2x{pdt:4s}  {_gib(mem['optimizer'])}{cell('opt_state')}"]
    if mem["reference"]:
        lines.append(f"  reference params     {_gib(mem['reference'])}{cell('reference')}")
    lines += [
        f"  train step           {_gib(mem['train_peak'])}"
        + (f"  {_gib(c['train_peak'] - c['params'] - c['opt_state'])}" if c else "")
        + "  (grads x2, weight copy, logits x2, activations, batch)",
        f"  sampling             {_gib(mem['sampler_peak'])}"
        + (f"  {_gib(c['sampler_peak'] - c['params'] - c['opt_state'])}" if c else "")
        + "  (KV cache x2, weight copy, decode logits)",
    ]
    if mem.get("sft_total"):
        lines.append(f"  SFT warm start       {_gib(mem['sft_total'])}{cell('sft_total')}"
                     "  (params, both AdamW states, grads, logits, activations)")
    lines += [
        f"  peak                 {_gib(mem['peak'])}{cell('peak')}"
        + (f"  of {_gib(r['device_memory_bytes']).strip()}" if r["device_memory_bytes"] else ""),
    ]
    if c:
        lines.append(f"  compiled/estimate    {c['peak'] / mem['peak']:.2f}x peak")
        lines += [f"    {p['name']:10s} {p['shape']:36s} args {_gib(p['argument'])} temp "
                  f"{_gib(p['temp'])} live {_gib(p['total'])}" for p in c["programs"]]
    lines.append(f"  printed peak: {'compiled' if c else 'estimate'}; {r['compiled_note']}")
    lines.append("memory options (estimated peak if changed):")
    for o in r["memory_options"]:
        if o["peak"] is None:
            lines.append(f"  {o['option']:22s} {o['setting']!s:28s} -")
            continue
        lines.append(f"  {o['option']:22s} {o['setting']!s:28s} {_gib(o['peak'])} "
                     f"({'+' if o['delta'] >= 0 else '-'}{_gib(abs(o['delta'])).strip()})")
    lo = r["lora"]
    lines.append(f"full fine-tuning vs LoRA ({lo['setting']}), estimate per device:")
    lines.append(f"  {'':12s}{'params':>13s}{'gradients':>13s}{'AdamW state':>13s}"
                 f"{'reference':>13s}{'peak':>13s}")
    for name in ("full", "lora"):
        v = lo[name]
        lines.append(f"  {name:12s}" + "".join(
            f"{_gib(v[k]):>13s}" for k in ("params", "gradients", "optimizer", "reference",
                                             "peak")))
    return lines
