"""Model import/export vs transformers' PyTorch implementation (the reference).

Parity is max |logits - ref| <= 1e-4 in float32 on O(1) logits from randomised tiny models
(see hf_fixtures). Each config's forward is jitted once and reused across tests.
"""

from __future__ import annotations

import functools
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_fixtures import TINY_SPECS, forward, hf_logits, load_hf, loaded_cache, tiny_hf_dir  # noqa: F401
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file

from sagc_jax.models import KVCache, Transformer, from_pretrained, init_cache, save_pretrained
from sagc_jax.parallel import make_mesh

ATOL = 1e-4
BF16_ATOL = 0.06  # bf16 compute through 2 layers on logits of std ~0.75 (observed ~0.02)
B, T = 2, 12


@functools.partial(jax.jit, static_argnums=0)
def _cached_step(graphdef, state, ids, positions, kv_mask, cache, cache_index):
    return nnx.merge(graphdef, state)(ids, positions=positions, kv_mask=kv_mask, cache=cache,
                                      cache_index=cache_index)


@pytest.fixture(scope="session")
def loaded(tiny_hf_dir):  # noqa: F811
    return loaded_cache(tiny_hf_dir, TINY_SPECS, B, T)


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


# ---------------------------------------------------------------------------------------------
# Import parity
# ---------------------------------------------------------------------------------------------

EXPECTED_CFG = {
    "llama": dict(num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=True, o_bias=True,
                  mlp_bias=True, tie_word_embeddings=False, rope_type="default"),
    "llama_gqa1": dict(num_kv_heads=1, head_dim=16, hidden_size=48, tie_word_embeddings=True,
                       rope_type="llama3", qkv_bias=False),
    "llama_linear_v4": dict(num_kv_heads=2, rope_type="linear", rope_theta=5000.0,
                            rope_scaling=(("factor", 2.0),)),
    "qwen2": dict(model_type="qwen2", qkv_bias=True, o_bias=False, tie_word_embeddings=True),
    "qwen2_sharded": dict(num_kv_heads=1, head_dim=16, hidden_size=32,
                          tie_word_embeddings=False),
    "llama_bf16": dict(num_heads=2, num_kv_heads=1),
}


@pytest.mark.parametrize("kind", sorted(TINY_SPECS))
def test_logits_parity(loaded, kind):
    m = loaded(kind)
    for k, v in EXPECTED_CFG[kind].items():
        assert getattr(m.cfg, k) == v, k
    assert m.cfg.vocab_size == TINY_SPECS[kind]["vocab_size"]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(m.model)))
    assert _max_diff(forward(m.model, m.ids), m.ref) <= ATOL


def test_left_padding_matches_unpadded(loaded):
    """Row 0 left-padded by P garbage tokens (masked): its logits equal the unpadded prefix's."""
    m, pad = loaded("qwen2"), 5
    ids = m.ids.copy()
    ids[0, pad:] = m.ids[0, :T - pad]
    ids[0, :pad] = np.arange(pad) + 7  # garbage that must not leak through the mask
    kv_mask = np.ones((B, T), bool)
    kv_mask[0, :pad] = False
    positions = np.maximum(np.cumsum(kv_mask, axis=1) - 1, 0)
    out = forward(m.model, ids, positions, kv_mask)
    assert np.all(np.isfinite(out))
    assert _max_diff(out[0, pad:], m.ref[0, :T - pad]) <= ATOL
    assert _max_diff(out[1], m.ref[1]) <= ATOL


