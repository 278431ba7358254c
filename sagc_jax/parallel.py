"""Device mesh creation (axes data, fsdp, tensor)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "fsdp", "tensor")


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: list | None = None) -> Mesh:
    """Mesh over all (or the given) devices; one axis may be -1 to take the remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError("mesh: at most one of data/fsdp/tensor may be -1")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"mesh: {len(devices)} devices not divisible by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh: data*fsdp*tensor = {int(np.prod(sizes))} but there are "
                         f"{len(devices)} devices")
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def make_mesh_from_config(mesh_cfg) -> Mesh:
    """Mesh from the `mesh:` config section (data may be -1 = the remaining devices)."""
    return make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)


def is_main_process() -> bool:
    """Only process 0 writes metrics, plots and HF exports."""
    return jax.process_index() == 0
