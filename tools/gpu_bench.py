"""One part of the prepared GPU benchmark (`tools/gpu.sh` runs them in order, one process
each, so a crash or a timeout loses only its own part). Each part writes its JSON to `--out` as
soon as it has a result (decode rewrites it after every row count).

    python3 -m tools.gpu_bench PART --out FILE [--cpu-smoke] [--peak-tflops T --peak-hbm-gbs B]

Parts:
  env     the device, jax / package versions, the chip's peaks, and an import of every
          `sagc_jax` module; exits 2 (one line) on a device whose peaks it does not know unless
          both --peak-tflops and --peak-hbm-gbs are given. Runs first: a refusal costs seconds.
  train   the GRPO train step (`train.learner.Learner` over the packed layout, what every
          real config trains on) at the Qwen2.5-0.5B shape of
          configs/qwen2.5-0.5b_gsm8k_gpu.yaml (random weights, bf16 compute, f32 params + AdamW,
          remat as the config): tokens/s and MFU (`gpu_steps.py`); then the same batch in
          64-row packed chunks (`fill`).
  decode  the prefix-sharing `Sampler` at 16 / 64 / 256 rows (16 prompts x G = 1 / 4 / 16, the
          GPU config's prompts_per_step): ms per decode step, prefill seconds, and the fraction
          of the HBM roofline, bytes = bf16 weights + the KV the step reads (`gpu_steps.py`).
  timing  the linear time model fitted to decode's points, as the simulator's `timing:` block
          and the trainer's `sagc.time_model.*` keys, then the simulator suite (configs/sim/*.yaml)
          with it beside the default guesses (`gpu_timing.py`; no jax).
  sagc    a short GRPO + SAGC run of configs/tiny_cpu.yaml with `sagc.timing=measured`: the
          group sizes SAGC picks on the device's real timings, per step.

`--cpu-smoke` runs every part on tiny shapes on a CPU (the CI test `tests/test_gpu_smoke.py`):
the same functions, the same JSON keys.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent

# (device-kind pattern, bf16 dense FLOP/s, HBM bytes/s, source). Only chips whose exact part we
# can tell from jax's device_kind (the CUDA device name): an H100 PCIe or an H200 NVL has other
# figures, so they are refused rather than given an SXM part's peaks.
#   H200 SXM: NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 tensor core
#     1,979 TFLOP/s with sparsity = 989 dense; 4.8 TB/s HBM3e.
#   H100 SXM: NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): 1,979 sparse = 989
#     dense; 3.35 TB/s HBM3.
#   A100 SXM4: NVIDIA A100 datasheet: BF16 312 TFLOP/s dense; 2,039 GB/s (80 GB), 1,555 GB/s
#     (40 GB).
PEAKS: tuple[tuple[str, float, float, str], ...] = (
    (r"^NVIDIA H200$", 989e12, 4.8e12, "NVIDIA H200 SXM datasheet"),
    (r"^NVIDIA H100 80GB HBM3$", 989e12, 3.35e12, "NVIDIA H100 SXM datasheet"),
    (r"^NVIDIA A100-SXM4-80GB$", 312e12, 2.039e12, "NVIDIA A100 datasheet"),
    (r"^NVIDIA A100-SXM4-40GB$", 312e12, 1.555e12, "NVIDIA A100 datasheet"),
)
PARTS = ("env", "train", "decode", "timing", "sagc")


class BenchError(Exception):
    """A one-line reason a part cannot run (printed as `gpu_bench PART: error: ...`, exit 2)."""


def peaks_for(kind: str, peak_tflops: float | None, peak_hbm_gbs: float | None
              ) -> dict[str, Any]:
    """{"peak_flops", "peak_hbm_bps", "peaks_source"} of device kind `kind`; given values win.

    Raises BenchError for a kind not in PEAKS unless both peaks are given: an MFU against a
    guessed peak would be a made-up figure.
    """
    if (peak_tflops is None) != (peak_hbm_gbs is None):
        raise BenchError("give both --peak-tflops and --peak-hbm-gbs, or neither")
    if peak_tflops is not None and peak_hbm_gbs is not None:
        if peak_tflops <= 0 or peak_hbm_gbs <= 0:
            raise BenchError("--peak-tflops and --peak-hbm-gbs must be > 0")
        return {"peak_flops": peak_tflops * 1e12, "peak_hbm_bps": peak_hbm_gbs * 1e9,
                "peaks_source": "command line"}
    for pattern, flops, bw, source in PEAKS:
        if re.match(pattern, kind.strip()):
            return {"peak_flops": flops, "peak_hbm_bps": bw, "peaks_source": source}
    known = ", ".join(p.strip("^$") for p, *_ in PEAKS)
    raise BenchError(f"unknown device {kind!r} (peaks known for: {known}); pass its bf16 dense "
                     "peak and HBM bandwidth as --peak-tflops T --peak-hbm-gbs B")


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Writes `data` atomically (a part killed mid-write leaves the previous file whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    tmp.replace(path)


def device_info(args: argparse.Namespace) -> dict[str, Any]:
    """Device kind and count, and the peaks the measurements are judged against."""
    import jax

    kind = jax.devices()[0].device_kind
    return {"device": kind, "platform": jax.default_backend(), "devices": jax.device_count(),
            **peaks_for(kind, args.peak_tflops, args.peak_hbm_gbs)}


# --------------------------------------------------------------------------------------------
# env
# --------------------------------------------------------------------------------------------


def import_all() -> dict[str, str]:
    """{module: error} for every `sagc_jax` module that fails to import (empty = all fine)."""
    import sagc_jax

    failed = {}
    for m in pkgutil.walk_packages(sagc_jax.__path__, "sagc_jax."):
        try:
            importlib.import_module(m.name)
        except Exception as e:  # report every failure, whatever it is
            failed[m.name] = f"{type(e).__name__}: {e}"[:300]
    return failed


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
                 "orbax-checkpoint", "transformers", "pydantic", "grain", "tensorboardX",
                 "typing_extensions", "numpy", "protobuf"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def _target_modules() -> dict[str, bool]:
    """{top-level module of the wheel folder (GPU_SITE): importable} for the installed wheels."""
    site = os.environ.get("GPU_SITE")
    if not site or not Path(site).is_dir():
        return {}
    names = sorted({p.name.removesuffix(".py") for p in Path(site).iterdir()
                    if not p.name.endswith((".dist-info", ".data")) and p.name not in
                    ("bin", "__pycache__") and (p.is_dir() or p.suffix == ".py")})
    ok = {}
    for n in names:
        try:
            importlib.import_module(n)
            ok[n] = True
        except Exception:  # a broken wheel: recorded, not fatal
            ok[n] = False
    return ok


def measured_rates(smoke: bool) -> dict[str, float]:
    """This device's bf16 matmul FLOP/s (n^3 product, random data) and copy bandwidth (read +
    write bytes of `x + 1` over a large bf16 array), best of 5 after a warm-up: the ceilings
    beside the datasheet's."""
    import jax
    import jax.numpy as jnp

    n, m = (256, 1 << 20) if smoke else (8192, 1 << 30)
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    x = jnp.zeros((m,), jnp.bfloat16)
    mm = jax.jit(lambda a: a @ a)
    inc = jax.jit(lambda x: x + 1)

    def best(f: Any, v: Any) -> float:
        jax.block_until_ready(f(v))
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(f(v))
            ts.append(time.perf_counter() - t0)
        return min(ts)

    return {"matmul_bf16_flops": 2.0 * n**3 / best(mm, a),
            "copy_bytes_per_s": 2.0 * 2 * m / best(inc, x), "matmul_n": n, "copy_elems": m}


