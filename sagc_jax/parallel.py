"""Device mesh, ``jax.distributed`` start-up and host-local <-> global arrays.

Multi-host model (see docs/scale.md): one process per host, one global mesh over every device with
axes ``('data', 'fsdp', 'tensor')``. Each process owns a contiguous block of the batch rows (its
devices come consecutively in ``jax.devices()``, which :func:`make_mesh` keeps), builds that block
on the host, and :func:`host_local_to_global` stitches the blocks into one global ``jax.Array``.
:func:`global_to_host_local` is the inverse, :func:`allgather` gives every process everything
(for SAGC, which must make the same decision on every host), and :func:`is_main_process` guards
writes.

Nothing here touches a backend at import time: :func:`initialize_distributed` must run before
the first ``jax.devices()`` call of the process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

log = logging.getLogger(__name__)

__all__ = [
    "BATCH_AXES",
    "MESH_AXES",
    "DistributedPlan",
    "allgather",
    "broadcast_from_main",
    "detect_cluster",
    "global_to_host_local",
    "host_local_to_global",
    "initialize_distributed",
    "is_main_process",
    "make_mesh",
    "make_mesh_from_config",
    "plan_distributed",
    "process_rows",
    "rows_sharding",
]


# --------------------------------------------------------------------------------------------
# Mesh
# --------------------------------------------------------------------------------------------


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: list | None = None) -> Mesh:
    """Mesh over all (or the given) devices; one axis may be -1 to take the remaining devices.

    Devices keep ``jax.devices()`` order (process-major), so with ``data``/``fsdp`` outermost each
    process's devices hold a contiguous block of the batch rows (see :func:`process_rows`).
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError("mesh: at most one of data/fsdp/tensor may be -1")
    if any(s < 1 and s != -1 for s in sizes):
        raise ValueError(f"mesh: sizes must be >= 1 (or -1), got data={data}, fsdp={fsdp}, "
                         f"tensor={tensor}")
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


def rows_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Rows (axis 0) over ``data x fsdp``, other axes replicated: the batch layout."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


# --------------------------------------------------------------------------------------------
# jax.distributed
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
    """What :func:`initialize_distributed` will do: ``kwargs`` for ``jax.distributed.initialize``
    (``None`` = stay single-process) and why (``source``)."""

    kwargs: dict[str, Any] | None
    source: str


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def detect_cluster(env: Mapping[str, str] | None = None) -> str | None:
    """Name of the multi-process environment this process runs in, or ``None``.

    ``"jax_env"``: ``JAX_COORDINATOR_ADDRESS`` (+ ``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``);
    ``"tpu_pod"``: a Cloud TPU slice with more than one host (``TPU_WORKER_HOSTNAMES`` lists
    several hosts, or ``TPU_PROCESS_ADDRESSES``/``MEGASCALE_COORDINATOR_ADDRESS`` is set);
    ``"slurm"``: a SLURM job step with more than one task. A single-host TPU VM, a single SLURM
    task or a plain machine is ``None``.
    """
    env = os.environ if env is None else env
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return "jax_env"
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1 or env.get("TPU_PROCESS_ADDRESSES") or env.get(
            "MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu_pod"
    if env.get("SLURM_JOB_ID") and (_int_env(env, "SLURM_NTASKS") or 1) > 1:
        return "slurm"
    return None


def plan_distributed(dist_cfg: Any, env: Mapping[str, str] | None = None) -> DistributedPlan:
    """Decide how to call ``jax.distributed.initialize`` from the ``distributed:`` config + env.

    Explicit config fields win over ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
    ``JAX_PROCESS_ID``; whatever is still ``None`` is left to JAX's own cluster detection (Cloud
    TPU metadata, SLURM, ...). ``initialize: never`` never initialises; ``auto`` initialises only
    when an address is given or :func:`detect_cluster` finds a multi-process environment;
    ``always`` initialises unconditionally (use it where detection by environment variables is
    not possible, e.g. a TPU VM whose shell lacks ``TPU_WORKER_HOSTNAMES``).
    """
    env = os.environ if env is None else env
    mode = getattr(dist_cfg, "initialize", "auto")
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"distributed.initialize: must be auto, always or never, got {mode!r}")
    if mode == "never":
        return DistributedPlan(None, "distributed.initialize=never")
    kwargs: dict[str, Any] = {}
    addr = getattr(dist_cfg, "coordinator_address", None) or env.get("JAX_COORDINATOR_ADDRESS")
    nproc = getattr(dist_cfg, "num_processes", None)
    pid = getattr(dist_cfg, "process_id", None)
    nproc = nproc if nproc is not None else _int_env(env, "JAX_NUM_PROCESSES")
    pid = pid if pid is not None else _int_env(env, "JAX_PROCESS_ID")
    if addr:
        kwargs["coordinator_address"] = addr
    if nproc is not None:
        kwargs["num_processes"] = nproc
    if pid is not None:
        kwargs["process_id"] = pid
    if nproc is not None and pid is not None and not 0 <= pid < nproc:
        raise ValueError(f"distributed.process_id: must be in [0, {nproc}), got {pid}")
    if getattr(dist_cfg, "coordinator_address", None):
        return DistributedPlan(kwargs, "config")
    if mode == "always":
        return DistributedPlan(kwargs, "distributed.initialize=always")
    cluster = detect_cluster(env)
    if cluster is None:
        if nproc is not None and nproc > 1:
            raise ValueError(f"distributed.num_processes={nproc} but no coordinator address: set "
                             "distributed.coordinator_address or JAX_COORDINATOR_ADDRESS")
        return DistributedPlan(None, "single process (no cluster detected)")
    if cluster == "jax_env":
        if nproc == 1:
            return DistributedPlan(None, "single process (JAX_NUM_PROCESSES=1)")
        return DistributedPlan(kwargs, "env JAX_COORDINATOR_ADDRESS")
    return DistributedPlan(kwargs, f"auto-detected {cluster}")


