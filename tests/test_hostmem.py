"""The CLI's host-memory policy (`sagc_jax.hostmem`): after it, a freed large buffer's pages are
reused without faulting them in again; without it, glibc unmaps and refaults them. Each case runs
in its own process (the policy is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sagc_jax.hostmem import computes_on_cpu

PROBE = """
import ctypes, json, resource, sys, threading
from sagc_jax.hostmem import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
SIZE = 64 * 2**20

faults = []
def work():  # on a worker thread, as XLA's temporaries are
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        p = libc.malloc(SIZE)
        ctypes.memset(p, 1, SIZE)  # touch every page
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        libc.free(p)
t = threading.Thread(target=work); t.start(); t.join()
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_memory_is_reused_without_page_faults():
    pages = 64 * 2**20 // 4096
    kept, default = _probe("keep"), _probe("default")
    assert kept["applied"] is True
    assert kept["faults"][0] > pages // 2  # the first touch faults the pages in
    assert max(kept["faults"][1:]) < pages // 20  # then they are reused
    assert min(default["faults"][1:]) > pages // 2  # glibc's default: unmapped and refaulted


def test_computes_on_cpu_follows_jax_platforms(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert computes_on_cpu()
    monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
    assert not computes_on_cpu()
