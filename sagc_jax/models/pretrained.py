"""One entry point for pretrained weights: an HF directory (safetensors) or a GGUF file."""

from __future__ import annotations

import json
import os

from jax.sharding import Mesh

from sagc_jax.models import gguf, hf
from sagc_jax.models.config import ModelConfig, from_hf_dict
from sagc_jax.models.llama import Transformer

__all__ = ["from_pretrained", "pretrained_config"]


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    mesh: Mesh | None = None,
) -> tuple[Transformer, ModelConfig]:
    """`(model, cfg)` from an HF checkpoint directory (`hf.from_pretrained`) or a `.gguf` file
    (`gguf.from_gguf`, dequantized to `param_dtype`); arguments as `hf.from_pretrained`."""
    if gguf.is_gguf(path):
        return gguf.from_gguf(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh)
    return hf.from_pretrained(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh)


def pretrained_config(path: str | os.PathLike[str], *, dtype: str | None = None,
                      param_dtype: str | None = None) -> ModelConfig:
    """The architecture at `path` without its weights: a directory's `config.json` or a GGUF
    file's metadata. OSError / ValueError when it cannot be read."""
    if gguf.is_gguf(path):
        return gguf.gguf_config(path, dtype=dtype, param_dtype=param_dtype)
    with open(os.path.join(os.fspath(path), hf.CONFIG_FILE), encoding="utf-8") as fh:
        return from_hf_dict(json.load(fh), dtype=dtype, param_dtype=param_dtype)
