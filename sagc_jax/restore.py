"""Verified reads of a run's checkpoint files: what counts as damaged, and the one fallback.

Every restore recomputes the fingerprints saved with the arrays (`checksum.py`) and compares
them (`verify`). A read that fails because the files are damaged (`integrity_failure`: a
fingerprint mismatch, bytes that do not decode, a missing file) is a `CheckpointCorruptError`;
any other failure (out of memory, an I/O error, a full disk, Ctrl-C) is raised as it is.
`first_restorable` is the fallback past damaged checkpoints that the trainer's resume
(`checkpoint.RunCheckpointer.restore_latest`) and eval / export (`open_run`) share.
`checkpoint.py` re-exports these names.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import orbax.checkpoint as ocp
from flax import nnx

from sagc_jax.checksum import fingerprints, fingerprints_np, mismatches

# The checkpoint module's logger: its warnings read the same from either module.
logger = logging.getLogger("sagc_jax.checkpoint")

CHECKSUMS_SUFFIX = ".checksums.json"

_C = TypeVar("_C")
_R = TypeVar("_R")


class CheckpointMismatchError(ValueError):
    """A checkpoint exists but belongs to an incompatible configuration."""


class CheckpointCorruptError(RuntimeError):
    """A checkpoint reads back different values than were saved (names the step and array)."""


def warn(msg: str) -> None:
    """A warning from process 0 only (every process sees the same checkpoints)."""
    if jax.process_index() == 0:
        logger.warning("%s", msg)


_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
# Tensorstore status codes (the start of its ValueError texts) that mean the stored bytes are
# missing or do not decode; any other code (RESOURCE_EXHAUSTED, UNAVAILABLE, CANCELLED, ...) is
# a failure of this read, not of the files.
_TS_DAMAGED = ("DATA_LOSS", "NOT_FOUND", "OUT_OF_RANGE", "INVALID_ARGUMENT", "FAILED_PRECONDITION")
_TS_OS_ERROR = re.compile(r"os_error_code[=:'\s]+(\d+)|\[OS error (\d+)")


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while e is not None and len(out) < 16 and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return out


def integrity_failure(e: BaseException) -> bool:
    """True when `e` (or what caused it) says a checkpoint's files are damaged: a fingerprint
    mismatch, a missing file, bytes that do not decode (JSON, UTF-8, zstd, a Tensorstore
    DATA_LOSS / NOT_FOUND / OUT_OF_RANGE / INVALID_ARGUMENT / FAILED_PRECONDITION, a
    TypeError / AttributeError / IndexError raised inside Orbax while it parses a damaged
    metadata file). False for
    everything that says nothing about the files: MemoryError, an OSError other than a missing
    file (EIO, ENOSPC, EINTR, EACCES...), a Tensorstore OS error or another status code, and
    anything not an Exception (KeyboardInterrupt) — those are raised, never a fallback."""
    chain = _chain(e)
    for x in chain:
        if not isinstance(x, Exception) or isinstance(x, MemoryError):
            return False
        if isinstance(x, OSError) and not isinstance(x, _MISSING):
            return False
        text = str(x)
        m = _TS_OS_ERROR.search(text)
        if m and int(m.group(1) or m.group(2)) != errno.ENOENT:
            return False
        if isinstance(x, ValueError) and re.match(r"[A-Z_]{4,}: ", text) and not text.startswith(
                _TS_DAMAGED):
            return False  # a Tensorstore status that is not about the bytes
    return any(isinstance(x, (CheckpointCorruptError, *_MISSING, ValueError, KeyError, EOFError))
               or (isinstance(x, (TypeError, AttributeError, IndexError)) and _from_orbax(x))
               for x in chain)


def _from_orbax(e: BaseException) -> bool:
    """Raised by Orbax's own code (the innermost frame): how it fails on a metadata file that
    is valid JSON of the wrong shape (`'dict' object has no attribute 'param_name'`)."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename


@contextlib.contextmanager
def _quiet_orbax_unraisable() -> Iterator[None]:
    """While restoring: Orbax's read coroutines that fail on damaged bytes are dropped
    unawaited, and Python prints each as "Exception ignored in: <coroutine ...>" with a
    traceback and a page of TensorStore spec — for an error this module reports in one line
    anyway. Those records (and only those) are dropped; the hook is put back on exit."""
    default = sys.unraisablehook

    def hook(args: Any) -> None:
        name = getattr(getattr(args.object, "cr_code", None), "co_filename", "")
        if "orbax" not in name:
            default(args)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()  # the dropped coroutines are reported when collected: do it here
        sys.unraisablehook = default


