"""``sagc-jax simulate``: config parsing/validation, common random numbers, trace replay,
calibrated timing, outputs (table, JSON, PNG) and exit codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from sagc_jax.sagc.simulate import (
    apply_overrides,
    load_sim_config,
    parse_sim_config,
    simulate_main,
)
from sagc_jax.sagc.timing import time_model_from_dict

SMALL = {
    "steps": 40,
    "seed": 1,
    "workload": {"prompts_per_step": 4, "max_new_tokens": 256, "loop_prob": 0.01},
    "sagc": {"group_sizes": [4, 8], "initial_group_size": 4, "delta": 0.2},
}


def _write(tmp_path, cfg, name="sim.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_simulate_main_writes_json_png_and_table(tmp_path, capsys):
    cfg = _write(tmp_path, SMALL)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = simulate_main(["--config", str(cfg), "steps=30", "--out", str(out), "--plot", str(png)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["policies"]) == {"static-4", "static-8", "sagc"}
    for v in res["policies"].values():
        for key in ("straggler_rate", "step_s", "benefit_per_s", "mean_group_size", "meets_delta"):
            assert key in v
    assert len(res["policies"]["sagc"]["group_size_trajectory"]) == 30
    assert res["policies"]["static-8"]["mean_group_size"] == 8.0
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "| sagc |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("workload.loop_prob=1.5", "workload.loop_prob"),
        ("sagc.delta=0", "sagc.delta"),
        ("workload.bogus=1", "workload.bogus"),
        ("steps=-3", "steps"),
        ("timing.decode_a=-1", "timing.decode_a"),
        ("workload.drift=[{loop_prob: 0.1}]", "workload.drift[0]"),
        ("sagc.nope=1", "sagc.nope"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, capsys, override, key):
    cfg = _write(tmp_path, SMALL)
    assert simulate_main(["--config", str(cfg), override]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    # "<key>: ..." or, from the shared config schema, "unknown key '<key>' (did you mean ...)"
    assert err.startswith((f"error: {key}", f"error: unknown key '{key}'"))


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert simulate_main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: --config")


def test_overrides_are_dot_paths_parsed_as_yaml():
    raw = apply_overrides({"a": {"b": 1}}, ["a.b=2.5", "a.c=[1, 2]", "d.e=true"])
    assert raw == {"a": {"b": 2.5, "c": [1, 2]}, "d": {"e": True}}
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides({}, ["nokey"])


def test_common_random_numbers_and_determinism():
    sim = parse_sim_config(SMALL)
    d1, d2 = sim.workload.draw(7), sim.workload.draw(7)
    np.testing.assert_array_equal(d1.lengths, d2.lengths)
    assert d1.lengths.shape == (4, 8)  # every policy slices [:B, :g] of the same block
    assert not np.array_equal(sim.workload.draw(8).lengths, d1.lengths)
    assert (d1.lengths[d1.truncated] == 256).all()


def test_drift_changes_parameters_at_step():
    raw = {
        **SMALL,
        "workload": {**SMALL["workload"], "drift": [{"at_step": 10, "median_length": 50}]},
    }
    sim = parse_sim_config(raw)
    assert sim.workload.params_at(9).median_length == 120
    assert sim.workload.params_at(10).median_length == 50
    assert sim.drift_steps == (10,)


def test_trace_replay(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for step in range(5):
        groups = []
        for _ in range(3):
            lengths = rng.integers(20, 200, 4)
            lengths[0] = 256 if step == 2 else lengths[0]
            groups.append(
                {
                    "lengths": lengths.tolist(),
                    "truncated": (lengths >= 256).tolist(),
                    "rewards": rng.integers(0, 2, 4).astype(float).tolist(),
                }
            )
        lines.append(
            json.dumps({"step": step, "group_size": 4, "max_new_tokens": 256, "groups": groups})
        )
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")
    cfg = _write(tmp_path, {**SMALL, "workload": {"trace": "trace.jsonl", "prompts_per_step": 4}})
    sim = load_sim_config(cfg)
    d = sim.workload.draw(0)
    assert d.lengths.shape == (4, 8) and d.max_new_tokens == 256
    out = tmp_path / "r.json"
    assert simulate_main(["--config", str(cfg), "--out", str(out)]) == 0
    assert "sagc" in json.loads(out.read_text())["policies"]
    (tmp_path / "bad.jsonl").write_text('{"step": 0}\n')
    bad = _write(tmp_path, {**SMALL, "workload": {"trace": "bad.jsonl"}}, "bad.yaml")
    with pytest.raises(ValueError, match=r"^workload\.trace: "):
        load_sim_config(bad)


def test_calibrated_time_model(tmp_path):
    cal = {"rows": [64, 128], "decode_step_s": [0.01, 0.02], "prefill_s": [0.1, 0.2]}
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    tm = time_model_from_dict({"calibration": "cal.json"}, tmp_path)
    assert tm.decode_step_s(96) == pytest.approx(0.015)
    assert tm.decode_step_s(256) == pytest.approx(0.04)  # linear extrapolation
    assert tm.prefill_s(64) == pytest.approx(0.1)
    lin = time_model_from_dict({"decode_a": 0.02, "decode_b": 1e-4})
    assert lin.decode_step_s(100) == pytest.approx(0.03)
    assert lin.decode_steps(17, 512) == 32 and lin.decode_steps(600, 512) == 512
    with pytest.raises(ValueError, match=r"^timing\.calibration: "):
        time_model_from_dict({"calibration": "missing.json"}, tmp_path)


def test_shipped_configs_parse():
    for name in ("heavy_tail", "drift"):
        sim = load_sim_config(f"configs/sim/{name}.yaml")
        assert sim.steps == 1500 and sim.sagc.group_sizes == (4, 8, 12, 16)