@pytest.mark.parametrize("kind", ["llama_gqa1", "qwen2"])
def test_kv_cache_decode_matches_full_forward(loaded, kind):
    """Prefill a left-padded prompt into a cache larger than needed, decode token by token."""
    m, pad, prompt, slots = loaded(kind), 3, 7, T + 4
    graphdef, state = nnx.split(m.model)
    ids = np.zeros((B, slots), np.int32)
    ids[0, pad:T] = m.ids[0, :T - pad]
    ids[1, :T] = m.ids[1]
    kv_mask = np.ones((B, slots), bool)
    kv_mask[0, :pad] = False
    positions = np.maximum(np.cumsum(kv_mask, axis=1) - 1, 0)
    cache = init_cache(m.cfg, B, slots)
    logits, cache = _cached_step(graphdef, state, ids[:, :prompt], positions[:, :prompt],
                                 kv_mask, cache, 0)
    outs = [np.asarray(logits)]
    for t in range(prompt, T):
        logits, cache = _cached_step(graphdef, state, ids[:, t:t + 1], positions[:, t:t + 1],
                                     kv_mask, cache, t)
        outs.append(np.asarray(logits))
    assert isinstance(cache, KVCache)
    out = np.concatenate(outs, axis=1)
    assert _max_diff(out[0, pad:], m.ref[0, :T - pad]) <= ATOL
    assert _max_diff(out[1], m.ref[1]) <= ATOL


def test_bfloat16_compute_is_close(loaded):
    m = loaded("llama")
    model, cfg = from_pretrained(m.path, dtype="bfloat16")
    assert cfg.dtype == "bfloat16"
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(model)))  # params f32
    out = forward(model, m.ids)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    assert _max_diff(out, m.ref) <= BF16_ATOL


# ---------------------------------------------------------------------------------------------
# Mesh placement
# ---------------------------------------------------------------------------------------------


