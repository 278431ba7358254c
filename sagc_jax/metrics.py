"""What a run writes: metrics.jsonl, trace.jsonl and TensorBoard events (plots: `plots.py`).

Only process 0 writes (`enabled=False` elsewhere); every writer appends, so a resumed run
continues the same files (rows past the restored step are dropped first, see `truncate_after`).
"""

from __future__ import annotations

import contextlib
import errno
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
    keep, lines = [], path.read_text().splitlines()
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a row cut short by a kill or a full disk
    if keep == lines:
        return
    # Replaced whole, never rewritten in place: a disk still full would otherwise leave the
    # file truncated, the rows the checkpoints cover lost.
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text("".join(x + "\n" for x in keep))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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


def _tensorboard_failed(tb: Any) -> bool:
    """Whether a TensorBoard writer thread died: tensorboardX leaves it dead after a failed
    write (a full disk, a read-only or removed directory), and events put for it are lost."""
    for fw in [*getattr(tb, "all_writers", {}).values(), getattr(tb, "file_writer", None)]:
        ew = getattr(fw, "event_writer", None)
        worker = getattr(ew, "_worker", None)
        if worker is not None and not getattr(ew, "_closed", True) and not worker.is_alive():
            return True
    return False


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

            # A queue far longer than the events of one row: with a dead writer thread
            # (`_tensorboard_failed`, checked every row) a put never blocks — with the default
            # 10 the run hung there after its disk filled.
            self._tb = SummaryWriter(str(self.dir / "tensorboard"), max_queue=1000)

    def resume_from(self, step: int) -> None:
        if self.enabled:
            truncate_after(self.metrics_path, step)
            truncate_after(self.trace_path, step)

    def missing_rows(self, step: int) -> list[int]:
        """Steps 1..`step` without a metrics row (a resumed run's history must be whole)."""
        if not self.enabled or step == 0:
            return []
        have = set()
        if self.metrics_path.exists():
            for line in self.metrics_path.read_text().splitlines():
                with contextlib.suppress(ValueError, AttributeError):
                    have.add(json.loads(line).get("step"))
        return [s for s in range(1, step + 1) if s not in have]

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
            if _tensorboard_failed(self._tb):
                self._tensorboard_error()
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, row["step"])

    def _tensorboard_error(self) -> None:
        """Raises the dead TensorBoard writer's error: flushing its pending bytes from this
        thread meets it again (ENOSPC...); else an EIO naming its directory."""
        tb, self._tb = self._tb, None
        try:
            tb.flush()
        finally:
            _abandon_tensorboard(tb)
        raise OSError(errno.EIO, f"the TensorBoard writer of {self.dir / 'tensorboard'} "
                      "stopped: a write of its event file failed")

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
