"""Configuration: the schema declared once (pydantic v2), YAML loading, ``key=value`` overrides.

* :mod:`~sagc_jax.config.schema` — every section (``cfg.run``, ``cfg.model``, ``cfg.sampling``,
  ``cfg.sagc`` = :class:`sagc_jax.sagc.config.SAGCConfig`, ...) and :class:`Config`.
* :mod:`~sagc_jax.config.load` — :func:`load_config`, :func:`apply_overrides`, round trip.
* :mod:`~sagc_jax.config.errors` — :class:`ConfigError`: one line naming the dotted key, e.g.
  ``sagc.delta: must be in (0, 1), got 1.5`` or
  ``unknown key 'sagc.detla' (did you mean 'sagc.delta'?)``.
* :mod:`~sagc_jax.config.base` — :class:`Section`, the frozen pydantic base of every section.

Sections are immutable and hashable: ``cfg.model_copy(update={...})`` replaces fields without
checking, ``cfg.validate()`` checks again.

The schema and loader are imported on first use (PEP 562): ``sagc_jax.sagc.config`` builds on
``sagc_jax.config.base`` while the schema imports ``SAGCConfig``, so an eager import here would
be circular.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sagc_jax.config.base import Section
from sagc_jax.config.errors import ConfigError
from sagc_jax.config.errors import config_keys as _keys_of

if TYPE_CHECKING:
    from sagc_jax.config.load import (
        apply_overrides,
        config_from_dict,
        config_to_dict,
        load_config,
        read_yaml,
        save_config,
    )
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
        SAGCConfig,
        SamplingSection,
    )

_LAZY = {
    **dict.fromkeys(
        ["apply_overrides", "config_from_dict", "config_to_dict", "load_config", "read_yaml",
         "save_config"],
        "load",
    ),
    **dict.fromkeys(
        ["AlgoConfig", "CheckpointConfig", "Config", "DataConfig", "DistributedConfig",
         "InitConfig", "MeshConfig", "ModelSection", "OptimConfig", "RewardSpec", "RunConfig",
         "SAGCConfig", "SamplingSection"],
        "schema",
    ),
}

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
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
    "read_yaml",
    "save_config",
]


def config_keys(cls: type | None = None, *, sections: bool = False) -> list[str]:
    """All valid dotted keys of ``cls`` (default :class:`Config`); with ``sections`` also the
    section names. Items of list-of-section fields appear as ``rewards[*].weight``."""
    if cls is None:
        from sagc_jax.config.schema import Config as cls
    return _keys_of(cls, sections=sections)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
