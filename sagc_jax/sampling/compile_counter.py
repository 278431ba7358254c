"""Process-wide count of XLA backend compiles, from `jax.monitoring`.

jax (checked on 0.10.2) records `/jax/core/compile/backend_compile_duration` around every
executable it builds, including ones loaded from the persistent compilation cache — so the count
is "new executables", which is what must stay 0 once the shape set is warm.
"""

from __future__ import annotations

import threading

from jax import monitoring

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_count = 0
_installed = False


def _listener(event: str, duration_secs: float, **kwargs: object) -> None:
    global _count
    if event == BACKEND_COMPILE_EVENT:
        with _lock:
            _count += 1


def install() -> None:
    """Registers the listener once (idempotent; jax has no way to list listeners)."""
    global _installed
    with _lock:
        if not _installed:
            monitoring.register_event_duration_secs_listener(_listener)
            _installed = True


def compile_count() -> int:
    """Backend compiles since the listener was installed (installs it on first use)."""
    install()
    return _count
