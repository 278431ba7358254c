"""Sampler: greedy parity with transformers, zero compiles over the shape set, determinism,
sampling distribution / top-k / top-p support, returned logprobs, errors.

Tiny random HF models (torch) are saved with `save_pretrained` and loaded with our
`from_pretrained`; one Sampler per model is shared by the whole module to keep compiles few.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sagc_jax.models.decode import decode_weights
from sagc_jax.models.hf import from_pretrained
from sagc_jax.parallel import make_mesh
from sagc_jax.sampling import Sampler, SamplingConfig, compile_count
from sagc_jax.sampling.draw import categorical_icdf, token_logprob

VOCAB, PAD, N_NEW = 128, 0, 12
# Different lengths; the first three fit the 8-token bucket, the last needs the 24 one.
PROMPTS = [[5, 17, 99], [3, 44, 12, 90, 7, 61, 2, 70], [11, 9, 120, 33, 51], list(range(30, 50))]


def _hf_model(kind: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # Large init so logits are peaked (argmax is far from ties; sampling tests are not ~uniform).
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, initializer_range=0.15, pad_token_id=PAD)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw)).eval()
    m = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **kw)).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.3)
    return m


def _hf_greedy(hf: torch.nn.Module, prompt: list[int], n: int, eos: list[int]) -> list[int]:
    """Unpadded single-prompt HF greedy generation, including the EOS token if one fires."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=n, eos_token_id=eos or None, pad_token_id=PAD)
    gen = out[0, len(prompt):].tolist()
    for i, t in enumerate(gen):
        if t in eos:
            return gen[:i + 1]
    return gen


def _setup(kind: str, tmp_path_factory, seed: int) -> dict:
    hf = _hf_model(kind, seed)
    d = tmp_path_factory.mktemp(kind)
    hf.save_pretrained(d)
    model, _ = from_pretrained(d)
    # EOS ids chosen from the model's own greedy output, so some rows stop early and some don't.
    free = [_hf_greedy(hf, p, N_NEW, []) for p in PROMPTS]
    eos = sorted({free[0][2], free[2][4]})
    return {"hf": hf, "model": model, "eos": eos}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    s = _setup("llama", tmp_path_factory, 0)
    cfg = SamplingConfig(group_sizes=(1, 4), prompts_per_step=4, prompt_buckets=(8, 24),
                         max_new_tokens=N_NEW, decode_chunk=4, use_top_k=True, use_top_p=True)
    s["sampler"] = Sampler(s["model"], cfg, pad_id=PAD, eos_ids=s["eos"])
    s["warm_compiles"] = s["sampler"].compile_all(progress=False)
    return s


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> dict:
    s = _setup("qwen2", tmp_path_factory, 1)
    cfg = SamplingConfig(group_sizes=(1, 3), prompts_per_step=4, prompt_buckets=(24,),
                         max_new_tokens=N_NEW, decode_chunk=8)
    s["sampler"] = Sampler(s["model"], cfg, pad_id=PAD, eos_ids=s["eos"])
    return s


def _check_greedy(s: dict, g: int) -> None:
    out = s["sampler"].generate(PROMPTS, group_size=g, key=jax.random.key(0), greedy=True)
    assert out.tokens.shape == (len(PROMPTS) * g, N_NEW)
    stopped = 0
    for i, p in enumerate(PROMPTS):
        ref = _hf_greedy(s["hf"], p, N_NEW, s["eos"])
        for r in range(i * g, (i + 1) * g):
            n = int(out.lengths[r])
            assert out.tokens[r, :n].tolist() == ref, (i, r)
            assert (out.tokens[r, n:] == PAD).all() and (out.logprobs[r, n:] == 0).all()
            assert out.truncated[r] == (ref[-1] not in s["eos"])
            stopped += not out.truncated[r]
    assert 0 < stopped < len(PROMPTS) * g  # the EOS choice makes some rows stop early


