"""Straggler-Aware Group Control: the controller (pure state + update functions) and the
offline simulator. See docs/sagc.md."""

from sagc_jax.config.sagc import SAGCConfig
from sagc_jax.sagc.controller import (
    REASONS,
    Choice,
    State,
    choose,
    init_state,
    observe,
    record_choice,
)
from sagc_jax.sagc.estimators import (
    posterior_risk,
    predicted_benefit,
    predicted_cost,
)
from sagc_jax.sagc.events import (
    Observation,
    counterfactual_risk,
    hypergeom_none,
    step_straggler_rate,
    straggler_events,
)
from sagc_jax.sagc.policy import SAGCPolicy, StaticPolicy, make_policy
from sagc_jax.sagc.state import (
    Benefit,
    Budget,
    Change,
    Cost,
    Decision,
    Length,
    Risk,
    SAGCState,
)
from sagc_jax.shapes import prompts_for  # the shape plan's rule, re-exported

__all__ = [
    "REASONS",
    "Benefit",
    "Budget",
    "Change",
    "Choice",
    "Cost",
    "Decision",
    "Length",
    "Observation",
    "Risk",
    "SAGCConfig",
    "SAGCPolicy",
    "SAGCState",
    "State",
    "StaticPolicy",
    "choose",
    "counterfactual_risk",
    "hypergeom_none",
    "init_state",
    "make_policy",
    "observe",
    "posterior_risk",
    "predicted_benefit",
    "predicted_cost",
    "prompts_for",
    "record_choice",
    "simulate_main",
    "step_straggler_rate",
    "straggler_events",
]


def simulate_main(argv: list[str]) -> int:
    """``sagc-jax simulate`` entry point (imported lazily: pulls in matplotlib only if plotting)."""
    from sagc_jax.sagc.simulate_cli import simulate_main as _main

    return _main(argv)
