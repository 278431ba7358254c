"""Reward functions (host-side Python, TRL convention) and their safe evaluation.

A reward function is any callable ``fn(prompts: list[str], completions: list[str], **columns)
-> list[float]`` where ``columns`` are the dataset's other columns as lists aligned with
``completions`` (e.g. ``answer=[...]``). A function should accept ``**kwargs`` so unknown columns
are ignored. ``None`` in the returned list means "not applicable to this example" (TRL) and counts
as 0.0 in the total; a completion that *every* function scores ``None`` is marked unscored
(:attr:`RewardResult.scored`), so the learner leaves it out of its group's statistics and the loss.

In the config, rewards are named by a built-in name (:data:`BUILTIN_REWARDS`) or as
``"package.module:function"``, each with a weight; :func:`compute_rewards` evaluates them and
returns the weighted total plus per-function values, turning any misbehaviour (an exception, the
wrong number of values, a non-finite or non-numeric value) into a :class:`RewardError` naming the
function and the example index — or, with ``on_error="zero"``, a 0 reward for the offending
examples, counted and reported.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np

from sagc_jax.rl.verifiers import (
    math_verify_reward,
    reasoning_gym_reward,
    reasoning_gym_strict_reward,
)

__all__ = [
    "BUILTIN_REWARDS",
    "RewardError",
    "RewardFn",
    "RewardResult",
    "build_reward_fns",
    "compute_rewards",
    "exact_answer_reward",
    "extract_final_answer",
    "extract_gsm8k_answer",
    "format_reward",
    "gsm8k_reward",
    "normalize_number",
    "resolve_reward",
    "score_groups",
]

logger = logging.getLogger(__name__)

RewardCallable = Callable[..., Sequence[Any]]


class RewardError(RuntimeError):
    """A reward function raised or returned something unusable."""


class RewardNameError(ValueError):
    """A reward name that resolves to no callable (a config error: the message names it)."""


# ----------------------------------------------------------------------------- answer parsing

_NUM = r"-?\$?\s*-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_HASH_RE = re.compile(r"####\s*(" + _NUM + r")")
_NUM_RE = re.compile(_NUM)
_FORMAT_RE = re.compile(r"(?:^|\n)####[ \t]*-?\d[\d,]*(?:\.\d+)?[ \t]*$")


def normalize_number(text: str) -> str | None:
    """Canonical string of a number: ``"$1,234.50"`` → ``"1234.5"``, ``"42.0"`` → ``"42"``,
    ``"-3"`` → ``"-3"``. ``None`` if ``text`` is not a number."""
    s = str(text).strip()
    for junk in ("\\$", "$", "\\%", "%", ",", "\\,", "\\!", " "):
        s = s.replace(junk, "")
    s = s.rstrip(".")
    if s.startswith("--"):
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def extract_final_answer(completion: str) -> str | None:
    """The number after the first ``####`` marker (the built-in task's answer line), normalised."""
    m = _HASH_RE.search(completion)
    return normalize_number(m.group(1)) if m else None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_gsm8k_answer(text: str) -> str | None:
    """GSM8K-style final answer of a completion or reference, normalised.

    Order: the number after ``####``; else the content of the last ``\\boxed{...}``; else the last
    number in the text. ``None`` if there is no number.
    """
    ans = extract_final_answer(text)
    if ans is not None:
        return ans
    boxed = _last_boxed(text)
    if boxed is not None:
        num = normalize_number(boxed)
        if num is not None:
            return num
        nums = _NUM_RE.findall(boxed)
        if nums:
            return normalize_number(nums[-1])
    nums = _NUM_RE.findall(text)
    return normalize_number(nums[-1]) if nums else None


def _require_answers(name: str, n: int, answer: Sequence[Any] | None) -> Sequence[Any]:
    if answer is None:
        raise ValueError(f"reward {name!r} needs an 'answer' column")
    if len(answer) != n:
        raise ValueError(f"reward {name!r}: {len(answer)} answers for {n} completions")
    return answer


# ----------------------------------------------------------------------------- built-ins


def exact_answer_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    answer: Sequence[Any] | None = None,
    **_: Any,
) -> list[float]:
    """1.0 if the completion's ``#### N`` answer equals ``answer`` (numerically), else 0.0."""
    answers = _require_answers("exact_answer", len(completions), answer)
    out = []
    for c, a in zip(completions, answers):
        got = extract_final_answer(c)
        ref = normalize_number(str(a))
        out.append(1.0 if got is not None and got == ref else 0.0)
    return out


