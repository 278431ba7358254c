"""Shared test setup: 4 fake CPU devices, -O0 code generation (`xla_env.py`) and a persistent
compilation cache.

All must be set before jax is imported anywhere, which is why they live here.
"""

import os
import pathlib

from xla_env import OPT_FLAGS

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=4 {OPT_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import logging  # noqa: E402  (after the environment above)

import pytest  # noqa: E402


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, at most 4 (each holds a JAX runtime and its compiles;
    the suite is compile-bound and XLA:CPU compiles on one thread)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture
def sagc_log():
    """Messages of the `sagc_jax` loggers during a test, whichever handlers the CLI installed
    (it writes them to stdout and stops propagation, so caplog alone would miss them)."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    log = logging.getLogger("sagc_jax")
    handler, level = _Collect(logging.DEBUG), log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    yield messages
    log.removeHandler(handler)
    log.setLevel(level)
