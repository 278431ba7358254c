"""Qwen3 and Gemma 3 text vs transformers (the reference): logits, the KV-cache and packed paths,
our sampler's greedy tokens vs `generate`, and the export round trip.

Tiny random checkpoints (`hf_fixtures.FAMILY_SPECS`): a Qwen3 GQA and a Qwen3 with one kv head and
attention bias; a Gemma 3 with GQA, window 5, local/global RoPE bases, query_pre_attn_scalar and a
final softcap, and a Gemma 3 in the 4.x config layout. Prompts are longer than the sliding
windows, so local layers see a cut past. Tolerance as tests/test_models.py (1e-4 in float32).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hf_fixtures import FAMILY_SPECS, forward, hf_logits, load_hf, loaded_cache, tiny_hf_dir  # noqa: F401
from safetensors.numpy import load_file

from sagc_jax.models import Transformer, from_pretrained, init_cache, save_pretrained
from sagc_jax.models.config import ModelConfig
from sagc_jax.sampling import Sampler, SamplingConfig

ATOL = 1e-4
ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "sagc_jax" / "assets" / "tokenizer"  # the built-in one, 105 tokens
B, T = 2, 12  # T > both Gemma windows (5 and 4)
N_NEW = 40
# Lengths 3 (inside every window), 9 and 17 (past them); one bucket each side of 8.
PROMPT_LENS = (3, 9, 17)

EXPECTED_CFG = {
    "qwen3": dict(model_type="qwen3", num_kv_heads=2, head_dim=24, qkv_bias=False,
                  tie_word_embeddings=True, rope_theta=20000.0, layer_types=()),
    "qwen3_bias": dict(num_kv_heads=1, head_dim=16, qkv_bias=True, o_bias=True,
                       tie_word_embeddings=False),
    "gemma3": dict(model_type="gemma3_text", hidden_act="gelu_pytorch_tanh", sliding_window=5,
                   layer_types=("sliding_attention", "full_attention", "sliding_attention"),
                   rope_theta=10000.0, rope_type="linear", rope_scaling=(("factor", 2.0),),
                   rope_local_theta=100.0, query_pre_attn_scalar=20.0,
                   final_logit_softcapping=3.0, tie_word_embeddings=True),
    "gemma3_v4": dict(num_kv_heads=1, sliding_window=4, rope_theta=50000.0,
                      rope_local_theta=1000.0, layer_types=("sliding_attention", "full_attention",
                                                            "sliding_attention", "full_attention"),
                      tie_word_embeddings=False, final_logit_softcapping=None),
}


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


@pytest.fixture(scope="module")
def loaded(tiny_hf_dir):  # noqa: F811
    return loaded_cache(tiny_hf_dir, FAMILY_SPECS, B, T)


@pytest.mark.parametrize("kind", sorted(FAMILY_SPECS))
def test_logits_parity(loaded, kind):
    m = loaded(kind)
    for k, v in EXPECTED_CFG[kind].items():
        assert getattr(m.cfg, k) == v, k
    assert _max_diff(forward(m.model, m.ids), m.ref) <= ATOL
    if m.cfg.layer_types:
        # The window matters at this length: without it the logits are far from transformers'.
        wide = dataclasses.replace(m.cfg, sliding_window=10 * T)
        graphdef, state = nnx.split(m.model)
        model = nnx.merge(graphdef, state)
        model.cfg = wide
        assert _max_diff(forward(model, m.ids), m.ref) > 100 * ATOL


@pytest.mark.parametrize("kind", ["gemma3", "qwen3_bias"])
def test_left_padding_and_kv_cache_decode(loaded, kind):
    """Row 0 left-padded (masked garbage), prefilled into a cache, then decoded token by token
    through the cache path: the window is by slot there and must match the unpadded reference."""
    m, pad, prompt, slots = loaded(kind), 3, 7, T + 4
    graphdef, state = nnx.split(m.model)
    ids = np.zeros((B, slots), np.int32)
    ids[0, pad:T] = m.ids[0, :T - pad]
    ids[0, :pad] = np.arange(pad) + 7
    ids[1, :T] = m.ids[1]
    kv_mask = np.ones((B, slots), bool)
    kv_mask[0, :pad] = False
    positions = np.maximum(np.cumsum(kv_mask, axis=1) - 1, 0)

    @jax.jit
    def step(state, ids, positions, cache, index):
        return nnx.merge(graphdef, state)(ids, positions=positions, kv_mask=jnp.asarray(kv_mask),
                                          cache=cache, cache_index=index)

    logits, cache = step(state, ids[:, :prompt], positions[:, :prompt],
                         init_cache(m.cfg, B, slots), 0)
    outs = [np.asarray(logits)]
    for t in range(prompt, T):
        logits, cache = step(state, ids[:, t:t + 1], positions[:, t:t + 1], cache, t)
        outs.append(np.asarray(logits))
    out = np.concatenate(outs, axis=1)
    assert _max_diff(out[0, pad:], m.ref[0, :T - pad]) <= ATOL
    assert _max_diff(out[1], m.ref[1]) <= ATOL


def test_packed_rows_mask_the_window(loaded):
    """The packed train forward: two sequences in one row (positions restart) and a prompt with
    two sibling completions (`branch_ids`), on Gemma 3 with window 5. Each sequence's logits
    equal transformers' on that sequence alone; the completions' windows are counted in
    positions (a second branch sits further from the prompt in slots than in positions)."""
    m = loaded("gemma3")
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, m.cfg.vocab_size, 9), rng.integers(0, m.cfg.vocab_size, 7)
    prompt = rng.integers(0, m.cfg.vocab_size, 6)
    c1, c2 = rng.integers(0, m.cfg.vocab_size, 5), rng.integers(0, m.cfg.vocab_size, 6)
    row0 = np.concatenate([a, b])
    pos0 = np.concatenate([np.arange(9), np.arange(7)])
    seg0 = np.concatenate([np.full(9, 1), np.full(7, 2)])
    row1 = np.concatenate([prompt, c1, c2])
    pos1 = np.concatenate([np.arange(6), 6 + np.arange(5), 6 + np.arange(6)])
    br1 = np.concatenate([np.zeros(6), np.full(5, 1), np.full(6, 2)])
    width = 17
    pad = lambda x, w=width: np.pad(x, (0, w - len(x)))  # noqa: E731
    ids = np.stack([pad(row0), row1]).astype(np.int32)
    positions = np.stack([pad(pos0), pos1]).astype(np.int32)
    segments = np.stack([pad(seg0), np.ones(width)]).astype(np.int32)
    branches = np.stack([np.zeros(width), br1]).astype(np.int32)
    out = np.asarray(m.model(jnp.asarray(ids), positions=jnp.asarray(positions),
                             segment_ids=jnp.asarray(segments), branch_ids=jnp.asarray(branches)))
    ref = lambda seq: hf_logits(m.hf, np.asarray(seq)[None])[0]  # noqa: E731
    assert _max_diff(out[0, :9], ref(a)) <= ATOL
    assert _max_diff(out[0, 9:16], ref(b)) <= ATOL
    assert _max_diff(out[1, :11], ref(np.concatenate([prompt, c1]))) <= ATOL
    assert _max_diff(out[1, 11:], ref(np.concatenate([prompt, c2]))[6:]) <= ATOL


# ---- our sampler vs transformers' generate ----------------------------------------------------

def _prompts(cfg: ModelConfig, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, cfg.vocab_size, n).tolist() for n in PROMPT_LENS]


def _hf_greedy(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy `generate`, n tokens, no EOS stop (our sampler runs without EOS
    ids; `min_new_tokens` would instead mask the EOS logit and change the argmax)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():  # an EOS id no token has: generate never stops early
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=n, pad_token_id=0, eos_token_id=10 ** 6)
    assert out.shape[1] == len(prompt) + n
    return out[0, len(prompt):].tolist()


def _our_greedy(model: Transformer, prompts: list[list[int]], g: int) -> np.ndarray:
    cfg = SamplingConfig(group_sizes=(g,), prompts_per_step=len(prompts),
                         prompt_buckets=(8, 24), max_new_tokens=N_NEW, decode_chunk=8)
    out = Sampler(model, cfg, pad_id=0).generate(prompts, group_size=g, key=jax.random.key(0),
                                                  greedy=True)
    assert (np.asarray(out.lengths) == N_NEW).all()
    return np.asarray(out.tokens)


@pytest.mark.parametrize("kind", ["qwen3", "gemma3", "gemma3_v4"])
def test_sampler_greedy_matches_generate(loaded, kind):
    """40 greedy tokens from our sampler (prefix sharing, 2 rows a prompt) equal transformers'
    `generate` for prompts shorter and longer than the window (all rows of a group too)."""
    m = loaded(kind)
    prompts = _prompts(m.cfg, 1)
    tokens = _our_greedy(m.model, prompts, g=2)
    refs = [_hf_greedy(m.hf, p, N_NEW) for p in prompts]
    # Tiny random models fall into loops; still the three references must differ.
    assert len({tuple(r) for r in refs}) == len(prompts)
    for i, ref in enumerate(refs):
        for r in (2 * i, 2 * i + 1):
            assert tokens[r].tolist() == ref, (i, r, tokens[r].tolist(), ref)


# ---- export -------------------------------------------------------------------------------------

def _randomised(cfg: ModelConfig, seed: int) -> Transformer:
    """A fresh model of ours with every param random (norm scales away from identity)."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    state = nnx.state(model, nnx.Param)

    def fill(path, x):
        name = str(path[-1].key)
        if name.endswith("norm"):
            return jnp.asarray(rng.uniform(0.5, 1.5, x.shape), jnp.float32)
        return jnp.asarray(rng.normal(0.0, 0.5 if "bias" in name else 0.1, x.shape), jnp.float32)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(fill,
                                                                     nnx.to_pure_dict(state)))
    nnx.update(model, state)
    return model


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_bias", "gemma3", "gemma3_v4"])
def test_export_round_trip(loaded, tmp_path, kind):
    """ours -> save_pretrained -> transformers: same logits and the same greedy tokens as our
    sampler; -> from_pretrained: the same config and bit-identical params."""
    m = loaded(kind)
    model = _randomised(m.cfg, seed=11)
    save_pretrained(model, tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["architectures"] == [m.cfg.family.hf_architecture]
    names = set(load_file(tmp_path / "model.safetensors"))
    assert ("lm_head.weight" in names) == (not m.cfg.tie_word_embeddings)
    hf = load_hf(tmp_path)
    assert type(hf).__name__ == m.cfg.family.hf_architecture
    assert _max_diff(hf_logits(hf, m.ids), forward(model, m.ids)) <= ATOL
    if kind in ("qwen3", "gemma3"):
        prompts = _prompts(m.cfg, 2)
        tokens = _our_greedy(model, prompts, g=1)
        for i, p in enumerate(prompts):
            assert tokens[i].tolist() == _hf_greedy(hf, p, N_NEW), i

    back, cfg = from_pretrained(tmp_path)
    assert cfg == m.cfg
    for (pa, a), (pb, b) in zip(jax.tree.leaves_with_path(nnx.to_pure_dict(nnx.state(model))),
                                jax.tree.leaves_with_path(nnx.to_pure_dict(nnx.state(back)))):
        assert pa == pb
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(pa))


