"""The GRPO update on packed sequences: exact, with static shapes whatever the batch holds.

An update runs the plan's chunks (`rl.packing`) one compiled call each, accumulating gradients,
then applies the optimizer once. Per-sequence arrays (`SEQ_FIELDS`, [S, ...] with S the largest
batch of the run, padded with invalid rows) are the same on every call; chunk i's loss masks in
its own sequences only (`chunk == i`). Every aggregation divides sums by full-batch normalisers
(see `rl.losses`), so the accumulated loss and gradient equal the unpacked step's exactly (up to
float summation order): packing changes where a token sits, never the loss.

Compiled shapes: one grad step and one log-prob step per chunk size, one apply step — none
depends on G, the prompt bucket or the completion lengths.
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

from sagc_jax.models.sharding import batch_sharding, replicated
from sagc_jax.rl.advantages import group_advantages
from sagc_jax.rl.losses import policy_loss, token_logprobs
from sagc_jax.rl.packing import unpack
from sagc_jax.rl.train_step import LossSettings

# Per-sequence arrays [S, ...] (name -> rank); `chunk`, `row`, `start` come from the PackPlan.
SEQ_FIELDS = {
    "lengths": 1, "loss_rows": 1, "old_logprobs": 2, "ref_logprobs": 2, "rewards": 1,
    "group_ids": 1, "valid": 1, "chunk": 1, "row": 1, "start": 1,
}
# Packed arrays of one chunk, int32 [chunk rows, pack_len].
CHUNK_FIELDS = ("tokens", "targets", "positions", "segment_ids")
SUM_METRICS = ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean")


def packed_logprobs(graphdef: nnx.GraphDef, params: Any, chunk: dict[str, jax.Array],
                    temperature: float) -> jax.Array:
    """Log-prob [rows, L] of each slot's target under softmax(logits / temperature)."""
    model = nnx.merge(graphdef, params)
    logits = model(chunk["tokens"], positions=chunk["positions"],
                   segment_ids=chunk["segment_ids"])
    return token_logprobs(logits, chunk["targets"], temperature)


def _mask_and_norms(seqs: dict[str, jax.Array]) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Full-batch completion mask [S, N] and its normalisers (tokens, sequences with a token)."""
    n = seqs["old_logprobs"].shape[1]
    mask = (jnp.arange(n)[None, :] < seqs["lengths"][:, None]) & seqs["loss_rows"][:, None]
    return mask, (mask.sum().astype(jnp.float32),
                  (mask.sum(-1) > 0).sum().astype(jnp.float32))


def _advantages(seqs: dict[str, jax.Array], settings: LossSettings, num_groups: int) -> jax.Array:
    return group_advantages(seqs["rewards"], seqs["group_ids"], seqs["valid"],
                            num_groups=num_groups, kind=settings.advantage, eps=settings.adv_eps)


def make_grad_step(graphdef: nnx.GraphDef, settings: LossSettings, *,
                   num_groups: int) -> Callable:
    """`grad_step(params, acc, chunk, seqs, index) -> acc`: adds chunk `index`'s loss gradient
    and summed metrics to `acc = (grads, sums)` (not jitted; `num_groups` is static)."""
    s = settings

    def grad_step(params, acc, chunk, seqs, index):
        adv = _advantages(seqs, s, num_groups)
        full, norms = _mask_and_norms(seqs)
        mask = full & (seqs["chunk"] == index)[:, None]
        n = mask.shape[1]

        def loss_fn(p):
            logp = unpack(packed_logprobs(graphdef, p, chunk, s.temperature), seqs["row"],
                          seqs["start"], n)
            return policy_loss(
                logp, seqs["old_logprobs"], adv, mask, epsilon=s.epsilon,
                epsilon_high=s.epsilon_high, loss_agg=s.loss_agg,
                ref_logprobs=seqs["ref_logprobs"] if s.beta > 0 else None, beta=s.beta,
                kl_estimator=s.kl_estimator, total_tokens=norms[0], total_seqs=norms[1],
                max_tokens=s.max_tokens)

        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        grads, sums = acc
        m = {**m, "loss": loss}
        return (jax.tree.map(jnp.add, grads, g),
                {k: sums[k] + m[k] for k in SUM_METRICS})

    return grad_step


def make_apply_step(optimizer: optax.GradientTransformation, settings: LossSettings, *,
                    num_groups: int) -> Callable:
    """`apply(params, opt_state, acc, seqs) -> (params, opt_state, metrics)`: one optimizer
    update from the accumulated gradient; a non-finite loss or gradient leaves params and
    optimizer state unchanged and reports `finite = 0` (as the unpacked step)."""

    def apply(params, opt_state, acc, seqs):
        grads, sums = acc
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        adv = _advantages(seqs, settings, num_groups)
        valid = seqs["valid"].astype(jnp.float32)
        _, norms = _mask_and_norms(seqs)
        metrics = {**sums, "grad_norm": grad_norm, "finite": finite.astype(jnp.float32),
                   "adv_abs_mean": (jnp.abs(adv) * valid).sum() / jnp.maximum(valid.sum(), 1.0),
                   "loss_tokens": norms[0]}
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    return apply


def make_logprob_step(graphdef: nnx.GraphDef, temperature: float) -> Callable:
    """`step(params, out, chunk, seqs, index) -> out`: writes the completion log-probs [S, N]
    of chunk `index`'s sequences into `out` (old / reference passes)."""

    def step(params, out, chunk, seqs, index):
        logp = unpack(packed_logprobs(graphdef, params, chunk, temperature), seqs["row"],
                      seqs["start"], out.shape[1])
        return jnp.where((seqs["chunk"] == index)[:, None], logp, out)

    return step


