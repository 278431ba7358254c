"""The SAGC controller's typed state: one immutable NamedTuple per sub-model, and ``SAGCState``.

Each sub-state holds numpy arrays with static shapes (K = len(sagc.group_sizes) rungs; the
comment on every field gives its unit). NamedTuples are pytrees as they are (``jax.tree``,
Orbax ``StandardSave/Restore``), need no registration and no jax import here; a field is read
by name (``state.budget.queue``) and a new state is built with ``_replace`` — the update
functions never write into an array they were given. A checkpoint stores the state as the
nested dict ``as_dict`` gives (sub-model -> field -> array, the layout since issue 32), and
``normalize_state`` turns such a dict (or a typed state) back into the typed state, so
checkpoints written before the state was typed still resume.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sagc_jax.config.sagc_constants import SAGCConstants, change_window, resolve, window_rows

#: Reason codes of a decision (stored as an index: strings are not pytree leaves).
REASONS: tuple[str, ...] = ("init", "warmup", "score", "no_feasible", "toward_feasible", "static")


class Decision(NamedTuple):
    """The decision clock and the last ``choose``'s outcome."""

    step: np.ndarray  # int64 []: observations folded in so far (also the RNG counter)
    seed: np.ndarray  # int64 []: seed of the Monte-Carlo draws
    horizon: np.ndarray  # int64 []: steps in the run; 0 = unknown
    g_idx: np.ndarray  # int64 []: rung index of the last observed (or initial) group size
    last_reason: np.ndarray  # int64 []: index into REASONS
    last_choice: np.ndarray  # int64 []: rung index of the last choice; -1 = none yet
    last_score: np.ndarray  # float64 [K]: last choice's score per rung (unitless)


class Budget(NamedTuple):
    """The straggler budget's signed balance (units: straggler cost x steps)."""

    queue: np.ndarray  # float64 []: virtual queue Q (budget debt)
    credit: np.ndarray  # float64 []: unused budget saved for later, <= credit_cap
    last_rate: np.ndarray  # float64 []: s_t, the last step's mean straggler cost (unitless)


class Risk(NamedTuple):
    """Per-rung straggler risk: discounted Beta pseudo-counts (groups; prior added on read)."""

    a: np.ndarray  # float64 [K]: discounted events (or tail shares), groups
    b: np.ndarray  # float64 [K]: discounted non-events (or 1 - tail shares), groups
    last: np.ndarray  # float64 [K]: last step's counterfactual risk (probability; diagnostic)
    # The last change_window(cfg) steps' own sums, newest first (change detection):
    hist_a: np.ndarray  # float64 [change_window, K]: weighted events per rung, groups
    hist_n: np.ndarray  # float64 [change_window, K]: weighted groups per rung


class Length(NamedTuple):
    """The "median x residual" length model, the truncation rate and the length trend."""

    eps_ring: np.ndarray  # float64 [window_rows]: untruncated row length / group median
    rows_seen: np.ndarray  # int64 []: residuals written to eps_ring so far (rows)
    med_ring: np.ndarray  # float64 [window_groups]: recent group medians (tokens)
    groups_seen: np.ndarray  # int64 []: medians written to med_ring so far (groups)
    trunc_s: np.ndarray  # float64 [2]: discounted sums (rows, truncated rows)
    trunc_total: np.ndarray  # float64 [2]: the same over the whole run (the prior's mean)
    hist_tr: np.ndarray  # float64 [change_window, 3]: per step rows, truncated rows, groups
    rows_since: np.ndarray  # int64 []: rows_seen at the last change (read only what came after)
    groups_since: np.ndarray  # int64 []: groups_seen at the last change
    exp_steps: np.ndarray  # float64 [K]: bootstrap E[decode steps] at each g (0 = unknown)
    # Discounted sums of 1, t, t^2, y, t*y, y^2; t in steps, y = log median length (tokens)
    trend_s: np.ndarray  # float64 [6]


class Benefit(NamedTuple):
    """Pass counts (the benefit model) and the realised benefit rate (λ's sums)."""

    pass_hist: np.ndarray  # float64 [K, max g + 1]: discounted count of groups with k passes
    rate_s: np.ndarray  # float64 [2]: discounted realised (benefit, seconds) (λ)
    total_s: np.ndarray  # float64 [2]: the same, undiscounted, over the whole run
    rate_now: np.ndarray  # float64 [3]: (benefit, seconds, steps), recent (half_life)


