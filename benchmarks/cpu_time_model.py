"""This machine's rollout time model for a real config: the `model` clock with CPU constants.

    python benchmarks/cpu_time_model.py [--config configs/smollm2-135m_rg_cpu.yaml] \
        [--groups 16 4 8] [--new 128] [--out benchmarks/results/cpu_time_model.json]

The config's own sampler (`train.setup.build_run` on the wheel's SmolLM2 GGUF, as
benchmarks/sagc_real.sh runs it: its model, LoRA, dtype, prompt bucket, decode chunk, prompts per
step) with EOS off, so every row runs `--new` decode steps, on the config's first training
prompts; per G one compiling call, then the best of 3 timed calls: seconds per decode step and
per prefill. The linear time model `decode_a + decode_b * rows` (and prefill's) is fitted, as
tools/gpu_timing.py does for the GPU, on the first two G and tested on the others (held out).
Printed as `sagc.time_model.*` overrides: a `timing: model` run with them decides as if this
CPU's rollout were the clock, deterministically (the update is not modelled: on this CPU it
is not small and grows with rows too, so the fit understates what a large G costs here).
Run it on a quiet machine (the load average is recorded beside each point).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from sagc_jax.config import load_config  # noqa: E402
from sagc_jax.data.tokenizer import encode_prompt  # noqa: E402
from sagc_jax.models.gguf import smollm2_path  # noqa: E402
from sagc_jax.sampling import Sampler  # noqa: E402
from sagc_jax.train.setup import build_run  # noqa: E402
from tools.gpu_timing import fit_linear  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/smollm2-135m_rg_cpu.yaml"))
    ap.add_argument("--groups", type=int, nargs="+", default=[16, 4, 8],
                    help="G per point; the first two are fitted, the rest held out")
    ap.add_argument("--new", type=int, default=128, help="decode steps per call (EOS off)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/cpu_time_model.json"))
    args = ap.parse_args(argv)
    cfg = load_config(args.config, ["run.dir=/tmp/cpu_time_model", "run.eval_every=0",
                                    f"model.path={smollm2_path()}"])
    run = build_run(cfg, progress=False)
    params = run.take_initial().params
    sc = dataclasses.replace(run.sampler.config, group_sizes=tuple(sorted(set(args.groups))))
    sampler = Sampler(run.sampler.model, sc, pad_id=run.pad_id, eos_ids=(), mesh=run.mesh)
    ids = [list(encode_prompt(run.tokenizer, ex["prompt"], cfg.data.chat_template))
           for ex in run.train_examples[:sc.prompts_per_step]]
    points = []
    for i, g in enumerate(args.groups):
        def call(r: int, g: int = g) -> object:
            out = sampler.generate(ids, group_size=g, key=jax.random.key(r), params=params,
                                   max_new_tokens=args.new)
            assert int(out.lengths.min()) == args.new  # EOS off: every row ran every step
            return out.stats

        t0 = time.perf_counter()
        call(0)
        compile_s = time.perf_counter() - t0
        stats = [call(r) for r in (1, 2, 3)]
        points.append({"group_size": g, "rows": len(ids) * g, "fitted": i < 2,
                       "decode_steps": stats[0].decode_steps, "compile_s": compile_s,
                       "decode_step_s": min(s.decode_s for s in stats) / stats[0].decode_steps,
                       "prefill_s": min(s.prefill_s for s in stats),
                       "load_1m": os.getloadavg()[0]})
        print(json.dumps(points[-1]), flush=True)
    fit = [p for p in points if p["fitted"]]
    da, db = fit_linear([p["rows"] for p in fit], [p["decode_step_s"] for p in fit])
    pa, pb = fit_linear([p["rows"] for p in fit], [p["prefill_s"] for p in fit])
    for p in points:
        p["decode_rel_err"] = (da + db * p["rows"]) / p["decode_step_s"] - 1
        p["prefill_rel_err"] = (pa + pb * p["rows"]) / p["prefill_s"] - 1
    res = {"config": os.path.relpath(args.config, ROOT), "new": args.new, "points": points,
           "time_model": {"decode_a": da, "decode_b": db, "prefill_a": pa, "prefill_b": pb},
           "cpu": os.cpu_count(), "jax": jax.__version__}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(" ".join(f"sagc.time_model.{k}={v:.6g}" for k, v in res["time_model"].items()))
    for p in points:
        print(f"rows {p['rows']:3d} ({'fit' if p['fitted'] else 'held out'}): decode "
              f"{1e3 * p['decode_step_s']:.1f} ms/step ({100 * p['decode_rel_err']:+.1f} %), "
              f"prefill {p['prefill_s']:.3f} s ({100 * p['prefill_rel_err']:+.1f} %), "
              f"load {p['load_1m']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
