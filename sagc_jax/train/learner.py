"""The learner: `update(state, batch) -> (state, metrics)`, μ GRPO iterations of one compiled
update (`train.steps.CompiledSteps`) over the batch's layout (`rl.batch`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sagc_jax.models.lora import adapter_zeros, disable_adapters
from sagc_jax.rl.batch import TrainBatch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.train.state import RunState
from sagc_jax.train.steps import CompiledSteps


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


class Learner:
    """`update(state, batch) -> (state, metrics)`: μ GRPO iterations of one compiled update.

    The only writer of `RunState.step`. Reports `train_token_util`: slots holding a token the
    loss needs ÷ slots the forward computes (a shared prompt counts once per row that computes
    it). The KL reference is `state.ref_params`; None with `algo.beta > 0` means the policy's
    own base with its LoRA adapters off (`lora.disable_adapters`: shares the base's arrays, no
    second copy of the weights).
    """

    def __init__(self, steps: CompiledSteps, *, beta: float, num_iterations: int):
        self.steps = steps
        self.beta = beta
        self.num_iterations = num_iterations
        self._adapter_zeros: Any = None

    def reference(self, state: RunState) -> Any:
        """The KL reference's params (read before the policy's params are donated)."""
        if state.ref_params is not None:
            return state.ref_params
        if self._adapter_zeros is None:  # made once: adapter-sized, on the adapters' devices
            self._adapter_zeros = adapter_zeros(state.params)
        return disable_adapters(state.params, self._adapter_zeros)

    @property
    def needs_logprobs(self) -> bool:
        """Whether updates run a separate log-prob pass (KL reference or μ > 1)."""
        return self.beta > 0 or self.num_iterations > 1

    def warm_up(self, state: RunState) -> None:
        """Compiles every train-step program ahead of time."""
        self.steps.warm_up(state.params, state.opt_state, self.needs_logprobs)

    def update(self, state: RunState, batch: TrainBatch) -> tuple[RunState, dict[str, float]]:
        """The new state and the metrics averaged over μ iterations; a non-finite loss stops
        early with `finite = 0` in the metrics (params of that iteration were not updated).

        The batch goes to device once, with its reference (KL) and old (μ > 1) log-prob passes;
        then μ iterations of `step(params, opt_state) -> (params, opt_state, metrics)`."""
        st = self.steps
        chunks, seqs = st.to_device(batch)
        if self.beta > 0:
            seqs["ref_logprobs"] = st.logprobs(self.reference(state), chunks, seqs)
        if self.num_iterations > 1:
            # μ > 1: the ratio is against the policy that sampled, recomputed in full precision.
            seqs["old_logprobs"] = st.logprobs(state.params, chunks, seqs)
        return self._iterate(state, lambda p, o: st.update(p, o, chunks, seqs), batch.token_util)

    def _iterate(self, state: RunState, step: Callable,
                 util: float) -> tuple[RunState, dict[str, float]]:
        """μ iterations of `step(params, opt_state) -> (params, opt_state, metrics)`."""
        params, opt_state = state.params, state.opt_state
        sums: dict[str, float] = {}
        for _ in range(self.num_iterations):
            params, opt_state, m = step(params, opt_state)
            m = {k: float(v) for k, v in m.items()}
            if m["finite"] < 1:
                return dataclasses.replace(state, params=params, opt_state=opt_state), m
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / self.num_iterations
        sums["train_token_util"] = util
        return dataclasses.replace(state, params=params, opt_state=opt_state,
                                   step=state.step + 1), sums
