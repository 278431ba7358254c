"""Record rollouts of the untrained model at one group size, with the trainer's own pieces and
no updates: a simulator trace (configs/sim/traces/ format, `workload.load_trace_groups`).

    GGUF=$(python -c "from sagc_jax.models.gguf import smollm2_path; print(smollm2_path())")
    nice -n 10 python benchmarks/probes/record_rollouts.py \
        --config configs/smollm2-135m_rg_cpu.yaml \
        --group-size 16 --prompts 32 --out configs/sim/traces/smollm2_static16_trace.jsonl \
        model.path=$GGUF

The run is built exactly as `sagc-jax train` builds it (`train.setup.build_run`: the model file,
tokenizer, chat template, task options, prompt buckets, KV-cache sampler, reward functions), with
`sagc.enabled=false sagc.initial_group_size=G`. Then, per prompt block, `rollout.collect` at G
with the step's sampling key `rollout_key(run.seed, step, 0)` and the initial params — what a
static-G run's steps would sample if its params never moved, on the same prompt stream (the
first `--prompts` prompts any run of the config trains on, in order). So record step 1 is the
static-G training run's step 1 row for row. Each record is the trainer's trace.jsonl row
(`train.records.trace_row`) plus the step's measured seconds and decode steps.

    python benchmarks/probes/record_rollouts.py \
        --report configs/sim/traces/smollm2_static16_trace.jsonl

prints the recording's figures (docs/results/smollm2/static16_recording.md): rows at the cap,
length mean / p90 / p99, pass rate, and the tail share at every g <= the recorded G computed
exactly from the recorded groups (the mean over all g-subsets of each group's rows);
`--first-rows 4 --out T4.jsonl` also writes the trace a G = 4 recording of the same prompts
would have given (each group's first 4 rows), to measure the simulator's extrapolation above
the recorded G against the rows actually recorded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _subsets(n: int, g: int) -> np.ndarray:
    """Every g-subset of range(n): int [C(n, g), g] (C(16, 8) = 12870 at most here)."""
    return np.array(list(itertools.combinations(range(n), g)))


def exact_tail_share(lengths: np.ndarray, g: int) -> np.ndarray:
    """Mean tail share (`sagc.events.tail_share`) over all g-subsets of each group's rows:
    int [P, G] -> float [P]."""
    from sagc_jax.sagc.events import tail_share

    return tail_share(lengths[:, _subsets(lengths.shape[1], g)]).mean(-1)


def exact_informative(values: np.ndarray, g: int) -> np.ndarray:
    """Share of each group's g-subsets whose values are not all equal: [P, G] -> float [P]."""
    sub = values[:, _subsets(values.shape[1], g)]
    return (sub.max(-1) != sub.min(-1)).mean(-1)