# ---- attention softcap (a config feature transformers' Gemma 3 does not apply) ---------------

def test_attention_softcap_decode_matches_full_forward():
    """With `attn_logit_softcapping` and a window, the sampler's decode (its own attention code)
    agrees with the full forward: each greedy token is the full forward's argmax at its slot."""
    cfg = ModelConfig(model_type="gemma3_text", vocab_size=61, hidden_size=32,
                      intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=16, hidden_act="gelu_pytorch_tanh", sliding_window=3,
                      layer_types=("sliding_attention", "full_attention"), rope_local_theta=100.0,
                      query_pre_attn_scalar=8.0, attn_logit_softcapping=0.5,
                      final_logit_softcapping=2.0, tie_word_embeddings=True)
    model = _randomised(cfg, seed=3)
    prompts = [[5, 9, 2, 44, 17, 3, 8], [30, 1]]
    tokens = _our_greedy(model, prompts, g=1)[:, :12]
    for p, gen in zip(prompts, tokens):
        seq = np.asarray(p + gen.tolist())
        full = forward(model, seq[None])[0]
        assert full[len(p) - 1:-1].argmax(-1).tolist() == gen.tolist()
    graphdef, state = nnx.split(model)
    uncapped = nnx.merge(graphdef, state)
    uncapped.cfg = dataclasses.replace(cfg, attn_logit_softcapping=None)
    seq = np.asarray([prompts[0]])
    assert _max_diff(forward(uncapped, seq), forward(model, seq)) > 100 * ATOL  # the cap bites


