"""Group advantages (GRPO / batch-scaled / Dr. GRPO) vs a NumPy reference; DAPO shaping."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from sagc_jax.rl.advantages import DEFAULT_ADV_EPS, frac_reward_zero_std, group_advantages
from sagc_jax.rl.shaping import overlong_penalty

# Bucket shape shared by every call below: 16 rows, 4 groups → one compile per (scale, ddof).
ROWS, NUM_GROUPS = 16, 4


def _np_advantages(groups, scale, ddof, eps):
    """Reference from the papers, one group at a time (lists of rewards, None = not scored).

    GRPO (DeepSeekMath §4.1.2): A_i = (r_i − mean(r)) / std(r); Dr. GRPO (Liu et al. 2025, §3.1):
    A_i = r_i − mean(r); "batch" (PPO Lite / TRL): the std is over every scored reward of the batch.
    Unscored rows: advantage 0, absent from the statistics. Zero-std groups: 0.
    """
    scored = [np.array([x for x in g if x is not None], np.float64) for g in groups]
    everything = np.concatenate(scored)
    batch_std = everything.std(ddof=ddof) if len(everything) > ddof else 0.0
    out = []
    for g, s in zip(groups, scored):
        std = s.std(ddof=ddof) if len(s) > ddof else 0.0
        for x in g:
            if x is None or std == 0.0:
                out.append(0.0)
            elif scale == "group":
                out.append((x - s.mean()) / (std + eps))
            elif scale == "batch":
                out.append((x - s.mean()) / (batch_std + eps))
            else:
                out.append(x - s.mean())
    return np.array(out)


def _layout(groups, order=None):
    """(rewards, group_ids, valid) padded to ROWS; `order` permutes rows (ids needn't be sorted)."""
    r = [np.nan if x is None else x for g in groups for x in g]
    ids = [i for i, g in enumerate(groups) for _ in g]
    n = len(r)
    perm = np.arange(n) if order is None else np.asarray(order)
    r = np.concatenate([np.asarray(r, np.float32)[perm], np.full(ROWS - n, 7.0, np.float32)])
    ids = np.concatenate([np.asarray(ids, np.int32)[perm], np.full(ROWS - n, -1, np.int32)])
    return r, ids, np.arange(ROWS) < n, perm


# Three steps through one bucket: G = 4 (full), G = 8 (one prompt + padding), and ragged groups
# (sizes 3, 5, 2, 6; a None reward; rows interleaved across groups).
STEPS = [
    [[1, 0, 0, 1], [1, 1, 1, 0], [0.1, 0.1, 0.1, 0.1], [2, 0, 0, 0]],
    [[3, 1, 1, 1, 1, 1, 1, 1]],
    [[0.5, None, 1.0], [0, 0, 1, 2, 0.25], [4, 4], [1, None, 0, 3, 2, 2]],
]


@pytest.mark.parametrize("scale,ddof", list(itertools.product(("group", "batch", "none"), (0, 1))))
def test_matches_reference_across_group_sizes(scale, ddof):
    compiled = None
    for k, groups in enumerate(STEPS):
        n = sum(map(len, groups))
        order = np.random.default_rng(k).permutation(n) if k == 2 else None
        r, ids, valid, perm = _layout(groups, order)
        got = np.asarray(group_advantages(r, ids, valid, NUM_GROUPS, scale, 1e-4, ddof))
        want = _np_advantages(groups, scale, ddof, 1e-4)[perm]
        np.testing.assert_allclose(got[:n], want, rtol=2e-5, atol=1e-6)
        np.testing.assert_array_equal(got[n:], 0.0)  # padding rows
        # G changed, the bucket shape didn't: no recompile.
        size = group_advantages._cache_size()
        assert compiled is None or size == compiled
        compiled = size


def test_zero_std_group_is_exactly_zero_and_none_rows_are_excluded():
    # 0.9 three times: its float32 mean is not exactly 0.9, yet the advantage must be exactly 0.
    r, ids, valid, _ = _layout([[0.9, 0.9, 0.9, None], [1, None, 0, 0]])
    a = np.asarray(group_advantages(r, ids, valid, NUM_GROUPS))
    np.testing.assert_array_equal(a[:4], 0.0)
    # The None row is neither counted in mean/std nor given an advantage: [1, 0, 0] alone.
    std = np.std([1.0, 0.0, 0.0])
    np.testing.assert_allclose(a[4:8], np.array([2, 0, -1, -1]) / 3 / (std + 1e-4) * [1, 0, 1, 1],
                               rtol=1e-5)


def test_default_eps_is_trls():
    """A near-tied group: eps=1e-4 (TRL) vs 1e-6 gives very different advantages (issue #15)."""
    assert DEFAULT_ADV_EPS == 1e-4
    r = jnp.array([0.0, 1e-4, 1e-4, 1e-4])
    a = np.asarray(group_advantages(r, jnp.zeros(4, jnp.int32), jnp.ones(4, bool), 1))
    std = np.std([0, 1e-4, 1e-4, 1e-4])
    np.testing.assert_allclose(a[0], -0.75e-4 / (std + 1e-4), rtol=1e-3)


def test_frac_reward_zero_std():
    # Group 0 flat, group 1 informative, group 2 flat once its None is dropped, group 3 empty.
    r, ids, valid, _ = _layout([[1, 1, 1], [0, 1], [2, None, 2]])
    assert float(frac_reward_zero_std(r, ids, valid, NUM_GROUPS)) == pytest.approx(2 / 3)
    r, ids, valid, _ = _layout([[0, 1], [0.1, 0.1, 0.1]])
    assert float(frac_reward_zero_std(r, ids, valid, NUM_GROUPS)) == pytest.approx(1 / 2)
    r, ids, valid, _ = _layout([[None, None]])
    assert float(frac_reward_zero_std(r, ids, valid, NUM_GROUPS)) == 0.0


def test_bad_arguments():
    r, ids, valid = jnp.zeros(4), jnp.zeros(4, jnp.int32), jnp.ones(4, bool)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(r, ids, valid, 1, "dr_grpo")
    with pytest.raises(ValueError, match="ddof"):
        group_advantages(r, ids, valid, 1, "group", 1e-4, 2)


def test_overlong_penalty():
    lengths = np.array([0, 80, 81, 90, 99, 100, 120])
    p = overlong_penalty(lengths, max_new_tokens=100, buffer=20, penalty=1.0)
    np.testing.assert_allclose(p, [0, 0, -0.05, -0.5, -0.95, -1.0, -1.0], rtol=1e-6)
    assert p.dtype == np.float32
    np.testing.assert_allclose(overlong_penalty(lengths, 100, 20, 0.5)[3], -0.25)
    np.testing.assert_array_equal(overlong_penalty(lengths, 100, 0, 1.0), 0.0)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 100, 200)
