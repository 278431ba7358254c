"""`sagc-jax compare`: the summary math on synthetic metrics rows, and the whole machinery
(train per policy x seed, shared SFT, eval, results.md/json, plots, resume) on a tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from sagc_jax.cli import main
from sagc_jax.experiments import (
    COLUMNS,
    Policy,
    aggregate,
    auto_target,
    cumulative_seconds,
    format_cell,
    moving_average,
    parse_policies,
    parse_seeds,
    spread,
    step_seconds,
    summarize_run,
    time_to_target,
)
from sagc_jax.experiments.budget import (
    checkpoint_at_or_before,
    cumulative_clock,
    cut_at_budget,
    length_samples,
    parse_max_steps,
    resolve_budget,
    step_clock,
    tail_stats,
)
from sagc_jax.sagc.timing import TimeModel

ROOT = Path(__file__).resolve().parent.parent


def _rows(rewards, step_s=2.0, **extra):
    return [{"step": i + 1, "reward_mean": r, "step_s": step_s, "straggler_rate": 0.1,
             "len_mean": 10.0 + i, "group_size": 4 + 4 * (i % 2), **extra}
            for i, r in enumerate(rewards)]


# ----------------------------------------------------------------------------- pure functions


def test_moving_average_is_trailing_over_full_windows():
    np.testing.assert_allclose(moving_average([1, 2, 3, 4, 5], 2), [1.5, 2.5, 3.5, 4.5])
    np.testing.assert_allclose(moving_average([1, 2, 3], 3), [2.0])
    assert len(moving_average([1, 2], 3)) == 0
    with pytest.raises(ValueError):
        moving_average([1.0], 0)


def test_time_to_target_first_crossing_of_the_moving_average():
    # Rewards 0.0 .. 0.9; the 3-step mean at index i is (i-1) / 10, >= 0.45 first at i = 6.
    rows = _rows([i / 10 for i in range(10)], step_s=2.0)
    step, secs = time_to_target(rows, 0.45, window=3)
    assert step == 7 and secs == pytest.approx(14.0)  # 7 steps x 2 s
    # One lucky step does not count: a spike of 1.0 alone is diluted by the window.
    spike = _rows([0, 0, 1.0, 0, 0, 0])
    assert time_to_target(spike, 0.5, window=3) == (None, None)
    assert time_to_target(spike, 0.5, window=1) == (3, pytest.approx(6.0))
    # Fewer rows than the window: never reached.
    assert time_to_target(_rows([1.0, 1.0]), 0.5, window=3) == (None, None)


def test_wall_clock_excludes_in_training_eval_time():
    rows = [{"step": 1, "step_s": 3.0}, {"step": 2, "step_s": 5.0, "eval_s": 4.0}]
    assert step_seconds(rows[1]) == pytest.approx(1.0)
    np.testing.assert_allclose(cumulative_seconds(rows), [3.0, 4.0])


def test_summarize_run_windows():
    rows = _rows([0.0] * 10 + [1.0] * 10, step_s=0.5)
    s = summarize_run(rows, target=0.5, window=10)
    assert s["steps"] == 20 and s["total_s"] == pytest.approx(10.0)
    assert s["final_reward"] == pytest.approx(1.0)  # last 10 steps
    assert s["len_mean"] == pytest.approx(np.mean(np.arange(20) + 10.0))  # last 20 steps
    assert s["mean_group_size"] == pytest.approx(6.0)
    assert s["straggler_rate"] == pytest.approx(0.1)
    # The 10-step mean reaches 0.5 when 5 of the 10 are ones: step 15, 7.5 s.
    assert s["steps_to_target"] == 15 and s["time_to_target_s"] == pytest.approx(7.5)


def test_budget_clocks_and_cut():
    tm = TimeModel(prefill_a=1.0, prefill_b=0.1, decode_a=0.5, decode_b=0.01)
    row = {"step": 1, "rows": 10, "decode_steps": 4, "step_s": 9.0, "eval_s": 2.0}
    assert step_clock(row, "model", tm) == pytest.approx(1.0 + 1.0 + 4 * (0.5 + 0.1))
    assert step_clock(row, "measured") == pytest.approx(7.0)
    with pytest.raises(ValueError, match="clock"):
        step_clock(row, "wall")
    # Longer decodes (a straggler tail) cost more on the model clock; rows barely matter.
    rows = [{"step": i + 1, "rows": 16, "decode_steps": d, "step_s": 1.0}
            for i, d in enumerate([32, 96, 32, 96])]
    secs = cumulative_clock(rows, "model")
    assert secs[1] - secs[0] > 2.5 * (secs[0])
    assert cut_at_budget(rows, secs[2], "model") == 3  # the step ending at the budget counts
    assert cut_at_budget(rows, secs[2] - 1e-9, "model") == 2
    assert cut_at_budget(rows, 0.0, "model") == 0
    big = [{**r, "rows": 64} for r in rows]
    assert cumulative_clock(big, "model")[-1] < 1.1 * secs[-1]
    assert resolve_budget("auto", [5.0, 3.0, float("nan")]) == 3.0
    assert resolve_budget(None, [1.0]) is None and resolve_budget("2.5", []) == 2.5
    for bad in ("0", "-1", "x"):
        with pytest.raises(ValueError, match="budget"):
            resolve_budget(bad, [])
    assert parse_max_steps("static-4=40, SAGC=30") == {"static-4": 40, "sagc": 30}
    assert parse_max_steps(None) == {}
    for bad in ("static-4", "static-4=0", "sagc=x"):
        with pytest.raises(ValueError, match="max-steps"):
            parse_max_steps(bad)
    # time-to-target and totals on the given clock; measured seconds are kept beside them.
    rr = _rows([0.0, 1.0, 1.0], step_s=2.0)
    s = summarize_run(rr, target=0.5, window=1, seconds=[10.0, 20.0, 30.0])
    assert s["time_to_target_s"] == 20.0 and s["total_s"] == 30.0 and s["measured_s"] == 6.0


def test_checkpoint_at_or_before_and_length_samples(tmp_path):
    for k in (5, 10, 15):
        (tmp_path / "checkpoints" / str(k)).mkdir(parents=True)
    (tmp_path / "checkpoints" / "initial").mkdir()
    assert checkpoint_at_or_before(tmp_path, 12).name == "10"
    assert checkpoint_at_or_before(tmp_path, 15).name == "15"
    assert checkpoint_at_or_before(tmp_path, 4) is None
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"step": i, "groups": [
        {"lengths": [10, 12 * i], "truncated": [False, i == 3]}]}) + "\n" for i in (1, 2, 3)))
    lens, trunc = length_samples(trace, (2, 3))
    assert lens.tolist() == [10, 24, 10, 36] and trunc.tolist() == [False, False, False, True]
    st = tail_stats(lens, trunc)
    assert st["median"] == 17.0 and st["truncated"] == 0.25 and st["p99"] > 35
    assert math.isnan(tail_stats(np.zeros(0), np.zeros(0, bool))["median"])


def test_spread_and_aggregate_ignore_not_reached():
    s = spread([1.0, 3.0, None])
    assert s["n"] == 2 and s["of"] == 3
    assert s["mean"] == pytest.approx(2.0) and s["std"] == pytest.approx(math.sqrt(2.0))
    assert (s["min"], s["max"]) == (1.0, 3.0)
    assert spread([2.0])["std"] == 0.0
    assert spread([None, float("nan")])["mean"] is None
    agg = aggregate({"sagc": {0: {"total_s": 10.0}, 1: {"total_s": 14.0}}}, keys=["total_s"])
    assert agg["sagc"]["total_s"]["mean"] == pytest.approx(12.0)
    assert format_cell(agg["sagc"]["total_s"], "{:.0f}") == "12 ± 3"
    assert format_cell(spread([None, None]), "{:.0f}", reached=True) == "not reached (0/2)"
    assert format_cell(spread([5.0, None]), "{:.0f}", reached=True) == "5 ± 0 (1/2 reached)"


def test_auto_target_is_relative_to_the_runs():
    # 80 % of the way from 0.2 to the best final reward 0.7.
    assert auto_target([0.1, 0.3], {"a": 0.5, "b": 0.7}) == pytest.approx(0.6)
    # Nobody improved: the target stays above the start (min_gain), so nobody "reaches" it.
    assert auto_target([0.3], {"a": 0.2}) == pytest.approx(0.34)


def test_parse_policies_and_seeds():
    pols = parse_policies("static-4, sagc,static-16")
    assert [p.name for p in pols] == ["static-4", "sagc", "static-16"]
    assert Policy("static-4", 4).overrides() == [
        "sagc.enabled=false", "sagc.initial_group_size=4", "sagc.group_sizes=[4]"]
    assert Policy("sagc", None).overrides() == ["sagc.enabled=true"]
    # SAGC deciding on one clock: one run per sagc.timing (issue 49).
    assert [p.overrides() for p in parse_policies("sagc-model,sagc-measured")] == [
        ["sagc.enabled=true", "sagc.timing=model"], ["sagc.enabled=true", "sagc.timing=measured"]]
    for bad in ("static-x", "dynamic", "sagc,sagc", "static-1", "", "sagc-wall"):
        with pytest.raises(ValueError):
            parse_policies(bad)
    assert parse_seeds("0,1") == [0, 1]
    for bad in ("a", "0,0", ""):
        with pytest.raises(ValueError):
            parse_seeds(bad)


# ----------------------------------------------------------------------------- end to end

TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=arith_short", "data.task_max_steps=3",
    "data.prompts_per_step=2", "data.num_eval=8", "sagc.group_sizes=[2,4]",
    "sagc.initial_group_size=2", "sagc.warmup_steps=1", "sagc.timing=model",
    "sagc.straggler=group_ratio",  # G moves
    "sampling.max_new_tokens=32", "sampling.prompt_buckets=[16]", "sampling.decode_chunk=8",
    "init.sft_steps=4", "init.sft_batch_size=8", "run.steps=3", "run.plots=false",
    "checkpoint.every=1", "checkpoint.keep=5",
]


def _initial_params(run_dir: Path) -> list[np.ndarray]:
    with ocp.StandardCheckpointer() as c:
        tree = c.restore(run_dir / "checkpoints" / "initial")
    return [np.asarray(x) for x in __import__("jax").tree.leaves(tree)]


def test_compare_end_to_end(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--config", str(ROOT / "configs/compare_cpu.yaml"), "--out-dir", str(out),
            "--seeds", "0", "--policies", "static-2,sagc", "--window", "2", *TINY]
    assert main(argv) == 0, capsys.readouterr().err
    for name in ("results.md", "results.json", "reward_vs_wallclock.png", "group_size.png",
                 "straggler_rate.png", "completion_length.png"):
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name

    lines = (out / "results.md").read_text().splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["policy", *[h for _, h, _ in COLUMNS]]
    body = {ln.strip("|").split("|")[0].strip(): ln for ln in table[2:]}
    assert set(body) == {"static-2", "sagc"}
    assert all(len(ln.strip("|").split("|")) == len(header) for ln in body.values())

    res = json.loads((out / "results.json").read_text())
    assert set(res["policies"]) == {"static-2", "sagc"}
    assert res["meta"]["steps"] == 3 and res["meta"]["seeds"] == [0]
    for pol in ("static-2", "sagc"):
        run = res["runs"][pol]["0"]
        assert run["steps"] == 3 and 0.0 <= run["eval_accuracy"] <= 1.0
        assert run["compile_s"] > 0 and run["total_s"] > 0
        assert set(res["policies"][pol]) >= {k for k, _, _ in COLUMNS}
    assert res["runs"]["static-2"]["0"]["mean_group_size"] == 2.0
    # Same seed, same config for both: identical step budget and data.
    for pol in ("static-2", "sagc"):
        text = (out / f"{pol}-s0" / "metrics.jsonl").read_text()
        rows = [json.loads(x) for x in text.splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(r["prompts"] == 2 for r in rows)
    # SFT ran once and was shared: the second run restored the exact same params.
    assert res["runs"]["static-2"]["0"]["sft_shared"] is False
    assert res["runs"]["sagc"]["0"]["sft_shared"] is True
    for a, b in zip(_initial_params(out / "static-2-s0"), _initial_params(out / "sagc-s0")):
        np.testing.assert_array_equal(a, b)

    # Resumable: a second invocation skips both finished runs and reuses their evals.
    capsys.readouterr()
    assert main([*argv, "--target", "0.5"]) == 0
    log = capsys.readouterr().out
    assert log.count("final checkpoint exists, skipped") == 2
    assert "held-out accuracy" not in log  # cached eval.json
    assert json.loads((out / "results.json").read_text())["meta"]["target"] == 0.5

    # Equal budget on the model clock: every run is read up to the smallest total, and its
    # held-out accuracy comes from its newest checkpoint within the budget.
    assert main([*argv, "--summarize-only", "--budget-s", "auto", "--clock", "model"]) == 0
    res = json.loads((out / "results.json").read_text())
    meta = res["meta"]
    assert meta["clock"] == "model" and meta["seeds"] == [0] and meta["delta"] > 0
    budget = meta["budget_s"]
    totals = {p: res["runs"][p]["0"]["total_s"] for p in ("static-2", "sagc")}
    assert all(t <= budget + 1e-9 for t in totals.values())
    assert min(totals.values()) == pytest.approx(budget)
    for pol in ("static-2", "sagc"):
        run = res["runs"][pol]["0"]
        assert run["eval_step"] <= run["steps"] and run["measured_s"] > 0
        assert set(res["policies"][pol]["time_to_target_s"]) >= {"n", "of", "mean"}
        assert set(res["policies"][pol]["straggler_rate"]) >= {"n", "of", "mean"}
    assert (out / "length_distribution.png").stat().st_size > 0
    assert "Equal wall-clock budget" in (out / "results.md").read_text()

    # Accuracy against seconds: every kept checkpoint evaluated (step 0 = `initial`), on both
    # clocks, each run's points at its steps' clock values.
    assert main([*argv, "--summarize-only", "--curves"]) == 0
    res = json.loads((out / "results.json").read_text())
    pts = json.loads((out / "curves.json").read_text())
    for clock in ("model", "measured"):
        c = res["curves"][clock]
        assert c["budget_s"] > 0 and set(c["policies"]) == {"static-2", "sagc"}
        for pol in ("static-2", "sagc"):
            run = pts[clock][pol]["0"]
            assert run[0]["step"] == 0 and run[0]["seconds"] == 0.0
            assert run[-1]["step"] == 3 and run[-1]["seconds"] > 0
            assert all(0 <= p["accuracy"] <= 1 for p in run)
            assert c["policies"][pol]["accuracy_at_budget"]["n"] == 1
    evals = json.loads((out / "sagc-s0" / "eval.json").read_text())
    assert {k.split("/")[0] for k in evals} >= {"0", "3"}  # one cache, several steps
    assert "## Held-out accuracy against seconds" in (out / "results.md").read_text()


def test_accuracy_curves_budget_target_and_se():
    from sagc_jax.experiments.curves import (
        CurvePoint,
        accuracy_at_budget,
        curve,
        mean_se,
        summarize_curves,
        time_to_accuracy,
        time_to_target_stat,
    )

    pts = curve({0: 0.4, 2: 0.5, 4: 0.7}, [1.0, 3.0, 6.0, 10.0], [1, 2, 3, 4])
    assert pts == [CurvePoint(0, 0.0, 0.4), CurvePoint(2, 3.0, 0.5), CurvePoint(4, 10.0, 0.7)]
    assert accuracy_at_budget(pts, 9.9) == 0.5 and accuracy_at_budget(pts, 10.0) == 0.7
    assert accuracy_at_budget(pts[1:], 2.0) is None
    assert time_to_accuracy(pts, 0.5) == 3.0 and time_to_accuracy(pts, 0.8) is None
    st = mean_se([0.5, 0.7, None, float("nan")])
    assert st.mean == pytest.approx(0.6) and st.se == pytest.approx(0.1) and (st.n, st.of) == (2, 4)
    slow = [CurvePoint(0, 0.0, 0.4), CurvePoint(2, 20.0, 0.9)]
    summ = summarize_curves({"model": {"fast": {0: pts}, "slow": {0: slow}}})["model"]
    # Budget: the smaller final clock (10 s); there `slow` still reads its step-0 accuracy.
    assert summ["budget_s"] == 10.0
    assert summ["policies"]["fast"]["accuracy_at_budget"]["mean"] == 0.7
    assert summ["policies"]["slow"]["accuracy_at_budget"]["mean"] == 0.4
    # Target: 80 % of the way from the step-0 mean (0.4) to the best mean at budget (0.7).
    assert summ["target"] == pytest.approx(0.64)
    assert summ["policies"]["fast"]["time_to_target_s"]["mean"] == 10.0
    assert summ["policies"]["slow"]["time_to_target_s"]["mean"] == 20.0
    # A seed that never reaches the target counts at its final clock (censored): dropping it
    # would make the policy with more failing seeds look faster.
    never = [CurvePoint(0, 0.0, 0.4), CurvePoint(2, 30.0, 0.5)]
    st2 = summarize_curves({"model": {"p": {0: pts, 1: never}}}, target=0.64,
                           budgets={"model": 10.0})["model"]["policies"]["p"]["time_to_target_s"]
    assert (st2["mean"], st2["n"], st2["of"], st2["censored"]) == (20.0, 2, 2, 1)
    assert time_to_target_stat({0: pts}, 0.64).censored == 0
    assert time_to_target_stat({0: pts}, None).n == 0
    # SAGC that decided on one clock is read on that clock only; static G and plain sagc on both.
    both = summarize_curves({c: {"static-4": {0: pts}, "sagc-model": {0: pts},
                                 "sagc-measured": {0: slow}} for c in ("model", "measured")})
    assert set(both["model"]["policies"]) == {"static-4", "sagc-model"}
    assert set(both["measured"]["policies"]) == {"static-4", "sagc-measured"}
    assert both["model"]["budget_s"] == 10.0 and both["measured"]["budget_s"] == 10.0


def test_compare_bad_input_fails_cleanly(tmp_path, capsys):
    base = ["compare", "--config", str(ROOT / "configs/compare_cpu.yaml"), "--out-dir",
            str(tmp_path)]
    assert main([*base, "--policies", "static-x"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert main([*base, "sagc.delta=-1"]) == 2
    assert "sagc.delta" in capsys.readouterr().err


def test_compare_stopped_by_a_signal_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    """SIGTERM / Ctrl-C inside one of compare's runs (the run saved its checkpoint): one line
    and 128 + signum, as `train` does, not the traceback it printed before."""
    import signal

    import sagc_jax.experiments as experiments
    from sagc_jax.errors import Interrupted

    def stopped(*a, **k):
        raise Interrupted(signal.SIGTERM, "stopped by signal SIGTERM after step 3; ...")

    monkeypatch.setattr(experiments, "run_comparison", stopped)
    code = main(["compare", "--config", str(ROOT / "configs/compare_cpu.yaml"), "--out-dir",
                 str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 143 and err == ["sagc-jax compare: stopped by signal SIGTERM after step 3; ..."]


def test_init_seed_shares_one_warm_start_across_run_seeds():
    """`init.seed` fixes the warm start (model init + SFT fingerprint); `run.seed` then varies
    only the RL part. Without it every run seed has its own warm start."""
    import jax
    from flax import nnx

    from sagc_jax.config import load_config
    from sagc_jax.data.tokenizer import load_run_tokenizer
    from sagc_jax.experiments.runs import sft_fingerprint
    from sagc_jax.models.build import build_model

    cfg = ROOT / "configs/compare_straggle_cpu.yaml"
    shared = [load_config(cfg, [f"run.seed={s}", "init.seed=7"]) for s in (0, 1)]
    own = [load_config(cfg, [f"run.seed={s}", "init.seed=null"]) for s in (0, 1)]
    assert [c.warm_start_seed for c in shared] == [7, 7]
    assert [c.warm_start_seed for c in own] == [0, 1]
    assert sft_fingerprint(shared[0]) == sft_fingerprint(shared[1])
    assert sft_fingerprint(own[0]) != sft_fingerprint(own[1])
    tok = load_run_tokenizer(None, None)
    weights = [[np.asarray(x) for x in jax.tree.leaves(nnx.state(build_model(
        c, len(tok), tok, None)[0]))] for c in (*shared, own[0])]
    for a, b in zip(weights[0], weights[1]):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, c) for a, c in zip(weights[0], weights[2]))


def test_sagc_real_page_table_is_its_committed_run():
    """docs/results/sagc_real/README.md's table is what `python -m sagc_jax.experiments.curves`
    prints from the committed raw files of its run."""
    import subprocess
    import sys

    run = ROOT / "docs" / "results" / "sagc_real" / "arith1" / "static-4-s0"
    out = subprocess.run([sys.executable, "-m", "sagc_jax.experiments.curves", str(run)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    page = (ROOT / "docs" / "results" / "sagc_real" / "README.md").read_text()
    lines = out.strip().splitlines()
    assert len(lines) == 5 and all(ln in page for ln in lines), out
    assert "| held-out accuracy | 0.46 |" in out
    # The cross-seed table of a mix folder, from the same raw files (`--mix`).
    mix = subprocess.run([sys.executable, "-m", "sagc_jax.experiments.curves", "--mix",
                          str(run.parent)], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    assert "| static-4 | 0.640 ± 0.121 |" in mix and "Clock `measured`" in mix  # 3 seeds
    # The benefit model's objective beside it, from the committed traces (issue 49's check):
    # the mean over static-4's seeds.
    from sagc_jax.experiments.curves import benefit_per_second

    bps = [benefit_per_second(r) for r in sorted(run.parent.glob("static-4-s*"))]
    mean = float(np.mean([b["model"] for b in bps]))
    assert len(bps) == 3 and all(b["model"] > b["measured"] > 0 for b in bps)
    assert f"| static-4 | {mean:.4f} |" in mix
    # ... and under the any_group law (1 if some group is informative).
    from sagc_jax.sagc.estimators import realised_benefit

    any_g = [benefit_per_second(r, benefit=lambda x: realised_benefit(x, 0.5, "any_group"))
             for r in sorted(run.parent.glob("static-4-s*"))]
    row = next(ln for ln in mix.splitlines() if ln.startswith(f"| static-4 | {mean:.4f} |"))
    assert f"| {np.mean([b['model'] for b in any_g]):.4f} |" in row
    assert all(0 < a["model"] != b["model"] for a, b in zip(any_g, bps))


def test_step0_eval_is_shared_only_between_runs_with_identical_start(tmp_path):
    """The step-0 held-out eval (the costliest of a curve) is reused from a sibling run only
    when its initial params' checksums and eval settings are identical."""
    import json

    import yaml

    from sagc_jax.experiments.runs import _sibling_initial_eval

    def make(name: str, sums: list[str], max_new: int, ev: dict | None = None):
        d = tmp_path / name
        (d / "checkpoints").mkdir(parents=True)
        (d / "checkpoints" / "initial.checksums.json").write_text(json.dumps({"params": sums}))
        (d / "config.yaml").write_text(yaml.safe_dump(
            {"model": {"path": "m"}, "data": {"task": "arith"}, "rewards": ["r"],
             "sampling": {"max_new_tokens": max_new}, "sagc": {"enabled": name != "a"}}))
        if ev is not None:
            (d / "eval.json").write_text(json.dumps({"0/0/None": ev}))
        return d

    make("a", ["x", "y"], 64, {"step": 0, "accuracy": 0.46})
    same, other_params, other_cap = (make("b", ["x", "y"], 64), make("c", ["x", "z"], 64),
                                     make("d", ["x", "y"], 32))
    got = _sibling_initial_eval(same, "0/0/None")
    assert got == {"step": 0, "accuracy": 0.46, "shared_from": "a"}
    assert _sibling_initial_eval(other_params, "0/0/None") is None
    assert _sibling_initial_eval(other_cap, "0/0/None") is None
    assert _sibling_initial_eval(same, "0/4/None") is None


