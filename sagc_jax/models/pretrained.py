"""One entry point for pretrained weights: an HF directory (safetensors) or a GGUF file."""

from __future__ import annotations

import json
import os
import re

from jax.sharding import Mesh

from sagc_jax.models import gguf, hf
from sagc_jax.models.config import ModelConfig, ModelConfigError
from sagc_jax.models.hf_config import from_hf_dict
from sagc_jax.models.llama import Transformer

__all__ = ["from_pretrained", "pretrained_config", "resolve_model_path"]

#: A Hugging Face hub id as transformers accepts one: `name` or `owner/name`.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
#: What a causal LM needs from a hub repo (weights, configs, tokenizer, chat template).
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def resolve_model_path(path: str | os.PathLike[str], *, download: bool = True) -> str:
    """`model.path` as a local path: itself when it exists here; otherwise a hub id
    (`google/gemma-3-1b-it`) resolved as transformers resolves it — the local Hugging Face
    cache, or a download when the network is allowed (`sagc-jax` sets `HF_HUB_OFFLINE=1`
    unless the user set it) and `download` (the dry run passes False: it reads only what is
    here). FileNotFoundError (one line naming the id) when it is neither."""
    p = os.fspath(path)
    if os.path.exists(p) or not _HUB_ID.fullmatch(p) or p.endswith(".gguf"):
        return p
    from huggingface_hub import constants, snapshot_download

    try:
        return snapshot_download(p, allow_patterns=_HUB_FILES, local_files_only=not download)
    except Exception as e:  # not cached offline, unknown repo, no network: one line
        offline = constants.HF_HUB_OFFLINE or not download
        why = (f"not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
               + ("; the hub is offline (HF_HUB_OFFLINE=1): set HF_HUB_OFFLINE=0 to download "
                  "it" if constants.HF_HUB_OFFLINE else "") if offline
               else f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        raise FileNotFoundError(f"model.path: {p!r} is no local file or directory, and as a "
                                f"Hugging Face hub id: {why}") from None


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    mesh: Mesh | None = None,
) -> tuple[Transformer, ModelConfig]:
    """`(model, cfg)` from an HF checkpoint directory (`hf.from_pretrained`) or a `.gguf` file
    (`gguf.from_gguf`, dequantized to `param_dtype`); arguments as `hf.from_pretrained`."""
    path = resolve_model_path(path)
    if gguf.is_gguf(path):
        return gguf.from_gguf(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh)
    return hf.from_pretrained(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh)


def pretrained_config(path: str | os.PathLike[str], *, dtype: str | None = None,
                      param_dtype: str | None = None) -> ModelConfig:
    """The architecture at `path` without its weights: a directory's `config.json` or a GGUF
    file's metadata. OSError when it cannot be read; ModelConfigError (naming `model.path`, the
    file and the field) when `config.json` is not a valid config; ValueError from GGUF metadata."""
    path = resolve_model_path(path)
    if gguf.is_gguf(path):
        return gguf.gguf_config(path, dtype=dtype, param_dtype=param_dtype)
    cfg_file = os.path.join(os.fspath(path), hf.CONFIG_FILE)
    with open(cfg_file, encoding="utf-8") as fh:
        try:
            return from_hf_dict(json.load(fh), dtype=dtype, param_dtype=param_dtype)
        except ValueError as e:  # bad JSON, a mistyped or unsupported field
            raise ModelConfigError(f"model.path: {cfg_file}: {' '.join(str(e).split())}"
                                   ) from None
