"""XLA flags for the tests and the subprocesses they start.

The suite compiles far more than it computes (tiny models, many shapes): at LLVM -O0 XLA:CPU
compiles a tiny training run's programs in about half the time (`sagc-jax train` on the
2-layer test model: 63 s -> 38 s wall, 91 -> 49 CPU-s, identical losses). The programs' HLO and
so everything the tests assert is unchanged; only the machine code is less optimised.
"""

from __future__ import annotations

import os
import re

OPT_FLAGS = "--xla_backend_optimization_level=0"
_COUNT = "--xla_force_host_platform_device_count"


def xla_flags(devices: int) -> str:
    """`XLA_FLAGS` for a child process with `devices` fake CPU devices: the parent's flags
    (the test defaults included) with the device count replaced."""
    flags = re.sub(rf"{_COUNT}=\S*", "", os.environ.get("XLA_FLAGS", OPT_FLAGS)).split()
    return " ".join([*flags, f"{_COUNT}={devices}"])
