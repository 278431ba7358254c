"""Decoder models (Llama / Qwen2 family) in flax.nnx, with HF import/export and GGUF import."""

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.hf import save_pretrained
from sagc_jax.models.hf_config import from_hf_dict, to_hf_dict
from sagc_jax.models.llama import KVCache, Transformer, init_cache
from sagc_jax.models.pretrained import from_pretrained

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
