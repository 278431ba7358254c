"""Where the device time of the packed update and of decode goes: one traced call of each, the
device's kernels summed by name (`tools/gpu_profile.sh` runs it with decode's flag variants).

    python3 -m tools.gpu_profile --out FILE [--cpu-smoke] [--top 40]

For each of `train` (the config's packed update, `gpu_steps.train_point`'s batch) and `decode`
(the sampler at G = 16, every row to the cap): wall seconds of the traced call, device busy
seconds (the union of kernel intervals on the device's streams), and the top kernels by total
time with their counts. busy / wall near 1 means the kernels are the cost; far below, the host
(launches, loop-predicate syncs) is. Kernel names are XLA's fusion / cuBLAS / cuDNN names; the
summary groups them into coarse classes (`kernel_class`).

`--cpu-smoke`: tiny shapes on a CPU (no device streams there: the host's XLA ops are summed
instead), for the CI test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Coarse classes of kernel names, first match wins (cuBLAS / cuDNN / CUTLASS kernels are the
# matmuls; XLA's own names say what a fusion holds).
CLASSES: tuple[tuple[str, str], ...] = (
    ("matmul", r"gemm|cublas|cutlass|sm90_xmma|nvjet|wgmma|cudnn|dot|matmul"),
    ("reduce", r"reduce|softmax|argmax|cumsum"),
    ("copy / transpose", r"copy|transpose|memcpy|memset|concatenate|dynamic.update.slice"),
    ("fusion (elementwise)", r"fusion|loop_|input_"),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    for label, pattern in CLASSES:
        if re.search(pattern, low):
            return label
    return "other"


def _union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of [start, end) intervals given in microseconds."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e6


def summarize_trace(path: Path, top: int = 40) -> dict[str, Any]:
    """Kernel totals of a perfetto / Chrome-trace JSON(.gz) written by `jax.profiler.trace`.

    Device events are those of processes named like a device (`/device:GPU:0`, ...); with none
    (a CPU run) the host's XLA op events (`/host:CPU`) are summed instead.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    pname = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    tname = {(e["pid"], e["tid"]): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    dev = {p for p, n in pname.items() if re.search(r"device:(GPU|TPU)|/device:", n)}
    source = "device"
    if not dev:
        dev, source = {p for p, n in pname.items() if "host" in n.lower()}, "host"
    spans = [e for e in events if e.get("ph") == "X" and e.get("pid") in dev and "dur" in e]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_class: dict[str, float] = defaultdict(float)
    by_thread: dict[str, float] = defaultdict(float)
    for e in spans:
        by_thread[f"{pname[e['pid']]} / {tname.get((e['pid'], e.get('tid')), e.get('tid'))}"] += (
            e["dur"] / 1e6)
        rec = by_name[e["name"]]
        rec[0] += e["dur"] / 1e6
        rec[1] += 1
        by_class[kernel_class(e["name"])] += e["dur"] / 1e6
    first = min((e["ts"] for e in spans), default=0.0)
    last = max((e["ts"] + e["dur"] for e in spans), default=0.0)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])
    return {"source": source, "processes": sorted(pname[p] for p in dev), "events": len(spans),
            "kernel_s": sum(v[0] for v in by_name.values()),
            "busy_s": _union_s([(e["ts"], e["ts"] + e["dur"]) for e in spans]),
            # The same on the stream lines only (the kernels as the GPU ran them).
            "stream_busy_s": _union_s([(e["ts"], e["ts"] + e["dur"]) for e in spans
                                       if "stream" in tname.get((e["pid"], e.get("tid")),
                                                                "").lower()]),
            "span_s": (last - first) / 1e6,
            "by_class_s": dict(sorted(by_class.items(), key=lambda kv: -kv[1])),
            # A device's kernels appear on its stream lines, and again as XLA ops / modules
            # lines: per line totals say which sums to read.
            "by_thread_s": dict(sorted(by_thread.items(), key=lambda kv: -kv[1])[:12]),
            "top": [{"name": n[:160], "s": v[0], "count": v[1], "class": kernel_class(n)}
                    for n, v in ranked[:top]]}


