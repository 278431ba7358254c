"""Dry runs of every shipped config (no weights, data or tokenizer download), launch scripts'
syntax, and the GPU benchmark's CPU smoke mode.

Shipped configs dry-run as they are: their `model.path` is a placeholder, so the architecture
comes from `model.preset`. Some tests also give a fake HF directory holding only a config.json
with the public Qwen2.5 numbers, which wins over the preset.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from xla_env import OPT_FLAGS

from sagc_jax.config import load_config
from sagc_jax.dryrun import DryRunError, dry_run, format_report, main

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))  # not configs/sim: those are simulator ones

_QWEN_COMMON = dict(
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6,
    rope_theta=1e6, max_position_embeddings=32768, vocab_size=151936, tie_word_embeddings=True,
    bos_token_id=151643, eos_token_id=151645, use_sliding_window=False, sliding_window=32768,
    attention_dropout=0.0, torch_dtype="bfloat16")
QWEN = {  # public config.json numbers of Qwen2.5-{0.5B,1.5B}-Instruct -> (config, params)
    "0.5b": (dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_window_layers=21),
             494_032_768),
    "1.5b": (dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_window_layers=28),
             1_543_714_304),
}
# Target topology of configs that are not meant for this machine's 4 CPU devices.
TARGETS = {"tpu-v5e-16": dict(num_devices=16, num_processes=4),
           "tpu-v5e-8": dict(num_devices=8, num_processes=1)}


@pytest.fixture(scope="module")
def fake_hf(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for size, (arch, _) in QWEN.items():
        d = tmp_path_factory.mktemp(f"qwen2.5-{size}")
        (d / "config.json").write_text(json.dumps({**_QWEN_COMMON, **arch}))
        out[size] = d
    return out


def _size_of(path: Path) -> str:
    return next((s for s in QWEN if s in path.name.lower()), "0.5b")


def _load(path: Path, fake_hf: dict[str, Path] | None, *extra: str):
    raw = load_config(path)
    over = list(extra)
    if raw.model.path is not None and fake_hf is not None:
        d = fake_hf[_size_of(path)]
        over += [f"model.path={d}", f"model.tokenizer={d}"]
    return load_config(path, over)


def _target(path: Path) -> dict:
    return next((v for k, v in TARGETS.items() if k in path.name), {})


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_dry_runs(path):
    """As shipped: no weights, no fake model dir, estimate only (abstract mesh of the target)."""
    cfg = load_config(path)
    r = dry_run(cfg, **_target(path))
    assert r["ok"], r["errors"]
    mem = r["memory"]
    assert all(mem[k] > 0 for k in ("params", "optimizer", "gradients", "sampler_peak",
                                    "train_peak", "peak"))
    trained = mem["optimizer"] // 2  # AdamW's two moments of what trains
    if cfg.model.lora is None:
        assert trained == mem["params"]
    else:  # the adapters only, also when the dry run falls back to model.preset
        assert r["model"]["lora_rank"] == cfg.model.lora.rank and trained < mem["params"] / 20
    assert mem["gradients"] in (trained, 2 * trained)  # x2: micro-batch accumulator
    assert mem["peak"] == max(mem["static"] + max(mem["sampler_peak"], mem["train_peak"]),
                              mem["sft_total"])
    assert (mem["sft_total"] > 0) == (cfg.init.sft_steps > 0 and not cfg.init.params)
    assert r["sampler_shapes"] and r["train_shapes"]
    for s in r["sampler_shapes"]:
        assert s["rows"] == s["prompts"] * s["group_size"] and s["kv_cache_bytes"] > 0
    if cfg.model.path is not None:
        assert r["model"]["source"].startswith(f"preset {cfg.model.preset} (no config.json")
        if "qwen2.5" in path.name:
            assert r["model"]["num_params"] == QWEN[_size_of(path)][1]
        assert r["checks"]["model.tokenizer"].startswith("not checked")
        if cfg.data.train_file is not None:  # a built-in task (smollm2) has no file to check
            assert r["checks"]["data.train_file"] == "not checked (path missing)"
    assert r["compiled_memory"] is None and "not compiled" in r["compiled_note"]
    options = {o["option"]: o for o in r["memory_options"]}
    assert options["model.remat"]["delta"] != 0 and options["optimizer state"]["delta"] >= 0
    text = format_report(r)
    assert "dry run: OK" in text and "KV cache" in text and "printed peak: estimate" in text


def test_matmul_weight_copy_in_the_estimate():
    """`model.matmul_dtype: bfloat16` under float32 params adds the bf16 weight copy decode
    reads (half the params' bytes); the train step keeps none (its backward re-rounds the
    float32 operands it saves anyway, `models/precision.py`)."""
    path = ROOT / "configs" / "tiny_cpu.yaml"
    base = dry_run(load_config(path))["memory"]
    bf = dry_run(load_config(path, ["model.matmul_dtype=bfloat16"]))["memory"]
    assert base["params"] > 0 and bf["sampler_peak"] - base["sampler_peak"] == base["params"] // 2
    assert bf["train_peak"] == base["train_peak"]


def test_qwen_param_counts_and_tpu_fit(fake_hf):
    tpu = ROOT / "configs" / "qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml"
    r = dry_run(_load(tpu, fake_hf), num_devices=16, num_processes=4,
                device_memory_bytes=16 * 2**30)
    assert abs(r["model"]["num_params"] - 1.54e9) < 0.01e9
    assert r["mesh"] == {"data": 4, "fsdp": 4, "tensor": 1}
    assert r["memory"]["peak"] < 16 * 2**30 and not r["warnings"], r["warnings"]
    assert {s["rows"] for s in r["sampler_shapes"]} == {384}  # batch_policy: rollouts
    gpu = ROOT / "configs" / "qwen2.5-0.5b_gsm8k_gpu.yaml"
    r = dry_run(_load(gpu, fake_hf), num_devices=1)
    assert abs(r["model"]["num_params"] - 494e6) < 1e6
    assert r["memory"]["peak"] < 40 * 2**30


def test_memory_scales_with_fsdp(fake_hf):
    tpu = ROOT / "configs" / "qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml"
    runs = {f: dry_run(_load(tpu, fake_hf, "mesh.data=-1", f"mesh.fsdp={f}"),
                       num_devices=16, num_processes=4) for f in (1, 2, 4, 16)}
    mem = {f: r["memory"] for f, r in runs.items()}
    for a, b in ((1, 2), (2, 4), (4, 16)):
        ratio = mem[a]["params"] / mem[b]["params"]
        assert b / a * 0.99 < ratio <= b / a, (a, b, ratio)  # norms stay replicated
        assert mem[a]["static"] > mem[b]["static"]
    # KV cache and logits follow the batch shards, data x fsdp = 16 in all four meshes.
    kv = {f: [s["kv_cache_bytes"] for s in r["sampler_shapes"]] for f, r in runs.items()}
    assert kv[1] == kv[2] == kv[4] == kv[16]
    assert all(mem[1][k] == mem[16][k] for k in ("logits", "activations", "kv_cache"))
    # 1.54B x 16 B does not fit a 16 GiB chip unsharded; fsdp=4 does.
    assert mem[1]["peak"] > 16 * 2**30 > mem[4]["peak"]


def test_mesh_and_batch_validation(fake_hf):
    tpu = ROOT / "configs" / "qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml"
    cfg = _load(tpu, fake_hf)
    with pytest.raises(DryRunError, match="must equal the 8 devices"):
        dry_run(cfg, num_devices=8, num_processes=2)
    with pytest.raises(DryRunError, match="do not split evenly"):
        dry_run(cfg, num_devices=16, num_processes=3)
    # 48 rollouts: 3 prompts at G=16 cannot split over 4 hosts, 48 rows not over 16 shards.
    r = dry_run(_load(tpu, fake_hf, "sagc.rollouts_per_step=48", "algo.micro_batch_rows=16"),
                num_devices=16, num_processes=4)
    assert not r["ok"] and any("do not divide data.shards = 4" in e for e in r["errors"])
    # micro_batch_rows must divide every rows count.
    r = dry_run(_load(tpu, fake_hf, "algo.micro_batch_rows=100"), num_devices=16,
                num_processes=4)
    assert any(e.startswith("algo.micro_batch_rows: 100 must divide") for e in r["errors"])
    # Single process: rows that do not split are only a warning (the batch is replicated).
    tiny = load_config(ROOT / "configs" / "tiny_cpu.yaml", ["data.prompts_per_step=1",
                                                            "sagc.group_sizes=[2,3]",
                                                            "sagc.initial_group_size=2"])
    r = dry_run(tiny, num_devices=4)
    assert r["ok"] and any("replicated" in w for w in r["warnings"])
    # A missing model dir without a preset is a clear error, not a traceback.
    with pytest.raises(DryRunError, match=r"no config\.json in .* or model\.preset=NAME"):
        dry_run(load_config(tpu, ["model.preset=null"]), num_devices=16, num_processes=4)


def test_cli_main(fake_hf, capsys):
    tpu = ROOT / "configs" / "qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml"
    rc = main(["--config", str(tpu), "--num-devices", "16", "--num-processes", "4",
               f"model.path={fake_hf['1.5b']}", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out)["devices"] == 16
    # placeholder model.path and no preset
    assert main(["--config", str(tpu), "--num-devices", "16", "model.preset=null"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["--config", str(tpu), "model.preset=qwen3"]) == 2
    assert "model.preset: unknown preset 'qwen3'; known: " in capsys.readouterr().err


def test_preset_real_path_wins_and_memory_options(fake_hf, capsys):
    gpu = ROOT / "configs" / "qwen2.5-0.5b_gsm8k_gpu.yaml"
    real = dry_run(_load(gpu, fake_hf), num_devices=1)
    assert real["model"]["source"].startswith("hf config ")  # a real model.path wins
    preset = dry_run(load_config(gpu), num_devices=1, device_memory_bytes=141 * 10**9)
    assert preset["model"]["source"].startswith("preset qwen2.5-0.5b")
    assert preset["memory"] == real["memory"]
    # bf16 storage halves params, AdamW state and gradients (and warns at GRPO learning rates).
    bf = dry_run(load_config(gpu, ["model.param_dtype=bfloat16"]), num_devices=1)
    assert bf["memory"]["params"] * 2 == preset["memory"]["params"]
    assert bf["memory"]["optimizer"] * 2 == preset["memory"]["optimizer"]
    assert any("round away" in w for w in bf["warnings"])
    opts = {o["option"]: o for o in preset["memory_options"]}
    assert opts["model.param_dtype"]["peak"] == bf["memory"]["peak"]
    assert opts["model.remat"]["setting"] is False and opts["model.remat"]["delta"] > 0
    assert opts["optimizer state"]["delta"] == 0  # one device: sharded == replicated
    mb = opts["algo.micro_batch_rows"]  # an H200 holds a larger micro-batch than 16 rows
    assert mb["peak"] <= 141 * 10**9 and int(mb["setting"].split()[0]) > 16
    small = dry_run(load_config(gpu), num_devices=1, device_memory_bytes=2**30)
    assert {o["option"]: o for o in small["memory_options"]}["algo.micro_batch_rows"][
        "setting"] == "none fits"
    # The README's command, as printed (here without compiling, to keep the test fast).
    from sagc_jax.cli import main as cli_main

    assert cli_main(["train", "--config", str(gpu), "--dry-run", "--no-compile"]) == 0
    assert "qwen2 from preset qwen2.5-0.5b" in capsys.readouterr().out


def test_dry_run_compiled_memory_beside_the_estimate():
    tiny = load_config(ROOT / "configs" / "tiny_cpu.yaml", [
        "sagc.group_sizes=[2]", "sagc.initial_group_size=2", "data.prompts_per_step=4",
        "sampling.max_new_tokens=16", "sampling.prompt_buckets=[8]", "sampling.decode_chunk=8"])
    r = dry_run(tiny, compile=True)  # this process's 4 devices: a concrete mesh
    c = r["compiled_memory"]
    # tiny_cpu.yaml warm-starts with SFT (init.sft_steps 600): its program is priced too.
    assert [p["name"] for p in c["programs"]] == ["train_step", "prefill", "decode", "sft_step"]
    assert c["params"] == r["memory"]["params"] and c["opt_state"] >= r["memory"]["optimizer"]
    assert c["peak"] >= c["params"] + c["opt_state"] and r["compiled_note"].startswith("XLA cpu")
    sft = c["programs"][-1]
    # Its arguments are the params and the SFT AdamW state over them (2x), both donated.
    assert sft["argument"] >= 3 * c["params"] and sft["alias"] > 0
    assert c["sft_total"] == sft["total"] + c["opt_state"] and c["peak"] >= c["sft_total"]
    mem = r["memory"]
    assert mem["sft_optimizer"] == 2 * mem["params"] and mem["peak"] >= mem["sft_total"] > 0
    text = format_report(r)
    assert "compiled/estimate" in text and "printed peak: compiled" in text
    assert "SFT warm start" in text
    assert dry_run(tiny, num_devices=8)["compiled_memory"] is None  # abstract mesh: estimate


def test_dry_run_prices_the_sft_warm_start_only_when_it_runs():
    """Issue 51: the SFT warm start (full-base AdamW, a batch of whole sequences) can be the
    run's peak; it is priced when a fresh run does it, and not with init.params or 0 steps."""
    path = ROOT / "configs" / "tiny_cpu.yaml"
    big = dry_run(load_config(path, ["init.sft_batch_size=512"]))["memory"]
    small = dry_run(load_config(path, ["init.sft_batch_size=8"]))["memory"]
    assert big["sft_total"] > small["sft_total"] > 0 and big["peak"] == big["sft_total"]
    for off in ("init.sft_steps=0", "init.params=runs/elsewhere/checkpoints/initial"):
        mem = dry_run(load_config(path, [off]))["memory"]
        assert mem["sft_total"] == 0 and mem["peak"] == mem["static"] + max(
            mem["train_peak"], mem["sampler_peak"])
        assert "SFT warm start" not in format_report(dry_run(load_config(path, [off])))


