"""Ctrl-C / SIGTERM for a whole training run, from build to the last step.

The first signal only raises a flag: the run stops at the next safe point (`check`) — after the
current step (saving a checkpoint), after the SFT warm start is saved, between compile phases —
and says so with `Interrupted`, which the CLI turns into one line and exit code 128 + signum
(130 for Ctrl-C, 143 for SIGTERM). A second signal stops at once (the last saved checkpoint is
what remains). Outside the main thread, where handlers cannot be installed, it is inert.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from sagc_jax.errors import Interrupted

__all__ = ["StopFlag"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


class StopFlag:
    """`with StopFlag() as stop:` ... `stop.check("after step 3; ...")` at safe points."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    @property
    def set(self) -> bool:
        return self.signum is not None

    def check(self, where: str) -> None:
        """Raises `Interrupted` ("stopped by SIGINT <where>") if a signal arrived."""
        if self.signum is not None:
            raise Interrupted(self.signum, f"stopped by signal {_name(self.signum)} {where}")

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise Interrupted(signum, f"stopped at once by a second signal ({_name(signum)}); "
                              "the last saved checkpoint is kept", at_once=True)
        self.signum = signum

    def __enter__(self) -> StopFlag:
        for s in _SIGNALS:
            with contextlib.suppress(ValueError):  # not in the main thread
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(s, h)
        self._old = {}
