"""The registry of built-in tasks: ``TASKS`` maps a name to a factory ``(**options) -> Task``.

A task module (``arith.py``, ``ramble.py``, …) builds its :class:`~sagc_jax.data.task.Task` from
the base in ``task.py`` (import it from there, not from here) and is listed here;
``get_task(name, **options)`` calls its factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sagc_jax.config.errors import ConfigError
from sagc_jax.data.arith import (
    ArithSource,
    arith_calc_task,
    arith_example,
    arith_task,
    check_arith_solution,
    make_arith_examples,
)
from sagc_jax.data.ramble import ramble_task
from sagc_jax.data.reasoning_gym import reasoning_gym_task
from sagc_jax.data.task import EVAL_BUCKETS, EVAL_SEED, Task, prompt_split

__all__ = [
    "EVAL_BUCKETS",
    "EVAL_SEED",
    "STEP_TASKS",
    "TASKS",
    "ArithSource",
    "Task",
    "arith_example",
    "check_arith_solution",
    "get_task",
    "make_arith_examples",
    "prompt_split",
]

#: Registry of task factories; ``get_task(name, **options)`` calls them.
TASKS: dict[str, Callable[..., Task]] = {
    "arith": arith_task,
    # Short-only variant: handy for smoke tests and as a no-straggler baseline.
    "arith_short": lambda **kw: arith_task(
        "arith_short", **{"min_steps": 1, "max_steps": 3, **kw}
    ),
    # arith solved with the calculator environment (env: {name: calculator}; envs/).
    "arith_calc": arith_calc_task,
    # arith with rambling SFT demonstrations: heavy-tailed completion lengths (ramble.py).
    "ramble": ramble_task,
    # Problems from reasoning-gym's generators, scored by their own verifiers (reasoning_gym.py).
    "reasoning_gym": reasoning_gym_task,
}

#: Tasks that take the config's ``data.task_min_steps`` / ``data.task_max_steps``.
STEP_TASKS = frozenset({"arith", "arith_short", "arith_calc", "ramble"})



def get_task(name: str, **options: Any) -> Task:
    """Look up a built-in task by name; ``options`` go to its factory (e.g. ``max_steps=8``).

    Raises:
      ConfigError (a ValueError) naming ``data.task``: unknown name (the message lists the
        built-in tasks) or bad options — bad input, exit 2 in the CLI.
    """
    if name not in TASKS:
        raise ConfigError(f"data.task: unknown task {name!r}; built-in tasks: "
                          f"{', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](**options)
    except TypeError as exc:
        raise ConfigError(f"data.task: bad options for task {name!r}: {exc}") from exc
