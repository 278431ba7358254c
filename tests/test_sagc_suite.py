"""benchmarks/sagc_suite.py on a cut-down suite: one synthetic and one real workload, 2 seeds,
60 steps, 2 population seeds (a few seconds)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    """benchmarks/<name>.py as module ``name`` (the benchmarks import each other by name)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _suite():
    return _module("sagc_suite")


def test_suite_core(tmp_path):
    """Pooled figures are sums over seeds; a static is 1.0x itself; the per-seed hindsight
    oracle beats every static within delta; a variant equal to the defaults is 1.0x SAGC; the
    real replays get their group's overrides; the page's sections are rewritten in place."""
    mod = _suite()
    wls = mod.workloads("drift,smollm2_run_replay")
    assert wls["smollm2_run_replay"]["straggler"] == "tail_share"
    assert wls["smollm2_run_replay"]["delta"] == pytest.approx(0.6)
    assert wls["drift"]["delta"] == pytest.approx(0.1)
    variants = {"same": ["credit_cap=100"], "no_credit": ["credit_cap=0"]}
    res, _ = mod.run_suite(wls, 2, variants, 2, 2, 1, tmp_path / "cache", ["steps=60"],
                           progress=False)
    for w in res["workloads"].values():
        pols = w["policies"]
        best = w["best_static"]
        if best:
            assert pols[best]["vs_best_static"][0] == pytest.approx(1.0)
            assert pols[best]["meets"]
        assert pols["same"]["vs_sagc"] == pytest.approx((1.0, 1.0))
        assert pols["same"]["benefit_per_s"] == pols["sagc"]["benefit_per_s"]
        assert pols["sagc"]["seeds"] == 2 and pols["static-4"]["seeds"] == 2
    # Per seed, recomputed from the cached static jobs: the oracle's program contains every
    # static rung whose rate is within delta.
    for w in wls.values():
        for seed in range(2):
            job = mod._static_job(w["path"], seed, [*w["sets"], "steps=60"], tmp_path / "cache")
            ora = job["pols"]["oracle"]
            for n, (ben, sec, rate, _) in job["pols"].items():
                if n.startswith("static-") and rate <= w["delta"]:
                    assert ora[0] / ora[1] >= ben / sec - 1e-9
    meta = {"date": "d", "commit": "c", "command": "cmd", "seeds": 2, "variant_seeds": 2,
            "pop_seeds": 2, "wall_s": 1.0, "cpu_s": 1.0, "load": (0.0, 0.0)}
    page = tmp_path / "page.md"
    page.write_text("intro\n\nmore prose\n")
    for _ in range(2):  # the second write replaces the sections, it does not add more
        mod.write_md(page, {"table": mod.table_md(res, meta),
                            "ablation": mod.ablation_md(res, variants, meta)})
    text = page.read_text()
    assert text.startswith("intro\n\nmore prose\n")
    assert text.count(mod.MARKS["table"][0]) == 1 and text.count(mod.MARKS["ablation"][1]) == 1
    for name in wls:
        assert f"| {name} | sagc |" in text
    verdict = mod.ablation(res, variants)
    assert verdict["same"]["max_loss"] == pytest.approx(0.0) and not verdict["same"]["keep"]


def test_replay_extension_rule_check(tmp_path):
    """benchmarks/replay_extension.py's finding, on the real G = 16 recording: rows added by the
    plug-in k / n never make a group informative, so it reads informative at 16 as informative
    at n; the replay's rule (empirical Bayes) reads it above the plug-in, and above Jeffreys
    from 8 rows; and the cut replay it builds (8 recorded rows a group, the rest by the rule)
    turns some one-sided groups informative, which the plug-in could not."""
    from sagc_jax.sagc.simulate import load_sim_config

    _suite()  # replay_extension imports it by name
    ext = _module("replay_extension")
    rows = [r.split("|")[1:-1] for r in ext.rule_check(reps=20)[2:]]
    assert [int(r[0]) for r in rows] == [4, 8]
    fig = {int(n): [float(x) for x in (real, plug, jeff, eb, at_n)]
           for n, real, plug, jeff, eb, at_n, *_ in rows}
    for n, (real, plug, jeff, eb, at_n) in fig.items():
        assert plug == pytest.approx(at_n, abs=1e-9), n
        assert real > eb > plug and jeff > plug, n
    assert fig[8][3] > fig[8][2]  # from 8 rows, the rule above Jeffreys
    sim = load_sim_config(ext.cut_replay(8, tmp_path), ["seed=0"])
    gained = 0
    for step in range(3):
        passes = sim.workload.draw(step).rewards > ext.PASS
        inf8, inf16 = ext._informative(passes[:, :8]), ext._informative(passes[:, :16])
        gained += int((inf16 & ~inf8).sum())
    assert gained > 0


def test_prompt_order_replays_the_same_records_in_another_order(tmp_path):
    """benchmarks/prompt_order.py: a shuffled order replays exactly the recording's groups,
    renumbered, in an order that differs from the recorded one and depends on the seed."""
    import json

    from sagc_jax.sagc.simulate import load_sim_config

    _suite()  # prompt_order imports it by name
    mod = _module("prompt_order")
    recs = [json.loads(x) for x in mod.TRACE.read_text().splitlines() if x.strip()]
    orders = []
    for s in (1, 2):
        path = mod.shuffled_replay(s, tmp_path)
        got = [json.loads(x) for x in (tmp_path / f"order{s}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in got] == list(range(1, len(recs) + 1))
        key = lambda r: json.dumps(r["groups"], sort_keys=True)  # noqa: E731
        assert sorted(map(key, got)) == sorted(map(key, recs))
        orders.append([key(r) for r in got])
        sim = load_sim_config(path, ["seed=0"])
        assert sim.workload.steps == 300 and len(sim.workload.groups) == len(recs)
    assert orders[0] != [key(r) for r in recs] and orders[0] != orders[1]