def test_unsupported_model_type_names_it(tiny_hf_dir, tmp_path):  # noqa: F811
    import shutil

    path = tmp_path / "ckpt"
    shutil.copytree(tiny_hf_dir("gemma3"), path)
    d = json.loads((path / "config.json").read_text())
    d["model_type"] = "gemma2"
    (path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"^config field 'model_type': unsupported 'gemma2'"):
        from_pretrained(path)


# ---- through the CLI: train (full and LoRA), export, transformers ----------------------------

@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gemma3_trains_and_exports_through_the_cli(tmp_path, lora):
    """`model.path` = a tiny Gemma 3 (window 5 < the prompts) with the built-in tokenizer: an SFT
    warm start and two GRPO steps run (full fine-tuning, or rank-4 LoRA), and `sagc-jax export`
    of the final checkpoint
    gives a directory whose transformers logits equal our model's loaded from that checkpoint
    (LoRA merged), and that differ from the starting weights (training changed them)."""
    from hf_fixtures import build_hf_dir

    from sagc_jax.cli import main
    from sagc_jax.open_run import load_policy

    spec = {**FAMILY_SPECS["gemma3"], "vocab_size": 112}  # >= the built-in tokenizer's 105
    base = build_hf_dir(spec, tmp_path / "base")
    run_dir = tmp_path / "run"
    # A 2-step SFT warm start on the answer format moves the weights for sure (a random model's
    # GRPO group often has equal rewards, so zero advantages and no update).
    extra = ["model.lora.rank=4", "model.lora.alpha=8.0"] if lora else []
    code = main(["train", "--config", str(ROOT / "configs" / "tiny_cpu.yaml"),
                 f"model.path={base}", f"model.tokenizer={TOKENIZER}", f"run.dir={run_dir}",
                 "run.steps=2", "run.eval_every=0",
                 "init.sft_steps=2", "data.task=arith_short", "data.prompts_per_step=2",
                 "sagc.group_sizes=[2]", "sagc.initial_group_size=2", "sampling.max_new_tokens=8",
                 "sampling.prompt_buckets=[32]", "sampling.decode_chunk=8", "checkpoint.every=1",
                 "run.progress=false", "run.plots=false", *extra])
    assert code == 0
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(run_dir), "--out", str(out)]) == 0  # latest step
    ours, _, _ = load_policy(run_dir)
    assert ours.cfg.sliding_window == 5 and bool(ours.cfg.lora_rank) == lora
    ids = np.random.default_rng(0).integers(0, 105, (2, 14))
    exported = hf_logits(load_hf(out), ids)
    assert _max_diff(exported, forward(ours, ids)) <= ATOL
    assert _max_diff(exported, hf_logits(load_hf(base), ids)) > 100 * ATOL


