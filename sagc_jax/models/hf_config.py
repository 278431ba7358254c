"""transformers' config.json <-> `ModelConfig`, for every family (4.x and 5.x layouts).

`from_hf_dict` reads a config.json (a multimodal one: its text tower, `text_tower_dict`) and
rejects anything we would silently get wrong, naming the field; `to_hf_dict` writes the
config.json transformers loads our export with.
"""

from __future__ import annotations

import warnings
from typing import Any

from sagc_jax.models.config import (
    SUPPORTED_ACTIVATIONS,
    SUPPORTED_ROPE_TYPES,
    ModelConfig,
    ModelConfigError,
)
from sagc_jax.models.families import FULL, SLIDING, TEXT_TOWERS, Family, family

# Fields that change the math of a forward pass in ways we do not implement (the softcaps only
# outside the families that read them, see `_check_unsupported`).
_SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")
_REFUSED_HF_FIELDS = (
    "logits_scaling", "embedding_multiplier",
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
    # Gemma 3 text (read by `_gemma3_from_hf`; the softcaps are refused for other families).
    "hidden_activation", "query_pre_attn_scalar", "rope_local_base_freq", "sliding_window_pattern",
    "use_bidirectional_attention", "cache_implementation", "_sliding_window_pattern", *_SOFTCAPS,
}



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


def _hidden_act(d: dict[str, Any]) -> str:
    """Gemma's config.json names the activation `hidden_activation`, the others `hidden_act`."""
    return d.get("hidden_activation") or d.get("hidden_act") or "silu"


def _check_unsupported(d: dict[str, Any], fam: Family) -> None:
    act = _hidden_act(d)
    if act not in SUPPORTED_ACTIVATIONS:
        key = "hidden_activation" if d.get("hidden_activation") else "hidden_act"
        raise ValueError(f"config field '{key}': only {SUPPORTED_ACTIVATIONS} are supported, "
                         f"got {act!r}")
    if d.get("use_sliding_window") and not fam.layer_types:
        raise ValueError(f"config field 'use_sliding_window': sliding-window attention is not "
                         f"supported for model_type {fam.model_type}")
    if d.get("use_bidirectional_attention"):
        raise ValueError("config field 'use_bidirectional_attention': only causal attention "
                         "is supported")
    if d.get("quantization_config"):
        raise ValueError("config field 'quantization_config': quantized checkpoints are not "
                         "supported")
    refused = _REFUSED_HF_FIELDS + (() if fam.layer_types else _SOFTCAPS)
    for k in refused:
        if d.get(k) not in (None, False, 0, {}, [], 1.0) and k in d:
            raise ValueError(f"config field '{k}' (= {d[k]!r}) is not supported by the "
                             f"{d.get('model_type')} loader")
    unknown = sorted(k for k, v in d.items()
                     if k not in _IGNORED_HF_FIELDS and v not in (None, False, 0, {}, []))
    if unknown:
        # Fields we have never seen: most are bookkeeping, so say so instead of failing.
        warnings.warn(f"HF config fields ignored by the {d.get('model_type')} loader: {unknown}",
                      stacklevel=3)


def _gemma3_from_hf(d: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Gemma 3's per-checkpoint fields: the layer pattern (5.x `layer_types`, else 4.x
    `sliding_window_pattern`: every n-th layer global), the window, the two RoPE settings (5.x
    `rope_parameters` keyed by layer type, else 4.x `rope_theta` / `rope_scaling` for global
    layers and `rope_local_base_freq` for local ones), the attention scalar and the softcaps."""
    types = d.get("layer_types")
    if not types:
        n = int(d.get("sliding_window_pattern") or 6)
        types = [SLIDING if (i + 1) % n else FULL for i in range(num_layers)]
    rope = d.get("rope_parameters") or {}
    if isinstance(rope, dict) and (FULL in rope or SLIDING in rope):
        global_rope = rope.get(FULL) or {"rope_type": "default", "rope_theta": 1e6}
        local = dict(rope.get(SLIDING) or {"rope_type": "default", "rope_theta": 1e4})
        theta, rope_type, scaling = _rope_from_hf({"rope_parameters": global_rope})
    else:
        theta, rope_type, scaling = _rope_from_hf({"rope_theta": 1e6, **d})
        local = {"rope_type": "default", "rope_theta": d.get("rope_local_base_freq", 1e4)}
    if (local.get("rope_type") or "default") != "default" or set(local) - {"rope_type",
                                                                          "rope_theta"}:
        raise ValueError(f"config field 'rope_parameters.{SLIDING}': only default RoPE is "
                         f"supported on sliding layers, got {local}")
    if d.get("attn_logit_softcapping") is not None:
        # transformers' Gemma3Attention stores it but never passes it to the attention (5.x), so
        # the checkpoint's reference behaviour is no cap; no released Gemma 3 config sets it.
        warnings.warn(f"config field 'attn_logit_softcapping' (= {d['attn_logit_softcapping']}) "
                      "is ignored, as transformers' Gemma 3 ignores it", stacklevel=3)
    final_cap = d.get("final_logit_softcapping")
    return dict(layer_types=tuple(types), sliding_window=d.get("sliding_window"),
                rope_theta=theta, rope_type=rope_type, rope_scaling=scaling,
                rope_local_theta=float(local.get("rope_theta", 1e4)),
                query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256),
                final_logit_softcapping=None if final_cap is None else float(final_cap))


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


def text_tower_dict(d: Any) -> Any:
    """A multimodal config.json (`TEXT_TOWERS`, e.g. model_type gemma3) as its text model's
    config.json: the nested text config over the text class's defaults; anything else as is."""
    tower = TEXT_TOWERS.get(d.get("model_type")) if isinstance(d, dict) else None
    if tower is None:
        return d
    text = d.get(tower.config_key)
    if not isinstance(text, dict):
        raise ModelConfigError(f"config field '{tower.config_key}': a {tower.model_type} "
                               f"config needs its text model's config there, got {text!r:.60}")
    return {**dict(tower.text_defaults), **text, "model_type": tower.text_model_type}


