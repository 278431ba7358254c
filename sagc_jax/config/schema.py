"""The config schema: the root :class:`Config`, assembled from one section per module.

Sections: ``run``, ``checkpoint``, ``mesh``, ``distributed`` (:mod:`~sagc_jax.config.runtime`),
``model`` (:mod:`~sagc_jax.config.model`), ``data``, ``sampling``
(:mod:`~sagc_jax.config.data`), ``algo``, ``optim``, ``init`` (:mod:`~sagc_jax.config.algo`),
``sagc`` (:mod:`~sagc_jax.config.sagc`, read by the controller and the simulator) and ``env``
(:mod:`~sagc_jax.config.env`); the rewards list is here. Rules that involve one section live on
it (``model_validator``); :class:`Config` holds only the rules that span sections. See
:mod:`sagc_jax.config.load` for YAML and ``key=value`` overrides.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from sagc_jax.config.algo import AlgoConfig, InitConfig, OptimConfig
from sagc_jax.config.base import Float, Section, Str, field, rule_error
from sagc_jax.config.data import DataConfig, SamplingSection
from sagc_jax.config.env import EnvConfig
from sagc_jax.config.model import LoRASection, ModelSection
from sagc_jax.config.runtime import CheckpointConfig, DistributedConfig, MeshConfig, RunConfig
from sagc_jax.config.sagc import SAGCConfig

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "DistributedConfig",
    "EnvConfig",
    "InitConfig",
    "LoRASection",
    "MeshConfig",
    "ModelSection",
    "OptimConfig",
    "RewardSpec",
    "RunConfig",
    "SAGCConfig",
    "SamplingSection",
]


class RewardSpec(Section):
    """One reward function by registered name, with its weight in the total reward."""

    section_key = "rewards[*]"
    positional = ("name", "weight")
    name: Str = field(doc="Registered reward function name.")
    weight: Float = field(1.0, "Weight in the summed reward.")

    @model_validator(mode="after")
    def _name(self) -> RewardSpec:
        if not self.name.strip():
            raise rule_error("name", "must be a non-empty string")
        return self


class Config(Section):
    """The whole configuration. Build with :func:`load_config` or :func:`config_from_dict`."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataConfig = Field(default_factory=DataConfig)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    sagc: SAGCConfig = Field(default_factory=SAGCConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    rewards: tuple[RewardSpec, ...] = field(
        (RewardSpec("exact_answer", 1.0),), "Reward functions summed with weights."
    )
    reward_on_error: Literal["raise", "zero"] = field(
        "raise", "When a reward function raises or times out: stop the run with an error naming "
        "the function and example (the state from before the step is saved), or score the row 0 "
        "with a warning."
    )
    reward_timeout_s: Float | None = field(
        None, "Seconds one reward-function call may take; a call that takes longer is a failure "
        "handled by reward_on_error (the stuck call is abandoned in a background thread, not "
        "killed). None = wait forever.", gt=0
    )
    env: EnvConfig | None = field(
        None, "Multi-turn episodes against an environment (docs/environments.md); None = "
        "single-turn rollouts.")
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @property
    def warm_start_seed(self) -> int:
        """Seed of the model's random init and the SFT warm start: `init.seed`, else `run.seed`."""
        return self.run.seed if self.init.seed is None else self.init.seed

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, data: Any) -> Any:
        """``sagc: null`` (an empty YAML section) means the section's defaults."""
        if isinstance(data, Mapping):
            return {
                k: {} if v is None and k in _SECTIONS else v for k, v in data.items()
            }
        return data

    @model_validator(mode="after")
    def _across_sections(self) -> Config:
        """Rules that involve more than one section."""
        a, s = self.algo, self.sampling
        if a.overlong_buffer >= s.max_new_tokens:
            raise rule_error(
                "algo.overlong_buffer",
                f"must be < sampling.max_new_tokens ({s.max_new_tokens}), got {a.overlong_buffer}",
            )
        if not self.rewards:
            raise rule_error("rewards", "must list at least one reward")
        if self.env is not None and a.dynamic_sampling:
            raise rule_error("algo.dynamic_sampling", "does not refill multi-turn episodes "
                             "(env: is set); set it to false")
        return self


_SECTIONS = frozenset(
    name
    for name, f in Config.model_fields.items()
    if typing.get_origin(f.annotation) is None and issubclass(f.annotation, Section)
)
