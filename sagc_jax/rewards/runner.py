"""Evaluating a reward bundle safely: per-call timeouts, value checks, weighted totals.

:func:`compute_rewards` evaluates a bundle of :class:`~sagc_jax.rewards.registry.RewardFn`
and returns the weighted total plus per-function values, turning any misbehaviour (an
exception, the wrong number of values, a non-finite or non-numeric value) into a
:class:`RewardError` naming the function and the example index — or, with ``on_error="zero"``, a
0 reward for the offending examples, counted and reported. ``None`` in a function's list means
"not applicable to this example" (TRL) and counts as 0.0 in the total; a completion that *every*
function scores ``None`` is marked unscored (:attr:`RewardResult.scored`), so the learner leaves
it out of its group's statistics and the loss.

A function with a ``timeout_s`` (config ``reward_timeout_s``, `registry.build_reward_fns`) is called
in a worker thread and waited for at most that long per call; a call that does not return in
time is a failure like an exception (retried one example at a time to name the example). A
Python thread cannot be stopped: the stuck call is abandoned and keeps running in a daemon thread
(it holds whatever CPU or memory it uses until it returns or the process exits).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sagc_jax.rewards.registry import RewardFn, check_unique

logger = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """A reward function raised or returned something unusable."""


@dataclasses.dataclass
class RewardResult:
    """Output of :func:`compute_rewards`.

    Attributes:
      total: ``Σ weight · per_fn`` per completion, float32 ``[n]``.
      per_fn: unweighted values per function name, float32 ``[n]``.
      num_errors: number of (function, example) values replaced by 0 (``on_error="zero"``).
      messages: one warning per failure.
      scored: bool ``[n]``; False where every function returned ``None`` (not applicable).
    """

    total: np.ndarray
    per_fn: dict[str, np.ndarray]
    num_errors: int = 0
    messages: list[str] = dataclasses.field(default_factory=list)
    scored: np.ndarray | None = None


class RewardTimeout(Exception):
    """A reward call that did not return within its `timeout_s` (it was abandoned)."""


def call_with_timeout(call: Callable[[], Any], timeout_s: float | None, *, thread_name: str,
                      setting: str = "reward_timeout_s") -> Any:
    """``call()``; with `timeout_s`, in a daemon thread waited for that long (raises
    RewardTimeout naming `setting`; the thread is left running: see the module docstring).
    Rewards and environments (`sagc_jax.envs`) share it."""
    if timeout_s is None:
        return call()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = call()
        except BaseException as exc:  # handed to the caller's thread, raised there
            box["exc"] = exc

    # A daemon thread, not an executor: executor threads are joined at exit, so an abandoned
    # call would hang the process's shutdown.
    t = threading.Thread(target=work, name=thread_name, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise RewardTimeout(f"did not return within {timeout_s:g} s ({setting}; the "
                            "call was abandoned)")
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def _call(rf: RewardFn, prompts: list[str], completions: list[str], columns: dict) -> Any:
    """``rf.fn(...)`` within ``rf.timeout_s`` (`call_with_timeout`)."""
    return call_with_timeout(lambda: rf.fn(prompts, completions, **columns), rf.timeout_s,
                             thread_name=f"reward-{rf.name}")


def _check_values(rf: RewardFn, out: Any, n: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Convert ``out`` to float32 ``[n]``; returns the values and ``(index, problem)`` list.

    Raises RewardError if ``out`` is not a sequence of length n (whole-batch problem).
    """
    try:
        m = len(out)
    except TypeError:
        raise RewardError(
            f"reward {rf.name!r} returned {type(out).__name__}, expected a list of {n} floats"
        ) from None
    if m != n:
        raise RewardError(f"reward {rf.name!r} returned {m} values for {n} completions")
    vals = np.zeros(n, dtype=np.float32)
    bad: list[tuple[int, str]] = []
    for i, v in enumerate(out):
        try:
            if isinstance(v, str | bytes):
                raise TypeError
            f = 0.0 if v is None else float(v)  # None: not applicable, counts 0.0
        except (TypeError, ValueError):
            bad.append((i, f"non-numeric value {v!r}"))
            continue
        if not math.isfinite(f):
            bad.append((i, f"non-finite value {f}"))
            continue
        vals[i] = f
    return vals, bad


def _per_example(rf: RewardFn, prompts: list[str], completions: list[str], columns: dict,
                 stop_at_timeout: bool = False
                 ) -> tuple[np.ndarray, list[tuple[int, str]], np.ndarray]:
    """Call ``rf`` one example at a time; returns values, per-index problems, None flags
    (`stop_at_timeout`: stop at the first call that times out)."""
    n = len(completions)
    vals = np.zeros(n, dtype=np.float32)
    nones = np.zeros(n, dtype=bool)
    bad: list[tuple[int, str]] = []
    for i in range(n):
        cols = {k: [v[i]] for k, v in columns.items()}
        try:
            out = _call(rf, [prompts[i]], [completions[i]], cols)
        except RewardTimeout as exc:
            bad.append((i, str(exc)))
            if stop_at_timeout:
                break  # the caller raises: do not wait out the other examples too
            continue
        except Exception as exc:
            bad.append((i, f"raised {type(exc).__name__}: {exc}"))
            continue
        try:
            v, b = _check_values(rf, out, 1)
        except RewardError as exc:
            bad.append((i, str(exc)))
            continue
        if b:
            bad.append((i, b[0][1]))
        else:
            vals[i] = v[0]
            nones[i] = out[0] is None
    return vals, bad, nones