def _unreadable(where: str, e: Exception) -> Exception:
    """`e` as a CheckpointCorruptError naming `where` if it is an integrity failure, else `e`
    itself (the caller raises it unchanged)."""
    if isinstance(e, CheckpointCorruptError) or not integrity_failure(e):
        return e
    return CheckpointCorruptError(f"{where}: unreadable ({error_line(e)})")


def error_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def verify(what: str, tree: Any, saved: list[str] | None, *, host: bool = False) -> None:
    """Raises CheckpointCorruptError if `tree`'s fingerprints differ from `saved` (None: a
    checkpoint written before fingerprints existed, not checked)."""
    if saved is None:
        return
    got = fingerprints_np(tree) if host else fingerprints(tree)
    bad = mismatches(tree, saved, got)
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        raise CheckpointCorruptError(f"{what}: checksum mismatch in {', '.join(bad[:3])}{more}")


def _checksums_file(path: Path) -> Path:
    return path.parent / f"{path.name}{CHECKSUMS_SUFFIX}"


def _pure(params: Any) -> dict:
    return nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def restore_params(path: str | Path, template: Any, step: int | None = None) -> Any:
    """Params placed like `template` (an nnx.State, of arrays or of ShapeDtypeStructs with
    shardings): saved by `RunCheckpointer.save_initial` (or any Orbax pure-dict params dir;
    `step=None`) or the `params` item of step `step` of the CheckpointManager in `path` (a
    LoRA run's steps hold only the adapters: pass `lora.checkpointed(template)`). Verified
    against the saved fingerprints; shape mismatches are errors naming the param."""
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"init.params: {path} does not exist")
    pure = restore_pure_params(path, _abstract(_pure(template)), step=step)
    out = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(out, pure)
    return out


def first_restorable(candidates: Sequence[_C], restore: Callable[[_C], _R],
                     where: Callable[[_C], str]) -> tuple[_R | None, list[tuple[_C, str]]]:
    """The one fallback of every reader of a run: the trainer's resume
    (`RunCheckpointer.restore_latest`) and eval / export (`open_run.open_checkpoint`).

    Tries `candidates` (newest first) and returns the first one's `restore` with the
    (candidate, error line) of the damaged ones tried before it, or None and all of them when
    none restores (the caller says so). Damaged means the restore raised
    `CheckpointCorruptError` (the restores turn integrity failures into it); each is reported
    (`where(candidate)`) when an older one is tried next. Anything else (another model, out of
    memory, an I/O error, Ctrl-C) is raised at once: it says nothing about the files.
    """
    bad: list[tuple[_C, str]] = []
    for i, cand in enumerate(candidates):
        try:
            with _quiet_orbax_unraisable():
                return restore(cand), bad
        except CheckpointCorruptError as e:
            bad.append((cand, error_line(e)))
            if i + 1 < len(candidates):
                warn(f"checkpoint {where(cand)} is unreadable or corrupt ({bad[-1][1]}); "
                     "falling back to the previous one")
    return None, bad


def restore_pure_params(path: str | Path, target: Any, step: int | None = None) -> Any:
    """Pure-dict params placed as `target` (ShapeDtypeStructs with shardings): from an
    `initial`-style directory (`step=None`) or the `params` item of CheckpointManager step
    `step` in directory `path` (the optimizer state and the rest are not read). Values are
    verified against the saved fingerprints (`<dir>.checksums.json`, or the step's `meta`)."""
    path = Path(path).absolute()
    if step is None:
        try:
            with _quiet_orbax_unraisable(), ocp.StandardCheckpointer() as c:
                pure = c.restore(path, target)
        except Exception as e:  # Orbax raises bare Exception for a chunk it cannot decode
            # Damage that breaks decoding (a flipped byte in a zstd chunk, a truncated file)
            # surfaces here, before any checksum can be compared.
            if not _checksums_file(path).is_file():
                raise  # not one of ours: Orbax's own message (shapes, structure) says more
            err = _unreadable(str(path), e)
            if err is e:
                raise
            raise err from None
        sums = _checksums_file(path)
        if sums.is_file():
            try:
                saved = json.loads(sums.read_text())["params"]
            except (OSError, ValueError, KeyError) as e:
                raise CheckpointCorruptError(f"{sums} is unreadable ({error_line(e)})") from None
            verify(str(path), pure, saved)
        return pure
    mngr = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False))
    try:
        with _quiet_orbax_unraisable():
            got = mngr.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    except FileNotFoundError:
        raise
    except Exception as e:  # as above: undecodable bytes fail before the checksums can
        err = _unreadable(f"checkpoint step {step} in {path}", e)
        if err is e:
            raise
        raise err from None
    finally:
        mngr.close()
    sums = (got["meta"] or {}).get("checksums") or {}
    verify(f"checkpoint step {step} in {path}: params", got["params"], sums.get("params"))
    return got["params"]
