"""Tiny GGUF files for tests, written with gguf-py's own writer and quantizer.

A random transformers model supplies the weights in HF layout; they are renamed to llama.cpp's
tensor names, the llama architecture's Q/K rows permuted as llama.cpp's converter does
(`LlamaModel.permute`), and each tensor stored in the quant type the caller names. K-quant blocks
(which gguf-py cannot quantize) are random bytes with small, finite scales. The file carries a
tiny byte-level BPE tokenizer (256 byte tokens, a few merges, three ChatML specials) and a chat
template, which transformers' GGUF loaders need.
"""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

Q = gguf.GGMLQuantizationType
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
                 "'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
                 "{{'<|im_start|>assistant\n'}}{% endif %}")
# HF name suffix under `model.layers.{i}.` -> GGUF name under `blk.{i}.`.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
# Gemma 3's four norms (llama.cpp's names).
GEMMA_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}


def tokens() -> list[str]:
    """The tiny vocabulary: 256 byte-level symbols (in byte order), merge results, specials."""
    byte_syms = [bytes_to_unicode()[b] for b in range(256)]
    return byte_syms + [m.replace(" ", "") for m in MERGES] + SPECIALS


VOCAB = len(tokens())  # 265


def hf_model(arch: str, *, hidden: int = 256, layers: int = 2, tie: bool = False,
             seed: int = 0) -> torch.nn.Module:
    """A random transformers model whose weights go into the GGUF (hidden % 256 == 0 so the
    K-quants fit). qwen3 / gemma3: head_dim 128 / 256, the values transformers' GGUF loader
    assumes (it reads no key_length for qwen3, no query_pre_attn_scalar for gemma3)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
              num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=50000.0,
              tie_word_embeddings=tie, initializer_range=0.05)
    if arch == "llama":
        m = LlamaForCausalLM(LlamaConfig(**kw))
    elif arch == "qwen3":
        m = Qwen3ForCausalLM(Qwen3Config(**kw, head_dim=128))
    elif arch == "gemma3":
        # 7 layers: llama.cpp's pattern makes layer 5 global; window 4 < the test's 10 ids.
        m = Gemma3ForCausalLM(Gemma3TextConfig(**{**kw, "num_hidden_layers": max(layers, 7)},
                                               head_dim=256, query_pre_attn_scalar=256,
                                               sliding_window=4))
    else:
        m = Qwen2ForCausalLM(Qwen2Config(**kw))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name:  # non-trivial biases and norm gains
                p.add_(torch.randn_like(p) * 0.2)
    return m.eval()


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `LlamaModel.permute` (rows of Q/K weights / biases)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _random_k_quant(shape: tuple[int, ...], qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks for a float tensor of `shape` with small finite f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (f16) lead the block
        raw[..., 0:4] = np.array([2e-4, 1e-4], np.float16).view(np.uint8)
    elif qtype == Q.Q6_K:  # d (f16) ends it
        raw[..., -2:] = np.array([1e-4], np.float16).view(np.uint8)
    else:
        raise ValueError(f"no random-block recipe for {qtype.name}")
    return raw.reshape(*shape[:-1], cols // block * size)


def encode(w: np.ndarray, qtype: Any, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    """(bytes or floats, raw_dtype) for `GGUFWriter.add_tensor`."""
    if qtype == Q.F32:
        return w.astype(np.float32), None
    if qtype == Q.F16:
        return w.astype(np.float16), None
    if qtype in (Q.Q4_K, Q.Q6_K):
        return _random_k_quant(w.shape, qtype, rng), qtype
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def write_gguf(path: str | os.PathLike[str], hf: torch.nn.Module, qtypes: dict[str, Any], *,
               arch: str | None = None, drop: tuple[str, ...] = (), raw: dict[str, Any] | None
               = None) -> str:
    """Writes `hf`'s weights as a GGUF file at `path` and returns the path.

    qtypes: GGUF tensor kind (e.g. "attn_q.weight", "token_embd.weight") -> quant type; F32 for
      the rest. arch: the `general.architecture` to write (default: the model's). drop: GGUF
      tensor names left out. raw: GGUF name -> quant type whose bytes are written as-is (zeros).
    """
    c = hf.config
    model_arch = {"gemma3_text": "gemma3"}.get(c.model_type, c.model_type)
    arch = arch or model_arch
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)  # Gemma: per layer type
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    if model_arch in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if model_arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
    names = GEMMA_LAYER_NAMES if model_arch == "gemma3" else LAYER_NAMES
    toks = tokens()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm" if model_arch == "llama" else "qwen2")
    w.add_token_list(toks)
    w.add_token_types([3 if t in SPECIALS else 1 for t in toks])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(toks.index("<|im_start|>"))
    w.add_eos_token_id(toks.index("<|im_end|>"))
    w.add_pad_token_id(toks.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    heads = {"attn_q": c.num_attention_heads, "attn_k": c.num_key_value_heads}
    for name, t in hf.state_dict().items():
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            kind = names[rest]
            gname = f"blk.{i}.{kind}"
        elif name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        else:
            kind = gname = TOP_NAMES[name]
        if gname in drop:
            continue
        x = t.detach().float().numpy()
        stem = kind.split(".")[0]
        if model_arch == "llama" and stem in heads:
            x = llama_permute(x, heads[stem])
        if model_arch == "gemma3" and gname.endswith("norm.weight"):
            x = x + 1.0  # llama.cpp's converter stores Gemma's (1 + w)
        if raw and gname in raw:
            block, size = gguf.GGML_QUANT_SIZES[raw[gname]]
            data = np.zeros((*x.shape[:-1], x.shape[-1] // block * size), np.uint8)
            w.add_tensor(gname, data, raw_dtype=raw[gname])
            continue
        data, raw_dtype = encode(x, qtypes.get(kind, Q.F32) if x.ndim == 2 else Q.F32, rng)
        w.add_tensor(gname, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)
