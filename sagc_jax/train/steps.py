"""What every compiled train step is built from, declared once for the padded and packed steps.

`train.learner.CompiledSteps` (one program per padded batch shape) and
`train.packed.PackedSteps` (programs per packed chunk size) both extend :class:`StepFields`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optax
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.rl.train_step import LossSettings


@dataclasses.dataclass
class StepFields:
    """The model graph, the optimizer, the static loss settings and the mesh with the shardings
    of the params and the optimizer state (both donated to the steps)."""

    graphdef: nnx.GraphDef
    optimizer: optax.GradientTransformation
    settings: LossSettings
    mesh: Mesh
    param_shardings: Any
    opt_shardings: Any

    @property
    def batch_ways(self) -> int:
        """Devices batch rows shard over (data x fsdp)."""
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]