def test_sliding_layers_kv_memory_is_bounded_by_the_window(loaded):
    """The sampler's own prefill program (abstract evaluation) and decode buffers: a sliding
    layer holds W - 1 prompt slots per prompt and a ring of W generated slots per row, however
    long the prompt bucket (24) and the completion (40); a global layer holds all of them. The
    greedy test above runs this layout past the window (prompt 17, 40 tokens > W = 5)."""
    from sagc_jax.models.decode import init_gen, kv_layer_slots

    m = loaded("gemma3")
    cfg, w, P, G, lp = m.cfg, m.cfg.sliding_window, 3, 2, 24
    sampler = Sampler(m.model, SamplingConfig(group_sizes=(G,), prompts_per_step=P,
                                              prompt_buckets=(lp,), max_new_tokens=N_NEW),
                      pad_id=0)
    ids, lens = jax.ShapeDtypeStruct((P, lp), jnp.int32), jax.ShapeDtypeStruct((P,), jnp.int32)
    prefix, _ = jax.eval_shape(lambda p, i, n: sampler._prefill_impl(p, i, n, g=G),
                               sampler._abstract_params, ids, lens)
    gen = init_gen(cfg, P * G, N_NEW)
    slot = cfg.num_kv_heads * cfg.head_dim * 4 * 2  # K and V, float32
    for i, local in enumerate(cfg.sliding_layers):
        held = sum(x.size * x.dtype.itemsize for x in (prefix.k[i], prefix.v[i]))
        ring = sum(x.size * x.dtype.itemsize for x in (gen.k[i], gen.v[i]))
        if local:
            assert held == P * (w - 1) * slot and ring == P * G * w * slot, i
        else:
            assert held == P * lp * slot and ring == P * G * N_NEW * slot, i
    assert kv_layer_slots(cfg, lp, lp + N_NEW) == 2 * (w - 1 + w) + (lp + N_NEW)