@pytest.mark.parametrize("g", [1, 4])
def test_greedy_matches_transformers_llama(llama, g):
    _check_greedy(llama, g)


@pytest.mark.parametrize("g", [1, 3])
def test_greedy_matches_transformers_qwen2(qwen, g):
    _check_greedy(qwen, g)


def test_no_compiles_after_compile_all(llama):
    s = llama["sampler"]
    assert llama["warm_compiles"] > 0 and len(s.shapes) == 4
    keys = [jax.random.key(i) for i in range(3)]
    before = compile_count()
    for g in (1, 4):
        for prompts in ([[1, 2, 3]], [[4] * 8, [5, 6]], [[7] * 9, [8] * 24, [1], [2, 3]]):
            for n, kw in ((1, {}), (5, {"greedy": True}), (N_NEW, {"top_k": 3, "top_p": 0.8}),
                          (7, {"temperature": 0.5, "top_p": 0.5})):
                out = s.generate(prompts, group_size=g, key=keys[n % 3], max_new_tokens=n, **kw)
                assert out.stats.compiles == 0 and out.tokens.shape == (len(prompts) * g, n)
                assert out.stats.prompt_bucket == s.prompt_bucket_for(max(map(len, prompts)))
    # params passed explicitly (the learner's path) reuse the same programs too.
    s.generate(PROMPTS, group_size=4, key=keys[0], params=nnx.state(llama["model"]))
    assert compile_count() == before


def test_determinism_and_padding_independence(llama):
    s = llama["sampler"]
    k0, k1 = jax.random.key(7), jax.random.key(8)
    a = s.generate(PROMPTS, group_size=4, key=k0, temperature=1.3)
    b = s.generate(PROMPTS, group_size=4, key=k0, temperature=1.3)
    c = s.generate(PROMPTS, group_size=4, key=k1, temperature=1.3)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert (a.tokens != c.tokens).any()
    # Rows of a group differ (independent draws), and dropping a prompt (one dummy) changes none.
    assert len({tuple(a.tokens[r]) for r in range(4)}) > 1
    three = [PROMPTS[3], PROMPTS[0], PROMPTS[1]]  # same prompt bucket with or without PROMPTS[2]
    d = s.generate([*three, PROMPTS[2]], group_size=4, key=k0, temperature=1.3)
    e = s.generate(three, group_size=4, key=k0, temperature=1.3)
    np.testing.assert_array_equal(d.tokens[:12], e.tokens)
    assert e.stats.rows == 12 and e.tokens.shape[0] == 12


def _full_logits(model, prompt: list[int], gen: np.ndarray) -> np.ndarray:
    """Logits [len(gen), V] predicting each generated token, from one uncached forward.

    Right-padded to a fixed length (causal, so padding after the tokens changes nothing) and
    jitted, so every row reuses one compiled forward.
    """
    ids = np.full((1, 24 + N_NEW), PAD, np.int32)
    ids[0, :len(prompt) + len(gen)] = prompt + gen.tolist()
    logits = np.asarray(_jit_forward(model)(nnx.state(model), jnp.asarray(ids)), np.float64)[0]
    return logits[len(prompt) - 1: len(prompt) - 1 + len(gen)]


_FORWARDS: dict[int, Any] = {}


def _jit_forward(model) -> Any:
    if id(model) not in _FORWARDS:
        graphdef = nnx.graphdef(model)
        _FORWARDS[id(model)] = jax.jit(lambda st, ids: nnx.merge(graphdef, st)(ids))
    return _FORWARDS[id(model)]