def compute_rewards(reward_fns: Sequence[RewardFn], prompts: Sequence[str],
                    completions: Sequence[str], columns: Mapping[str, Sequence[Any]] | None = None,
                    on_error: str = "raise") -> RewardResult:
    """Evaluate every reward function on a batch and combine them with their weights.

    Args:
      reward_fns: the bundle (names must be unique).
      prompts, completions: aligned lists of length ``n``.
      columns: extra dataset columns, each a list of length ``n`` (passed as keyword arguments).
      on_error: ``"raise"`` → :class:`RewardError` naming the function and the first bad example
        index; ``"zero"`` → 0 for the offending examples (the whole batch when a function returns
        the wrong number of values), counted in ``num_errors`` with a message and a log warning.

    A function that raises (or times out, see :class:`RewardFn`.timeout_s) on the batch is
    retried one example at a time to find the failing index; the other examples keep their
    per-example values. With ``on_error="raise"`` the retry stops at the first example that
    times out; with ``"zero"`` every example that times out costs up to ``timeout_s``.
    """
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_error must be 'raise' or 'zero', got {on_error!r}")
    prompts, completions = list(prompts), list(completions)
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions")
    cols: dict[str, list[Any]] = {}
    for k, v in (columns or {}).items():
        v = list(v)
        if len(v) != n:
            raise ValueError(f"column {k!r} has {len(v)} values for {n} completions")
        cols[k] = v
    check_unique(reward_fns)

    total = np.zeros(n, dtype=np.float32)
    scored = np.zeros(n, dtype=bool)
    per_fn: dict[str, np.ndarray] = {}
    num_errors = 0
    messages: list[str] = []

    def fail(msg: str, count: int, cause: BaseException | None = None) -> None:
        nonlocal num_errors
        if on_error == "raise":
            raise RewardError(msg) from cause
        num_errors += count
        messages.append(msg + " (set to 0)")
        logger.warning("%s (set to 0)", msg)

    for rf in reward_fns:
        nones = np.zeros(n, dtype=bool)  # a failed value (on_error="zero") counts as scored 0
        try:
            out = _call(rf, prompts, completions, cols)
        except Exception as exc:
            vals, bad, nones = _per_example(rf, prompts, completions, cols,
                                            stop_at_timeout=on_error == "raise")
            if bad:
                # Prefer the first example that raises; other problems are counted too.
                i, problem = next(((i, p) for i, p in bad
                                   if p.startswith(("raised", "did not return"))), bad[0])
                fail(f"reward {rf.name!r} failed on example {i}: {problem}", len(bad), exc)
            else:
                what = (f"timed out ({exc})" if isinstance(exc, RewardTimeout)
                        else f"raised {type(exc).__name__}: {exc}")
                fail(f"reward {rf.name!r} failed on the batch of {n} (no single example "
                     f"reproduces it): {what}", n, exc)
                vals = np.zeros(n, dtype=np.float32)
        else:
            try:
                vals, bad = _check_values(rf, out, n)
            except RewardError as exc:
                fail(str(exc), n)
                vals = np.zeros(n, dtype=np.float32)
            else:
                nones = np.fromiter((v is None for v in out), dtype=bool, count=n)
                if bad:
                    i, problem = bad[0]
                    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                    fail(f"reward {rf.name!r} returned a bad value for example {i}: "
                         f"{problem}{more}", len(bad))
        per_fn[rf.name] = vals
        total += np.float32(rf.weight) * vals
        scored |= ~nones
    return RewardResult(total=total, per_fn=per_fn, num_errors=num_errors, messages=messages,
                        scored=scored)


#: Example fields that are not reward-function keyword arguments.
NOT_COLUMNS = frozenset({"prompt", "prompt_ids", "solution"})


def score_groups(reward_fns: Sequence[RewardFn], examples: Sequence[Mapping[str, Any]], g: int,
                 completions: Sequence[str], on_error: str = "raise") -> RewardResult:
    """Rewards of `len(examples) * g` prompt-major completions (row r answers example r // g).

    Every example field except the prompt text/ids and the SFT solution (the columns of the
    first example) is passed to the reward functions as a keyword argument, repeated g times.
    """
    prompts = [ex["prompt"] for ex in examples for _ in range(g)]
    keys = [k for k in examples[0] if k not in NOT_COLUMNS] if examples else []
    columns = {k: [ex.get(k) for ex in examples for _ in range(g)] for k in keys}
    return compute_rewards(reward_fns, prompts, completions, columns, on_error=on_error)
