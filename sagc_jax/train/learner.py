"""The learner: `update(state, batch) -> (state, metrics)`, μ GRPO iterations of one compiled
update over the run's one train layout (`shapes.TrainLayout`, built by `rl.batch.make_batch`).

The pure steps are `rl.train_step`'s. Compiled shapes depend only on the layout (S, N, pack_len,
the declared chunk sizes), never on G, the prompt bucket or the completion lengths: one cache of
compiled programs (`shapes.train_programs`), filled by `warm_up` (or the first update).
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
from sagc_jax.models.lora import adapter_zeros, disable_adapters, trainable
from sagc_jax.models.sharding import batch_sharding, replicated
from sagc_jax.rl.batch import CHUNK_FIELDS, HEAD_FIELDS, SEQ_FIELDS, TrainBatch
from sagc_jax.rl.train_step import (
    SUM_METRICS,
    LossSettings,
    make_apply_step,
    make_grad_step,
    make_logprob_step,
    zero_acc,
)
from sagc_jax.shapes import TrainLayout, train_programs
from sagc_jax.train.state import RunState

Arrays = dict[str, jax.Array]


@dataclasses.dataclass
class Learner:
    """`update(state, batch) -> (state, metrics)`: μ GRPO iterations of one compiled update.

    The only writer of `RunState.step`. Chunk rows and per-sequence rows shard over data x fsdp
    when their count divides it (else they are replicated; with several processes they must
    divide). Params, optimizer state and the gradient accumulator are donated. The KL reference
    is `state.ref_params`; None with `beta > 0` means the policy's own base with its LoRA
    adapters off (`lora.disable_adapters`: no second copy of the weights). Reports
    `train_token_util`: slots holding a token the loss needs ÷ slots the forward computes.
    """

    graphdef: nnx.GraphDef
    optimizer: optax.GradientTransformation
    settings: LossSettings
    mesh: Mesh
    param_shardings: Any
    opt_shardings: Any
    layout: TrainLayout
    num_iterations: int = 1
    hosts: Hosts = dataclasses.field(default_factory=Hosts)

    def __post_init__(self) -> None:
        self._compiled: dict[tuple[str, int], Callable] = {}
        self._rep = replicated(self.mesh)
        self._index: list[jax.Array] = []
        self._adapter_zeros: Any = None

    @property
    def needs_entropy(self) -> bool:
        """Whether updates first run an entropy pass (the full-batch entropy threshold)."""
        return self.settings.top_entropy_quantile < 1.0

    # ---- shardings and programs
    def _shardings(self, rows: int) -> dict[str, Any]:
        """Shardings of a program's argument kinds for chunks of `rows` rows: rows over
        data x fsdp when they split evenly, else replicated (correct, just not data-parallel)."""
        ways = self.mesh.shape["data"] * self.mesh.shape["fsdp"]

        def over(n: int, ndim: int) -> NamedSharding:
            return batch_sharding(self.mesh, ndim) if n % ways == 0 else self._rep

        S = self.layout.seqs
        return {"acc": (trainable(self.param_shardings), {k: self._rep for k in SUM_METRICS}),
                "seq": {k: over(S, nd) for k, (nd, _) in SEQ_FIELDS.items()},
                "chunk": {k: over(rows, 2) for k in CHUNK_FIELDS}, "out": over(S, 2)}

    def _jit(self, name: str, rows: int = 0) -> Any:
        """Program `name` (`shapes.train_programs`) for chunks of `rows` rows, jitted."""
        sh, s, groups = self._shardings(rows), self.settings, self.layout.num_groups
        ps, os_, rep, acc, seq, out = (self.param_shardings, self.opt_shardings, self._rep,
                                       sh["acc"], sh["seq"], sh["out"])
        if name == "grad":
            return jax.jit(make_grad_step(self.graphdef, s, num_groups=groups),
                           in_shardings=(ps, acc, sh["chunk"], seq, rep), out_shardings=acc,
                           donate_argnums=(1,))
        if name in ("logp", "ent"):
            return jax.jit(make_logprob_step(self.graphdef, s.temperature, entropy=name == "ent"),
                           in_shardings=(ps, out, sh["chunk"], seq, rep), out_shardings=out,
                           donate_argnums=(1,))
        if name == "apply":
            return jax.jit(make_apply_step(self.optimizer, s, num_groups=groups),
                           in_shardings=(ps, os_, acc, seq), out_shardings=(ps, os_, rep),
                           donate_argnums=(0, 1))
        if name == "out":  # zeros for a log-prob pass to fill
            shape = (self.layout.seqs, self.layout.completion_len)
            return jax.jit(lambda: jnp.zeros(shape, jnp.float32), out_shardings=out)
        return jax.jit(zero_acc, in_shardings=(ps,), out_shardings=acc)

    def lower(self, name: str, rows: int, params: Any, opt_state: Any) -> Any:
        """Program `name` lowered for chunks of `rows` rows and params / optimizer state like
        these (arrays or abstract): what `warm_up` compiles and the dry run prices."""
        sh, lay = self._shardings(rows), self.layout
        S, N = lay.seqs, lay.completion_len

        def sds(shape: tuple[int, ...], dtype: Any, sharding: Any) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

        acc = jax.tree.map(lambda a, s: sds(a.shape, a.dtype, s),
                           jax.eval_shape(zero_acc, params), sh["acc"])
        seq = {k: sds((S, N) if nd == 2 else (S,), dt, sh["seq"][k])
               for k, (nd, dt) in SEQ_FIELDS.items()}
        chunk = {k: sds((rows, N if k in HEAD_FIELDS else lay.pack_len), jnp.int32,
                        sh["chunk"][k]) for k in CHUNK_FIELDS}
        idx, out = sds((), jnp.int32, self._rep), sds((S, N), jnp.float32, sh["out"])
        args = {"zeros": (params,), "apply": (params, opt_state, acc, seq), "out": (),
                "grad": (params, acc, chunk, seq, idx), "logp": (params, out, chunk, seq, idx),
                "ent": (params, out, chunk, seq, idx)}[name]
        return self._jit(name, rows).lower(*args)

    def warm_up(self, params: Any, opt_state: Any) -> None:
        """Compiles (ahead of time) every program of the layout's chunk sizes; then nothing
        more is ever compiled."""
        logprobs = self.settings.beta > 0 or self.num_iterations > 1  # KL reference, μ > 1
        for key in train_programs(self.layout.chunk_sizes, logprobs=logprobs,
                                  entropy=self.needs_entropy):
            if key not in self._compiled:
                self._compiled[key] = self.lower(*key, params, opt_state).compile()

    # ---- the host loop
    def _chunk_index(self, i: int) -> jax.Array:
        """Chunk `i`'s index as a replicated int32 scalar (made once: no per-step transfer)."""
        while len(self._index) <= i:
            self._index.append(self.hosts.replicated(np.int32(len(self._index)), self._rep))
        return self._index[i]

    def to_device(self, batch: TrainBatch) -> tuple[list[Arrays], Arrays]:
        """A host batch -> (chunks, per-sequence arrays) on device with the steps' shardings;
        with several processes, each process's rows form the global arrays."""
        ways = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        chunks = [self.hosts.to_global(c, self._shardings(size)["chunk"], size, ways)
                  for c, size in zip(batch.chunks, batch.sizes)]
        seqs = self.hosts.to_global(batch.seqs, self._shardings(0)["seq"], self.layout.seqs,
                                    ways)
        return chunks, seqs

    def logprobs(self, params: Any, chunks: list[Arrays], seqs: Arrays,
                 entropy: bool = False) -> jax.Array:
        """Completion log-probs (or with `entropy`, token entropies) [S, N] of every placed
        sequence (0 elsewhere)."""
        out = self._compiled[("out", 0)]()
        name = "ent" if entropy else "logp"
        for i, c in enumerate(chunks):
            out = self._compiled[(name, len(c["tokens"]))](params, out, c, seqs,
                                                          self._chunk_index(i))
        return out

    def step(self, params: Any, opt_state: Any, chunks: list[Arrays],
             seqs: Arrays) -> tuple[Any, Any, Arrays]:
        """One optimizer step on the batch: grads accumulated over the chunks, applied once."""
        self.warm_up(params, opt_state)  # compiles nothing once warmed up
        if self.needs_entropy:
            seqs = {**seqs, "entropy": self.logprobs(params, chunks, seqs, entropy=True)}
        acc = self._compiled[("zeros", 0)](params)
        for i, c in enumerate(chunks):
            acc = self._compiled[("grad", len(c["tokens"]))](params, acc, c, seqs,
                                                             self._chunk_index(i))
        return self._compiled[("apply", 0)](params, opt_state, acc, seqs)

    def reference(self, state: RunState) -> Any:
        """The KL reference's params (read before the policy's params are donated)."""
        if state.ref_params is not None:
            return state.ref_params
        if self._adapter_zeros is None:  # made once: adapter-sized, on the adapters' devices
            self._adapter_zeros = adapter_zeros(state.params)
        return disable_adapters(state.params, self._adapter_zeros)

    def update(self, state: RunState, batch: TrainBatch) -> tuple[RunState, dict[str, float]]:
        """The new state and the metrics averaged over μ iterations; a non-finite loss stops
        early with `finite = 0` in the metrics (params of that iteration were not updated).

        The batch goes to device once, with its reference (KL) and old (μ > 1) log-prob passes;
        then μ optimizer steps, each accumulating the chunks' gradients and applying them once.
        """
        self.warm_up(state.params, state.opt_state)
        chunks, seqs = self.to_device(batch)
        if self.settings.beta > 0:
            seqs["ref_logprobs"] = self.logprobs(self.reference(state), chunks, seqs)
        if self.num_iterations > 1:
            # μ > 1: the ratio is against the policy that sampled, recomputed in full precision.
            seqs["old_logprobs"] = self.logprobs(state.params, chunks, seqs)
        params, opt_state = state.params, state.opt_state
        sums: dict[str, float] = {}
        for _ in range(self.num_iterations):
            params, opt_state, m = self.step(params, opt_state, chunks, seqs)
            m = {k: float(v) for k, v in m.items()}
            if m["finite"] < 1:
                return dataclasses.replace(state, params=params, opt_state=opt_state), m
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / self.num_iterations
        sums["train_token_util"] = batch.token_util
        return dataclasses.replace(state, params=params, opt_state=opt_state,
                                   step=state.step + 1), sums
