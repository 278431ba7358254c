"""The ``sagc:`` config section — declared once, used by the trainer and the simulator.

Defaults are the controller's, justified in docs/sagc.md ("Defaults and why"). Field bounds and
choices are checked by pydantic; the rules that involve several fields are in
:meth:`SAGCConfig._rules`. Errors are one line naming ``sagc.<field>`` (see
:mod:`sagc_jax.config.errors`).
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated, Literal

from annotated_types import Ge
from pydantic import AfterValidator, model_validator

from sagc_jax.config.base import Bool, Float, Int, Section, Str, field, rule_error

__all__ = ["SAGCConfig", "risk_level"]


def risk_level(risk: str) -> float | None:
    """``"mean"`` -> None; ``"q90"`` -> 0.90. Raises ValueError otherwise."""
    if risk == "mean":
        return None
    m = re.fullmatch(r"q(\d+(?:\.\d+)?)", str(risk))
    if not m or not 50.0 < float(m.group(1)) < 100.0:
        raise ValueError(f"bad risk {risk!r}")
    return float(m.group(1)) / 100.0


def _risk(v: str) -> str:
    try:
        risk_level(v)
    except ValueError:
        raise rule_error(
            "", f"must be 'mean' or an upper quantile like 'q90' / 'q95' (50 < q < 100), got {v!r}"
        ) from None
    return v


class SAGCConfig(Section):
    """The ``sagc:`` config section (frozen, hashable). Defaults are justified in docs/sagc.md."""

    section_key = "sagc"
    enabled: Bool = field(True, "Adapt G; False = fixed initial_group_size.")
    group_sizes: tuple[Annotated[Int, Ge(2)], ...] = field(
        (4, 8, 12, 16),
        "Allowed group sizes (the compiled rungs); strictly increasing, each >= 2 (a group needs "
        "two rollouts to compare).",
    )
    initial_group_size: Int = field(8, "G at step 0 and during warm-up; one of group_sizes.")
    # tau >= 1: an event is max L > tau * median L, and max >= median always, so tau < 1 would
    # flag almost every group (docs/sagc.md, "Straggler event").
    tau: Float = field(2.0, "Straggler if max L > tau * median L within a group.", ge=1)
    count_truncated: Bool = field(
        True, "Any member truncated at max_new_tokens is a straggler event."
    )
    delta: Float = field(0.1, "Long-run straggler-rate budget.", gt=0, lt=1)
    V: Float = field(1.0, "Weight of the normalised objective u(g) against Q * risk(g).", ge=0)
    half_life: Float = field(
        100.0,
        "Steps; forgetting of risk/pass-rate statistics within a regime (change detection "
        "restarts them on a shift).",
        gt=0,
    )
    risk: Annotated[Str, AfterValidator(_risk)] = field(
        "q90", "'mean' or an upper posterior quantile 'qNN' (50 < NN < 100)."
    )
    floor_on_mean: Bool = field(
        True,
        "Judge the smallest rung on its posterior mean risk, not the 'risk' quantile: holding it "
        "for uncertainty buys no safety (there is no safer rung), and a quantile that still "
        "remembers a heavy start holds it long after the tail has lightened.",
    )
    extrapolation_power: Float = field(
        2.0,
        "A group of G rows extended by the length model to g > G counts as (G/g)^p groups of "
        "evidence about g; 1 = exact-model weight G/g, larger = trust the model less.",
        ge=0,
    )
    max_rung_step: Int = field(
        1, "Max rungs G moves up per step (moves down are unlimited); 0 = unlimited.", ge=0
    )
    warmup_steps: Int = field(4, "Steps held at initial_group_size before deciding.", ge=0)
    batch_policy: Literal["prompts", "rollouts"] = field(
        "prompts", "prompts: B fixed (rows = B * g); rollouts: B = rollouts_per_step // g."
    )
    rollouts_per_step: Int | None = field(
        None, "Rows per step when batch_policy is 'rollouts'; divisible by every group size.", ge=1
    )
    seed: Int = field(0, "Seed of the controller's random draws.")
    hard_filter: Bool = field(True, "Only g with risk(g) <= delta are eligible.")
    share_budget: Bool = field(True, "The rung above the largest feasible one is eligible too.")
    tie_margin: Float = field(
        0.0,
        "Among feasible rungs scoring within this of the best (score units: a step's best "
        "benefit), take the largest; 0 = the argmax. 0.02 trades +1.7 % on drift and +0.8 % on "
        "length growth for -0.2 to -0.4 % on slow drift and loop bursts (docs/sagc.md).",
        ge=0,
    )
    pass_threshold: Float = field(0.5, "reward > threshold counts as a pass (benefit model).")
    pass_em_iters: Int = field(
        5,
        "EM steps from the method-of-moments Beta toward the likelihood of the observed pass "
        "counts (benefit model); 0 = the Beta alone.",
        ge=0,
    )
    cost_ema: Float = field(0.3, "EMA weight of a new per-shape timing measurement.", gt=0, le=1)
    length_half_life: Float = field(
        100.0,
        "Steps; forgetting of the per-row truncation rate that feeds cost and risk above G_t "
        "within a regime (change detection restarts it on a shift).",
        gt=0,
    )
    window_rows: Int = field(
        2048,
        "Ring buffer of recent untruncated per-row length / group median; >= 4 * max(group_sizes).",
    )
    window_groups: Int = field(256, "Ring buffer of recent per-group median lengths.", ge=4)
    mc_samples: Int = field(
        64, "Monte-Carlo subsets / bootstrap draws per group and candidate.", ge=1
    )
    prior_a: Float = field(0.5, "Beta prior on each candidate's risk (Jeffreys).", gt=0)
    prior_b: Float = field(0.5, "Beta prior on each candidate's risk (Jeffreys).", gt=0)
    timing: Literal["measured", "model"] = field(
        "measured",
        "Where the per-shape step cost comes from. measured: wall-clock of each rollout (true to "
        "the hardware, but G then depends on timing noise, so two runs of one seed can "
        "diverge); model: seconds from the linear model_* terms (deterministic: exact resume "
        "and replay).",
    )
    model_decode_a: Float = field(0.02, "s per decode step, independent of rows.", ge=0)
    model_decode_b: Float = field(2.5e-5, "s per row per decode step.", ge=0)
    model_prefill_a: Float = field(0.05, "s per prefill call.", ge=0)
    model_prefill_b: Float = field(2.0e-4, "s per prefill row.", ge=0)
    # --- issue #13 redesign (docs/sagc.md, "Where we depart from DESIGN.md") ---
    objective: Literal["rate", "ratio"] = field(
        "rate",
        "rate: u(g) = (benefit - lambda * cost) / max benefit, lambda the realised run-long "
        "benefit per second (benefit/s is a ratio of sums); ratio: the per-step "
        "J(g) = (benefit/cost) / max(benefit/cost) of DESIGN.md.",
    )
    rate_half_life: Float = field(
        500.0,
        "Steps; memory of lambda, the realised benefit per second, when horizon is unknown.",
        gt=0,
    )
    horizon: Int | None = field(
        None,
        "Steps in the run (the trainer fills in run.steps, the simulator its steps). Known: "
        "lambda is the benefit per second the run would end at if the current regime lasted to "
        "the end (certainty equivalence); None: the discounted realised rate.",
        ge=1,
    )
    trend_half_life: Float | None = field(
        300.0,
        "Steps; memory of the regression of log median completion length on step within the "
        "current regime (R1-style length growth). With a horizon, lambda's projection grows "
        "the per-step cost along that trend (shrunk by its noise, bounded by one decode chunk "
        "and the max_new_tokens cap); None: the current cost lasts (flat).",
        gt=0,
    )
    change_threshold: Float = field(
        15.0,
        "Likelihood-ratio statistic (about chi-square(1)) that declares a change in the "
        "straggler or truncation rate; 0 = no change detection.",
        ge=0,
    )
    credit_cap: Float = field(
        100.0,
        "Budget credit: unused straggler budget (sum of delta - s_t over steps) saved for later, "
        "at most this much; 0 = none (the queue only counts debt).",
        ge=0,
    )
    credit_horizon: Float = field(
        300.0, "Steps over which saved credit may be spent: risk cap = delta + credit / this.", gt=0
    )
    change_window: Int = field(
        32, "Steps of per-step sums kept; windows of 1, 2, 4, ... steps are tested.", ge=1
    )

    @model_validator(mode="after")
    def _rules(self) -> SAGCConfig:
        gs = self.group_sizes
        if not gs:
            raise rule_error("group_sizes", "must not be empty")
        if any(b <= a for a, b in itertools.pairwise(gs)):
            raise rule_error("group_sizes", f"must be strictly increasing, got {list(gs)}")
        if self.initial_group_size not in gs:
            raise rule_error(
                "initial_group_size",
                f"must be one of sagc.group_sizes {list(gs)}, got {self.initial_group_size}",
            )
        if self.batch_policy == "rollouts":
            n = self.rollouts_per_step
            if n is None:
                raise rule_error(
                    "rollouts_per_step",
                    "must be a positive integer when batch_policy is 'rollouts', got None",
                )
            if any(n % g for g in gs):
                raise rule_error(
                    "rollouts_per_step",
                    f"must be divisible by every group size {list(gs)}, got {n}",
                )
        if self.window_rows < 4 * max(gs):
            raise rule_error(
                "window_rows",
                f"must be >= 4 * max(group_sizes) = {4 * max(gs)}, got {self.window_rows}",
            )
        return self
