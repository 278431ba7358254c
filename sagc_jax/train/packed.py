"""Packed train / log-prob steps jitted over the mesh, and the host loop of one update.

The pure step builders are in `rl.packed_step`; the layout is `rl.packing`'s. Shapes depend only
on the declared chunk sizes (`ShapePlan.pack_chunk_rows`), never on G or completion lengths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from sagc_jax.models.lora import trainable
from sagc_jax.models.sharding import batch_sharding, replicated
from sagc_jax.rl.packed_step import (
    CHUNK_FIELDS,
    HEAD_FIELDS,
    SEQ_BOOL,
    SEQ_FIELDS,
    SEQ_FLOAT,
    SUM_METRICS,
    make_apply_step,
    make_grad_step,
    make_logprob_step,
    zero_acc,
)
from sagc_jax.train.steps import StepFields


@dataclasses.dataclass
class PackedSteps(StepFields):
    """Jitted packed steps over a mesh and the host loop of one update.

    Chunk rows shard over data x fsdp when the chunk size divides it (else replicated);
    per-sequence arrays are replicated (small: [S, N]). Params, optimizer state and the gradient
    accumulator (to the grad steps) are donated. `seqs` (S), `completion_len` (N) and
    `num_groups` are the run's largest batch, so no shape depends on G.
    """

    num_groups: int
    seqs: int
    completion_len: int
    pack_len: int
    chunk_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        self._jit: dict[tuple, Callable] = {}
        self._compiled: dict[tuple, Callable] = {}
        self._rep = replicated(self.mesh)
        self._index = [jax.device_put(np.int32(i), self._rep) for i in range(256)]

    # ---- shardings and abstract inputs
    def chunk_sharding(self, rows: int) -> NamedSharding:
        return batch_sharding(self.mesh, 2) if rows % self.batch_ways == 0 else self._rep

    def _acc_shardings(self) -> tuple[Any, dict[str, NamedSharding]]:
        return trainable(self.param_shardings), {k: self._rep for k in SUM_METRICS}

    def _seq_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        S, N = self.seqs, self.completion_len
        dt = {**{k: jnp.float32 for k in SEQ_FLOAT}, **{k: jnp.bool_ for k in SEQ_BOOL}}
        return {k: jax.ShapeDtypeStruct((S, N) if nd == 2 else (S,), dt.get(k, jnp.int32),
                                        sharding=self._rep) for k, nd in SEQ_FIELDS.items()}

    def _chunk_spec(self, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
        sh = self.chunk_sharding(rows)
        width = {k: self.completion_len for k in HEAD_FIELDS}  # a row's cap on scored slots
        return {k: jax.ShapeDtypeStruct((rows, width.get(k, self.pack_len)), jnp.int32,
                                        sharding=sh) for k in CHUNK_FIELDS}

    # ---- jitted functions
    def _fn(self, name: str, rows: int = 0) -> Callable:
        key = (name, rows)
        if key in self._compiled:
            return self._compiled[key]
        if key not in self._jit:
            rep, acc = self._rep, self._acc_shardings()
            seq = {k: rep for k in SEQ_FIELDS}
            chunk = {k: self.chunk_sharding(rows) for k in CHUNK_FIELDS}
            ps, os_ = self.param_shardings, self.opt_shardings
            if name == "grad":
                fn = jax.jit(make_grad_step(self.graphdef, self.settings,
                                            num_groups=self.num_groups),
                             in_shardings=(ps, acc, chunk, seq, rep), out_shardings=acc,
                             donate_argnums=(1,))
            elif name in ("logp", "ent"):
                fn = jax.jit(make_logprob_step(self.graphdef, self.settings.temperature,
                                               entropy=name == "ent"),
                             in_shardings=(ps, rep, chunk, seq, rep), out_shardings=rep,
                             donate_argnums=(1,))
            elif name == "apply":
                fn = jax.jit(make_apply_step(self.optimizer, self.settings,
                                             num_groups=self.num_groups),
                             in_shardings=(ps, os_, acc, seq), out_shardings=(ps, os_, rep),
                             donate_argnums=(0, 1))
            else:
                fn = jax.jit(zero_acc, in_shardings=(ps,), out_shardings=acc)
            self._jit[key] = fn
        return self._jit[key]

    def warm_up(self, params: Any, opt_state: Any, need_logprobs: bool) -> None:
        """Compiles (ahead of time) every packed step of the declared chunk sizes."""
        acc = jax.eval_shape(zero_acc, params)
        acc = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                           acc, self._acc_shardings())
        seq, idx = self._seq_spec(), jax.ShapeDtypeStruct((), jnp.int32, sharding=self._rep)
        out = jax.ShapeDtypeStruct((self.seqs, self.completion_len), jnp.float32,
                                   sharding=self._rep)
        todo = {("zeros", 0): (params,), ("apply", 0): (params, opt_state, acc, seq)}
        for c in self.chunk_sizes:
            todo[("grad", c)] = (params, acc, self._chunk_spec(c), seq, idx)
            if need_logprobs:
                todo[("logp", c)] = (params, out, self._chunk_spec(c), seq, idx)
            if self.needs_entropy:
                todo[("ent", c)] = (params, out, self._chunk_spec(c), seq, idx)
        for key, args in todo.items():
            if key not in self._compiled:
                self._compiled[key] = self._fn(*key).lower(*args).compile()

    @property
    def needs_entropy(self) -> bool:
        """Whether updates first run an entropy pass (the full-batch entropy threshold)."""
        return self.settings.top_entropy_quantile < 1.0

    # ---- the host loop
    def to_device(self, chunks: list[dict[str, np.ndarray]], seqs: dict[str, np.ndarray]
                  ) -> tuple[list[dict[str, jax.Array]], dict[str, jax.Array]]:
        """Host chunks and per-sequence arrays -> device arrays with the steps' shardings."""
        dev_chunks = [{k: jax.device_put(c[k], self.chunk_sharding(len(c[k])))
                       for k in CHUNK_FIELDS} for c in chunks]
        zeros = np.zeros((self.seqs, self.completion_len), np.float32)
        return dev_chunks, {k: jax.device_put(np.asarray(seqs.get(k, zeros)), self._rep)
                            for k in SEQ_FIELDS}

    def logprobs(self, params: Any, chunks: list[dict[str, jax.Array]],
                 seqs: dict[str, jax.Array], entropy: bool = False) -> jax.Array:
        """Completion log-probs (or with `entropy`, token entropies) [S, N] of every packed
        sequence (0 elsewhere)."""
        out = jax.device_put(np.zeros((self.seqs, self.completion_len), np.float32), self._rep)
        name = "ent" if entropy else "logp"
        for i, c in enumerate(chunks):
            out = self._fn(name, len(c["tokens"]))(params, out, c, seqs, self._index[i])
        return out

    def update(self, params: Any, opt_state: Any, chunks: list[dict[str, jax.Array]],
               seqs: dict[str, jax.Array]) -> tuple[Any, Any, dict[str, jax.Array]]:
        """One optimizer step on the whole batch: grads accumulated over the chunks."""
        if len(chunks) > len(self._index):
            raise ValueError(f"PackedSteps.update: {len(chunks)} chunks exceed "
                             f"{len(self._index)}; declare larger chunk sizes")
        if self.needs_entropy:
            seqs = {**seqs, "entropy": self.logprobs(params, chunks, seqs, entropy=True)}
        acc = self._fn("zeros")(params)
        for i, c in enumerate(chunks):
            acc = self._fn("grad", len(c["tokens"]))(params, acc, c, seqs, self._index[i])
        return self._fn("apply")(params, opt_state, acc, seqs)
