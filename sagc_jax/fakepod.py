"""A pod on a laptop: re-run a command in a subprocess that sees N fake CPU devices.

JAX reads ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` and ``JAX_PLATFORMS`` only when
its backend starts, so a process that has to look like a 16-chip slice is started afresh with
both set. The child is marked (``SAGC_JAX_FAKE_DEVICES=N``) so it runs the command itself
instead of spawning again. With N fake devices the dry run builds a real ``Mesh`` and can compile
the run's programs on it (``sagc_jax.compiled_memory``), which an ``AbstractMesh`` cannot.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["MARK", "fake_device_env", "in_fake_pod", "mesh_devices", "run_with_devices"]

MARK = "SAGC_JAX_FAKE_DEVICES"
_COUNT_FLAG = "--xla_force_host_platform_device_count"


def fake_device_env(n: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with ``n`` fake CPU devices and the marker set.

    An existing device-count flag in ``XLA_FLAGS`` is replaced; other XLA flags are kept.
    """
    if n < 1:
        raise ValueError(f"--devices: must be >= 1, got {n}")
    env = dict(os.environ if env is None else env)
    flags = re.sub(rf"{_COUNT_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join([*flags, f"{_COUNT_FLAG}={n}"])
    env["JAX_PLATFORMS"] = "cpu"
    env[MARK] = str(n)
    return env


def in_fake_pod(n: int | None = None, env: Mapping[str, str] | None = None) -> bool:
    """True in a child started by :func:`run_with_devices` (with ``n`` devices, if given)."""
    mark = (os.environ if env is None else env).get(MARK)
    return mark is not None and (n is None or mark == str(n))


def mesh_devices(mesh_cfg) -> int | None:
    """Devices a ``mesh:`` section asks for, or None when ``data: -1`` leaves it open."""
    if mesh_cfg.data == -1:
        return None
    return int(mesh_cfg.data * mesh_cfg.fsdp * mesh_cfg.tensor)


def run_with_devices(n: int, module: str, argv: Sequence[str]) -> int:
    """Run ``python -m module *argv`` with ``n`` fake CPU devices; its exit code.

    Output goes straight to this process's stdout/stderr.
    """
    cmd = [sys.executable, "-m", module, *argv]
    return subprocess.run(cmd, env=fake_device_env(n), check=False).returncode
