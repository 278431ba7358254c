"""Cross-process agreement: the few values every host must see identically.

Single process: every method is the identity (no collective runs). With several processes
each host samples its own block of rows; lengths, flags and rewards are gathered so metrics,
train-step buckets and SAGC decisions agree everywhere, and process 0's clock is broadcast.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from sagc_jax.parallel import allgather, broadcast_from_main, host_local_to_global


@dataclasses.dataclass(frozen=True)
class Hosts:
    """This process's place among `count` processes."""

    count: int = 1
    index: int = 0

    @classmethod
    def current(cls) -> Hosts:
        return cls(jax.process_count(), jax.process_index())

    @property
    def single(self) -> bool:
        return self.count == 1

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def local_rows(self, rows: int) -> int:
        """This process's share of `rows` global rows (or prompts)."""
        return rows // self.count

    def gather(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every process's rows concatenated in process order (identity for one process)."""
        return allgather(arrays)

    def agree(self, value: Any) -> Any:
        """Process 0's `value` everywhere (identity for one process)."""
        return value if self.single else broadcast_from_main(value)

    def max_int(self, value: int) -> int:
        """The largest of every process's `value` (itself for one process)."""
        if self.single:
            return int(value)
        return int(allgather(np.asarray([value], np.int64)).max())

    def replicated(self, x: Any, sharding: Sharding) -> jax.Array:
        """A host value, the same on every process, as one array with `sharding`."""
        if self.single:
            return jax.device_put(np.asarray(x), sharding)
        return host_local_to_global(np.asarray(x), sharding)

    def seconds(self, prefill_s: float, decode_s: float) -> tuple[float, float]:
        """Process 0's measured seconds everywhere (each host's clock differs)."""
        if self.single:
            return prefill_s, decode_s
        t = broadcast_from_main(np.asarray([prefill_s, decode_s], np.float64))
        return float(t[0]), float(t[1])

    def to_global(self, batch: dict[str, np.ndarray], shardings: dict[str, Sharding],
                  global_rows: int, batch_ways: int) -> dict[str, jax.Array]:
        """Host batch arrays -> global device arrays with the step's shardings."""
        if self.single:
            return {k: jax.device_put(np.asarray(v), shardings[k]) for k, v in batch.items()}
        if global_rows % batch_ways:
            # A replicated batch cannot be assembled from host-local rows.
            raise ValueError(f"{global_rows} batch rows do not split over data x fsdp = "
                             f"{batch_ways} devices; with several processes they must (see the "
                             "dry run)")
        return {k: host_local_to_global(np.asarray(v), shardings[k]) for k, v in batch.items()}

    def warm_up(self, local_rows_per_g: dict[int, int], measured_timing: bool) -> None:
        """Runs a step's gathers / broadcasts once per G on dummy data (each is a small jitted
        program per shape), so `compiles` stays 0 after warm-up. Mirrors `collect`,
        `global_view` and `observation_from`; every process calls it."""
        if self.single:
            return
        for rows in local_rows_per_g.values():
            i32, f32, b = (np.zeros(rows, t) for t in (np.int32, np.float32, bool))
            allgather({"lengths": i32, "truncated": b, "rewards": f32})
            allgather({"lengths": i32, "truncated": b, "rewards": f32, "raw_rewards": f32,
                       "valid": b, "plen": np.zeros(1, np.int64)})
        self.max_int(0)  # the train batch's row count (`rl.batch.make_batch`)
        if measured_timing:
            broadcast_from_main(np.zeros(2, np.float64))
            broadcast_from_main(np.int32(0))
