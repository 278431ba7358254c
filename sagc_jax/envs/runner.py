"""How the trainer names, builds and calls environments (the API is `envs.base`).

The config names the class like a reward (`env.name`: a built-in from :data:`BUILTIN_ENVS` or
``"package.module:Class"``, resolved by the rewards' `rewards.registry.resolve_named`); every call
(constructor, `reset`, `step`) runs under `env.timeout_s` with the rewards' runner
(`rewards.runner.call_with_timeout`). A bad name is an :class:`EnvNameError` (exit 2); an env that
raises, times out or returns something unusable is an :class:`EnvError` naming the env, the
example and the call, in one line (exit 1), as a failing reward is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from sagc_jax.envs.base import EnvError, EnvNameError, StepResult
from sagc_jax.envs.calculator import Calculator
from sagc_jax.rewards.registry import resolve_named
from sagc_jax.rewards.runner import RewardTimeout, call_with_timeout

#: Built-in environments by config name.
BUILTIN_ENVS: dict[str, Callable[..., Any]] = {"calculator": Calculator}


def resolve_env(name: str) -> Callable[..., Any]:
    """The environment class of `env.name` (built-in or ``"package.module:Class"``)."""
    return resolve_named(name, BUILTIN_ENVS, kind="env", error=EnvNameError,
                         form="package.module:Class")


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """A resolved `env:` section: how to build, reset and step episodes safely.

    Attributes:
      name: the config name (in every message).
      factory: the class (called with `options` once per episode).
      options: keyword arguments of the constructor.
      timeout_s: seconds per call (constructor, reset, step); None waits forever.
      stop: stop strings ending a model turn: `env.stop`, else the class's `stop`.
    """

    name: str
    factory: Callable[..., Any]
    options: Mapping[str, Any]
    timeout_s: float | None
    stop: tuple[str, ...]

    @classmethod
    def from_config(cls, env: Any) -> EnvSpec:
        """From the config's `env:` section (`config.env.EnvConfig`)."""
        factory = resolve_env(env.name)
        stop = env.stop if env.stop is not None else tuple(getattr(factory, "stop", ()) or ())
        return cls(env.name, factory, dict(env.options or {}), env.timeout_s, tuple(stop))

    def _run(self, what: str, index: int, call: Callable[[], Any]) -> Any:
        try:
            return call_with_timeout(call, self.timeout_s, thread_name=f"env-{self.name}",
                                     setting="env.timeout_s")
        except RewardTimeout as exc:
            raise EnvError(f"env {self.name!r} failed on example {index} ({what}): "
                           f"{exc}") from None
        except Exception as exc:
            raise EnvError(f"env {self.name!r} failed on example {index} ({what}): raised "
                           f"{type(exc).__name__}: {exc}") from exc

    def make(self, index: int) -> Any:
        """A fresh environment for the episode of example `index` (`index` names it in errors)."""
        return self._run("constructor", index, lambda: self.factory(**self.options))

    def reset(self, env: Any, example: Mapping[str, Any], index: int) -> str:
        """`env.reset(example)`, checked to be a string."""
        obs = self._run("reset", index, lambda: env.reset(dict(example)))
        if not isinstance(obs, str):
            raise EnvError(f"env {self.name!r} failed on example {index} (reset): returned "
                           f"{type(obs).__name__}, expected a str observation")
        return obs

    def step(self, env: Any, action: str, index: int, turn: int) -> StepResult:
        """`env.step(action)` as a checked `StepResult` (a finite reward, a str observation)."""
        what = f"step of turn {turn}"
        out = self._run(what, index, lambda: env.step(action))
        try:
            obs, reward, done = out
            reward = float(reward)
        except (TypeError, ValueError):
            raise EnvError(f"env {self.name!r} failed on example {index} ({what}): returned "
                           f"{out!r:.80}, expected (observation, reward, done)") from None
        if not isinstance(obs, str) or not math.isfinite(reward):
            raise EnvError(f"env {self.name!r} failed on example {index} ({what}): returned "
                           f"observation {obs!r:.40} / reward {reward}, expected a str and a "
                           "finite number")
        return StepResult(obs, reward, bool(done))