def report(path: str, group_sizes: tuple[int, ...] = (4, 8, 16), threshold: float = 0.5) -> str:
    """The recording's figures as markdown (see the module docstring)."""
    from sagc_jax.sagc.events import hypergeom_none

    recs = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    grp = [gr for r in recs for gr in r["groups"]]
    big = min(len(gr["lengths"]) for gr in grp)
    lengths = np.array([gr["lengths"][:big] for gr in grp])
    trunc = np.array([gr["truncated"][:big] for gr in grp])
    rew = np.array([gr["rewards"][:big] for gr in grp])
    passed = rew > threshold
    L = lengths.ravel()
    out = [f"{len(grp)} groups x {big} rows = {L.size} rows, cap {recs[0]['max_new_tokens']}",
           "",
           "| rows at cap | len mean | p50 | p90 | p99 | pass (reward > 0.5) | reward = 1 | "
           "mean reward | prompts never passed | prompts always passed |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
           f"| {trunc.mean():.1%} ({trunc.sum()}) | {L.mean():.1f} | {np.percentile(L, 50):.0f} | "
           f"{np.percentile(L, 90):.0f} | {np.percentile(L, 99):.0f} | {passed.mean():.1%} | "
           f"{(rew >= 1).mean():.1%} | {rew.mean():.3f} | {(~passed.any(-1)).sum()} | "
           f"{passed.all(-1).sum()} |",
           "",
           "Per g, exact over all g-subsets of each recorded group (mean over groups):",
           "",
           "| g | tail share | p10 | p90 | has a truncated row | passes mixed | rewards not all "
           "equal (the simulator's informative group) | benefit per group, x (1 - 1/g) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g in group_sizes:
        if g > big:
            continue
        ts = exact_tail_share(lengths, g)
        p_tr = 1.0 - hypergeom_none(big, trunc.sum(-1), g)  # exact (hypergeometric)
        mixed = exact_informative(passed.astype(np.int8), g).mean()
        inf = exact_informative(rew, g).mean()
        out.append(f"| {g} | {ts.mean():.3f} | {np.percentile(ts, 10):.3f} | "
                   f"{np.percentile(ts, 90):.3f} | {p_tr.mean():.0%} | {mixed:.0%} | {inf:.0%} | "
                   f"{inf * (1 - 1 / g):.3f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", metavar="TRACE", help="no sampling: print TRACE's figures")
    ap.add_argument("--first-rows", type=int, default=None, metavar="K",
                    help="with --report and --out: also write TRACE cut to the first K rows of "
                    "every group (what a G = K recording of the same prompts would have seen)")
    ap.add_argument("--config")
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=32, help="prompts in all (multiple of the "
                    "prompts per step at G)")
    ap.add_argument("--out", help="trace JSONL (written as it goes)")
    ap.add_argument("overrides", nargs="*", metavar="key=value",
                    help="config overrides, e.g. model.path=$GGUF")
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.report))
        if args.first_rows and args.out:
            with open(args.report) as f, open(args.out, "w") as sink:
                for line in filter(str.strip, f):
                    rec = json.loads(line)
                    rec["group_size"] = args.first_rows
                    rec["groups"] = [{k: v[:args.first_rows] for k, v in gr.items()}
                                     for gr in rec["groups"]]
                    sink.write(json.dumps(rec) + "\n")
        return 0
    if not args.config or not args.out:
        ap.error("--config and --out are required (unless --report)")

    from sagc_jax.config import load_config
    from sagc_jax.rollout import collect
    from sagc_jax.train.records import trace_row
    from sagc_jax.train.setup import build_run

    g = args.group_size
    with tempfile.TemporaryDirectory(prefix="record_rollouts_") as tmp:
        cfg = load_config(args.config, [*args.overrides, "sagc.enabled=false",
                                        f"sagc.initial_group_size={g}", "run.eval_every=0",
                                        f"run.dir={tmp}/run", "run.plots=false"])
        t0 = time.perf_counter()
        run = build_run(cfg, progress=False)
        per_step = run.plan.prompts_per_g[g]
        if args.prompts % per_step:
            ap.error(f"--prompts {args.prompts}: not a multiple of {per_step} prompts per step "
                     f"at G = {g}")
        print(f"built in {time.perf_counter() - t0:.0f}s; G = {g}, {per_step} prompt(s) x {g} "
              f"rows per step, {args.prompts // per_step} steps", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as sink:
            for step in range(args.prompts // per_step):
                t = time.perf_counter()
                ro = collect(run.sampler, run.prompts, g, run.reward_fns, step=step,
                             num_prompts=per_step, params=run.initial.params,
                             tokenizer=run.tokenizer, settings=run.collect_settings,
                             hosts=run.hosts)
                rec = trace_row(step, ro, cfg.sampling.max_new_tokens)
                rec.update(decode_steps=int(ro.stats["decode_steps"]),
                           prefill_s=round(ro.stats["prefill_s"], 3),
                           decode_s=round(ro.stats["decode_s"], 3))
                sink.write(json.dumps(rec) + "\n")
                sink.flush()
                print(f"step {step + 1}: len max {int(ro.lengths.max())}, at cap "
                      f"{int(ro.truncated.sum())}/{len(ro.lengths)}, reward mean "
                      f"{float(ro.raw_rewards.mean()):.3f}, {time.perf_counter() - t:.0f}s, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"wrote {args.prompts // per_step} steps to {args.out} in "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
