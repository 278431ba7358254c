"""Rollout sampling: bucketed shapes, prefix sharing, chunked while-loop decode."""

from sagc_jax.sampling.buckets import SamplingConfig, Shape, declared_shapes, prompt_bucket_for
from sagc_jax.sampling.compile_counter import compile_count
from sagc_jax.sampling.draw import sample_step
from sagc_jax.sampling.sampler import SampleOutput, Sampler, SampleStats

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
