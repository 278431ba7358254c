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
