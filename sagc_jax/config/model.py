"""The ``model:`` section and its ``model.lora:`` subsection."""

from __future__ import annotations

from importlib import resources
from typing import Literal

from pydantic import model_validator

from sagc_jax.config.base import Bool, Float, Int, PosInt, Section, Str, field, rule_error
from sagc_jax.config.errors import fmt

__all__ = ["LoRASection", "ModelSection", "preset_names"]


def preset_names() -> tuple[str, ...]:
    """Names of the shipped architecture presets (``sagc_jax/models/presets/*.json``), read
    without importing the model code (the config stays importable without jax)."""
    folder = resources.files("sagc_jax").joinpath("models", "presets")
    return tuple(sorted(f.name.removesuffix(".json") for f in folder.iterdir()
                        if f.name.endswith(".json")))


LoRATarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoRASection(Section):
    """LoRA adapters (``model.lora:``) on the stacked layer weights; see docs/lora.md.

    Only the adapters are trained (and carry AdamW state); the base stays frozen, and with
    ``algo.beta > 0`` the KL reference is the base with adapters off (no second copy).
    """

    section_key = "model.lora"
    rank: PosInt = field(16, "Adapter rank r.")
    alpha: Float = field(32.0, "Adapter scale numerator: the update is (alpha / rank) * A @ B.",
                         gt=0)
    targets: tuple[LoRATarget, ...] = field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "Layer weights that get an adapter (HF module names).")
    dropout: Float = field(0.0, "Adapter input dropout; only 0.0 is implemented.", ge=0, lt=1)

    @model_validator(mode="after")
    def _rules(self) -> LoRASection:
        if not self.targets:
            raise rule_error("targets", "must list at least one layer weight")
        if len(set(self.targets)) != len(self.targets):
            raise rule_error("targets", f"must not repeat a weight, got {fmt(self.targets)}")
        if self.dropout != 0.0:
            raise rule_error("dropout", f"only 0.0 is implemented (adapter dropout is not), got "
                             f"{self.dropout}")
        return self


class ModelSection(Section):
    """Policy model (``model:``). With ``path`` set the architecture comes from the HF config
    there; otherwise :func:`sagc_jax.models.config.from_run_section` builds a ``ModelConfig``."""

    section_key = "model"
    path: Str | None = field(
        None, "HF model directory (config.json + safetensors) or a .gguf file (weights, "
        "tokenizer and chat template); None = fresh random model."
    )
    tokenizer: Str | None = field(
        None, "HF tokenizer directory or .gguf file; None = model.path's own tokenizer, else "
        "the built-in tokenizer shipped with the package."
    )
    model_type: Literal["llama", "qwen2"] = field("llama", "Model family (fresh models only).")
    hidden_size: Int = field(128, "Residual width.", ge=1)
    intermediate_size: Int = field(384, "SwiGLU MLP width.", ge=1)
    num_layers: Int = field(4, "Number of transformer blocks.", ge=1)
    num_heads: Int = field(4, "Query heads.", ge=1)
    num_kv_heads: Int = field(2, "Key/value heads (GQA); must divide num_heads.", ge=1)
    head_dim: Int | None = field(None, "Per-head width; None = hidden_size // num_heads.", ge=1)
    rope_theta: Float = field(10000.0, "RoPE base frequency.", gt=0)
    max_position_embeddings: Int = field(
        512, "Maximum sequence length (prompt + completion).", ge=1
    )
    tie_word_embeddings: Bool = field(True, "Share input embedding and LM head.")
    attention_bias: Bool = field(False, "Bias on q/k/v projections (Qwen2 style).")
    preset: Str | None = field(
        None, "Architecture preset (e.g. qwen2.5-0.5b; sagc_jax/models/presets/*.json): the dry "
        "run sizes the run from it when model.path holds no config.json; a real model.path wins."
    )
    dtype: Literal["float32", "bfloat16"] = field(
        "float32", "Compute dtype of the policy and sampler (matmul inputs, KV cache)."
    )
    param_dtype: Literal["float32", "bfloat16"] = field(
        "float32", "Storage dtype of the params, their gradients and AdamW moments; bfloat16 "
        "halves them, but an update smaller than ~2^-8 of a weight rounds away."
    )
    remat: Bool = field(False, "Rematerialise transformer blocks in the backward pass.")
    matmul_dtype: Literal["float32", "bfloat16"] | None = field(
        None,
        "Operand dtype of every dense and LM-head matmul (train step, log-prob passes, prefill, "
        "decode, evals); null = model.dtype. bfloat16 under a float32 model is mixed precision "
        "as torch autocast / TRL's bf16=True: bf16 operands, float32 accumulation, float32 "
        "master weights, norms, softmax, KV cache and loss (models/precision.py). ~2x the "
        "matmul rate on CPUs with AVX512-BF16 and half decode's weight read; the policy is then "
        "the bf16-rounded one.",
    )
    lora: LoRASection | None = field(
        None, "LoRA adapters ({rank, alpha, targets, dropout}); None = full fine-tuning.")

    @model_validator(mode="after")
    def _preset(self) -> ModelSection:
        if self.preset is not None:
            names = preset_names()
            if self.preset.strip().lower() not in names:
                raise rule_error("preset", f"unknown preset {self.preset!r}; known: "
                                 f"{', '.join(names)}")
        return self

    @model_validator(mode="after")
    def _heads(self) -> ModelSection:
        if self.path is None:
            if self.num_heads % self.num_kv_heads:
                raise rule_error(
                    "num_kv_heads",
                    f"must divide model.num_heads ({self.num_heads}), got {self.num_kv_heads}",
                )
            if self.head_dim is None and self.hidden_size % self.num_heads:
                raise rule_error(
                    "hidden_size",
                    f"must be divisible by model.num_heads ({self.num_heads}) when "
                    f"model.head_dim is null, got {self.hidden_size}",
                )
        return self