def test_issue49_verdict_reads_sagc_against_the_best_static_per_clock():
    """`verdict.verdict_md`: SAGC of the clock it decided on, against the best / worst static
    by accuracy at budget, the fastest static's time to target (1.1x) and the best's length."""
    from sagc_jax.experiments.verdict import verdict_md

    def st(mean, se=0.0, n=1):
        return {"mean": mean, "se": se, "n": n, "of": 1}

    def row(acc, se, ttt, ln):
        return {"accuracy_at_budget": st(acc, se), "len_at_budget": st(ln),
                "time_to_target_s": st(ttt, n=int(ttt is not None))}

    summary = {"model": {"budget_s": 100.0, "target": 0.8, "policies": {
        "static-4": row(0.62, 0.0, 163, 86.3), "static-16": row(0.88, 0.02, 77, 33.6),
        "sagc-model": row(0.87, 0.01, 84, 30.0), "sagc-measured": row(0.1, 0, None, 99)}},
        "measured": {"budget_s": 50.0, "target": 0.7, "policies": {
            "static-4": row(0.80, 0.0, 40, 50.0), "static-16": row(0.50, 0.0, None, 40.0),
            "sagc-measured": row(0.60, 0.0, None, 60.0)}}}
    text = "\n".join(verdict_md(summary))
    model = next(ln for ln in text.splitlines() if ln.startswith("| `model`"))
    assert model.count("yes (") == 4 and "static-16" in model  # 0.87 >= 0.88 - 0.02; 84 <= 84.7
    measured = next(ln for ln in text.splitlines() if ln.startswith("| `measured`"))
    assert measured.count("**no**") == 3 and "yes (vs static-16 0.500)" in measured
    # A censored SAGC mean (a seed ran out of clock first) is a lower bound: never a "yes",
    # however small; the cell says so with "≥".
    summary["model"]["policies"]["sagc-model"]["time_to_target_s"] |= {"mean": 70,
                                                                        "censored": 1}
    model = next(ln for ln in "\n".join(verdict_md(summary)).splitlines()
                 if ln.startswith("| `model`"))
    assert "**no** (≥ 70 s vs static-16 77 s)" in model and model.count("yes (") == 3


