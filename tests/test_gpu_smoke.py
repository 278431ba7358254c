"""The prepared GPU call (`tools/gpu.sh`, issue 35) run on a CPU with tiny shapes, so the
device run cannot fail on an import, a path or a typo; plus the pure pieces it reports with
(peaks, the roofline's bytes, model FLOPs, the time-model fit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tools import gpu_bench, gpu_steps, gpu_timing

ROOT = Path(__file__).resolve().parent.parent

PARTS = ("env", "train", "decode", "timing", "sagc")


def _probe_wheel(folder: Path) -> None:
    """A one-module wheel: gpu.sh must install it --target and put it on the path."""
    folder.mkdir()
    di = "sagc_gpu_probe-0.0.1.dist-info"
    with zipfile.ZipFile(folder / "sagc_gpu_probe-0.0.1-py3-none-any.whl", "w") as z:
        z.writestr("sagc_gpu_probe.py", "OK = True\n")
        z.writestr(f"{di}/METADATA", "Metadata-Version: 2.1\nName: sagc-gpu-probe\n"
                                     "Version: 0.0.1\n")
        z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                  "Tag: py3-none-any\n")
        z.writestr(f"{di}/RECORD", f"sagc_gpu_probe.py,,\n{di}/METADATA,,\n{di}/WHEEL,,\n"
                                   f"{di}/RECORD,,\n")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("gpu_smoke")
    _probe_wheel(tmp / "wheels")
    out = tmp / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_WHEELS": str(tmp / "wheels"),
           "GPU_SITE": str(tmp / "site"), "XLA_FLAGS": "", "BENCH_ARGS": "--sim-procs 2"}
    r = subprocess.run(["bash", str(ROOT / "tools/gpu.sh"), "--cpu-smoke", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    return out, r


def _load(out: Path, part: str) -> dict:
    return json.loads((out / f"{part}.json").read_text())


def test_cpu_smoke_writes_every_part(smoke):
    out, r = smoke
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    # Few files come back from the device machine: one JSON per part and the log, no cache.
    assert files == sorted([f"{p}.json" for p in PARTS] + ["gpu_bench.log"])
    log = (out / "gpu_bench.log").read_text()
    assert all(f"{p}: exit 0" in log for p in PARTS)
    for p in PARTS:
        d = _load(out, p)
        assert d["smoke"] is True and d["part_s"] > 0


def test_cpu_smoke_env_installs_the_wheels(smoke):
    out, _ = smoke
    env = _load(out, "env")
    assert env["wheel_modules"] == {"sagc_gpu_probe": True}
    assert env["import_failures"] == {}
    assert env["platform"] == "cpu" and env["peaks_source"] == "command line"
    assert env["peak_flops"] == 1e12 and env["peak_hbm_bps"] == 100e9
    assert env["versions"]["jax"] not in ("", "missing")
    assert env["measured"]["matmul_bf16_flops"] > 0 and env["measured"]["copy_bytes_per_s"] > 0


def test_cpu_smoke_train_is_packed_and_sane(smoke):
    out, _ = smoke
    t = _load(out, "train")
    assert t["chunks"] and all(c == 4 for c in t["chunks"]) and t["remat"] is True
    assert 0 < t["token_util"] <= 1 and t["finite"] is True and np.isfinite(t["loss"])
    assert t["rows"] == 8 and t["group_size"] == 4 and t["dtype"] == "bfloat16"
    assert t["tokens_per_s"] == pytest.approx(t["seq_tokens"] / t["step_s"])
    assert t["real_tokens"] < t["seq_tokens"]  # a group's prompt computed once per row
    assert 0 < t["mfu"] < t["hfu_with_remat"] < 1
    assert t["step_s"] > 0 and t["compile_s"] > 0 and len(t["step_s_all"]) == 2
    f = t["fill"]  # the same batch in taller chunks: the same tokens and FLOPs
    assert f["overrides"] == ["algo.pack_chunk_rows=[8]"] and f["chunks"] != t["chunks"]
    assert f["seq_tokens"] == t["seq_tokens"] and f["model_tflop"] == t["model_tflop"]


def test_cpu_smoke_decode_points(smoke):
    out, _ = smoke
    d = _load(out, "decode")
    assert [p["rows"] for p in d["points"]] == [2, 4, 8] and d["prompts"] == 2
    assert [p["held_out"] for p in d["points"]] == [False, False, True]  # the last G measured
    for p in d["points"]:
        assert p["decode_steps"] == 16 and p["step_ms"] > 0 and p["prefill_s"] > 0
        assert 0 < p["roofline_frac_valid"] < p["roofline_frac"] < 1
        assert p["bytes_per_step"] == p["weight_bytes"] + p["prefix_kv_bytes"] + p["gen_kv_bytes"]
        assert p["tokens_per_s"] == pytest.approx(p["rows"] / (p["step_ms"] / 1e3))


def test_cpu_smoke_timing_model_and_suite(smoke):
    out, _ = smoke
    t = _load(out, "timing")
    assert set(t["timing"]) == {"decode_a", "decode_b", "prefill_a", "prefill_b", "decode_chunk"}
    assert all(v >= 0 for v in t["timing"].values()) and t["timing"]["decode_chunk"] == 8
    assert t["fit_rows"] == [2, 4] and t["held_out_rows"] == [8]
    assert t["yaml"].startswith("timing: {decode_a: ")
    assert [o.split("=")[0] for o in t["sagc_overrides"]] == [
        "sagc.time_model.decode_a", "sagc.time_model.decode_b", "sagc.time_model.prefill_a",
        "sagc.time_model.prefill_b"]
    n_configs = len(list((ROOT / "configs" / "sim").glob("*.yaml")))
    assert len(t["sim"]) == 2 * n_configs
    assert {s["timing"] for s in t["sim"]} == {"default", "measured"}
    for s in t["sim"]:
        assert s["steps"] == 20 and s["sagc_benefit_per_s"] > 0
        assert set(s["static_benefit_per_s"]) == {"static-4", "static-8", "static-12",
                                                  "static-16"}


def test_cpu_smoke_sagc_run(smoke):
    out, _ = smoke
    s = _load(out, "sagc")
    assert s["steps"] == 2 and s["compiles_after_warmup"] == 0
    assert set(s["group_sizes"]) <= {2, 4} and len(s["per_step"]) == 2
    assert all(r["step_s"] > 0 and r["decode_s"] > 0 and "sagc_reason" in r
               for r in s["per_step"])


def test_unknown_device_needs_both_peaks():
    h200 = gpu_bench.peaks_for("NVIDIA H200", None, None)
    assert (h200["peak_flops"], h200["peak_hbm_bps"]) == (989e12, 4.8e12)
    for kind in ("NVIDIA H200 NVL", "NVIDIA H100 PCIe", "cpu", "TPU v5 lite"):
        with pytest.raises(gpu_bench.BenchError, match="--peak-tflops T --peak-hbm-gbs B"):
            gpu_bench.peaks_for(kind, None, None)
    with pytest.raises(gpu_bench.BenchError, match="both"):
        gpu_bench.peaks_for("cpu", 100.0, None)
    given = gpu_bench.peaks_for("NVIDIA H200", 500.0, 2000.0)
    assert (given["peak_flops"], given["peak_hbm_bps"]) == (500e12, 2000e9)


def test_env_part_refuses_an_unknown_device_in_one_line(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "tools.gpu_bench", "env", "--out",
                        str(tmp_path / "env.json")], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "gpu_bench env: error: unknown device 'cpu' (peaks known for: NVIDIA H200, NVIDIA H100 "
        "80GB HBM3, NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-40GB); pass its bf16 dense peak "
        "and HBM bandwidth as --peak-tflops T --peak-hbm-gbs B"]
    assert json.loads((tmp_path / "env.json").read_text())["device"] == "cpu"


def test_decode_bytes_count_the_prompt_once_per_prompt():
    from sagc_jax.models.presets import load_preset

    cfg = load_preset("qwen2.5-0.5b", dtype="bfloat16")
    kv_tok = 24 * 2 * 64 * 2 * 2  # layers x kv heads x head dim x (K, V) x bf16
    b = gpu_steps.decode_bytes(cfg, prompts=16, rows=256, prompt_len=128, slots=512, steps=512)
    assert b["prefix_kv_bytes"] == 16 * 128 * kv_tok
    assert b["gen_kv_bytes"] == 256 * 512 * kv_tok
    assert b["weight_bytes"] == 2 * cfg.num_params()
    # The figure: counting the prompt's KV once per row overstates the bytes ~14 %.
    per_row = b["weight_bytes"] + 256 * (128 + 512) * kv_tok
    assert per_row / b["bytes_per_step"] == pytest.approx(1.14, abs=0.01)


def test_train_flops_count_the_layout_as_computed():
    """A lone sequence of n slots: n real slots, ~n^2 / 2 attended pairs; one prompt shared by
    two completions: the prompt's slots and pairs once, siblings never attend to each other."""
    cfg = gpu_steps.bench_config(True)[1]
    lp = gpu_steps.layer_params(cfg)
    h, d, L = cfg.hidden_size, cfg.head_dim, cfg.num_layers
    assert lp == L * (h * d * 2 * (cfg.num_heads + cfg.num_kv_heads)
                      + 3 * h * cfg.intermediate_size)
    q_dim = cfg.num_heads * d
    lone = {"segment_ids": np.array([[1] * 10 + [0] * 6]), "branch_ids": np.zeros((1, 16), int),
            "head_slots": np.array([[6, 7, 8, 9, 0]])}
    assert gpu_steps.attended_pairs(lone["segment_ids"], lone["branch_ids"]) == 55
    assert gpu_steps.train_flops(cfg, [lone]) == pytest.approx(
        6 * lp * 10 + 6 * cfg.vocab_size * h * 4 + 12 * L * q_dim * 55)
    # prompt of 4 slots, completions of 3 and 2 own slots
    seg = np.array([[1] * 9 + [0]])
    br = np.array([[0] * 4 + [1] * 3 + [2] * 2 + [0]])
    assert gpu_steps.attended_pairs(seg, br) == 10 + (4 * 3 + 6) + (4 * 2 + 3)  # no padding


