"""What a run writes: metrics.jsonl, trace.jsonl and TensorBoard events (plots: `plots.py`).

Only process 0 writes (`enabled=False` elsewhere); every writer appends, so a resumed run
continues the same files (rows past the restored step are dropped first, see `truncate_after`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Keys that depend on wall-clock time; excluded when comparing runs for exact resume.
TIMING_KEYS = ("rollout_s", "reward_s", "train_s", "step_s", "prefill_s", "decode_s",
               "tokens_per_s", "compile_s", "time_s", "compiles", "eval_s", "load_1m")


def _clean(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def truncate_after(path: Path, step: int) -> None:
    """Drops JSONL rows with `step` > step (written after the checkpoint a resume starts from)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a row cut short by a kill
    path.write_text("".join(x + "\n" for x in keep))


def _abandon_tensorboard(tb: Any) -> None:
    """After a failed close (a full disk): stop its writer threads and mark them closed, so
    tensorboardX's exit hook does not retry and print a traceback after the run's error."""
    writers = [*getattr(tb, "all_writers", {}).values(), getattr(tb, "file_writer", None)]
    for fw in writers:
        ew = getattr(fw, "event_writer", None)
        if ew is None or getattr(ew, "_closed", True):
            continue
        with contextlib.suppress(Exception):
            ew._worker.stop()
        with contextlib.suppress(Exception):
            ew._ev_writer.close()
        ew._closed = True


class RunWriter:
    """Appends per-step metrics and per-group traces; TensorBoard scalars."""

    def __init__(self, run_dir: str | os.PathLike, *, enabled: bool = True,
                 tensorboard: bool = True):
        self.dir = Path(run_dir)
        self.enabled = enabled
        self.metrics_path = self.dir / "metrics.jsonl"
        self.trace_path = self.dir / "trace.jsonl"
        self._tb = None
        if enabled and tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"))

    def resume_from(self, step: int) -> None:
        if self.enabled:
            truncate_after(self.metrics_path, step)
            truncate_after(self.trace_path, step)

    def write(self, row: dict[str, Any], trace: dict[str, Any] | None = None) -> None:
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in row.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if trace is not None:
            with self.trace_path.open("a") as f:
                f.write(json.dumps(trace) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        """Flushes and closes TensorBoard (the JSONL files are closed after every write)."""
        if not self.enabled:
            return
        if self._tb is not None:
            tb, self._tb = self._tb, None
            try:
                tb.flush()
                tb.close()
            except OSError:
                _abandon_tensorboard(tb)
                raise


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over full windows: out[i] = mean(values[i : i + window]).

    Units: those of `values`. Length `len(values) - window + 1` (empty if too short); out[i]
    belongs to the step at index `i + window - 1`, the last one it averages.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    v = np.asarray(values, dtype=float)
    if len(v) < window:
        return np.zeros(0)
    c = np.cumsum(np.concatenate([[0.0], v]))
    return (c[window:] - c[:-window]) / window
