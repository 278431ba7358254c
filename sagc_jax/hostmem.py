"""Host memory for CPU compute: keep freed memory for reuse instead of handing it back.

XLA:CPU allocates every executable run's temporaries with malloc and frees them when the run
ends; a SmolLM2-135M packed chunk gradient holds ~5 GB of them. glibc serves requests that large
from fresh `mmap`s (always, from the per-thread arenas XLA's worker threads use) and unmaps them
on free, so each call faults all its pages in again: 1.36 M minor faults a 4-row chunk, 5-40 s of
kernel time on top of ~12 s of compute, the most after a rollout has touched other memory
(benchmarks/README.md, "The packed update, four fixes"). One arena, no mmap and no trimming
keep the freed pages in the heap: after the first step a chunk faults nothing (6.2 s against
9.3-16 s).

The trainer's CLI applies this before JAX starts its threads, on hosts that compute on the CPU
only; on GPU / TPU hosts the device allocator owns the big buffers and nothing changes. The cost:
the process keeps its peak host memory for its lifetime.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import sys

# glibc <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def computes_on_cpu() -> bool:
    """Whether JAX will run on the CPU: `JAX_PLATFORMS` when set (its first entry), else no
    accelerator plugin (`jax_plugins` entry points, libtpu) is installed. Starts no backend."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    if importlib.metadata.entry_points(group="jax_plugins"):
        return False
    return importlib.util.find_spec("libtpu") is None


def keep_freed_memory() -> bool:
    """Sets glibc malloc to one arena, no mmap and no trimming for the rest of the process.

    Call before any thread allocates (threads keep the arena they first used). Returns whether
    it was applied: False off Linux or without glibc's `mallopt`.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # -1 for the trim threshold: never trim (mallopt(3)).
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
    return all(mallopt(param, value) == 1 for param, value in settings)
