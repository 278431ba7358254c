"""Kill harness: `kill -9` a short training run at random moments, resume it with the same
command, and compare with an uninterrupted run.

Each case starts a fresh run dir, kills the run (its whole process group, SIGKILL) at a moment
drawn from one of these kinds, then reruns the command until it exits 0 (sometimes killing a
resume too):
  time        uniformly at random in [0, the reference run's duration]: start-up, the SFT warm
              start, compiling, steps and saves, in proportion to how long each takes;
  step        0-0.6 s after the n-th metrics row appeared (mid-step, or its save);
  save        the moment an Orbax temporary step directory appears (mid-save);
  quarantine  the newest checkpoint of a finished-up-to-k run is damaged, the resume (which
              falls back and moves it aside) is killed early, and resumed again.
A case passes when the final metrics rows (timing columns left out) equal the reference's, every
step 1..N appears exactly once in metrics.jsonl and trace.jsonl, and the final params are
bitwise equal.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
# The tiny run of tests/test_trainer.py: a ~60k-param model, SAGC moving G between 2 and 4,
# `sagc.timing=model` so resumed runs can be compared exactly.
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=arith_short", "data.task_max_steps=3",
    "data.prompts_per_step=4", "sagc.group_sizes=[2,4]", "sagc.initial_group_size=4",
    "sagc.warmup_steps=1", "sagc.timing=model", "sampling.max_new_tokens=32",
    "sampling.prompt_buckets=[16]", "sampling.decode_chunk=8", "init.sft_steps=8",
    "init.sft_batch_size=8", "optim.lr=1e-3", "optim.warmup_steps=0", "checkpoint.every=1",
    "checkpoint.keep=10", "run.progress=false", "run.plots=false",
]


def command(run_dir: Path, steps: int = STEPS) -> list[str]:
    return [sys.executable, "-m", "sagc_jax.cli", "train", *TINY, f"run.dir={run_dir}",
            f"run.steps={steps}"]


# Imported first by every child (PYTHONPATH): any TCP/UDP connect is refused and reported, so
# each run also shows that training reaches for no network.
NO_NETWORK = """
import socket, sys
def _refuse(self, address, *a):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        sys.stderr.write(f"NETWORK ACCESS {address}\\n")
        raise OSError("network access blocked by the reliability harness")
    return _connect(self, address, *a)
