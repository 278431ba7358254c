"""The environment API of multi-turn rollouts, and how the trainer calls one safely.

An environment is a class (one instance per episode, built with the config's `env.options`)::

    class MyEnv:
        stop = ("</call>",)                     # strings that end a model turn, besides EOS
        def reset(self, example: dict) -> str:  # the example's fields; an opening observation
            ...                                 # ("" = none) appended after the prompt
        def step(self, action: str) -> StepResult | tuple[str, float, bool]:
            ...                                 # action: the turn's model text (stop included)

`step` returns the observation appended for the next turn (environment tokens: context, never
trained on), a reward and whether the episode is over: the shape of google/tunix's `BaseEnv`
and of the Gym-style environments TRL drives. Subclassing :class:`Environment` is optional.

How the trainer names, builds and calls one safely is `envs.runner` (`EnvSpec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class EnvNameError(ValueError):
    """`env.name` resolves to no class (a config error: the message names it)."""


class EnvError(RuntimeError):
    """An environment raised, timed out or returned something unusable."""


class StepResult(NamedTuple):
    """What one `step` returns: the next observation (text), its reward, whether it ended."""

    observation: str
    reward: float = 0.0
    done: bool = False


class Environment:
    """Optional base class: no stop strings, an empty opening observation."""

    stop: tuple[str, ...] = ()

    def reset(self, example: Mapping[str, Any]) -> str:
        """Starts an episode for `example` (its dataset fields); returns the opening observation
        ("" = none: the prompt alone opens the episode)."""
        return ""

    def step(self, action: str) -> StepResult:  # pragma: no cover - abstract
        """The model's turn text -> (observation, reward, done)."""
        raise NotImplementedError