def initialize_distributed(dist_cfg: Any, env: Mapping[str, str] | None = None) -> bool:
    """Start ``jax.distributed`` as the ``distributed:`` config section asks; True if it ran.

    Call once per process, before anything queries devices. Idempotent: returns True without a
    second call when JAX is already initialised. For multi-process CPU runs the collectives
    backend is set to gloo first (``jax_cpu_collectives_implementation``; without it cross-process
    CPU computations fail).
    """
    plan = plan_distributed(dist_cfg, env)
    if plan.kwargs is None:
        log.info("jax.distributed: not initialised (%s)", plan.source)
        return False
    if jax.distributed.is_initialized():
        return True
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, KeyError, ValueError):  # flag renamed/removed in a future JAX
        log.warning("could not set jax_cpu_collectives_implementation=gloo")
    log.info("jax.distributed.initialize(%s) [%s]", plan.kwargs, plan.source)
    jax.distributed.initialize(**plan.kwargs)
    return True


# --------------------------------------------------------------------------------------------
# Host-local <-> global arrays
# --------------------------------------------------------------------------------------------


def _local_row_ranges(sharding: Sharding, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """Distinct [start, stop) row ranges of ``shape`` held by this process's devices, sorted."""
    ranges = set()
    for dev, idx in sharding.devices_indices_map(shape).items():
        if dev.process_index != jax.process_index():
            continue
        sl = idx[0] if idx else slice(None)
        start, stop, _ = sl.indices(shape[0])
        ranges.add((start, stop))
    return sorted(ranges)


def process_rows(total_rows: int, sharding: Sharding | None = None) -> slice:
    """This process's contiguous block of ``total_rows`` batch rows.

    Without ``sharding``: equal blocks in process order (rows must divide by the process count).
    With a sharding (e.g. :func:`rows_sharding`): the rows its addressable devices hold, which
    must form one contiguous block (true for :func:`make_mesh` meshes).
    """
    n, i = jax.process_count(), jax.process_index()
    if sharding is None:
        if total_rows % n:
            raise ValueError(f"{total_rows} rows do not split evenly over {n} processes")
        per = total_rows // n
        return slice(i * per, (i + 1) * per)
    ranges = _local_row_ranges(sharding, (total_rows,))
    start, stop = ranges[0][0], max(r[1] for r in ranges)
    covered = np.zeros(stop - start, bool)
    for a, b in ranges:
        covered[a - start:b - start] = True
    if not covered.all():
        raise ValueError(f"process {i}'s rows under {sharding} are not one contiguous block: "
                         f"{ranges}")
    return slice(start, stop)


def host_local_to_global(x_local: np.ndarray, sharding: Sharding,
                         global_shape: tuple[int, ...] | None = None) -> jax.Array:
    """Global ``jax.Array`` from every process's block of rows
    (``jax.make_array_from_process_local_data``).

    ``x_local`` is this process's rows, in order (:func:`process_rows`). Without
    ``global_shape`` JAX infers it from the sharding (each process holds its own rows; dimensions
    not sharded across processes keep ``x_local``'s size). Single process: a plain
    ``device_put`` with ``sharding``.
    """
    return jax.make_array_from_process_local_data(sharding, np.asarray(x_local), global_shape)


def global_to_host_local(x: jax.Array) -> np.ndarray:
    """This process's block of a global array as numpy: the bounding box of its addressable
    shards (rows in order). A replicated array comes back whole."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    shards = x.addressable_shards
    idx = [tuple(s.indices(n)[:2] for s, n in zip(sh.index, x.shape)) for sh in shards]
    lo = [min(i[d][0] for i in idx) for d in range(x.ndim)]
    hi = [max(i[d][1] for i in idx) for d in range(x.ndim)]
    out = np.empty([h - l for l, h in zip(lo, hi)], dtype=x.dtype)
    covered = np.zeros(out.shape, bool)
    for sh, ix in zip(shards, idx):
        where = tuple(slice(a - l, b - l) for (a, b), l in zip(ix, lo))
        out[where] = np.asarray(sh.data)
        covered[where] = True
    if not covered.all():
        raise ValueError(f"this process's shards of a {x.shape} array do not form one block")
    return out


def allgather(x_local: Any) -> np.ndarray:
    """Every process's ``x_local`` concatenated along axis 0 in process order (tiled), as numpy.

    Single process: ``x_local`` itself. Works on pytrees too (each leaf gathered).
    """
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, x_local)
    from jax.experimental import multihost_utils

    out = multihost_utils.process_allgather(x_local, tiled=True)
    return jax.tree.map(np.asarray, out)


def broadcast_from_main(x: Any) -> Any:
    """Process 0's value of ``x`` (a pytree of arrays/scalars) on every process.

    Use for decisions that must agree across hosts but depend on host-local measurements, e.g.
    SAGC's next group size under ``sagc.timing: measured`` (each host's wall clock differs).
    """
    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(x)