def from_hf_dict(d: dict[str, Any], *, dtype: str | None = None,
                 param_dtype: str | None = None) -> ModelConfig:
    """Builds a ModelConfig from an HF config.json dict (a multimodal one: its text tower);
    errors name the offending field."""
    d = text_tower_dict(d)
    check_hf_fields(d)
    model_type = d.get("model_type")
    fam = family(model_type)  # one line naming an unsupported model_type
    _check_unsupported(d, fam)
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads"):
        if k not in d:
            raise ValueError(f"config field '{k}' is missing")
    layers = int(d["num_hidden_layers"])
    if fam.layer_types:
        extra = _gemma3_from_hf(d, layers)
    else:
        theta, rope_type, scaling = _rope_from_hf(d)
        extra = dict(rope_theta=theta, rope_type=rope_type, rope_scaling=scaling)
    heads = int(d["num_attention_heads"])
    attention_bias = bool(d.get("attention_bias", False))
    is_qwen2 = fam.bias_rule == "qwen2"
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(d["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", fam.tied_by_default)),
        # Qwen2 always has q/k/v bias and no o bias; elsewhere attention_bias covers q/k/v/o.
        qkv_bias=True if is_qwen2 else attention_bias,
        o_bias=False if is_qwen2 else attention_bias,
        mlp_bias=bool(d.get("mlp_bias", False)),
        hidden_act=_hidden_act(d),
        dtype=dtype or "float32",
        param_dtype=param_dtype or "float32",
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
        pad_token_id=d.get("pad_token_id"),
        **extra,
    )


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json transformers needs to load our weights (5.x `rope_parameters` layout,
    plus `rope_theta` for 4.x readers)."""
    fam = cfg.family
    rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **cfg.rope_params}
    d: dict[str, Any] = {
        "architectures": [fam.hf_architecture],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
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
    if fam.bias_rule == "qwen2":
        if not cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:
            raise ValueError("qwen2 export: needs qkv_bias=True, o_bias=False, mlp_bias=False")
        d["use_sliding_window"] = False
        return d
    if cfg.qkv_bias != cfg.o_bias:
        raise ValueError(f"{cfg.model_type} export: qkv_bias and o_bias must match (HF "
                         "attention_bias)")
    d["attention_bias"] = cfg.qkv_bias
    if cfg.model_type == "llama":
        d["mlp_bias"] = cfg.mlp_bias
    elif cfg.mlp_bias:
        raise ValueError(f"{cfg.model_type} export: HF has no MLP bias for this family")
    if cfg.model_type == "qwen3":
        d["use_sliding_window"] = False
    if fam.layer_types:
        d["hidden_activation"] = d.pop("hidden_act")
        d["layer_types"] = list(cfg.layer_types) or [FULL] * cfg.num_layers
        d["sliding_window"] = cfg.sliding_window
        local = cfg.rope_theta if cfg.rope_local_theta is None else cfg.rope_local_theta
        d["rope_parameters"] = {FULL: rope, SLIDING: {"rope_type": "default",
                                                      "rope_theta": local}}
        d["rope_local_base_freq"] = local
        qpas = float(cfg.query_pre_attn_scalar or cfg.head_dim)
        d.update(query_pre_attn_scalar=int(qpas) if qpas.is_integer() else qpas,  # HF: an int
                 attn_logit_softcapping=cfg.attn_logit_softcapping,
                 final_logit_softcapping=cfg.final_logit_softcapping,
                 use_bidirectional_attention=False)
        if cfg.attn_logit_softcapping is not None:
            raise ValueError("gemma3_text export: transformers' Gemma 3 does not apply "
                             "attn_logit_softcapping, so the export would not be this model")
    elif cfg.layer_types or cfg.attn_logit_softcapping or cfg.final_logit_softcapping:
        raise ValueError(f"{cfg.model_type} export: sliding windows / softcaps are Gemma 3 "
                         "features")
    return d
