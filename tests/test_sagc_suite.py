"""tools/sagc_suite.py on a cut-down suite: one synthetic and one real workload, 2 seeds,
60 steps, 2 population seeds (a few seconds)."""

from __future__ import annotations

import pytest

from tools import sagc_suite


def test_suite_core(tmp_path):
    """Pooled figures are sums over seeds; a static is 1.0x itself; the per-seed hindsight
    oracle beats every static within delta; a variant equal to the defaults is 1.0x SAGC; the
    real replays get their group's overrides; the page's sections are rewritten in place."""
    mod = sagc_suite
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


def test_cached_only_reads_the_complete_seed_prefix(tmp_path):
    """A cut run's partial result (`--cached-only`): nothing is computed; the figures are those
    of the seeds the cache holds for every workload and config, the variants' own prefix."""
    mod = sagc_suite
    wls = mod.workloads("drift")
    variants = {"no_credit": ["credit_cap=0"]}
    cache = tmp_path / "cache"
    with pytest.raises(SystemExit, match="holds no complete seed"):
        mod.run_suite(wls, 2, variants, 2, 2, 1, cache, ["steps=40"], progress=False,
                      cached_only=True)
    full, _ = mod.run_suite(wls, 2, variants, 2, 2, 1, cache, ["steps=40"], progress=False)
    part, cpu = mod.run_suite(wls, 5, variants, 5, 2, 1, cache, ["steps=40"], progress=False,
                              cached_only=True)
    assert (part["seeds"], part["variant_seeds"], part["pop_seeds"]) == (2, 2, 2)
    assert part["workloads"] == full["workloads"] and cpu < 5.0
    # Seed 1 of the variant missing: the shipped figures keep 2 seeds, the variant has 1.
    gone = [f for f in (cache / "suite").glob("drift-sagc-1-*.pkl")]
    for f in gone:  # the two SAGC configs of seed 1; keep the shipped one by recomputing it
        f.unlink()
    mod.run_suite(wls, 2, {}, 2, 2, 1, cache, ["steps=40"], progress=False)
    part, _ = mod.run_suite(wls, 2, variants, 2, 2, 1, cache, ["steps=40"], progress=False,
                            cached_only=True)
    assert (part["seeds"], part["variant_seeds"]) == (2, 1)
    assert part["workloads"]["drift"]["policies"]["no_credit"]["seeds"] == 1


def test_cache_key_ignores_comments_not_values_or_the_trace(tmp_path):
    """A reworded comment keeps every cached job (the key is the parsed workload); a changed
    value or a changed trace file does not."""
    from tools.sagc_sweep import workload_key

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"step": 1}\n')
    wl = tmp_path / "w.yaml"
    wl.write_text("# a comment\nsteps: 10\nworkload: {trace: t.jsonl}\n")
    k0 = workload_key(wl)
    wl.write_text("# another comment, longer\nsteps: 10   # inline\nworkload: {trace: t.jsonl}\n")
    assert workload_key(wl) == k0
    trace.write_text('{"step": 2}\n')
    assert workload_key(wl) != k0
    trace.write_text('{"step": 1}\n')
    wl.write_text("steps: 11\nworkload: {trace: t.jsonl}\n")
    assert workload_key(wl) != k0


def test_cached_only_without_a_complete_variant_seed_gives_the_main_table(tmp_path):
    """Before any variant seed is complete, `--cached-only` still reads the main table."""
    mod = sagc_suite
    wls = mod.workloads("drift")
    cache = tmp_path / "cache"
    mod.run_suite(wls, 1, {}, 1, 1, 1, cache, ["steps=30"], progress=False)
    res, _ = mod.run_suite(wls, 1, {"never_run": ["credit_cap=7"]}, 1, 1, 1, cache,
                           ["steps=30"], progress=False, cached_only=True)
    assert (res["seeds"], res["variant_seeds"]) == (1, 0)
    assert "never_run" not in res["workloads"]["drift"]["policies"]


