"""Resuming with a changed config: a run trained 2 steps, then the same `run.dir` restarted for 3
steps with one setting changed.

A change the checkpoint cannot serve (another architecture, LoRA on/off or another rank,
other rungs, a dtype) must be refused before step 3 with one line naming the key, exit 2, the
run directory untouched (its `config.yaml` and checkpoints as they were). A change a run may take
(learning rate, budget, cadences, more steps) must resume and finish step 3. Anything else
(exit 1, a traceback, a refused harmless change, an accepted harmful one) is a failure. Each
case runs `sagc_jax.cli.main(["train", ...])` in this process on a copy of the 2-step run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
from pathlib import Path

from .cases import Result

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tiny_cpu.yaml"
BASE = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=arith_short", "data.task_max_steps=3",
    "data.prompts_per_step=4", "sagc.group_sizes=[2,4]", "sagc.initial_group_size=4",
    "sagc.timing=model", "sampling.max_new_tokens=16", "sampling.prompt_buckets=[16]",
    "sampling.decode_chunk=8", "init.sft_steps=0", "checkpoint.every=1", "checkpoint.keep=5",
    "run.progress=false", "run.plots=false", "run.eval_every=0", "checkpoint.async_save=false",
]
# (change, must it be refused?) — refusals must name the key's section.
CASES: tuple[tuple[str, bool], ...] = (
    ("model.hidden_size=48", True), ("model.num_layers=3", True), ("model.num_heads=4", True),
    ("model.intermediate_size=96", True), ("model.num_kv_heads=2", True),
    ("model.lora={rank: 4, alpha: 8.0}", True), ("model.tie_word_embeddings=false", True),
    ("sagc.group_sizes=[2,4,8]", True), ("sagc.group_sizes=[4]", True),
    ("sagc.group_sizes=[4,8]", True),  # same count: would reinterpret per-rung statistics
    ("model.param_dtype=bfloat16", True),
    ("optim.lr=3e-4", False), ("sagc.delta=0.05", False), ("checkpoint.every=2", False),
    ("checkpoint.keep=2", False), ("run.log_every=2", False), ("sagc.V=0.5", False),
    ("optim.max_grad_norm=0.5", False), ("algo.epsilon=0.1", False),
    ("sampling.temperature=0.8", False), ("sagc.half_life=50", False),
)


def _digest(run_dir: Path) -> str:
    """Hash of config.yaml and the checkpoint files (what a refusal must leave untouched)."""
    h = hashlib.sha256()
    for p in sorted([run_dir / "config.yaml", *(run_dir / "checkpoints").rglob("*")]):
        if p.is_file():
            h.update(str(p.relative_to(run_dir)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _train(run_dir: Path, extra: list[str]) -> tuple[int, str]:
    from sagc_jax.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "--config", str(CONFIG), *BASE, f"run.dir={run_dir}", *extra])
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("sagc-jax")]
    return code, lines[-1] if lines else err.getvalue().strip()[-300:]


def run_resume_fuzz(work: Path, cases: tuple[tuple[str, bool], ...] = CASES) -> Result:
    """Every case on a copy of one 2-step run."""
    res = Result()
    base = work / "base"
    code, line = _train(base, ["run.steps=2"])
    if code != 0:
        raise RuntimeError(f"the 2-step base run failed: {line}")
    for i, (change, refuse) in enumerate(cases):
        run_dir = work / f"case{i}"
        shutil.copytree(base, run_dir)
        (run_dir / ".lock").unlink(missing_ok=True)
        before = _digest(run_dir)
        code, line = _train(run_dir, ["run.steps=3", change])
        section = change.split(".")[0]
        steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
        if refuse:
            ok = code == 2 and "\n" not in line and section in line and _digest(run_dir) == before
            outcome = "refused, one line, run dir untouched" if ok else f"exit {code}"
        else:
            ok = code == 0 and steps == 3
            outcome = "resumed to step 3" if ok else f"exit {code}, {steps} steps"
        res.tried += 1
        res.outcomes[f"{'must refuse' if refuse else 'may resume'}: {outcome}"] += 1
        res.records.append({"case": i, "change": change, "must_refuse": refuse,
                            "outcome": outcome, "exit_code": code, "line": line,
                            "metrics_rows": steps})
        if not ok:
            res.failures.append((i, change, code, line))
        shutil.rmtree(run_dir, ignore_errors=True)
    return res