def test_fit_time_model_recovers_a_linear_model():
    rows = [16, 64, 256]
    dec = {"decode_chunk": 32, "points": [
        {"rows": r, "step_ms": 1e3 * (0.004 + 2e-6 * r), "prefill_s": 0.03 + 1e-5 * r}
        for r in rows]}
    fit = gpu_timing.fit_time_model(dec)
    t = fit["timing"]
    assert t["decode_a"] == pytest.approx(0.004) and t["decode_b"] == pytest.approx(2e-6)
    assert t["prefill_a"] == pytest.approx(0.03) and t["prefill_b"] == pytest.approx(1e-5)
    assert fit["fit_max_rel_err"]["decode"] < 1e-9 and t["decode_chunk"] == 32
    assert fit["sagc_overrides"][0] == "sagc.time_model.decode_a=0.004"
    assert fit["loo_max_rel_err"]["decode"] < 1e-9 and fit["held_out_max_rel_err"] is None


def test_fit_time_model_tests_on_held_out_points():
    """A held-out point is not fitted, and its error is reported: here it sits 20 % above the
    line the other points lie on, which the fit must not bend towards."""
    pts = [{"rows": r, "step_ms": 1e3 * (0.004 + 2e-6 * r), "prefill_s": 0.03 + 1e-5 * r}
           for r in (16, 64, 256)]
    pts.append({"rows": 128, "step_ms": 1.2e3 * (0.004 + 2e-6 * 128),
                "prefill_s": 0.03 + 1e-5 * 128, "held_out": True})
    fit = gpu_timing.fit_time_model({"decode_chunk": 32, "points": pts})
    assert fit["timing"]["decode_b"] == pytest.approx(2e-6) and fit["held_out_rows"] == [128]
    assert fit["held_out_max_rel_err"]["decode"] == pytest.approx(0.2 / 1.2)
    assert fit["held_out_max_rel_err"]["prefill"] < 1e-9
    bent = dict(pts[1], step_ms=pts[1]["step_ms"] * 1.5)  # LOO: the others predict it 1/3 low
    loo = gpu_timing.fit_time_model({"decode_chunk": 32, "points": [pts[0], bent, pts[2]]})
    assert loo["loo_max_rel_err"]["decode"] > 0.3


