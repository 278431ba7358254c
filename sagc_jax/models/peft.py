"""LoRA adapters as a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`)
that `peft.PeftModel.from_pretrained(transformers_base, dir)` loads onto the HF base model.

Key names and layout are PEFT's for a CausalLM: `base_model.model.model.layers.{i}.self_attn.
q_proj.lora_A.weight` [r, in] and `...lora_B.weight` [out, r] (torch Linear layout, [out, in]),
so PEFT's x @ A^T @ B^T * (lora_alpha / r) is our x @ A @ B * (alpha / r).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.hf import _to_host
from sagc_jax.models.lora import A_SUFFIX, B_SUFFIX


class NoAdaptersError(ValueError):
    """A PEFT export was asked of a policy that has no LoRA adapters (bad input: exit 2)."""


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_MODULE = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
           "v_proj": "self_attn.v_proj", "o_proj": "self_attn.o_proj",
           "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}


def adapter_config(cfg: ModelConfig, base_model: str | None) -> dict[str, Any]:
    """PEFT's LoraConfig fields for `cfg`'s adapters (dropout 0, no bias, plain scaling)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
        "target_modules": sorted(cfg.lora_targets), "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
        "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
    }


def save_peft_adapter(model: Any, path: str | os.PathLike, *,
                      base_model: str | None = None) -> None:
    """Writes `model`'s adapters (float32) as a PEFT adapter directory at `path`.

    `base_model` is recorded as `base_model_name_or_path` (the HF dir the adapters go onto).
    Sharded adapters are gathered; with several processes only process 0 writes.
    Raises NoAdaptersError when the model has no adapters.
    """
    cfg: ModelConfig = model.cfg
    if not cfg.lora_rank:
        raise NoAdaptersError("--format peft: the policy has no LoRA adapters (model.lora "
                              "unset); export merged weights instead")
    layers = nnx.to_pure_dict(nnx.state(model.layers, nnx.LoRAParam))
    tensors: dict[str, np.ndarray] = {}
    for t in cfg.lora_targets:
        a, b = _to_host(layers[t + A_SUFFIX]), _to_host(layers[t + B_SUFFIX])
        for i in range(cfg.num_layers):
            key = f"base_model.model.model.layers.{i}.{_MODULE[t]}"
            tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(a[i].T)  # [r, in]
            tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(b[i].T)  # [out, r]
    if jax.process_index() != 0:
        return
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ADAPTER_CONFIG), "w") as f:
        json.dump(adapter_config(cfg, base_model), f, indent=2)
    save_file(tensors, os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