def test_load_on_mesh_is_sharded_and_matches(loaded, tmp_path):
    m = loaded("qwen2")
    mesh = make_mesh(data=1, fsdp=2, tensor=2)
    model, _ = from_pretrained(m.path, mesh=mesh)
    q = model.layers.q_proj[...]
    assert q.sharding.spec == P(None, "fsdp", "tensor")
    assert {s.data.shape for s in q.addressable_shards} == {(2, 32, 32)}
    assert len(q.sharding.device_set) == 4
    embed = model.embed[...]  # vocab 151 is odd -> replicated over tensor, still fsdp-sharded
    assert embed.sharding.spec == P(None, "fsdp")
    assert model.layers.k_bias[...].sharding.spec == P(None, "tensor")
    assert _max_diff(forward(model, m.ids), m.ref) <= ATOL
    # Export gathers the shards back into exactly the original tensors.
    save_pretrained(model, tmp_path)
    orig, saved = load_file(m.path / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert sorted(orig) == sorted(saved)
    for name, t in orig.items():
        np.testing.assert_array_equal(saved[name], t, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------


def _randomised(cfg, seed: int) -> Transformer:
    """A fresh model of ours with every param random (norms != 1, biases != 0)."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)

    def fill(path, x):
        name = str(path[-1].key)
        if name.endswith("norm"):
            return jnp.asarray(rng.uniform(0.5, 1.5, x.shape), jnp.float32)
        return jnp.asarray(rng.normal(0.0, 0.5 if "bias" in name else 0.1, x.shape), jnp.float32)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(fill, pure))
    nnx.update(model, state)
    return model


@pytest.mark.parametrize("kind", ["llama", "llama_gqa1", "qwen2", "qwen2_sharded"])
def test_export_round_trip(loaded, tmp_path, kind):
    """ours -> save_pretrained -> transformers gives our logits; -> from_pretrained is exact."""
    from transformers import AutoTokenizer

    m = loaded(kind)
    model = _randomised(m.cfg, seed=11)
    ours = forward(model, m.ids)
    tokenizer = None
    if kind == "qwen2":
        tokenizer = AutoTokenizer.from_pretrained(
            pathlib.Path(__file__).parent.parent / "sagc_jax" / "assets" / "tokenizer")
    save_pretrained(model, tmp_path, tokenizer=tokenizer)

    names = set(load_file(tmp_path / "model.safetensors"))
    assert ("lm_head.weight" in names) == (not m.cfg.tie_word_embeddings)
    hf = load_hf(tmp_path)
    assert _max_diff(hf_logits(hf, m.ids), ours) <= ATOL
    if tokenizer is not None:
        assert (tmp_path / "tokenizer.json").exists()

    back, cfg = from_pretrained(tmp_path)
    assert cfg == m.cfg
    for (pa, a), (pb, b) in zip(jax.tree.leaves_with_path(nnx.to_pure_dict(nnx.state(model))),
                                jax.tree.leaves_with_path(nnx.to_pure_dict(nnx.state(back)))):
        assert pa == pb
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(pa))


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: pathlib.Path, **changes) -> None:
    d = json.loads((path / "config.json").read_text())
    d.update(changes)
    (path / "config.json").write_text(json.dumps(d))


@pytest.mark.parametrize("changes, match", [
    ({"model_type": "gpt2"}, "model_type.*gpt2"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
     "rope_type.*yarn"),
    ({"hidden_act": "gelu"}, "hidden_act.*gelu"),
])
def test_unsupported_config_is_refused(tiny_hf_dir, tmp_path, changes, match):  # noqa: F811
    path = _copy(tiny_hf_dir("qwen2"), tmp_path / "ckpt")
    _edit_config(path, **changes)
    with pytest.raises(ValueError, match=match):
        from_pretrained(path)


def _rewrite_weights(path: pathlib.Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(tiny_hf_dir, tmp_path):  # noqa: F811
    path = _copy(tiny_hf_dir("qwen2"), tmp_path / "ckpt")
    _rewrite_weights(path, lambda t: t.pop("model.layers.1.self_attn.v_proj.bias"))
    with pytest.raises(ValueError,
                       match=r"'model\.layers\.1\.self_attn\.v_proj\.bias'.*model\.safetensors"):
        from_pretrained(path)


def test_missing_tensor_in_sharded_index(tiny_hf_dir, tmp_path):  # noqa: F811
    path = _copy(tiny_hf_dir("qwen2_sharded"), tmp_path / "ckpt")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"'model\.norm\.weight'.*index\.json"):
        from_pretrained(path)


def test_shape_mismatch(tiny_hf_dir, tmp_path):  # noqa: F811
    path = _copy(tiny_hf_dir("qwen2"), tmp_path / "ckpt")
    name = "model.layers.0.self_attn.k_proj.weight"  # [2 kv heads * 16, 64]

    def edit(t):
        t[name] = t[name][:16]

    _rewrite_weights(path, edit)
    with pytest.raises(ValueError, match=rf"'{name}'.*\[16, 64\].*expected \[32, 64\]"):
        from_pretrained(path)


def test_unexpected_tensor_and_harmless_extras(tiny_hf_dir, tmp_path):  # noqa: F811
    path = _copy(tiny_hf_dir("qwen2"), tmp_path / "ckpt")
    extra = "model.layers.2.mlp.up_proj.weight"  # a third layer in a 2-layer config

    def add_harmless(t):
        t["model.rotary_emb.inv_freq"] = np.ones(8, np.float32)
        t["lm_head.weight"] = t["model.embed_tokens.weight"]  # tied and identical: fine

    _rewrite_weights(path, add_harmless)
    from_pretrained(path)

    _rewrite_weights(path, lambda t: t.update({extra: np.zeros((96, 64), np.float32)}))
    with pytest.raises(ValueError, match=rf"unexpected tensors.*'{extra}'"):
        from_pretrained(path)

    def differing_head(t):
        t.pop(extra)
        t["lm_head.weight"] = t["lm_head.weight"] + 1.0

    _rewrite_weights(path, differing_head)
    with pytest.raises(ValueError, match=r"'lm_head\.weight'.*tie_word_embeddings"):
        from_pretrained(path)


def test_missing_weights_file(tiny_hf_dir, tmp_path):  # noqa: F811
    path = tmp_path / "ckpt"
    path.mkdir()
    shutil.copy(tiny_hf_dir("qwen2") / "config.json", path / "config.json")
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        from_pretrained(path)
