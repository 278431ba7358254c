"""A recorded run's SAGC observations, rebuilt from its files: what the controller saw each step.

The trainer logs each step's rows to `metrics.jsonl` and its groups (lengths, truncated flags,
rewards) to `trace.jsonl`; with `sagc.timing: model` the seconds it observed are the time
model's of (rows, decode steps). `logged_observations` puts them back together, so a run's
decisions can be replayed exactly (tests/test_real_runs.py) or under other settings
(benchmarks/probes/sagc_cost_replay.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.sagc.controller import Observation
from sagc_jax.sagc.timing import TimeModel, chunked_decode_steps


@dataclass(frozen=True)
class LoggedStep:
    """One logged step: its metrics row, its trace row and the observation SAGC got."""

    metrics: dict[str, Any]
    trace: dict[str, Any]
    observation: Observation


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def logged_observations(run_dir: str | Path, sagc_cfg: Any,
                        decode_chunk: int) -> Iterator[LoggedStep]:
    """Every training step of ``run_dir`` in order (metrics rows with a ``group_size``), with the
    `Observation` rebuilt on the `model` clock of ``sagc_cfg.time_model``. ValueError if a step's
    logged decode steps are not its longest row rounded up to ``decode_chunk`` (the trace and
    the metrics disagree: not what the controller saw)."""
    run = Path(run_dir)
    tm = TimeModel.from_sagc(sagc_cfg)
    trace = {t["step"]: t for t in _jsonl(run / "trace.jsonl")}
    for m in _jsonl(run / "metrics.jsonl"):
        if "group_size" not in m:
            continue
        t = trace[m["step"]]
        g, rows, steps = t["group_size"], m["rows"], m["decode_steps"]
        lengths = np.array([n for gr in t["groups"] for n in gr["lengths"]])
        if steps != chunked_decode_steps(int(lengths.max()), t["max_new_tokens"], decode_chunk):
            raise ValueError(f"{run}: step {m['step']}: decode_steps {steps} is not the longest "
                             f"row ({int(lengths.max())}) rounded up to {decode_chunk}")
        yield LoggedStep(m, t, Observation(
            group_size=g, lengths=lengths,
            truncated=np.array([x for gr in t["groups"] for x in gr["truncated"]]),
            rewards=np.array([x for gr in t["groups"] for x in gr["rewards"]]),
            max_new_tokens=t["max_new_tokens"], prefill_s=tm.prefill_s(rows),
            decode_s=steps * tm.decode_step_s(rows), decode_steps=steps, rows=rows,
            prompts=rows // g, decode_chunk=decode_chunk))
