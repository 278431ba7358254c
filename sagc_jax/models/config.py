"""Architecture config for the decoder families (Llama, Qwen2, Qwen3, Gemma 3 text).

One frozen dataclass describes every model we build; `models/hf_config.py` translates
transformers' config.json to and from it (`from_hf_dict` / `to_hf_dict`).
What is fixed per family (q/k norms, Gemma's norms) is in `models/families.py`; the per-checkpoint
numbers of Gemma 3 (sliding window, layer pattern, local RoPE base, softcaps) are fields here, so
every family shares this one schema.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sagc_jax.models.families import FULL, SLIDING, SUPPORTED_MODEL_TYPES, Family, family

SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class ModelConfigError(ValueError):
    """A model config (config.json or the `model.*` fields) with a missing, mistyped or
    out-of-range field; the message names the field (a user's input error: `train` exits 2)."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only transformer hyper-parameters (every family in `models/families.py`).

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
    # MLP activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (Gemma's GeGLU).
    hidden_act: str = "silu"
    # Sliding-window attention (Gemma 3): `layer_types` [num_layers] of "sliding_attention" /
    # "full_attention" (empty = every layer full); a sliding layer's query at position p sees
    # keys at positions > p - sliding_window (HF's window, the query included).
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    # RoPE base of the sliding layers (default RoPE, no scaling); None = `rope_theta`.
    rope_local_theta: float | None = None
    # Attention scale = query_pre_attn_scalar ** -0.5 (Gemma); None = head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None
    # c * tanh(x / c) on the attention scores / the final logits when set (Gemma 2 style).
    # (Gemma 3 checkpoints: transformers applies only the final one; see `_gemma3_from_hf`.)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

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
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            bad("hidden_act", f"unsupported {self.hidden_act!r}, supported: "
                f"{SUPPORTED_ACTIVATIONS}")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - {SLIDING, FULL}:
                bad("layer_types", f"need {self.num_layers} of '{SLIDING}' / '{FULL}', got "
                    f"{list(self.layer_types)}")
            if SLIDING in self.layer_types and (self.sliding_window or 0) < 1:
                bad("sliding_window", f"sliding layers need a window >= 1, got "
                    f"{self.sliding_window}")
        if self.lora_rank < 0 or (self.lora_rank > 0) != bool(self.lora_targets):
            bad("lora_rank", f"{self.lora_rank} with targets {list(self.lora_targets)}: need "
                "rank >= 1 with targets, or rank 0 without")

    @property
    def rope_params(self) -> dict[str, Any]:
        return dict(self.rope_scaling)

    @property
    def family(self) -> Family:
        return family(self.model_type)

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """[num_layers] True where a layer attends within `sliding_window` only."""
        return tuple(t == SLIDING for t in self.layer_types) or (False,) * self.num_layers

    @property
    def attn_scale(self) -> float:
        """Multiplier of q.k: query_pre_attn_scalar ** -0.5 (Gemma) or head_dim ** -0.5."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        if self.o_bias:
            attn += h
        if self.family.qk_norm:
            attn += 2 * d
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        per_layer = attn + mlp + (4 if self.family.sandwich_norms else 2) * h
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
