"""The run's shape plan: every shape the sampler and the train step compile, derived once.

Used by the warm-up (what to compile), the sampler (its `SamplingConfig`), the train step
(prompt / completion buckets of a batch, micro-batches) and the dry run (the same list, priced).
A run only ever sees shapes from this plan, so `compiles` stays 0 after warm-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from sagc_jax.sagc import prompts_for
from sagc_jax.sampling import SamplingConfig


def completion_buckets(max_new_tokens: int, chunk: int) -> tuple[int, ...]:
    """Train-step completion lengths: half and full `max_new_tokens` (multiples of the chunk).

    Two buckets make the update's cost follow the straggler tail (a batch without a long
    completion trains on half the length) for one extra compile per G.
    """
    half = -(-(max_new_tokens // 2) // chunk) * chunk
    return tuple(sorted({min(half, max_new_tokens), max_new_tokens}))


def bucket(value: int, buckets: tuple[int, ...]) -> int:
    """Smallest bucket >= value; ValueError past the largest."""
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


def micro_batches(rows: int, micro_batch_rows: int | None) -> int:
    """Micro-batches per update of `rows` rows (`algo.micro_batch_rows` must divide rows)."""
    if micro_batch_rows is None or micro_batch_rows >= rows:
        return 1
    if rows % micro_batch_rows:
        raise ValueError(f"algo.micro_batch_rows: {micro_batch_rows} must divide the batch rows "
                         f"{rows} (prompts x group size) of every declared shape")
    return rows // micro_batch_rows


@dataclasses.dataclass(frozen=True)
class TrainShape:
    """One compiled train step: rows = prompts x G, sequence = prompt bucket + completion."""

    group_size: int
    prompts: int
    rows: int
    prompt_bucket: int
    completion_bucket: int


@dataclasses.dataclass(frozen=True)
class ShapePlan:
    """Group sizes, prompts per G, buckets and the divisibility a mesh and hosts need.

    Attributes:
      prompts_per_g: {G: prompts per step} (global, all processes together).
      batch_ways: data x fsdp devices the batch rows are sharded over.
      data_shards: virtual data shards (`data.shards`, default the process count).
    """

    group_sizes: tuple[int, ...]
    prompts_per_g: dict[int, int]
    prompt_buckets: tuple[int, ...]
    cache_buckets: tuple[int, ...] | None
    max_new_tokens: int
    decode_chunk: int
    completion_buckets: tuple[int, ...]
    micro_batch_rows: int | None = None
    batch_ways: int = 1
    num_processes: int = 1
    data_shards: int = 1

    @classmethod
    def from_config(cls, cfg: Any, *, batch_ways: int = 1, num_processes: int = 1,
                    group_sizes: tuple[int, ...] | None = None) -> ShapePlan:
        """The plan of `cfg` (a Config); `group_sizes` restricts it (the dry run skips rungs
        whose prompt count is invalid). ValueError from `prompts_for` names a bad rung."""
        s = cfg.sampling
        gs = tuple(cfg.sagc.group_sizes) if group_sizes is None else tuple(group_sizes)
        return cls(
            group_sizes=gs,
            prompts_per_g={g: prompts_for(cfg.sagc, g, cfg.data.prompts_per_step) for g in gs},
            prompt_buckets=tuple(s.prompt_buckets),
            cache_buckets=None if s.cache_buckets is None else tuple(s.cache_buckets),
            max_new_tokens=s.max_new_tokens, decode_chunk=s.decode_chunk,
            completion_buckets=completion_buckets(s.max_new_tokens, s.decode_chunk),
            micro_batch_rows=cfg.algo.micro_batch_rows, batch_ways=batch_ways,
            num_processes=num_processes, data_shards=cfg.data.shards or num_processes)

    # ---- the sampler
    def sampling_config(self, cfg: Any) -> SamplingConfig:
        """The training sampler's static config (the G x prompt-bucket shape set)."""
        s = cfg.sampling
        return SamplingConfig(
            group_sizes=self.group_sizes, prompts_per_step=max(self.prompts_per_g.values()),
            prompts_for_group=dict(self.prompts_per_g), prompt_buckets=self.prompt_buckets,
            cache_buckets=self.cache_buckets, max_new_tokens=self.max_new_tokens,
            decode_chunk=self.decode_chunk, use_top_k=s.top_k is not None,
            use_top_p=s.top_p is not None, prompt_too_long=s.prompt_too_long)

    def eval_sampling_config(self, cfg: Any, prompts: int = 64) -> SamplingConfig:
        """Greedy held-out evaluation during training: G = 1, `prompts` per call."""
        return SamplingConfig(
            group_sizes=(1,), prompts_per_step=prompts, prompt_buckets=self.prompt_buckets,
            cache_buckets=self.cache_buckets, max_new_tokens=self.max_new_tokens,
            decode_chunk=self.decode_chunk, prompt_too_long=cfg.sampling.prompt_too_long)

    # ---- the train step
    def train_shapes(self) -> Iterator[TrainShape]:
        """Every (G, prompt bucket, completion bucket) train step, in compile order."""
        for g in self.group_sizes:
            p = self.prompts_per_g[g]
            for lp in self.prompt_buckets:
                for n in self.completion_buckets:
                    yield TrainShape(g, p, p * g, lp, n)

    def completion_bucket(self, longest: int) -> int:
        """Train-step completion length for a batch whose longest completion is `longest`."""
        return bucket(max(int(longest), 1), self.completion_buckets)

    def micro_batches(self, rows: int) -> int:
        return micro_batches(rows, self.micro_batch_rows)

    def rows_split(self, rows: int) -> bool:
        """Whether `rows` shard over data x fsdp (else the batch is replicated)."""
        return rows % self.batch_ways == 0

    # ---- divisibility
    def problems(self) -> tuple[list[str], list[str]]:
        """(errors, warnings) of the plan against the mesh, the hosts and the data shards."""
        errors: list[str] = []
        warnings: list[str] = []
        n, shards, ways = self.num_processes, self.data_shards, self.batch_ways
        if shards % n:
            errors.append(f"data.shards: must be a multiple of the process count {n}, got "
                          f"{shards}")
        for g, p in self.prompts_per_g.items():
            rows = p * g
            if not self.rows_split(rows):
                msg = f"rows {rows} (= {p} prompts x G {g}) do not divide data x fsdp = {ways}"
                if n > 1:
                    errors.append(msg + ": host-local batches cannot form the global batch")
                else:
                    warnings.append(msg + ": the batch is replicated (correct, not data-parallel)")
            if shards % n == 0 and p % shards:
                errors.append(f"data.prompts_per_step: {p} prompts per step at G={g} do not "
                              f"divide data.shards = {shards} (each shard gives the same "
                              "number of prompts)")
            mb = self.micro_batch_rows
            if mb is not None and mb < rows:
                if rows % mb:
                    errors.append(f"algo.micro_batch_rows: {mb} must divide the batch rows "
                                  f"{rows} (prompts {p} x G {g})")
                elif self.rows_split(rows) and mb % ways:
                    warnings.append(f"algo.micro_batch_rows: {mb} does not divide data x fsdp "
                                    f"= {ways}: micro-batches are resharded every step")
        return errors, warnings

    def owned_shards(self, process_index: int) -> list[int]:
        """The contiguous virtual data shards process `process_index` reads."""
        per = self.data_shards // self.num_processes
        return list(range(process_index * per, (process_index + 1) * per))