_connect = socket.socket.connect
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
"""


def child_env(work: Path, extra_path: str = "") -> dict[str, str]:
    """Environment of the harness's training runs: one CPU device, the HF hub left to the CLI
    (which turns it offline), sockets refused (`NO_NETWORK`), and a persistent compilation
    cache shared by all runs (identical executables, so identical numbers, compiled once):
    `$RELIABILITY_JAX_CACHE`, else `work/jax_cache`."""
    site = work / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_NETWORK)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONUNBUFFERED="1",
               JAX_COMPILATION_CACHE_DIR=os.environ.get("RELIABILITY_JAX_CACHE",
                                                        str(work / "jax_cache")),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(ROOT), extra_path,
                                                     env.get("PYTHONPATH", "")) if p)
    return env


def _start(run_dir: Path, log: Path, extra: tuple[str, ...] = (), pythonpath: str = "",
           root: Path | None = None) -> subprocess.Popen:
    fh = open(log, "ab")  # noqa: SIM115 - the child writes to it; closed with the process
    env = child_env(root or run_dir.parent, pythonpath)
    return subprocess.Popen([*command(run_dir), *extra], env=env,
                            stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_to_end(run_dir: Path, log: Path, timeout: float = 1200, extra: tuple[str, ...] = (),
               pythonpath: str = "", root: Path | None = None) -> int:
    """Runs the command (plus `extra` overrides; `pythonpath` prepended; `root`: where the
    compilation cache lives, default the run dir's parent) to completion; its exit code."""
    proc = _start(run_dir, log, extra, pythonpath, root)
    try:
        return proc.wait(timeout=timeout)
    finally:
        _kill(proc)


def _phase(run_dir: Path) -> str:
    """What the run was doing when killed, from what it had written."""
    ck = run_dir / "checkpoints"
    if any("tmp" in p.name for p in ck.glob("*")) if ck.is_dir() else False:
        return "mid-save"
    if not (ck / "initial.checksums.json").exists():
        return "start-up/SFT"
    metrics = run_dir / "metrics.jsonl"
    n = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    return "compile" if n == 0 else "mid-step"


def _kill_at_time(run_dir: Path, log: Path, delay: float) -> str:
    proc = _start(run_dir, log)
    try:
        proc.wait(timeout=delay)
        return "finished"  # it ended before the moment
    except subprocess.TimeoutExpired:
        phase = _phase(run_dir)
        _kill(proc)
        return phase


def _kill_on_save(run_dir: Path, log: Path, nth: int, timeout: float = 1200) -> str:
    """Kills the run the moment its `nth` temporary step directory appears."""
    proc = _start(run_dir, log)
    ck, seen, deadline = run_dir / "checkpoints", set(), time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            tmp = {p.name for p in ck.glob("*tmp*")} if ck.is_dir() else set()
            seen |= tmp
            if len(seen) >= nth and tmp:
                os.killpg(proc.pid, signal.SIGKILL)
                return "mid-save"
            time.sleep(0.005)
        return "finished"
    finally:
        _kill(proc)


def _kill_in_step(run_dir: Path, log: Path, nth: int, delay: float,
                  timeout: float = 1200) -> str:
    """Kills the run `delay` seconds after its `nth` metrics row appeared (inside step nth+1,
    or its save)."""
    proc = _start(run_dir, log)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= nth:
                try:
                    proc.wait(timeout=delay)
                    return "finished"
                except subprocess.TimeoutExpired:
                    phase = _phase(run_dir)
                    os.killpg(proc.pid, signal.SIGKILL)
                    return phase
            time.sleep(0.005)
        return "finished"
    finally:
        _kill(proc)


def _damage_newest(run_dir: Path) -> int:
    """Inverts 200 bytes of the newest step's largest params file (so it fails its checksum
    or decoding); returns that step."""
    ck = run_dir / "checkpoints"
    step = max(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    big = max((p for p in (ck / str(step) / "params").rglob("*") if p.is_file()),
              key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    for j in range(len(data) // 2, min(len(data) // 2 + 200, len(data))):
        data[j] ^= 0xFF
    big.write_bytes(bytes(data))
    return step


def _kill_after_quarantine(run_dir: Path, log: Path, delay: float | None,
                           timeout: float = 1200) -> str:
    """Resumes a damaged run and kills it as soon as the damaged step has been moved aside
    (`delay` None) or after `delay` seconds."""
    proc = _start(run_dir, log)
    ck, t0 = run_dir / "checkpoints", time.time()
    try:
        while proc.poll() is None and time.time() < t0 + timeout:
            moved = any(".corrupt-" in p.name for p in ck.iterdir())
            if (delay is None and moved) or (delay is not None and time.time() > t0 + delay):
                os.killpg(proc.pid, signal.SIGKILL)
                return "after quarantine" if moved else "before quarantine"
            time.sleep(0.005)
        return "finished"
    finally:
        _kill(proc)


def outcome(run_dir: Path, ref_dir: Path) -> list[str]:
    """Problems of a finished run vs the reference (empty: identical)."""
    from sagc_jax.metrics import TIMING_KEYS, read_jsonl

    problems = []
    rows = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    if sorted(set(steps)) != list(range(1, STEPS + 1)):
        problems.append(f"lost steps: {sorted(set(range(1, STEPS + 1)) - set(steps))}")
    if len(steps) != len(set(steps)):
        problems.append(f"duplicated steps: {sorted(s for s in set(steps) if steps.count(s) > 1)}")
    trace = [r["step"] for r in read_jsonl(run_dir / "trace.jsonl")]
    if trace != list(range(1, STEPS + 1)) and trace != list(range(STEPS)):
        problems.append(f"trace steps {trace}")

    def strip(rs: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rs]

    if not problems and strip(rows) != strip(read_jsonl(ref_dir / "metrics.jsonl")):
        problems.append("metrics differ from the uninterrupted run")
    if not _params_equal(run_dir, ref_dir):
        problems.append("final params differ from the uninterrupted run")
    return problems


def _final_params(run_dir: Path) -> tuple[int, dict]:
    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager(run_dir / "checkpoints")
    try:
        step = mngr.latest_step()
        got = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    finally:
        mngr.close()
    return step, ocp.tree.to_flat_dict(got["params"])


def _params_equal(a: Path, b: Path) -> bool:
    sa, pa = _final_params(a)
    sb, pb = _final_params(b)
    return sa == sb and pa.keys() == pb.keys() and all(
        np.array_equal(np.asarray(pa[k]), np.asarray(pb[k])) for k in pa)


@dataclass
class KillResult:
    """Counts of a kill run; `failures` holds (case, how it was killed, problems)."""

    tried: int = 0
    kills: int = 0
    tracebacks: int = 0
    network: int = 0
    phases: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str, list[str]]] = field(default_factory=list)
    ref_seconds: float = 0.0


def _kill_once(kind: str, run_dir: Path, log: Path, ref_s: float, rng: random.Random) -> str:
    if kind == "save":
        return _kill_on_save(run_dir, log, nth=rng.randrange(1, STEPS + 1))
    if kind == "step":
        return _kill_in_step(run_dir, log, nth=rng.randrange(1, STEPS),
                             delay=rng.uniform(0, 0.6))
    if kind == "quarantine":
        # A run killed somewhere in its steps, its newest checkpoint then damaged.
        while True:
            phase = _kill_at_time(run_dir, log, rng.uniform(0.5, 0.95) * ref_s)
            ck = run_dir / "checkpoints"
            steps = [p for p in ck.iterdir() if p.name.isdigit()] if ck.is_dir() else []
            if phase == "finished" or len(steps) >= 2:
                break
        _damage_newest(run_dir)
        return "quarantine: " + _kill_after_quarantine(
            run_dir, log, None if rng.random() < 0.5 else rng.uniform(0, 0.5 * ref_s))
    return _kill_at_time(run_dir, log, rng.uniform(0, 0.9 * ref_s))


def kill_case(i: int, kind: str, work: Path, ref_dir: Path, ref_s: float,
              rng: random.Random, res: KillResult) -> None:
    """One case: kill (a resume too, sometimes), resume to the end, compare."""
    run_dir = work / f"case{i}"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = work / f"case{i}.log"
    phase = _kill_once(kind, run_dir, log, ref_s, rng)
    res.kills += phase != "finished"
    res.phases[phase] += 1
    if phase != "finished" and rng.random() < 0.3:  # kill the resume too
        again = _kill_at_time(run_dir, log, rng.uniform(0, ref_s))
        res.kills += again != "finished"
        res.phases[f"resume: {again}"] += 1
    code = run_to_end(run_dir, log)
    res.tried += 1
    text = log.read_text(errors="replace")
    res.tracebacks += text.count("Traceback (most recent call last)")
    res.network += text.count("NETWORK ACCESS")
    if code != 0:
        res.failures.append((i, phase, [f"resume exited {code} (log {log})"]))
        res.outcomes["failure"] += 1
        return
    problems = outcome(run_dir, ref_dir)
    if "Traceback (most recent call last)" in text or "NETWORK ACCESS" in text:
        problems.append(f"a traceback or a network access in {log}")
    # Only the step damaged on purpose may be fallen back past (once): any other fallback
    # would be a valid checkpoint moved aside.
    fallbacks = text.count("falling back to the previous one")
    if fallbacks > (1 if kind == "quarantine" else 0):
        problems.append(f"{fallbacks} checkpoint fallback(s) in {log}")
    if problems:
        res.failures.append((i, phase, problems))
    res.outcomes["failure" if problems else "identical"] += 1
    if not problems:
        shutil.rmtree(run_dir, ignore_errors=True)
        log.unlink()


def run_kills(n: int, seed: int = 0, work: Path | None = None,
              kinds: tuple[str, ...] = ("time", "step", "save", "quarantine"),
              report: Any = None) -> KillResult:
    """Cases (kinds cycled) until `n` kills were made (at most 2n cases), against one
    uninterrupted reference run."""
    import tempfile

    rng = random.Random(seed)
    res = KillResult()
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory()
        work = Path(tmp.name)
    try:
        work.mkdir(parents=True, exist_ok=True)
        ref = work / "reference"
        shutil.rmtree(ref, ignore_errors=True)
        code = run_to_end(ref, work / "reference.log")
        if code != 0:
            raise RuntimeError(f"reference run exited {code}; see {work / 'reference.log'}")
        # A second, uninterrupted run with the compilation cache warm: the clock of the kill
        # moments (what every resume costs), and a check that two plain runs agree.
        t0 = time.time()
        again = work / "reference_again"
        shutil.rmtree(again, ignore_errors=True)
        code = run_to_end(again, work / "reference_again.log")
        res.ref_seconds = time.time() - t0
        if code != 0 or outcome(again, ref):
            raise RuntimeError(f"two uninterrupted runs differ: {outcome(again, ref)}")
        i = 0
        while res.kills < n and i < 2 * n:
            kill_case(i, kinds[i % len(kinds)], work, ref, res.ref_seconds, rng, res)
            if report is not None:
                report(i, res)
            i += 1
    finally:
        if tmp is not None:
            tmp.cleanup()
    return res