def test_fit_linear_keeps_terms_non_negative():
    assert gpu_timing.fit_linear(np.array([1, 2, 3]), np.array([3.0, 2.0, 1.0])) == (2.0, 0.0)
    a, b = gpu_timing.fit_linear(np.array([10, 20, 30]), np.array([0.5, 1.5, 2.5]))
    assert a == 0.0 and b > 0
    assert gpu_timing.fit_linear(np.array([4, 4]), np.array([1.0, 3.0])) == (2.0, 0.0)


def test_gpu_report_matches_the_readme():
    """benchmarks/README.md's H200 tables are what tools/gpu_report.py prints from the
    committed raw files (the report's table rows and figure lines appear there verbatim)."""
    from tools import gpu_report

    text = gpu_report.report(gpu_report.DEFAULT)
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and "---" not in ln]
    assert len(lines) >= 20
    # The README relabels one decode column (see the section); every row must be there.
    missing = [ln for ln in lines if ln.replace(
        "of roofline counting valid K/V only", "roofline share if only valid K/V were read")
        not in readme]
    assert not missing, missing[:3]
    assert "| cuDNN fused attention (run 3) |" in text and "26.3 %" in text


def test_summarize_trace_sums_device_kernels(tmp_path):
    """Device lines only (not the host's), kernels classed by name, busy = interval union."""
    import gzip

    from tools import gpu_profile

    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
          {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7,
           "args": {"name": "Stream #14(Compute)"}},
          {"ph": "X", "pid": 1, "tid": 7, "name": "gemm_fusion_dot_1", "ts": 0, "dur": 10},
          {"ph": "X", "pid": 1, "tid": 7, "name": "loop_transpose_fusion", "ts": 5, "dur": 10},
          {"ph": "X", "pid": 1, "tid": 7, "name": "gemm_fusion_dot_1", "ts": 30, "dur": 10},
          {"ph": "X", "pid": 2, "tid": 1, "name": "python", "ts": 0, "dur": 1000}]
    path = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = gpu_profile.summarize_trace(path)
    assert s["source"] == "device" and s["events"] == 3
    assert s["kernel_s"] == pytest.approx(30e-6) and s["busy_s"] == pytest.approx(25e-6)
    assert s["stream_busy_s"] == pytest.approx(25e-6) and s["span_s"] == pytest.approx(40e-6)
    assert s["by_class_s"] == pytest.approx({"matmul": 20e-6, "copy / transpose": 10e-6})
    assert s["top"][0] == {"name": "gemm_fusion_dot_1", "s": pytest.approx(20e-6), "count": 2,
                           "class": "matmul"}