class Cost(NamedTuple):
    """Per-shape timings (seconds) and the step's shape facts."""

    prefill_s: np.ndarray  # float64 [K]: EMA prefill seconds per compiled shape
    decode_step_s: np.ndarray  # float64 [K]: EMA seconds per decode step per shape
    measured: np.ndarray  # bool [K]: the shape has been timed
    prompts: np.ndarray  # int64 []: last observed prompts per step (prompts policy)
    max_new_tokens: np.ndarray  # int64 []: tokens
    decode_chunk: np.ndarray  # int64 []: decode steps per chunk (>= 1)
    # Realised decode steps / those of the longest row (1 for single turns; episodes run each
    # turn to its longest row, so theirs is > 1, issue 53): discounted sums of 1, x, x^2, y,
    # x*y with x = log2(rows), y = the ratio - 1, for its line in log rows.
    steps_fit: np.ndarray  # float64 [5]
    env_s: np.ndarray  # float64 [K]: EMA seconds per step in environment calls per shape


class Change(NamedTuple):
    """Change detection (a windowed likelihood-ratio test)."""

    changes: np.ndarray  # int64 []: change points detected so far
    change_step: np.ndarray  # int64 []: first step of the current regime
    last_llr: np.ndarray  # float64 []: largest change statistic of the last step (unitless)


class SAGCState(NamedTuple):
    """The controller's whole state: one sub-state per sub-model (a pytree of numpy arrays)."""

    decision: Decision
    budget: Budget
    risk: Risk
    length: Length
    benefit: Benefit
    cost: Cost
    change: Change


State = SAGCState  # the name the controller's functions were typed with

#: Sub-model -> its sub-state's class (the order of the fields is the checkpoint's key order).
SUBSTATES: dict[str, type] = {
    "decision": Decision, "budget": Budget, "risk": Risk, "length": Length, "benefit": Benefit,
    "cost": Cost, "change": Change,
}

#: Sub-model -> its keys (the state's layout; ``init_state`` gives shapes, the classes units).
LAYOUT: dict[str, tuple[str, ...]] = {m: cls._fields for m, cls in SUBSTATES.items()}


def init_state(
    cfg: Any,
    *,
    horizon: int | None = None,
    seed: int | None = None,
    consts: SAGCConstants | None = None,
    prompts: int | None = None,
    max_new_tokens: int | None = None,
) -> SAGCState:
    """Fresh controller state for an ``SAGCConfig``: numpy arrays with static shapes.

    ``horizon``: steps in the run (the trainer passes run.steps, the simulator its steps);
    None = unknown (λ is then the discounted realised rate). ``seed``: of the Monte-Carlo draws
    (None = the constant seed, 0; the simulator passes its own). Both are kept in the state, so
    a resumed run keeps them. K = len(group_sizes) candidates. ``consts``: the constants that
    size the rings and windows and give the default seed (None: the shipped ones).
    ``prompts`` (the run's prompts a step) and ``max_new_tokens``: the step's shape before any
    observation (None: unknown, 0), so the first choice can price the rungs; every observation
    overwrites them.
    """
    c = resolve(consts)
    k = len(cfg.group_sizes)
    f64 = np.float64
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    if horizon is not None and int(horizon) < 1:
        raise ValueError(f"SAGC horizon: must be >= 1 steps or None, got {horizon}")
    win = change_window(cfg)
    return SAGCState(
        decision=Decision(
            step=i64(0), seed=i64(c.seed if seed is None else seed),
            horizon=i64(0 if horizon is None else horizon),
            g_idx=i64(cfg.group_sizes.index(cfg.start_group_size)),
            last_reason=i64(0), last_choice=i64(-1), last_score=np.zeros(k, f64),
        ),
        budget=Budget(queue=np.array(0.0, f64), credit=np.array(0.0, f64),
                      last_rate=np.array(0.0, f64)),
        risk=Risk(a=np.zeros(k, f64), b=np.zeros(k, f64), last=np.zeros(k, f64),
                  hist_a=np.zeros((win, k), f64), hist_n=np.zeros((win, k), f64)),
        length=Length(
            eps_ring=np.ones(window_rows(cfg, c), f64), rows_seen=i64(0),
            med_ring=np.ones(c.window_groups, f64), groups_seen=i64(0),
            trunc_s=np.zeros(2, f64), trunc_total=np.zeros(2, f64),
            hist_tr=np.zeros((win, 3), f64), rows_since=i64(0), groups_since=i64(0),
            exp_steps=np.zeros(k, f64), trend_s=np.zeros(6, f64),
        ),
        benefit=Benefit(pass_hist=np.zeros((k, max(cfg.group_sizes) + 1), f64),
                        rate_s=np.zeros(2, f64), total_s=np.zeros(2, f64),
                        rate_now=np.zeros(3, f64)),
        cost=Cost(prefill_s=np.zeros(k, f64), decode_step_s=np.zeros(k, f64),
                  measured=np.zeros(k, bool), prompts=i64(prompts or 0),
                  max_new_tokens=i64(max_new_tokens or 0),
                  decode_chunk=i64(1), steps_fit=np.zeros(5, f64), env_s=np.zeros(k, f64)),
        change=Change(changes=i64(0), change_step=i64(0), last_llr=np.array(0.0, f64)),
    )


