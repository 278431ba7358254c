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


@dataclasses.dataclass(frozen=True)
class TextTower:
    """A multimodal checkpoint whose text decoder we load as its text family (vision skipped).

    - `config_key`: where config.json nests the text config; `text_defaults`: the text config
      class's defaults, which transformers 4.x leaves out of a nested config (hub files such as
      google/gemma-3-4b-it's list only the fields that differ).
    - `layouts`: per known checkpoint layout, (text model's HF prefix, checkpoint prefix) pairs:
      4.x / hub files store `language_model.model.*`, 5.x's live modules `model.language_model.*`
      (the first layout whose embedding is present is used).
    - `skipped`: tensor prefixes of the other towers.
    """

    model_type: str
    text_model_type: str
    config_key: str
    text_defaults: tuple[tuple[str, object], ...]
    layouts: tuple[tuple[tuple[str, str], ...], ...]
    skipped: tuple[str, ...]


# transformers' Gemma3TextConfig defaults (configuration_gemma3.py, 5.x).
_GEMMA3_TEXT_DEFAULTS = (
    ("vocab_size", 262208), ("hidden_size", 2304), ("intermediate_size", 9216),
    ("num_hidden_layers", 26), ("num_attention_heads", 8), ("num_key_value_heads", 4),
    ("head_dim", 256), ("hidden_activation", "gelu_pytorch_tanh"),
    ("max_position_embeddings", 131072), ("rms_norm_eps", 1e-6), ("pad_token_id", 0),
    ("eos_token_id", 1), ("bos_token_id", 2), ("tie_word_embeddings", True),
    ("query_pre_attn_scalar", 256), ("sliding_window", 4096), ("rope_theta", 1_000_000.0),
    ("rope_local_base_freq", 10_000.0), ("sliding_window_pattern", 6),
)

TEXT_TOWERS: dict[str, TextTower] = {t.model_type: t for t in (
    TextTower("gemma3", "gemma3_text", "text_config", _GEMMA3_TEXT_DEFAULTS,
              layouts=((("model.", "language_model.model."),
                        ("lm_head.", "language_model.lm_head.")),
                       (("model.", "model.language_model."), ("lm_head.", "lm_head."))),
              skipped=("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                       "model.multi_modal_projector.")),
)}

# GGUF `general.architecture` -> our model_type.
GGUF_ARCHITECTURES: dict[str, str] = {f.gguf_arch: f.model_type for f in FAMILIES.values()}

SLIDING, FULL = "sliding_attention", "full_attention"  # HF `layer_types` values


def family(model_type: str) -> Family:
    """The record of `model_type`; ValueError in one line naming it otherwise (a text tower's
    outer type is accepted where config.json is read, `config.text_tower_dict`)."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(f"config field 'model_type': unsupported '{model_type}', supported: "
                         f"{SUPPORTED_MODEL_TYPES}") from None
