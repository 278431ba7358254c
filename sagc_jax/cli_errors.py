"""How `sagc-jax train` reports a failed run in one line: which errors are bad input (exit 2)
and which a runtime failure (1), the line for a full, read-only or removed run dir, and the
library records and hooks that would print tracebacks after that line (Orbax via absl and
asyncio, Tensorstore callbacks into a closed event loop, TensorBoard's writer thread)."""

from __future__ import annotations

import logging
import sys
from typing import Any


def input_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad config or input (exit 2); anything else is a runtime failure (1)."""
    from sagc_jax.checkpoint import CheckpointMismatchError
    from sagc_jax.config import ConfigError
    from sagc_jax.data.readers import DataError
    from sagc_jax.data.tokenizer import TokenizerError
    from sagc_jax.envs import EnvNameError
    from sagc_jax.models.config import ModelConfigError
    from sagc_jax.models.hf import ModelFileError
    from sagc_jax.rewards import RewardNameError
    from sagc_jax.runlock import RunDirLocked

    # FileNotFound / FileExists before step 1: init.params, model.path, run.resume vs run.dir.
    return (ConfigError, DataError, TokenizerError, ModelFileError, ModelConfigError,
            RewardNameError, EnvNameError, CheckpointMismatchError, RunDirLocked, FileNotFoundError,
            FileExistsError)


_DISK_FULL = ("No space left on device", "os_error_code='28'")


def _os_errno(e: BaseException | None) -> int | None:
    """The OS error number behind `e` (its chain searched): an OSError's, or the
    `os_error_code='N'` Tensorstore puts in the text of the errors of Orbax's writes."""
    import re

    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno:
            return e.errno
        m = re.search(r"os_error_code='(\d+)'", str(e))
        if m:
            return int(m.group(1))
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _is_disk_full(e: BaseException | None) -> bool:
    """ENOSPC as an OSError, or as Tensorstore's RESOURCE_EXHAUSTED text (Orbax's writes)."""
    import errno

    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if any(m in str(e) for m in _DISK_FULL):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _is_os_error(e: BaseException | None) -> bool:
    """An OS-level write failure (read-only filesystem, a removed directory...) as Tensorstore
    reports it inside Orbax: a ValueError whose text carries `os_error_code='N'`."""
    return e is not None and "os_error_code=" in str(e)


# What a failed write of the run dir means, and what to do (by errno).
_STORAGE = {30: "read-only file system; the checkpoints written before are kept (a partial one "
                "is ignored). Make it writable and rerun the same command to resume",
            2: "a file or directory of the run was removed while it ran. Rerun the same command: "
               "it resumes from the checkpoints left, or starts again"}


def _train_error(e: BaseException, run_dir: str) -> str:
    """One line for a failed run: a full disk, a read-only or vanished run dir say what is kept;
    long messages are cut."""
    if _is_disk_full(e):
        return (f"run.dir {run_dir}: no space left on device; the checkpoints written before "
                "are kept (a partial one is ignored). Free some space and rerun the same command "
                "to resume")
    code = _os_errno(e)
    if code in _STORAGE and run_dir in str(e):  # a write of the run dir, not an input file
        return f"run.dir {run_dir}: {_STORAGE[code]}"
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 800 else f"{text[:500]} ... {text[-250:]}"


class _NoTraceback(logging.Filter):
    """For library loggers that log exceptions with their traceback (Orbax via absl): the
    exception reaches the command too, which reports it in one line, so the record keeps only
    its message — and the records of a failed write (an I/O error, a full disk in a background
    save) are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError) or _is_disk_full(exc) or any(
                m in record.getMessage() for m in _DISK_FULL) or _is_os_error(exc):
            return False
        if record.levelno >= logging.ERROR and "background save thread" in record.getMessage():
            return False  # Orbax re-raises it to the caller, which reports it
        if "cannot schedule new futures after" in record.getMessage():
            # A save abandoned by a hard stop (a second Ctrl-C): its threads fail as Python
            # exits ("... after shutdown" or "... after interpreter shutdown"), after the
            # command's one line; the next run ignores the partial step.
            return False
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def _quiet_library_tracebacks() -> None:
    """Library tracebacks that would bury the command's own one-line error: absl log records
    (`_NoTraceback`) and a full disk in a background writer thread (TensorBoard's), which
    the main thread meets too and reports."""
    import threading

    # asyncio: Orbax's write tasks that failed with the same full disk or read-only filesystem
    # are logged once more ("Task exception was never retrieved") when collected at exit.
    for name in ("absl", "asyncio"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _NoTraceback) for f in log.filters):
            log.addFilter(_NoTraceback())
    _quiet_closed_loop_callbacks()
    default = threading.excepthook
    if getattr(default, "_sagc_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not _is_disk_full(args.exc_value):
            default(args)

    hook._sagc_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _silence_abandoned_saves() -> None:
    """After a stopped or failed run's one line: a save abandoned by a signal or a failed write
    ends in Orbax's threads and coroutines as Python exits, in words that vary with the moment
    it is cut (executor shut down, event loop closed, "coroutine ... was never awaited" with
    its tracemalloc hint). The command has said what is kept, and the next run ignores the
    partial step, so those records and warnings are not printed."""
    import warnings

    for name in ("absl", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    warnings.simplefilter("ignore")


def _quiet_closed_loop_callbacks() -> None:
    """After a failed background save, Orbax closes its event loop while Tensorstore writes are
    still in flight; each one completing later calls back into the closed loop, and Python
    prints "RuntimeError: Event loop is closed" with a traceback per write (after the
    command's own one-line error). Only those are dropped."""
    default = sys.unraisablehook
    if getattr(default, "_sagc_quiet", False):
        return

    def hook(args: Any) -> None:
        if not (isinstance(args.exc_value, RuntimeError)
                and str(args.exc_value) == "Event loop is closed"):
            default(args)

    hook._sagc_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
