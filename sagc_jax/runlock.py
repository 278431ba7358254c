"""One writer per run directory: an exclusive `fcntl.flock` on `<run.dir>/.lock`.

Two `sagc-jax train` on the same `run.dir` would interleave `metrics.jsonl` and race on
checkpoint steps. The lock is taken before anything else is written to the run dir and held for
the life of the run. `flock` locks belong to the open file, so the OS releases them when the
process exits for any reason (kill -9 included): a stale `.lock` file never blocks a rerun. The
file holds the holder's pid, for the error message only; it is never used to decide anything.

With several processes (multi-host), only process 0 takes the lock: the others write nothing but
their own checkpoint shards, under process 0's supervision.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_FILE", "RunDirLocked", "RunLock"]

LOCK_FILE = ".lock"


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory (the message names run.dir and its pid)."""


class RunLock:
    """Context manager: `with RunLock(run_dir): ...` holds the run dir's lock.

    Raises `RunDirLocked` if another process holds it, `OSError` (naming `run.dir`) if the dir
    cannot be created or the lock file cannot be opened.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, enabled: bool = True):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.enabled = enabled
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if not self.enabled or self._fd is not None:
            return self
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OSError(f"run.dir {self.run_dir} cannot be created or written: "
                          f"{e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise RunDirLocked(f"run.dir {self.run_dir} is in use by another sagc-jax run "
                               f"({who}); wait for it to finish or choose another run.dir"
                               ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        # The file stays: unlinking it would let a third process lock a fresh inode while a
        # second still waits on the old one.
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
