"""XLA flags for the tests and the subprocesses they start.

The suite compiles far more than it computes (tiny models, many shapes): at LLVM -O0 XLA:CPU
compiles a tiny training run's programs in about half the time (`sagc-jax train` on the
2-layer test model: 63 s -> 38 s wall, 91 -> 49 CPU-s, identical losses). The programs' HLO and
so everything the tests assert is unchanged; only the machine code is less optimised.
"""

from __future__ import annotations

import os

from sagc_jax.fakepod import fake_device_env  # imports no jax

OPT_FLAGS = "--xla_backend_optimization_level=0"


def xla_flags(devices: int) -> str:
    """`XLA_FLAGS` for a child process with `devices` fake CPU devices: the parent's flags
    (the test defaults included) with the device count replaced."""
    flags = os.environ.get("XLA_FLAGS", OPT_FLAGS)
    return fake_device_env(devices, {"XLA_FLAGS": flags})["XLA_FLAGS"]
