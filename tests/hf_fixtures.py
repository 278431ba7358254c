"""Tiny random HF (PyTorch) Llama / Qwen2 checkpoints for parity tests, shared across test files.

Every weight that could hide a mapping bug is randomised: norms are not 1, biases are not 0, and
weights use a large init std so logits are O(1) and a wrong transpose / RoPE / norm shows up far
above the parity tolerance.

Use from another test file (the `tests/` dir is on sys.path under pytest's default import mode):

    from hf_fixtures import tiny_hf_dir  # noqa: F401  (session fixture, shared cache)

    def test_x(tiny_hf_dir):
        path = tiny_hf_dir("qwen2")          # built once per session, then reused
        ref = load_hf(path)                  # transformers model, float32, eval mode

Names in `TINY_SPECS` are the supported kinds; `build_hf_dir(spec, dest)` builds any spec.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

# Shared by every model: 2 layers, tiny vocabularies (odd sizes so a vocab-padding bug shows).
_BASE: dict[str, Any] = dict(num_hidden_layers=2, max_position_embeddings=256,
                             initializer_range=0.1, rms_norm_eps=1e-6)

TINY_SPECS: dict[str, dict[str, Any]] = {
    # MHA, default RoPE, untied, Llama attention_bias (q/k/v/o) and mlp_bias.
    "llama": dict(kind="llama", vocab_size=101, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=4, attention_bias=True,
                  mlp_bias=True, tie_word_embeddings=False),
    # One kv head (GQA 4:1), llama3 RoPE, tied, head_dim 16 != hidden 48 / 4 heads.
    "llama_gqa1": dict(kind="llama", vocab_size=257, hidden_size=48, intermediate_size=80,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                       tie_word_embeddings=True,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                        "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}),
    # GQA 2:1, linear RoPE, config.json rewritten in the 4.x `rope_theta` + `rope_scaling` layout.
    "llama_linear_v4": dict(kind="llama", vocab_size=131, hidden_size=64, intermediate_size=96,
                            num_attention_heads=4, num_key_value_heads=2,
                            tie_word_embeddings=False,
                            rope_parameters={"rope_type": "linear", "rope_theta": 5000.0,
                                             "factor": 2.0},
                            config_layout="v4"),
    # Qwen2 (q/k/v bias), GQA 2:1, tied; shapes divide a (fsdp=2, tensor=2) mesh.
    "qwen2": dict(kind="qwen2", vocab_size=151, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    # Qwen2 untied, 1 kv head, head_dim 16 != 32 / 4, weights split over 2 files by hand.
    "qwen2_sharded": dict(kind="qwen2", vocab_size=97, hidden_size=32, intermediate_size=64,
                          num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                          tie_word_embeddings=False, sharded=True),
    # Llama stored in bfloat16 (exercises the bf16 read path; reference = the bf16 values).
    "llama_bf16": dict(kind="llama", vocab_size=89, hidden_size=32, intermediate_size=64,
                       num_attention_heads=2, num_key_value_heads=1,
                       tie_word_embeddings=False, save_dtype="bfloat16"),
}

# Qwen3 and Gemma 3 text (tests/test_families.py): kept apart from TINY_SPECS, whose kinds
# test_models.py parametrizes over with per-kind expectations.
_SLIDE, _FULL = "sliding_attention", "full_attention"
FAMILY_SPECS: dict[str, dict[str, Any]] = {
    # Qwen3, GQA 2:1, tied, head_dim 24 != hidden 64 / 4 heads, q/k norms.
    "qwen3": dict(kind="qwen3", vocab_size=149, hidden_size=64, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                  tie_word_embeddings=True, rope_theta=20000.0),
    # Qwen3 untied, one kv head, attention_bias (q/k/v/o), 3 layers.
    "qwen3_bias": dict(kind="qwen3", vocab_size=103, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                       head_dim=16, attention_bias=True, tie_word_embeddings=False),
    # Gemma 3: GQA 2:1, window 5 (prompts are longer), local/global layers with their own RoPE
    # (global: linear scaling), query_pre_attn_scalar 20 != head_dim 24, final softcap, tied.
    "gemma3": dict(kind="gemma3", vocab_size=163, hidden_size=64, intermediate_size=96,
                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=24, query_pre_attn_scalar=20, sliding_window=5,
                   layer_types=[_SLIDE, _FULL, _SLIDE],
                   rope_parameters={_FULL: {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 10000.0},
                                    _SLIDE: {"rope_type": "default", "rope_theta": 100.0}},
                   final_logit_softcapping=3.0, tie_word_embeddings=True),
    # Gemma 3, one kv head, untied, 4 layers, window 4, config.json in the 4.x layout
    # (`sliding_window_pattern` 2, `rope_theta` + `rope_local_base_freq`).
    "gemma3_v4": dict(kind="gemma3", vocab_size=97, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                      layer_types=[_SLIDE, _FULL, _SLIDE, _FULL],
                      rope_parameters={_FULL: {"rope_type": "default", "rope_theta": 50000.0},
                                       _SLIDE: {"rope_type": "default", "rope_theta": 1000.0}},
                      tie_word_embeddings=False, config_layout="gemma_v4"),
}
ALL_SPECS: dict[str, dict[str, Any]] = {**TINY_SPECS, **FAMILY_SPECS}

# Spec keys that are ours, not HF config fields.
_LOCAL_KEYS = ("kind", "config_layout", "sharded", "save_dtype", "seed")


def build_hf_model(spec: dict[str, Any]):
    """A random transformers CausalLM (float32, eval) for `spec` (see TINY_SPECS)."""
    import torch
    import transformers as tf

    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
               "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
    if spec["kind"] not in classes:
        raise ValueError(f"unknown kind {spec['kind']!r}")
    torch.manual_seed(spec.get("seed", 0))
    kw = {**_BASE, **{k: v for k, v in spec.items() if k not in _LOCAL_KEYS}}
    config_cls, model_cls = (getattr(tf, n) for n in classes[spec["kind"]])
    model = model_cls(config_cls(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)  # norms != 1, so a swapped / dropped norm changes logits
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)  # biases != 0 (HF inits them to zero)
    return model.eval()


def _write_v4_config(dest: pathlib.Path) -> None:
    """Rewrites config.json in the transformers 4.x RoPE layout (top-level theta, `type` key)."""
    path = dest / "config.json"
    d = json.loads(path.read_text())
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type")
    d["rope_scaling"] = None if rope_type == "default" else {"type": rope_type, **rope}
    path.write_text(json.dumps(d, indent=2))


def _write_gemma_v4_config(dest: pathlib.Path) -> None:
    """Rewrites a Gemma 3 config.json in the 4.x layout: `sliding_window_pattern` instead of
    `layer_types`, `rope_theta` / `rope_local_base_freq` instead of per-type `rope_parameters`
    (as google/gemma-3-1b-it's config.json is written)."""
    path = dest / "config.json"
    d = json.loads(path.read_text())
    types = d.pop("layer_types")
    period = types.index("full_attention") + 1
    assert all((t == "full_attention") == ((i + 1) % period == 0) for i, t in enumerate(types))
    rope = d.pop("rope_parameters")
    d.update(sliding_window_pattern=period, rope_scaling=None,
             rope_theta=rope["full_attention"]["rope_theta"],
             rope_local_base_freq=rope["sliding_attention"]["rope_theta"])
    path.write_text(json.dumps(d, indent=2))


def shard_safetensors(dest: pathlib.Path, num_files: int = 2) -> None:
    """Splits dest/model.safetensors over `num_files` files + an index, as HF sharding does."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(dest / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(num_files):
        fname = f"model-{i + 1:05d}-of-{num_files:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::num_files]}  # interleave: layers span files
        save_file(part, dest / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.nbytes for t in tensors.values())
    (dest / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    os.remove(dest / "model.safetensors")


def build_hf_dir(spec: dict[str, Any], dest: str | os.PathLike) -> pathlib.Path:
    """Builds the model for `spec` and writes it with transformers' `save_pretrained` to dest,
    then applies the spec's on-disk variations (bf16, 4.x config layout, sharding)."""
    import torch

    dest = pathlib.Path(dest)
    model = build_hf_model(spec)
    if spec.get("save_dtype") == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(dest)
    if spec.get("config_layout") == "v4":
        _write_v4_config(dest)
    if spec.get("config_layout") == "gemma_v4":
        _write_gemma_v4_config(dest)
    if spec.get("sharded"):
        shard_safetensors(dest)
    return dest


def load_hf(path: str | os.PathLike):
    """transformers' model for a checkpoint dir, float32, eval mode (the parity reference)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_logits(model, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
    """Float32 numpy logits of a transformers model for int ids [B, T]."""
    import torch

    with torch.no_grad():
        kw = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
        return model(torch.tensor(np.asarray(ids), dtype=torch.long), **kw).logits.float().numpy()


_BUILT: dict[str, pathlib.Path] = {}


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], pathlib.Path]:
    """Factory `kind -> checkpoint dir` (kinds: ALL_SPECS keys); each built once per session.

    Treat the returned dirs as read-only: copy one before corrupting it.
    """
    # Module-level cache: pytest makes one FixtureDef per module that imports this fixture, so
    # its own session cache alone would rebuild the models once per importing test file.
    root = tmp_path_factory.getbasetemp() / "tiny_hf"

    def get(kind: str) -> pathlib.Path:
        if kind not in _BUILT:
            _BUILT[kind] = build_hf_dir(ALL_SPECS[kind], root / kind)
        return _BUILT[kind]

    return get


# ---- tokenizers: a model's own HF tokenizer, with a bos token (Llama) and without (Qwen2) ----

#: Llama-2-style template: it emits the bos token itself (so a tokenizer that also added one
#: would give two: exactly what must not happen).
LLAMA_CHAT = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] "
              "{{ m['content'] }} [/INST]{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}"
              "{% endfor %}")
#: ChatML (Qwen2): no bos anywhere.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_hf_tokenizer(kind: str):
    """A real transformers tokenizer class over single characters, built locally (no merges):
    "llama": `LlamaTokenizer` (bos `<s>`, Metaspace, 98 tokens, fits TINY_SPECS["llama"]);
    "qwen2": `Qwen2Tokenizer` (no bos, byte-level, ChatML tokens, 99 tokens, fits "qwen2")."""
    from tokenizers import AddedToken, pre_tokenizers
    from transformers import LlamaTokenizer, Qwen2Tokenizer

    printable = [chr(c) for c in range(33, 127)]
    if kind == "llama":
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3}
        vocab.update({c: i + 4 for i, c in enumerate(printable)})
        tok = LlamaTokenizer(vocab=vocab, merges=[])
        tok.chat_template = LLAMA_CHAT
        return tok
    if kind == "qwen2":
        byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
        keep = [c for c in byte_chars if c in printable] + ["\u0120", "\u010a"]  # space, newline
        vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(keep)}}
        tok = Qwen2Tokenizer(vocab=vocab, merges=[])
        tok.add_special_tokens({"additional_special_tokens": [
            AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)]})
        tok.chat_template = CHATML
        return tok
    raise ValueError(f"unknown tokenizer kind {kind!r}")


def pipeline_greedy(model: Any, prompts: list[str], max_new_tokens: int,
                    tokenizer: Any = None) -> list[str]:
    """Greedy completions from `transformers.pipeline("text-generation")` on `model` (an
    exported directory, or a loaded model with `tokenizer`), one prompt per call (no padding),
    the way a user would run it."""
    import torch
    from transformers import pipeline

    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, dtype=torch.float32)
    return [pipe(p, max_new_tokens=max_new_tokens, do_sample=False, return_full_text=False)[0]
            ["generated_text"] for p in prompts]


# ---- our side of a parity check (tests/test_models.py, tests/test_families.py) ---------------


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids, positions, kv_mask):
    return nnx.merge(graphdef, state)(ids, positions=positions, kv_mask=kv_mask)


def forward(model, ids, positions=None, kv_mask=None) -> np.ndarray:
    """Jitted full forward; positions / kv_mask are always passed so a config compiles once."""
    ids = jnp.asarray(ids, jnp.int32)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    if kv_mask is None:
        kv_mask = jnp.ones(ids.shape, bool)
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, ids, jnp.asarray(positions), jnp.asarray(kv_mask)))


class Loaded:
    """One fixture checkpoint: our model, its config, the HF reference and reference logits of
    [batch, length] random ids (seeded by the kind's place in `specs`)."""

    def __init__(self, kind: str, path: pathlib.Path, specs: dict[str, Any], batch: int,
                 length: int):
        from sagc_jax.models import from_pretrained

        self.kind, self.path = kind, path
        self.model, self.cfg = from_pretrained(path)
        self.hf = load_hf(path)
        seed = sorted(specs).index(kind)
        self.ids = np.random.default_rng(seed).integers(0, self.cfg.vocab_size, (batch, length))
        self.ref = hf_logits(self.hf, self.ids)


def loaded_cache(tiny_hf_dir: Callable[[str], pathlib.Path], specs: dict[str, Any], batch: int,
                 length: int) -> Callable[[str], Loaded]:
    """kind -> its `Loaded`, built once (the body of the test modules' `loaded` fixtures)."""
    cache: dict[str, Loaded] = {}

    def get(kind: str) -> Loaded:
        if kind not in cache:
            cache[kind] = Loaded(kind, tiny_hf_dir(kind), specs, batch, length)
        return cache[kind]

    return get