def gsm8k_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    answer: Sequence[Any] | None = None,
    **_: Any,
) -> list[float]:
    """1.0 if the GSM8K-style final answers of completion and reference agree, else 0.0.

    The reference may be a bare number or a full GSM8K solution ending in ``#### 42``.
    """
    answers = _require_answers("gsm8k", len(completions), answer)
    out = []
    for c, a in zip(completions, answers):
        ref = extract_gsm8k_answer(str(a))
        got = extract_gsm8k_answer(c)
        out.append(1.0 if ref is not None and got == ref else 0.0)
    return out


def format_reward(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 if the completion ends with a well-formed ``#### <number>`` line, else 0.0."""
    return [1.0 if _FORMAT_RE.search(c.rstrip()) else 0.0 for c in completions]


#: Built-in reward functions by config name.
BUILTIN_REWARDS: dict[str, RewardCallable] = {
    "exact_answer": exact_answer_reward,
    "gsm8k": gsm8k_reward,
    "format": format_reward,
    # External verifiers (rl/verifiers.py): reasoning-gym's score_answer, HF math-verify.
    "reasoning_gym": reasoning_gym_reward,
    "reasoning_gym_strict": reasoning_gym_strict_reward,
    "math_verify": math_verify_reward,
}


def resolve_reward(name: str) -> RewardCallable:
    """A reward callable from a built-in name or ``"package.module:function"``.

    Raises:
      RewardNameError: unknown built-in (lists them), unimportable module, missing or
        non-callable attribute — each message names what was asked for.
    """
    if not isinstance(name, str) or not name:
        raise RewardNameError(f"reward name must be a non-empty string, got {name!r}")
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if ":" not in name:
        raise RewardNameError(
            f"unknown reward {name!r}; built-ins: {', '.join(sorted(BUILTIN_REWARDS))} "
            "(or use 'package.module:function')"
        )
    mod_name, _, attr = name.partition(":")
    if not mod_name or not attr:
        raise RewardNameError(f"reward {name!r}: expected 'package.module:function'")
    module = _import_reward_module(name, mod_name)
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise RewardNameError(
                f"reward {name!r}: module {mod_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardNameError(f"reward {name!r}: {attr!r} is not callable")
    return fn


def _import_reward_module(name: str, mod_name: str) -> Any:
    """Imports a reward's module; a module in the current directory is found too (as with
    `python -m`), also when running the installed `sagc-jax` script, whose sys.path lacks it."""
    cwd = os.getcwd()
    top = mod_name.split(".")[0]
    for attempt in range(2):
        try:
            return importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name != top:  # the module exists but imports something missing
                raise RewardNameError(f"reward {name!r}: cannot import module {mod_name!r}: "
                                      f"{exc}") from None
            if attempt or cwd in sys.path or "" in sys.path:
                break
            sys.path.append(cwd)
        except Exception as exc:
            raise RewardNameError(f"reward {name!r}: importing module {mod_name!r} failed: "
                                  f"{type(exc).__name__}: {exc}") from None
    raise RewardNameError(f"reward {name!r}: cannot import module {mod_name!r}: no module "
                          f"{top!r} in the current directory ({cwd}) or on the Python path "
                          "(set PYTHONPATH to its directory)")


@dataclasses.dataclass(frozen=True)
class RewardFn:
    """A named, weighted reward function."""

    name: str
    fn: RewardCallable
    weight: float = 1.0

    @classmethod
    def from_name(cls, name: str, weight: float = 1.0) -> RewardFn:
        """Resolve ``name`` with :func:`resolve_reward`."""
        return cls(name, resolve_reward(name), float(weight))


def build_reward_fns(spec: Any) -> list[RewardFn]:
    """Reward bundle from a config value.

    Accepts a name (``"exact_answer"``), a list of names, a mapping ``{name: weight}``, or a list
    of mappings ``{"name": ..., "weight": ...}``, objects with ``.name``/``.weight`` (the config's
    ``RewardSpec``) or ``RewardFn`` objects.
    """
    if isinstance(spec, str):
        items: list[tuple[str, float]] = [(spec, 1.0)]
    elif isinstance(spec, Mapping):
        items = [(str(k), float(v)) for k, v in spec.items()]
    else:
        items = []
        out_fns: list[RewardFn] = []
        for entry in spec:
            if isinstance(entry, RewardFn):
                out_fns.append(entry)
            elif isinstance(entry, str):
                items.append((entry, 1.0))
            elif isinstance(entry, Mapping) and "name" in entry:
                items.append((str(entry["name"]), float(entry.get("weight", 1.0))))
            elif hasattr(entry, "name") and not callable(entry):  # e.g. config.RewardSpec
                items.append((str(entry.name), float(getattr(entry, "weight", 1.0))))
            else:
                raise ValueError(f"bad reward entry {entry!r}: expected name or {{name, weight}}")
        if out_fns:
            fns = out_fns + [RewardFn.from_name(n, w) for n, w in items]
            _check_unique(fns)
            return fns
    fns = [RewardFn.from_name(n, w) for n, w in items]
    if not fns:
        raise ValueError("no reward functions configured")
    _check_unique(fns)
    return fns


def _check_unique(fns: Sequence[RewardFn]) -> None:
    names = [f.name for f in fns]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"reward functions listed more than once: {dup}")


# ----------------------------------------------------------------------------- evaluation


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

    def masked_total(self) -> np.ndarray:
        """``total`` with NaN on unscored rows: the learner's convention for "no reward"."""
        if self.scored is None:
            return self.total
        return np.where(self.scored, self.total, np.float32(np.nan)).astype(np.float32)


def _to_float(v: Any) -> float:
    """float(v); None → 0.0; raises TypeError/ValueError on non-numbers."""
    if v is None:
        return 0.0
    if isinstance(v, str | bytes):
        raise TypeError(f"non-numeric value {v!r}")
    return float(v)


def _call(rf: RewardFn, prompts: list[str], completions: list[str], columns: dict) -> Any:
    return rf.fn(prompts, completions, **columns)


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
            f = _to_float(v)
        except (TypeError, ValueError):
            bad.append((i, f"non-numeric value {v!r}"))
            continue
        if not math.isfinite(f):
            bad.append((i, f"non-finite value {f}"))
            continue
        vals[i] = f
    return vals, bad


def _per_example(
    rf: RewardFn, prompts: list[str], completions: list[str], columns: dict
) -> tuple[np.ndarray, list[tuple[int, str]], np.ndarray]:
    """Call ``rf`` one example at a time; returns values, per-index problems, None flags."""
    n = len(completions)
    vals = np.zeros(n, dtype=np.float32)
    nones = np.zeros(n, dtype=bool)
    bad: list[tuple[int, str]] = []
    for i in range(n):
        cols = {k: [v[i]] for k, v in columns.items()}
        try:
            out = _call(rf, [prompts[i]], [completions[i]], cols)
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


def compute_rewards(
    reward_fns: Sequence[RewardFn],
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Sequence[Any]] | None = None,
    on_error: str = "raise",
) -> RewardResult:
    """Evaluate every reward function on a batch and combine them with their weights.

    Args:
      reward_fns: the bundle (names must be unique).
      prompts, completions: aligned lists of length ``n``.
      columns: extra dataset columns, each a list of length ``n`` (passed as keyword arguments).
      on_error: ``"raise"`` → :class:`RewardError` naming the function and the first bad example
        index; ``"zero"`` → 0 for the offending examples (the whole batch when a function returns
        the wrong number of values), counted in ``num_errors`` with a message and a log warning.

    A function that raises on the batch is retried one example at a time to find the failing
    index; the other examples keep their per-example values.
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
    _check_unique(reward_fns)

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
            vals, bad, nones = _per_example(rf, prompts, completions, cols)
            if bad:
                # Prefer the first example that raises; other problems are counted too.
                i, problem = next(((i, p) for i, p in bad if p.startswith("raised")), bad[0])
                fail(f"reward {rf.name!r} failed on example {i}: {problem}", len(bad), exc)
            else:
                fail(
                    f"reward {rf.name!r} raised {type(exc).__name__} on the batch of {n} "
                    f"(no single example reproduces it): {exc}",
                    n,
                    exc,
                )
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
                    fail(
                        f"reward {rf.name!r} returned a bad value for example {i}: {problem}{more}",
                        len(bad),
                    )
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
