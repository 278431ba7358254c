"""`rl.noise_scale`: the estimator recovers a known gradient noise scale from chunk terms."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sagc_jax.rl.noise_scale import noise_scale_rows


def _terms(rng, g_true, sigma, sizes):
    """One update's (F, A, s, rows): per-row gradients N(G, σ² I), chunks of `sizes` rows,
    each chunk's term c_i = w_i × its mean (w_i = its row share)."""
    rows = sum(sizes)
    per_row = g_true + sigma * rng.standard_normal((rows, g_true.size))
    edges = np.cumsum([0, *sizes])
    c = [per_row[a:b].mean(0) * (b - a) / rows for a, b in itertools.pairwise(edges)]
    w = np.array(sizes, float) / rows
    full = np.sum(c, axis=0)
    return float(full @ full), float(sum(ci @ ci for ci in c)), float((w**2).sum()), rows


@pytest.mark.parametrize("b_true,sizes", [(3.0, (4, 4, 4, 4)), (40.0, (2, 6, 4, 4, 8))])
def test_recovers_a_known_noise_scale(b_true, sizes):
    """B_noise = tr(Σ)/|G|² = d σ² / |G|²: within 10 % over 400 updates, for a noise scale
    below and above the batch, with unequal chunks; one update alone is far noisier."""
    rng = np.random.default_rng(0)
    d = 64
    g_true = np.full(d, 1.0 / np.sqrt(d))  # |G| = 1
    sigma = np.sqrt(b_true / d)
    terms = [_terms(rng, g_true, sigma, sizes) for _ in range(400)]
    est = noise_scale_rows(*zip(*terms))
    assert est == pytest.approx(b_true, rel=0.1)
    singles = [noise_scale_rows(*t) for t in terms[:50]]
    spread = np.std([x for x in singles if x is not None])
    assert spread > 0.1 * b_true


def test_one_chunk_or_no_signal_is_none():
    assert noise_scale_rows(1.0, 1.0, 1.0, 8) is None  # one chunk: nothing to compare
    assert noise_scale_rows(1.0, 2.0, 0.25, 8) is None  # A > F: no gradient signal seen
    with pytest.raises(ValueError, match="noise_scale_rows"):
        noise_scale_rows([1.0, 2.0], [1.0], [0.5], [8])
