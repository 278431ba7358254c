"""Equal wall-clock budgets for the comparison: its two clocks, the stop rule and length tails.

Two clocks measure a training step (both from one metrics row, so every run can be read on
both):

- ``model`` — *modelled accelerator rollout seconds*: ``prefill_a + prefill_b * rows +
  decode_steps * (decode_a + decode_b * rows)``, the linear time model SAGC uses with
  ``sagc.timing: model`` (constants from the run's ``sagc`` section). A decode step costs nearly
  the same at any row count, so what makes a step expensive is its longest completion — the
  straggler tail. The update is not modelled (on an accelerator it is small for these models).
  Deterministic: the same seed gives the same clock on any machine, at any load.
- ``measured`` — the real clock of this machine: ``step_s`` minus in-training eval time
  (rollout + rewards + update). On a shared CPU it moves with the load.

Budget rule: a run is read up to the end of the last step whose cumulative clock is <= the
budget (`cut_at_budget`): exactly what a run stopped at the budget would have logged, since a
step does not depend on later ones (the comparison uses a constant learning rate after warm-up;
SAGC's only use of the planned length is its horizon, the step cap, which each policy sets close
to the steps it needs to reach the budget). Runs train a step cap `run.steps` and
are cut afterwards; `--budget-s auto` takes the smallest total clock over all runs, so every run
has data up to the budget. Held-out accuracy is measured at the newest checkpoint at or before
the cut (`checkpoint.every` apart).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.experiments.summary import step_seconds
from sagc_jax.sagc.timing import TimeModel

__all__ = [
    "CLOCKS",
    "checkpoint_at_or_before",
    "cumulative_clock",
    "cut_at_budget",
    "length_samples",
    "parse_max_steps",
    "resolve_budget",
    "step_clock",
    "tail_stats",
]

CLOCKS = ("model", "measured")


def step_clock(row: Mapping[str, Any], clock: str, tm: TimeModel | None = None) -> float:
    """Seconds of one metrics row on `clock` (``model`` needs `rows` and `decode_steps`)."""
    if clock == "model":
        return (tm or TimeModel()).step_seconds(int(row["rows"]), int(row["decode_steps"]))
    if clock == "measured":
        return step_seconds(row)
    raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")


def cumulative_clock(rows: Sequence[Mapping[str, Any]], clock: str,
                     tm: TimeModel | None = None) -> np.ndarray:
    """Clock seconds at the end of each step, float [len(rows)]."""
    return np.cumsum([step_clock(r, clock, tm) for r in rows]) if rows else np.zeros(0)


def cut_at_budget(rows: Sequence[Mapping[str, Any]], budget_s: float, clock: str,
                  tm: TimeModel | None = None) -> int:
    """Number of leading rows whose cumulative clock is <= `budget_s` (seconds)."""
    return int(np.searchsorted(cumulative_clock(rows, clock, tm), budget_s, side="right"))


def checkpoint_at_or_before(run_dir: str | Path, step: int) -> Path | None:
    """The newest `<run_dir>/checkpoints/<k>` with k <= `step` (None if there is none)."""
    ck = Path(run_dir) / "checkpoints"
    steps = [int(p.name) for p in ck.iterdir() if p.name.isdigit() and int(p.name) <= step] \
        if ck.is_dir() else []
    return ck / str(max(steps)) if steps else None


def resolve_budget(budget: float | str | None, totals: Sequence[float]) -> float | None:
    """The budget in seconds: a number as given, ``"auto"`` = the smallest run total (every run
    then has data up to it), None = no budget (read whole runs)."""
    if budget is None:
        return None
    if budget == "auto":
        vals = [t for t in totals if math.isfinite(t)]
        if not vals:
            raise ValueError("--budget-s auto: no run has any step yet")
        return float(min(vals))
    try:
        b = float(budget)
    except (TypeError, ValueError):
        b = math.nan
    if not b > 0:
        raise ValueError(f"--budget-s must be > 0 or 'auto', got {budget!r}")
    return b


def parse_max_steps(text: str | None) -> dict[str, int]:
    """``"static-4=55,sagc=45"`` -> ``{"static-4": 55, "sagc": 45}`` (per-policy step caps)."""
    out: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, val = part.partition("=")
        try:
            n = int(val)
        except ValueError:
            n = 0
        if not sep or n < 1:
            raise ValueError(f"--max-steps {part.strip()!r}: expected POLICY=STEPS with STEPS >= 1")
        out[name.strip().lower()] = n
    return out


def length_samples(trace_path: str | Path, steps: tuple[int, int] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per-row completion lengths (tokens) and truncated flags from a run's `trace.jsonl`,
    for the steps `lo <= step <= hi` of `steps` (1-based, inclusive; None = all).
    Returns (int [n], bool [n])."""
    recs = [json.loads(line) for line in Path(trace_path).read_text().splitlines() if line]
    if steps is not None:
        recs = [r for r in recs if steps[0] <= r["step"] <= steps[1]]
    steps_ = recs
    lens = [n for s in steps_ for grp in s["groups"] for n in grp["lengths"]]
    trunc = [t for s in steps_ for grp in s["groups"] for t in grp["truncated"]]
    return np.asarray(lens, dtype=np.int64), np.asarray(trunc, dtype=bool)


def tail_stats(lengths: np.ndarray, truncated: np.ndarray) -> dict[str, float]:
    """Median, p90, p99, mean (tokens) and truncated fraction of a length sample."""
    if len(lengths) == 0:
        return {k: math.nan for k in ("median", "p90", "p99", "mean", "truncated")}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {"median": float(p50), "p90": float(p90), "p99": float(p99),
            "mean": float(lengths.mean()), "truncated": float(np.mean(truncated))}

