"""The GPU tables of benchmarks/README.md ("GPU: H200"), regenerated from the committed raw JSON.

    python -m tools.gpu_report [RESULTS_DIR]     # default benchmarks/results/gpu_h200

RESULTS_DIR holds one folder per device call: run1_gpu_sh (`tools/gpu.sh`), run2_profile
(`tools/gpu_profile.sh`), run3_attention (`gpu_bench.py train --variant ...`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_h200"


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def device_lines(env: dict[str, Any]) -> list[str]:
    m = env["measured"]
    v = env["versions"]
    return [f"Device: {env['nvidia_smi']} (jax {v['jax']}, CUDA 13 plugin "
            f"{v['jax-cuda13-plugin']}, flax {v['flax']}). Datasheet peaks "
            f"{env['peak_flops'] / 1e12:.0f} TFLOP/s bf16 dense, {env['peak_hbm_bps'] / 1e12:.1f}"
            f" TB/s; measured in the same call: an {m['matmul_n']}^3 bf16 matmul "
            f"{m['matmul_bf16_flops'] / 1e12:.0f} TFLOP/s, `x + 1` over 2 GiB bf16 "
            f"{m['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write)."]


def train_table(run1: Path, run3: Path) -> list[str]:
    base = _load(run1 / "train.json")
    rows = [("einsum attention (run 1), 16-row chunks", base),
            ("einsum attention (run 1), 64-row chunks", base["fill"])]
    for name, label in (("plain_t", "einsum + XLA-folded weight transposes"),
                        ("dpa_cudnn", "cuDNN fused attention"),
                        ("plain_t_dpa_cudnn", "cuDNN fused attention + folded transposes")):
        f = run3 / f"train_{name}.json"
        if f.exists():
            rows.append((label + " (run 3)", _load(f)))
    out = [f"Packed GRPO update, {base['model']} (random weights, bf16 compute, f32 params + "
           f"AdamW, remat), {base['rows']} rows = {base['prompts']} prompts x G = "
           f"{base['group_size']}, prompt bucket {base['prompt_bucket']}, completions "
           f"log-normal around 200 tokens (cap {base['max_new_tokens']}): "
           f"{base['seq_tokens']} sequence tokens, {base['real_tokens']} computed (shared "
           f"prompts once per row), {base['model_tflop']:.0f} model TFLOP per update.", "",
           "| variant | chunks | s / update (median of 5) | tokens/s | TFLOP/s | MFU | loss |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for label, r in rows:
        out.append(f"| {label} | {r['chunks']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | "
                   f"{r['tflops_per_s']:.0f} | {_pct(r['mfu'])} | {r['loss']:.5f} |")
    return out


def decode_table(run1: Path, run2: Path) -> list[str]:
    d = _load(run1 / "decode.json")
    out = [f"Decode, {d['model']} bf16, {d['prompts']} prompts (prefix shared), every row to "
           f"the {d['max_new_tokens']}-token cap, decode_chunk {d['decode_chunk']}; best of 2 "
           "calls. Roofline bytes per step = bf16 weights + each prompt's K/V once + every row's "
           "whole generated K/V buffer (read in full each step, masked past the current slot).",
           "", "| rows (G) | ms / step | roofline ms | of roofline | GB/s achieved | "
           "of roofline counting valid K/V only | prefill s | fitted? |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in d["points"]:
        out.append(f"| {p['rows']} ({p['group_size']}) | {p['step_ms']:.3f} | "
                   f"{p['roofline_step_ms']:.3f} | {_pct(p['roofline_frac'])} | "
                   f"{p['hbm_gbs']:.0f} | {_pct(p['roofline_frac_valid'])} | "
                   f"{p['prefill_s']:.4f} | {'held out' if p.get('held_out') else 'fit'} |")
    for name, label in (("cmdbuf_while", "`--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL`"),
                        ("no_cmdbuf", "`--xla_gpu_enable_command_buffer=` (graphs off)")):
        f = run2 / f"decode_{name}.json"
        if f.exists():
            p = _load(f)["points"][0]
            out.append(f"| {p['rows']} ({p['group_size']}), {label} (run 2) | "
                       f"{p['step_ms']:.3f} | {p['roofline_step_ms']:.3f} | "
                       f"{_pct(p['roofline_frac'])} | {p['hbm_gbs']:.0f} | "
                       f"{_pct(p['roofline_frac_valid'])} | {p['prefill_s']:.4f} | - |")
    return out


def profile_table(run2: Path) -> list[str]:
    prof = _load(run2 / "profile.json")
    out = ["| traced call | wall s | GPU busy s (stream union) | matmul s | copy / transpose s |"
           " reduce s | elementwise s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for part, label in (("train", "one packed update (einsum attention)"),
                        ("decode", "one generate, 256 rows x 512 steps")):
        t = prof[part]["trace"]
        c = t["by_class_s"]
        wall = t["span_s"] if part == "decode" else prof[part]["step_s"]
        out.append(f"| {label} | {wall:.3f} | {t['stream_busy_s']:.3f} | "
                   f"{c.get('matmul', 0):.3f} | {c.get('copy / transpose', 0):.3f} | "
                   f"{c.get('reduce', 0):.3f} | {c.get('fusion (elementwise)', 0):.3f} |")
    top = prof["train"]["trace"]["top"][:3]
    out += ["", "Largest train kernels: " + "; ".join(
        f"`{k['name']}` {k['s']:.3f} s over {k['count']} calls" for k in top) + "."]
    return out


def timing_lines(run1: Path) -> list[str]:
    t = _load(run1 / "timing.json")
    tm = t["timing"]
    h = t["held_out_max_rel_err"] or {}
    lo = t["loo_max_rel_err"] or {}
    out = [f"Fitted on rows {t['fit_rows']}: `{t['yaml']}`. Worst relative error: on the fitted "
           f"points decode {_pct(t['fit_max_rel_err']['decode'])}, prefill "
           f"{_pct(t['fit_max_rel_err']['prefill'])}; on the held-out shape (rows "
           f"{t['held_out_rows']}) decode {_pct(h.get('decode', float('nan')))}, prefill "
           f"{_pct(h.get('prefill', float('nan')))}; leave-one-out over the fitted points "
           f"decode {_pct(lo.get('decode', float('nan')))} (the 16-row end point, "
           f"extrapolated), prefill {_pct(lo.get('prefill', float('nan')))}. Trainer overrides: "
           f"`{' '.join(t['sagc_overrides'])}`. Per row, 256 rows add "
           f"{tm['decode_b'] * 256 / tm['decode_a']:.2f}x decode_a to a decode step.", "",
           "| simulator config | SAGC / best static in budget, guessed timing | same, H200 "
           "timing | SAGC mean G guessed -> H200 |", "|---|---:|---:|---|"]
    by = {(r["config"], r["timing"]): r for r in t["sim"]}
    for cfg in sorted({c for c, _ in by}):
        a, b = by[(cfg, "default")], by[(cfg, "measured")]

        def ratio(r: dict[str, Any]) -> str:
            v = r["sagc_vs_best_static"]
            return "n/a (no static G in budget)" if not v else f"{v:.3f}"

        out.append(f"| {cfg} | {ratio(a)} | {ratio(b)} | {a['sagc_mean_group_size']:.1f} -> "
                   f"{b['sagc_mean_group_size']:.1f} |")
    return out


def sagc_lines(run1: Path) -> list[str]:
    s = _load(run1 / "sagc.json")
    gs = s["group_sizes"]
    return [f"SAGC on the GPU's measured timings (`sagc.timing=measured`, configs/tiny_cpu.yaml, "
            f"bf16, {s['steps']} steps after a {s['startup_s'].get('sft_s', 0):.0f} s SFT warm "
            f"start): G per step {gs[:6]} ... {gs[-3:]} (G = {max(gs)} from step "
            f"{gs.index(max(gs)) + 1} on), {s['compiles_after_warmup']} compiles after warm-up, "
            f"{s['wall_s']:.0f} s wall including {s['startup_s'].get('compile_s', 0):.0f} s of "
            "compiles."]


def report(root: Path) -> str:
    run1, run2, run3 = root / "run1_gpu_sh", root / "run2_profile", root / "run3_attention"
    parts = [device_lines(_load(run1 / "env.json")), ["", "#### Packed train step", ""],
             train_table(run1, run3), ["", "Where the einsum update's time went (run 2, "
                                          "`jax.profiler` trace, kernels by class):", ""],
             profile_table(run2), ["", "#### Decode", ""], decode_table(run1, run2),
             ["", "#### SAGC time model and simulator suite", ""], timing_lines(run1), [""],
             sagc_lines(run1)]
    return "\n".join(line for part in parts for line in part)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT))
