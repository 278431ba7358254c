"""The summary math of a comparison, pure functions on metrics rows (unit-tested on synthetic
rows): time-to-target, per-run headline numbers, spread over seeds, the automatic target."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sagc_jax.metrics import moving_average

# Table columns: (key in a run summary, header, number format).
# `time_to_target_s` and `total_s` are on the comparison's clock (`--clock`, see budget.py);
# `measured_s` is always this machine's real clock.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("time_to_target_s", "wall-clock to target (s)", "{:.0f}"),
    ("steps_to_target", "steps to target", "{:.0f}"),
    ("total_s", "total wall-clock (s)", "{:.0f}"),
    ("steps", "steps", "{:.0f}"),
    ("measured_s", "measured CPU wall-clock (s)", "{:.0f}"),
    ("load_mean", "load avg (1 min)", "{:.1f}"),
    ("straggler_rate", "straggler rate", "{:.3f}"),
    ("final_reward", "final train reward", "{:.3f}"),
    ("eval_accuracy", "held-out accuracy", "{:.3f}"),
    ("len_mean", "completion length (tok)", "{:.1f}"),
    ("mean_group_size", "mean G", "{:.2f}"),
    ("compile_s", "compile warm-up (s)", "{:.0f}"),
)


def num(v: Any) -> float:
    """A metrics value as float (NaN for missing / non-numeric, e.g. 'nan' strings)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def step_seconds(row: Mapping[str, Any]) -> float:
    """Training seconds of one step: `step_s` minus any in-training eval time (`eval_s`)."""
    s = num(row.get("step_s"))
    ev = num(row.get("eval_s"))
    return s - ev if math.isfinite(ev) else s


def cumulative_seconds(rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Wall-clock seconds at the end of each step (cumulative `step_seconds`)."""
    return np.cumsum([step_seconds(r) for r in rows]) if rows else np.zeros(0)


def time_to_target(rows: Sequence[Mapping[str, Any]], target: float, window: int = 10,
                   key: str = "reward_mean", seconds: Sequence[float] | None = None
                   ) -> tuple[int | None, float | None]:
    """First step whose trailing `window`-step mean of `key` is >= `target`.

    Returns `(step, seconds)`: the step number (the row's `step`) and the cumulative training
    wall-clock (s) at the end of that step — `seconds[i]` when given (another clock, e.g.
    `budget.cumulative_clock`), else `cumulative_seconds(rows)`; `(None, None)` when the target
    is never reached.
    """
    ma = moving_average([num(r.get(key)) for r in rows], window)
    hit = np.flatnonzero(ma >= target)
    if len(hit) == 0:
        return None, None
    i = int(hit[0]) + window - 1
    secs = cumulative_seconds(rows) if seconds is None else np.asarray(seconds, dtype=float)
    return int(rows[i]["step"]), float(secs[i])


def _tail_mean(rows: Sequence[Mapping[str, Any]], key: str, n: int) -> float:
    vals = [num(r.get(key)) for r in rows[-n:]]
    vals = [v for v in vals if math.isfinite(v)]
    return float(np.mean(vals)) if vals else math.nan


def summarize_run(rows: Sequence[Mapping[str, Any]], *, target: float, window: int = 10,
                  final_window: int = 10, len_window: int = 20,
                  seconds: Sequence[float] | None = None) -> dict[str, Any]:
    """Headline numbers of one run from its metrics rows.

    `seconds`: cumulative clock seconds per row (default: the measured `cumulative_seconds`).

    - `time_to_target_s` (s) / `steps_to_target`: see `time_to_target` (None = not reached);
    - `total_s` (s): the clock at the last row; `measured_s` (s): sum of `step_seconds`;
    - `straggler_rate`: mean per-step fraction of groups with a straggler event;
    - `final_reward`: mean `reward_mean` over the last `final_window` steps;
    - `len_mean` (tokens): mean completion length over the last `len_window` steps;
    - `mean_group_size`: mean G over all steps; `steps`: number of rows;
    - `load_mean`: mean 1-minute load average at the steps' ends (NaN for runs before it was
      logged): what the `measured` clock ran beside.
    """
    step, secs = time_to_target(rows, target, window, seconds=seconds)
    measured = float(cumulative_seconds(rows)[-1]) if rows else math.nan
    return {
        "steps": len(rows),
        "time_to_target_s": secs,
        "steps_to_target": step,
        "total_s": (measured if seconds is None else float(seconds[-1])) if rows else math.nan,
        "measured_s": measured,
        "straggler_rate": _tail_mean(rows, "straggler_rate", len(rows)),
        "final_reward": _tail_mean(rows, "reward_mean", final_window),
        "len_mean": _tail_mean(rows, "len_mean", len_window),
        "mean_group_size": _tail_mean(rows, "group_size", len(rows)),
        "load_mean": _tail_mean(rows, "load_1m", len(rows)),
    }


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and spread over seeds, ignoring None/NaN (e.g. 'not reached').

    Returns `mean`, `std` (sample std, ddof=1; 0 with one value), `min`, `max`, `n` (values
    used) and `of` (values given); the statistics are None when `n == 0`. Units: the inputs'.
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {"n": len(vals), "of": len(values)}
    if not vals:
        return {**out, "mean": None, "std": None, "min": None, "max": None}
    a = np.asarray(vals)
    return {**out, "mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def aggregate(per_run: Mapping[str, Mapping[int, Mapping[str, Any]]],
              keys: Sequence[str] = tuple(k for k, _, _ in COLUMNS)) -> dict[str, dict[str, Any]]:
    """`{policy: {seed: run summary}}` -> `{policy: {key: spread over seeds}}`."""
    return {pol: {k: spread([runs[s].get(k) for s in sorted(runs)]) for k in keys}
            for pol, runs in per_run.items()}


def auto_target(initial: Sequence[float], finals: Mapping[str, float], frac: float = 0.8,
                min_gain: float = 0.05) -> float:
    """A reward target relative to the runs, the same for every policy. Unitless (reward).

    `r0` = mean of `initial` (each run's first-window mean reward), `best` = the best policy's
    mean final reward; the target is `r0 + frac * max(best - r0, min_gain)`, rounded to 0.01.
    `min_gain` keeps it above the starting level when no policy improved (then nobody reaches
    it, which is the honest answer).
    """
    vals = [float(v) for v in initial if math.isfinite(float(v))]
    r0 = float(np.mean(vals)) if vals else 0.0
    best = max((v for v in finals.values() if math.isfinite(v)), default=r0)
    return round(r0 + frac * max(best - r0, min_gain), 2)