def test_seeds_needed_for_the_time_margin_pools_per_seed_spread():
    """`verdict.seeds_needed_md`: sd pooled from se × √n of policies with ≥ 2 uncensored seeds
    (here 40 s and 20 s over 2 and 3 seeds: pooled √((1600 + 2·400) / 3) ≈ 28.3 s); the margin
    is 10 % of the fastest static's time (8.0 s), so n = ⌈2 · 800 / 64⌉ = 25. A clock with no
    SAGC run decided on it is not read."""
    from sagc_jax.experiments.verdict import seeds_needed_md

    def pol(mean, sd, n, censored=0):
        return {"time_to_target_s": {"mean": mean, "se": sd / math.sqrt(n), "n": n, "of": n,
                                     "censored": censored}}

    summary = {"model": {"policies": {"static-4": pol(80.0, 40.0, 2),
                                      "static-16": pol(90.0, 20.0, 3),
                                      "sagc-model": pol(200.0, 500.0, 3, censored=1)}},
               "measured": {"policies": {"static-4": pol(80.0, 40.0, 2),
                                         "static-8": pol(90.0, 20.0, 3)}}}
    text = "\n".join(seeds_needed_md(summary))
    assert "**25 seeds**" in text and "28 s" in text and "8 s of the fastest static's 80 s" in text
    assert "`measured`" not in text


