"""Trainer-facing SAGC wrappers: ``SAGCPolicy`` (adaptive), ``StaticPolicy`` (fixed g),
``make_policy`` and the batch policy ``prompts_for``. They hold the pure controller state
(an ``SAGCState``, ``state.py``) and expose ``choose() -> g`` / ``observe(obs) -> metrics`` /
``load_state(restored)``. The run's length (``horizon``) and, in the simulator, the seed of the
controller's draws are passed when a policy is built; they live in its state. ``consts``: the
controller's constants (``SAGCConstants``), handed to every call; None (the default): the
shipped ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sagc_jax.config.sagc_constants import SAGCConstants
from sagc_jax.sagc.controller import (
    REASONS,
    Choice,
    SAGCConfig,
    State,
    choose,
    init_state,
    normalize_state,
    observe,
    record_choice,
)
from sagc_jax.sagc.estimators import posterior_risk
from sagc_jax.sagc.events import Observation, step_straggler_rate
from sagc_jax.shapes import prompts_for

__all__ = ["SAGCPolicy", "StaticPolicy", "make_policy", "prompts_for"]


class SAGCPolicy:
    """Adaptive group size. ``choose() -> g``; after the step, ``observe(obs) -> metrics``.

    ``horizon``: steps in the run (None = unknown); ``seed``: of the controller's Monte-Carlo
    draws (None = the constant, 0); ``consts``: the constants (None = the shipped ones);
    ``prompts``, ``max_new_tokens``: the run's step shape, known before its first step (None:
    unknown; ``init_state``)."""

    def __init__(self, cfg: SAGCConfig, *, horizon: int | None = None, seed: int | None = None,
                 consts: SAGCConstants | None = None, prompts: int | None = None,
                 max_new_tokens: int | None = None):
        self.cfg = cfg.validate()
        self.consts = consts
        self.state: State = init_state(cfg, horizon=horizon, seed=seed, consts=consts,
                                       prompts=prompts, max_new_tokens=max_new_tokens)
        self.last_choice: Choice | None = None  # the last decision with its diagnostics

    @property
    def last_reason(self) -> str:
        """Why the last ``choose`` picked its g (one of ``REASONS``; "init" before any)."""
        return REASONS[int(self.state.decision.last_reason)]

    def choose(self) -> int:
        self.last_choice = choose(self.cfg, self.state, self.consts)
        self.state = record_choice(self.state, self.last_choice)
        return self.last_choice.g

    def observe(self, obs: Observation) -> dict[str, Any]:
        self.state = observe(self.cfg, self.state, obs, self.consts)
        risk = posterior_risk(self.cfg, self.state, consts=self.consts)
        metrics: dict[str, Any] = {
            "straggler_rate": float(self.state.budget.last_rate),
            "sagc_queue": float(self.state.budget.queue),
            "sagc_reason": self.last_reason,
        }
        for g, r in zip(self.cfg.group_sizes, risk):
            metrics[f"risk_g{g}"] = float(r)
        return metrics

    def load_state(self, state: State | dict[str, Any]) -> None:
        """Adopt a restored state: a checkpoint's nested dict or a typed ``SAGCState``."""
        self.state = normalize_state(self.cfg, state, self.consts)


class StaticPolicy:
    """Always ``initial_group_size``; same interface and straggler-rate metric as SAGCPolicy."""

    def __init__(self, cfg: SAGCConfig, *, horizon: int | None = None, seed: int | None = None,
                 consts: SAGCConstants | None = None, prompts: int | None = None,
                 max_new_tokens: int | None = None):
        del prompts, max_new_tokens  # a fixed g needs no price
        self.cfg = cfg.validate()
        self.consts = consts
        self.state: State = init_state(cfg, horizon=horizon, seed=seed, consts=consts)
        self.last_reason = "init"  # "static" once it has chosen

    def choose(self) -> int:
        self.last_reason = "static"
        return self.cfg.start_group_size

    def observe(self, obs: Observation) -> dict[str, Any]:
        rate = step_straggler_rate(self.cfg, obs, self.consts)
        st = self.state
        self.state = st._replace(
            decision=st.decision._replace(step=np.array(int(st.decision.step) + 1, np.int64)),
            budget=st.budget._replace(last_rate=np.array(rate)),
        )
        return {"straggler_rate": rate, "sagc_queue": 0.0, "sagc_reason": "static"}

    def load_state(self, state: State | dict[str, Any]) -> None:
        """Adopt a restored state: a checkpoint's nested dict or a typed ``SAGCState``."""
        self.state = normalize_state(self.cfg, state, self.consts)


def make_policy(
    cfg: SAGCConfig,
    *,
    horizon: int | None = None,
    seed: int | None = None,
    consts: SAGCConstants | None = None,
    prompts: int | None = None,
    max_new_tokens: int | None = None,
) -> SAGCPolicy | StaticPolicy:
    """SAGCPolicy when ``cfg.enabled`` else StaticPolicy (keywords as SAGCPolicy)."""
    cls = SAGCPolicy if cfg.enabled else StaticPolicy
    return cls(cfg, horizon=horizon, seed=seed, consts=consts, prompts=prompts,
               max_new_tokens=max_new_tokens)
