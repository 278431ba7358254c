"""One fault at an exact moment of a real `sagc-jax train` run (storage and signal harnesses).

Child side: `python -m tools.reliability.inject train ARGS...` runs `sagc_jax.cli.entry`
with one function of the run wrapped, named by `$RELIABILITY_FAULT` (JSON, `Fault`): on the
`nth` call of that function (`TARGETS`) the action fires, `delay` seconds after the call began
(in a timer thread, so the function is running) or before it when `delay` is 0. What fired, and
whether the function was still running then, is appended to `$RELIABILITY_FAULT_LOG`.

Wrapping the run's own functions, rather than polling its files from outside, puts the fault in
the phase it names every time (a 10 ms SFT warm start or eval cannot be hit by a clock).

Parent side: `run_child` starts such a child and returns a `Child` (exit code, last stderr line,
traceback seen, what fired).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .cases import Result

# target -> (module, attribute[, method]) of the function wrapped.
TARGETS: dict[str, tuple[str, str, str | None]] = {
    "build": ("sagc_jax.train.loop", "build_run", None),
    "sft": ("sagc_jax.train.start", "sft_warm_start", None),
    "compile": ("sagc_jax.train.loop", "warm_up", None),
    "eval": ("sagc_jax.train.loop", "eval_greedy", None),
    "step": ("sagc_jax.train.loop", "train_one", None),
    "save": ("sagc_jax.checkpoint", "RunCheckpointer", "save"),
    "save_initial": ("sagc_jax.checkpoint", "RunCheckpointer", "save_initial"),
    "write": ("sagc_jax.metrics", "RunWriter", "write"),
}


@dataclass
class Fault:
    """What to do, and when. Actions: `signal` (`signum`, sent `count` times `gap` s apart),
    `fill` (the filesystem of `path` filled to `slack` free bytes by a ballast file `ballast`),
    `readonly` (a read-only bind mount over `path`), `remove` (`path` deleted), `kill` (SIGKILL
    to the run itself)."""

    target: str
    nth: int = 1
    delay: float = 0.0
    action: str = "signal"
    signum: int = signal.SIGTERM
    count: int = 1
    gap: float = 0.05
    path: str = ""
    ballast: str = ""
    slack: int = 0


def fill(path: str, ballast: str, slack: int) -> int:
    """Writes `ballast` until `path`'s filesystem has `slack` bytes free; returns its size."""
    st = os.statvfs(path)
    size = max(st.f_bavail * st.f_frsize - slack, 0)
    written = 0
    with open(ballast, "wb") as f:
        while written < size:
            n = min(1 << 20, size - written)
            try:
                f.write(b"\0" * n)
                f.flush()
            except OSError:  # tmpfs rounds to pages: the last partial chunk may not fit
                break
            written += n
    return written


