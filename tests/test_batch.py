"""Rollout -> train batch: unscored rows (every reward function returned None) carry NaN, which
the train step reads as "out of the statistics and the loss"; truncation masking."""

import types

import numpy as np

from sagc_jax.rl.batch import make_batch


def _rollout(scored):
    g, rows, n = 2, 4, 3
    return types.SimpleNamespace(
        group_size=g, examples=[{"prompt_ids": [5, 6]}, {"prompt_ids": [7]}],
        tokens=np.arange(rows * n, dtype=np.int32).reshape(rows, n), logprobs=np.zeros((rows, n)),
        lengths=np.array([3, 1, 2, 3]), truncated=np.array([False, False, False, True]),
        rewards=np.array([1.0, 0.0, 0.5, 0.25], np.float32), valid=np.array([1, 1, 1, 0], bool),
        row_offset=2, scored=scored)


def test_unscored_rows_get_nan_rewards():
    b = make_batch(_rollout(np.array([True, False, True, True])), prompt_len=2, completion_len=3,
                   num_groups=4, pad_id=0, mask_truncated=True)
    r = b.arrays["rewards"]
    assert np.isnan(r[1]) and r[[0, 2, 3]].tolist() == [1.0, 0.5, 0.25]
    assert b.arrays["group_ids"].tolist() == [1, 1, 2, 2]  # global ids from row_offset
    assert b.arrays["loss_rows"].tolist() == [True, True, True, False]
    assert b.arrays["tokens"][2].tolist() == [0, 7, 6, 7, 8]  # left-padded prompt | completion


def test_all_scored_when_unknown():
    b = make_batch(_rollout(None), prompt_len=2, completion_len=3, num_groups=4, pad_id=0)
    assert np.isfinite(b.arrays["rewards"]).all()
    assert b.arrays["loss_rows"].tolist() == [True, True, True, False]
