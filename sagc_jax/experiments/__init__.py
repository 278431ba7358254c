"""Experiments: SAGC against static group sizes (`sagc-jax compare`)."""

from sagc_jax.experiments.compare import run_comparison
from sagc_jax.experiments.policies import DEFAULT_POLICIES, Policy, parse_policies, parse_seeds
from sagc_jax.experiments.report import format_cell, format_results_md
from sagc_jax.experiments.summary import (
    COLUMNS,
    aggregate,
    auto_target,
    cumulative_seconds,
    spread,
    step_seconds,
    summarize_run,
    time_to_target,
)
from sagc_jax.metrics import moving_average

__all__ = [
    "COLUMNS", "DEFAULT_POLICIES", "Policy", "aggregate", "auto_target", "cumulative_seconds",
    "format_cell", "format_results_md", "moving_average", "parse_policies", "parse_seeds",
    "run_comparison", "spread", "step_seconds", "summarize_run", "time_to_target",
]
