"""Configuration: the schema declared once (pydantic v2), YAML loading, ``key=value`` overrides.

* :mod:`~sagc_jax.config.schema` — every section (``cfg.run``, ``cfg.model``, ``cfg.sampling``,
  ``cfg.sagc`` = :class:`~sagc_jax.config.sagc.SAGCConfig`, ...) and :class:`Config`.
* :mod:`~sagc_jax.config.load` — :func:`load_config`, :func:`apply_overrides`, round trip.
* :mod:`~sagc_jax.config.errors` — :class:`ConfigError`: one line naming the dotted key, e.g.
  ``sagc.delta: must be in (0, 1), got 1.5`` or
  ``unknown key 'sagc.detla' (did you mean 'sagc.delta'?)``.
* :mod:`~sagc_jax.config.base` — :class:`Section`, the frozen pydantic base of every section.

Sections are immutable and hashable: ``cfg.model_copy(update={...})`` replaces fields without
checking, ``cfg.validate()`` checks again.
"""

from __future__ import annotations

from sagc_jax.config.base import Section
from sagc_jax.config.env import EnvConfig
from sagc_jax.config.errors import ConfigError
from sagc_jax.config.errors import config_keys as _keys_of
from sagc_jax.config.load import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    load_saved_config,
    read_yaml,
    save_config,
)
from sagc_jax.config.sagc import SAGCConfig
from sagc_jax.config.schema import (
    AlgoConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    DistributedConfig,
    InitConfig,
    MeshConfig,
    ModelSection,
    OptimConfig,
    RewardSpec,
    RunConfig,
    SamplingSection,
)

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "EnvConfig",
    "InitConfig",
    "MeshConfig",
    "ModelSection",
    "OptimConfig",
    "RewardSpec",
    "RunConfig",
    "SAGCConfig",
    "SamplingSection",
    "Section",
    "apply_overrides",
    "config_from_dict",
    "config_keys",
    "config_to_dict",
    "load_config",
    "load_saved_config",
    "read_yaml",
    "save_config",
]


def config_keys(cls: type | None = None, *, sections: bool = False) -> list[str]:
    """All valid dotted keys of ``cls`` (default :class:`Config`); with ``sections`` also the
    section names. Items of list-of-section fields appear as ``rewards[*].weight``."""
    return _keys_of(Config if cls is None else cls, sections=sections)