def test_paired_differences_cancel_what_two_policies_share_seed_by_seed():
    """`verdict.paired_md`: SAGC − static over the seeds both ran. A seed effect common to both
    (+0.3 on seed 1) leaves the per-seed differences (0.05, 0.05) with 0 spread, where the
    unpaired means would carry it; times as the geometric mean of the ratios (80/100, 125/100
    -> 1.0x), a never-reached seed counted at its final clock and counted as censored; a
    static missing a seed is compared on the seeds both have."""
    from sagc_jax.experiments.verdict import paired_md

    def pol(acc, times):
        return {"per_seed_accuracy_at_budget": acc, "per_seed_time_to_target_s": times}

    summary = {"model": {"policies": {
        "sagc-model": pol({"0": 0.45, "1": 0.75, "2": 0.6}, {"0": [80, 200], "1": [125, 200],
                                                              "2": [None, 150]}),
        "static-4": pol({"0": 0.40, "1": 0.70}, {"0": [100, 300], "1": [100, 300]}),
        "static-8": pol({"0": 0.5, "1": 0.5, "2": 0.5}, {"0": [100, 300], "1": [100, 300],
                                                         "2": [50, 300]})}}}
    text = "\n".join(paired_md(summary))
    assert "| `model` | static-4 | 2 | +0.050 ± 0.000 | 1.00× [0.80, 1.25] |" in text
    row8 = next(ln for ln in text.splitlines() if "| static-8 |" in ln and "`model`" in ln)
    assert "| 3 |" in row8 and "(1 of 3 censored)" in row8
    assert "| sagc-model | 0.450 / 80 | 0.750 / 125 | 0.600 / ≥ 150 |" in text
    assert "| static-4 | 0.400 / 100 | 0.700 / 100 | – |" in text
    assert paired_md({"measured": summary["model"]}) == []  # no SAGC decided on that clock


