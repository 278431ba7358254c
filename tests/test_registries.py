"""The config's `algo.*` choices are the registries' names: a name added to a registry (or to the
schema) without the other fails here."""

from __future__ import annotations

import typing

import pytest

from sagc_jax.config import AlgoConfig
from sagc_jax.rl.advantages import ADVANTAGE_ESTIMATORS
from sagc_jax.rl.losses import IMPORTANCE_WEIGHTS, KL_ESTIMATORS, LOSS_AGGREGATIONS


def _choices(field: str) -> set[str]:
    return set(typing.get_args(AlgoConfig.model_fields[field].annotation))


@pytest.mark.parametrize(("field", "registry"), [
    ("scale_rewards", ADVANTAGE_ESTIMATORS),
    ("loss_agg", LOSS_AGGREGATIONS),
    ("importance_sampling", IMPORTANCE_WEIGHTS),
    ("kl_estimator", KL_ESTIMATORS),
])
def test_algo_choices_are_registry_names(field, registry):
    assert _choices(field) == set(registry)
    assert all(callable(fn) for fn in registry.values())
