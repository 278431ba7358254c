"""Checkpoint integrity (fingerprints, fallback, moving damaged steps aside), the disk-space
pre-check and the run-dir lock. Checkpoints are written with the trainer's own `RunCheckpointer`
from a tiny model (no training), so these tests cost a few compiles of the fingerprint only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from flax import nnx

from sagc_jax import checkpoint as ckpt
from sagc_jax.checksum import fingerprints, fingerprints_np
from sagc_jax.cli import main
from sagc_jax.config import config_from_dict
from sagc_jax.data.pipeline import make_prompt_iterator
from sagc_jax.data.tokenizer import load_tokenizer
from sagc_jax.models.build import build_model
from sagc_jax.runlock import RunDirLocked, RunLock

STEPS = (1, 2)


def flip_bytes(step_dir: Path, item: str = "params", n: int = 200) -> Path:
    """Inverts `n` bytes in the middle of the item's largest data file (the values restore
    silently: Orbax checks structure, not contents). Returns the file."""
    big = max((p for p in (step_dir / item).rglob("*") if p.is_file()),
              key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + n):
        data[i] ^= 0xFF
    big.write_bytes(bytes(data))
    return big


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """checkpoints/ with `initial` and steps 1, 2 (distinct params), plus a restore template."""
    d = tmp_path_factory.mktemp("ck") / "checkpoints"
    cfg = config_from_dict({"model": {"hidden_size": 32, "intermediate_size": 64,
                                      "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}})
    tok = load_tokenizer(None)
    model, mcfg = build_model(cfg, len(tok), tok, None)
    _, params = nnx.split(model)
    opt = optax.adam(1e-3)
    it = make_prompt_iterator([{"prompt": "1+1=", "answer": "2"}], tokenizer=tok)
    saver = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    saver.save_initial(params, mcfg)
    by_step = {}
    for step in STEPS:
        p = jax.tree.map(lambda x, s=step: x + 0.01 * s, params)
        saver.save(step, ckpt.Snapshot(step, p, opt.init(p), {"q": np.full(3, step, np.float64)},
                                         it), force=True)
        by_step[step] = jax.tree.map(np.asarray, nnx.to_pure_dict(p))
    saver.wait()
    saver.close()

    def template() -> ckpt.Snapshot:
        return ckpt.Snapshot(0, params, opt.init(params), {"q": np.zeros(3)},
                               make_prompt_iterator([{"prompt": "1+1=", "answer": "2"}],
                                                    tokenizer=tok))

    return {"dir": d, "mcfg": mcfg, "template": template, "params": by_step,
            "initial": params}


def _copy(saved: dict, tmp_path: Path) -> ckpt.RunCheckpointer:
    d = tmp_path / "checkpoints"
    shutil.copytree(saved["dir"], d)
    return ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)


# ------------------------------------------------------------------------------ fingerprints


def test_fingerprints_agree_on_device_and_host_and_see_one_bit():
    rng = np.random.default_rng(0)
    tree = {"f32": rng.normal(size=(3, 5)).astype(np.float32),
            "bf16": rng.normal(size=(7,)).astype(ml_dtypes.bfloat16),
            "i32": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.array([True, False]),
            "scalar": np.float32(3.0)}
    host = fingerprints_np(tree)
    assert fingerprints(jax.tree.map(jnp.asarray, tree)) == host
    assert len(set(host)) == len(host)
    flipped = dict(tree, f32=tree["f32"].copy())
    flipped["f32"].view(np.uint32)[1, 2] ^= 1  # one bit
    # Leaves in sorted-key order (b, bf16, f32, i32, scalar): only f32's changes.
    assert [a == b for a, b in zip(fingerprints_np(flipped), host)] == [1, 1, 0, 1, 1]
    swapped = dict(tree, i32=tree["i32"][:, ::-1].copy())  # same words, other positions
    assert fingerprints_np(swapped) != host


# ------------------------------------------------------------------------------ fallback


def test_bit_flip_falls_back_and_moves_the_step_aside(saved, tmp_path, sagc_log):
    ck = _copy(saved, tmp_path)
    flip_bytes(ck.directory / "2")
    state = ck.restore_latest(saved["template"](), saved["mcfg"])
    assert state.step == 1
    got = jax.tree.map(np.asarray, nnx.to_pure_dict(state.params))
    jax.tree.map(np.testing.assert_array_equal, got, saved["params"][1])
    log = "\n".join(sagc_log)
    # A flipped value fails its checksum; a flip in a chunk's framing fails decoding (see below).
    detected = r"checkpoint step 2 in \S+: (params: checksum mismatch|unreadable \()"
    assert re.search(detected, log), log
    assert "moved" in log
    moved = [p.name for p in ck.directory.iterdir() if ckpt.CORRUPT_TAG in p.name]
    assert len(moved) == 1 and moved[0].startswith("2.corrupt-")
    assert ck.manager.all_steps() == [1]
    # The step number can be saved again, and the next restore takes it without a fallback.
    st = saved["template"]()
    assert ck.save(2, ckpt.Snapshot(2, state.params, state.opt_state, state.sagc,
                                      st.data_iter), force=True)
    ck.wait()
    seen = len(sagc_log)
    assert ck.restore_latest(saved["template"](), saved["mcfg"]).step == 2
    assert sagc_log[seen:] == []  # no fallback this time


def test_first_restorable_is_the_one_fallback(sagc_log):
    """The fallback the resume and eval / export share: damaged candidates (a
    CheckpointCorruptError) are passed over newest first, each reported when an older one is
    tried next; any other error, another model's included, is raised at once."""
    def restore(name: str) -> str:
        if name.startswith("bad"):
            raise ckpt.CheckpointCorruptError(f"{name}: checksum mismatch in w")
        if name == "oom":
            raise MemoryError("out of memory")
        if name == "other":
            raise ckpt.CheckpointMismatchError("another model")
        return name

    got, bad = ckpt.first_restorable(["bad3", "bad2", "ok1", "bad0"], restore, str.upper)
    assert got == "ok1" and [c for c, _ in bad] == ["bad3", "bad2"]
    assert sum("BAD3 is unreadable or corrupt" in m for m in sagc_log) == 1
    assert ckpt.first_restorable(["bad1", "bad0"], restore, str) == (
        None, [("bad1", "CheckpointCorruptError: bad1: checksum mismatch in w"),
               ("bad0", "CheckpointCorruptError: bad0: checksum mismatch in w")])
    for stop in ("oom", "other"):  # says nothing about the files: no fallback
        with pytest.raises((MemoryError, ckpt.CheckpointMismatchError)):
            ckpt.first_restorable(["bad1", stop, "ok0"], restore, str)