def zero_acc(params: Any) -> tuple[Any, dict[str, jax.Array]]:
    """An empty accumulator (zero grads like params, zero metric sums)."""
    return (jax.tree.map(jnp.zeros_like, params),
            {k: jnp.zeros((), jnp.float32) for k in SUM_METRICS})


@dataclasses.dataclass
class PackedSteps:
    """Jitted packed steps over a mesh and the host loop of one update.

    Chunk rows shard over data x fsdp when the chunk size divides it (else replicated);
    per-sequence arrays are replicated (small: [S, N]). Params, optimizer state and the gradient
    accumulator (to the grad steps) are donated. `seqs` (S), `completion_len` (N) and
    `num_groups` are the run's largest batch, so no shape depends on G.
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

    def __post_init__(self) -> None:
        self._jit: dict[tuple, Callable] = {}
        self._compiled: dict[tuple, Callable] = {}
        self._rep = replicated(self.mesh)
        self._index = [jax.device_put(np.int32(i), self._rep) for i in range(256)]

    # ---- shardings and abstract inputs
    def chunk_sharding(self, rows: int) -> NamedSharding:
        ways = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        return batch_sharding(self.mesh, 2) if rows % ways == 0 else self._rep

    def _acc_shardings(self) -> tuple[Any, dict[str, NamedSharding]]:
        return self.param_shardings, {k: self._rep for k in SUM_METRICS}

    def _seq_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        S, N = self.seqs, self.completion_len
        dt = {"old_logprobs": jnp.float32, "ref_logprobs": jnp.float32, "rewards": jnp.float32,
              "loss_rows": jnp.bool_, "valid": jnp.bool_}
        return {k: jax.ShapeDtypeStruct((S, N) if nd == 2 else (S,), dt.get(k, jnp.int32),
                                        sharding=self._rep) for k, nd in SEQ_FIELDS.items()}

    def _chunk_spec(self, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
        sh = self.chunk_sharding(rows)
        return {k: jax.ShapeDtypeStruct((rows, self.pack_len), jnp.int32, sharding=sh)
                for k in CHUNK_FIELDS}

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
            elif name == "logp":
                fn = jax.jit(make_logprob_step(self.graphdef, self.settings.temperature),
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
        for key, args in todo.items():
            if key not in self._compiled:
                self._compiled[key] = self._fn(*key).lower(*args).compile()

    # ---- the host loop
    def to_device(self, chunks: list[dict[str, np.ndarray]], seqs: dict[str, np.ndarray]
                  ) -> tuple[list[dict[str, jax.Array]], dict[str, jax.Array]]:
        """Host chunks and per-sequence arrays -> device arrays with the steps' shardings."""
        dev_chunks = [{k: jax.device_put(c[k], self.chunk_sharding(len(c[k])))
                       for k in CHUNK_FIELDS} for c in chunks]
        return dev_chunks, {k: jax.device_put(np.asarray(seqs[k]), self._rep)
                            for k in SEQ_FIELDS}

    def logprobs(self, params: Any, chunks: list[dict[str, jax.Array]],
                 seqs: dict[str, jax.Array]) -> jax.Array:
        """Completion log-probs [S, N] of every packed sequence (0 elsewhere)."""
        out = jax.device_put(np.zeros((self.seqs, self.completion_len), np.float32), self._rep)
        for i, c in enumerate(chunks):
            out = self._fn("logp", len(c["tokens"]))(params, out, c, seqs, self._index[i])
        return out

    def update(self, params: Any, opt_state: Any, chunks: list[dict[str, jax.Array]],
               seqs: dict[str, jax.Array]) -> tuple[Any, Any, dict[str, jax.Array]]:
        """One optimizer step on the whole batch: grads accumulated over the chunks."""
        if len(chunks) > len(self._index):
            raise ValueError(f"PackedSteps.update: {len(chunks)} chunks exceed "
                             f"{len(self._index)}; declare larger chunk sizes")
        acc = self._fn("zeros")(params)
        for i, c in enumerate(chunks):
            acc = self._fn("grad", len(c["tokens"]))(params, acc, c, seqs, self._index[i])
        return self._fn("apply")(params, opt_state, acc, seqs)
