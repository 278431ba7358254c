"""The learner: compiled train / log-prob steps over the mesh, and `update(state, batch)`.

One `jax.jit` per (rows, groups, prompt bucket) shape with explicit in/out shardings and donated
params / optimizer state; `warm_up` compiles every shape of the `ShapePlan` ahead of time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from sagc_jax.models.sharding import batch_sharding, replicated
from sagc_jax.rl.batch import TrainBatch
from sagc_jax.rl.train_step import (
    BATCH_FIELDS,
    LossSettings,
    abstract_batch,
    completion_logprobs,
    make_train_step,
)
from sagc_jax.train.hosts import Hosts
from sagc_jax.train.plan import ShapePlan, micro_batches
from sagc_jax.train.state import TrainState


def loss_settings(cfg: Any) -> LossSettings:
    """The static loss settings of a Config (`algo.*`, sampling temperature and length)."""
    a, s = cfg.algo, cfg.sampling
    return LossSettings(epsilon=a.epsilon, epsilon_high=a.epsilon_high, loss_agg=a.loss_agg,
                        beta=a.beta, kl_estimator=a.kl_estimator, advantage=a.advantage,
                        adv_eps=a.adv_eps, temperature=s.temperature,
                        max_tokens=s.max_new_tokens)


@dataclasses.dataclass
class CompiledSteps:
    """Jitted train / logprob functions over a mesh, one compile per batch shape.

    Shardings are explicit: params/opt state by the model's rules, batch rows over data x fsdp,
    metrics replicated. Params and optimizer state are donated.
    """

    graphdef: nnx.GraphDef
    optimizer: optax.GradientTransformation
    settings: LossSettings
    mesh: Mesh
    param_shardings: Any
    opt_shardings: Any
    micro_batch_rows: int | None = None

    def __post_init__(self) -> None:
        self._train: dict[tuple, Callable] = {}
        self._logp: dict[tuple, Callable] = {}
        # Ahead-of-time executables from warm_up: a jit's own cache does not see them.
        self._compiled: dict[tuple, Callable] = {}

    def batch_shardings(self, rows: int) -> dict[str, NamedSharding]:
        n_shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if rows % n_shards:
            # Rows that don't split evenly stay replicated: correct, just not data-parallel.
            return {k: replicated(self.mesh) for k in BATCH_FIELDS}
        return {k: batch_sharding(self.mesh, nd) for k, nd in BATCH_FIELDS.items()}

    def micro_batches(self, rows: int) -> int:
        return micro_batches(rows, self.micro_batch_rows)

    def _jit_train(self, rows: int, num_groups: int, prompt_len: int) -> Callable:
        key = (rows, num_groups, prompt_len)
        if key not in self._train:
            step = make_train_step(self.graphdef, self.optimizer, self.settings,
                                   num_groups=num_groups, prompt_len=prompt_len,
                                   micro_batches=self.micro_batches(rows))
            rep = replicated(self.mesh)
            self._train[key] = jax.jit(
                step,
                in_shardings=(self.param_shardings, self.opt_shardings,
                              self.batch_shardings(rows)),
                out_shardings=(self.param_shardings, self.opt_shardings, rep),
                donate_argnums=(0, 1))
        return self._train[key]

    def _jit_logprob(self, rows: int, prompt_len: int) -> Callable:
        key = (rows, prompt_len)
        if key not in self._logp:
            bs = self.batch_shardings(rows)
            fn = lambda p, t, pad, ln: completion_logprobs(  # noqa: E731
                self.graphdef, p, t, pad, ln, prompt_len, self.settings.temperature)
            self._logp[key] = jax.jit(
                fn, in_shardings=(self.param_shardings, bs["tokens"], bs["prompt_pad"],
                                  bs["lengths"]),
                out_shardings=bs["old_logprobs"])
        return self._logp[key]

    def train_fn(self, rows: int, num_groups: int, prompt_len: int,
                 completion_len: int | None = None) -> Callable:
        """`fn(params, opt_state, batch) -> (params, opt_state, metrics)` for one shape: the
        ahead-of-time executable when `warm_up` made one (a jit's cache does not see those)."""
        exe = self._compiled.get(("train", rows, num_groups, prompt_len, completion_len))
        return exe or self._jit_train(rows, num_groups, prompt_len)

    def logprob_fn(self, rows: int, prompt_len: int,
                   completion_len: int | None = None) -> Callable:
        """`fn(params, tokens, prompt_pad, lengths) -> logprobs [R, N]` (old / reference)."""
        exe = self._compiled.get(("logp", rows, prompt_len, completion_len))
        return exe or self._jit_logprob(rows, prompt_len)

    def warm_up(self, params: Any, opt_state: Any, rows: int, num_groups: int, prompt_len: int,
                completion_len: int, need_logprobs: bool) -> None:
        """Compiles (ahead of time) the step for one shape, without running it."""
        spec = abstract_batch(rows, prompt_len + completion_len, completion_len)
        shard = self.batch_shardings(rows)
        spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shard[k])
                for k, v in spec.items()}
        self._compiled[("train", rows, num_groups, prompt_len, completion_len)] = (
            self._jit_train(rows, num_groups, prompt_len).lower(params, opt_state, spec).compile())
        if need_logprobs:
            self._compiled[("logp", rows, prompt_len, completion_len)] = (
                self._jit_logprob(rows, prompt_len).lower(
                    params, spec["tokens"], spec["prompt_pad"], spec["lengths"]).compile())


