"""The time model: seconds for prefill and for one decode step as functions of rows.

One definition for the simulator, SAGC's ``sagc.timing: model`` observations and the
experiments' ``model`` clock (:meth:`TimeModel.from_sagc` reads the config's ``sagc.time_model``,
whose defaults are also the simulator's ``timing:`` defaults).

Default (accelerator-like, memory-bound decode): ``t_decode(rows) = decode_a + decode_b * rows``
where decode_a is the per-step weight read and decode_b the per-row KV-cache/sampling work;
``prefill(rows) = prefill_a + prefill_b * rows``. Or a calibration file with measured per-shape
costs ``{"rows": [...], "decode_step_s": [...], "prefill_s": [...]}``, interpolated piecewise
linearly and extrapolated with the end segments' slopes (constant if one point).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.config.sagc import TimeModelSection

# decode_a: s per decode step at 0 rows (weights read once per step); decode_b: s per row per
# decode step (256 rows: +32% over decode_a); prefill_a: s per prefill call; prefill_b: s per
# row (one definition: ``sagc.time_model``'s defaults); decode_chunk: decode steps per
# while_loop iteration (tokens per chunk).
DEFAULT_TIMING: dict[str, Any] = {**TimeModelSection().model_dump(), "decode_chunk": 16}


def _extrap(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation with linear extrapolation; floored at 0."""
    if len(xs) == 1:
        return np.full_like(x, ys[0], dtype=np.float64)
    y = np.interp(x, xs, ys)
    lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
    hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    y = np.where(x < xs[0], ys[0] + lo_slope * (x - xs[0]), y)
    y = np.where(x > xs[-1], ys[-1] + hi_slope * (x - xs[-1]), y)
    return np.maximum(y, 0.0)


def chunked_decode_steps(max_len: int, max_new_tokens: int, chunk: int) -> int:
    """Decode steps a single turn runs: its longest row (at most max_new_tokens) rounded up to
    a whole ``chunk`` (the sampler's loop exits only between chunks)."""
    c = max(int(chunk), 1)
    return int(math.ceil(min(int(max_len), int(max_new_tokens)) / c) * c)


@dataclass(frozen=True)
class TimeModel:
    """Linear (a + b*rows) or calibrated per-shape time model. Seconds; defaults
    :data:`DEFAULT_TIMING` (= ``sagc.time_model``'s defaults)."""

    decode_a: float = DEFAULT_TIMING["decode_a"]
    decode_b: float = DEFAULT_TIMING["decode_b"]
    prefill_a: float = DEFAULT_TIMING["prefill_a"]
    prefill_b: float = DEFAULT_TIMING["prefill_b"]
    decode_chunk: int = DEFAULT_TIMING["decode_chunk"]
    cal_rows: tuple[float, ...] = ()
    cal_decode: tuple[float, ...] = ()
    cal_prefill: tuple[float, ...] = ()

    @classmethod
    def from_sagc(cls, sagc_cfg: Any) -> TimeModel:
        """The linear model of a config's ``sagc`` section (its ``time_model``)."""
        return cls(**sagc_cfg.time_model.model_dump())

    def step_seconds(self, rows: int, decode_steps: int) -> float:
        """Rollout seconds of one step of ``rows`` rows and ``decode_steps`` decode steps."""
        return self.prefill_s(rows) + decode_steps * self.decode_step_s(rows)

    def decode_step_s(self, rows: int) -> float:
        """Seconds per decode step for a batch of ``rows`` rows."""
        if self.cal_rows:
            xs, ys = np.array(self.cal_rows), np.array(self.cal_decode)
            return float(_extrap(np.array([rows], float), xs, ys)[0])
        return self.decode_a + self.decode_b * rows

    def prefill_s(self, rows: int) -> float:
        """Seconds to prefill a batch of ``rows`` rows."""
        if self.cal_rows:
            xs, ys = np.array(self.cal_rows), np.array(self.cal_prefill)
            return float(_extrap(np.array([rows], float), xs, ys)[0])
        return self.prefill_a + self.prefill_b * rows

    def decode_steps(self, max_len: int, max_new_tokens: int) -> int:
        """Decode steps run: the longest row rounded up to a whole chunk (the while_loop exits
        only between chunks), at most max_new_tokens rounded up likewise."""
        return chunked_decode_steps(max_len, max_new_tokens, self.decode_chunk)

    def episode_decode_steps(self, turns: np.ndarray) -> int:
        """Decode steps of an episode step: turns int [rows, T] (tokens per turn) -> the sum over
        turns of that turn's longest row, each rounded up to a whole chunk (every turn runs
        until its longest row ends; `sampling.turns`)."""
        c = self.decode_chunk
        longest = np.asarray(turns).reshape(-1, np.shape(turns)[-1]).max(0)
        return int((np.ceil(longest[longest > 0] / c) * c).sum())


def time_model_from_dict(d: dict[str, Any] | None, base_dir: Path | None = None) -> TimeModel:
    """Validate the ``timing:`` section (errors name ``timing.<key>``)."""
    d = dict(d or {})
    allowed = set(DEFAULT_TIMING) | {"calibration"}
    for key in d:
        if key not in allowed:
            raise ValueError(f"timing.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")
    vals = {**DEFAULT_TIMING, **{k: v for k, v in d.items() if k != "calibration"}}
    for key, v in vals.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"timing.{key}: a number >= 0, got {v!r}")
    if not isinstance(vals["decode_chunk"], int) or vals["decode_chunk"] < 1:
        raise ValueError(f"timing.decode_chunk: an integer >= 1, got {vals['decode_chunk']!r}")
    cal: dict[str, tuple[float, ...]] = {}
    if "calibration" in d:
        path = Path(str(d["calibration"]))
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        try:
            raw = json.loads(path.read_text())
            rows = [float(x) for x in raw["rows"]]
            dec = [float(x) for x in raw["decode_step_s"]]
            pre = [float(x) for x in raw["prefill_s"]]
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"timing.calibration: unreadable {path}: {e}") from None
        if not rows or not (len(rows) == len(dec) == len(pre)):
            raise ValueError(
                f"timing.calibration: rows/decode_step_s/prefill_s lengths differ in {path}"
            )
        order = np.argsort(rows)
        if len(np.unique(rows)) != len(rows):
            raise ValueError(f"timing.calibration: duplicate rows in {path}")
        cal = {
            "cal_rows": tuple(np.array(rows)[order].tolist()),
            "cal_decode": tuple(np.array(dec)[order].tolist()),
            "cal_prefill": tuple(np.array(pre)[order].tolist()),
        }
    return TimeModel(
        decode_a=float(vals["decode_a"]),
        decode_b=float(vals["decode_b"]),
        prefill_a=float(vals["prefill_a"]),
        prefill_b=float(vals["prefill_b"]),
        decode_chunk=int(vals["decode_chunk"]),
        **cal,
    )