def test_corrupt_optimizer_state_falls_back(saved, tmp_path):
    ck = _copy(saved, tmp_path)
    flip_bytes(ck.directory / "2", item="opt_state")
    assert ck.restore_latest(saved["template"](), saved["mcfg"]).step == 1
    assert not (ck.directory / "2").exists()


def test_nothing_restorable_moves_nothing(saved, tmp_path):
    ck = _copy(saved, tmp_path)
    for step in STEPS:
        flip_bytes(ck.directory / str(step))
    with pytest.raises(ckpt.CheckpointCorruptError,
                       match=r"could be restored.*step 2.*(checksum|unreadable)"):
        ck.restore_latest(saved["template"](), saved["mcfg"])
    assert sorted(p.name for p in ck.directory.iterdir() if p.name.isdigit()) == ["1", "2"]


def test_corrupt_initial_params_are_refused(saved, tmp_path):
    ck = _copy(saved, tmp_path)
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.to_pure_dict(ck.restore_initial(saved["initial"])),
                 nnx.to_pure_dict(saved["initial"]))
    flip_bytes(ck.directory, item="initial")
    # Flipped values fail the checksum; flipped bytes that land in a compressed chunk's framing
    # (where they land depends on Orbax's file layout) fail decoding first. Both name the dir.
    with pytest.raises(ckpt.CheckpointCorruptError,
                       match=r"initial: (checksum mismatch|unreadable)"):
        ck.restore_initial(saved["initial"])