def test_fused_attention_takes_the_family_scale():
    """The packed path's fused kernel (`jax.nn.dot_product_attention`, run here as 'xla') with
    Gemma's query_pre_attn_scalar scale equals the einsum attention with the same scale."""
    from sagc_jax.models.llama import _attention, fused_attention

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(2, 6, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, 2, 6, 8)), jnp.float32) for _ in range(2))
    mask = jnp.tril(jnp.ones((6, 6), bool))[None].repeat(2, 0)
    scale = 20.0 ** -0.5
    got = fused_attention(q, k, v, mask, "xla", scale=scale)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_attention(q, k, v, mask, scale)),
                               atol=1e-5, rtol=1e-5)
    assert _max_diff(got, _attention(q, k, v, mask)) > 1e-3  # the default 8 ** -0.5 differs


@pytest.mark.parametrize("kind", ["gemma3", "qwen3"])
def test_bfloat16_compute_is_close(loaded, kind):
    """bf16 compute (params stay float32) through Gemma's float32 (1 + w) norms and scaled
    embeddings, and Qwen3's q/k norms: its distance to the float32 reference is of the size of
    transformers' own bf16 distance (these randomised norms scale by up to 2.5 per norm, so
    bf16 rounding alone moves Gemma's logits by ~0.17, past test_models' 0.06 for Llama)."""
    m = loaded(kind)
    model, cfg = from_pretrained(m.path, dtype="bfloat16")
    out = forward(model, m.ids)
    assert cfg.dtype == "bfloat16" and out.dtype == np.float32 and np.all(np.isfinite(out))
    with torch.no_grad():
        hf16 = type(m.hf).from_pretrained(m.path, dtype=torch.bfloat16).eval()
        theirs = hf16(torch.tensor(m.ids)).logits.float().numpy()
    hf_err = _max_diff(theirs, m.ref)
    assert 0 < _max_diff(out, m.ref) <= max(2 * hf_err, 0.06)


