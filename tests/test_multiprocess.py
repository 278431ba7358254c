"""Multi-controller training: 2 local processes x 2 CPU devices == 1 process x 4 devices.

Both runs use `data.shards=2`, so they see the same global prompts in the same order; the
sampler's per-row keys depend only on the global row index, so the rollouts are the same too.
What may differ is the order of floating-point reductions (gloo all-reduces across processes vs
in-process ones), hence a tolerance on the params; G decisions (`sagc.timing: model`) and the
reward sequence must be identical.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import jax
import numpy as np
import orbax.checkpoint as ocp
from xla_env import xla_flags

from sagc_jax.metrics import read_jsonl

ROOT = Path(__file__).resolve().parent.parent

# Params of the 2-process run must match the 1-process run within this (absolute, per element,
# f32 params of O(0.1)): only reduction order differs.
PARAMS_ATOL = 1e-5
TIMEOUT_S = 300  # all three workers together; they need ~2 minutes on 2 busy cores

COMMON = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=arith_short", "data.task_max_steps=3",
    "data.prompts_per_step=4", "data.shards=2", "sagc.group_sizes=[2,4]",
    "sagc.initial_group_size=4", "sagc.warmup_steps=1", "sagc.timing=model",
    "sagc.straggler=group_ratio",  # G moves
    "sampling.max_new_tokens=32", "sampling.prompt_buckets=[16]", "sampling.decode_chunk=8",
    "init.sft_steps=4", "init.sft_batch_size=8", "optim.lr=1e-3", "optim.warmup_steps=0",
    "checkpoint.every=0", "run.progress=false", "run.plots=false", "run.steps=3",
    "mesh.data=-1",
    # A random tiny model rarely earns the exact-answer reward: the overlong shaping (a length
    # penalty) gives every step a non-zero learning signal, so the params really move.
    "algo.overlong_buffer=24",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION", "JAX_COORDINATOR", "JAX_NUM_PROCESSES",
                                "JAX_PROCESS_ID"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices),
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return env


def _kill_group(p: subprocess.Popen) -> None:
    """Kills a worker's whole process group (it may have spawned helpers)."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def _launch(run_dir: Path, *, processes: int, devices: int,
            log_dir: Path) -> list[tuple[subprocess.Popen, IO[str]]]:
    """Starts `sagc-jax train` as `processes` local processes, each in its own session (process
    group) with its output in a log file."""
    cmd = [sys.executable, "-m", "sagc_jax.cli", "train", *COMMON, f"run.dir={run_dir}"]
    if processes > 1:
        cmd += ["distributed.initialize=always",
                f"distributed.coordinator_address=127.0.0.1:{_free_port()}",
                f"distributed.num_processes={processes}"]
    out = []
    for pid in range(processes):
        log = open(log_dir / f"{run_dir.name}.{pid}.log", "w+")  # noqa: SIM115
        extra = [f"distributed.process_id={pid}"] if processes > 1 else []
        try:
            p = subprocess.Popen(cmd + extra, env=_env(devices), cwd=ROOT, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            log.close()
            raise
        out.append((p, log))
    return out


def _wait_all(runs: list[tuple[subprocess.Popen, IO[str]]], timeout_s: float) -> None:
    """Waits for every worker; stops early when one fails (its peers would block in a
    collective). Raises with the logs of failed or timed-out workers."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p, _ in runs):
        if any(p.poll() not in (None, 0) for p, _ in runs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    failed = []
    for p, log in runs:
        rc = p.poll()
        if rc != 0:
            log.seek(0)
            failed.append(f"{' '.join(p.args[-2:])}: rc={rc}\n{log.read()[-4000:]}")
    assert not failed, "\n\n".join(failed)


def _final_params(run_dir: Path) -> tuple[int, dict]:
    """(latest step, params) on one local device: the 2-process run's checkpoint names devices
    this process does not have, so the target sharding is given explicitly."""
    step = ocp.CheckpointManager(run_dir / "checkpoints").latest_step()
    path = run_dir / "checkpoints" / str(step) / "params"
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as c:
        meta = c.metadata(path)
        meta = getattr(meta, "item_metadata", meta)
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta)
        return step, c.restore(path, target)


def test_two_processes_match_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    runs = []
    try:
        # Concurrently: compiling is mostly single-threaded, so this nearly halves the wall time.
        runs += _launch(one, processes=1, devices=4, log_dir=tmp_path)
        runs += _launch(two, processes=2, devices=2, log_dir=tmp_path)
        _wait_all(runs, TIMEOUT_S)
    finally:
        for p, log in runs:
            _kill_group(p)
            log.close()

    m1, m2 = read_jsonl(one / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl")
    assert [r["step"] for r in m2] == [1, 2, 3]
    assert [r["group_size"] for r in m2] == [r["group_size"] for r in m1]
    assert [r["reward_mean"] for r in m2] == [r["reward_mean"] for r in m1]
    for key in ("shaped_reward_mean", "rows", "prompts", "len_max", "decode_steps",
                "padding_waste", "kept_groups", "compiles"):
        assert [r[key] for r in m2] == [r[key] for r in m1], key
    assert all(r["compiles"] == 0 for r in m2), [r["compiles"] for r in m2]
    assert any(abs(r["loss"]) > 0 for r in m1)  # the comparison is not vacuous
    np.testing.assert_allclose([r["loss"] for r in m2], [r["loss"] for r in m1], atol=1e-5)

    s1, p1 = _final_params(one)
    s2, p2 = _final_params(two)
    assert s1 == s2 == 3
    flat1 = dict(_leaves(p1))
    flat2 = dict(_leaves(p2))
    assert flat1.keys() == flat2.keys()
    for k in flat1:
        np.testing.assert_allclose(flat2[k], flat1[k], atol=PARAMS_ATOL, rtol=0, err_msg=k)


def _leaves(tree: dict, prefix: str = ""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", np.asarray(v)
