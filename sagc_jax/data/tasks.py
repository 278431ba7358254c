"""Built-in tasks.

``arith`` — verifiable multi-step arithmetic built for the straggler problem. A prompt is a
left-to-right chain of single-digit additions/subtractions, e.g. ``"7+5-3+8="``; the reference
solution writes one line per step and then the answer::

    7+5=12
    12-3=9
    9+8=17
    #### 17

(followed by EOS in training). The number of steps is geometric-ish — most prompts are short,
with a tail of long ones up to ``max_steps`` — so completion lengths vary prompt to prompt
(about 7 characters per step). Operands are digits 0..9 and every running total stays in 0..99:
at each step the operator is drawn from those that keep the total in range (``+`` is impossible
above 90, ``-`` below the operand), so no modular arithmetic is needed and every line is a true
equation.

Example ``i`` of a split is a pure function of ``(seed, i)``, so the 100k-example training set is
a lazy random-access source (:class:`ArithSource`), never a list in memory. Train and eval are
disjoint by construction: every prompt is assigned to a split by a stable hash of its text
(1 in ``EVAL_BUCKETS`` prompts are eval-only); a generator for one split redraws until it lands in
its split.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = [
    "EVAL_BUCKETS",
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

#: One prompt in ``EVAL_BUCKETS`` (by stable hash) belongs to the held-out split.
EVAL_BUCKETS = 8
#: Seed used for the eval split of built-in tasks (train seeds are the user's).
EVAL_SEED = 1_000_003
_MAX_TOTAL = 99
_MAX_REDRAWS = 10_000


def prompt_split(prompt: str) -> str:
    """``"eval"`` or ``"train"``: the split a prompt belongs to (stable across runs/platforms)."""
    h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "little")
    return "eval" if h % EVAL_BUCKETS == 0 else "train"


def _num_steps(rng: np.random.Generator, min_steps: int, max_steps: int, p_continue: float) -> int:
    """Truncated geometric: P(k) ∝ p_continue**(k - min_steps) on [min_steps, max_steps]."""
    k = np.arange(min_steps, max_steps + 1)
    w = p_continue ** (k - min_steps).astype(np.float64)
    return int(rng.choice(k, p=w / w.sum()))


def _draw(rng: np.random.Generator, min_steps: int, max_steps: int, p_continue: float) -> dict:
    steps = _num_steps(rng, min_steps, max_steps, p_continue)
    total = int(rng.integers(0, 10))
    prompt = [str(total)]
    lines = []
    for _ in range(steps):
        d = int(rng.integers(0, 10))
        ops = [op for op, ok in (("+", total + d <= _MAX_TOTAL), ("-", total - d >= 0)) if ok]
        op = ops[int(rng.integers(0, len(ops)))]
        new = total + d if op == "+" else total - d
        prompt.append(f"{op}{d}")
        lines.append(f"{total}{op}{d}={new}")
        total = new
    lines.append(f"#### {total}")
    return {
        "prompt": "".join(prompt) + "=",
        "answer": str(total),
        "solution": "\n".join(lines),
        "num_steps": steps,
    }


def arith_example(
    index: int,
    seed: int,
    *,
    min_steps: int = 1,
    max_steps: int = 12,
    p_continue: float = 0.7,
    split: str = "train",
) -> dict[str, Any]:
    """Example ``index`` of the arith ``split`` for ``seed`` (a pure function of its arguments).

    Returns a dict with ``prompt`` (e.g. ``"7+5-3+8="``), ``answer`` (``"17"``), ``solution``
    (reference completion without EOS) and ``num_steps``. ``split`` is ``"train"``, ``"eval"`` or
    ``"all"`` (no split filter).
    """
    if split not in ("train", "eval", "all"):
        raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if not 0.0 < p_continue <= 1.0:
        raise ValueError(f"p_continue must be in (0, 1], got {p_continue}")
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index), 0x5A6C])
    for _ in range(_MAX_REDRAWS):
        ex = _draw(rng, min_steps, max_steps, p_continue)
        if split == "all" or prompt_split(ex["prompt"]) == split:
            return ex
    raise RuntimeError(f"could not draw an arith example for split {split!r}")  # pragma: no cover


def make_arith_examples(
    n: int,
    seed: int,
    min_steps: int = 1,
    max_steps: int = 12,
    *,
    p_continue: float = 0.7,
    split: str = "train",
) -> list[dict[str, Any]]:
    """The first ``n`` examples of :class:`ArithSource` (``seed``, ``split``) as a list."""
    return list(ArithSource(n, seed, min_steps, max_steps, p_continue=p_continue, split=split))


def check_arith_solution(prompt: str, solution: str) -> bool:
    """True if ``solution`` is a correct step-by-step solution of ``prompt`` (used by tests)."""
    import re

    toks = re.findall(r"\d+|[+-]", prompt.rstrip("="))
    total = int(toks[0])
    lines = solution.strip().split("\n")
    if len(lines) != (len(toks) - 1) // 2 + 1:
        return False
    for j, line in enumerate(lines[:-1]):
        op, d = toks[1 + 2 * j], int(toks[2 + 2 * j])
        new = total + d if op == "+" else total - d
        if line != f"{total}{op}{d}={new}" or not 0 <= new <= _MAX_TOTAL:
            return False
        total = new
    return lines[-1] == f"#### {total}"


class ArithSource(Sequence[dict[str, Any]]):
    """Lazy random-access source of arith examples (grain ``RandomAccessDataSource`` protocol).

    ``src[i]`` generates example ``i`` deterministically from ``(seed, i)``; nothing is stored.
    """

    def __init__(
        self,
        n: int,
        seed: int,
        min_steps: int = 1,
        max_steps: int = 12,
        *,
        p_continue: float = 0.7,
        split: str = "train",
    ) -> None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._n = int(n)
        self._kw = dict(
            seed=int(seed),
            min_steps=int(min_steps),
            max_steps=int(max_steps),
            p_continue=float(p_continue),
            split=split,
        )
        arith_example(0, **self._kw)  # validate arguments eagerly

    def __len__(self) -> int:
        return self._n

    def longest_prompts(self) -> list[str]:
        """Prompts of the longest possible length (`max_steps` single-digit steps): checking
        these bounds every prompt of the source without generating them all."""
        steps = self._kw["max_steps"]
        return ["9" + "-9" * steps + "=", "0" + "+9" * steps + "="]

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        index = int(index)
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(f"index {index} out of range for ArithSource of length {self._n}")
        return arith_example(index, **self._kw)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self._n):
            yield arith_example(i, **self._kw)

    def __repr__(self) -> str:
        kw = ", ".join(f"{k}={v!r}" for k, v in self._kw.items())
        return f"ArithSource(n={self._n}, {kw})"


@dataclasses.dataclass(frozen=True)
class Task:
    """A built-in task: lazily generated train data, a held-out eval set and a default reward.

    Attributes:
      name: registry name.
      default_reward: reward name for :func:`sagc_jax.rl.rewards.resolve_reward`.
      description: one line for ``--help``/logs.
      make_train: ``(seed, n) -> Sequence[dict]``.
      make_eval: ``(n) -> list[dict]``.
      default_train_size: ``n`` when ``train_examples`` is called without one.
      default_eval_size: ``n`` when ``eval_examples`` is called without one.
    """

    name: str
    default_reward: str
    description: str
    make_train: Callable[[int, int], Sequence[dict[str, Any]]]
    make_eval: Callable[[int], list[dict[str, Any]]]
    default_train_size: int = 100_000
    default_eval_size: int = 512

    def train_examples(self, seed: int = 0, n: int | None = None) -> Sequence[dict[str, Any]]:
        """Training examples (a lazy random-access sequence of dicts)."""
        return self.make_train(seed, self.default_train_size if n is None else n)

    def eval_examples(self, n: int | None = None) -> list[dict[str, Any]]:
        """Held-out examples (fixed; disjoint from every train seed's prompts)."""
        return self.make_eval(self.default_eval_size if n is None else n)


def _arith_task(
    name: str = "arith",
    min_steps: int = 1,
    max_steps: int = 12,
    p_continue: float = 0.7,
) -> Task:
    kw = dict(min_steps=min_steps, max_steps=max_steps, p_continue=p_continue)
    ArithSource(0, 0, **kw)  # type: ignore[arg-type]  # validate
    return Task(
        name=name,
        default_reward="exact_answer",
        description=(
            f"multi-step single-digit +/- arithmetic, {min_steps}..{max_steps} steps "
            f"(truncated geometric, p_continue={p_continue}), answer after '#### '"
        ),
        make_train=lambda seed, n: ArithSource(n, seed, split="train", **kw),  # type: ignore[arg-type]
        make_eval=lambda n: list(ArithSource(n, EVAL_SEED, split="eval", **kw)),  # type: ignore[arg-type]
    )


#: Registry of task factories; ``get_task(name, **options)`` calls them.
TASKS: dict[str, Callable[..., Task]] = {
    "arith": _arith_task,
    # Short-only variant: handy for smoke tests and as a no-straggler baseline.
    "arith_short": lambda **kw: _arith_task(
        "arith_short", **{"min_steps": 1, "max_steps": 3, **kw}
    ),
    # arith with rambling SFT demonstrations: heavy-tailed completion lengths (ramble.py).
    "ramble": lambda **kw: _ramble_task(**kw),
    # Problems from reasoning-gym's generators, scored by their own verifiers (reasoning_gym.py).
    "reasoning_gym": lambda **kw: _reasoning_gym_task(**kw),
}

#: Tasks that take the config's ``data.task_min_steps`` / ``data.task_max_steps``.
STEP_TASKS = frozenset({"arith", "arith_short", "ramble"})


def _ramble_task(**kw: Any) -> Task:
    from sagc_jax.data.ramble import ramble_task  # ramble.py imports this module

    return ramble_task(**kw)


def _reasoning_gym_task(**options: Any) -> Task:
    from sagc_jax.data.reasoning_gym import ReasoningGymSource, heldout_examples, parse_options

    opts = parse_options(options)
    return Task(
        name="reasoning_gym",
        default_reward="reasoning_gym",
        description=opts.description(),
        make_train=lambda seed, n: ReasoningGymSource(n, seed, opts),
        make_eval=lambda n: heldout_examples(opts, n),
    )


def get_task(name: str, **options: Any) -> Task:
    """Look up a built-in task by name; ``options`` go to its factory (e.g. ``max_steps=8``).

    Raises:
      ValueError: unknown name (the message lists the built-in tasks) or bad options.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](**options)
    except TypeError as exc:
        raise ValueError(f"bad options for task {name!r}: {exc}") from exc
