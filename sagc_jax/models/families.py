"""Model families by `model_type`: the structural features of a decoder block that are fixed per
family (not per checkpoint), the class names export writes, and the GGUF architecture name.

One typed record per family in one registry, so code asks `family(cfg.model_type).qk_norm`
instead of comparing model_type strings. Numbers that vary per checkpoint (widths, windows, RoPE
bases, softcaps) live in `ModelConfig`; this module is a leaf (imports nothing of ours), so
config, the forward and the importers can all read it without cycles.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Family:
    """What a model_type's decoder block looks like beyond the shared Llama skeleton.

    - `bias_rule`: "llama" (HF `attention_bias` puts a bias on q/k/v and o) or "qwen2" (q/k/v
      always biased, o never).
    - `qk_norm`: an RMSNorm over head_dim on every query and key head, before RoPE.
    - `sandwich_norms`: Gemma's extra norms on the attention output and on the MLP output
      (four norms a block: input, post-attention, pre- and post-feed-forward).
    - `norm_plus_one`: RMSNorm scales by (1 + w), computed in float32 before the cast back
      (Gemma), instead of w times the already-cast normalised input (Llama).
    - `embed_scale`: embeddings are multiplied by sqrt(hidden) in the compute dtype (Gemma).
    - `layer_types`: whether config.json's `layer_types` / sliding window are read (Gemma 3).
    - `tied_by_default`: transformers' default `tie_word_embeddings` for the family's config
      class (used when config.json omits the field).
    """

    model_type: str
    hf_architecture: str
    gguf_arch: str
    bias_rule: str = "llama"
    qk_norm: bool = False
    sandwich_norms: bool = False
    norm_plus_one: bool = False
    embed_scale: bool = False
    layer_types: bool = False
    tied_by_default: bool = False


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", "llama"),
    Family("qwen2", "Qwen2ForCausalLM", "qwen2", bias_rule="qwen2"),
    Family("qwen3", "Qwen3ForCausalLM", "qwen3", qk_norm=True),
    Family("gemma3_text", "Gemma3ForCausalLM", "gemma3", qk_norm=True, sandwich_norms=True,
           norm_plus_one=True, embed_scale=True, layer_types=True, tied_by_default=True),
)}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)

# GGUF `general.architecture` -> our model_type.
GGUF_ARCHITECTURES: dict[str, str] = {f.gguf_arch: f.model_type for f in FAMILIES.values()}

SLIDING, FULL = "sliding_attention", "full_attention"  # HF `layer_types` values


def family(model_type: str) -> Family:
    """The record of `model_type`; ValueError in one line naming it otherwise."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(f"config field 'model_type': unsupported '{model_type}', supported: "
                         f"{SUPPORTED_MODEL_TYPES}") from None