def test_fake_pod_from_the_config_mesh():
    """The v5e-16 config fixes a 16-device mesh: the CLI re-runs itself on 16 fake CPU devices."""
    tpu = ROOT / "configs" / "qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SAGC_JAX_FAKE_DEVICES")}
    r = subprocess.run([sys.executable, "-m", "sagc_jax.dryrun", "--config", str(tpu),
                        "--num-processes", "4", "--no-compile", "--json"], env=env,
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["devices"], out["processes"], out["ok"]) == (16, 4, True)
    assert "re-running on 16 fake CPU devices" in r.stderr
    assert out["compiled_note"] == "not compiled (--no-compile)"


SCRIPTS = ["launch/local.sh", "launch/gpu.sh", "launch/tpu_pod.sh", "tools/gpu.sh",
           "tools/prepare_gpu_wheels.sh", "tools/sagc_ablation.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_shell_scripts_parse(script):
    path = ROOT / script
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n#") and "set -euo pipefail" in text
    assert os.access(path, os.X_OK)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_tool_shell_script_parses():
    """Every tools/*.sh (gpu_profile.sh runs on without -e: a failed variant costs its line)."""
    paths = sorted((ROOT / "tools").glob("*.sh"))
    assert {p.name for p in paths} >= {"gpu.sh", "gpu_profile.sh", "sagc_ablation.sh"}
    for path in paths:
        assert path.read_text().startswith("#!/usr/bin/env bash\n#"), path.name
        r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, (path.name, r.stderr)


def test_tpu_pod_script_builds_the_remote_command(tmp_path):
    fake = tmp_path / "gcloud"
    fake.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "TPU_NAME": "tpu1",
           "ZONE": "z1", "PROJECT": "p1"}
    r = subprocess.run(["bash", str(ROOT / "launch/tpu_pod.sh"), "configs/x.yaml",
                        "model.path=/mnt/a b", "--dry-run"], env=env, capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "--worker=all" in r.stdout and "tpu1" in r.stdout
    assert ("sagc-jax train --dry-run --config configs/x.yaml distributed.initialize=always "
            "model.path=/mnt/a\\ b") in r.stdout
    r = subprocess.run(["bash", str(ROOT / "launch/tpu_pod.sh"), "c.yaml"], capture_output=True,
                       text=True, env={k: v for k, v in env.items() if k != "ZONE"})
    assert r.returncode != 0 and "ZONE" in r.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_local_sh_dry_run():
    # local.sh sets the device count itself; the tests' -O0 stays (tests/xla_env.py).
    env = {**os.environ, "SAGC_JAX": f"{sys.executable} -m sagc_jax.dryrun", "XLA_FLAGS": OPT_FLAGS}
    # `-c ''`: the dry-run module takes no sub-command; local.sh passes the config through.
    r = subprocess.run(["bash", str(ROOT / "launch/local.sh"), "-n", "2", "-c", "--json",
                        "configs/tiny_cpu.yaml"], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["devices"] == 2


def test_lora_dry_run_compiles_with_adapter_only_optimizer_state():
    """Regression: the compiled-memory path built AdamW state for every param while the LoRA
    step updates only the adapters (an optax tree mismatch)."""
    tiny = load_config(ROOT / "configs" / "tiny_cpu.yaml", [
        "sagc.group_sizes=[2]", "sagc.initial_group_size=2", "data.prompts_per_step=4",
        "sampling.max_new_tokens=16", "sampling.prompt_buckets=[8]", "sampling.decode_chunk=8",
        "model.lora.rank=4"])
    r = dry_run(tiny, compile=True)
    c = r["compiled_memory"]
    assert r["ok"] and c is not None
    assert c["opt_state"] < c["params"] / 2  # adapters only: far below 2x the params


def test_preset_fallback_keeps_lora(tmp_path):
    """The shipped real config without its GGUF at hand falls back to `model.preset`; it must
    size the LoRA run it describes (AdamW state for the adapters only), exactly as the same
    architecture read from a model file (here the preset's config.json in a directory)."""
    from sagc_jax.models.presets import preset_hf_dict

    real = ROOT / "configs" / "smollm2-135m_rg_cpu.yaml"
    fallback = dry_run(load_config(real))
    assert fallback["model"]["source"].startswith("preset smollm2-135m")
    assert fallback["model"]["lora_rank"] == 16
    (tmp_path / "config.json").write_text(json.dumps(preset_hf_dict("smollm2-135m")))
    from_file = dry_run(load_config(real, [f"model.path={tmp_path}"]))
    assert from_file["model"]["source"].startswith("hf config")
    assert fallback["memory"] == from_file["memory"]
    mem = fallback["memory"]
    # LoRA rank 16 on 134.5M params: the adapters are < 10 % of the weights (full fine-tuning
    # would hold two AdamW moments of every weight, 2x the params' bytes).
    assert mem["optimizer"] < 0.1 * mem["params"], mem


@pytest.mark.parametrize("preset", ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "gemma3-270m",
                                    "gemma3-1b", "gemma3-4b"])
def test_new_family_presets_dry_run(preset):
    """The GPU config sized from each Qwen3 / Gemma 3 preset (estimate only): it validates,
    the report names the family, and the params and KV cache follow the architecture."""
    from sagc_jax.models.presets import load_preset

    cfg = load_config(ROOT / "configs" / "qwen2.5-0.5b_gsm8k_gpu.yaml", [f"model.preset={preset}"])
    r = dry_run(cfg, num_devices=1)
    assert r["ok"], r["errors"]
    mcfg = load_preset(preset)
    assert r["model"]["model_type"] == mcfg.model_type
    assert r["model"]["num_params"] == mcfg.num_params()
    assert r["memory"]["params"] == 4 * mcfg.num_params()  # float32 params on one device
    per_token = 2 * mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim * 2  # K, V; bf16
    for s in r["sampler_shapes"]:
        full = s["rows_per_device"] * s["cache_bucket"] * per_token
        if mcfg.sliding_window is None:
            assert s["kv_cache_bytes"] == full
            continue
        # Sliding layers hold <= W - 1 prompt + W generated slots; the global ones everything.
        n_local = sum(mcfg.sliding_layers)
        bound = s["rows_per_device"] * per_token // mcfg.num_layers * (
            n_local * (2 * mcfg.sliding_window - 1)
            + (mcfg.num_layers - n_local) * s["cache_bucket"])
        assert s["kv_cache_bytes"] <= bound
        if s["cache_bucket"] > 2 * mcfg.sliding_window:
            assert s["kv_cache_bytes"] < full
    assert f"{mcfg.model_type} from preset {preset}" in format_report(r)


