"""Storage faults: a short training run on a small filesystem the harness mounts itself (tmpfs,
one per case), which fills up, turns read-only or loses the run directory at an exact moment.

Kinds (`KINDS`, each case seeded `<seed>/<kind>/<i>`):
  full-save      the filesystem filled (0-200 KB left) as the n-th step checkpoint is written
  full-metrics   filled (0-600 bytes left) as the n-th metrics row is appended (a row cut short)
  full-initial   filled as the SFT warm start is saved (checkpoints/initial)
  small-disk     a filesystem of 0.1-3 MB from the start (the space pre-check, or a full disk)
  still-full     full-save, then a rerun on the still-full disk (must lose nothing), then one
                 with space
  ro-start       a fresh run on a read-only filesystem (run dir absent or empty)
  ro-resume      a run killed (SIGKILL) after its n-th row, its filesystem then remounted
                 read-only, and resumed
  ro-mid         the run dir made read-only (a read-only bind mount over it) as the n-th
                 checkpoint is written or the n-th row appended
  removed        the run dir deleted as the n-th checkpoint is written, row appended or step runs
Then the cause is removed (ballast deleted, remounted read-write, a bigger size) and the same
command rerun to the end. A case passes when the faulted run either finished or stopped with
exit 1 or 2, no traceback and a last stderr line that names the run dir or the mount; every
rerun on a still-broken disk stopped the same way and lost no metrics row or checkpoint; and
the final run's metrics rows, steps 1..8 (once each) and final params equal an uninterrupted
reference run's (`kills.outcome`), with no checkpoint fallback (a checkpoint that fails its
checksum is refused or fallen back from, and any fallback here would be a valid step lost).
Where mounting is not allowed every case is recorded as skipped, with the reason.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .cases import Result
from .inject import Fault, fill, run_cases, run_child
from .kills import ROOT, STEPS, TINY, outcome

KINDS = ("full-save", "full-metrics", "full-initial", "small-disk", "still-full", "ro-start",
         "ro-resume", "ro-mid", "removed")
MB = 1 << 20


def _sh(*cmd: str) -> str | None:
    """Runs a mount command; None on success, else its error."""
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[0]


def mount_tmpfs(path: Path, size: int) -> str | None:
    """Mounts a tmpfs of `size` bytes at `path`; None, or why it could not."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        return _sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    except OSError as e:  # no mount binary
        return str(e)


def unmount_all(path: Path) -> None:
    """Unmounts `path` and anything mounted under it (bind mounts first)."""
    for _ in range(4):
        mounted = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()
                   if ln.split()[1] == str(path) or ln.split()[1].startswith(f"{path}/")]
        if not mounted:
            return
        for m in sorted(mounted, key=len, reverse=True):
            _sh("umount", m)


def _argv(run_dir: Path) -> list[str]:
    return ["train", *TINY, f"run.dir={run_dir}", f"run.steps={STEPS}"]


def _state(run_dir: Path) -> tuple[list[str], list[str]]:
    """(metrics rows up to the newest saved step, finished checkpoint entries): what a failed
    rerun must keep. Rows past the newest checkpoint are not kept by design (the
    resume recomputes them), nor are Orbax's unfinished `*tmp*` step directories."""
    ck = run_dir / "checkpoints"
    names = sorted(p.name for p in ck.iterdir() if "tmp" not in p.name) if ck.is_dir() else []
    newest = max((int(n) for n in names if n.isdigit()), default=0)
    m = run_dir / "metrics.jsonl"
    rows = []
    for line in (m.read_text(errors="replace").splitlines() if m.exists() else []):
        try:
            if json.loads(line).get("step", 0) <= newest:
                rows.append(line)
        except ValueError:
            continue
    return rows, names


def _fault(kind: str, rng: random.Random, mnt: Path, run_dir: Path) -> Fault | None:
    ballast = str(mnt / "ballast")
    if kind in ("full-save", "still-full"):
        return Fault("save", nth=rng.randint(1, STEPS), action="fill", path=str(mnt),
                     ballast=ballast, slack=rng.randrange(0, 200_000))
    if kind == "full-metrics":
        return Fault("write", nth=rng.randint(1, STEPS), action="fill", path=str(mnt),
                     ballast=ballast, slack=rng.randrange(0, 600))
    if kind == "full-initial":
        return Fault("save_initial", action="fill", path=str(mnt), ballast=ballast,
                     slack=rng.randrange(0, 300_000))
    if kind == "ro-resume":
        return Fault("write", nth=rng.randint(2, STEPS), action="kill",
                     delay=rng.choice([0.0, 0.02]))
    if kind == "ro-mid":
        return Fault(rng.choice(["save", "write"]), nth=rng.randint(1, STEPS),
                     action="readonly", path=str(run_dir), delay=rng.choice([0.0, 0.01]))
    if kind == "removed":
        return Fault(rng.choice(["save", "write", "step"]), nth=rng.randint(1, STEPS),
                     action="remove", path=str(run_dir), delay=rng.choice([0.0, 0.02]))
    return None


def _judge(child: Any, names: tuple[str, ...]) -> str | None:
    """None when a faulted run ended as documented, else what is wrong."""
    if child.timed_out:
        return "hung: killed after the timeout"
    if child.traceback:
        return f"traceback (exit {child.code})"
    if child.code == 0:
        return None
    if child.code not in (1, 2):
        return f"exit {child.code}: {child.last_line[:200]}"
    if not child.last_line.startswith("sagc-jax train:") or not any(
            n in child.last_line for n in names):
        return f"last line names no path: {child.last_line[:300]}"
    return None


