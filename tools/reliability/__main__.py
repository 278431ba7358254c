"""The long reliability harness: ``python -m tools.reliability [--quick]``.

Prints, per harness, the cases tried and the outcomes by kind, then the totals the issue asks
for (tracebacks, silent corruptions, lost or duplicated steps); exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .fuzz_ckpt import run_ckpt_fuzz
from .fuzz_config import run_config_fuzz
from .fuzz_data import run_data_fuzz
from .fuzz_models import KINDS as MODEL_KINDS
from .fuzz_models import run_model_fuzz
from .fuzz_resume import run_resume_fuzz
from .fuzz_tasks import KINDS as TASK_KINDS
from .fuzz_tasks import run_task_fuzz
from .kills import run_kills
from .rewards_e2e import run_reward_cases
from .signal_phases import PHASES as SIGNAL_PHASES
from .signal_phases import run_signals
from .storage import KINDS as STORAGE_KINDS
from .storage import run_storage

PARTS = ("config", "data", "ckpt", "models", "tasks", "resume", "rewards", "kills", "storage",
         "signals")


def _show(name: str, tried: int, outcomes: dict, failures: list, seconds: float) -> None:
    print(f"\n## {name}: {tried} cases in {seconds:.0f} s, {len(failures)} failures")
    for k, v in sorted(outcomes.items()):
        print(f"  {k:55s} {v}")
    for f in failures[:10]:
        print(f"  FAILURE {str(f)[:400]}")
    sys.stdout.flush()


_TITLES = {
    "storage": "storage faults on a tmpfs of its own (disk full while a checkpoint, the warm "
               "start or a metrics row is written; too small from the start; read-only at start, "
               "on resume, mid-run; run dir removed mid-run), each rerun to the end",
    "signals": "SIGTERM / SIGINT, once or twice, in every phase (build, SFT, its save, compile, "
               "held-out eval, step, checkpoint write), each rerun to the end",
}


def _case_part(part: str, run_part: Any, n: int, seed: int, work: Path, record: str | None,
               totals: dict[str, int]) -> None:
    """A harness of one record per case (storage, signals): runs it, prints, writes the record,
    counts its problems into `totals`."""
    t0 = time.time()

    def report(i: int, rec: dict) -> None:
        print(f"  {part} case {i} ({rec.get('kind') or rec.get('phase')}): {rec['outcome']} "
              f"({time.time() - t0:.0f} s)", flush=True)

    r = run_part(n, seed, work, report=report)
    _show(_TITLES[part], r.tried, r.outcomes, r.failures, time.time() - t0)
    if record:
        with open(record, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(rec) + "\n" for rec in r.records)
    problems = [x for f in r.failures for x in f[2]]
    totals["failures"] += len(r.failures)
    totals["tracebacks"] += sum("traceback" in x for x in problems)
    totals["lost_or_dup"] += sum("lost" in x or "duplicated" in x for x in problems)
    totals["silent"] += sum("differ" in x or "fallback" in x for x in problems)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.reliability", description=__doc__)
    p.add_argument("--config-cases", type=int, default=10_000)
    p.add_argument("--data-cases", type=int, default=1_200)
    p.add_argument("--ckpt-cases", type=int, default=200)
    p.add_argument("--model-cases", type=int, default=20,
                   help=f"damaged / foreign model files per kind ({len(MODEL_KINDS)} kinds)")
    p.add_argument("--model-record", help="write the model-file cases' per-case record (JSON "
                   "lines) here (docs/results/reliability_models.jsonl)")
    p.add_argument("--task-cases", type=int, default=10,
                   help=f"impossible task options per kind ({len(TASK_KINDS)} kinds)")
    p.add_argument("--task-record", help="write the task cases' per-case record (JSON lines) "
                   "here (docs/results/reliability_tasks.jsonl)")
    p.add_argument("--resume-record", help="write the changed-config resume cases' per-case "
                   "record (JSON lines) here (docs/results/reliability_resume.jsonl)")
    p.add_argument("--kills", type=int, default=24, help="kill -9 moments (at least)")
    p.add_argument("--storage-cases", type=int, default=6,
                   help=f"storage faults per kind ({len(STORAGE_KINDS)} kinds)")
    p.add_argument("--storage-record", help="write the storage cases' per-case record (JSON "
                   "lines) here (docs/results/reliability_storage.jsonl)")
    p.add_argument("--signal-cases", type=int, default=6,
                   help=f"signals per phase ({len(SIGNAL_PHASES)} phases)")
    p.add_argument("--signal-record", help="write the signal cases' per-case record (JSON "
                   "lines) here (docs/results/reliability_signals.jsonl)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", action="append", choices=PARTS, help="run only these parts")
    p.add_argument("--work", help="directory for the runs (default: a temporary one); the "
                   "logs of failed cases are kept there")
    args = p.parse_args(argv)
    parts = args.only or PARTS
    tmp = None if args.work else tempfile.TemporaryDirectory()
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RELIABILITY_JAX_CACHE", str(work / "jax_cache"))  # for the children
    totals = {"failures": 0, "tracebacks": 0, "silent": 0, "lost_or_dup": 0}
    print(f"reliability harness, seed {args.seed}, parts {', '.join(parts)}", flush=True)
    if "config" in parts:
        t0 = time.time()
        r = run_config_fuzz(args.config_cases, args.seed)
        _show("config (key=value overrides and YAML documents)", r.tried, r.outcomes,
              r.failures, time.time() - t0)
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += len(r.failures)
    if "data" in parts:
        t0 = time.time()
        r = run_data_fuzz(args.data_cases, args.seed)
        _show(f"data (JSONL / JSON array / Parquet; {r.rows} mutated rows)", r.tried,
              r.outcomes, r.failures, time.time() - t0)
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += sum("Error" in f[2].split(":")[0] for f in r.failures)
        totals["silent"] += sum("changed" in f[2] or "loaded," in f[2] for f in r.failures)
    if "ckpt" in parts:
        t0 = time.time()
        r = run_ckpt_fuzz(args.ckpt_cases, args.seed)
        _show("checkpoints (flips / truncations / deletions, every file)", r.tried,
              {**r.outcomes, **{f"by item: {k}": v for k, v in r.by_item.items()}},
              r.failures, time.time() - t0)
        totals["failures"] += len(r.failures)
        totals["silent"] += sum("wrong" in f[2] or "valid step" in f[2] for f in r.failures)
        totals["tracebacks"] += sum("Error:" in f[2] for f in r.failures)
    if "models" in parts:
        t0 = time.time()
        r = run_model_fuzz(args.model_cases, args.seed)
        _show("model files (truncated / foreign-architecture / missing-tensor GGUF; truncated, "
              "missing- and extra-tensor safetensors; tokenizer larger than the vocabulary)",
              r.tried, r.outcomes, r.failures, time.time() - t0)
        if args.model_record:
            with open(args.model_record, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(rec) + "\n" for rec in r.records)
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += sum(f[2].startswith("wrong error") for f in r.failures)
        totals["silent"] += sum("changed" in f[2] for f in r.failures)
    if "tasks" in parts:
        t0 = time.time()
        r = run_task_fuzz(args.task_cases, args.seed, work / "tasks")
        _show("task options that cannot work (unknown / misconfigured reasoning-gym datasets, "
              "weights, system prompts; prompts longer than every bucket; built-in task "
              "options)", r.tried, r.outcomes, r.failures, time.time() - t0)
        if args.task_record:
            with open(args.task_record, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(rec) + "\n" for rec in r.records)
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += sum(f[3].split(":")[0].endswith("Error") for f in r.failures)
    if "resume" in parts:
        t0 = time.time()
        r = run_resume_fuzz(work / "resume")
        _show("resume with a changed config (architecture, LoRA, dtype, rungs refused; "
              "learning rate, budget, cadences resumed)", r.tried, r.outcomes, r.failures,
              time.time() - t0)
        if args.resume_record:
            with open(args.resume_record, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(rec) + "\n" for rec in r.records)
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += sum(f[2] == 1 for f in r.failures)
    if "rewards" in parts:
        t0 = time.time()
        r = run_reward_cases(work / "rewards", root=work)
        _show("rewards in training (never returns / raises on 1 % / NaN)", r.tried,
              r.outcomes, r.failures, time.time() - t0)
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += r.tracebacks
    if "kills" in parts:
        t0 = time.time()

        def report(i: int, res) -> None:
            print(f"  kill case {i}: {res.kills} kills, {dict(res.outcomes)} "
                  f"({time.time() - t0:.0f} s)", flush=True)

        r = run_kills(args.kills, args.seed, work / "kills", report=report)
        _show(f"kills (kill -9, {r.kills} kills; resumes vs an uninterrupted run of "
              f"{r.ref_seconds:.0f} s)", r.tried,
              {**r.outcomes, **{f"killed at: {k}": v for k, v in r.phases.items()}},
              r.failures, time.time() - t0)
        print(f"  network accesses {r.network}")
        totals["failures"] += len(r.failures)
        totals["tracebacks"] += r.tracebacks
        totals["lost_or_dup"] += sum(any("lost" in x or "duplicated" in x for x in f[2])
                                     for f in r.failures)
        totals["silent"] += sum(any("differ" in x for x in f[2]) for f in r.failures)
    for part, run_part, n, record in (
            ("storage", run_storage, args.storage_cases, args.storage_record),
            ("signals", run_signals, args.signal_cases, args.signal_record)):
        if part in parts:
            _case_part(part, run_part, n, args.seed, work / part, record, totals)
    print(f"\nTOTAL: {totals['failures']} failed cases, {totals['tracebacks']} tracebacks, "
          f"{totals['silent']} silent corruptions, {totals['lost_or_dup']} lost or duplicated "
          "steps")
    if tmp is not None:
        tmp.cleanup()
    return 1 if totals["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
