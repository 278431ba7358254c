"""Real-model readiness without weights: architecture presets, bf16 params, optimizer-state
sharding, compiled memory of the real programs (tiny model), and the fake-pod subprocess."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from sagc_jax.config import load_config
from sagc_jax.models import Transformer, from_hf_dict
from sagc_jax.models.presets import PresetError, load_preset, preset_hf_dict, preset_names
from sagc_jax.models.sharding import opt_state_shardings, state_shardings
from sagc_jax.parallel import make_mesh

ROOT = Path(__file__).resolve().parent.parent

# Public parameter counts (HF model cards / safetensors totals) of the shipped presets.
PUBLIC_PARAMS = {
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512,
    "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824,
    "smollm2-135m": 134_515_008,
}
# Qwen3 / Gemma 3: the model cards' rounded figures, millions (total, non-embedding): Qwen3
# cards' "Number of Parameters (Non-Embedding)", Gemma 3 270M's "170M embedding + 100M
# transformer"; gemma3-4b is the text tower of the 4.3B model (its 0.4B SigLIP encoder left out).
CARD_PARAMS = {
    "qwen3-0.6b": (600, 440), "qwen3-1.7b": (1700, 1400), "qwen3-4b": (4000, 3600),
    "gemma3-270m": (270, 100), "gemma3-1b": (1000, None), "gemma3-4b": (3900, None),
}


def test_new_family_presets_match_model_cards():
    for name, (total, body) in CARD_PARAMS.items():
        cfg = load_preset(name, dtype="bfloat16")
        assert cfg == from_hf_dict(preset_hf_dict(name), dtype="bfloat16")
        n = cfg.num_params() / 1e6
        assert abs(n - total) / total < 0.03, (name, n)
        if body is not None:
            assert abs(n - cfg.vocab_size * cfg.hidden_size / 1e6 - body) / body < 0.03, name
    g270, g4 = load_preset("gemma3-270m"), load_preset("gemma3-4b")
    # Every 6th layer global (270M: 3 of 18), window 512; the 4B's global RoPE is linear x8.
    assert g270.sliding_layers.count(False) == 3 and not g270.sliding_layers[5]
    assert (g270.sliding_window, g270.rope_theta, g270.rope_local_theta) == (512, 1e6, 1e4)
    assert g4.rope_type == "linear" and g4.rope_scaling == (("factor", 8.0),)
    assert g4.sliding_window == 1024 and g4.vocab_size == 262208
    q06 = load_preset("qwen3-0.6b")
    assert (q06.head_dim, q06.num_heads * q06.head_dim, q06.hidden_size) == (128, 2048, 1024)


def test_presets_match_public_models():
    assert preset_names() == tuple(sorted(PUBLIC_PARAMS | CARD_PARAMS))
    for name, n in PUBLIC_PARAMS.items():
        cfg = load_preset(name, dtype="bfloat16")
        assert cfg.num_params() == n, name
        assert cfg.dtype == "bfloat16" and cfg.param_dtype == "float32"
        assert cfg == from_hf_dict(preset_hf_dict(name), dtype="bfloat16")
    q7, l3 = load_preset("qwen2.5-7b"), load_preset("llama-3.2-3b")
    assert (q7.num_kv_heads, q7.head_dim, q7.qkv_bias, q7.tie_word_embeddings) == (4, 128, True,
                                                                                   False)
    assert l3.rope_type == "llama3" and dict(l3.rope_scaling)["factor"] == 32.0
    assert (l3.rms_norm_eps, l3.max_position_embeddings, l3.qkv_bias) == (1e-5, 131072, False)


def test_unknown_preset_lists_the_names():
    with pytest.raises(PresetError,
                       match=r"unknown preset 'qwen-0.5b'; known: gemma3-1b, gemma3-270m, "):
        load_preset("qwen-0.5b")
    assert load_preset(" Qwen2.5-0.5B ").hidden_size == 896  # case and spaces forgiven


def _tiny(**kw):
    return from_hf_dict(dict(model_type="qwen2", vocab_size=96, hidden_size=32,
                             intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, tie_word_embeddings=True), **kw)


def test_bf16_params_and_optimizer_state():
    cfg = _tiny(dtype="bfloat16", param_dtype="bfloat16")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    opt = optax.adamw(1e-3)
    mu = opt.init(params)[0].mu
    assert {x.dtype for x in jax.tree.leaves(mu)} == {jnp.dtype(jnp.bfloat16)}
    logits = model(jnp.ones((2, 5), jnp.int32))
    assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits).all())
    with pytest.raises(ValueError, match="param_dtype"):
        _tiny(param_dtype="float16")


def test_optimizer_state_follows_param_sharding():
    """Without explicit out_shardings XLA leaves Adam's zeros on one device; with
    opt_state_shardings mu/nu take each param's sharding and the count is replicated."""
    mesh = make_mesh(1, 2, 2)
    model = Transformer(_tiny(), rngs=nnx.Rngs(0))
    _, params = nnx.split(model)
    p_shard = state_shardings(params, mesh)
    params = jax.device_put(params, p_shard)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    plain = jax.jit(opt.init)(params)
    assert not all(x.sharding.is_equivalent_to(s, x.ndim) for x, s in zip(
        jax.tree.leaves(plain[1][0].mu), jax.tree.leaves(p_shard)))
    o_shard = opt_state_shardings(opt, jax.eval_shape(opt.init, params), p_shard, mesh)
    state = jax.jit(opt.init, out_shardings=o_shard)(params)
    mu = state[1][0].mu
    assert mu["layers"]["gate_proj"].sharding.spec == P(None, "fsdp", "tensor")
    for x, s in zip(jax.tree.leaves(mu), jax.tree.leaves(p_shard)):
        assert x.sharding.spec == s.spec
    assert state[1][0].count.sharding.spec == P()


