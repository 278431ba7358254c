"""One entry point for pretrained weights: an HF directory (safetensors) or a GGUF file."""

from __future__ import annotations

import json
import os

from jax.sharding import Mesh

from sagc_jax.models import gguf, hf
from sagc_jax.models.config import ModelConfig, ModelConfigError
from sagc_jax.models.hf_config import from_hf_dict
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
    file's metadata. OSError when it cannot be read; ModelConfigError (naming `model.path`, the
    file and the field) when `config.json` is not a valid config; ValueError from GGUF metadata."""
    if gguf.is_gguf(path):
        return gguf.gguf_config(path, dtype=dtype, param_dtype=param_dtype)
    cfg_file = os.path.join(os.fspath(path), hf.CONFIG_FILE)
    with open(cfg_file, encoding="utf-8") as fh:
        try:
            return from_hf_dict(json.load(fh), dtype=dtype, param_dtype=param_dtype)
        except ValueError as e:  # bad JSON, a mistyped or unsupported field
            raise ModelConfigError(f"model.path: {cfg_file}: {' '.join(str(e).split())}"
                                   ) from None
