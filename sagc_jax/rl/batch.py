"""Rollout -> the train batch: one layout, built from the rollout's groups (`rl.packing`).

A rollout is prompt-major: group i is rows [i*G, (i+1)*G), all of one prompt. The batch places
each sequence (prompt | completion) in rows of `pack_len` slots, a group's prompt once per row
for the completions of that group there (`share_prompts`, `algo.packing`), or one sequence per
row (the padded case). Either way the update sees the same arrays:

    chunks  one dict per compiled chunk, `CHUNK_FIELDS` int32 [rows of this process, pack_len]
            (`head_*`: [rows, N]); a chunk's global rows are `sizes[i]`, `sizes[i] / processes`
            from each process
    seqs    `SEQ_FIELDS` [S / processes, ...] per sequence, this process's block of the global
            [S, ...]; S (the largest batch of any G) and N (`max_new_tokens`) are fixed for the
            run, so no compiled shape depends on G, the prompt or the completion lengths
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from sagc_jax.hosts import Hosts
from sagc_jax.rl.packing import pack_chunks, plan_packing, split_chunks
from sagc_jax.shapes import TrainLayout

# Per-sequence arrays [S, ...] (name -> rank, dtype). `chunk`, `row`, `hstart`: where the
# sequence sits (`rl.packing`); `ref_logprobs` / `entropy` are zeros here, filled on device by the
# reference pass (`algo.beta > 0`) and the entropy pass (`top_entropy_quantile < 1`: the
# threshold is a full-batch quantile, so it must be known before any chunk's gradient).
# `loss_mask`: False on completion tokens the loss never scores (an environment's replies in a
# multi-turn episode); they stay in the sequence as context.
_F, _I, _B = np.float32, np.int32, np.bool_
SEQ_FIELDS = {
    "lengths": (1, _I), "loss_rows": (1, _B), "old_logprobs": (2, _F), "ref_logprobs": (2, _F),
    "rewards": (1, _F), "group_ids": (1, _I), "valid": (1, _B), "chunk": (1, _I), "row": (1, _I),
    "hstart": (1, _I), "entropy": (2, _F), "loss_mask": (2, _B),
}
# Packed arrays of one chunk, int32 [chunk rows, pack_len]; `head_slots` / `head_targets`:
# [chunk rows, N], each row's scored slots and the tokens they score (`rl.packing`).
CHUNK_FIELDS = ("tokens", "positions", "segment_ids", "branch_ids", "head_slots", "head_targets")
HEAD_FIELDS = ("head_slots", "head_targets")


@dataclasses.dataclass
class TrainBatch:
    """One update's host arrays (see the module doc) and its token accounting.

    sizes: global rows of each chunk; real_tokens / computed_tokens: this process's slots
    holding a token the loss needs / slots its forward computes.
    """

    chunks: list[dict[str, np.ndarray]]
    seqs: dict[str, np.ndarray]
    sizes: tuple[int, ...]
    real_tokens: int
    computed_tokens: int

    @property
    def token_util(self) -> float:
        """Real tokens ÷ computed tokens (1.0 for an empty batch)."""
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0


def make_batch(ro: Any, layout: TrainLayout, hosts: Hosts | None = None, *, pad_id: int = 0,
               mask_truncated: bool = False) -> TrainBatch:
    """The train batch of rollout `ro` (a `rollout.Rollout`, this process's rows) in `layout`.

    Loss rows: valid (kept groups), scored by some reward function and, with `mask_truncated`
    (DAPO), not truncated; only those are placed. A multi-turn rollout's `env_mask` becomes the
    per-token `loss_mask` (its environment tokens are placed but never scored). A row every
    reward function scored None carries a NaN reward, which the step reads as "out of the
    advantages' statistics". Group ids are global (this process's rows start at
    `ro.row_offset`). With several processes the chunk count is the largest any process needs
    (one gather of an int).
    """
    hosts = hosts or Hosts()
    g, rows = ro.group_size, len(ro.lengths)
    local = layout.seqs // hosts.count
    if rows > local:
        raise ValueError(f"make_batch: {rows} rows exceed the declared {local} sequences")
    n = layout.completion_len
    prompts = [np.asarray(ro.examples[r // g]["prompt_ids"], np.int32) for r in range(rows)]
    lengths = np.asarray(ro.lengths, np.int32)
    scored = getattr(ro, "scored", None)
    rewards = ro.rewards if scored is None else np.where(scored, ro.rewards, np.float32(np.nan))
    loss_rows = np.asarray(ro.valid, bool) & ~(mask_truncated & np.asarray(ro.truncated, bool))
    plan = plan_packing(np.array([len(q) for q in prompts]), lengths, loss_rows,
                        pack_len=layout.pack_len, loss_cap=n,
                        prompt_ids=np.arange(rows) // g,  # the rollout's groups: no hashing
                        one_per_row=not layout.share_prompts)
    used = plan.rows if hosts.single else hosts.max_int(plan.rows)
    split = split_chunks(plan, used, layout.chunk_sizes, processes=hosts.count,
                         index=hosts.index)
    chunks = pack_chunks(plan, split, prompts, ro.tokens, lengths, pad_id, index=hosts.index)
    env = getattr(ro, "env_mask", None)  # environment tokens: context, out of the loss
    rows_of = {"lengths": lengths, "loss_rows": loss_rows, "rewards": rewards,
               "group_ids": (ro.row_offset + np.arange(rows)) // g, "valid": ro.valid,
               "old_logprobs": ro.logprobs[:, :n], "chunk": split.chunk, "row": split.row,
               "hstart": plan.hstart,
               "loss_mask": True if env is None else ~np.asarray(env, bool)[:, :n]}
    seqs = {}
    for k, (nd, dtype) in SEQ_FIELDS.items():  # padding rows: chunk -1, loss_mask True, else 0
        seqs[k] = np.full((local, n)[:nd], -1 if k == "chunk" else k == "loss_mask", dtype)
        seqs[k][:rows] = rows_of.get(k, 0)
    return TrainBatch(chunks, seqs, split.sizes, plan.real_tokens,
                      sum(split.local) * layout.pack_len)
