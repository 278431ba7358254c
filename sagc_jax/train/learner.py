"""The learner: compiled train / log-prob steps over the mesh, and `update(state, batch)`.

One `jax.jit` per (rows, groups, prompt bucket) shape with explicit in/out shardings and donated
params / optimizer state; `warm_up` compiles every shape of the `ShapePlan` ahead of time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding

from sagc_jax.hosts import Hosts
from sagc_jax.models.lora import adapter_zeros, disable_adapters
from sagc_jax.models.sharding import batch_sharding, replicated
from sagc_jax.rl.batch import TrainBatch
from sagc_jax.rl.packing import pack_batch
from sagc_jax.rl.train_step import (
    BATCH_FIELDS,
    LossSettings,
    abstract_batch,
    completion_logprobs,
    make_train_step,
)
from sagc_jax.shapes import ShapePlan, micro_batches
from sagc_jax.train.packed import PackedSteps
from sagc_jax.train.state import TrainState
from sagc_jax.train.steps import StepFields


def loss_settings(cfg: Any) -> LossSettings:
    """The static loss settings of a Config (`algo.*`, sampling temperature and length)."""
    a, s = cfg.algo, cfg.sampling
    return LossSettings(epsilon=a.epsilon, epsilon_high=a.epsilon_high, clip_delta=a.clip_delta,
                        importance_sampling=a.importance_sampling, loss_agg=a.loss_agg,
                        beta=a.beta, kl_estimator=a.kl_estimator,
                        kl_bias_correction=a.kl_bias_correction, scale_rewards=a.scale_rewards,
                        std_ddof=a.std_ddof, adv_eps=a.adv_eps,
                        top_entropy_quantile=a.top_entropy_quantile,
                        off_policy_threshold=a.off_policy_mask_threshold,
                        temperature=s.temperature,
                        max_tokens=s.max_new_tokens)


@dataclasses.dataclass
class CompiledSteps(StepFields):
    """Jitted train / logprob functions over a mesh, one compile per batch shape.

    Shardings are explicit: params/opt state by the model's rules, batch rows over data x fsdp,
    metrics replicated. Params and optimizer state are donated.
    """

    micro_batch_rows: int | None = None

    def __post_init__(self) -> None:
        self._train: dict[tuple, Callable] = {}
        self._logp: dict[tuple, Callable] = {}
        # Ahead-of-time executables from warm_up: a jit's own cache does not see them.
        self._compiled: dict[tuple, Callable] = {}

    def batch_shardings(self, rows: int) -> dict[str, NamedSharding]:
        if rows % self.batch_ways:
            # Rows that don't split evenly stay replicated: correct, just not data-parallel.
            return {k: replicated(self.mesh) for k in BATCH_FIELDS}
        return {k: batch_sharding(self.mesh, nd) for k, nd in BATCH_FIELDS.items()}

    def rows_sharding(self, rows: int) -> NamedSharding | None:
        """The model's residual stream [micro-batch rows x seq, H]: rows over data x fsdp when
        a micro-batch splits evenly and there is FSDP to fix (else left to GSPMD). Not with
        tensor > 1: there XLA:CPU aborted intermittently at run time with the constraint."""
        mb = rows // self.micro_batches(rows)
        if self.mesh.shape["fsdp"] == 1 or self.mesh.shape["tensor"] > 1 or mb % self.batch_ways:
            return None
        return batch_sharding(self.mesh)

    def micro_batches(self, rows: int) -> int:
        return micro_batches(rows, self.micro_batch_rows)

    def _jit_train(self, rows: int, num_groups: int, prompt_len: int) -> Callable:
        key = (rows, num_groups, prompt_len)
        if key not in self._train:
            step = make_train_step(self.graphdef, self.optimizer, self.settings,
                                   num_groups=num_groups, prompt_len=prompt_len,
                                   micro_batches=self.micro_batches(rows),
                                   rows_sharding=self.rows_sharding(rows))
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

    With `packed` (single process), the batch's sequences are packed (`rl.packing`) and the
    update runs the packed steps; otherwise the padded `steps`. Both report `train_token_util`:
    slots holding a token the loss needs ÷ slots the train step's forward computes (padded:
    prompt + completion - 1 of every sequence in the loss; packed: a shared prompt counts once
    per row that computes it).
    ref_params: the frozen KL reference (set by the loop when `algo.beta > 0`); None with
    `algo.beta > 0` means the policy's own base with its LoRA adapters off
    (`lora.disable_adapters`: shares the base's arrays, no second copy of the weights).
    """

    def __init__(self, steps: CompiledSteps, *, beta: float, num_iterations: int,
                 hosts: Hosts | None = None, batch_ways: int = 1,
                 packed: PackedSteps | None = None, pad_id: int = 0):
        self.steps = steps
        self.beta = beta
        self.num_iterations = num_iterations
        self.hosts = hosts or Hosts()
        self.batch_ways = batch_ways
        self.packed = packed
        self.pad_id = pad_id
        self.ref_params: Any = None
        self._adapter_zeros: Any = None

    def reference(self, params: Any) -> Any:
        """The KL reference's params for the policy `params` (read before they are donated)."""
        if self.ref_params is not None:
            return self.ref_params
        if self._adapter_zeros is None:  # made once: adapter-sized, on the adapters' devices
            self._adapter_zeros = adapter_zeros(params)
        return disable_adapters(params, self._adapter_zeros)

    @property
    def needs_logprobs(self) -> bool:
        """Whether updates run a separate log-prob pass (KL reference or μ > 1)."""
        return self.beta > 0 or self.num_iterations > 1

    def warm_up(self, state: TrainState, plan: ShapePlan) -> None:
        """Compiles every train-step shape of the plan ahead of time."""
        if self.packed is not None:
            self.packed.warm_up(state.params, state.opt_state, self.needs_logprobs)
            return
        for s in plan.train_shapes():
            self.steps.warm_up(state.params, state.opt_state, s.rows, s.prompts,
                               s.prompt_bucket, s.completion_bucket, self.needs_logprobs)

    def update(self, state: TrainState, batch: TrainBatch) -> tuple[TrainState, dict[str, float]]:
        """The new state and the metrics averaged over μ iterations; a non-finite loss stops
        early with `finite = 0` in the metrics (params of that iteration were not updated).

        Padded or packed, the batch becomes one `step(params, opt_state) -> (params, opt_state,
        metrics)` and its token utilisation; the μ iterations are the same for both."""
        prepare = self._padded_step if self.packed is None else self._packed_step
        step, util = prepare(state, batch)
        return self._iterate(state, step, util)

    def _padded_step(self, state: TrainState, batch: TrainBatch) -> tuple[Callable, float]:
        """The padded batch on device (+ its log-prob passes) and the step over it."""
        rows = batch.rows * self.hosts.count  # global rows
        lp, n = batch.prompt_len, batch.completion_len
        shard = self.steps.batch_shardings(rows)
        dev = self.hosts.to_global({k: batch.arrays[k] for k in BATCH_FIELDS}, shard, rows,
                                   self.batch_ways)
        if self.needs_logprobs:
            logp_fn = self.steps.logprob_fn(rows, lp, n)
            if self.beta > 0:
                dev["ref_logprobs"] = logp_fn(self.reference(state.params), dev["tokens"],
                                              dev["prompt_pad"], dev["lengths"])
            if self.num_iterations > 1:
                # μ > 1: the ratio is against the policy that sampled, recomputed in full precision.
                dev["old_logprobs"] = logp_fn(state.params, dev["tokens"], dev["prompt_pad"],
                                              dev["lengths"])
        fn = self.steps.train_fn(rows, batch.num_groups, lp, n)
        a = batch.arrays
        real = _real_tokens(lp - a["prompt_pad"], a["lengths"], a["loss_rows"])
        util = real / (batch.rows * (lp + n - 1))  # this process's rows
        return (lambda p, o: fn(p, o, dev)), util

    def _packed_step(self, state: TrainState, batch: TrainBatch) -> tuple[Callable, float]:
        """The batch packed into chunks on device (+ its log-prob passes) and the step over it."""
        ps = self.packed
        chunks, seqs, plan = pack_batch(
            batch.arrays, batch.prompt_len, seqs=ps.seqs, completion_len=ps.completion_len,
            pack_len=ps.pack_len, chunk_sizes=ps.chunk_sizes, pad_id=self.pad_id)
        chunks, seqs = ps.to_device(chunks, seqs)
        if self.beta > 0:
            seqs["ref_logprobs"] = ps.logprobs(self.reference(state.params), chunks, seqs)
        if self.num_iterations > 1:
            seqs["old_logprobs"] = ps.logprobs(state.params, chunks, seqs)
        return (lambda p, o: ps.update(p, o, chunks, seqs)), plan.token_util

    def _iterate(self, state: TrainState, step: Callable,
                 util: float) -> tuple[TrainState, dict[str, float]]:
        """μ iterations of `step(params, opt_state) -> (params, opt_state, metrics)`."""
        params, opt_state = state.params, state.opt_state
        sums: dict[str, float] = {}
        for _ in range(self.num_iterations):
            params, opt_state, m = step(params, opt_state)
            m = {k: float(v) for k, v in m.items()}
            if m["finite"] < 1:
                return TrainState(params, opt_state, state.step), m
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / self.num_iterations
        sums["train_token_util"] = util
        return TrainState(params, opt_state, state.step + 1), sums


def _real_tokens(prompt_lens: Any, lengths: Any, loss_rows: Any) -> int:
    """Σ (prompt + completion - 1) over sequences with a loss token (the useful forward)."""
    keep = (lengths > 0) & loss_rows
    return int((prompt_lens + lengths - 1)[keep].sum())
