"""Every ``sagc:`` field (issue 32: 14 of them) has a test here that fails if the field is wired
wrongly, plus the constants' properties (one rung up per step, hard filter, the queue after a
held step), the removed keys and the state layout. Pure numpy controller, no jax compile.

``FIELD_TESTS`` maps each field to its test; ``test_every_field_has_a_test`` keeps the map in
step with the schema."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from contextlib import redirect_stderr
from types import SimpleNamespace

import numpy as np
import pytest

from sagc_jax.config import ConfigError, load_config
from sagc_jax.config import sagc_constants as sc
from sagc_jax.config.sagc import REMOVED_KEYS, SAGCConfig, TimeModelSection
from sagc_jax.config.sagc_constants import (
    CONSTANTS,
    rate_half_life,
    window_rows,
)
from sagc_jax.rollout.collect import FirstRound
from sagc_jax.sagc import (
    REASONS,
    Observation,
    SAGCPolicy,
    StaticPolicy,
    choose,
    init_state,
    make_policy,
    observe,
    predicted_cost,
)
from sagc_jax.sagc.controller import LAYOUT, normalize_state, record_choice
from sagc_jax.sagc.estimators import batch_prompts, posterior_risk
from sagc_jax.sagc.events import tail_share
from sagc_jax.sagc.observation import observation_from
from sagc_jax.sagc.simulate import parse_sim_config, run_policies, sagc_policy
from sagc_jax.sagc.state import Budget, SAGCState, as_dict, with_fields
from sagc_jax.sagc.timing import DEFAULT_TIMING, TimeModel
from sagc_jax.sagc.updates import budget_update

GR = {"straggler": "group_ratio"}
GRB = {**GR, "delta": 0.1}  # with the budget the event rate used to default to


def _obs(lengths, g: int, *, truncated=None, rewards=None, timed: bool = False, **kw):
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    n = len(lengths)
    extra = {"prefill_s": 0.1, "decode_s": 2.0, "decode_steps": 64} if timed else {}
    return Observation(
        group_size=g, lengths=lengths,
        truncated=np.zeros(n, bool) if truncated is None else np.asarray(truncated, bool),
        rewards=np.tile([1.0, 0.0], n // 2) if rewards is None else np.asarray(rewards),
        max_new_tokens=512, **extra, **kw)


def _decided(cfg: SAGCConfig, a, b, *, g_idx: int | None = None, queue: float = 0.0):
    """A state past warm-up with risk pseudo-counts a, b and queue Q (no timing yet)."""
    st = init_state(cfg)
    last = len(cfg.group_sizes) - 1 if g_idx is None else g_idx
    st = with_fields(st, "decision", step=np.array(cfg.warmup_steps + 10, np.int64),
                     g_idx=np.array(last, np.int64))
    st = with_fields(st, "risk", a=np.asarray(a, float), b=np.asarray(b, float))
    return with_fields(st, "budget", queue=np.array(float(queue)))


# A group of 4 with max/median = 2.5: an event at tau 2, none at tau 3; tail share 0.6.
ONE_TAIL = [[10, 10, 10, 25], [10, 10, 10, 10]]


# ------------------------------------------------------------------ the 15 fields


def test_enabled_false_holds_initial_group_size():
    cfg = SAGCConfig(enabled=False, initial_group_size=12)
    pol = make_policy(cfg)
    assert isinstance(pol, StaticPolicy) and isinstance(make_policy(SAGCConfig()), SAGCPolicy)
    for _ in range(3):
        assert pol.choose() == 12
        pol.observe(_obs(np.full(24, 10), 12))
    assert int(pol.state.decision.step) == 3 and pol.last_reason == "static"


def test_group_sizes_and_initial_group_size_shape_and_validate():
    cfg = SAGCConfig(group_sizes=(2, 8, 1024), initial_group_size=8)
    st = init_state(cfg)
    assert st.risk.a.shape == (3,) and st.benefit.pass_hist.shape == (3, 1025)
    assert int(st.decision.g_idx) == 1  # initial_group_size's rung
    assert st.length.eps_ring.shape == (4096,)  # max(2048, 4 x 1024)
    assert window_rows(SAGCConfig()) == 2048
    for kw, msg in [
        ({"group_sizes": ()}, "sagc.group_sizes: must not be empty"),
        ({"group_sizes": (8, 4)}, "sagc.group_sizes: must be strictly increasing, got [8, 4]"),
        ({"group_sizes": (1, 4), "initial_group_size": 4}, "sagc.group_sizes[0]: must be >= 2"),
        ({"initial_group_size": 6}, "sagc.initial_group_size: must be one of sagc.group_sizes"),
    ]:
        with pytest.raises(ConfigError, match="^" + msg.replace("[", r"\[").replace("]", r"\]")):
            SAGCConfig(**kw)


def test_straggler_switches_the_constrained_cost():
    obs = _obs(ONE_TAIL, 4)
    ts, gr = SAGCConfig(), SAGCConfig(**GR)
    assert ts.straggler == "tail_share"  # the default
    new_ts = observe(ts, init_state(ts), obs)
    new_gr = observe(gr, init_state(gr), obs)
    assert float(new_ts.budget.last_rate) == pytest.approx((15 / 25 + 0.0) / 2)
    assert float(new_gr.budget.last_rate) == 0.5  # one group of two has an event
    # The observed rung's risk evidence is the same cost, group by group.
    i4 = ts.group_sizes.index(4)
    assert new_ts.risk.last[i4] == pytest.approx(tail_share(np.array(ONE_TAIL)).mean())
    assert new_gr.risk.last[i4] == 0.5


def test_tau_decides_which_groups_are_events():
    obs = _obs(ONE_TAIL, 4)
    for tau, rate in ((2.0, 0.5), (3.0, 0.0)):
        cfg = SAGCConfig(**GR, tau=tau)
        assert float(observe(cfg, init_state(cfg), obs).budget.last_rate) == rate
    # tail_share ignores tau.
    a, b = SAGCConfig(tau=2.0), SAGCConfig(tau=3.0)
    assert observe(a, init_state(a), obs).budget.last_rate == observe(
        b, init_state(b), obs).budget.last_rate


def test_no_budget_by_default_and_a_stated_budget_binds():
    # Issue 49: no straggler budget unless the user states one, whatever the straggler cost.
    assert SAGCConfig().delta is None and SAGCConfig(**GR).delta is None
    assert SAGCConfig(delta=0.3).delta == 0.3
    assert load_config(None, ["sagc.straggler=group_ratio"]).sagc.delta is None
    assert load_config(None, ["sagc.delta=0.2"]).sagc.delta == 0.2
    # Without a budget: the queue and credit stay 0, every rung is feasible, the score is V * J
    # and the choice its argmax over the reachable rungs.
    free = SAGCConfig(**GR, risk="mean")
    st = observe(free, init_state(free), _obs(ONE_TAIL, 4))
    assert float(st.budget.queue) == 0 == float(st.budget.credit)
    assert float(st.budget.last_rate) == 0.5
    info = choose(free, _decided(free, [0.5, 0.5, 9.5, 14.5], [99.5, 99.5, 90.5, 85.5]))
    g = info.g
    assert all(info.feasible) and info.risk_cap is None
    np.testing.assert_allclose(info.score, free.V * np.array(info.j))
    assert g == free.group_sizes[int(np.argmax(np.where(info.eligible, info.score,
                                                        -np.inf)))]
    for bad in (0.0, 1.0):
        with pytest.raises(ConfigError, match=r"^sagc\.delta: must be in \(0, 1\)"):
            SAGCConfig(delta=bad)
    with pytest.raises(ConfigError, match=r"^sagc\.straggler: must be one of"):  # not a crash
        SAGCConfig.from_dict({"straggler": {"x": 1}})
    # The queue grows by the excess over delta: rate 0.5 vs delta 0.1 and 0.3.
    obs = _obs(ONE_TAIL, 4)
    for delta in (0.1, 0.3):
        cfg = SAGCConfig(**GR, delta=delta)
        q = float(observe(cfg, init_state(cfg), obs).budget.queue)
        assert q == pytest.approx(0.5 - delta)
    # Feasible rungs are those with risk <= delta (no credit): delta moves the cut.
    for delta, n_feasible in ((0.05, 2), (0.2, 4)):
        cfg = SAGCConfig(**GR, delta=delta, risk="mean")
        info = choose(cfg, _decided(cfg, [0.5, 0.5, 9.5, 14.5], [99.5, 99.5, 90.5, 85.5]))
        assert sum(info.feasible) == n_feasible and info.risk_cap == delta


def test_V_weighs_the_objective_against_the_queue():
    cfg1, cfg0 = SAGCConfig(**GR, V=1.0), SAGCConfig(**GR, V=0.0)
    a, b = [0.5, 1.5, 2.5, 3.5], [99.5, 98.5, 97.5, 96.5]  # all feasible, risk rising with g
    for cfg in (cfg1, cfg0):
        info = choose(cfg, _decided(cfg, a, b, queue=2.0))
        g = info.g
        want = cfg.V * np.array(info.j) - 2.0 * np.array(info.risk)
        np.testing.assert_allclose(info.score, want)
        assert g == cfg.group_sizes[int(np.argmax(np.where(info.eligible, want, -np.inf)))]
    # V = 0: the queue alone decides (the least risky rung); V = 1 with Q = 0: the objective
    # (flat cost: the largest rung has u = 0, the rest < 0).
    assert choose(cfg0, _decided(cfg0, a, b, queue=2.0)).g == 4
    assert choose(cfg1, _decided(cfg1, a, b, queue=0.0)).g == 16


def test_half_life_sets_every_memory():
    obs = _obs(np.full(16, 10), 4, timed=True)
    for hl in (10.0, 100.0):
        cfg = SAGCConfig(half_life=hl, delta=0.6, benefit="groups")  # 0.75 a group below
        st = init_state(cfg)
        st.benefit.pass_hist[1, 3] = 2.0  # a fresh state's own array: written in place
        st = with_fields(st, "benefit", rate_s=np.array([1.0, 2.0]))
        st = with_fields(st, "length", trunc_s=np.array([100.0, 4.0]))
        new = observe(cfg, st, obs)
        lam = 0.5 ** (1 / hl)
        assert new.benefit.pass_hist[1, 3] == pytest.approx(2.0 * lam)  # unobserved rung
        np.testing.assert_allclose(new.length.trunc_s, lam * np.array([100.0, 4.0]) + [16, 0])
        lam_r = 0.5 ** (1 / (5 * hl))  # the benefit rate remembers 5 x longer
        assert rate_half_life(cfg) == 5 * hl
        assert new.benefit.rate_s[0] == pytest.approx(lam_r * 1.0 + 4 * 0.75)  # 4 groups
        # The credit horizon is 3 x half_life.
        st2 = _decided(cfg, [0.5] * 4, [99.5] * 4)
        st2 = with_fields(st2, "budget", credit=np.array(6.0))
        assert choose(cfg, st2).risk_cap == pytest.approx(cfg.delta + 6.0 / (3 * hl))


def test_risk_quantile_is_above_the_mean_and_changes_the_choice():
    a, b = [0.5, 0.5, 2.5, 2.5], [99.5, 99.5, 37.5, 37.5]  # mean 0.07 at 12/16, q90 0.13
    got = {}
    for risk in ("mean", "q90"):
        cfg = SAGCConfig(**GRB, risk=risk)
        st = _decided(cfg, a, b)
        got[risk] = choose(cfg, st)
    mean, q90 = got["mean"].risk, got["q90"].risk
    assert (q90 >= mean).all() and (q90[2:] > 0.1).all() and (mean[2:] < 0.1).all()
    np.testing.assert_allclose(mean, posterior_risk(SAGCConfig(**GR), _decided(
        SAGCConfig(**GR), a, b), mean=True))
    assert got["mean"][0] == 16 and got["q90"][0] == 12  # 12: the budget-sharing rung


def test_warmup_steps_hold_the_initial_group_size():
    for warm in (0, 3):
        pol = SAGCPolicy(SAGCConfig(**GR, warmup_steps=warm, initial_group_size=8))
        reasons = []
        for _ in range(warm + 2):
            g = pol.choose()
            reasons.append(pol.last_reason)
            if reasons[-1] == "warmup":
                assert g == 8
            pol.observe(_obs(np.full(4 * g, 10), g))
        assert reasons[:warm] == ["warmup"] * warm and "warmup" not in reasons[warm:]


#: This CPU's time model (benchmarks/results/cpu_time_model.json's fit): a step at 32 rows costs
#: 1.8x one at 8, where the default accelerator-like model prices them alike.
CPU_TM = TimeModelSection(decode_a=0.0558904, decode_b=0.00253875, prefill_a=0.36022,
                          prefill_b=0.00178673)


def test_prior_start_reads_the_clock():
    """prior_start warms up where the prior prices best on sagc.time_model, on either clock:
    small where rows are dear (the CPU model: 4 for any_group, 8 for groups at 2 prompts and a
    256-token cap), the largest where they are cheap (the default model), and never overrides
    an explicit initial_group_size; the warm-up holds that rung. Off (runs before 2026-12-06,
    FIXED_START): the largest rung, whatever the clock."""
    def first(benefit="any_group", tm=CPU_TM, timing="model", init=None, on=True, warm=3):
        assert CONSTANTS.prior_start  # the default
        cfg = SAGCConfig(group_sizes=(4, 8, 16), benefit=benefit, time_model=tm, timing=timing,
                         initial_group_size=init, warmup_steps=warm)
        pol = SAGCPolicy(cfg, horizon=48, prompts=2, max_new_tokens=256,
                         consts=dataclasses.replace(CONSTANTS, prior_start=on))
        gs = []
        for _ in range(warm + 1):
            gs.append(pol.choose())
            mixed = np.tile([0.0, 1.0], gs[-1])
            pol.observe(_obs(np.full(2 * gs[-1], 40), gs[-1], rewards=mixed))
        assert gs[:warm] == [gs[0]] * warm
        return gs[0]

    assert first() == 4 and first("groups") == 8
    assert first(tm=TimeModelSection()) == 16 and first("groups", tm=TimeModelSection()) == 16
    assert first(timing="measured") == 4 and first(init=8) == 8  # the stated model: the prior
    assert first(timing="measured", tm=TimeModelSection()) == 16
    assert first(on=False) == 16 and first("groups", on=False) == 16
    # Without the step's shape the prior prices a single decode step, and rows look free.
    cfg = SAGCConfig(group_sizes=(4, 8, 16), time_model=CPU_TM, timing="model")
    assert SAGCPolicy(cfg, prompts=2, max_new_tokens=256).choose() != SAGCPolicy(cfg).choose()


def test_batch_policy_and_rollouts_per_step_set_the_rows():
    st = with_fields(init_state(SAGCConfig()), "cost", prompts=np.array(16, np.int64))
    assert batch_prompts(SAGCConfig(), st).tolist() == [16] * 4  # prompts: B fixed
    cfg = SAGCConfig(batch_policy="rollouts", rollouts_per_step=96)
    assert (batch_prompts(cfg, st) * np.array(cfg.group_sizes)).tolist() == [96] * 4
    with pytest.raises(ConfigError, match=r"^sagc\.rollouts_per_step: must be a positive"):
        SAGCConfig(batch_policy="rollouts")
    with pytest.raises(ConfigError, match=r"^sagc\.rollouts_per_step: must be divisible"):
        SAGCConfig(batch_policy="rollouts", rollouts_per_step=100)


def _rollout(g: int, prompts: int, env_s: float = 0.0):
    fr = FirstRound(prompts=prompts, decode_steps=64, prefill_s=9.0, decode_s=99.0,
                    lengths=np.full(prompts * g, 10), truncated=np.zeros(prompts * g, bool),
                    rewards=np.tile([1.0, 0.0], prompts * g // 2), env_s=env_s)
    return SimpleNamespace(first_round=fr, group_size=g)


def test_timing_measured_reads_the_clock_model_the_time_model():
    ro = _rollout(8, 4, env_s=7.0)
    meas = observation_from(ro, SAGCConfig(), max_new_tokens=512, decode_chunk=16)
    assert (meas.prefill_s, meas.decode_s, meas.env_s) == (9.0, 99.0, 7.0)
    model = observation_from(ro, SAGCConfig(timing="model"), max_new_tokens=512, decode_chunk=16)
    tm = TimeModel()
    assert model.prefill_s == pytest.approx(tm.prefill_s(32))
    assert model.decode_s == pytest.approx(64 * tm.decode_step_s(32))
    assert model.env_s == 0.0  # host time is not on the accelerator-like clock


def test_time_model_terms_give_the_linear_cost():
    tmc = {"decode_a": 0.01, "decode_b": 1e-3, "prefill_a": 0.2, "prefill_b": 0.05}
    cfg = SAGCConfig(timing="model", time_model=tmc, group_sizes=(4, 8), initial_group_size=8)
    assert cfg.time_model == TimeModelSection(**tmc)
    tm = TimeModel.from_sagc(cfg)
    rows = 32
    assert tm.step_seconds(rows, 64) == pytest.approx(0.2 + 0.05 * rows + 64 * (0.01 + 1e-3 * rows))
    obs = observation_from(_rollout(8, 4), cfg, max_new_tokens=512, decode_chunk=16)
    st = observe(cfg, init_state(cfg), obs)
    cost = predicted_cost(cfg, st)
    steps = st.length.exp_steps[1]
    assert cost[1] == pytest.approx(0.2 + 0.05 * rows + steps * (0.01 + 1e-3 * rows))
    # One set of defaults: the simulator's timing block and the section's.
    assert {k: DEFAULT_TIMING[k] for k in tmc} == TimeModelSection().model_dump()
    assert load_config(None, ["sagc.time_model.decode_b=0.5"]).sagc.time_model.decode_b == 0.5


# ------------------------------------------------------------------ the constants' properties


def test_at_most_one_rung_up_per_step_and_unlimited_down():
    cfg = SAGCConfig(**GR)
    assert CONSTANTS.max_rung_step == 1
    # From the smallest rung, all feasible, the objective wants the largest: one rung up.
    info = choose(cfg, _decided(cfg, [0.5] * 4, [99.5] * 4, g_idx=0))
    g = info.g
    assert g == 8 and info.reachable.tolist() == [True, True, False, False]
    # From the largest, only the smallest feasible and a big queue: straight down.
    g = choose(cfg, _decided(cfg, [0.5, 50, 50, 50], [99.5, 50, 50, 50], queue=50.0)).g
    assert g == 4
    # Property over a run: consecutive choices never climb more than one rung.
    rng = np.random.default_rng(0)
    pol = SAGCPolicy(cfg)
    idx = []
    for t in range(40):
        g = pol.choose()
        idx.append(cfg.group_sizes.index(g))
        tail = 60 if t >= 25 else 12  # tight groups, then every group with a long tail
        lengths = rng.integers(10, 13, (4, g))
        lengths[:, 0] = tail
        pol.observe(_obs(lengths, g))
    assert max(np.diff(idx)) <= 1 and min(np.diff(idx)) < -1


def test_hard_filter_only_feasible_rungs_and_the_budget_sharing_one():
    cfg = SAGCConfig(**GR)
    rng = np.random.default_rng(1)
    for _ in range(60):
        a = rng.uniform(0.0, 20.0, 4)
        st = _decided(cfg, a, 100.0 - a, g_idx=int(rng.integers(4)), queue=rng.uniform(0, 5))
        info = choose(cfg, st)
        g = info.g
        if info.reason != "score":
            continue
        feas = np.flatnonzero(info.feasible)
        allowed = set(feas.tolist()) | {int(feas.max()) + 1}
        assert cfg.group_sizes.index(g) in allowed


def test_queue_does_not_grow_after_a_no_feasible_step():
    b = Budget(queue=np.array(1.0), credit=np.array(0.0), last_rate=np.array(0.0))
    assert float(budget_update(b, 0.9, 0.1, held=True).queue) == 1.0  # no growth
    assert float(budget_update(b, 0.0, 0.1, held=True).queue) == pytest.approx(0.9)  # drains
    assert float(budget_update(b, 0.9, 0.1, held=False).queue) == pytest.approx(1.8)
    # Through observe: the reason recorded by choose decides.
    cfg = SAGCConfig(**GRB)
    st = _decided(cfg, [50.0] * 4, [50.0] * 4, queue=1.0)
    info = choose(cfg, st)
    g = info.g
    assert info.reason == "no_feasible" and g == 4
    new = observe(cfg, record_choice(st, info), _obs([[10, 10, 10, 30]] * 2, 4))
    assert float(new.budget.queue) == 1.0


# ------------------------------------------------------------------ removed keys, state layout


def test_removed_keys_are_one_line_errors_saying_what_they_became(tmp_path):
    # 15: `benefit` (issue 49's per-step-law test, 2026-12-06) joined the 14 the rewrite left.
    assert len(SAGCConfig.model_fields) == 15 and {"tie_margin", "horizon"} <= set(REMOVED_KEYS)
    for key in REMOVED_KEYS:
        with pytest.raises(ConfigError) as exc:
            SAGCConfig.from_dict({key: 1})
        msg = str(exc.value)
        assert msg.startswith(f"sagc.{key}: removed in the SAGC core rewrite (issue 32)"), msg
        assert "\n" not in msg
    assert "now sagc.time_model.decode_a" in REMOVED_KEYS["model_decode_a"]
    assert "cost_ema = 0.3" in REMOVED_KEYS["cost_ema"]
    assert "5 x half_life" in REMOVED_KEYS["rate_half_life"]
    # A saved config (YAML) and a CLI override name the key the same way.
    path = tmp_path / "old.yaml"
    path.write_text("sagc:\n  delta: 0.1\n  credit_cap: 50.0\n")
    with pytest.raises(ConfigError, match=r"^sagc\.credit_cap: removed .*credit_cap = 100\.0"):
        load_config(path)
    from sagc_jax.sagc.simulate_cli import simulate_main

    err = io.StringIO()
    with redirect_stderr(err):
        rc = simulate_main(["--config", "configs/sim/drift.yaml", "sagc.tie_margin=0.02"])
    assert rc == 2 and err.getvalue().count("\n") == 1
    assert err.getvalue().startswith("error: sagc.tie_margin: removed in the SAGC core rewrite")


def test_old_flat_state_is_refused_in_one_line():
    cfg = SAGCConfig()
    flat = {"step": np.array(3), "queue": np.array(0.0), "risk_a": np.zeros(4)}
    with pytest.raises(ValueError, match=r"^SAGC state key 'queue' is from the old flat layout: "
                       r"the SAGC state layout changed .*\(issue 32\)") as exc:
        normalize_state(cfg, flat)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="old flat layout"):
        SAGCPolicy(cfg).load_state(flat)
    # The nested layout is what LAYOUT says, and it restores as is (horizon, seed kept).
    st = init_state(cfg, horizon=77, seed=5)
    assert {m: tuple(sub) for m, sub in as_dict(st).items()} == LAYOUT
    back = normalize_state(cfg, st)
    assert int(back.decision.horizon) == 77 and int(back.decision.seed) == 5
    assert REASONS[int(back.decision.last_reason)] == "init"


def test_typed_state_is_a_pytree_and_reads_the_nested_dict_layout():
    """Issue 49 item 5: the state is one NamedTuple per sub-model. It is a pytree whose leaves
    are the nested dict's (same names, dtypes, shapes, order); a nested dict as checkpoints
    since issue 32 hold it (jax arrays, numpy scalars) comes back typed, dtypes restored."""
    jax = pytest.importorskip("jax")
    cfg = SAGCConfig()
    st = init_state(cfg, horizon=40, seed=3)
    assert isinstance(st, SAGCState) and st._fields == tuple(LAYOUT)
    assert all(type(sub)._fields == LAYOUT[m] for m, sub in zip(LAYOUT, st))
    paths = ["/".join(k.name for k in p) for p, _ in jax.tree_util.tree_flatten_with_path(st)[0]]
    assert paths == [f"{m}/{k}" for m, ks in LAYOUT.items() for k in ks]
    st = with_fields(st, "budget", queue=np.array(1.5))
    st.cost.measured[1] = True
    d = {m: {k: (jax.numpy.asarray(v) if v.ndim else v[()]) for k, v in sub.items()}
         for m, sub in as_dict(st).items()}  # as Orbax may hand them back
    back = normalize_state(cfg, d)
    for m, sub in as_dict(st).items():
        for k, v in sub.items():
            got = getattr(getattr(back, m), k)
            assert isinstance(got, np.ndarray) and got.dtype == v.dtype and got.shape == v.shape
            np.testing.assert_array_equal(got, v)
    assert float(back.budget.queue) == 1.5 and back.cost.measured.tolist()[1]
    with pytest.raises(ValueError, match=r"state budget/queue: shape \(2,\), expected \(\)"):
        normalize_state(cfg, {**d, "budget": {**d["budget"], "queue": np.zeros(2)}})
    with pytest.raises(ValueError):  # a typo in a field name is not a silent new field
        with_fields(st, "budget", qeue=np.array(0.0))


def test_constants_are_passed_not_patched():
    """Issue 49 item 5: the controller reads only the ``consts`` it is handed (None: the shipped
    CONSTANTS); a policy keeps its own for its whole life, equal to passing them at every call."""
    cfg = SAGCConfig(**GR)
    free = dataclasses.replace(CONSTANTS, max_rung_step=0)
    st = _decided(cfg, [0.5] * 4, [99.5] * 4, g_idx=0)
    assert choose(cfg, st).g == 8 and choose(cfg, st, free).g == 16  # unlimited moves up
    small = dataclasses.replace(CONSTANTS, window_rows_min=64, window_groups=8)
    cfg = SAGCConfig(**{**GR, "half_life": 12.0})  # the change test's depth: 4 steps
    st = init_state(cfg, consts=small)
    assert st.length.eps_ring.shape == (64,) and st.risk.hist_a.shape == (4, 4)
    rng = np.random.default_rng(0)
    obs = [_obs(rng.integers(10, 40, (4, 4)), 4, timed=True) for _ in range(12)]
    pol, gs, by_hand = SAGCPolicy(cfg, consts=small), [], []
    for o in obs:
        gs.append(pol.choose())
        by_hand.append((c := choose(cfg, st, small)).g)
        st = record_choice(st, c)
        pol.observe(o)  # every step observed at G = 4 (any rung may be chosen)
        st = observe(cfg, st, o, small)
    assert gs == by_hand and len(set(gs)) > 1
    for m, sub in as_dict(pol.state).items():
        for k, v in sub.items():
            np.testing.assert_array_equal(v, as_dict(st)[m][k])


def test_any_group_picks_the_cheapest_rung_whose_groups_still_inform():
    """Pass rates near 0.5: every group of 4 is informative, so any_group stays at the smallest
    rung while the group-variance model pays for larger ones; a hard mix (pass ~8 %) needs 16
    samples for a mixed group, and both forms go there."""
    def mean_g(form: str, pass_rate: dict) -> float:
        sim = parse_sim_config({
            "steps": 40, "workload": {"prompts_per_step": 2, "pass_rate": pass_rate,
                                      "loop_prob": 0.0}, "sagc": {"benefit": form}})
        return float(np.mean(run_policies(sim, {"sagc": sagc_policy(sim)})["sagc"]
                             ["group_size"][sim.sagc.warmup_steps:]))
    easy, hard = {"a": 20, "b": 20}, {"a": 1, "b": 12}
    assert mean_g("any_group", easy) == 4.0
    assert mean_g("groups", easy) >= 8.0
    assert mean_g("any_group", hard) >= 14.0 and mean_g("groups", hard) >= 14.0


# ------------------------------------------------------------------ the map


FIELD_TESTS = {
    "enabled": test_enabled_false_holds_initial_group_size,
    "group_sizes": test_group_sizes_and_initial_group_size_shape_and_validate,
    "initial_group_size": test_group_sizes_and_initial_group_size_shape_and_validate,
    "straggler": test_straggler_switches_the_constrained_cost,
    "tau": test_tau_decides_which_groups_are_events,
    "delta": test_no_budget_by_default_and_a_stated_budget_binds,
    "V": test_V_weighs_the_objective_against_the_queue,
    "half_life": test_half_life_sets_every_memory,
    "risk": test_risk_quantile_is_above_the_mean_and_changes_the_choice,
    "warmup_steps": test_warmup_steps_hold_the_initial_group_size,
    "batch_policy": test_batch_policy_and_rollouts_per_step_set_the_rows,
    "rollouts_per_step": test_batch_policy_and_rollouts_per_step_set_the_rows,
    "timing": test_timing_measured_reads_the_clock_model_the_time_model,
    "time_model": test_time_model_terms_give_the_linear_cost,
    "benefit": test_any_group_picks_the_cheapest_rung_whose_groups_still_inform,
}


def test_every_field_has_a_test():
    """Each SAGCConfig field maps to a test of this module that names it (as ``name=``,
    ``"name"`` or ``cfg.name``: the knob audit's pattern, benchmarks/probes/sagc_knob_audit.py)."""
    import inspect
    import re

    assert set(FIELD_TESTS) == set(SAGCConfig.model_fields)
    for name, fn in FIELD_TESTS.items():
        assert fn.__name__.startswith("test_") and globals()[fn.__name__] is fn
        n = re.escape(name)
        pat = rf"(?<![\w.]){n}\s*=|[\"']{n}[\"'=]|sagc\.{n}\b|cfg\.{n}\b|\.{n}\b"
        assert re.search(pat, inspect.getsource(fn)), f"{fn.__name__} does not name {name}"
    src = inspect.getsource(test_time_model_terms_give_the_linear_cost)
    for name in TimeModelSection.model_fields:  # sagc.time_model.<term>
        assert re.search(rf"\b{name}\b", src)
    assert math.isfinite(hash(SAGCConfig()))


def test_recorded_constants_round_trip_and_refuse_another_version(tmp_path):
    """A run's sagc_constants.json reads back as the constants written (tuples included), and a
    file that lacks a constant or holds one that no longer exists is refused, naming both."""
    path = tmp_path / sc.CONSTANTS_FILE
    moved = dataclasses.replace(sc.CONSTANTS, cost_ema=0.5, trunc_pooled_prior=(0.2, 2.0))
    sc.save_constants(path, moved)
    assert sc.load_constants(path) == moved
    raw = json.loads(path.read_text())
    del raw["cost_ema"]
    path.write_text(json.dumps({**raw, "tie_margin": 0.02}))
    with pytest.raises(ValueError, match=r"missing \['cost_ema'\], unknown \['tie_margin'\]"):
        sc.load_constants(path)


def test_recorded_retired_constants_read_as_what_replaced_them(tmp_path):
    """Files written before window_steps was derived (change_window / 2) load as step_memory:
    16 (= 32 / 2) as True, 0 as False (ROW_MEMORIES); any other value is refused. Likewise
    length_half_life_x: 1 (half_life itself) loads, another value is refused."""
    path = tmp_path / sc.CONSTANTS_FILE
    sc.save_constants(path, sc.CONSTANTS)
    raw = json.loads(path.read_text())
    del raw["step_memory"]
    for old, memory in ((16, True), (0, False)):
        path.write_text(json.dumps({**raw, "window_steps": old}))
        assert sc.load_constants(path).step_memory is memory
    assert sc.window_steps(32, sc.CONSTANTS) == 16
    assert sc.window_steps(32, dataclasses.replace(sc.CONSTANTS, **sc.ROW_MEMORIES)) == 0
    path.write_text(json.dumps({**raw, "window_steps": 8}))
    with pytest.raises(ValueError, match="window_steps=8 is retired"):
        sc.load_constants(path)
    path.write_text(json.dumps({**raw, "window_steps": 16, "length_half_life_x": 1.0}))
    assert sc.load_constants(path) == sc.CONSTANTS  # the multiplier was 1: half_life itself
    path.write_text(json.dumps({**raw, "window_steps": 16, "length_half_life_x": 2.0}))
    with pytest.raises(ValueError, match=r"length_half_life_x=2\.0 is retired"):
        sc.load_constants(path)
    # change_window (until 2026-12-08): 32, the depth half_life 100 derives, loads; 64 does not
    path.write_text(json.dumps({**raw, "window_steps": 16, "change_window": 32}))
    assert sc.load_constants(path) == sc.CONSTANTS
    path.write_text(json.dumps({**raw, "change_window": 64}))
    with pytest.raises(ValueError, match="change_window=64 is retired"):
        sc.load_constants(path)


def test_change_window_follows_half_life():
    """The change test's depth is a third of half_life rounded to a power of two (32 at the
    default 100, what it was as a constant), and the state's per-step sums take that depth."""
    assert [sc.change_window(SAGCConfig(half_life=h)) for h in (1, 12, 50, 100, 200)] == [
        2, 4, 16, 32, 64]
    st = init_state(SAGCConfig(half_life=50.0))
    assert st.risk.hist_a.shape[0] == st.length.hist_tr.shape[0] == 16