def truncate_data(item_dir: Path) -> None:
    """Cuts every data chunk of an Orbax item to 64 bytes, so decoding (not a checksum) fails."""
    for f in item_dir.rglob("*"):
        if f.is_file() and f.stat().st_size > 256 and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:64])


def test_undecodable_initial_params_are_refused(saved, tmp_path):
    ck = _copy(saved, tmp_path)
    truncate_data(ck.directory / "initial")
    with pytest.raises(ckpt.CheckpointCorruptError, match="initial: unreadable"):
        ck.restore_initial(saved["initial"])


def test_undecodable_step_is_one_error_and_falls_back(saved, tmp_path, sagc_log):
    ck = _copy(saved, tmp_path)
    truncate_data(ck.directory / "2" / "params")
    target = ckpt._abstract(ckpt._pure(saved["template"]().params))
    with pytest.raises(ckpt.CheckpointCorruptError,
                       match=r"checkpoint step 2 in \S+: unreadable \(\w+"):
        ckpt.restore_pure_params(ck.directory, target, step=2)
    assert ck.restore_latest(saved["template"](), saved["mcfg"]).step == 1
    assert any("checkpoint step 2" in m and ": unreadable (" in m for m in sagc_log), sagc_log


# ------------------------------------------------------------------------------ disk space


def test_space_check_counts_keep_checkpoints_and_initial(saved, tmp_path, monkeypatch):
    t = saved["template"]()
    p_bytes = ckpt.tree_bytes(t.params)
    per = p_bytes + ckpt.tree_bytes(t.opt_state)
    fresh = ckpt.RunCheckpointer(tmp_path / "fresh", every=1, keep=3)
    need, _ = fresh.bytes_needed(t.params, t.opt_state, steps=100)
    assert need == 4 * per + p_bytes  # keep + 1 in flight, plus initial/
    assert fresh.bytes_needed(t.params, t.opt_state, steps=1)[0] == 2 * per + p_bytes
    ck = _copy(saved, tmp_path)  # 2 steps and initial already on disk
    assert ck.bytes_needed(t.params, t.opt_state, steps=100)[0] == 4 * per
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9, 3 * per))
    with pytest.raises(OSError) as e:
        ck.check_space(t.params, t.opt_state, steps=100)
    msg = str(e.value)
    assert "run.dir" in msg and "checkpoint.keep=5" in msg and " 0 MiB" not in msg
    assert ckpt.format_bytes(3 * per) in msg and ckpt.format_bytes(4 * per) in msg


def test_format_bytes_never_rounds_to_zero():
    assert ckpt.format_bytes(0) == "0 B"
    assert ckpt.format_bytes(1200) == "1.17 KiB"
    assert ckpt.format_bytes(5 * 2**30) == "5 GiB"


# ------------------------------------------------------------------------------ run-dir lock


def test_lock_is_exclusive_and_names_the_holder(tmp_path):
    held = rf"run.dir {tmp_path / 'run'} .*pid {os.getpid()}"
    with RunLock(tmp_path / "run"), pytest.raises(RunDirLocked, match=held):
        RunLock(tmp_path / "run").acquire()
    RunLock(tmp_path / "run").acquire().release()  # released on exit


def test_lock_of_a_killed_process_is_released(tmp_path):
    code = ("import sys, time; from sagc_jax.runlock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run")],
                            stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLocked, match=f"pid {proc.pid}"):
            RunLock(tmp_path / "run").acquire()
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 30
    while True:  # the OS drops the lock with the process
        try:
            RunLock(tmp_path / "run").acquire().release()
            break
        except RunDirLocked:
            assert time.time() < deadline
            time.sleep(0.05)


