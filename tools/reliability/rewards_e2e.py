"""Misbehaving rewards in real training runs: one that never returns, one that raises on 1 % of
inputs, one that returns NaN, each under `reward_on_error: raise` and `zero`.

Documented outcomes (`reward_timeout_s`, `reward_on_error` in the config reference):
  raise  exit 1 with one line naming the function and the example, and the state from before
         the failing step saved (``checkpoints/<step>``), so rerunning resumes there — or exit 0
         when no input hit the failure (the 1 % reward in a short run);
  zero   exit 0, the failures scored 0 with a warning each, every metric finite.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .kills import run_to_end

MODULE = '''
import math, time, zlib

def stuck(prompts, completions, **kw):
    time.sleep(10 ** 6)

def flaky(prompts, completions, **kw):
    out = []
    for p, c in zip(prompts, completions):
        if zlib.crc32((p + c).encode()) % 100 == 7:
            raise RuntimeError("verifier crashed")
        out.append(1.0 if c.strip() else 0.0)
    return out

def nan(prompts, completions, **kw):
    return [math.nan] * len(completions)
'''

CASES = [(fn, mode) for fn in ("stuck", "flaky", "nan") for mode in ("raise", "zero")]


@dataclass
class RewardRunResult:
    tried: int = 0
    outcomes: Counter = field(default_factory=Counter)
    tracebacks: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)


def check_run(fn: str, mode: str, run_dir: Path, log: Path, code: int) -> str:
    """The outcome kind of one run; raises AssertionError if it is not the documented one."""
    text = log.read_text(errors="replace")
    assert "Traceback (most recent call last)" not in text, "a traceback"
    assert "NETWORK ACCESS" not in text, "a network access"
    name = f"chaos_rewards:{fn}"
    if mode == "raise" and code != 0:
        assert code == 1, f"exit {code}"
        err = [ln for ln in text.splitlines() if ln.startswith("sagc-jax train: error")]
        assert len(err) == 1, f"error lines: {err}"
        assert name in err[0] and re.search(r"example \d+", err[0]), err[0]
        m = re.search(r"state before step (\d+) saved", err[0])
        assert m and (run_dir / "checkpoints" / str(int(m.group(1)) - 1)).is_dir(), err[0]
        what = {"stuck": "did not return within", "flaky": "raised RuntimeError",
                "nan": "non-finite"}[fn]
        assert what in err[0], err[0]
        return "stopped, state saved"
    assert code == 0, f"exit {code}"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(math.isfinite(v) for r in rows for v in r.values()
                        if isinstance(v, float)), "a non-finite metric"
    if mode == "raise":
        assert fn == "flaky", f"{fn} under raise finished"
        return "finished (no input hit)"
    assert "(set to 0)" in text or fn == "flaky", "no warning for the zeroed rewards"
    return "finished, scored 0 with warnings"


def run_reward_cases(work: Path, steps: int = 3, root: Path | None = None) -> RewardRunResult:
    """Every (reward, mode) case once, in `work` (which holds the module); `root` holds the
    compilation cache (shared with the kill harness)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "chaos_rewards.py").write_text(MODULE)
    res = RewardRunResult()
    for fn, mode in CASES:
        run_dir = work / f"{fn}-{mode}"
        shutil.rmtree(run_dir, ignore_errors=True)
        log = work / f"{fn}-{mode}.log"
        log.unlink(missing_ok=True)
        extra = (f"rewards=[{{name: 'chaos_rewards:{fn}', weight: 1.0}}]",
                 f"reward_on_error={mode}", "reward_timeout_s=0.5", f"run.steps={steps}")
        code = run_to_end(run_dir, log, extra=extra, pythonpath=str(work), root=root)
        res.tried += 1
        text = log.read_text(errors="replace")
        res.tracebacks += text.count("Traceback (most recent call last)")
        try:
            res.outcomes[f"{fn}/{mode}: {check_run(fn, mode, run_dir, log, code)}"] += 1
        except AssertionError as e:
            res.failures.append((f"{fn}/{mode}", f"{e} (log {log})"))
            res.outcomes[f"{fn}/{mode}: failure"] += 1
    return res
