"""The sampler's declared shape set: its config and bucket rounding (the rules are the shape
plan's, `sagc_jax.shapes`).

Every compiled generate program is keyed by `(group_size, prompt_bucket)`; everything else a call
may vary (prompt lengths within a bucket, max_new_tokens up to the configured max, temperature,
top-k/top-p values, the key, greedy) is a traced value, so it never triggers a compile.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, Literal

from sagc_jax.shapes import Shape, ShapePlan, cache_bucket, sampler_shapes


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampler settings; together they declare the compiled shape set.

    Attributes:
      group_sizes: allowed G (rows per prompt); one program per (G, prompt bucket).
      prompts_per_step: compiled prompt count P (a call with fewer pads with dummy prompts).
      prompts_for_group: optional per-G prompt counts {G: P_G} (fixed rollout count N = P_G * G);
        G missing from it use `prompts_per_step`.
      prompt_buckets: prompt lengths prompts are left-padded up to; strictly increasing.
      cache_buckets: KV-cache lengths; None -> prompt bucket + max_new_tokens. Otherwise each
        prompt bucket Lp uses the smallest cache bucket >= Lp + max_new_tokens.
      max_new_tokens: largest n a call may ask for (the output buffer size).
      decode_chunk: decode steps per iteration of the while loop (the all-done test runs once per
        chunk).
      use_top_k / use_top_p: compile the filtering code in (values stay dynamic per call).
      prefix_sharing: prefill each distinct prompt once and keep its K/V once for its G rows
        (decode attends over the shared prompt part and each row's own generated part);
        False repeats every prompt G times before prefill (the Tunix way; kept for benchmarks).
      prompt_too_long: "error" (default) or "truncate" (keep the last tokens of the prompt).
    """

    group_sizes: tuple[int, ...] = (4, 8, 12, 16)
    prompts_per_step: int = 8
    prompts_for_group: dict[int, int] | None = None
    prompt_buckets: tuple[int, ...] = (32, 64, 128)
    cache_buckets: tuple[int, ...] | None = None
    max_new_tokens: int = 128
    decode_chunk: int = 16
    use_top_k: bool = False
    use_top_p: bool = False
    prefix_sharing: bool = True
    prompt_too_long: Literal["error", "truncate"] = "error"

    def __post_init__(self) -> None:
        def inc(name: str, xs: Sequence[int]) -> None:
            increasing = all(a < b for a, b in itertools.pairwise(xs))
            if not xs or any(int(x) < 1 for x in xs) or not increasing:
                raise ValueError(f"SamplingConfig.{name} must be non-empty, positive and strictly "
                                 f"increasing, got {tuple(xs)}")

        inc("prompt_buckets", self.prompt_buckets)
        if len(set(self.group_sizes)) != len(self.group_sizes) or not self.group_sizes or any(
                g < 1 for g in self.group_sizes):
            raise ValueError(f"SamplingConfig.group_sizes must be distinct positive ints, got "
                             f"{self.group_sizes}")
        for name in ("prompts_per_step", "max_new_tokens", "decode_chunk"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SamplingConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.prompts_for_group is not None:
            bad = {g: p for g, p in self.prompts_for_group.items() if p < 1}
            if bad:
                raise ValueError(f"SamplingConfig.prompts_for_group counts must be >= 1: {bad}")
        if self.cache_buckets is not None:
            inc("cache_buckets", self.cache_buckets)
            for lp in self.prompt_buckets:
                cache_bucket_for(lp, self)  # raises if a prompt bucket has no cache bucket
        if self.prompt_too_long not in ("error", "truncate"):
            raise ValueError(f"SamplingConfig.prompt_too_long must be 'error' or 'truncate', got "
                             f"{self.prompt_too_long!r}")

    @classmethod
    def from_plan(cls, plan: ShapePlan, sampling: Any) -> SamplingConfig:
        """The training sampler's config: the plan's G x prompt-bucket shape set, and the
        filtering switches of the ``sampling:`` section."""
        return cls(
            group_sizes=plan.group_sizes, prompts_per_step=plan.max_prompts,
            prompts_for_group=dict(plan.prompts_per_g), prompt_buckets=plan.prompt_buckets,
            cache_buckets=plan.cache_buckets, max_new_tokens=plan.max_new_tokens,
            decode_chunk=plan.decode_chunk, use_top_k=sampling.top_k is not None,
            use_top_p=sampling.top_p is not None, prompt_too_long=sampling.prompt_too_long)

    @classmethod
    def for_eval(cls, plan: ShapePlan, sampling: Any, prompts: int = 64) -> SamplingConfig:
        """Greedy held-out evaluation during training: G = 1, `prompts` per call, the plan's
        prompt and cache buckets; weights in the model's dtype (an eval measures the policy,
        not the rollout engine's rounding of it)."""
        return cls(
            group_sizes=(1,), prompts_per_step=prompts, prompt_buckets=plan.prompt_buckets,
            cache_buckets=plan.cache_buckets, max_new_tokens=plan.max_new_tokens,
            decode_chunk=plan.decode_chunk, prompt_too_long=sampling.prompt_too_long)

    def prompts_for(self, g: int) -> int:
        """Compiled prompt count P_g for group size g."""
        if self.prompts_for_group and g in self.prompts_for_group:
            return int(self.prompts_for_group[g])
        return int(self.prompts_per_step)

    @property
    def out_buffer(self) -> int:
        """Token buffer length: max_new_tokens rounded up to whole decode chunks."""
        c = self.decode_chunk
        return -(-self.max_new_tokens // c) * c


def prompt_bucket_for(length: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= length, or None if the prompt is longer than every bucket."""
    for b in buckets:
        if length <= b:
            return int(b)
    return None


def cache_bucket_for(prompt_bucket: int, cfg: SamplingConfig) -> int:
    """KV-cache slots for a prompt bucket under `cfg` (`sagc_jax.shapes.cache_bucket`)."""
    return cache_bucket(prompt_bucket, cfg.max_new_tokens, cfg.cache_buckets)


def declared_shapes(cfg: SamplingConfig) -> tuple[Shape, ...]:
    """Every (group size, prompt bucket) shape the sampler compiles, in compile order."""
    return sampler_shapes(cfg.group_sizes, cfg.prompts_for, cfg.prompt_buckets,
                          cfg.max_new_tokens, cfg.cache_buckets)