def _allowed(scaled: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    """Boolean [V] support of top-k then top-p (value thresholds, a little slack for f32)."""
    s = np.sort(scaled)[::-1].copy()
    if top_k is not None:
        s[top_k:] = -np.inf
    thresh = s[top_k - 1] if top_k is not None else s[-1]
    if top_p is not None:
        p = np.exp(s - s[0])
        p /= p.sum()
        before = np.cumsum(p) - p
        last = int(np.sum(before < top_p + 1e-5)) - 1
        thresh = s[last]
    return scaled >= thresh - 1e-5


def test_first_token_distribution(llama):
    """First-token frequencies match softmax(logits / T) within 5 binomial std per token."""
    s, T, prompt = llama["sampler"], 0.8, PROMPTS[1]
    counts = np.zeros(VOCAB)
    calls = 150  # 16 rows each -> 2400 draws
    for i in range(calls):
        out = s.generate([prompt] * 4, group_size=4, key=jax.random.key(100 + i),
                         max_new_tokens=1, temperature=T)
        np.add.at(counts, out.tokens[:, 0], 1)
    total = counts.sum()
    logits = _full_logits(llama["model"], prompt, np.zeros(1, np.int64))[0] / T
    p = np.exp(logits - logits.max())
    p /= p.sum()
    std = np.sqrt(p * (1 - p) / total)
    assert np.all(np.abs(counts / total - p) <= 5 * std + 1e-3), np.abs(counts / total - p).max()


@pytest.mark.parametrize("top_k,top_p", [(5, None), (None, 0.7), (20, 0.8)])
def test_top_k_top_p_support_and_logprobs(llama, top_k, top_p):
    """Every sampled token lies in the filtered support computed from a full forward pass, and
    the returned logprobs are the untruncated log_softmax(logits / T) of those tokens."""
    s, T, g = llama["sampler"], 0.7, 4
    out = s.generate(PROMPTS, group_size=g, key=jax.random.key(3), temperature=T,
                     top_k=top_k, top_p=top_p)
    for r in range(out.tokens.shape[0]):
        n = int(out.lengths[r])
        gen = out.tokens[r, :n]
        scaled = _full_logits(llama["model"], PROMPTS[r // g], gen) / T
        m = scaled.max(-1, keepdims=True)
        logp = scaled - m - np.log(np.exp(scaled - m).sum(-1, keepdims=True))
        for t in range(n):
            assert _allowed(scaled[t], top_k, top_p)[gen[t]], (r, t)
        np.testing.assert_allclose(out.logprobs[r, :n], logp[np.arange(n), gen], atol=1e-4)


def test_stats(llama):
    out = llama["sampler"].generate(PROMPTS, group_size=4, key=jax.random.key(0), greedy=True)
    st = out.stats
    assert st.rows == 16 and st.decode_steps % 4 == 0 and st.decode_steps >= out.lengths.max()
    assert st.padding_waste == st.rows * st.decode_steps - out.lengths.sum()
    assert st.prompt_bucket == 24 and st.cache_bucket == 24 + N_NEW
    assert st.prefill_s > 0 and st.decode_s > 0 and st.tokens_per_s > 0


def test_errors(llama, qwen):
    s = llama["sampler"]
    k = jax.random.key(0)
    with pytest.raises(ValueError, match=r"prompt 1 has 25 tokens.*\(8, 24\)"):
        s.generate([[1], [2] * 25], group_size=4, key=k)
    with pytest.raises(ValueError, match=r"group_size 2 .*\(1, 4\)"):
        s.generate([[1]], group_size=2, key=k)
    with pytest.raises(ValueError, match=r"5 prompts .* at most 4"):
        s.generate([[1]] * 5, group_size=4, key=k)
    with pytest.raises(ValueError, match="max_new_tokens"):
        s.generate([[1]], group_size=4, key=k, max_new_tokens=N_NEW + 1)
    with pytest.raises(ValueError, match="use_top_k"):
        qwen["sampler"].generate([[1]], group_size=1, key=k, top_k=3)


def test_no_prefix_sharing_and_mesh_match(llama):
    """The Tunix-style baseline (prompt repeated g times) and a 2x2 data/fsdp mesh give the same
    greedy rows and logprobs as the default sampler."""
    ref = llama["sampler"].generate(PROMPTS, group_size=4, key=jax.random.key(0), greedy=True)
    base = SamplingConfig(group_sizes=(4,), prompts_per_step=4, prompt_buckets=(24,),
                          max_new_tokens=N_NEW, decode_chunk=4)
    mesh = make_mesh(data=2, fsdp=2, tensor=1)
    for cfg, m in ((SamplingConfig(**{**base.__dict__, "prefix_sharing": False}), None),
                   (base, mesh)):
        s = Sampler(llama["model"], cfg, pad_id=PAD, eos_ids=llama["eos"], mesh=m)
        out = s.generate(PROMPTS, group_size=4, key=jax.random.key(0), greedy=True)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def test_bf16_matmul_decode(llama):
    """`model.matmul_dtype: bfloat16` under a float32 model: decode reads bf16 weight copies,
    and the sampler tracks the float32 one (greedy rows equal until a near-tie, logprobs within
    bf16 rounding, not equal), with no compile after warm-up."""
    model = nnx.merge(*nnx.split(llama["model"]))
    model.cfg = dataclasses.replace(model.cfg, matmul_dtype="bfloat16")
    assert decode_weights(model).head.dtype == jnp.bfloat16
    cfg = SamplingConfig(group_sizes=(4,), prompts_per_step=4, prompt_buckets=(24,),
                         max_new_tokens=N_NEW, decode_chunk=4)
    s = Sampler(model, cfg, pad_id=PAD, eos_ids=llama["eos"])
    s.compile_all(progress=False)
    key = jax.random.key(0)
    before = compile_count()
    out = s.generate(PROMPTS, group_size=4, key=key, greedy=True)
    assert compile_count() == before
    ref = llama["sampler"].generate(PROMPTS, group_size=4, key=key, greedy=True)
    # Rows agree up to a near-tie that bf16 rounding can flip; compare logprobs up to there.
    same = np.cumprod(out.tokens == ref.tokens, axis=1).astype(bool)
    assert same.mean() > 0.75 and same[:, :4].all(), same.sum(1)
    gap = np.abs(out.logprobs - ref.logprobs)[same].max()
    assert 0 < gap < 0.05, gap


def test_categorical_icdf_distribution_and_exclusions():
    """The two-level inverse-CDF draw matches softmax(logits) (V not a multiple of the block,
    so padding is exercised) and never returns an excluded (-inf) token."""
    V, R = 37, 40000
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, V).astype(np.float32)
    logits[[3, 20, 36]] = -np.inf  # 36: the last token, next to the padding
    keys = jax.random.split(jax.random.key(5), R)
    toks = np.asarray(jax.jit(categorical_icdf)(keys, jnp.broadcast_to(jnp.asarray(logits),
                                                                         (R, V))))
    counts = np.bincount(toks, minlength=V)
    assert counts.size == V and counts[[3, 20, 36]].sum() == 0
    p = np.exp(logits - logits.max())
    p /= p.sum()
    std = np.sqrt(p * (1 - p) / R)
    assert np.all(np.abs(counts / R - p) <= 5 * std + 1e-4), np.abs(counts / R - p).max()


def test_token_logprob_is_log_softmax_at_the_token():
    """`token_logprob` (the sampled token's log-probability without an [R, V] log_softmax) is
    `jax.nn.log_softmax` gathered at the token, bit for bit, at a large vocabulary and scale."""
    R, V = 8, 262144  # Gemma 3's vocabulary: the size the shortcut was made for
    logits = jax.random.normal(jax.random.key(0), (R, V)) * 30
    tokens = jax.random.randint(jax.random.key(1), (R,), 0, V).at[0].set(
        jnp.argmax(logits[0]))
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, None], -1)[:, 0]
    got = jax.jit(token_logprob)(logits, tokens)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(
        lambda x, t: jnp.take_along_axis(jax.nn.log_softmax(x, -1), t[:, None], -1)[:, 0])(
            logits, tokens)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-6, atol=1e-5)
    assert float(got[0]) > -1.0 and float(got.min()) < -50  # argmax row vs tail tokens