def test_mix_curves_reads_another_folders_statics_on_this_folders_clock(tmp_path):
    """`curves --mix DIR --statics DIR2`: DIR2's static runs join DIR's runs, all read on the
    `model` clock of DIR's runs (a cell on another time model reuses the static runs)."""
    import shutil

    import yaml

    from sagc_jax.experiments.budget import cumulative_clock
    from sagc_jax.experiments.curves import _main, mix_curves
    from sagc_jax.metrics import read_jsonl
    from sagc_jax.sagc.timing import TimeModel

    real = ROOT / "docs" / "results" / "sagc_real" / "arith1"
    mix = tmp_path / "arith1"
    shutil.copytree(real / "sagc-model-s0", mix / "sagc-model-s0")
    cfg = yaml.safe_load((mix / "sagc-model-s0" / "config.yaml").read_text())
    cfg["sagc"]["time_model"] |= {"decode_a": 0.05, "decode_b": 0.0025}
    (mix / "sagc-model-s0" / "config.yaml").write_text(yaml.safe_dump(cfg))
    alone = mix_curves(mix)["model"]
    assert set(alone["policies"]) == {"sagc-model"}
    both = mix_curves(mix, statics=real)["model"]
    assert set(both["policies"]) == {"sagc-model", "static-4", "static-8", "static-16"}
    tm = TimeModel(**{**TimeModel().__dict__, "decode_a": 0.05, "decode_b": 0.0025})
    finals = [float(cumulative_clock(read_jsonl(r / "metrics.jsonl"), "model", tm)[-1])
              for r in [mix / "sagc-model-s0", *real.glob("static-*-s*")]]
    assert both["budget_s"] == pytest.approx(min(finals))
    assert both["budget_s"] > 3 * mix_curves(real)["model"]["budget_s"]  # the slower clock
    # Runs on two clocks cannot share one: refused, naming the folder.
    shutil.copytree(real.parent.parent / "sagc_real_init8/arith1/sagc-model-s1",
                    mix / "sagc-model-s1")
    with pytest.raises(ValueError, match="time_model differ"):
        mix_curves(mix, statics=real)
    assert _main(["--mix", str(mix), "--stat", str(real)]) == 2


def test_curves_cli_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    """`python -m sagc_jax.experiments.curves`: --help works; a missing run, an empty mix folder
    or no argument is exit 2 with one line naming it, no traceback."""
    from sagc_jax.experiments.curves import _main

    assert _main(["--help"]) == 0
    assert "--statics" in capsys.readouterr().out
    assert _main([str(tmp_path / "nope")]) == 2
    assert "nope/eval.json" in capsys.readouterr().err
    assert _main(["--mix", str(tmp_path)]) == 2
    assert f"{tmp_path}: no committed run" in capsys.readouterr().err
    assert _main([]) == 2 and _main(["--statics", str(tmp_path)]) == 2


def test_sagc_doc_benefit_tables_are_the_scripts_output():
    """docs/sagc.md's benefit-form and per-step tables are what `python
    -m tools.sagc_benefit_forms` prints from the committed real runs (a run added to a mix
    folder must be followed by regenerating them)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tools.sagc_benefit_forms"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| ")]
    doc = (ROOT / "docs" / "sagc.md").read_text().splitlines()
    assert len(rows) >= 12
    for row in rows:
        assert row in doc, row
