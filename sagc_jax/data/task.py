"""What every built-in task is made of: the :class:`Task` record, one lazy random-access source
(:class:`LazySource`) and the stable train/eval split of prompts.

A task's example ``i`` is a pure function of ``(seed, i)``, so a 100k-example training set is a
:class:`LazySource` over that function, never a list in memory. Train and eval are disjoint by
construction: every prompt is assigned to a split by a stable hash of its text (1 in
``EVAL_BUCKETS`` prompts is eval-only); a generator for one split redraws until it lands there.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

__all__ = ["EVAL_BUCKETS", "EVAL_SEED", "MAX_REDRAWS", "LazySource", "Task", "prompt_split"]

#: One prompt in ``EVAL_BUCKETS`` (by stable hash) belongs to the held-out split.
EVAL_BUCKETS = 8
#: Seed used for the eval split of built-in tasks (train seeds are the user's).
EVAL_SEED = 1_000_003
#: Draws a generator may take to land in its split before giving up.
MAX_REDRAWS = 10_000


def prompt_split(prompt: str) -> str:
    """``"eval"`` or ``"train"``: the split a prompt belongs to (stable across runs/platforms)."""
    h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "little")
    return "eval" if h % EVAL_BUCKETS == 0 else "train"


class LazySource(Sequence[dict[str, Any]]):
    """Lazy random-access source (grain ``RandomAccessDataSource`` protocol) of ``n`` examples.

    ``src[i]`` is ``example(i, **kw)``, generated on demand; nothing is stored. Task modules
    subclass it only to name their arguments (``ArithSource``, ``RambleSource``).
    """

    def __init__(self, example: Callable[..., dict[str, Any]], n: int, **kw: Any) -> None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._example = example
        self._n = int(n)
        self._kw = kw
        example(0, **kw)  # validate arguments eagerly

    def __len__(self) -> int:
        return self._n

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
            raise IndexError(f"index {index} out of range for {type(self).__name__} of length "
                             f"{self._n}")
        return self._example(index, **self._kw)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self._n):
            yield self._example(i, **self._kw)

    def __repr__(self) -> str:
        kw = ", ".join(f"{k}={v!r}" for k, v in self._kw.items())
        return f"{type(self).__name__}(n={self._n}, {kw})"


@dataclasses.dataclass(frozen=True)
class Task:
    """A built-in task: lazily generated train data, a held-out eval set and a default reward.

    Attributes:
      name: registry name.
      default_reward: reward name for :func:`sagc_jax.rewards.resolve_reward`.
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
