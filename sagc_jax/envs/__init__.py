"""Environments for multi-turn, tool-using rollouts (docs/environments.md)."""

from sagc_jax.envs.base import EnvError, Environment, EnvNameError, StepResult
from sagc_jax.envs.calculator import Calculator, evaluate
from sagc_jax.envs.runner import BUILTIN_ENVS, EnvSpec, resolve_env

__all__ = ["BUILTIN_ENVS", "Calculator", "EnvError", "EnvNameError", "EnvSpec", "Environment",
           "StepResult", "evaluate", "resolve_env"]