def test_second_train_on_a_locked_run_dir_exits_2(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        assert main(["train", f"run.dir={run_dir}", "run.steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run.dir" in err and f"pid {os.getpid()}" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing else written


def test_full_disk_and_library_tracebacks_become_one_line(capsys):
    import errno
    import logging

    from sagc_jax.cli import _quiet_library_tracebacks, _train_error

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("save failed") from e
    except RuntimeError as e:
        msg = _train_error(e, "/runs/x")
    assert "\n" not in msg and "run.dir /runs/x: no space left" in msg and "resume" in msg
    # Orbax logs its background-thread failures with tracebacks (via absl): the command
    # reports them itself, so the records keep one line and I/O errors are dropped.
    _quiet_library_tracebacks()
    handler = logging.StreamHandler()  # writes to the current (captured) stderr
    log = logging.getLogger("absl")
    log.addHandler(handler)
    try:
        for exc in (OSError(errno.ENOSPC, "disk full"), ValueError("bad")):
            try:
                raise exc
            except Exception:
                log.exception("background save failed: %s", type(exc).__name__)
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.splitlines() == ["background save failed: ValueError"]


def test_nested_sagc_state_roundtrips_and_the_old_flat_layout_is_one_line(saved, tmp_path):
    """The SAGC state is one sub-state per sub-model (issue 32; typed since issue 49): it
    round-trips through a run checkpoint, stored as the nested dict (sub-model -> key) that
    checkpoints written before the state was typed hold too, so both restore into the typed
    state; a checkpoint holding the old flat state is refused in one line naming an old key
    (not a traceback, not a silent fresh start)."""
    from sagc_jax.sagc import SAGCConfig, init_state
    from sagc_jax.sagc.state import as_dict, normalize_state, with_fields

    st = saved["template"]()
    typed = with_fields(init_state(SAGCConfig(), horizon=40, seed=3), "budget",
                        queue=np.array(1.5))
    typed.cost.measured[1] = True
    nested = as_dict(typed)
    tmpl = ckpt.Snapshot(0, st.params, st.opt_state, init_state(SAGCConfig()), st.data_iter)
    for i, written in enumerate((typed, nested)):  # today's typed state, a pre-typing dict
        ck = _copy(saved, tmp_path / f"a{i}")
        assert ck.save(3, ckpt.Snapshot(3, st.params, st.opt_state, written, st.data_iter),
                       force=True)
        ck.wait()
        got = ck.restore_latest(tmpl, saved["mcfg"])
        assert got.step == 3 and sorted(got.sagc) == sorted(nested)
        back = as_dict(normalize_state(SAGCConfig(), got.sagc))
        for m, sub in nested.items():
            for k, v in sub.items():
                np.testing.assert_array_equal(got.sagc[m][k], v)
                assert got.sagc[m][k].dtype == v.dtype == back[m][k].dtype
                np.testing.assert_array_equal(back[m][k], v)
        ck.close()
    # Steps 1 and 2 of the fixture hold a flat SAGC state, as every checkpoint before issue 32.
    ck = _copy(saved, tmp_path / "b")
    old = {"queue": np.zeros(()), "risk_a": np.zeros(4), "step": np.array(2)}
    assert ck.save(3, ckpt.Snapshot(3, st.params, st.opt_state, old, st.data_iter), force=True)
    ck.wait()
    with pytest.raises(ckpt.CheckpointMismatchError) as exc:
        ck.restore_latest(tmpl, saved["mcfg"])
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("checkpoint step 3: SAGC state key 'queue' is from "
                                              "the old flat layout"), msg
    assert "issue 32" in msg
    assert [p.name for p in ck.directory.iterdir() if ckpt.CORRUPT_TAG in p.name] == []
