"""Architecture config for the Llama/Qwen2 decoder family, and its HF config.json mapping.

One frozen dataclass describes every model we build; `from_hf_dict` / `to_hf_dict` translate
transformers' config.json (4.x and 5.x layouts) and reject anything we would silently get wrong.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


class ModelConfigError(ValueError):
    """A model config (config.json or the `model.*` fields) with a missing, mistyped or
    out-of-range field; the message names the field (a user's input error: `train` exits 2)."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

# Fields that change the math of a forward pass in ways we do not implement.
_REFUSED_HF_FIELDS = (
    "attn_logit_softcapping", "final_logit_softcapping", "logits_scaling", "embedding_multiplier",
    "residual_multiplier", "attention_multiplier", "partial_rotary_factor", "qk_layernorm",
    "use_qk_norm", "no_rope_layers", "moe_intermediate_size", "num_experts",
)

# HF config fields we read, or know to be irrelevant for a decoder-only forward pass. Any other
# field with a non-default value is reported instead of ignored (see `_check_unsupported`).
_IGNORED_HF_FIELDS = {
    "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "attention_dropout", "pretraining_tp", "hidden_dropout",
    "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "max_window_layers", "layer_types",
    "tokenizer_class", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias",
    "use_sliding_window", "sliding_window", "task_specific_params",
    "prefix", "sep_token_id", "decoder_start_token_id", "tf_legacy_loss", "pruned_heads",
    "torchscript", "add_cross_attention", "tie_encoder_decoder", "finetuning_task",
    "cross_attention_hidden_size", "use_bfloat16", "keys_to_ignore_at_inference",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer hyper-parameters (Llama / Qwen2 family).

    `dtype` is the compute dtype; `param_dtype` the storage dtype of the params (and so of the
    gradients and AdamW moments, which optax keeps in the params' dtype).
    `rope_scaling` is a tuple of sorted (key, value) pairs so the config stays hashable
    (it is a static argument of jitted functions).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    model_type: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: True; Llama `attention_bias` also sets o_bias
    o_bias: bool = False
    mlp_bias: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    # Operand dtype of the dense and LM-head matmuls (`model.matmul_dtype`, models/precision.py);
    # None = `dtype`.
    matmul_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # LoRA adapters (models/lora.py): rank 0 = none. Scale = lora_alpha / lora_rank.
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> None:
            raise ModelConfigError(f"model config field '{field}': {why}")

        if self.model_type not in SUPPORTED_MODEL_TYPES:
            bad("model_type",
                f"unsupported '{self.model_type}', supported: {SUPPORTED_MODEL_TYPES}")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim"):
            if int(getattr(self, f)) < 1:
                bad(f, f"must be >= 1, got {getattr(self, f)}")
        if self.num_heads % self.num_kv_heads:
            bad("num_key_value_heads", f"{self.num_kv_heads} must divide num_attention_heads "
                f"{self.num_heads}")
        if self.head_dim % 2:
            bad("head_dim", f"must be even for RoPE, got {self.head_dim}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            bad("rope_type", f"unsupported '{self.rope_type}', supported: {SUPPORTED_ROPE_TYPES}")
        for f in ("dtype", "param_dtype"):
            if getattr(self, f) not in ("float32", "bfloat16"):
                bad(f, f"must be float32 or bfloat16, got {getattr(self, f)}")
        if self.matmul_dtype not in (None, "float32", "bfloat16"):
            bad("matmul_dtype", f"must be null, float32 or bfloat16, got {self.matmul_dtype!r}")
        if self.lora_rank < 0 or (self.lora_rank > 0) != bool(self.lora_targets):
            bad("lora_rank", f"{self.lora_rank} with targets {list(self.lora_targets)}: need "
                "rank >= 1 with targets, or rank 0 without")

    @property
    def rope_params(self) -> dict[str, Any]:
        return dict(self.rope_scaling)

    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        if self.o_bias:
            attn += h
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    def num_lora_params(self) -> int:
        """Adapter params (A and B of every targeted weight, all layers)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        qd, kvd = self.num_heads * d, self.num_kv_heads * d
        dims = {"q_proj": (h, qd), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (qd, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        return self.num_layers * self.lora_rank * sum(sum(dims[t]) for t in self.lora_targets)


def from_run_section(m: Any, vocab_size: int, *, bos_token_id: int | None = None,
                     eos_token_id: int | None = None,
                     pad_token_id: int | None = None) -> ModelConfig:
    """A fresh model's config from the run config's `model:` section (no HF dir)."""
    return ModelConfig(
        model_type=m.model_type, vocab_size=vocab_size, hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads, head_dim=m.head_dim or m.hidden_size // m.num_heads,
        rope_theta=m.rope_theta, max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
        # `attention_bias` means Qwen2-style q/k/v bias; Llama's HF flag also biases o_proj.
        qkv_bias=m.attention_bias or m.model_type == "qwen2",
        o_bias=m.attention_bias and m.model_type == "llama", dtype=m.dtype,
        param_dtype=getattr(m, "param_dtype", "float32"), remat=m.remat,
        matmul_dtype=getattr(m, "matmul_dtype", None),
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)


def _rope_from_hf(d: dict[str, Any]) -> tuple[float, str, tuple[tuple[str, Any], ...]]:
    """Reads RoPE settings from either layout: 5.x `rope_parameters` or 4.x `rope_theta` +
    `rope_scaling`."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"config field 'rope_parameters': expected a dict, got {params!r}")
    params = dict(params)
    theta = float(params.pop("rope_theta", d.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"config field 'rope_parameters.rope_type': unsupported '{rope_type}', "
            f"supported: {SUPPORTED_ROPE_TYPES}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("config field 'rope_parameters.partial_rotary_factor': only 1.0 supported")
    params.pop("partial_rotary_factor", None)
    needed = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}[rope_type]
    for k in needed:
        if k not in params:
            raise ValueError(f"config field 'rope_parameters.{k}': required for rope_type "
                             f"'{rope_type}'")
    kept = {k: params[k] for k in needed}
    extra = set(params) - set(needed)
    if extra:
        raise ValueError(f"config field 'rope_parameters': unsupported keys {sorted(extra)} for "
                         f"rope_type '{rope_type}'")
    return theta, rope_type, tuple(sorted(kept.items()))


def _check_unsupported(d: dict[str, Any]) -> None:
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config field 'hidden_act': only 'silu' is supported, got "
                         f"{d['hidden_act']!r}")
    if d.get("use_sliding_window"):
        raise ValueError("config field 'use_sliding_window': sliding-window attention is not "
                         "supported")
    if d.get("quantization_config"):
        raise ValueError("config field 'quantization_config': quantized checkpoints are not "
                         "supported")
    for k in _REFUSED_HF_FIELDS:
        if d.get(k) not in (None, False, 0, {}, [], 1.0) and k in d:
            raise ValueError(f"config field '{k}' (= {d[k]!r}) is not supported by the "
                             f"{d.get('model_type')} loader")
    unknown = sorted(k for k, v in d.items()
                     if k not in _IGNORED_HF_FIELDS and v not in (None, False, 0, {}, []))
    if unknown:
        # Fields we have never seen: most are bookkeeping, so say so instead of failing.
        warnings.warn(f"HF config fields ignored by the {d.get('model_type')} loader: {unknown}",
                      stacklevel=3)


# config.json fields `from_hf_dict` reads, by the JSON type they must have (None is allowed for
# the optional ones: HF writes `"head_dim": null` for "derive it").
_HF_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads")
_HF_OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "max_position_embeddings",
                     "bos_token_id", "pad_token_id")
_HF_NUMBERS = ("rms_norm_eps", "rope_theta")
_HF_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias")


def check_hf_fields(d: Any) -> None:
    """Raises ModelConfigError naming the first config.json field `from_hf_dict` reads whose
    value has the wrong JSON type (`"hidden_size": null`, `"num_hidden_layers": "2"`, ...)."""
    if not isinstance(d, dict):
        raise ModelConfigError(f"config.json: expected a JSON object, got {type(d).__name__}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def bad(k: str, want: str) -> None:
        raise ModelConfigError(f"config field '{k}': expected {want}, got {d[k]!r:.60}")

    for k in _HF_INT_FIELDS:
        if k in d and not is_int(d[k]):
            bad(k, "an integer")
    for k in _HF_OPTIONAL_INTS:
        if d.get(k) is not None and not is_int(d[k]):
            bad(k, "an integer or null")
    eos = d.get("eos_token_id")
    if eos is not None and not is_int(eos) and not (
            isinstance(eos, list) and all(is_int(x) for x in eos)):
        bad("eos_token_id", "an integer, a list of integers or null")
    for k in _HF_NUMBERS:
        if d.get(k) is not None and (isinstance(d[k], bool) or not isinstance(d[k], int | float)):
            bad(k, "a number")
    for k in _HF_BOOLS:
        if d.get(k) is not None and not isinstance(d[k], bool):
            bad(k, "true or false")


def from_hf_dict(d: dict[str, Any], *, dtype: str | None = None,
                 param_dtype: str | None = None) -> ModelConfig:
    """Builds a ModelConfig from an HF config.json dict; errors name the offending field."""
    check_hf_fields(d)
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"config field 'model_type': unsupported '{model_type}', "
                         f"supported: {SUPPORTED_MODEL_TYPES}")
    _check_unsupported(d)
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads"):
        if k not in d:
            raise ValueError(f"config field '{k}' is missing")
    theta, rope_type, scaling = _rope_from_hf(d)
    heads = int(d["num_attention_heads"])
    attention_bias = bool(d.get("attention_bias", False))
    is_qwen = model_type == "qwen2"
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_layers=int(d["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_type=rope_type,
        rope_scaling=scaling,
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v bias and no o bias; Llama's attention_bias covers q/k/v/o.
        qkv_bias=True if is_qwen else attention_bias,
        o_bias=False if is_qwen else attention_bias,
        mlp_bias=bool(d.get("mlp_bias", False)),
        dtype=dtype or "float32",
        param_dtype=param_dtype or "float32",
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
        pad_token_id=d.get("pad_token_id"),
    )


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json transformers needs to load our weights (5.x `rope_parameters` layout,
    plus `rope_theta` for 4.x readers)."""
    rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **cfg.rope_params}
    d: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM" if cfg.model_type == "llama" else "Qwen2ForCausalLM"],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_parameters": rope,
        "rope_theta": cfg.rope_theta,
        "torch_dtype": "float32",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }
    if cfg.model_type == "llama":
        if cfg.qkv_bias != cfg.o_bias:
            raise ValueError("llama export: qkv_bias and o_bias must match (HF attention_bias)")
        d["attention_bias"] = cfg.qkv_bias
        d["mlp_bias"] = cfg.mlp_bias
    else:
        if not cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:
            raise ValueError("qwen2 export: needs qkv_bias=True, o_bias=False, mlp_bias=False")
        d["use_sliding_window"] = False
    return d
