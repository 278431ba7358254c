"""Decoder models (Llama / Qwen2 family) in flax.nnx, with HF import/export."""

from sagc_jax.models.config import ModelConfig, from_hf_dict, to_hf_dict
from sagc_jax.models.hf import from_pretrained, save_pretrained
from sagc_jax.models.llama import KVCache, Transformer, init_cache

__all__ = [
    "KVCache",
    "ModelConfig",
    "Transformer",
    "from_hf_dict",
    "from_pretrained",
    "init_cache",
    "save_pretrained",
    "to_hf_dict",
]
