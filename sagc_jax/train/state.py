"""The run's state (`RunState`): params, optimizer state, KL reference, step, SAGC state and
data position, the single source of truth and the checkpoint.

Compiled steps donate `params` and `opt_state` and return new ones, so the state is replaced
(never mutated) by every update; the sampler is handed `state.params` on every call.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from sagc_jax.models.sharding import opt_state_shardings, replicated


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["params", "opt_state", "ref_params", "sagc", "data"],
                   meta_fields=["step"])
@dataclasses.dataclass(frozen=True)
class RunState:
    """The run's whole state: what a step reads and returns, and what a checkpoint holds.

    params: nnx.State of the policy (sharded by the model's rules); opt_state: the optax state
    of `lora.trainable(params)` (sharded like them, scalars replicated); ref_params: the frozen
    KL reference (`algo.beta > 0` without LoRA), else None (with LoRA the reference is the
    base with its adapters off: no copy); step: GRPO steps done, advanced only by
    `Learner.update`; sagc: the controller's state pytree (a copy: the policy's own is
    updated in place); data: the prompt iterators' positions (`PromptStream.get_state`).
    Frozen: a step returns a new one (`dataclasses.replace`), the compiled steps donate the
    old params and optimizer state.
    """

    params: Any
    opt_state: Any
    ref_params: Any = None
    sagc: Any = None
    data: Any = None
    step: int = 0

    def param_bytes(self) -> int:
        """Bytes of one copy of the params."""
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.params))


def init_opt_state(optimizer: optax.GradientTransformation, params: Any,
                   mesh: Mesh) -> tuple[Any, Any]:
    """(optimizer state placed like `params`, its shardings); non-param leaves replicated.

    The shardings are explicit (`opt_state_shardings`): a plain `jit(optimizer.init)` leaves
    Adam's `zeros_like(param)` on one device, and the AdamW state was replicated, not sharded
    over fsdp / tensor like the params.
    """
    p_shard = jax.tree.map(
        lambda x: x.sharding if isinstance(x.sharding, NamedSharding) else replicated(mesh),
        params)
    shard = opt_state_shardings(optimizer, jax.eval_shape(optimizer.init, params), p_shard, mesh)
    return jax.jit(optimizer.init, out_shardings=shard)(params), shard


def copy_params(params: Any) -> Any:
    """A copy that survives donation of `params` (the frozen KL reference)."""
    return jax.tree.map(lambda x: x.copy(), params)
