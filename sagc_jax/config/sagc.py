"""The ``sagc:`` config section — declared once, used by the trainer and the simulator.

Defaults are the controller's, justified in docs/sagc.md ("Settings"). Field bounds and
choices are checked by pydantic; the rules that involve several fields are in
:meth:`SAGCConfig._rules`. Errors are one line naming ``sagc.<field>`` (see
:mod:`sagc_jax.config.errors`). The controller's other internals are constants
(:mod:`sagc_jax.config.sagc_constants`); a key the issue-32 rewrite removed is refused with one
line saying what it became (:data:`REMOVED_KEYS`).
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated, Any, Literal

from annotated_types import Ge
from pydantic import AfterValidator, Field, model_validator

from sagc_jax.config.base import Bool, Float, Int, Section, Str, field, rule_error
from sagc_jax.config.sagc_constants import SAGCConstants

__all__ = [
    "REMOVED_KEYS",
    "SAGCConfig",
    "TimeModelSection",
    "migrate_legacy_sagc",
    "risk_level",
]


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


class TimeModelSection(Section):
    """The linear time model (``sagc.time_model:``) behind ``sagc.timing: model``: seconds of a
    decode step ``decode_a + decode_b * rows`` and of a prefill ``prefill_a + prefill_b * rows``
    (:class:`sagc_jax.sagc.timing.TimeModel` is built from it; the simulator's ``timing:``
    defaults are these). The defaults are an invented accelerator-like line, measured on no
    machine; on an H200, Qwen2.5-0.5B at 16 prompts measured decode_a 0.00111, decode_b
    6.73e-6, prefill_a 0.00751, prefill_b 7.9e-8 (benchmarks/README.md, "GPU: H200")."""

    section_key = "sagc.time_model"
    decode_a: Float = field(0.02, "s per decode step, independent of rows.", ge=0)
    decode_b: Float = field(2.5e-5, "s per row per decode step.", ge=0)
    prefill_a: Float = field(0.05, "s per prefill call.", ge=0)
    prefill_b: Float = field(2.0e-4, "s per prefill row.", ge=0)


_WHY = "removed in the SAGC core rewrite (issue 32)"


def _removed_keys() -> dict[str, str]:
    """Old ``sagc:`` key -> what it became (the one-line error's text)."""
    c = SAGCConstants()  # the shipped values
    where = "sagc_jax/config/sagc_constants.py"
    out = {k: f"{_WHY}; now the constant {k} = {getattr(c, k)!r} ({where})" for k in (
        "count_truncated", "floor_on_mean", "extrapolation_power", "max_rung_step",
        "hard_filter", "share_budget", "pass_threshold", "pass_em_iters", "cost_ema",
        "window_groups", "mc_samples", "prior_a", "prior_b", "change_threshold", "credit_cap")}
    out["change_window"] = f"{_WHY}; now derived from sagc.half_life ({where}: change_window)"
    out["length_half_life"] = f"{_WHY}; now sagc.half_life itself ({where})"
    for k in ("rate_half_life", "trend_half_life", "credit_horizon"):
        x = getattr(c, f"{k}_x")
        out[k] = f"{_WHY}; now derived from sagc.half_life ({x:g} x half_life; {where})"
    out["window_rows"] = (f"{_WHY}; now derived: max({c.window_rows_min}, "
                          f"{c.window_rows_per_rung} x max(sagc.group_sizes)) ({where})")
    out["seed"] = (f"{_WHY}; now the constant seed = {c.seed} ({where}; the simulator passes "
                   "its own seed)")
    out["horizon"] = (f"{_WHY}; now passed by the trainer (run.steps) or the simulator "
                      "(steps) when the controller is built")
    out["tie_margin"] = f"{_WHY}; the near-tie rule is gone (the choice is the argmax)"
    out["objective"] = f"{_WHY}; the 'ratio' objective is gone (always the rate objective)"
    for k in ("decode_a", "decode_b", "prefill_a", "prefill_b"):
        out[f"model_{k}"] = f"{_WHY}; now sagc.time_model.{k}"
    return out


#: Every key the rewrite removed, with its one-line explanation (see :func:`_removed_keys`).
REMOVED_KEYS: dict[str, str] = _removed_keys()


def migrate_legacy_sagc(old: dict[str, Any]) -> dict[str, Any]:
    """A pre-issue-32 ``sagc:`` mapping (a saved run's config.yaml) in today's schema: the
    ``model_*`` terms become ``time_model``, ``horizon`` is dropped (the trainer passes
    run.steps), and every other removed key is dropped *only if* it holds the value that is now
    the constant or derived quantity; otherwise a one-line error names the key (the run used a
    setting this controller no longer has, so its decisions would not reproduce)."""
    c = SAGCConstants()
    half = float(old.get("half_life", 100.0))
    sizes = old.get("group_sizes", (4, 8, 12, 16))
    now: dict[str, Any] = {k: getattr(c, k) for k in REMOVED_KEYS if hasattr(c, k)}
    now |= {f"{k}": getattr(c, f"{k}_x") * half for k in
            ("rate_half_life", "trend_half_life", "credit_horizon")}
    now["length_half_life"] = half
    now |= {"window_rows": max(c.window_rows_min, c.window_rows_per_rung * max(sizes)),
            "tie_margin": 0.0, "objective": "rate"}
    new = {k: v for k, v in old.items() if k not in REMOVED_KEYS}
    tm = {k[len("model_"):]: old[k] for k in REMOVED_KEYS if k.startswith("model_") and k in old}
    if tm:
        new["time_model"] = tm
    for k, v in old.items():
        if k in now and v != now[k]:
            raise ValueError(f"sagc.{k}: {REMOVED_KEYS[k]}; this config has {v!r}, the "
                             f"controller now uses {now[k]!r}, so it cannot be migrated")
    return new


class SAGCConfig(Section):
    """The ``sagc:`` config section (frozen, hashable). Defaults are justified in docs/sagc.md."""

    section_key = "sagc"
    enabled: Bool = field(True, "Adapt G; False = fixed initial_group_size.")
    group_sizes: tuple[Annotated[Int, Ge(2)], ...] = field(
        (4, 8, 12, 16),
        "Allowed group sizes (the compiled rungs); strictly increasing, each >= 2 (a group needs "
        "two rollouts to compare).",
    )
    initial_group_size: Int | None = field(
        None,
        "G at step 0 and during warm-up; one of group_sizes. null (default): the rung of the "
        "best prior benefit per second on time_model (every group's longest row at the cap): "
        "the largest, whose groups inform every smaller rung, where rows are cheap (the default "
        "accelerator-like model), smaller where they are dear (docs/sagc.md, 'The warm-up "
        "rung'); with enabled: false, the largest.",
    )
    straggler: Literal["tail_share", "group_ratio"] = field(
        "tail_share",
        "What delta bounds. tail_share: the mean over groups of (max L - median L) / max L, the "
        "share of a group's decode steps run only for its tail (unitless, [0, 1); tau unused); "
        "it tracks the decode wasted on real rollouts. group_ratio: the fraction of groups with "
        "an event (max L > tau * median L, or a truncated member; unitless rate). "
        "docs/results/sagc_straggler_definition.md.",
    )
    # tau >= 1: an event is max L > tau * median L, and max >= median always, so tau < 1 would
    # flag almost every group (docs/sagc.md, "Straggler event").
    tau: Float = field(
        2.0, "Straggler if max L > tau * median L within a group (straggler: group_ratio).", ge=1
    )
    delta: Float | None = field(
        None,
        "Long-run budget on the mean straggler cost of `straggler` (unitless, in (0, 1)), the "
        "paper's constrained mode: e.g. 0.6 with tail_share (at most 60 % of a group's decode "
        "steps spent on its tail, run average) or 0.1 with group_ratio (at most 10 % of groups "
        "with an event). null (the default) = no budget: G maximises benefit per second, the "
        "straggler priced in seconds through each rung's expected longest row "
        "(docs/sagc.md, \"No budget by default\").",
        gt=0,
        lt=1,
    )
    V: Float = field(
        1.0,
        "Weight of the normalised objective u(g) against Q * risk(g) (only with a delta budget: "
        "without one the choice is the argmax of u).",
        ge=0,
    )
    half_life: Float = field(
        100.0,
        "Steps; forgetting of risk/pass-rate statistics within a regime (change detection "
        "restarts them on a shift). Also sets the truncation-rate memory (1x), the benefit "
        "rate's (5x), the length trend's (3x), the credit horizon (3x) and the change test's "
        "depth (a third, rounded to a power of two).",
        gt=0,
    )
    risk: Annotated[Str, AfterValidator(_risk)] = field(
        "q90", "'mean' or an upper posterior quantile 'qNN' (50 < NN < 100)."
    )
    warmup_steps: Int = field(4, "Steps held at initial_group_size before deciding.", ge=0)
    batch_policy: Literal["prompts", "rollouts"] = field(
        "prompts", "prompts: B fixed (rows = B * g); rollouts: B = rollouts_per_step // g."
    )
    rollouts_per_step: Int | None = field(
        None, "Rows per step when batch_policy is 'rollouts'; divisible by every group size.", ge=1
    )
    benefit: Literal["groups", "any_group", "diminishing"] = field(
        "any_group",
        "What one step is worth (benefit(g) in benefit per second). any_group: P(at least one "
        "of the step's groups is informative), flat in the batch beyond that (the default since "
        "2026-12-07, docs/sagc.md \"What one step is worth\"); groups: informative groups x "
        "(1 - 1/g), the paper's group-variance benefit; diminishing: n / (n + 1) of the step's "
        "n informative groups (each further group worth less; an option, not the default: "
        "below it on arith1 on this CPU's clock, docs/sagc.md).",
    )
    timing: Literal["measured", "model"] = field(
        "measured",
        "Where the per-shape step cost comes from. measured: wall-clock of each rollout (true to "
        "the hardware, but G then depends on timing noise, so two runs of one seed can "
        "diverge); model: seconds from the linear time_model (deterministic: exact resume "
        "and replay).",
    )
    time_model: TimeModelSection = Field(
        default_factory=TimeModelSection,
        description="The linear time model of timing: model (seconds; see its keys).",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        """Refuse the keys issue 32 removed (one line: what each became)."""
        if isinstance(data, dict):
            for key in data:
                if key in REMOVED_KEYS:
                    raise rule_error(str(key), REMOVED_KEYS[key])
        return data

    @property
    def start_group_size(self) -> int:
        """``initial_group_size``, or the largest rung when it is null (left unresolved in the
        config itself, so that an override of ``group_sizes`` alone moves it too): a static
        run's G; SAGC's start when null is the prior's (``controller.start_index``)."""
        return self.group_sizes[-1] if self.initial_group_size is None else self.initial_group_size

    @model_validator(mode="after")
    def _rules(self) -> SAGCConfig:
        gs = self.group_sizes
        if not gs:
            raise rule_error("group_sizes", "must not be empty")
        if any(b <= a for a, b in itertools.pairwise(gs)):
            raise rule_error("group_sizes", f"must be strictly increasing, got {list(gs)}")
        if self.initial_group_size is not None and self.initial_group_size not in gs:
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
        return self
