"""LoRA: zero adapters leave the model exact, only adapters train, merged / PEFT exports match
transformers (and peft), and a LoRA run of the main job resumes exactly after a kill."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from hf_fixtures import hf_logits, load_hf, tiny_hf_dir  # noqa: F401  (session fixture)
from reference_step import rollout
from xla_env import xla_flags

from sagc_jax.cli import main
from sagc_jax.config import ConfigError, config_from_dict
from sagc_jax.export import export
from sagc_jax.metrics import TIMING_KEYS, read_jsonl
from sagc_jax.models import ModelConfig, Transformer, from_pretrained, save_pretrained
from sagc_jax.models.decode import decode_weights
from sagc_jax.models.lora import LORA_TARGETS, add_lora, disable_adapters, split_trainable
from sagc_jax.models.peft import save_peft_adapter
from sagc_jax.models.sharding import state_shardings
from sagc_jax.open_run import load_policy
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.shapes import TrainLayout
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import RunState, init_opt_state

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)
LCFG = dataclasses.replace(CFG, lora_rank=4, lora_alpha=8.0, lora_targets=LORA_TARGETS)
IDS = (np.arange(24).reshape(2, 12) * 7 + 3) % CFG.vocab_size


def _randomise_b(model: Transformer, seed: int = 1, std: float = 0.1) -> None:
    """Non-zero adapters (a fresh B is zero, which would hide a wrong A, B or scale)."""
    keys = jax.random.split(jax.random.key(seed), len(model.cfg.lora_targets))
    for k, t in zip(keys, model.cfg.lora_targets, strict=True):
        b = getattr(model.layers, t + "_lora_b")
        b[...] = jax.random.normal(k, b.shape) * std


def test_zero_adapters_equal_base_and_merge_equals_unmerged():
    base = Transformer(CFG, rngs=nnx.Rngs(0))
    model = Transformer(LCFG, rngs=nnx.Rngs(0))
    ref = np.asarray(base(IDS))
    np.testing.assert_allclose(np.asarray(model(IDS)), ref, rtol=0, atol=1e-6)
    _randomise_b(model)
    lora_logits = np.asarray(model(IDS))
    assert np.abs(lora_logits - ref).max() > 1e-2  # the adapters do act
    # Adapters off (the KL reference): the base exactly, from the same arrays.
    graphdef, state = nnx.split(model)
    np.testing.assert_array_equal(np.asarray(nnx.merge(graphdef, disable_adapters(state))(IDS)),
                                  ref)
    # The decode path merges W + (alpha/r) A @ B once: its weights equal the unmerged forward's.
    w = decode_weights(model)
    base_w = decode_weights(base)
    a, b = model.layers.q_proj_lora_a[...], model.layers.q_proj_lora_b[...]
    np.testing.assert_allclose(np.asarray(w.layers[1]["q_proj"]),
                               np.asarray(base_w.layers[1]["q_proj"] + 2.0 * a[1] @ b[1]),
                               rtol=1e-6, atol=1e-6)
    assert not any(k.endswith(("_lora_a", "_lora_b")) for k in w.layers[0])


def test_only_adapters_train_and_carry_optimizer_state():
    """One sharded GRPO step (fsdp=2 x tensor=2): base bitwise unchanged, A and B move, AdamW
    state only for the adapters; the adapter sharding rules place A / B like their weight."""
    mesh = make_mesh(1, 2, 2, devices=jax.devices()[:4])
    graphdef, params = nnx.split(Transformer(LCFG, rngs=nnx.Rngs(0)))
    shard = state_shardings(params, mesh)
    params = jax.device_put(params, shard)
    spec = nnx.to_pure_dict(shard)["layers"]
    assert tuple(spec["q_proj_lora_a"].spec) == (None, "fsdp", None)
    assert tuple(spec["q_proj_lora_b"].spec) == (None, None, "tensor")
    before = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
    train, _ = split_trainable(params)
    opt = optax.adam(1e-2)
    opt_state, opt_shard = init_opt_state(opt, train, mesh)
    assert sum(x.size for x in jax.tree.leaves(opt_state)) == 2 * LCFG.num_lora_params() + 1
    learner = Learner(graphdef, opt, LossSettings(beta=0.0, max_tokens=4), mesh, shard,
                      opt_shard, TrainLayout(8, 2, 4, 8, (4,)))
    ro = rollout(0, g=4, prompts=2, lp=4, n=4, vocab=CFG.vocab_size, drop=(), truncate=False)
    ro.lengths[:], ro.rewards = 4, np.tile([0.0, 1.0], 4).astype(np.float32)
    state, m = learner.update(RunState(params, opt_state), make_batch(ro, learner.layout))
    params = state.params
    assert float(m["finite"]) == 1.0 and float(m["grad_norm"]) > 0
    after = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
    for k, v in after["layers"].items():
        if k.endswith("_lora_b"):
            assert np.abs(v).max() > 0, k  # B left zero: the adapter got no gradient
        elif not k.endswith("_lora_a"):
            np.testing.assert_array_equal(v, before["layers"][k], err_msg=k)
    for k in ("embed", "final_norm", "lm_head"):
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_lora_config_rules():
    cfg = config_from_dict({"model": {"lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}})
    assert cfg.model.lora.rank == 8 and config_from_dict({}).model.lora is None
    for bad, key in (({"dropout": 0.1}, "model.lora.dropout"),
                     ({"targets": ["q"]}, "model.lora.targets[0]"),
                     ({"rank": 0}, "model.lora.rank")):
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            config_from_dict({"model": {"lora": bad}})


def test_merged_and_peft_exports_match_transformers(tiny_hf_dir, tmp_path):  # noqa: F811
    peft = pytest.importorskip("peft")  # in the `test` extra
    base_dir = tiny_hf_dir("llama")
    model, mcfg = from_pretrained(base_dir)
    model.cfg = dataclasses.replace(mcfg, lora_rank=4, lora_alpha=8.0,
                                    lora_targets=LORA_TARGETS)
    add_lora(model.layers, LORA_TARGETS, 4, nnx.Rngs(3))
    _randomise_b(model, std=0.2)
    ids = IDS % mcfg.vocab_size
    ours = np.asarray(model(ids))
    assert np.abs(ours - hf_logits(load_hf(base_dir), ids)).max() > 1e-2

    save_pretrained(model, tmp_path / "merged")
    np.testing.assert_allclose(hf_logits(load_hf(tmp_path / "merged"), ids), ours,
                               rtol=0, atol=1e-4)

    save_peft_adapter(model, tmp_path / "peft", base_model=str(base_dir))
    conf = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["base_model_name_or_path"] == str(base_dir)
    with_adapter = peft.PeftModel.from_pretrained(load_hf(base_dir), tmp_path / "peft").eval()
    np.testing.assert_allclose(hf_logits(with_adapter, ids), ours, rtol=0, atol=1e-4)


def test_peft_export_of_a_model_without_adapters_is_a_bad_input(tiny_hf_dir, tmp_path,  # noqa: F811
                                                                 capsys):
    hf_dir = tiny_hf_dir("llama")
    capsys.readouterr()  # the fixture's own output (transformers' progress bar)
    rc = main(["export", "--checkpoint", str(hf_dir), "--out", str(tmp_path / "x"), "--format",
               "peft"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no LoRA adapters" in err, err


# ---- the main job with LoRA: learns nothing wrong, resumes exactly ---------------------------
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=arith_short", "data.task_max_steps=3",
    "data.prompts_per_step=4", "sagc.group_sizes=[2,4]", "sagc.initial_group_size=4",
    "sagc.warmup_steps=1", "sagc.timing=model", "sampling.max_new_tokens=32",
    "sampling.prompt_buckets=[16]", "sampling.decode_chunk=8", "init.sft_steps=8",
    "init.sft_batch_size=8", "optim.lr=1e-2", "optim.warmup_steps=0", "checkpoint.every=1",
    "checkpoint.keep=10", "run.progress=false", "run.plots=false",
    "model.lora.rank=4", "model.lora.alpha=8.0", "algo.beta=0.04",
]
ROOT = Path(__file__).resolve().parent.parent
STEPS = 5


def _cli(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "sagc_jax.cli", "train", *TINY, f"run.dir={run_dir}",
            f"run.steps={STEPS}"]


def _env() -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": xla_flags(1),
            "PYTHONUNBUFFERED": "1"}


def _params(run_dir: Path, step: int | None = None) -> dict:
    mngr = ocp.CheckpointManager(run_dir / "checkpoints")
    step = mngr.latest_step() if step is None else step
    got = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    return ocp.tree.to_flat_dict(got["params"])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    r = subprocess.run(_cli(run_dir), env=_env(), capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_lora_run_trains_adapters_only_with_zero_compiles(lora_run, tmp_path):
    """Checkpoints hold the adapters only; loading the run puts them on the frozen base
    (checkpoints/initial, bitwise), and its merged export is what transformers computes."""
    rows = read_jsonl(lora_run / "metrics.jsonl")
    assert len(rows) == STEPS and all(r["compiles"] == 0 for r in rows)
    assert all(r["kl"] >= 0 for r in rows)
    first, last = _params(lora_run, 1), _params(lora_run)
    assert sorted(k[-1] for k in last) == sorted(
        t + s for t in LORA_TARGETS for s in ("_lora_a", "_lora_b"))
    assert all(not np.array_equal(last[k], first[k]) for k in last)  # adapters keep training
    model, tok, _ = load_policy(lora_run)
    loaded = ocp.tree.to_flat_dict(jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model))))
    initial = ocp.tree.to_flat_dict(ocp.StandardCheckpointer().restore(
        lora_run / "checkpoints" / "initial"))
    for k, v in loaded.items():
        np.testing.assert_array_equal(v, last[k] if k in last else initial[k], err_msg=str(k))
    export(lora_run, tmp_path / "hf")
    export(lora_run, tmp_path / "peft", fmt="peft")  # adapters only, for the run's model.path
    conf = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 8.0 and conf["base_model_name_or_path"] is None
    assert (tmp_path / "peft" / "adapter_model.safetensors").is_file()
    # Both exports carry the tokenizer training encoded with (its <bos> rule included).
    from transformers import AutoTokenizer

    from sagc_jax.data.tokenizer import encode_prompt

    for d in ("hf", "peft"):
        saved = AutoTokenizer.from_pretrained(tmp_path / d)
        assert [saved(p).input_ids for p in ("2+6+7+2=", "9-3+5=")] == [
            encode_prompt(tok, p) for p in ("2+6+7+2=", "9-3+5=")]
    ids = IDS % model.cfg.vocab_size
    np.testing.assert_allclose(hf_logits(load_hf(tmp_path / "hf"), ids), np.asarray(model(ids)),
                               rtol=0, atol=1e-4)


def test_lora_run_resumes_exactly_after_kill(lora_run, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_cli(run_dir), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        # Killed once step 2's checkpoint is final (async saves finish after the step's row).
        if (run_dir / "checkpoints" / "2").is_dir():
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(metrics.read_text().splitlines()) < STEPS
    r = subprocess.run(_cli(run_dir), env=_env(), capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step" in r.stdout
    a, b = _params(lora_run), _params(run_dir)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_KEYS}  # noqa: E731
                          for r in rows]
    assert strip(read_jsonl(metrics)) == strip(read_jsonl(lora_run / "metrics.jsonl"))
