"""The training state: params, optimizer state and step, the single source of truth.

Compiled steps donate `params` and `opt_state` and return new ones, so the state is replaced
(never mutated) by every update; the sampler is handed `state.params` on every call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from sagc_jax.models.sharding import replicated


@dataclasses.dataclass
class TrainState:
    """params: nnx.State of the policy (sharded by the model's rules); opt_state: the optax
    state (sharded like params, scalars replicated); step: GRPO steps done."""

    params: Any
    opt_state: Any
    step: int = 0

    def param_bytes(self) -> int:
        """Bytes of one copy of the params."""
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.params))


def init_opt_state(optimizer: optax.GradientTransformation, params: Any,
                   mesh: Mesh) -> tuple[Any, Any]:
    """(optimizer state placed like `params`, its shardings); non-param leaves replicated."""
    opt_state = jax.jit(optimizer.init)(params)
    shard = jax.tree.map(
        lambda x: x.sharding if isinstance(x.sharding, NamedSharding) else replicated(mesh),
        opt_state)
    return jax.device_put(opt_state, shard), shard


def copy_params(params: Any) -> Any:
    """A copy that survives donation of `params` (the frozen KL reference)."""
    return jax.tree.map(lambda x: x.copy(), params)
