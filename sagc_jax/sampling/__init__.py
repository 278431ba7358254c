"""Rollout sampling: bucketed shapes, prefix sharing, chunked while-loop decode."""

from sagc_jax.sampling.buckets import SamplingConfig, Shape, declared_shapes, prompt_bucket_for
from sagc_jax.sampling.compile_counter import compile_count
from sagc_jax.sampling.sampler import SampleOutput, Sampler, SampleStats, sample_step

__all__ = [
    "SampleOutput",
    "SampleStats",
    "Sampler",
    "SamplingConfig",
    "Shape",
    "compile_count",
    "declared_shapes",
    "prompt_bucket_for",
    "sample_step",
]