@pytest.fixture(scope="module")
def tiny_run_cfg():
    return load_config(None, [
        "data.prompts_per_step=4", "sagc.group_sizes=[2,4]", "sagc.initial_group_size=2",
        "sampling.max_new_tokens=8", "sampling.prompt_buckets=[8]", "sampling.decode_chunk=4",
        "algo.micro_batch_rows=8", "model.remat=true"])


def test_compiled_memory_of_the_real_programs(tiny_run_cfg):
    from sagc_jax.compiled_memory import compiled_memory
    from sagc_jax.shapes import ShapePlan

    mcfg = dataclasses.replace(_tiny(), remat=True)
    out = {}
    for fsdp in (1, 2):
        mesh = make_mesh(-1, fsdp, 1, devices=jax.devices()[:fsdp])
        plan = ShapePlan.from_config(tiny_run_cfg, batch_ways=fsdp)
        out[fsdp] = compiled_memory(tiny_run_cfg, mcfg, mesh, plan=plan)
    one, two = out[1], out[2]
    names = [p["name"] for p in one["programs"]]
    assert names == ["train_step", "prefill", "decode"]
    n = mcfg.num_params()
    # mu and nu in f32, plus int32 step counts (Adam's and the schedule's).
    assert one["params"] == 4 * n and 2 * 4 * n < one["opt_state"] <= 2 * 4 * n + 16
    train, prefill, decode = one["programs"]
    # The grad program at the largest chunk (micro_batch_rows=8) of 16 slots a row.
    assert train["shape"] == "rows=16 chunk=8x16" and "rows=16" in prefill["shape"]
    # Its arguments are the params, the gradient accumulator (as large; donated) and the batch;
    # the AdamW state stays on the device beside it.
    assert 2 * one["params"] < train["argument"] < 1.1 * 2 * one["params"] + 16 * 1024
    assert train["alias"] >= one["params"] - 4
    assert one["train_peak"] == train["total"] + one["opt_state"]
    # Prefix sharing: prefill returns each prompt's K/V once (layers x 4 prompts x kv x 8 prompt
    # slots x dim x k,v x f32) and the last logits; decode takes them beside the params and
    # holds the 16 rows' generated K/V (8 new tokens each) in its temporaries.
    prefix = 2 * 4 * 2 * 8 * 8 * 2 * 4
    assert prefix + 4 * 96 * 4 <= prefill["output"] < 2 * prefix
    assert decode["argument"] >= prefix + one["params"]
    assert decode["temp"] >= 2 * 16 * 2 * 8 * 8 * 2 * 4
    assert one["sampler_peak"] == max(prefill["total"], decode["total"]) + one["opt_state"]
    assert one["peak"] == max(one["train_peak"], one["sampler_peak"])
    # fsdp=2 halves the sharded params and their AdamW moments (norms and biases stay whole).
    assert 0.5 * one["params"] < two["params"] < 0.6 * one["params"]
    assert two["opt_state"] < 0.6 * one["opt_state"]


def test_micro_batches_stay_sharded_over_the_batch_axes():
    """4-way data parallel, 32 sequences: `micro_batch_rows=8` makes the largest chunk 8 rows,
    2 per device, so the grad step's temporaries (dominated by the f32 logits of the scored
    slots) shrink against chunks of 32 rows; the per-sequence [S, N] arrays are a fixed part."""
    from sagc_jax.compiled_memory import abstract_train_state, train_step_memory
    from sagc_jax.optim import make_optimizer
    from sagc_jax.rl.train_step import LossSettings
    from sagc_jax.shapes import ShapePlan

    mcfg = dataclasses.replace(_tiny(), vocab_size=8192, remat=True)
    mesh = make_mesh(4, 1, 1)
    temp = {}
    for mb in (32, 8):
        cfg = load_config(None, [f"algo.micro_batch_rows={mb}", "data.prompts_per_step=8",
                                 "sagc.group_sizes=[4]", "sagc.initial_group_size=4",
                                 "sampling.prompt_buckets=[16]", "sampling.max_new_tokens=16"])
        layout = ShapePlan.from_config(cfg, batch_ways=4).train_layout
        assert (layout.seqs, layout.num_groups, max(layout.chunk_sizes)) == (32, 8, mb)
        opt = make_optimizer(cfg.optim, cfg.run.steps)
        state = abstract_train_state(mcfg, mesh, opt)
        temp[mb] = train_step_memory(state, mesh, opt, LossSettings.from_config(cfg),
                                     layout).temp
    assert temp[8] < 0.5 * temp[32], temp


def test_fake_pod_subprocess():
    from sagc_jax.fakepod import MARK, fake_device_env, in_fake_pod, mesh_devices

    env = fake_device_env(3, {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=4"})
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=3"
    assert env["JAX_PLATFORMS"] == "cpu" and in_fake_pod(3, env) and not in_fake_pod(2, env)
    assert not in_fake_pod(None, {})
    code = f"import jax, os; print(jax.device_count(), os.environ['{MARK}'])"
    r = subprocess.run([sys.executable, "-c", code], env=fake_device_env(3), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["3", "3"], r.stderr[-1000:]
    tpu = load_config(ROOT / "configs" / "qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml")
    assert mesh_devices(tpu.mesh) == 16 and mesh_devices(load_config(None).mesh) is None
    with pytest.raises(ValueError, match="--devices"):
        fake_device_env(0)