def test_dry_run_prices_what_the_trainer_compiles(tmp_path, monkeypatch):
    """The dry run's train layout, its chunk programs, their count and the estimate's batch
    bytes equal what the trainer builds (`build_run`) and what its warm-up would compile,
    recorded here instead of compiled. Under `batch_policy: rollouts` the G with the most rows
    is not the one with the most prompts: the step's group count is the latter's."""
    from sagc_jax.memory_estimate import per_device
    from sagc_jax.train.learner import Learner
    from sagc_jax.train.setup import build_run
    from sagc_jax.train.state import RunState

    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", [
        f"run.dir={tmp_path}", "run.eval_every=0", "sagc.batch_policy=rollouts",
        "sagc.rollouts_per_step=16", "sagc.group_sizes=[2,4]", "sagc.initial_group_size=2",
        "sampling.max_new_tokens=16", "sampling.prompt_buckets=[32]", "algo.beta=0.04",
        "algo.top_entropy_quantile=0.5", "algo.pack_chunk_rows=[8,4]"])
    report = dry_run(cfg)
    assert report["ok"], report["errors"]
    t = report["train_layout"]
    assert (t["seqs"], t["num_groups"], t["chunk_sizes"]) == (16, 8, (8, 4))

    lowered: dict[tuple[str, int], tuple] = {}

    class _Record:  # stands in for a jitted program: keeps what warm-up lowers it with
        def __init__(self, key: tuple[str, int]):
            self.key = key

        def lower(self, *args):
            lowered[self.key] = args
            return self

        def compile(self):
            return self

    monkeypatch.setattr(Learner, "_jit", lambda self, name, rows=0: _Record((name, rows)))
    run = build_run(cfg, progress=False)
    try:
        layout = run.learner.layout
        assert (layout.seqs, layout.num_groups, layout.completion_len, layout.pack_len,
                layout.chunk_sizes, layout.share_prompts) == (
            t["seqs"], t["num_groups"], t["completion_len"], t["pack_len"], t["chunk_sizes"],
            t["share_prompts"])
        state: RunState = run.take_initial()
        run.learner.warm_up(state.params, state.opt_state)
    finally:
        run.writer.close()
        run.ckpt.close()
    n_sampler = 2 * len(report["sampler_shapes"])
    assert len(lowered) == report["compiled_programs"] - n_sampler
    by_rows = {x["chunk_rows"]: x for x in report["train_shapes"]}
    assert {c for name, c in lowered if name == "grad"} == set(by_rows)
    ways = report["batch_shards"]
    for c, shape in by_rows.items():
        _, _, chunk, seqs, _ = lowered[("grad", c)]
        assert chunk["tokens"].shape == (c, shape["pack_len"])
        assert chunk["head_slots"].shape == (c, shape["head_slots"])
        assert shape["rows_per_device"] == per_device(c, ways)
        assert seqs["old_logprobs"].shape == (t["seqs"], t["completion_len"])

    def per_device_bytes(tree) -> int:
        return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in jax.tree.leaves(tree))

    _, _, chunk, seqs, _ = lowered[("grad", max(by_rows))]
    assert report["memory"]["batch"] == per_device_bytes(chunk) + per_device_bytes(seqs)
