"""The policy a run config describes: an HF checkpoint or GGUF file (`model.path`) or a fresh
model. The one answer to "which model does this config describe": the trainer builds it
(`build_model`), eval and export restore checkpoints into it (`open_run`), the dry run sizes
it (`describe_model`, which may fall back to `model.preset`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, NamedTuple

from flax import nnx

from sagc_jax.models.config import ModelConfig, from_run_section
from sagc_jax.models.gguf import is_gguf
from sagc_jax.models.llama import Transformer
from sagc_jax.models.lora import add_lora
from sagc_jax.models.pretrained import from_pretrained, pretrained_config, resolve_model_path


def with_lora(mcfg: ModelConfig, lora: Any) -> ModelConfig:
    """`mcfg` with the adapters of a `model.lora` section (None: unchanged)."""
    if lora is None:
        return mcfg
    return dataclasses.replace(mcfg, lora_rank=lora.rank, lora_alpha=lora.alpha,
                               lora_targets=tuple(lora.targets))


def _run_options(mcfg: ModelConfig, m: Any) -> ModelConfig:
    """A pretrained architecture with the run's compute options (`model.remat`,
    `model.matmul_dtype`) from the config's `model:` section `m`."""
    return dataclasses.replace(mcfg, remat=m.remat, matmul_dtype=m.matmul_dtype)


def build_model(cfg: Any, vocab_size: int, tokenizer: Any, mesh: Any
                ) -> tuple[Transformer, ModelConfig]:
    """An HF checkpoint or GGUF file (`model.path`, weights loaded onto `mesh`) or a fresh random
    model from the `model.*` fields (seeded by `cfg.warm_start_seed`: `init.seed`, else
    `run.seed`; the tokenizer supplies vocab and special ids). With `model.lora`, fresh adapters
    (same seed) sit beside the base weights."""
    m = cfg.model
    if m.path is not None:
        model_config(cfg, vocab_size)  # config.json first: its errors name the file and field
        model, mcfg = from_pretrained(m.path, dtype=m.dtype, param_dtype=m.param_dtype, mesh=mesh)
        model.cfg = with_lora(_run_options(mcfg, m), m.lora)
        if m.lora is not None:
            add_lora(model.layers, m.lora.targets, m.lora.rank, nnx.Rngs(cfg.warm_start_seed))
        return model, model.cfg
    mcfg = model_config(cfg, vocab_size, tokenizer)
    return Transformer(mcfg, rngs=nnx.Rngs(cfg.warm_start_seed)), mcfg


def model_config(cfg: Any, vocab_size: int | None, tokenizer: Any = None) -> ModelConfig:
    """The architecture `build_model` builds for `cfg`, without weights: `model.path`'s
    `config.json` or GGUF metadata (with `model.remat`, `model.param_dtype`, `model.lora`), or
    the `model.*` fields (with `model.lora`) and `vocab_size` (special ids from `tokenizer` when
    given). OSError when the config cannot be read, ModelConfigError (naming the file and the
    field) when it is not a valid config, ValueError from GGUF metadata."""
    m = cfg.model
    if m.path is not None:
        return _path_config(m.path, m)
    if vocab_size is None:
        raise ValueError("model.tokenizer: needed for the vocabulary size of a fresh model")
    if tokenizer is None:
        return with_lora(from_run_section(m, vocab_size), m.lora)
    return with_lora(from_run_section(m, vocab_size, bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id), m.lora)


def _path_config(path: str, m: Any) -> ModelConfig:
    """The architecture at `path` with the `model` section's run options and LoRA."""
    mcfg = pretrained_config(path, dtype=m.dtype, param_dtype=m.param_dtype)
    return with_lora(_run_options(mcfg, m), m.lora)


class ModelSourceError(ValueError):
    """The architecture a config describes cannot be read here (one line naming the key)."""


class ModelSource(NamedTuple):
    """The architecture a config describes (`config`) and where it was read from (`source`:
    ``gguf PATH``, ``hf config FILE``, ``preset NAME ...`` or ``fresh (model.* fields)``)."""

    config: ModelConfig
    source: str


def describe_model(cfg: Any, vocab_size: int | None, tokenizer: Any = None) -> ModelSource:
    """`model_config` and where it came from, reading only what exists here and no weights (the
    dry run): a `model.path` without a config here (no `config.json`, no GGUF file) falls back
    to `model.preset` (a shipped architecture with the run's dtype, remat, matmul dtype and
    `model.lora`), so a config whose path is a placeholder still sizes the run it describes.
    Every failure is a ModelSourceError naming the key."""
    m = cfg.model
    path = os.fspath(m.path) if m.path is not None else None
    if path is not None:
        with contextlib.suppress(FileNotFoundError):  # else the preset, or the error below
            path = resolve_model_path(path, download=False)  # a hub id in the local HF cache
    cfg_file = os.path.join(path, "config.json") if path is not None else None
    if path is not None and is_gguf(path) and os.path.isfile(path):
        try:  # the file's metadata only: no tensor is read
            return ModelSource(_path_config(path, m), f"gguf {path}")
        except (OSError, ValueError) as e:
            raise ModelSourceError(f"model.path: {e}") from None
    if cfg_file is not None and os.path.isfile(cfg_file):
        try:
            return ModelSource(_path_config(path, m), f"hf config {cfg_file}")
        except (OSError, ValueError) as e:
            raise ModelSourceError(f"model.path: {cfg_file}: {e}") from None
    if m.preset is not None:
        from sagc_jax.models.presets import load_preset

        # `model.lora` too: without it the fallback sized full fine-tuning (AdamW state for
        # every weight), not the run the config describes.
        base = dataclasses.replace(load_preset(m.preset, dtype=m.dtype),
                                   param_dtype=m.param_dtype)
        why = f" (no config.json in {path!r})" if path is not None else ""
        return ModelSource(with_lora(_run_options(base, m), m.lora), f"preset {m.preset}{why}")
    if path is not None:
        raise ModelSourceError(f"model.path: no config.json in {path!r} (a dry run reads only "
                               "config.json; set model.path=DIR or model.preset=NAME)")
    if vocab_size is None:
        raise ModelSourceError("model.tokenizer: needed for the vocabulary size of a fresh "
                               f"model, but {m.tokenizer!r} does not exist here")
    return ModelSource(model_config(cfg, vocab_size, tokenizer), "fresh (model.* fields)")