def as_dict(state: SAGCState) -> dict[str, dict[str, np.ndarray]]:
    """The nested-dict form (sub-model -> field -> array; arrays shared, not copied): what a
    checkpoint stores, the layout since issue 32."""
    return {m: dict(sub._asdict()) for m, sub in state._asdict().items()}


def copy_state(state: SAGCState) -> SAGCState:
    """A deep copy (every array copied)."""
    return SAGCState(*(type(sub)(*(np.array(v, copy=True) for v in sub)) for sub in state))


#: Keys of the flat state before issue 32 (one is named when such a state is refused).
_FLAT_KEYS = frozenset({
    "queue", "credit", "risk_a", "risk_b", "risk_last", "prefill_s", "decode_step_s", "step",
    "seed", "g_idx", "eps_ring", "pass_hist", "trunc_s", "hist_a", "changes", "trend_s",
})


def state_layout_error(keys: Any) -> str | None:
    """One line if ``keys`` (a restored state's top-level keys) are the old flat layout."""
    old = sorted(_FLAT_KEYS & {str(k) for k in keys})
    if not old:
        return None
    return (f"SAGC state key {old[0]!r} is from the old flat layout: the SAGC state layout "
            "changed in the controller core rewrite (issue 32); resume that checkpoint with the "
            "version that wrote it, or start a new run.dir")


def normalize_state(
    cfg: Any, restored: SAGCState | dict[str, Any], consts: SAGCConstants | None = None
) -> SAGCState:
    """Coerce a restored state — the nested dict a checkpoint holds (numpy scalars / jax
    arrays), or a typed state — to the typed state with the exact dtypes and shapes.

    Keeps the restored horizon and seed (a resumed run goes on as it started). Raises
    ValueError (one line) on another layout: the pre-issue-32 flat state, or keys that differ.
    """
    if isinstance(restored, SAGCState):
        restored = as_dict(restored)
    msg = state_layout_error(restored)
    if msg:
        raise ValueError(msg)
    ref = as_dict(init_state(cfg, consts=consts))
    restored = _with_added_fields(restored, ref)
    got = {m: set(v) if isinstance(v, dict) else set() for m, v in restored.items()}
    want = {m: set(v) for m, v in ref.items()}
    if got != want:
        flat = lambda d: {f"{m}/{k}" for m, ks in d.items() for k in ks}  # noqa: E731
        missing, extra = sorted(flat(want) - flat(got)), sorted(flat(got) - flat(want))
        raise ValueError(
            f"SAGC state keys mismatch: missing {missing}, unexpected {extra} (a checkpoint "
            "written by another controller version; resume it with that version, or start "
            "the controller afresh)"
        )
    subs = {}
    for m, sub in ref.items():
        fields = {}
        for k, v in sub.items():
            arr = np.array(restored[m][k], dtype=v.dtype)
            if arr.shape != v.shape:
                raise ValueError(f"SAGC state {m}/{k}: shape {arr.shape}, expected {v.shape}")
            fields[k] = arr
        subs[m] = SUBSTATES[m](**fields)
    return SAGCState(**subs)


#: Fields added to the layout after issue 32, with the value a state written before them means
#: (its initial one): such a checkpoint resumes as if the field had always been there.
ADDED_FIELDS: tuple[tuple[str, str], ...] = (("cost", "steps_fit"), ("cost", "env_s"))


def _with_added_fields(restored: dict[str, Any], ref: dict[str, dict[str, np.ndarray]]
                       ) -> dict[str, Any]:
    """``restored`` with every missing ``ADDED_FIELDS`` entry set to its initial value (from
    ``ref``, a fresh state's ``as_dict``); other keys untouched."""
    out = dict(restored)
    for m, k in ADDED_FIELDS:
        sub = out.get(m)
        if isinstance(sub, dict) and k not in sub:
            out[m] = {**sub, k: ref[m][k]}
    return out


def with_fields(state: SAGCState, sub: str, **fields: Any) -> SAGCState:
    """``state`` with fields of the sub-state ``sub`` replaced (``_replace`` one level down):
    ``with_fields(st, "budget", queue=np.array(1.0))``. Unknown names raise ValueError."""
    return state._replace(**{sub: getattr(state, sub)._replace(**fields)})
