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
step does not depend on later ones (the comparison uses a constant learning rate after warm-up,
so nothing depends on the run's planned length either). Runs train a step cap `run.steps` and
are cut afterwards; `--budget-s auto` takes the smallest total clock over all runs, so every run
has data up to the budget. Held-out accuracy is measured at the newest checkpoint at or before
the cut (`checkpoint.every` apart).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CLOCKS",
    "BudgetClock",
    "TimeModel",
    "checkpoint_at_or_before",
    "cumulative_clock",
    "cut_at_budget",
    "length_samples",
    "step_clock",
    "tail_stats",
]

CLOCKS = ("model", "measured")


def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


@dataclasses.dataclass(frozen=True)
class TimeModel:
    """Linear accelerator time model (seconds): the defaults of `SAGCConfig`'s `model_*`."""

    prefill_a: float = 0.05
    prefill_b: float = 2.0e-4
    decode_a: float = 0.02
    decode_b: float = 2.5e-5

    @classmethod
    def from_sagc(cls, sagc_cfg: Any) -> TimeModel:
        """From a config's `sagc` section (`model_prefill_a` ...); missing fields keep defaults."""
        kw = {f: getattr(sagc_cfg, f"model_{f}") for f in ("prefill_a", "prefill_b",
                                                            "decode_a", "decode_b")
              if hasattr(sagc_cfg, f"model_{f}")}
        return cls(**kw)

    def step_seconds(self, rows: int, decode_steps: int) -> float:
        """Modelled rollout seconds of one step of `rows` rows and `decode_steps` decode steps."""
        return (self.prefill_a + self.prefill_b * rows
                + decode_steps * (self.decode_a + self.decode_b * rows))


def step_clock(row: Mapping[str, Any], clock: str, tm: TimeModel | None = None) -> float:
    """Seconds of one metrics row on `clock` (``model`` needs `rows` and `decode_steps`)."""
    if clock == "model":
        return (tm or TimeModel()).step_seconds(int(row["rows"]), int(row["decode_steps"]))
    if clock == "measured":
        s, ev = _num(row.get("step_s")), _num(row.get("eval_s"))
        return s - ev if math.isfinite(ev) else s
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


class BudgetClock:
    """Accumulates a run's clock step by step; `add(row)` is True once the budget is spent.

    `spent` starts from the rows already logged (a resumed run keeps its clock).
    """

    def __init__(self, budget_s: float, clock: str, tm: TimeModel | None = None,
                 rows: Sequence[Mapping[str, Any]] = ()) -> None:
        if not budget_s > 0:
            raise ValueError(f"budget must be > 0 seconds, got {budget_s}")
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        self.budget_s, self.clock, self.tm = float(budget_s), clock, tm or TimeModel()
        self.spent = float(sum(step_clock(r, clock, self.tm) for r in rows))

    @property
    def done(self) -> bool:
        return self.spent >= self.budget_s

    def add(self, row: Mapping[str, Any]) -> bool:
        self.spent += step_clock(row, self.clock, self.tm)
        return self.done


def length_samples(trace_path: str | Path, first: int | None = None,
                   last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-row completion lengths (tokens) and truncated flags from a run's `trace.jsonl`:
    the first `first` steps, or the last `last` steps, or all. Returns (int [n], bool [n])."""
    steps = [json.loads(line) for line in Path(trace_path).read_text().splitlines() if line]
    if first is not None:
        steps = steps[:first]
    elif last is not None:
        steps = steps[-last:]
    lens = [n for s in steps for grp in s["groups"] for n in grp["lengths"]]
    trunc = [t for s in steps for grp in s["groups"] for t in grp["truncated"]]
    return np.asarray(lens, dtype=np.int64), np.asarray(trunc, dtype=bool)


def tail_stats(lengths: np.ndarray, truncated: np.ndarray) -> dict[str, float]:
    """Median, p90, p99, mean (tokens) and truncated fraction of a length sample."""
    if len(lengths) == 0:
        return {k: math.nan for k in ("median", "p90", "p99", "mean", "truncated")}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {"median": float(p50), "p90": float(p90), "p99": float(p99),
            "mean": float(lengths.mean()), "truncated": float(np.mean(truncated))}


def plot_length_distribution(samples: Mapping[str, tuple[np.ndarray, np.ndarray]],
                             path: str | Path, *, cap: int, title: str) -> Path:
    """Histogram (log count) of completion lengths per labelled sample, e.g. before/after GRPO.

    `samples`: label -> (lengths int [n], truncated bool [n]); `cap`: max_new_tokens (dotted).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.arange(0, cap + 9, 8)
    for label, (lens, trunc) in samples.items():
        st = tail_stats(lens, trunc)
        ax.hist(lens, bins=bins, histtype="step", lw=1.8, density=True,
                label=f"{label}: median {st['median']:.0f}, p99 {st['p99']:.0f}, "
                      f"truncated {st['truncated']:.1%} (n={len(lens)})")
    ax.axvline(cap, ls=":", c="k", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("density (log)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
