"""The compiled train steps over the mesh and the host loop of one update.

The pure step builders are in `rl.train_step`, the layout in `rl.batch` / `rl.packing`. Shapes
depend only on the declared chunk sizes (`ShapePlan.pack_chunk_rows`), S and N, never on G, the
prompt bucket or the completion lengths: one cache of compiled programs, filled by `warm_up`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from sagc_jax.hosts import Hosts
from sagc_jax.models.lora import trainable
from sagc_jax.models.sharding import batch_sharding, replicated
from sagc_jax.rl.batch import (
    CHUNK_FIELDS,
    HEAD_FIELDS,
    SEQ_BOOL,
    SEQ_FIELDS,
    SEQ_FLOAT,
    TrainBatch,
)
from sagc_jax.rl.train_step import (
    SUM_METRICS,
    LossSettings,
    make_apply_step,
    make_grad_step,
    make_logprob_step,
    zero_acc,
)
from sagc_jax.shapes import TrainLayout, train_programs

Arrays = dict[str, jax.Array]


@dataclasses.dataclass
class CompiledSteps:
    """Jitted grad / log-prob / apply steps over a mesh and the host loop of one update.

    Chunk rows and per-sequence rows shard over data x fsdp when their count divides it (else
    they are replicated; with several processes they must divide). Params, optimizer state and
    the gradient accumulator (to the grad steps) are donated. `seqs` (S), `completion_len` (N)
    and `num_groups` are the run's largest batch, so no shape depends on G.
    """

    graphdef: nnx.GraphDef
    optimizer: optax.GradientTransformation
    settings: LossSettings
    mesh: Mesh
    param_shardings: Any
    opt_shardings: Any
    num_groups: int
    seqs: int
    completion_len: int
    pack_len: int
    chunk_sizes: tuple[int, ...]
    hosts: Hosts = dataclasses.field(default_factory=Hosts)

    @classmethod
    def from_layout(cls, graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    settings: LossSettings, mesh: Mesh, param_shardings: Any, opt_shardings: Any,
                    layout: TrainLayout, hosts: Hosts | None = None) -> CompiledSteps:
        """The steps of the run's one layout (`ShapePlan.train_layout`): what the trainer and
        the dry run's compiled memory plan build."""
        return cls(graphdef, optimizer, settings, mesh, param_shardings, opt_shardings,
                   num_groups=layout.num_groups, seqs=layout.seqs,
                   completion_len=layout.completion_len, pack_len=layout.pack_len,
                   chunk_sizes=layout.chunk_sizes, hosts=hosts or Hosts())

    def __post_init__(self) -> None:
        self._jit: dict[tuple[str, int], Callable] = {}
        # Ahead-of-time executables from warm_up: a jit's own cache does not see them.
        self._compiled: dict[tuple[str, int], Callable] = {}
        self._rep = replicated(self.mesh)
        self._index: list[jax.Array] = []

    # ---- shardings and abstract inputs
    @property
    def batch_ways(self) -> int:
        """Devices batch rows shard over (data x fsdp)."""
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

    def rows_sharding(self, rows: int, ndim: int) -> NamedSharding:
        """Rows over data x fsdp when they split evenly, else replicated (correct, just not
        data-parallel)."""
        return batch_sharding(self.mesh, ndim) if rows % self.batch_ways == 0 else self._rep

    def _seq_shardings(self) -> dict[str, NamedSharding]:
        return {k: self.rows_sharding(self.seqs, nd) for k, nd in SEQ_FIELDS.items()}

    def _acc_shardings(self) -> tuple[Any, dict[str, NamedSharding]]:
        return trainable(self.param_shardings), {k: self._rep for k in SUM_METRICS}

    def _seq_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        S, N = self.seqs, self.completion_len
        dt = {**{k: jnp.float32 for k in SEQ_FLOAT}, **{k: jnp.bool_ for k in SEQ_BOOL}}
        sh = self._seq_shardings()
        return {k: jax.ShapeDtypeStruct((S, N) if nd == 2 else (S,), dt.get(k, jnp.int32),
                                        sharding=sh[k]) for k, nd in SEQ_FIELDS.items()}

    def _chunk_spec(self, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
        sh = self.rows_sharding(rows, 2)
        width = {k: self.completion_len for k in HEAD_FIELDS}  # a row's cap on scored slots
        return {k: jax.ShapeDtypeStruct((rows, width.get(k, self.pack_len)), jnp.int32,
                                        sharding=sh) for k in CHUNK_FIELDS}

    def _out_spec(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((self.seqs, self.completion_len), jnp.float32,
                                    sharding=self.rows_sharding(self.seqs, 2))

    # ---- jitted functions
    def _fn(self, name: str, rows: int = 0) -> Callable:
        """The compiled program `name` for chunks of `rows` rows: the ahead-of-time executable
        when `warm_up` made one, else a jit (compiled on first call)."""
        key = (name, rows)
        if key in self._compiled:
            return self._compiled[key]
        if key not in self._jit:
            rep, acc = self._rep, self._acc_shardings()
            seq = self._seq_shardings()
            chunk = {k: self.rows_sharding(rows, 2) for k in CHUNK_FIELDS}
            out = self.rows_sharding(self.seqs, 2)
            ps, os_ = self.param_shardings, self.opt_shardings
            if name == "grad":
                fn = jax.jit(make_grad_step(self.graphdef, self.settings,
                                            num_groups=self.num_groups),
                             in_shardings=(ps, acc, chunk, seq, rep), out_shardings=acc,
                             donate_argnums=(1,))
            elif name in ("logp", "ent"):
                fn = jax.jit(make_logprob_step(self.graphdef, self.settings.temperature,
                                               entropy=name == "ent"),
                             in_shardings=(ps, out, chunk, seq, rep), out_shardings=out,
                             donate_argnums=(1,))
            elif name == "apply":
                fn = jax.jit(make_apply_step(self.optimizer, self.settings,
                                             num_groups=self.num_groups),
                             in_shardings=(ps, os_, acc, seq), out_shardings=(ps, os_, rep),
                             donate_argnums=(0, 1))
            elif name == "out":  # zeros for a log-prob pass to fill
                shape = (self.seqs, self.completion_len)
                fn = jax.jit(lambda: jnp.zeros(shape, jnp.float32), out_shardings=out)
            else:
                fn = jax.jit(zero_acc, in_shardings=(ps,), out_shardings=acc)
            self._jit[key] = fn
        return self._jit[key]

    def warm_up(self, params: Any, opt_state: Any, need_logprobs: bool) -> None:
        """Compiles (ahead of time) every step of the declared chunk sizes."""
        acc = jax.eval_shape(zero_acc, params)
        acc = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                           acc, self._acc_shardings())
        seq, idx = self._seq_spec(), jax.ShapeDtypeStruct((), jnp.int32, sharding=self._rep)
        out = self._out_spec()
        chunk = self._chunk_spec
        inputs: dict[str, Callable[[int], tuple]] = {  # a program's abstract arguments
            "zeros": lambda c: (params,), "apply": lambda c: (params, opt_state, acc, seq),
            "out": lambda c: (), "grad": lambda c: (params, acc, chunk(c), seq, idx),
            "logp": lambda c: (params, out, chunk(c), seq, idx),
            "ent": lambda c: (params, out, chunk(c), seq, idx)}
        for key in train_programs(self.chunk_sizes, logprobs=need_logprobs,
                                  entropy=self.needs_entropy):
            if key not in self._compiled:
                self._compiled[key] = self._fn(*key).lower(*inputs[key[0]](key[1])).compile()

    @property
    def needs_entropy(self) -> bool:
        """Whether updates first run an entropy pass (the full-batch entropy threshold)."""
        return self.settings.top_entropy_quantile < 1.0

    # ---- the host loop
    def _chunk_index(self, i: int) -> jax.Array:
        """Chunk `i`'s index as a replicated int32 scalar (made once: no per-step transfer)."""
        while len(self._index) <= i:
            self._index.append(self.hosts.replicated(np.int32(len(self._index)), self._rep))
        return self._index[i]

    def to_device(self, batch: TrainBatch) -> tuple[list[Arrays], Arrays]:
        """A host batch -> (chunks, per-sequence arrays) on device with the steps' shardings;
        with several processes, each process's rows form the global arrays."""
        ways = self.batch_ways
        chunks = [self.hosts.to_global({k: c[k] for k in CHUNK_FIELDS},
                                       {k: self.rows_sharding(size, 2) for k in CHUNK_FIELDS},
                                       size, ways)
                  for c, size in zip(batch.chunks, batch.sizes)]
        seqs = self.hosts.to_global({k: batch.seqs[k] for k in SEQ_FIELDS},
                                    self._seq_shardings(), self.seqs, ways)
        return chunks, seqs

    def logprobs(self, params: Any, chunks: list[Arrays], seqs: Arrays,
                 entropy: bool = False) -> jax.Array:
        """Completion log-probs (or with `entropy`, token entropies) [S, N] of every placed
        sequence (0 elsewhere)."""
        out = self._fn("out")()
        name = "ent" if entropy else "logp"
        for i, c in enumerate(chunks):
            out = self._fn(name, len(c["tokens"]))(params, out, c, seqs, self._chunk_index(i))
        return out

    def update(self, params: Any, opt_state: Any, chunks: list[Arrays],
               seqs: Arrays) -> tuple[Any, Any, Arrays]:
        """One optimizer step on the whole batch: grads accumulated over the chunks."""
        if self.needs_entropy:
            seqs = {**seqs, "entropy": self.logprobs(params, chunks, seqs, entropy=True)}
        acc = self._fn("zeros")(params)
        for i, c in enumerate(chunks):
            acc = self._fn("grad", len(c["tokens"]))(params, acc, c, seqs, self._chunk_index(i))
        return self._fn("apply")(params, opt_state, acc, seqs)