def traced(fn: Any, top: int) -> dict[str, Any]:
    """Runs fn() once under `jax.profiler.trace`; wall seconds and the trace's summary."""
    import jax

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        with jax.profiler.trace(d, create_perfetto_trace=True):
            fn()
        wall = time.perf_counter() - t0
        found = sorted(Path(d).rglob("perfetto_trace.json.gz"))
        if not found:
            return {"wall_s": wall, "error": f"no perfetto trace under {d}: "
                    f"{[str(p.relative_to(d)) for p in Path(d).rglob('*')][:20]}"}
        return {"wall_s": wall, **summarize_trace(found[0], top)}


def profile_train(smoke: bool, dev: dict[str, Any], top: int) -> dict[str, Any]:
    """One traced packed update of `gpu_steps.train_point`'s batch (after its timed calls)."""
    from tools import gpu_steps

    hold: dict[str, Any] = {}
    point = gpu_steps.train_point(smoke, dev, keep=hold)
    return {"step_s": point["step_s"], "mfu": point["mfu"], "chunks": point["chunks"],
            "trace": traced(hold["update"], top)}


def profile_decode(smoke: bool, dev: dict[str, Any], top: int) -> dict[str, Any]:
    """One traced generate at the largest G (every row to the cap), after a warm-up call."""
    import jax
    import numpy as np
    from flax import nnx

    from sagc_jax.models import Transformer
    from sagc_jax.sampling import Sampler, SamplingConfig
    from tools import gpu_steps

    cfg, mcfg = gpu_steps.bench_config(smoke)
    s = cfg.sampling
    g = 2 if smoke else 16
    prompts, lp = cfg.data.prompts_per_step, s.prompt_buckets[0]
    sampler = Sampler(Transformer(mcfg, rngs=nnx.Rngs(0)),
                      SamplingConfig(group_sizes=(g,), prompts_per_step=prompts,
                                     prompt_buckets=(lp,), max_new_tokens=s.max_new_tokens,
                                     decode_chunk=s.decode_chunk),
                      pad_id=0, eos_ids=(), mesh=gpu_steps._one_device_mesh())
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, mcfg.vocab_size, lp).tolist() for _ in range(prompts)]
    sampler.generate(ids, group_size=g, key=jax.random.key(0))
    out: dict[str, Any] = {}

    def run() -> None:
        out["stats"] = sampler.generate(ids, group_size=g, key=jax.random.key(1)).stats

    trace = traced(run, top)
    st = out["stats"]
    return {"rows": prompts * g, "decode_steps": st.decode_steps,
            "step_ms": 1e3 * st.decode_s / st.decode_steps, "prefill_s": st.prefill_s,
            "trace": trace}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--cpu-smoke", action="store_true")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--peak-hbm-gbs", type=float)
    p.add_argument("--parts", nargs="+", default=["decode", "train"],
                   choices=["decode", "train"])
    args = p.parse_args(argv)
    from tools import gpu_bench

    dev = gpu_bench.device_info(args)
    res: dict[str, Any] = {**dev, "smoke": args.cpu_smoke}
    for part in args.parts:
        fn = profile_train if part == "train" else profile_decode
        t0 = time.perf_counter()
        try:
            res[part] = fn(args.cpu_smoke, dev, args.top)
        except Exception as e:  # keep the other part's result
            res[part] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        res[part]["part_s"] = time.perf_counter() - t0
        gpu_bench.write_json(args.out, res)
        r = res[part]
        tr = r.get("trace", {})
        print(f"[profile {part}] wall {tr.get('wall_s')} busy {tr.get('busy_s')} "
              f"classes {tr.get('by_class_s')} {r.get('error', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
