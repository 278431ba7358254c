"""Group advantages (GRPO / Dr. GRPO), group ids, zero-variance groups, DAPO shaping."""

import jax.numpy as jnp
import numpy as np
import pytest

from sagc_jax.rl.advantages import group_advantages, group_ids_for, zero_variance_groups
from sagc_jax.rl.shaping import overlong_penalty

# Bucket shape shared by every call below: 16 rows, 4 groups → one compile for G=4 and G=8.
ROWS, NUM_GROUPS = 16, 4


def _pad(x, fill, n=ROWS):
    x = np.asarray(x)
    return np.concatenate([x, np.full(n - len(x), fill, x.dtype)])


def test_group_ids_for():
    np.testing.assert_array_equal(group_ids_for(3, 2), [0, 0, 1, 1, 2, 2])
    assert group_ids_for(2, 4).dtype == np.int32
    assert group_ids_for(0, 4).shape == (0,)


def test_grpo_hand_computed_and_group_size_change():
    eps = 1e-4
    # Step 1: G=4, 4 prompts, fills the bucket exactly.
    r1 = np.array([1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 2, 0, 0, 0], np.float32)
    ids1 = group_ids_for(4, 4)
    a1 = np.asarray(group_advantages(r1, ids1, np.ones(ROWS, bool), NUM_GROUPS, "grpo", eps))
    compiled = group_advantages._cache_size()
    # Group 0: mean .5, population std .5 → ±1/(.5+eps).
    np.testing.assert_allclose(a1[:4], np.array([1, -1, -1, 1]) * 0.5 / (0.5 + eps), rtol=1e-6)
    # Group 1: mean .75, std sqrt(3)/4.
    s = np.sqrt(3) / 4
    np.testing.assert_allclose(a1[4:8], (np.array([1, 1, 1, 0]) - 0.75) / (s + eps), rtol=1e-6)
    np.testing.assert_array_equal(a1[8:12], 0.0)  # zero variance → 0, not NaN
    s3 = np.sqrt(0.75)  # [2,0,0,0]: mean .5, var (2.25 + 3*.25)/4 = .75
    np.testing.assert_allclose(a1[12:], (np.array([2, 0, 0, 0]) - 0.5) / (s3 + eps), rtol=1e-6)

    # Step 2: G=8, 1 prompt + padding, through the same function and bucket shape.
    r2 = _pad(np.array([3, 1, 1, 1, 1, 1, 1, 1], np.float32), np.nan)  # NaN pad must not leak
    ids2 = _pad(group_ids_for(1, 8), -1)
    valid2 = np.arange(ROWS) < 8
    a2 = np.asarray(group_advantages(r2, ids2, valid2, NUM_GROUPS, "grpo", eps))
    mean, std = 1.25, np.sqrt((1.75**2 + 7 * 0.25**2) / 8)
    np.testing.assert_allclose(a2[:8], (r2[:8] - mean) / (std + eps), rtol=1e-6)
    np.testing.assert_array_equal(a2[8:], 0.0)
    assert group_advantages._cache_size() == compiled  # G changed, shapes didn't: no recompile


def test_dr_grpo_mean_only_with_padding():
    r = _pad(np.array([1, 0, 0, 0, 5, 5, 2, 0], np.float32), 100.0)
    ids = _pad(group_ids_for(2, 4), 0)  # pad rows claim group 0 but are invalid
    valid = np.arange(ROWS) < 8
    a = np.asarray(group_advantages(r, ids, valid, NUM_GROUPS, "dr_grpo", 1e-4))
    np.testing.assert_allclose(a[:4], [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
    np.testing.assert_allclose(a[4:8], [2, 2, -1, -3], rtol=1e-6)
    np.testing.assert_array_equal(a[8:], 0.0)


def test_unbiased_std_option_and_bad_kind():
    r = jnp.array([1.0, 0.0, 0.0, 0.0])
    a = group_advantages(r, jnp.zeros(4, jnp.int32), jnp.ones(4, bool), 1, "grpo", 0.0, ddof=1)
    np.testing.assert_allclose(np.asarray(a), (np.array([1, 0, 0, 0]) - 0.25) / 0.5, rtol=1e-6)
    with pytest.raises(ValueError, match="kind"):
        group_advantages(r, jnp.zeros(4, jnp.int32), jnp.ones(4, bool), 1, "ppo", 0.0)


def test_zero_variance_groups():
    r = np.array([1, 1, 0, 1, 2, 2, 7, 7], np.float32)
    ids = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    valid = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
    np.testing.assert_array_equal(zero_variance_groups(r, ids, 5), [True, False, True, True, True])
    # Group 3 has one valid row; group 4 none → both zero-variance.
    np.testing.assert_array_equal(
        zero_variance_groups(r, ids, 5, valid), [True, False, True, True, True]
    )
    r[7] = 8
    assert not zero_variance_groups(r, ids, 4)[3]
    assert zero_variance_groups(r, ids, 4, valid)[3]


def test_overlong_penalty():
    lengths = np.array([0, 80, 81, 90, 99, 100, 120])
    p = overlong_penalty(lengths, max_new_tokens=100, buffer=20, penalty=1.0)
    np.testing.assert_allclose(p, [0, 0, -0.05, -0.5, -0.95, -1.0, -1.0], rtol=1e-6)
    assert p.dtype == np.float32
    np.testing.assert_allclose(overlong_penalty(lengths, 100, 20, 0.5)[3], -0.25)
    np.testing.assert_array_equal(overlong_penalty(lengths, 100, 0, 1.0), 0.0)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 100, 200)
