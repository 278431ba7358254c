"""SAGC's fixed internals: what used to be ``sagc:`` config fields and is now one constant each.

Issue 32 cut the ``sagc:`` section to the knobs a user should set (:mod:`sagc_jax.config.sagc`).
Everything else the controller reads lives here, in one frozen dataclass, at exactly the value
it had as a config default (so behaviour is unchanged). The memories are derived from
``sagc.half_life`` (the ``*_x`` multipliers, the change test's depth) and the residual ring from
``sagc.group_sizes``.

The controller's entry points (``init_state``, ``observe``, ``choose``, the policies) take the
constants as an explicit ``consts`` argument and hand them down to every function they call;
``consts=None`` (the default) means the shipped :data:`CONSTANTS`. Nothing patches them
in-process: an ablation or a replay builds its own and passes it in::

    import dataclasses
    from sagc_jax.config import sagc_constants as sc
    free = dataclasses.replace(sc.CONSTANTS, max_rung_step=0)
    policy = SAGCPolicy(cfg, consts=free)          # or choose(cfg, state, free), ...

A SAGC run records the constants it ran under in ``<run.dir>/sagc_constants.json``
(:func:`save_constants`), so its decisions replay exactly after the code's constants move on
(:func:`load_constants`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

__all__ = [
    "CONSTANTS",
    "CONSTANTS_FILE",
    "FIXED_START",
    "FLAT_MODEL_COST",
    "ROW_MEMORIES",
    "SAGCConstants",
    "change_window",
    "credit_horizon",
    "length_half_life",
    "load_constants",
    "rate_half_life",
    "resolve",
    "save_constants",
    "trend_half_life",
    "window_rows",
    "window_steps",
]


@dataclasses.dataclass(frozen=True)
class SAGCConstants:
    """The controller's constants; each comment gives the reason for its value (docs/sagc.md,
    "Constants", says which were measured by an ablation and which are still argued)."""

    # Straggler event (straggler: group_ratio): a row cut at max_new_tokens is a straggler
    # whatever the median, since its true length is unknown and at least the cap.
    count_truncated: bool = True
    # Judge the smallest rung on its posterior mean risk: holding it for uncertainty buys no
    # safety (there is no safer rung), and a quantile that remembers a heavy start holds it long.
    floor_on_mean: bool = True
    # A group of G rows extended by the length model to g > G counts as (G/g)^p groups of
    # evidence about g: 1 would trust the model as exact; 2 lets direct observations win fast.
    extrapolation_power: float = 2.0
    # Rungs G may move UP per step (down is unlimited); 0 = unlimited. One: a larger rung is
    # tried a step at a time, as its risk is known only by extrapolation until it is run.
    max_rung_step: int = 1
    # Only rungs with risk <= the cap are eligible (False: the queue alone steers).
    hard_filter: bool = True
    # The rung just above the feasible ones is eligible too, so the queue time-shares the two
    # rungs that bracket delta (the optimal stationary constrained policy) instead of wasting
    # budget.
    share_budget: bool = True
    # reward > this counts as a pass (benefit model; rewards of the shipped tasks are 0/1).
    pass_threshold: float = 0.5
    # EM steps from the moments Beta toward the likelihood of the pass counts; 5 fixes most of
    # the Beta's under-prediction on real (non-Beta) pass rates and stays a smoothed fit.
    pass_em_iters: int = 5
    # EMA weight of a new per-shape timing measurement: averages step-to-step noise over ~3 steps.
    cost_ema: float = 0.3
    # The length model reads the rows and group medians of the last `window_steps` steps (and
    # none before the last change): lengths drift per update, not per row, so a memory counted
    # in rows was ~16 steps at the simulator's 16 prompts/step but a whole 48-step real run at
    # 2 prompts/step (issue 49: second-half seconds over-predicted 4.5x). How many steps is
    # derived, half the change test's depth (change_window(cfg) / 2 = 16): 8 or 32 steps moved
    # no workload > 0.4 % (40 seeds, benchmarks/sagc_ablation.md). False = no step window (the
    # rings' capacity alone: ROW_MEMORIES).
    step_memory: bool = True
    # Capacity of the ring of untruncated row length / group median: at least this many rows
    # (and always at least window_rows_per_rung x the largest rung); bounds the memory when
    # steps are large (the simulator's G = 16: 8 steps).
    window_rows_min: int = 2048
    window_rows_per_rung: int = 4
    # Capacity of the ring of recent group medians (tokens) for the bootstrap of E[decode steps].
    window_groups: int = 256
    # Monte-Carlo subsets / bootstrap draws per group and candidate (noise well below the
    # posterior's at the step cost of a few ms).
    mc_samples: int = 64
    # Beta prior on each rung's risk: Jeffreys (uninformative, proper).
    prior_a: float = 0.5
    prior_b: float = 0.5
    # Memories as multiples of sagc.half_life (the per-row truncation rate's is half_life
    # itself: 0.5x or 2x moved no workload > 0.9 %, 40 seeds, benchmarks/sagc_ablation.md):
    # lambda's discounted realised rate when no horizon is known (5x: a run-long price, not a
    # step's), the regression of log length on step (3x: a trend needs more steps than a
    # rate), and the steps over which saved budget credit may be spent (3x). 0 for the trend =
    # none (flat).
    rate_half_life_x: float = 5.0
    trend_half_life_x: float = 3.0
    credit_horizon_x: float = 3.0
    # Change detection: likelihood-ratio statistic (about chi-square(1); false-alarm rate near
    # 1e-4 per test) above which a change is declared; 0 = none. (Its depth, the longest
    # window tested, is derived from half_life: change_window.)
    change_threshold: float = 15.0
    # Unused straggler budget saved for later, at most this much (0 = the queue counts debt only).
    credit_cap: float = 100.0
    # Weight, in rows, of the truncation-rate prior (the run's pooled rate): a regime that has
    # just begun is a priori like the run so far, so a few hundred clean rows after a change do
    # not price the largest rungs as if loops were gone. Rows, not steps: a rate's evidence is
    # rows, and 8 steps of rows (1000 at 16 prompts x G = 8) cost loop_bursts 2.3 % at 2 prompts
    # a step (20 seeds; docs/results/sagc_real/README.md, "Memories in steps").
    trunc_prior_rows: float = 1000.0
    # The pooled rate's own pseudo-counts (truncations, rows) before any row is seen: 10 %.
    trunc_pooled_prior: tuple[float, float] = (0.1, 1.0)
    # The length trend counts only slopes more than this many standard errors from 0, and only
    # after this many steps of weight (z = 2 and 20 steps read the steps between a jump in
    # lengths and its detection as a change as growth: drift 1.069 vs 1.072 over 40 seeds).
    trend_z: float = 3.0
    trend_min_weight: float = 50.0
    # An unmeasured shape's interpolated seconds never go below this fraction of the smallest
    # measured shape's: a noisy negative slope (or, on the measured clock, the per-row guess
    # below the one shape measured) cannot make a shape free.
    cost_floor_frac: float = 0.5
    # `timing: model` prices every rung off its time model, tried or not. False: learned per
    # shape from the modelled seconds of the shapes run, flat for the others, as until
    # 2026-12-06 (FLAT_MODEL_COST). On a CPU-like time model (decode step at 32 rows 1.8x the
    # 8-row one) flat pricing from the warm-up's G = 16 priced 4 and 8 as dear as 16.
    model_cost_known: bool = True
    # `initial_group_size: null`: warm up at the rung the prior prices best (benefit under a
    # uniform pass rate per second of `sagc.time_model` with every group's longest row at the
    # cap); False: the largest, as until 2026-12-06 (FIXED_START). Same start on the default
    # accelerator-like model; on this CPU's, +1.4 % / +5.0 % mean benefit/s under the two
    # benefit laws (15 workloads x 40 seeds; docs/sagc.md, "The warm-up rung the prior picks").
    prior_start: bool = True
    # Seed of the controller's Monte-Carlo draws (key (seed, step, salt)); the simulator passes
    # its own seed instead (init_state(cfg, seed=...)), as it always did.
    seed: int = 0


#: SAGC warming up at the largest rung whatever the time model (2026-12-06, issue 49): runs
#: recorded before then replay exactly with these constants too.
FIXED_START: dict[str, Any] = {"prior_start": False}

#: The shipped constants (what ``consts=None`` means); build others with ``dataclasses.replace``.
CONSTANTS = SAGCConstants()

#: The length model's memories before its rings were read over steps (2026-12-05, issue 49):
#: back to their capacity. Runs recorded before then replay exactly under
#: ``dataclasses.replace(CONSTANTS, **ROW_MEMORIES)``.
ROW_MEMORIES: dict[str, Any] = {"step_memory": False}

#: `timing: model` pricing an unrun shape flat at the seconds of those run (2026-12-06, issue
#: 49): runs recorded before then replay exactly with these constants too.
FLAT_MODEL_COST: dict[str, Any] = {"model_cost_known": False}


#: The file in a run directory that holds the constants the run's controller ran under.
CONSTANTS_FILE = "sagc_constants.json"


def save_constants(path: str | os.PathLike[str], consts: SAGCConstants | None = None) -> None:
    """Write ``consts`` (None: the shipped ones) to ``path`` as JSON, one key per constant."""
    with open(path, "w") as f:
        json.dump(dataclasses.asdict(resolve(consts)), f, indent=1, sort_keys=True)
        f.write("\n")


def load_constants(path: str | os.PathLike[str]) -> SAGCConstants:
    """The constants a run recorded (:func:`save_constants`). Strict both ways, because a run
    replays exactly only under all of its constants: a key the file lacks (a constant added
    after the run; its old behaviour is the caller's to pin) or one it has that no longer
    exists raises ValueError naming the keys and the file."""
    with open(path) as f:
        raw = _retire(json.load(f), os.fspath(path))
    names = {f.name for f in dataclasses.fields(SAGCConstants)}
    missing, unknown = sorted(names - raw.keys()), sorted(raw.keys() - names)
    if missing or unknown:
        raise ValueError(f"{os.fspath(path)}: SAGC constants missing {missing}, unknown "
                         f"{unknown}; the file was written by another version of sagc-jax")
    return SAGCConstants(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def _retire(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """A recorded file's retired constants: ``window_steps`` (until 2026-12-07) was
    change_window / 2 (now ``step_memory``) or 0 (ROW_MEMORIES); ``length_half_life_x`` was 1
    (the truncation rate's memory is now half_life itself); ``change_window`` (until
    2026-12-08) was 32, what :func:`change_window` derives from the default half_life of 100
    that every run recorded before then used. Another value has no equivalent now and raises
    ValueError naming the file."""
    raw = dict(raw)
    if "window_steps" in raw and "step_memory" not in raw:
        w = raw.pop("window_steps")
        if w not in (0, raw.get("change_window", _RECORDED_DEPTH) // 2):
            raise ValueError(f"{path}: window_steps={w} is retired (now change_window / 2 "
                             "steps, or none); the run does not replay under this version")
        raw["step_memory"] = w != 0
    if raw.get("length_half_life_x", 1.0) != 1.0:
        raise ValueError(f"{path}: length_half_life_x={raw['length_half_life_x']} is retired "
                         "(now half_life itself); the run does not replay under this version")
    raw.pop("length_half_life_x", None)
    if raw.get("change_window", _RECORDED_DEPTH) != _RECORDED_DEPTH:
        raise ValueError(f"{path}: change_window={raw['change_window']} is retired (now derived "
                         "from half_life); the run does not replay under this version")
    raw.pop("change_window", None)
    return raw


#: The change test's depth every run recorded before 2026-12-08 ran under (half_life 100).
_RECORDED_DEPTH = 32


def resolve(consts: SAGCConstants | None) -> SAGCConstants:
    """``consts`` as passed, or the shipped ones (None: :data:`CONSTANTS`)."""
    return CONSTANTS if consts is None else consts


def length_half_life(cfg: Any) -> float:
    """Steps; forgetting of the per-row truncation rate: ``sagc.half_life`` itself."""
    return float(cfg.half_life)


def rate_half_life(cfg: Any, consts: SAGCConstants | None = None) -> float:
    """Steps; memory of lambda's discounted realised rate without a horizon (5 x half_life)."""
    return resolve(consts).rate_half_life_x * cfg.half_life


def trend_half_life(cfg: Any, consts: SAGCConstants | None = None) -> float:
    """Steps; memory of the log-length trend (3 x half_life); 0 = no trend."""
    return resolve(consts).trend_half_life_x * cfg.half_life


def credit_horizon(cfg: Any, consts: SAGCConstants | None = None) -> float:
    """Steps over which saved credit may be spent: risk cap = delta + credit / this."""
    return resolve(consts).credit_horizon_x * cfg.half_life


def change_window(cfg: Any) -> int:
    """Steps; depth of the change test (its windows are the last 1, 2, 4, ... steps up to it):
    a third of ``sagc.half_life``, rounded to a power of two, at least 2 (32 at the default
    100). 16 and 64 moved no workload > 0.6 % (40 seeds, benchmarks/sagc_ablation.md), so it
    is no constant of its own; it follows the memory, so a shorter memory tests shorter
    windows."""
    return int(max(2, 2 ** round(math.log2(float(cfg.half_life) / 3.0))))


def window_steps(depth: int, consts: SAGCConstants | None = None) -> int:
    """Steps the length model reads back: half the change test's depth (``depth``: that of the
    state's per-step sums, :func:`change_window` at init); 0 = no step window."""
    return depth // 2 if resolve(consts).step_memory else 0


def window_rows(cfg: Any, consts: SAGCConstants | None = None) -> int:
    """Rows; length of the residual ring: max(window_rows_min, window_rows_per_rung x max rung)."""
    c = resolve(consts)
    return max(c.window_rows_min, c.window_rows_per_rung * max(cfg.group_sizes))
