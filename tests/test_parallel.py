"""parallel.py: distributed start-up decisions, mesh validation, host-local <-> global arrays.

Single-process behaviour runs on the 4 fake CPU devices of conftest.py; one test starts two real
local processes (2 CPU devices each, gloo collectives) to check the multi-host helpers end to end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from xla_env import xla_flags

from sagc_jax.config import DistributedConfig, MeshConfig
from sagc_jax.parallel import (
    allgather,
    broadcast_from_main,
    detect_cluster,
    global_to_host_local,
    host_local_to_global,
    initialize_distributed,
    is_main_process,
    make_mesh,
    make_mesh_from_config,
    plan_distributed,
    process_rows,
    rows_sharding,
)

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ distributed plan


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"JAX_COORDINATOR_ADDRESS": "h:1234"}, "jax_env"),
    ({"TPU_WORKER_HOSTNAMES": "t-0"}, None),  # single-host TPU VM
    ({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3"}, "tpu_pod"),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "x"}, "tpu_pod"),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, "slurm"),
])
def test_detect_cluster(env, expected):
    assert detect_cluster(env) == expected


def test_plan_auto_single_process_and_never():
    assert plan_distributed(DistributedConfig(), {}).kwargs is None
    never = DistributedConfig(initialize="never")
    assert plan_distributed(never, {"JAX_COORDINATOR_ADDRESS": "h:1"}).kwargs is None


def test_plan_from_env_and_config():
    env = {"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    plan = plan_distributed(DistributedConfig(), env)
    assert plan.kwargs == {"coordinator_address": "h:1234", "num_processes": 2, "process_id": 1}
    # Explicit config fields win over the environment.
    cfg = DistributedConfig(coordinator_address="c:9", num_processes=4, process_id=3)
    assert plan_distributed(cfg, env).kwargs == {"coordinator_address": "c:9",
                                                 "num_processes": 4, "process_id": 3}
    # JAX_NUM_PROCESSES=1 is a single process: nothing to initialise.
    one = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "1"}
    assert plan_distributed(DistributedConfig(), one).kwargs is None


def test_plan_tpu_pod_and_always_leave_detection_to_jax():
    plan = plan_distributed(DistributedConfig(), {"TPU_WORKER_HOSTNAMES": "a,b"})
    assert plan.kwargs == {} and "tpu_pod" in plan.source
    assert plan_distributed(DistributedConfig(initialize="always"), {}).kwargs == {}


def test_plan_errors():
    with pytest.raises(ValueError, match="process_id"):
        plan_distributed(DistributedConfig(coordinator_address="h:1", num_processes=2,
                                           process_id=2), {})
    with pytest.raises(ValueError, match="coordinator"):
        plan_distributed(DistributedConfig(num_processes=2), {})
    with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
        plan_distributed(DistributedConfig(), {"JAX_COORDINATOR_ADDRESS": "h:1",
                                               "JAX_PROCESS_ID": "x"})


def test_initialize_distributed_single_process_is_a_no_op():
    assert initialize_distributed(DistributedConfig(), {}) is False
    assert initialize_distributed(DistributedConfig(initialize="never"), {}) is False
    assert jax.process_count() == 1 and is_main_process()


# ------------------------------------------------------------------ mesh


def test_make_mesh_shapes_and_errors():
    assert dict(make_mesh().shape) == {"data": 4, "fsdp": 1, "tensor": 1}
    assert dict(make_mesh(2, 2, 1).shape) == {"data": 2, "fsdp": 2, "tensor": 1}
    assert dict(make_mesh(1, -1, 2).shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    assert dict(make_mesh_from_config(MeshConfig(data=-1, fsdp=2)).shape)["data"] == 2
    with pytest.raises(ValueError, match="at most one"):
        make_mesh(-1, -1)
    with pytest.raises(ValueError, match="not divisible by 3"):
        make_mesh(-1, 3)
    with pytest.raises(ValueError, match="but there are 4 devices"):
        make_mesh(2, 1, 1)
    with pytest.raises(ValueError, match=">= 1"):
        make_mesh(0, 4)


def test_mesh_config_shape_validation():
    assert MeshConfig(data=4, fsdp=4).shape(16) == (4, 4, 1)
    assert MeshConfig(data=-1, fsdp=4).shape(16) == (4, 4, 1)
    with pytest.raises(ValueError, match="must equal the 8 devices"):
        MeshConfig(data=4, fsdp=4).shape(8)
    with pytest.raises(ValueError, match="must divide"):
        MeshConfig(data=-1, fsdp=3).shape(16)


# ------------------------------------------------------------------ arrays (single process)


def test_host_local_global_round_trip_single_process():
    mesh = make_mesh(2, 2, 1)
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    sh = rows_sharding(mesh, 2)
    g = host_local_to_global(x, sh)
    assert g.shape == (8, 3) and g.sharding == sh
    assert sorted(s.index[0].start for s in g.addressable_shards) == [0, 2, 4, 6]
    np.testing.assert_array_equal(global_to_host_local(g), x)
    assert process_rows(8) == slice(0, 8)
    assert process_rows(8, rows_sharding(mesh)) == slice(0, 8)
    np.testing.assert_array_equal(allgather(x), x)
    assert broadcast_from_main({"g": 8})["g"] == 8


def test_global_to_host_local_replicated_and_column_sharded():
    mesh = make_mesh(1, 2, 2)
    x = np.arange(4 * 6).reshape(4, 6)
    rep = jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
    np.testing.assert_array_equal(global_to_host_local(rep), x)
    both = jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp", "tensor")))
    np.testing.assert_array_equal(global_to_host_local(both), x)


# ------------------------------------------------------------------ two real processes

_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import jax
    from sagc_jax.config import DistributedConfig
    from sagc_jax.parallel import (allgather, global_to_host_local, host_local_to_global,
                                   initialize_distributed, make_mesh, process_rows,
                                   rows_sharding, broadcast_from_main, is_main_process)

    assert initialize_distributed(DistributedConfig())  # from JAX_* env vars
    pid, n = jax.process_index(), jax.process_count()
    assert n == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = make_mesh(2, 2, 1)
    sh = rows_sharding(mesh, 2)
    rows = process_rows(8, rows_sharding(mesh))
    assert rows == process_rows(8) == slice(4 * pid, 4 * pid + 4), rows
    full = np.arange(16, dtype=np.float32).reshape(8, 2)
    g = host_local_to_global(full[rows], sh)
    assert g.shape == (8, 2)
    total = float(jax.jit(lambda a: a.sum())(g))          # a cross-process reduction
    assert total == full.sum(), total
    np.testing.assert_array_equal(global_to_host_local(g), full[rows])
    np.testing.assert_array_equal(allgather(full[rows]), full)
    assert int(broadcast_from_main(np.int32(10 + pid))) == 10
    assert is_main_process() == (pid == 0)
    print("OK", pid)
""")


def test_two_local_processes_gloo(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    procs = []
    for pid in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION")}
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(2),
                   JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(pid), PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for pid, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out[-3000:]
        assert f"OK {pid}" in out
