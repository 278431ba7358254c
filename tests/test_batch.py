"""Rollout -> train batch: unscored rows (every reward function returned None) carry NaN, which
the train step reads as "out of the statistics and the loss"; truncation masking; global group
ids."""

import types

import numpy as np

from sagc_jax.rl.batch import make_batch
from sagc_jax.shapes import TrainLayout

SPEC = TrainLayout(seqs=8, num_groups=4, completion_len=3, pack_len=8, chunk_sizes=(2, 1))


def _rollout(scored):
    g, rows, n = 2, 4, 3
    return types.SimpleNamespace(
        group_size=g, examples=[{"prompt_ids": [5, 6]}, {"prompt_ids": [7]}],
        tokens=np.arange(rows * n, dtype=np.int32).reshape(rows, n), logprobs=np.zeros((rows, n)),
        lengths=np.array([3, 1, 2, 3]), truncated=np.array([False, False, True, False]),
        rewards=np.array([1.0, 0.0, 0.5, 0.25], np.float32), valid=np.array([1, 1, 1, 0], bool),
        row_offset=2, scored=scored)


def test_unscored_rows_get_nan_rewards():
    b = make_batch(_rollout(np.array([True, False, True, True])),
                   SPEC, mask_truncated=True)
    r = b.seqs["rewards"]
    assert np.isnan(r[1]) and r[[0, 2, 3]].tolist() == [1.0, 0.5, 0.25]
    assert b.seqs["group_ids"][:4].tolist() == [1, 1, 2, 2]  # global ids from row_offset
    assert b.seqs["loss_rows"][:4].tolist() == [True, True, False, False]
    assert b.seqs["chunk"][:4].tolist()[2:] == [-1, -1]  # truncated and dropped: not placed
    assert b.seqs["lengths"].shape == (8,) and not b.seqs["valid"][4:].any()


def test_all_scored_when_unknown():
    b = make_batch(_rollout(None), SPEC)
    assert np.isfinite(b.seqs["rewards"]).all()
    assert b.seqs["loss_rows"][:4].tolist() == [True, True, True, False]
    assert (b.seqs["chunk"][:3] >= 0).all()
