"""Signals in every phase: SIGTERM or SIGINT (once, or twice: the hard stop) delivered while a
short training run is in a given phase, then the same command rerun to the end and compared
with an uninterrupted run.

Phases (`PHASES`: the function of the run the signal is sent inside, `inject.TARGETS`): building
the run (model, data, tokenizer), the SFT warm start, saving it (`checkpoints/initial`), the
compile warm-up, a held-out eval (before GRPO or at a step), a step, a step's checkpoint write.
The signal is sent by the run to itself from a timer thread `delay` seconds after the phase's
`nth` call began (drawn per case), so it arrives while that phase runs — whether it still did is
recorded (`inside`). Each case is seeded `<seed>/<phase>/<i>`.

A case passes when the signalled run ended with 128 + signum (130 SIGINT, 143 SIGTERM) and a last
stderr line `sagc-jax train: stopped ...` saying where (or 0, when the signal came after the last
safe point of a finished run), no traceback; and the rerun finished with metrics rows, steps 1..8
(once each) and final params equal to the uninterrupted run's (`kills.outcome`), no checkpoint
fallback (a hard stop must leave the last saved checkpoint valid, or a partial one Orbax
ignores).
"""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path
from typing import Any

from .cases import Result
from .inject import Fault, run_cases, run_child
from .kills import ROOT, STEPS, TINY, outcome

# Held-out evals on (before GRPO, after steps 4 and 8), so the eval phase exists.
EXTRA = ("run.eval_every=4", "data.num_eval=16")
# phase -> (calls a run makes, largest delay in s: about the phase's length on 2 CPU cores)
PHASES: dict[str, tuple[int, float]] = {
    "build": (1, 1.0), "sft": (1, 0.3), "save_initial": (1, 0.05), "compile": (1, 2.0),
    "eval": (3, 0.1), "step": (STEPS, 0.05), "save": (STEPS, 0.02),
}
# Cycled per phase: (signal, how many).
PLAN = ((signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGTERM, 2), (signal.SIGINT, 2),
        (signal.SIGTERM, 1), (signal.SIGINT, 1))


def _argv(run_dir: Path) -> list[str]:
    return ["train", *TINY, *EXTRA, f"run.dir={run_dir}", f"run.steps={STEPS}"]


def signal_case(i: int, phase: str, j: int, seed: int, work: Path, ref: Path,
                env: dict[str, str]) -> dict[str, Any]:
    """Case `j` of `phase`: its record, with `problems` empty when it passed."""
    rng = random.Random(f"{seed}/{phase}/{j}")
    calls, max_delay = PHASES[phase]
    signum, count = PLAN[j % len(PLAN)]
    fault = Fault(phase, nth=rng.randint(1, calls), delay=rng.uniform(0.001, max_delay),
                  action="signal", signum=int(signum), count=count,
                  gap=rng.uniform(0.001, 0.05))
    run_dir, log = work / f"case{i}", work / f"case{i}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    first = run_child(_argv(run_dir), env, log, fault, ROOT)
    rec: dict[str, Any] = {
        "case": i, "phase": phase, "seed": f"{seed}/{phase}/{j}",
        "signal": signal.Signals(signum).name, "count": count, "nth": fault.nth,
        "delay_s": round(fault.delay, 4), "inside": any(f.get("inside") for f in first.fired),
        "exit_code": first.code, "last_line": first.last_line}
    problems = []
    if first.timed_out:
        problems.append("the signalled run hung: killed after the timeout")
    if first.traceback:
        problems.append(f"traceback in the signalled run (exit {first.code})")
    if first.code not in (0, 128 + signum):
        problems.append(f"signalled run exit {first.code}: {first.last_line[:300]}")
    elif first.code and not first.last_line.startswith("sagc-jax train: stopped"):
        problems.append(f"last line: {first.last_line[:300]}")
    final = run_child(_argv(run_dir), env, log, None, ROOT)
    rec["final_exit"] = final.code
    if final.code != 0 or final.traceback or final.timed_out:
        problems.append(f"rerun exit {final.code}{' (hung)' if final.timed_out else ''}: "
                        f"{final.last_line[:300]}")
    else:
        problems += outcome(run_dir, ref)
        if "falling back to the previous one" in log.with_suffix(".err").read_text(
                errors="replace"):
            problems.append("a checkpoint fallback on resume")
    rec["resumed_identical"] = not problems
    rec["outcome"] = "failure" if problems else (
        "finished (signal after the last safe point)" if first.code == 0 else
        f"stopped ({'hard' if count > 1 else 'at a safe point'}), exit {first.code}"
    ) + ("" if problems else "; resumed identical")
    rec["problems"] = problems
    if not problems:
        shutil.rmtree(run_dir, ignore_errors=True)
        for suffix in (".log", ".err", ".fired"):
            log.with_suffix(suffix).unlink(missing_ok=True)
    return rec


def run_signals(n_per_phase: int, seed: int, work: Path,
                phases: tuple[str, ...] = tuple(PHASES), report: Any = None) -> Result:
    """`n_per_phase` cases of each phase against one uninterrupted reference run."""
    return run_cases(phases, n_per_phase, _argv, work, report=report,
                     case=lambda i, phase, j, ref, env: signal_case(i, phase, j, seed, work, ref,
                                                                     env))
