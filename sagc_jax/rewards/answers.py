"""Answer-matching reward functions: the numeric final answer of a completion (``#### N``,
``\\boxed{N}`` or the last number) against the example's ``answer`` column, and the ``#### N``
format check. Built-ins of :data:`sagc_jax.rewards.registry.BUILTIN_REWARDS` (``exact_answer``,
``gsm8k``, ``format``); each follows the TRL convention ``fn(prompts, completions, **columns)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

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


def _answers_match(name: str, completions: Sequence[str], answer: Sequence[Any] | None,
                   parse_completion: Callable[[str], str | None],
                   parse_answer: Callable[[str], str | None]) -> list[float]:
    """1.0 per completion whose parsed answer equals the parsed `answer` (both found), else 0.0."""
    if answer is None:
        raise ValueError(f"reward {name!r} needs an 'answer' column")
    if len(answer) != len(completions):
        raise ValueError(f"reward {name!r}: {len(answer)} answers for {len(completions)} "
                         "completions")
    return [1.0 if (ref := parse_answer(str(a))) is not None and parse_completion(c) == ref
            else 0.0 for c, a in zip(completions, answer)]


# ----------------------------------------------------------------------------- built-ins
def exact_answer_reward(prompts: Sequence[str], completions: Sequence[str],
                        answer: Sequence[Any] | None = None, **_: Any) -> list[float]:
    """1.0 if the completion's ``#### N`` answer equals ``answer`` (numerically), else 0.0."""
    return _answers_match("exact_answer", completions, answer, extract_final_answer,
                          normalize_number)


def gsm8k_reward(prompts: Sequence[str], completions: Sequence[str],
                 answer: Sequence[Any] | None = None, **_: Any) -> list[float]:
    """1.0 if the GSM8K-style final answers of completion and reference agree, else 0.0.

    The reference may be a bare number or a full GSM8K solution ending in ``#### 42``.
    """
    return _answers_match("gsm8k", completions, answer, extract_gsm8k_answer,
                          extract_gsm8k_answer)


def format_reward(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 if the completion ends with a well-formed ``#### <number>`` line, else 0.0."""
    return [1.0 if _FORMAT_RE.search(c.rstrip()) else 0.0 for c in completions]
