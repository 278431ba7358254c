"""Where and how a run executes: ``run:``, ``checkpoint:``, ``mesh:`` and ``distributed:``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, model_validator

from sagc_jax.config.base import Bool, Int, Section, Str, field, rule_error
from sagc_jax.config.errors import ConfigError

__all__ = ["CheckpointConfig", "DistributedConfig", "MeshConfig", "RunConfig"]


class RunConfig(Section):
    """Run bookkeeping: output directory, length, logging, resuming."""

    section_key = "run"
    dir: Str = field("runs/tiny", "Output directory (config.yaml, metrics.jsonl, checkpoints).")
    steps: Int = field(200, "Number of GRPO training steps.", ge=1)
    seed: Int = field(0, "Global seed (params init, data order, sampling keys).")
    resume: Literal["auto", "never", "required"] = field(
        "auto",
        "auto: resume if a checkpoint exists in run.dir; never: start fresh; "
        "required: fail without a checkpoint.",
    )
    log_every: Int = field(1, "Print/log a metrics line every N steps.", ge=1)
    progress: Bool = field(True, "Show progress bars (compile warm-up, training).")
    eval_every: Int = field(0, "Evaluate every N steps; 0 = off.", ge=0)
    plots: Bool = field(True, "Write PNG plots of the run.")


def _data_size(v: int) -> int:
    if v != -1 and v < 1:
        raise rule_error("", f"must be -1 or >= 1, got {v}")
    return v


class MeshConfig(Section):
    """Device mesh with axes ('data', 'fsdp', 'tensor')."""

    section_key = "mesh"
    data: Annotated[Int, AfterValidator(_data_size)] = field(
        -1, "Data-parallel size; -1 = all remaining devices."
    )
    fsdp: Int = field(1, "Fully-sharded data-parallel size.", ge=1)
    tensor: Int = field(1, "Tensor-parallel size.", ge=1)

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """Resolve ``data=-1`` and check ``data * fsdp * tensor == num_devices``."""
        rest = self.fsdp * self.tensor
        if self.data == -1:
            if num_devices % rest:
                raise ConfigError(
                    f"mesh: fsdp * tensor = {rest} must divide the {num_devices} devices"
                )
            return (num_devices // rest, self.fsdp, self.tensor)
        if self.data * rest != num_devices:
            raise ConfigError(
                f"mesh: data * fsdp * tensor = {self.data * rest} must equal the "
                f"{num_devices} devices (use mesh.data=-1 to fill)"
            )
        return (self.data, self.fsdp, self.tensor)


class CheckpointConfig(Section):
    """Orbax checkpointing."""

    section_key = "checkpoint"
    every: Int = field(50, "Save every N steps; 0 = only at the end.", ge=0)
    keep: Int = field(3, "Checkpoints to keep.", ge=1)
    async_save: Bool = field(True, "Save in the background.")


class DistributedConfig(Section):
    """Multi-host ``jax.distributed`` initialisation."""

    section_key = "distributed"
    initialize: Literal["auto", "always", "never"] = field(
        "auto", "auto: initialise when a cluster environment is detected."
    )
    coordinator_address: Str | None = field(None, "host:port of process 0; None = auto-detect.")
    num_processes: Int | None = field(None, "Total processes; None = auto-detect.", ge=1)
    process_id: Int | None = field(None, "This process's index; None = auto-detect.", ge=0)

    @model_validator(mode="after")
    def _ids(self) -> DistributedConfig:
        n, i = self.num_processes, self.process_id
        if i is not None and n is not None and i >= n:
            raise rule_error(
                "process_id", f"must be < distributed.num_processes ({n}), got {i}"
            )
        return self