def storage_case(i: int, kind: str, seed: int, work: Path, ref: Path,
                 env: dict[str, str]) -> dict[str, Any]:
    """One case (see the module docstring): its record, with `problems` empty when it passed."""
    rng = random.Random(f"{seed}/{kind}/{i}")
    case = work / f"case{i}"
    mnt, log = case / "mnt", case / "run.log"
    unmount_all(mnt)
    shutil.rmtree(case, ignore_errors=True)
    size = rng.randrange(100_000, 3 * MB) if kind == "small-disk" else 32 * MB
    rec: dict[str, Any] = {"case": i, "kind": kind, "seed": f"{seed}/{kind}/{i}",
                           "fs_bytes": size}
    why = mount_tmpfs(mnt, size)
    if why is not None:
        return {**rec, "outcome": f"skipped: cannot mount a tmpfs ({why})", "problems": []}
    run_dir = mnt / "run"
    names = (str(run_dir), str(mnt))
    problems: list[str] = []
    try:
        fault = _fault(kind, rng, mnt, run_dir)
        if kind == "ro-start":
            if rng.random() < 0.5:
                run_dir.mkdir()
            _sh("mount", "-o", "remount,ro", str(mnt))
        rec["fault"] = None if fault is None else {k: v for k, v in vars(fault).items()
                                                  if k in ("target", "nth", "delay", "slack")}
        first = run_child(_argv(run_dir), env, log, fault, ROOT)
        rec.update(exit_code=first.code, last_line=first.last_line, fired=first.fired)
        if (first.code != -9 or first.timed_out) and (bad := _judge(first, names)):
            problems.append(f"faulted run: {bad}")
        if kind in ("ro-resume", "still-full"):  # a rerun while the disk is still broken
            if kind == "ro-resume":
                _sh("mount", "-o", "remount,ro", str(mnt))
            before = _state(run_dir)
            again = run_child(_argv(run_dir), env, log, None, ROOT)
            rec.update(broken_rerun_exit=again.code, broken_rerun_line=again.last_line)
            if again.code == 0 or (bad := _judge(again, names)):
                problems.append(f"rerun on the broken disk: exit {again.code}, {bad}")
            after = _state(run_dir)
            # It may get further (a partial step directory freed), never lose what was saved.
            if after[0][:len(before[0])] != before[0] or not set(before[1]) <= set(after[1]):
                problems.append(f"the rerun on the broken disk lost rows or checkpoints: "
                                f"{len(before[0])} -> {len(after[0])} rows, "
                                f"{before[1]} -> {after[1]}")
        _recover(kind, mnt, run_dir)
        final = run_child(_argv(run_dir), env, log, None, ROOT)
        if kind == "removed" and final.code == 2 and "move it aside" in final.last_line:
            # Checkpoints recreated under a removed run dir, without the rows before them:
            # refused as documented; moved aside, the rerun starts again.
            rec["refused_line"] = final.last_line
            shutil.move(run_dir, mnt / "run.aside")
            final = run_child(_argv(run_dir), env, log, None, ROOT)
        rec.update(final_exit=final.code)
        if final.code != 0 or final.traceback or final.timed_out:
            problems.append(f"rerun exit {final.code}{' (hung)' if final.timed_out else ''}: "
                            f"{final.last_line[:300]}")
        else:
            problems += outcome(run_dir, ref)
            fallbacks = log.with_suffix(".err").read_text(errors="replace").count(
                "falling back to the previous one")
            if fallbacks:
                problems.append(f"{fallbacks} checkpoint fallback(s)")
        rec["resumed_identical"] = not problems
    finally:
        unmount_all(mnt)
    rec["outcome"] = _outcome(rec, problems)
    rec["problems"] = problems
    if not problems:
        shutil.rmtree(case, ignore_errors=True)
    return rec


def _recover(kind: str, mnt: Path, run_dir: Path) -> None:
    """Removes the fault's cause: the ballast, the read-only mounts, the size limit."""
    if kind == "ro-mid":
        with contextlib.suppress(Exception):
            _sh("umount", str(run_dir))
    if kind in ("ro-start", "ro-resume"):
        _sh("mount", "-o", "remount,rw", str(mnt))
    (mnt / "ballast").unlink(missing_ok=True)
    if kind == "small-disk":
        _sh("mount", "-o", f"remount,size={32 * MB}", str(mnt))


def _outcome(rec: dict[str, Any], problems: list[str]) -> str:
    if problems:
        return "failure"
    code = rec.get("exit_code")
    how = "finished (the fault did not bite)" if code == 0 else \
        "killed" if code == -9 else f"stopped, exit {code}, one line"
    return f"{how}; resumed identical"


def run_storage(n_per_kind: int, seed: int, work: Path, kinds: tuple[str, ...] = KINDS,
                report: Any = None) -> Result:
    """`n_per_kind` cases of each kind against one uninterrupted reference run."""
    return run_cases(kinds, n_per_kind, _argv, work, report=report,
                     case=lambda i, kind, _j, ref, env: storage_case(i, kind, seed, work, ref,
                                                                      env))


__all__ = ["KINDS", "fill", "run_storage", "storage_case"]