def part_env(args: argparse.Namespace) -> dict[str, Any]:
    """Versions and device (written at once), the peaks (may refuse: then nothing else runs),
    nvidia-smi and the import check."""
    import jax

    res: dict[str, Any] = {"versions": _versions(), "wheel_modules": _target_modules(),
                           "device": jax.devices()[0].device_kind,
                           "platform": jax.default_backend(), "devices": jax.device_count()}
    write_json(args.out, res)  # before the peaks check: a refusal still records the device
    res.update(peaks_for(res["device"], args.peak_tflops, args.peak_hbm_gbs))
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,"
                              "clocks.max.sm", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        res["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        res["nvidia_smi"] = f"unavailable: {e}"
    res["import_failures"] = import_all()
    res["measured"] = measured_rates(args.cpu_smoke)
    return res


# --------------------------------------------------------------------------------------------
# sagc: a short GRPO run with measured timings
# --------------------------------------------------------------------------------------------


_STEP_KEYS = ("step", "group_size", "rows", "step_s", "prefill_s", "decode_s", "decode_steps",
              "straggler_rate", "sagc_reason", "sagc_queue", "reward_mean", "truncated_frac",
              "len_mean", "len_max", "compiles")


def sagc_overrides(smoke: bool, steps: int, run_dir: str) -> list[str]:
    """configs/tiny_cpu.yaml overrides: measured timings, no eval/checkpoints/plots."""
    out = [f"run.dir={run_dir}", f"run.steps={steps}", "run.progress=false", "run.plots=false",
           "run.eval_every=0", "checkpoint.every=0", "checkpoint.async_save=false",
           "sagc.timing=measured", "sagc.warmup_steps=2"]
    if smoke:
        # One layer and one packed chunk size: the fewest compiles the same path can take.
        return [*out, "model.hidden_size=32", "model.intermediate_size=64",
                "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
                "data.task=arith_short", "data.prompts_per_step=2", "sagc.group_sizes=[2,4]",
                "sagc.initial_group_size=2", "sampling.max_new_tokens=8",
                "sampling.prompt_buckets=[32]", "sampling.decode_chunk=8",
                "algo.pack_chunk_rows=[8]", "init.sft_steps=0"]
    return [*out, "init.sft_steps=200", "model.dtype=bfloat16"]


def part_sagc(args: argparse.Namespace) -> dict[str, Any]:
    """`args.sagc_steps` GRPO steps; per step G, timings, SAGC's reason and the reward."""
    from sagc_jax.config import load_config
    from sagc_jax.metrics import read_jsonl
    from sagc_jax.train import train

    res = device_info(args)
    steps = args.sagc_steps or (2 if args.cpu_smoke else 40)
    with tempfile.TemporaryDirectory() as d:
        run_dir = os.path.join(d, "run")
        cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml",
                          sagc_overrides(args.cpu_smoke, steps, run_dir))
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        train(cfg, progress=False, timing=timing)
        rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    res.update(
        config="configs/tiny_cpu.yaml", steps=len(rows), wall_s=time.perf_counter() - t0,
        startup_s=timing, group_sizes=[int(r["group_size"]) for r in rows],
        compiles_after_warmup=int(sum(r.get("compiles", 0) for r in rows)),
        per_step=[{k: r[k] for k in _STEP_KEYS if k in r} for r in rows])
    return res


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("part", choices=PARTS)
    p.add_argument("--out", required=True, help="this part's JSON")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes (CI, on a CPU)")
    p.add_argument("--peak-tflops", type=float, help="bf16 dense TFLOP/s per device")
    p.add_argument("--peak-hbm-gbs", type=float, help="HBM GB/s per device")
    p.add_argument("--decode-json", help="timing: decode part's JSON (default: beside --out)")
    p.add_argument("--sim-steps", type=int, help="timing: steps per simulation (default: each "
                   "config's own; 20 with --cpu-smoke)")
    p.add_argument("--sim-procs", type=int, help="timing: processes (default: CPUs, <= 16)")
    p.add_argument("--decode-groups", type=int, nargs="+",
                   help="decode: these G only (default 16 1 4 8, the last held out; smoke 2 1 4)")
    p.add_argument("--variant", default="base",
                   help="train: an exploratory patch (gpu_steps.apply_variant): einsum, plain_t, "
                   "einsum+plain_t; not base: no `fill` shape")
    p.add_argument("--sagc-steps", type=int, help="sagc: GRPO steps (default 40; smoke 2)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.part == "env":
            res = part_env(args)
        elif args.part == "train":
            from tools.gpu_steps import part_train

            res = part_train(args, device_info(args), lambda r: write_json(args.out, r))
        elif args.part == "decode":
            from tools.gpu_steps import part_decode

            res = part_decode(args, device_info(args), lambda r: write_json(args.out, r))
        elif args.part == "timing":
            from tools.gpu_timing import part_timing

            res = part_timing(args, lambda r: write_json(args.out, r))
        else:
            res = part_sagc(args)
    except BenchError as e:
        print(f"gpu_bench {args.part}: error: {e}", file=sys.stderr)
        return 2
    res["part_s"] = time.perf_counter() - t0
    res["smoke"] = bool(args.cpu_smoke)
    write_json(args.out, res)
    print(f"[{args.part}] {json.dumps(summary(args.part, res))}", flush=True)
    return 0


def summary(part: str, res: dict[str, Any]) -> dict[str, Any]:
    """The few numbers of a part worth a log line."""
    keys = {"env": ("device", "versions", "import_failures", "measured"),
            "train": ("tokens_per_s", "mfu", "step_s", "compile_s"),
            "decode": ("points",), "timing": ("timing", "fit_max_rel_err",
                                                            "held_out_max_rel_err",
                                                            "loo_max_rel_err"),
            "sagc": ("group_sizes", "compiles_after_warmup", "wall_s")}[part]
    out = {k: res.get(k) for k in keys}
    if part == "train" and "fill" in res:
        out["fill"] = {k: res["fill"].get(k) for k in keys}
    if part == "decode":
        out["points"] = [{k: p[k] for k in ("rows", "step_ms", "roofline_frac")}
                         for p in res.get("points", [])]
    return out


if __name__ == "__main__":
    sys.exit(main())
