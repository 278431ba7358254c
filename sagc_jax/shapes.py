"""The run's shape plan: every shape the sampler and the train step compile, derived once.

The one owner of rows and prompts per G (`prompts_for`), the prompt / cache buckets and the
train layout's sizes (`TrainLayout`). Read by SAGC's cost model and the simulator
(`prompts_for`), the sampler (`SamplingConfig.from_plan`, `sampler_shapes`), the train step
(`ShapePlan.train_layout`: the `train.learner.Learner` and `rl.batch.make_batch`) and the dry
run (the same lists, priced). A run only ever sees shapes from this plan, so `compiles` stays 0
after warm-up.
It imports nothing from the package: every layer above may read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


def prompts_for(sagc_cfg: Any, g: int, prompts_per_step: int) -> int:
    """Prompts per step at group size ``g`` (``sagc.batch_policy``): fixed B ("prompts") or
    ``rollouts_per_step // g`` ("rollouts"); rows = prompts x g."""
    if sagc_cfg.batch_policy == "prompts":
        return int(prompts_per_step)
    n = sagc_cfg.rollouts_per_step
    if n is None or n % g:
        raise ValueError(f"sagc.rollouts_per_step: must be divisible by group size {g}, got {n!r}")
    return n // g


def bucket(value: int, buckets: tuple[int, ...]) -> int:
    """Smallest bucket >= value; ValueError past the largest."""
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


def cache_bucket(prompt_bucket: int, max_new_tokens: int,
                 cache_buckets: Sequence[int] | None) -> int:
    """KV-cache slots for a prompt bucket: room for the prompt and max_new_tokens.

    The last decode step's K/V write is never read back, and steps past n only touch padding,
    so `Lp + max_new_tokens` slots are enough even when n is not a multiple of the chunk.
    `cache_buckets=None`: exactly that; else the smallest cache bucket that holds it.
    """
    need = prompt_bucket + max_new_tokens
    if cache_buckets is None:
        return need
    for b in cache_buckets:
        if b >= need:
            return int(b)
    raise ValueError(f"no cache bucket >= prompt bucket {prompt_bucket} + max_new_tokens "
                     f"{max_new_tokens} = {need}; cache_buckets={cache_buckets}")


