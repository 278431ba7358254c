"""Rollout -> the train step's host arrays (`BATCH_FIELDS`), at the plan's buckets.

Sequence layout (all [R, ...], rows prompt-major): tokens [R, Lp + N] = left-padded prompt
(Lp = prompt bucket) | completion right-padded to N (the completion bucket).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class TrainBatch:
    """Host arrays of one update plus its static shape.

    arrays: `rl.train_step.BATCH_FIELDS` -> numpy [R, ...] (this process's rows);
    prompt_len / completion_len: the buckets Lp and N; num_groups: global prompts in the batch.
    """

    arrays: dict[str, np.ndarray]
    prompt_len: int
    completion_len: int
    num_groups: int

    @property
    def rows(self) -> int:
        """This process's rows."""
        return len(self.arrays["lengths"])


def make_batch(ro: Any, *, prompt_len: int, completion_len: int, num_groups: int, pad_id: int,
               mask_truncated: bool = False) -> TrainBatch:
    """The train batch of rollout `ro` (a `rollout.Rollout`, this process's rows).

    Truncated completions are left out of the loss with `mask_truncated` (DAPO); rows of dropped
    groups (`ro.valid` False) are in neither the loss nor the advantages. Group ids are global
    (this process's rows start at `ro.row_offset`).
    """
    g = ro.group_size
    rows = len(ro.lengths)
    lp, n = prompt_len, completion_len
    tokens = np.full((rows, lp + n), pad_id, np.int32)
    pad = np.zeros(rows, np.int32)
    for r in range(rows):
        ids = np.asarray(ro.examples[r // g]["prompt_ids"], np.int32)
        tokens[r, lp - len(ids):lp] = ids
        pad[r] = lp - len(ids)
    tokens[:, lp:] = ro.tokens[:, :n]
    loss_rows = ro.valid.copy()
    if mask_truncated:
        loss_rows &= ~ro.truncated
    arrays = {"tokens": tokens, "prompt_pad": pad, "lengths": ro.lengths.astype(np.int32),
              "old_logprobs": ro.logprobs[:, :n].astype(np.float32),
              "ref_logprobs": np.zeros((rows, n), np.float32), "rewards": ro.rewards,
              "group_ids": ((ro.row_offset + np.arange(rows)) // g).astype(np.int32),
              "valid": ro.valid, "loss_rows": loss_rows}
    return TrainBatch(arrays, lp, n, num_groups)
