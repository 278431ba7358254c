"""The policy a run config describes: an HF checkpoint or GGUF file (`model.path`) or a fresh
model."""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx

from sagc_jax.models.config import ModelConfig, from_run_section
from sagc_jax.models.llama import Transformer
from sagc_jax.models.lora import add_lora
from sagc_jax.models.pretrained import from_pretrained, pretrained_config


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
        mcfg = pretrained_config(m.path, dtype=m.dtype, param_dtype=m.param_dtype)
        return with_lora(_run_options(mcfg, m), m.lora)
    if vocab_size is None:
        raise ValueError("model.tokenizer: needed for the vocabulary size of a fresh model")
    if tokenizer is None:
        return with_lora(from_run_section(m, vocab_size), m.lora)
    return with_lora(from_run_section(m, vocab_size, bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id), m.lora)
