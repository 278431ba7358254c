"""Sharding rules as data: param path -> logical axes, logical axis -> mesh axis.

Change the tables, not the code, to shard a family differently. A dimension whose size does not
divide the mesh axis is replicated instead (e.g. an odd vocabulary, or 1 kv head on tensor=4):
GSPMD keeps the math right either way, and a load never fails on a shape quirk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sagc_jax.models.lora import A_SUFFIX, B_SUFFIX, LORA_TARGETS

# Logical axes of each parameter of models/llama.py (path joined with '.').
LLAMA_PARAM_AXES: Mapping[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": (None,),
    "layers.attn_norm": ("layers", None),
    "layers.mlp_norm": ("layers", None),
    "layers.q_norm": ("layers", None),
    "layers.k_norm": ("layers", None),
    "layers.post_attn_norm": ("layers", None),
    "layers.post_mlp_norm": ("layers", None),
    "layers.q_proj": ("layers", "embed", "q_heads"),
    "layers.k_proj": ("layers", "embed", "kv_heads"),
    "layers.v_proj": ("layers", "embed", "kv_heads"),
    "layers.o_proj": ("layers", "q_heads", "embed"),
    "layers.q_bias": ("layers", "q_heads"),
    "layers.k_bias": ("layers", "kv_heads"),
    "layers.v_bias": ("layers", "kv_heads"),
    "layers.o_bias": ("layers", None),
    "layers.gate_proj": ("layers", "embed", "mlp"),
    "layers.up_proj": ("layers", "embed", "mlp"),
    "layers.down_proj": ("layers", "mlp", "embed"),
    "layers.gate_bias": ("layers", "mlp"),
    "layers.up_bias": ("layers", "mlp"),
    "layers.down_bias": ("layers", None),
}
# LoRA adapters (models/lora.py): A [L, in, r] is sharded like its weight's input dim, B
# [L, r, out] like its output dim, the rank replicated; x @ A then needs no extra gather.
LLAMA_PARAM_AXES = {
    **LLAMA_PARAM_AXES,
    **{f"layers.{t}{A_SUFFIX}": (*LLAMA_PARAM_AXES[f"layers.{t}"][:2], None)
       for t in LORA_TARGETS},
    **{f"layers.{t}{B_SUFFIX}": ("layers", None, LLAMA_PARAM_AXES[f"layers.{t}"][2])
       for t in LORA_TARGETS},
}

# FSDP shards the model dimension; tensor parallelism shards heads, MLP and vocabulary.
LOGICAL_TO_MESH: Mapping[str, str | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
}

BATCH_AXES = ("data", "fsdp")


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh,
             param_axes: Mapping[str, tuple[str | None, ...]] = LLAMA_PARAM_AXES,
             logical_to_mesh: Mapping[str, str | None] = LOGICAL_TO_MESH) -> PartitionSpec:
    """PartitionSpec for one parameter; unknown paths are an error (a new param needs a rule)."""
    if path not in param_axes:
        raise KeyError(f"no sharding rule for parameter '{path}'")
    axes = param_axes[path]
    if len(axes) != len(shape):
        raise ValueError(f"sharding rule for '{path}' has {len(axes)} axes, "
                         f"param has shape {shape}")
    out = []
    for logical, size in zip(axes, shape):
        mesh_axis = logical_to_mesh.get(logical) if logical else None
        if mesh_axis is not None and (mesh.shape[mesh_axis] == 1 or size % mesh.shape[mesh_axis]):
            mesh_axis = None
        out.append(mesh_axis)
    return PartitionSpec(*out)


def _path_str(path: tuple) -> str:
    names = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
    if names and names[-1] == "value":  # nnx.Variable leaf inside an nnx.State
        names = names[:-1]
    return ".".join(names)


def state_shardings(state, mesh: Mesh, **rules) -> object:
    """NamedShardings for every leaf of an nnx.State / pure dict of params (same structure)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, spec_for(_path_str(path), tuple(x.shape), mesh,
                                                     **rules)),
        state)


def opt_state_shardings(optimizer: optax.GradientTransformation, opt_state: Any,
                        param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings of an optax state: each per-parameter tree in it (Adam's mu and nu, ...) takes
    the parameters' shardings, every other leaf (step counts) is replicated.

    Pass them as ``out_shardings`` of ``jax.jit(optimizer.init)``: left to itself, XLA puts
    ``zeros_like(param)`` on one device (its output does not depend on the input's sharding),
    so AdamW state would not be sharded over ``fsdp`` / ``tensor`` at all.
    ``opt_state`` may be abstract (``jax.eval_shape(optimizer.init, params)``).
    """
    return optax.tree_map_params(optimizer, lambda _, s: s, opt_state, param_shardings,
                                 transform_non_params=lambda _: replicated(mesh))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rows over data x fsdp, everything else replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
