"""Rotary position embeddings: default, `linear` and `llama3` frequency scalings (HF semantics),
and Gemma 3's separate base for sliding-window layers."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from sagc_jax.models.config import ModelConfig


def _default_inv(theta: float, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))


def layer_inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Per-layer inverse frequencies [num_layers, head_dim // 2] float32: sliding layers use
    default RoPE at `rope_local_theta` (Gemma 3's local base), the others `inv_frequencies`.
    Stacked so the layer scan reads each layer's row alongside its weights."""
    glob = inv_frequencies(cfg)
    local = (glob if cfg.rope_local_theta is None
             else _default_inv(cfg.rope_local_theta, cfg.head_dim).astype(np.float32))
    return np.stack([local if s else glob for s in cfg.sliding_layers])


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] float32 of the global (full-attention) layers,
    computed on the host once per config."""
    dim = cfg.head_dim
    inv = _default_inv(cfg.rope_theta, dim)
    p = cfg.rope_params
    if cfg.rope_type == "linear":
        inv = inv / float(p["factor"])
    elif cfg.rope_type == "llama3":
        factor = float(p["factor"])
        lo, hi = float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old_ctx = float(p["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old_ctx / lo, inv / factor, inv)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_ctx / hi) & ~(wavelen > old_ctx / lo)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: np.ndarray) -> jnp.ndarray:
    """Rotates x [B, T, N, D] by positions [B, T] (int); HF's rotate-half layout.

    Angles are computed in float32 whatever x's dtype, as HF does.
    """
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