class Learner:
    """`update(state, batch) -> (state, metrics)`: μ GRPO iterations of one compiled step.

    ref_params: the frozen KL reference (set by the loop when `algo.beta > 0`).
    """

    def __init__(self, steps: CompiledSteps, *, beta: float, num_iterations: int,
                 hosts: Hosts | None = None, batch_ways: int = 1):
        self.steps = steps
        self.beta = beta
        self.num_iterations = num_iterations
        self.hosts = hosts or Hosts()
        self.batch_ways = batch_ways
        self.ref_params: Any = None

    @property
    def needs_logprobs(self) -> bool:
        """Whether updates run a separate log-prob pass (KL reference or μ > 1)."""
        return self.beta > 0 or self.num_iterations > 1

    def warm_up(self, state: TrainState, plan: ShapePlan) -> None:
        """Compiles every train-step shape of the plan ahead of time."""
        for s in plan.train_shapes():
            self.steps.warm_up(state.params, state.opt_state, s.rows, s.prompts,
                               s.prompt_bucket, s.completion_bucket, self.needs_logprobs)

    def update(self, state: TrainState, batch: TrainBatch) -> tuple[TrainState, dict[str, float]]:
        """The new state and the metrics averaged over μ iterations; a non-finite loss stops
        early with `finite = 0` in the metrics (params of that iteration were not updated)."""
        rows = batch.rows * self.hosts.count  # global rows
        lp, n = batch.prompt_len, batch.completion_len
        shard = self.steps.batch_shardings(rows)
        dev = self.hosts.to_global({k: batch.arrays[k] for k in BATCH_FIELDS}, shard, rows,
                                   self.batch_ways)
        if self.needs_logprobs:
            logp_fn = self.steps.logprob_fn(rows, lp, n)
            if self.beta > 0:
                dev["ref_logprobs"] = logp_fn(self.ref_params, dev["tokens"], dev["prompt_pad"],
                                              dev["lengths"])
            if self.num_iterations > 1:
                # μ > 1: the ratio is against the policy that sampled, recomputed in full precision.
                dev["old_logprobs"] = logp_fn(state.params, dev["tokens"], dev["prompt_pad"],
                                              dev["lengths"])
        fn = self.steps.train_fn(rows, batch.num_groups, lp, n)
        params, opt_state = state.params, state.opt_state
        sums: dict[str, float] = {}
        for _ in range(self.num_iterations):
            params, opt_state, m = fn(params, opt_state, dev)
            m = {k: float(v) for k, v in m.items()}
            if m["finite"] < 1:
                return TrainState(params, opt_state, state.step), m
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / self.num_iterations
        return TrainState(params, opt_state, state.step + 1), sums