def pack_len_for(max_prompt: int, max_new_tokens: int, multiple: int = 8) -> int:
    """Slots per packed row that fit the longest sequence (p + l - 1), rounded up to
    `multiple`."""
    need = max_prompt + max_new_tokens - 1
    return -(-need // multiple) * multiple


def default_chunk_rows(micro_batch_rows: int | None, batch_ways: int) -> tuple[int, ...]:
    """Packed chunk sizes: `micro_batch_rows` (or 8 x data x fsdp) halved while the half is
    still a multiple of data x fsdp, so every chunk shards evenly (with several processes each
    must: it is assembled from every process's rows) and an update pads fewer rows than the
    smallest size."""
    c = micro_batch_rows or 8 * batch_ways
    out = [c]
    while c % 2 == 0 and (c // 2) % batch_ways == 0:
        c //= 2
        out.append(c)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One compiled sampler shape: rows = prompts * group_size; caches have `cache_bucket`
    slots."""

    group_size: int
    prompts: int
    rows: int
    prompt_bucket: int
    cache_bucket: int


def sampler_shapes(group_sizes: Sequence[int], prompts: Callable[[int], int],
                   prompt_buckets: Sequence[int], max_new_tokens: int,
                   cache_buckets: Sequence[int] | None) -> tuple[Shape, ...]:
    """Every (group size, prompt bucket) sampler program, in compile order; `prompts(g)` is the
    prompt count at G = g."""
    out = []
    for g in group_sizes:
        p = prompts(g)
        for lp in prompt_buckets:
            out.append(Shape(g, p, p * g, lp, cache_bucket(lp, max_new_tokens, cache_buckets)))
    return tuple(out)


def train_programs(chunk_sizes: Sequence[int], *, logprobs: bool,
                   entropy: bool) -> tuple[tuple[str, int], ...]:
    """Every program one update runs, as (name, chunk rows; 0: not per chunk), in compile
    order: the accumulator's zeros and the optimizer apply; a log-prob pass's output buffer
    when there is one; per chunk size its grad step, log-prob step (`logprobs`: KL reference or
    mu > 1) and entropy step (`entropy`: `top_entropy_quantile < 1`). `Learner.warm_up`
    compiles exactly these and the dry run counts them."""
    out: list[tuple[str, int]] = [("zeros", 0), ("apply", 0)]
    if logprobs or entropy:
        out.append(("out", 0))
    for c in chunk_sizes:
        out.append(("grad", c))
        if logprobs:
            out.append(("logp", c))
        if entropy:
            out.append(("ent", c))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class TrainLayout:
    """The one train layout every update compiles, whatever G, prompt or completion lengths.

    Chunk arrays are int32 `[chunk rows, pack_len]` (tokens, positions, segment and branch
    ids) and `[chunk rows, completion_len]` (the scored slots and their targets), one program
    per size in `chunk_sizes` (global rows, largest first); per-sequence arrays are
    `[seqs, completion_len]` (log-probs, entropies) and `[seqs]`. The `train.learner.Learner`
    compiles it, `rl.batch.make_batch` fills it, the dry run prices it.

    Attributes:
      seqs: S, global sequences of the largest batch of any G.
      num_groups: groups (prompts) of the largest prompt count of any G.
      completion_len: N = `max_new_tokens`, also a row's cap on scored slots.
      pack_len: slots per row.
      chunk_sizes: the declared global chunk rows, largest first.
      share_prompts: several sequences a row, a group's prompt once (`algo.packing`).
    """

    seqs: int
    num_groups: int
    completion_len: int
    pack_len: int
    chunk_sizes: tuple[int, ...]
    share_prompts: bool = True

    def programs(self, *, logprobs: bool, entropy: bool) -> tuple[tuple[str, int], ...]:
        """The update's programs (`train_programs`) over this layout's chunk sizes."""
        return train_programs(self.chunk_sizes, logprobs=logprobs, entropy=entropy)


@dataclasses.dataclass(frozen=True)
class ShapePlan:
    """Group sizes, prompts per G, buckets and the divisibility a mesh and hosts need.

    Attributes:
      prompts_per_g: {G: prompts per step} (global, all processes together).
      batch_ways: data x fsdp devices the batch rows are sharded over.
      data_shards: virtual data shards (`data.shards`, default the process count).
      packing: the train layout packs several sequences a row, a group's prompt once
        (`algo.packing`); else one sequence per row. Either way pack_len slots per row, chunks
        of `pack_chunk_rows` rows (`train_layout`, `rl.batch`).
    """

    group_sizes: tuple[int, ...]
    prompts_per_g: dict[int, int]
    prompt_buckets: tuple[int, ...]
    cache_buckets: tuple[int, ...] | None
    max_new_tokens: int
    decode_chunk: int
    micro_batch_rows: int | None = None
    batch_ways: int = 1
    num_processes: int = 1
    data_shards: int = 1
    packing: bool = False
    pack_len: int = 0
    pack_chunk_rows: tuple[int, ...] = ()

    @staticmethod
    def rungs(cfg: Any) -> tuple[tuple[int, ...], list[str]]:
        """The group sizes of `cfg` whose prompt count is valid, and the others' errors (the
        dry run reports those and prices the rest)."""
        ok, errors = [], []
        for g in cfg.sagc.group_sizes:
            try:
                prompts_for(cfg.sagc, g, cfg.data.prompts_per_step)
                ok.append(g)
            except ValueError as e:
                errors.append(str(e))
        return tuple(ok), errors

    @classmethod
    def from_config(cls, cfg: Any, *, batch_ways: int = 1, num_processes: int = 1,
                    group_sizes: tuple[int, ...] | None = None) -> ShapePlan:
        """The plan of `cfg` (a Config); `group_sizes` restricts it (the dry run skips rungs
        whose prompt count is invalid). ValueError from `prompts_for` names a bad rung."""
        s, a = cfg.sampling, cfg.algo
        gs = tuple(cfg.sagc.group_sizes) if group_sizes is None else tuple(group_sizes)
        return cls(
            group_sizes=gs,
            prompts_per_g={g: prompts_for(cfg.sagc, g, cfg.data.prompts_per_step) for g in gs},
            prompt_buckets=tuple(s.prompt_buckets),
            cache_buckets=None if s.cache_buckets is None else tuple(s.cache_buckets),
            max_new_tokens=s.max_new_tokens, decode_chunk=s.decode_chunk,
            micro_batch_rows=cfg.algo.micro_batch_rows, batch_ways=batch_ways,
            num_processes=num_processes, data_shards=cfg.data.shards or num_processes,
            packing=bool(a.packing),
            pack_len=a.pack_len or pack_len_for(s.prompt_buckets[-1], s.max_new_tokens),
            pack_chunk_rows=tuple(sorted(a.pack_chunk_rows or default_chunk_rows(
                a.micro_batch_rows, batch_ways), reverse=True)))

    # ---- the sampler
    def sampler_shapes(self) -> tuple[Shape, ...]:
        """The training sampler's programs (what `SamplingConfig.from_plan` declares)."""
        return sampler_shapes(self.group_sizes, self.prompts_per_g.__getitem__,
                              self.prompt_buckets, self.max_new_tokens, self.cache_buckets)

    # ---- the train step
    @property
    def train_layout(self) -> TrainLayout:
        """The layout every update of this plan compiles (S, N, pack_len, chunk sizes)."""
        return TrainLayout(seqs=self.max_rows, num_groups=self.max_prompts,
                           completion_len=self.max_new_tokens, pack_len=self.pack_len,
                           chunk_sizes=self.pack_chunk_rows, share_prompts=self.packing)

    @property
    def max_rows(self) -> int:
        """The largest batch (global rows) of any G: a packed update's sequence count S."""
        return max(p * g for g, p in self.prompts_per_g.items())

    @property
    def max_prompts(self) -> int:
        """The largest prompt count of any G (the packed step's static group count)."""
        return max(self.prompts_per_g.values())

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
        need = self.prompt_buckets[-1] + self.max_new_tokens - 1
        if self.pack_len < need:
            errors.append(f"algo.pack_len: {self.pack_len} slots cannot hold the longest "
                          f"sequence (largest prompt bucket + max_new_tokens - 1 = {need})")
        odd = [c for c in self.pack_chunk_rows if c % ways]
        if odd and n > 1:
            errors.append(f"algo.pack_chunk_rows: {odd} do not divide data x fsdp = {ways}: "
                          "with several processes every chunk is assembled from each "
                          "process's rows")
        elif odd:
            warnings.append(f"algo.pack_chunk_rows: {odd} do not divide data x fsdp = {ways}:"
                            " those chunks are replicated (correct, not data-parallel)")
        return errors, warnings

    def owned_shards(self, process_index: int) -> list[int]:
        """The contiguous virtual data shards process `process_index` reads."""
        per = self.data_shards // self.num_processes
        return list(range(process_index * per, (process_index + 1) * per))
