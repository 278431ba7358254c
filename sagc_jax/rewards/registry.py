"""Reward names: the built-ins, ``"package.module:function"`` lookup and the config's bundle.

A reward function is any callable ``fn(prompts: list[str], completions: list[str], **columns)
-> list[float]`` where ``columns`` are the dataset's other columns as lists aligned with
``completions`` (e.g. ``answer=[...]``). A function should accept ``**kwargs`` so unknown columns
are ignored. ``None`` in the returned list means "not applicable to this example" (TRL); see
`sagc_jax.rewards.runner` for how the values are combined.

In the config, rewards are named by a built-in name (:data:`BUILTIN_REWARDS`) or as
``"package.module:function"``, each with a weight: :func:`build_reward_fns` turns that into
a bundle of :class:`RewardFn`; a name that resolves to nothing is a :class:`RewardNameError`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sagc_jax.rewards.answers import exact_answer_reward, format_reward, gsm8k_reward
from sagc_jax.rewards.verifiers import (
    math_verify_reward,
    reasoning_gym_reward,
    reasoning_gym_strict_reward,
)

RewardCallable = Callable[..., Sequence[Any]]


class RewardNameError(ValueError):
    """A reward name that resolves to no callable (a config error: the message names it)."""


#: Built-in reward functions by config name.
BUILTIN_REWARDS: dict[str, RewardCallable] = {
    "exact_answer": exact_answer_reward,
    "gsm8k": gsm8k_reward,
    "format": format_reward,
    # External verifiers (rewards/verifiers.py): reasoning-gym's score_answer, HF math-verify.
    "reasoning_gym": reasoning_gym_reward,
    "reasoning_gym_strict": reasoning_gym_strict_reward,
    "math_verify": math_verify_reward,
}

#: Where the built-ins lived before they became this package (issue 52).
_OLD_MODULES = ("sagc_jax.rl.rewards", "sagc_jax.rl.answer_rewards", "sagc_jax.rl.verifiers")


def resolve_reward(name: str) -> RewardCallable:
    """A reward callable from a built-in name or ``"package.module:function"``.

    Raises:
      RewardNameError: unknown built-in (lists them), unimportable module, missing or
        non-callable attribute, a module the built-ins moved out of — each message names what
        was asked for.
    """
    if isinstance(name, str) and name.partition(":")[0] in _OLD_MODULES:
        old, _, attr = name.partition(":")
        new = next((f"{f.__module__}:{attr}" for f in BUILTIN_REWARDS.values()
                    if f.__name__ == attr), "sagc_jax.rewards")
        raise RewardNameError(f"reward {name!r}: module {old!r} moved to sagc_jax.rewards; "
                              f"use {new!r} (or a built-in name: "
                              f"{', '.join(sorted(BUILTIN_REWARDS))})")
    return resolve_named(name, BUILTIN_REWARDS, kind="reward", error=RewardNameError)


def resolve_named(name: str, builtins: Mapping[str, Any], *, kind: str,
                  error: type[ValueError], form: str = "package.module:function") -> Any:
    """A callable from a built-in name (a key of `builtins`) or ``"package.module:attr"``: the
    one name lookup of the config's plug-ins (rewards here, environments in `sagc_jax.envs`).
    Raises `error`, one line naming the `kind` ("reward", "env") and what was asked for: an
    unknown built-in (listing them), an unimportable module, a missing or non-callable attribute.
    """
    if not isinstance(name, str) or not name:
        raise error(f"{kind} name must be a non-empty string, got {name!r}")
    if name in builtins:
        return builtins[name]
    if ":" not in name:
        raise error(
            f"unknown {kind} {name!r}; built-ins: {', '.join(sorted(builtins))} "
            f"(or use '{form}')"
        )
    mod_name, _, attr = name.partition(":")
    if not mod_name or not attr:
        raise error(f"{kind} {name!r}: expected '{form}'")
    module = _import_module(name, mod_name, kind, error)
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise error(f"{kind} {name!r}: module {mod_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise error(f"{kind} {name!r}: {attr!r} is not callable")
    return fn


def _import_module(name: str, mod_name: str, kind: str, error: type[ValueError]) -> Any:
    """Imports a plug-in's module; a module in the current directory is found too (as with
    `python -m`), also when running the installed `sagc-jax` script, whose sys.path lacks it."""
    cwd = os.getcwd()
    top = mod_name.split(".")[0]
    for attempt in range(2):
        try:
            return importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name != top:  # the module exists but imports something missing
                raise error(f"{kind} {name!r}: cannot import module {mod_name!r}: "
                            f"{exc}") from None
            if attempt or cwd in sys.path or "" in sys.path:
                break
            sys.path.append(cwd)
        except Exception as exc:
            raise error(f"{kind} {name!r}: importing module {mod_name!r} failed: "
                        f"{type(exc).__name__}: {exc}") from None
    raise error(f"{kind} {name!r}: cannot import module {mod_name!r}: no module "
                f"{top!r} in the current directory ({cwd}) or on the Python path "
                "(set PYTHONPATH to its directory)")


@dataclasses.dataclass(frozen=True)
class RewardFn:
    """A named, weighted reward function."""

    name: str
    fn: RewardCallable
    weight: float = 1.0
    timeout_s: float | None = None  # seconds per call; None waits forever (rewards/runner.py)

    @classmethod
    def from_name(cls, name: str, weight: float = 1.0) -> RewardFn:
        """Resolve ``name`` with :func:`resolve_reward`."""
        return cls(name, resolve_reward(name), float(weight))


def build_reward_fns(spec: Any, timeout_s: float | None = None) -> list[RewardFn]:
    """Reward bundle from a config value, each function called within `timeout_s` seconds
    (None: no timeout; config ``reward_timeout_s``).

    Accepts a name (``"exact_answer"``), a mapping ``{name: weight}``, or a list of names,
    mappings ``{"name": ..., "weight": ...}`` or objects with ``.name``/``.weight`` (the
    config's ``RewardSpec``).
    """
    if isinstance(spec, str | Mapping):
        spec = [spec] if isinstance(spec, str) else [{"name": k, "weight": v}
                                                     for k, v in spec.items()]
    items: list[tuple[str, Any]] = []
    for e in spec:
        if isinstance(e, str):
            items.append((e, 1.0))
        elif isinstance(e, Mapping) and "name" in e:
            items.append((str(e["name"]), e.get("weight", 1.0)))
        elif hasattr(e, "name") and not callable(e):  # e.g. config.RewardSpec
            items.append((str(e.name), getattr(e, "weight", 1.0)))
        else:
            raise ValueError(f"bad reward entry {e!r}: expected name or {{name, weight}}")
    fns = [RewardFn(n, resolve_reward(n), float(w), timeout_s) for n, w in items]
    if not fns:
        raise ValueError("no reward functions configured")
    check_unique(fns)
    return fns


def check_unique(fns: Sequence[RewardFn]) -> None:
    """Raises ValueError naming the reward names listed more than once."""
    names = [f.name for f in fns]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"reward functions listed more than once: {dup}")
