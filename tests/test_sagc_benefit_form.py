"""`sagc.benefit: any_group` (a step is worth one step if any group in it is informative),
`diminishing` (n informative groups are worth n / (n + 1)) and the simulator's matching world
laws `progress: any_group` / `diminishing` (issue 49; docs/sagc.md)."""

from __future__ import annotations

import numpy as np
import pytest

from sagc_jax.sagc import SAGCConfig, init_state
from sagc_jax.sagc.estimators import (
    PASS_GRID,
    batch_prompts,
    expected_diminishing,
    pass_rate_mixture,
    predicted_benefit,
    realised_benefit,
)
from sagc_jax.sagc.simulate import parse_sim_config, run_step
from sagc_jax.sagc.state import with_fields


def test_realised_benefit_any_group_is_one_if_some_group_is_mixed():
    r = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert realised_benefit(r, 0.5) == pytest.approx(0.75)  # one group x (1 - 1/4)
    assert realised_benefit(r, 0.5, "any_group") == 1.0
    assert realised_benefit(np.ones((2, 4)), 0.5, "any_group") == 0.0
    assert realised_benefit(np.zeros((3, 8)), 0.5, "any_group") == 0.0
    assert realised_benefit(r, 0.5, "diminishing") == pytest.approx(0.5)
    both = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    assert realised_benefit(both, 0.5, "diminishing") == pytest.approx(2 / 3)
    assert realised_benefit(np.ones((2, 4)), 0.5, "diminishing") == 0.0


@pytest.mark.parametrize("b,q", [(1, 0.5), (2, 0.3), (8, 0.6), (8, 1.0), (16, 1e-6)])
def test_expected_diminishing_is_the_binomial_mean(b, q):
    """The closed form against the exact sum over N ~ Binomial(b, q)."""
    from math import comb

    exact = sum(comb(b, k) * q**k * (1 - q) ** (b - k) * k / (k + 1) for k in range(b + 1))
    assert expected_diminishing(b, q) == pytest.approx(exact, rel=1e-9, abs=1e-15)
    assert expected_diminishing(b, 0.0) == 0.0


def test_predicted_any_group_is_the_chance_of_one_informative_group():
    """The model's P(>= 1 of the step's B groups informative) against a Monte Carlo draw of
    B prompts from the fitted pass-rate mixture, g samples each."""
    cfg = SAGCConfig(group_sizes=(4, 8, 16), initial_group_size=4, benefit="any_group")
    state = init_state(cfg)
    hist = np.zeros_like(state.benefit.pass_hist)
    hist[0, :5] = [30.0, 4.0, 3.0, 5.0, 8.0]  # most groups of 4 all wrong: a hard mix
    state = with_fields(state, "benefit", pass_hist=hist)
    pred = predicted_benefit(cfg, state)
    w, bs = pass_rate_mixture(cfg, state), batch_prompts(cfg, state)
    rng = np.random.default_rng(0)
    n = 200_000
    for i, g in enumerate(cfg.group_sizes):
        b = int(bs[i])
        p = rng.choice(PASS_GRID, size=(n, b), p=w)
        k = rng.binomial(g, p)
        mc = ((k > 0) & (k < g)).any(-1).mean()
        assert pred[i] == pytest.approx(mc, abs=0.01), g
    assert (np.diff(pred) > 0).all() and pred.max() <= 1.0
    groups = predicted_benefit(cfg.model_copy(update={"benefit": "groups"}), state)
    assert not np.allclose(groups, pred)


def test_predicted_diminishing_is_its_monte_carlo_mean():
    """The model's E[N / (N + 1)] against a Monte Carlo draw of B prompts from the fitted
    pass-rate mixture, g samples each, N the step's mixed groups; between any_group's and 0."""
    cfg = SAGCConfig(group_sizes=(4, 8, 16), initial_group_size=4, benefit="diminishing")
    state = init_state(cfg)
    hist = np.zeros_like(state.benefit.pass_hist)
    hist[0, :5] = [30.0, 4.0, 3.0, 5.0, 8.0]
    state = with_fields(state, "benefit", pass_hist=hist)
    pred = predicted_benefit(cfg, state)
    w, bs = pass_rate_mixture(cfg, state), batch_prompts(cfg, state)
    rng = np.random.default_rng(1)
    for i, g in enumerate(cfg.group_sizes):
        p = rng.choice(PASS_GRID, size=(200_000, int(bs[i])), p=w)
        k = rng.binomial(g, p)
        n = ((k > 0) & (k < g)).sum(-1)
        assert pred[i] == pytest.approx((n / (n + 1)).mean(), abs=0.01), g
    anyg = predicted_benefit(cfg.model_copy(update={"benefit": "any_group"}), state)
    assert (np.diff(pred) > 0).all() and (pred < anyg).all() and (pred > 0).all()


@pytest.mark.parametrize("form", ["groups", "any_group", "diminishing"])
def test_sim_progress_law_is_the_judged_benefit(form):
    sim = parse_sim_config({"steps": 20, "workload": {"prompts_per_step": 2}, "progress": form})
    law = {"groups": lambda n: n * (1 - 1 / 8), "any_group": lambda n: float(n > 0),
           "diminishing": lambda n: n / (n + 1)}[form]
    seen = set()
    for step in range(20):
        obs, _, ben = run_step(sim, sim.workload.draw(step), 8)
        r = np.asarray(obs.rewards).reshape(-1, 8)
        mixed = int((r.max(-1) != r.min(-1)).sum())
        assert ben == pytest.approx(law(mixed))
        seen.add(mixed)
    assert {1, 2} <= seen  # both laws differ on these draws: one and two mixed groups


def test_sim_progress_rejects_unknown_law():
    with pytest.raises(ValueError, match="progress"):
        parse_sim_config({"progress": "rows"})


def test_benefit_law_table_is_its_committed_runs():
    """docs/sagc.md's "What one step is worth" tables are what `python
    -m tools.sagc_benefit_law --table-only` prints from the committed suite JSONs."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "tools.sagc_benefit_law", "--table-only"],
                         capture_output=True, text=True, check=True, cwd=root).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| ")]
    doc = (root / "docs" / "sagc.md").read_text().splitlines()
    assert len(rows) == 17 + 18 + 18 + 18  # the law table (header, 15 workloads, worst); the
    # warm-ups' and the three models' tables (also a ≥ 0.98 row)
    for row in rows:
        assert row in doc, row