def _act(fault: Fault, log: Path, inside: list[int]) -> None:
    record = {"target": fault.target, "nth": fault.nth, "action": fault.action,
              "inside": inside[0] > 0}
    try:
        if fault.action == "signal":
            for i in range(fault.count):
                if i:
                    time.sleep(fault.gap)
                os.kill(os.getpid(), fault.signum)
        elif fault.action == "fill":
            record["ballast_bytes"] = fill(fault.path, fault.ballast, fault.slack)
        elif fault.action == "readonly":
            r = subprocess.run(["mount", "--bind", "-o", "ro", fault.path, fault.path],
                               capture_output=True, text=True)
            record["mount"] = r.returncode
        elif fault.action == "remove":
            shutil.rmtree(fault.path, ignore_errors=True)
        elif fault.action == "kill":
            with log.open("a") as f:
                f.write(json.dumps(record) + "\n")
            os.kill(os.getpid(), signal.SIGKILL)
    finally:
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _wrap(fn: Any, fault: Fault, log: Path) -> Any:
    calls, inside = [0], [0]

    def wrapper(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == fault.nth:
            if fault.delay > 0:
                threading.Timer(fault.delay, _act, (fault, log, inside)).start()
            else:
                _act(fault, log, [1])
        inside[0] += 1
        try:
            return fn(*args, **kw)
        finally:
            inside[0] -= 1

    return wrapper


def install(fault: Fault, log: Path) -> None:
    """Wraps the target function in its module (the loop looks its phases up there)."""
    import importlib

    module, attr, method = TARGETS[fault.target]
    owner = importlib.import_module(module)
    if method is None:
        setattr(owner, attr, _wrap(getattr(owner, attr), fault, log))
    else:
        cls = getattr(owner, attr)
        setattr(cls, method, _wrap(getattr(cls, method), fault, log))


# ------------------------------------------------------------------------------ parent side
@dataclass
class Child:
    """A finished child run: exit code, last line of stderr, whether a traceback (or a
    network access) appeared, and what fired (the records of `_act`)."""

    code: int
    last_line: str
    traceback: bool
    fired: list[dict[str, Any]]
    timed_out: bool = False


def run_child(argv: list[str], env: dict[str, str], log: Path, fault: Fault | None,
              cwd: Path, timeout: float = 300) -> Child:
    """Runs `python -m tools.reliability.inject ARGV` with `fault`; logs to `log`
    (stdout) and `log`.err (stderr, appended). A run still going after `timeout` s (a tiny run
    takes ~10 s) is a hang: killed, and `timed_out` set."""
    fired_log = log.with_suffix(".fired")
    fired_log.unlink(missing_ok=True)
    env = dict(env, RELIABILITY_FAULT_LOG=str(fired_log))
    env.pop("RELIABILITY_FAULT", None)
    if fault is not None:
        env["RELIABILITY_FAULT"] = json.dumps(asdict(fault))
    err = log.with_suffix(".err")
    start = err.stat().st_size if err.exists() else 0
    with log.open("ab") as out, err.open("ab") as errf:
        proc = subprocess.Popen([sys.executable, "-m", "tools.reliability.inject", *argv],
                                env=env, stdout=out, stderr=errf, cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code, timed_out = proc.wait(), True
    text = err.read_bytes()[start:].decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    fired = [json.loads(ln) for ln in fired_log.read_text().splitlines()] \
        if fired_log.exists() else []
    return Child(code=code, last_line=lines[-1] if lines else "",
                 traceback="Traceback (most recent call last)" in text
                 or "NETWORK ACCESS" in text, fired=fired, timed_out=timed_out)


def run_cases(groups: tuple[str, ...], n_per_group: int, argv: Any, work: Path,
              case: Any, report: Any = None) -> Result:
    """The harnesses' shared driver: one uninterrupted reference run (``argv(run_dir)``), then
    ``n_per_group`` cases of each group, ``case(i, group, j, ref, env) -> record`` (a dict with
    ``outcome`` and ``problems``), tallied into a :class:`Result`."""
    from .kills import ROOT, child_env  # parent side only: the child never imports it

    res = Result()
    work.mkdir(parents=True, exist_ok=True)
    env = child_env(work)
    ref = work / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    child = run_child(argv(ref), env, work / "reference.log", None, ROOT)
    if child.code != 0:
        raise RuntimeError(f"reference run exited {child.code}: {child.last_line}")
    i = 0
    for group in groups:
        for j in range(n_per_group):
            rec = case(i, group, j, ref, env)
            res.tried += 1
            res.outcomes[f"{group}: {rec['outcome']}"] += 1
            res.records.append(rec)
            if rec["problems"]:
                res.failures.append((i, group, rec["problems"]))
            if report is not None:
                report(i, rec)
            i += 1
    return res


def main(argv: list[str]) -> None:
    from sagc_jax.hostmem import computes_on_cpu, keep_freed_memory

    if computes_on_cpu():  # as the CLI does, before the imports below start JAX's threads
        keep_freed_memory()
    spec = os.environ.get("RELIABILITY_FAULT")
    if spec:
        install(Fault(**json.loads(spec)), Path(os.environ["RELIABILITY_FAULT_LOG"]))
    from sagc_jax.cli import entry

    entry(argv)  # as the `sagc-jax` program: main, then exit (quietly after a failure)


if __name__ == "__main__":
    main(sys.argv[1:])