def test_suite_diff_sets_sagc_before_and_after_and_refuses_other_workloads(tmp_path, capsys):
    """tools/sagc_suite_diff.py: after / before is SAGC's pooled benefit/s ratio, a variant of
    the second suite is read against the first suite's SAGC, and two suites over different
    workloads are refused in one line (exit 2), or with --common compared where both hold."""
    import json

    from tools import sagc_suite_diff

    def suite(ben: float, g: float, **variants: float) -> dict:
        pols = {"static-4": {"benefit_per_s": 1.0, "vs_best_static": [1.0, 1.0], "mean_g": 4},
                "oracle": {"benefit_per_s": 3.0},
                "sagc": {"benefit_per_s": ben, "vs_best_static": [ben, ben], "mean_g": g}}
        pols |= {k: {"benefit_per_s": v} for k, v in variants.items()}
        return {"workloads": {"drift": {"best_static": "static-4", "policies": pols}}}

    before, after = tmp_path / "b.json", tmp_path / "a.json"
    before.write_text(json.dumps(suite(1.0, 8.0)))
    after.write_text(json.dumps(suite(1.02, 9.5, rowsprior=1.01)))
    assert sagc_suite_diff.main([str(before), str(after)]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == ("| drift | static-4 | 1.000 | 1.020 | 1.0200 | 8.00 -> 9.50 | 1.0100 |")
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"workloads": {"bimodal": suite(1.0, 8.0)["workloads"]["drift"]}}))
    assert sagc_suite_diff.main([str(before), str(other)]) == 2
    assert "workloads differ: ['bimodal', 'drift']" in capsys.readouterr().err
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"workloads": {**suite(1.02, 9.5)["workloads"],
                                              **json.loads(other.read_text())["workloads"]}}))
    assert sagc_suite_diff.main([str(before), str(both), "--common"]) == 0
    out = capsys.readouterr().out
    assert "| drift | static-4 | 1.000 | 1.020 | 1.0200 | 8.00 -> 9.50 |" in out
    assert "| bimodal" not in out and "In one suite only (not compared): bimodal" in out


def test_ablation_table_reads_one_json_per_variant_and_refuses_another_baseline(tmp_path,
                                                                               capsys):
    """tools/sagc_ablation_table.py: one suite JSON per variant (as tools/sagc_ablation.sh
    writes them) merge into one part; a constant at its shipped value moves nothing, a
    removed mechanism loses more than the bar and is kept; a file whose shipped SAGC differs
    (another controller or other draws) is refused naming it (exit 2)."""
    import json

    from tools import sagc_ablation_table as tab

    part = tmp_path / "res" / "nobudget"
    part.mkdir(parents=True)
    base = ["--seeds", "2", "--pop-seeds", "1", "--workers", "1", "--only", "length_growth",
            "--cache", str(tmp_path / "cache"), "--no-budget", "--set", "steps=200"]
    for v in ("same=credit_horizon_x=3", "notrend=trend_half_life_x=0"):
        assert sagc_suite.main([*base, "--variant", v,
                                "--json", str(part / f"{v.split('=')[0]}.json")]) == 0
    res, variants, metas = tab.load_part(part)
    assert variants == {"same": ["credit_horizon_x=3"], "notrend": ["trend_half_life_x=0"]}
    assert [m["variant_seeds"] for m in metas] == [2, 2]
    same = tab.variant_figures(res, "same")
    assert same["ratios"] == {"length_growth": pytest.approx(1.0)}
    assert tab.constant_verdict([same]).startswith("**moves nothing")
    page = tab.page_md(tmp_path / "res")
    assert "| `credit_horizon_x` | credit_horizon_x=3 |" in page
    assert "Not run yet: measured, budget, nobudget_groups, nobudget_pinned." in page
    assert "| *shipped SAGC's mean G* |" in page
    bad = json.loads((part / "same.json").read_text())
    bad["workloads"]["length_growth"]["policies"]["sagc"]["benefit_per_s"] *= 1.01
    (part / "zz.json").write_text(json.dumps(bad))
    assert tab.main(["--results", str(tmp_path / "res"), "--out", str(tmp_path / "p.md")]) == 2
    assert "zz.json: shipped SAGC differs" in capsys.readouterr().err
