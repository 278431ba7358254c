"""The training prompts of each step: one grain iterator per owned virtual data shard.

A step's global batch is the shards' next prompts in shard order, so it does not depend on
how many processes share the shards; its position is part of the run's state (checkpointed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sagc_jax.errors import TrainingError


class PromptStream:
    """The step's prompts from one grain iterator per owned virtual data shard.

    The global batch is the shards' next prompts in shard order, so it does not depend on how
    many processes share the shards; its position (`get_state`) is checkpointed.
    """

    def __init__(self, iterators: Sequence[Any], num_shards: int, num_epochs: int | None):
        self.iterators = list(iterators)
        self.num_shards = num_shards
        self.num_epochs = num_epochs

    def take(self, step: int, num_prompts: int) -> list[dict[str, Any]]:
        """This process's block of `num_prompts` global prompts: num_prompts / S from each owned
        shard, in shard order."""
        per_shard = num_prompts // self.num_shards
        return self._next(step, [it for it in self.iterators for _ in range(per_shard)])

    def refill(self, step: int, need: int) -> list[dict[str, Any]]:
        """DAPO refill: `need` fresh prompts, cycling over the owned shards."""
        return self._next(step, [self.iterators[i % len(self.iterators)] for i in range(need)])

    def _next(self, step: int, iters: list[Any]) -> list[dict[str, Any]]:
        try:
            return [next(it) for it in iters]
        except StopIteration as e:
            raise TrainingError(f"training data exhausted at step {step} "
                                f"(data.num_epochs={self.num_epochs})") from e

    def get_state(self) -> list[Any]:
        return [it.get_state() for it in self.iterators]

    def set_state(self, states: list[Any]) -> None:
        for it, st in zip(self.iterators, states):
            it.set_state(st)
