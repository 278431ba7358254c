"""Storage faults and signals in every phase (issue 50): short versions of
`tools/reliability/storage.py` and `signal_phases.py` (real `sagc-jax train` runs, a fault
injected at an exact moment, then rerun and compared with an uninterrupted run), and regression
tests of what they found. The long versions: `python -m tools.reliability --only storage`
/ `--only signals` (docs/results/reliability.md)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from sagc_jax import cli_errors
from sagc_jax.metrics import RunWriter, truncate_after
from sagc_jax.train import loop
from tools.reliability import signal_phases, storage
from tools.reliability.inject import run_child
from tools.reliability.kills import child_env

ROOT = Path(__file__).resolve().parent.parent


def _mount_or_skip(tmp_path: Path) -> None:
    why = storage.mount_tmpfs(tmp_path / "probe", 1 << 20)
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs here ({why}): the storage harness needs root")
    storage.unmount_all(tmp_path / "probe")


def _reference(work: Path, argv_of: Callable[[Path], list[str]]) -> tuple[Path, dict[str, str]]:
    """The uninterrupted run the cases are compared with (the harness's own command)."""
    env = child_env(work)
    ref = work / "reference"
    child = run_child(argv_of(ref), env, work / "reference.log", None, ROOT)
    assert child.code == 0, child.last_line
    return ref, env


def test_storage_faults_stop_in_one_line_and_resume_exactly(tmp_path, monkeypatch):
    """A disk filling while a checkpoint is written (it used to print Orbax's 'Event loop is
    closed' and TensorBoard's atexit tracebacks after the one-line error, or hang): exit 1, one
    line naming run.dir, and the rerun equals an uninterrupted run. (One case: three short
    runs; the long harness tries 54.)"""
    _mount_or_skip(tmp_path)
    monkeypatch.setenv("RELIABILITY_JAX_CACHE", str(ROOT / ".jax_cache" / "reliability"))
    ref, env = _reference(tmp_path, storage._argv)
    rec = storage.storage_case(0, "full-save", 0, tmp_path, ref, env)
    assert rec["problems"] == [], rec
    assert rec["exit_code"] == 1 and "run.dir" in rec["last_line"], rec
    assert rec["fired"] and rec["fired"][0]["inside"], rec  # filled during the save
    assert rec["resumed_identical"], rec


def test_a_hard_stop_during_a_checkpoint_write_resumes_exactly(tmp_path, monkeypatch):
    """SIGTERM twice (the hard stop) while a step's checkpoint is written: 143 with one line
    (Orbax's abandoned save used to log after it), and the rerun equals an uninterrupted run.
    (One case: three short runs; the long harness tries 42, every phase.)"""
    monkeypatch.setenv("RELIABILITY_JAX_CACHE", str(ROOT / ".jax_cache" / "reliability"))
    ref, env = _reference(tmp_path, signal_phases._argv)
    hard = signal_phases.signal_case(0, "save", 2, 0, tmp_path, ref, env)  # SIGTERM twice
    assert hard["problems"] == [] and hard["exit_code"] in (0, 143), hard
    assert hard["count"] == 2 and hard["resumed_identical"], hard


# ------------------------------------------------------------------ what the harnesses found
def test_the_writer_is_closed_even_when_the_checkpoint_wait_fails(tmp_path):
    """Left open, TensorBoard's atexit hook flushed into the same full disk with a traceback."""
    closed = []

    def wait() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    run = SimpleNamespace(ckpt=SimpleNamespace(wait=wait),
                          writer=SimpleNamespace(close=lambda: closed.append(1), enabled=True),
                          cfg=SimpleNamespace(run=SimpleNamespace(plots=False)))
    with pytest.raises(OSError, match="No space"):
        loop._close(run, quietly=False)
    assert closed == [1]
    loop._close(run, quietly=True)  # failing already: not raised again
    assert closed == [1, 1]


def test_truncating_metrics_on_a_full_disk_keeps_the_file(tmp_path, monkeypatch):
    """A resume drops rows past its checkpoint; with the disk still full the old in-place
    rewrite left metrics.jsonl truncated, the rows the checkpoints cover lost."""
    m = tmp_path / "metrics.jsonl"
    rows = "".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "re'
    m.write_text(rows)

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(Path, "write_text", full)
        with pytest.raises(OSError):
            truncate_after(m, 2)
    assert m.read_text() == rows
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
    truncate_after(m, 2)
    assert m.read_text() == '{"step": 1}\n{"step": 2}\n'


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_tensorboard_writer_stops_the_run_instead_of_hanging(tmp_path):
    """tensorboardX's writer thread dies on a failed write (a full disk); with its default
    10-event queue the next rows' add_scalar blocked forever: the run hung."""
    w = RunWriter(tmp_path)
    ew = w._tb.file_writer.event_writer

    def full(*a: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    ew._ev_writer.write_event = full
    ew._ev_writer.flush = full
    raised: list[OSError] = []

    def rows() -> None:
        try:
            for s in range(1, 100):
                w.write({"step": s, **{f"k{i}": float(i) for i in range(40)}})
                time.sleep(0.02)
        except OSError as e:
            raised.append(e)

    t = threading.Thread(target=rows, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "write() blocked on the dead TensorBoard writer"
    assert raised and raised[0].errno == errno.ENOSPC, raised
    w.close()  # abandoned: nothing left to flush, no second error


def test_no_save_under_a_removed_run_dir(tmp_path):
    """A save would recreate checkpoints/ under a removed run dir, without the metrics rows
    before it (steps lost on resume): every save first checks the run dir's config.yaml."""
    from sagc_jax.errors import TrainingError

    run = SimpleNamespace(hosts=SimpleNamespace(is_main=True), run_dir=tmp_path / "run")
    with pytest.raises(TrainingError, match="removed while the run was writing it"):
        loop._check_run_dir(run)
    run.run_dir.mkdir()
    (run.run_dir / "config.yaml").write_text("{}")
    loop._check_run_dir(run)


def test_missing_metrics_rows_before_the_checkpoint_are_found(tmp_path):
    w = RunWriter(tmp_path, tensorboard=False)
    assert w.missing_rows(0) == [] and w.missing_rows(2) == [1, 2]
    w.write({"step": 1})
    w.write({"step": 3})
    assert w.missing_rows(3) == [2]


def test_read_only_and_removed_run_dirs_are_one_runtime_line():
    run_dir = "/mnt/x/run"
    ro = ValueError(f'PERMISSION_DENIED: Failed to create directory: "{run_dir}/checkpoints/6.'
                    "orbax-checkpoint-tmp\": Read-only file system [os_error_code='30']")
    line = cli_errors._train_error(ro, run_dir)
    assert line.startswith(f"run.dir {run_dir}: read-only file system") and "\n" not in line
    gone = FileNotFoundError(errno.ENOENT, "No such file or directory", f"{run_dir}/m.jsonl")
    assert "removed while it ran" in cli_errors._train_error(gone, run_dir)
    assert cli_errors._os_errno(gone) == errno.ENOENT and cli_errors._os_errno(ro) == errno.EROFS
    other = FileNotFoundError(errno.ENOENT, "No such file", "/data/train.jsonl")
    assert "removed" not in cli_errors._train_error(other, run_dir)  # an input file


def test_a_save_abandoned_by_a_hard_stop_logs_nothing_after_the_line(capsys):
    """A second signal during a checkpoint write: Orbax's commit thread logged 'cannot
    schedule new futures after interpreter shutdown' (absl ERROR) after the one line."""
    import logging

    cli_errors._quiet_library_tracebacks()
    handler = logging.StreamHandler()
    log = logging.getLogger("absl")
    log.addHandler(handler)
    try:
        log.error("[thread=write_metadata_after_commits] _SignalingThread.run() raised an "
                  "exception: cannot schedule new futures after interpreter shutdown")
        log.error("something else")
    finally:
        log.removeHandler(handler)
    assert capsys.readouterr().err.splitlines() == ["something else"]


def test_closed_event_loop_callbacks_are_dropped_and_nothing_else(tmp_path):
    """After a failed background save, each Tensorstore write completing later printed
    'RuntimeError: Event loop is closed' with a traceback; other unraisables still print."""
    code = (
        "import sys; from sagc_jax import cli_errors; cli_errors._quiet_closed_loop_callbacks()\n"
        "class A:\n    def __del__(self): raise RuntimeError('Event loop is closed')\n"
        "class B:\n    def __del__(self): raise RuntimeError('something else')\n"
        "A(); B()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert "Event loop is closed" not in r.stderr
    assert "something else" in r.stderr


def test_the_pages_tables_are_the_committed_records():
    """docs/results/reliability.md's storage and signal tables are what `python -m
    tools.reliability.table` prints from the committed per-case records."""
    from tools.reliability.table import table

    page = (ROOT / "docs" / "results" / "reliability.md").read_text()
    for name, least in (("storage", 50), ("signals", 40)):
        record = ROOT / "docs" / "results" / f"reliability_{name}.jsonl"
        recs = [json.loads(ln) for ln in record.read_text().splitlines()]
        assert len(recs) >= least and all(r["problems"] == [] for r in recs), name
        assert table(record) in page, f"regenerate the {name} table: see the page"