def test_multimodal_gemma3_checkpoint_loads_its_text_tower(tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint (model_type gemma3: a SigLIP tower, the
    projector, the text decoder under `language_model.`): we load the text decoder, whose logits
    on text-only ids equal the multimodal model's; and a config.json whose `text_config` lists
    only the fields that differ from Gemma3TextConfig's defaults (as hub files do) loads to the
    same config. Its export is a text-only Gemma3ForCausalLM."""
    import shutil

    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                query_pre_attn_scalar=16, sliding_window_pattern=3, initializer_range=0.1)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    hf = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
        boi_token_index=297, eoi_token_index=298)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
    hf.save_pretrained(tmp_path / "mm")
    model, cfg = from_pretrained(tmp_path / "mm")
    assert cfg.model_type == "gemma3_text" and cfg.sliding_layers == (True, True, False)
    ids = np.random.default_rng(0).integers(0, 290, (2, 11))
    assert _max_diff(forward(model, ids), hf_logits(hf, ids)) <= ATOL

    # The hub's 4.x layout: text_config without its defaults.
    sparse = tmp_path / "sparse"
    shutil.copytree(tmp_path / "mm", sparse)
    d = json.loads((sparse / "config.json").read_text())
    d["text_config"] = {"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64,
                        "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 4,
                        "query_pre_attn_scalar": 16, "sliding_window_pattern": 3}
    (sparse / "config.json").write_text(json.dumps(d))
    assert from_pretrained(sparse)[1] == cfg

    save_pretrained(model, tmp_path / "out")
    text_only = load_hf(tmp_path / "out")
    assert type(text_only).__name__ == "Gemma3ForCausalLM"
    assert _max_diff(hf_logits(text_only, ids), hf_logits(hf, ids)) <= ATOL


def test_gemma3_sampler_has_no_compiles_after_compile_all(loaded):
    """The ring-buffer decode keeps the sampler's shape set closed: after `compile_all`, prompts
    of any length in both buckets (some past the window), any n and G, sampled or greedy, compile
    nothing."""
    from sagc_jax.sampling import compile_count

    m = loaded("gemma3")
    sampler = Sampler(m.model, SamplingConfig(group_sizes=(1, 2), prompts_per_step=3,
                                              prompt_buckets=(8, 24), max_new_tokens=12,
                                              decode_chunk=4, use_top_p=True), pad_id=0)
    assert sampler.compile_all(progress=False) > 0
    keys = {n: jax.random.key(n) for n in (3, 12, 7)}  # key creation compiles on its own
    before = compile_count()
    for g in (1, 2):
        for prompts in ([[1, 2, 3]], [[4] * 8, [5] * 6], [[7] * 9, [8] * 24, [1]]):
            for n, kw in ((3, {"greedy": True}), (12, {"top_p": 0.8}), (7, {})):
                out = sampler.generate(prompts, group_size=g, key=keys[n], max_new_tokens=n, **kw)
                assert out.stats.compiles == 0 and out.tokens.shape == (len(prompts) * g, n)
    assert compile_count() == before


def test_hub_id_resolves_through_the_local_cache_and_offline_fails_in_one_line(
        tiny_hf_dir, tmp_path, monkeypatch):  # noqa: F811
    """Issue 51: `model.path: owner/name` is found in the local Hugging Face cache as
    transformers finds it (the trainer's build and the dry run's config read); an id that is
    not cached fails offline in one line naming the id and how to allow the download."""
    import shutil

    from huggingface_hub import constants

    from sagc_jax.config import load_config
    from sagc_jax.models.build import describe_model
    from sagc_jax.models.pretrained import pretrained_config, resolve_model_path

    src = tiny_hf_dir("gemma3")
    repo = tmp_path / "hub" / "models--tiny-org--gemma3-tiny"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(src, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    assert resolve_model_path("tiny-org/gemma3-tiny") == str(snap)
    assert pretrained_config("tiny-org/gemma3-tiny") == pretrained_config(src)
    model, _ = from_pretrained("tiny-org/gemma3-tiny")
    ref, _ = from_pretrained(src)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(ref)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", ["model.path=tiny-org/gemma3-tiny"])
    assert describe_model(cfg, None).source == f"hf config {snap / 'config.json'}"
    with pytest.raises(FileNotFoundError) as e:
        resolve_model_path("tiny-org/not-cached")
    msg = str(e.value)
    assert "\n" not in msg and "'tiny-org/not-cached'" in msg and "HF_HUB_OFFLINE=0" in msg
    assert resolve_model_path(str(src)) == str(src)  # a local path stays as it is
