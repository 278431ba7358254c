"""Built-in rewards backed by external verifiers: reasoning-gym's and Hugging Face's math-verify.

``reasoning_gym`` — scores a completion with its dataset's own ``score_answer`` (reasoning-gym
0.1.25; values in [0, 1], some datasets give partial credit). Answer extraction:

1. the content of the **last** complete ``<answer>…</answer>`` (reasoning-gym's own
   ``extract_answer``); if there is one, it alone is scored;
2. otherwise (lenient fallback) the best score over two candidates: the last non-empty line
   (an unclosed leading ``<answer>`` removed, for a completion cut off at the cap) and the last
   number in the completion. Fallback answers score as much as tagged ones.

``reasoning_gym_strict`` is step 1 only: no tagged answer scores 0. Both need the columns of the
``reasoning_gym`` task (``rg_entry``, ``rg_config``); the verifier of each dataset is built once
per call with the example's generator settings.

``math_verify`` — ``math_verify.verify(parse(answer), parse(prediction))``: 1.0 or 0.0, the
reference from the ``answer`` column (a bare answer such as ``x^2 + 1`` read as ``$x^2 + 1$``),
the prediction the last ``<answer>…</answer>`` content if
there is one, else the whole completion (math-verify finds ``\\boxed{}``, ``$…$`` or a last
number). A reference math-verify cannot parse scores ``None`` (not applicable, as in TRL).
math-verify's time limits use ``signal.alarm``, which works only in the main thread; called from
another thread (e.g. under a caller's own reward timeout) the limits are turned off, so that
caller's timeout is the only bound.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

__all__ = [
    "answer_candidates",
    "math_verify_reward",
    "reasoning_gym_reward",
    "reasoning_gym_strict_reward",
]

logger = logging.getLogger(__name__)
_NUMBER_RE = re.compile(r"-?\d+(?:[.,]\d+)*")
_MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own default, per parse / comparison


def _require(module: str, package: str, reward: str) -> None:
    """A missing optional package is one line saying how to install it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"reward {reward!r} needs the {package} package: pip install "
                                  f"'sagc-jax[real]' (or {package} itself)")


def _tagged(completion: str) -> str | None:
    _require("reasoning_gym", "reasoning-gym", "reasoning_gym")
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


def answer_candidates(completion: str, lenient: bool = True) -> list[str]:
    """Answers to score, best first: ``[tagged]``, else (``lenient``) the last non-empty line
    and the last number (see the module docstring); ``[]`` when there is nothing."""
    tagged = _tagged(completion)
    if tagged is not None:
        return [tagged]
    if not lenient:
        return []
    out: list[str] = []
    lines = [ln.strip() for ln in completion.splitlines() if ln.strip()]
    if lines:
        out.append(lines[-1].removeprefix("<answer>").strip())
    nums = _NUMBER_RE.findall(completion)
    if nums and nums[-1] not in out:
        out.append(nums[-1])
    return [a for a in out if a]


def _need(name: str, col: str, values: Sequence[Any] | None, n: int) -> Sequence[Any]:
    if values is None:
        raise ValueError(f"reward {name!r} needs a {col!r} column (data.task: reasoning_gym "
                         "provides it)")
    if len(values) != n:
        raise ValueError(f"reward {name!r}: {len(values)} {col!r} values for {n} completions")
    return values


def _score_rg(name: str, completions: Sequence[str], rg_entry: Sequence[Any] | None,
              rg_config: Sequence[Any] | None, lenient: bool) -> list[float]:
    import json

    _require("reasoning_gym", "reasoning-gym", name)
    from reasoning_gym import create_dataset

    entries = _need(name, "rg_entry", rg_entry, len(completions))
    configs = _need(name, "rg_config", rg_config, len(completions))
    verifiers: dict[tuple[str, str], Any] = {}  # one per (dataset, settings) in this call
    out = []
    for completion, entry, config in zip(completions, entries, configs):
        dataset = entry["metadata"]["source_dataset"]
        key = (dataset, str(config))
        if key not in verifiers:
            verifiers[key] = create_dataset(dataset, **json.loads(config), seed=0, size=1)
        scores = [float(verifiers[key].score_answer(a, entry))
                  for a in answer_candidates(completion, lenient)]
        out.append(max(scores, default=0.0))
    return out


def reasoning_gym_reward(prompts: Sequence[str], completions: Sequence[str],
                         rg_entry: Sequence[Any] | None = None,
                         rg_config: Sequence[Any] | None = None, **_: Any) -> list[float]:
    """The dataset's own ``score_answer`` of the extracted answer (tagged, else the fallback)."""
    return _score_rg("reasoning_gym", completions, rg_entry, rg_config, lenient=True)


def reasoning_gym_strict_reward(prompts: Sequence[str], completions: Sequence[str],
                                rg_entry: Sequence[Any] | None = None,
                                rg_config: Sequence[Any] | None = None,
                                **_: Any) -> list[float]:
    """As ``reasoning_gym`` but only a ``<answer>…</answer>`` answer counts (no fallback)."""
    return _score_rg("reasoning_gym_strict", completions, rg_entry, rg_config, lenient=False)


def _parse_reference(parse: Any, ref: str, limit: int | None) -> list[Any]:
    """math-verify's parse of a reference; a bare answer without ``$`` or ``\\boxed`` is read
    as LaTeX math first (bare ``x^2 + 1`` would otherwise parse as its last number, 1)."""
    if ref.strip() and "$" not in ref and "\\boxed" not in ref:
        gold = parse(f"${ref}$", parsing_timeout=limit)
        if gold:
            return gold
    return parse(ref, parsing_timeout=limit)


def math_verify_reward(prompts: Sequence[str], completions: Sequence[str],
                       answer: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 if math-verify finds the completion's answer equal to the ``answer`` column."""
    _require("math_verify", "math-verify", "math_verify")
    from math_verify import parse, verify

    answers = _need("math_verify", "answer", answer, len(completions))
    # signal.alarm (math-verify's limit) raises off the main thread; no limit there instead.
    limit = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() \
        else None
    golds: dict[str, Any] = {}
    out: list[float | None] = []
    for completion, ref in zip(completions, answers):
        ref = "" if ref is None else str(ref)
        if ref not in golds:
            golds[ref] = _parse_reference(parse, ref, limit)
        if not golds[ref]:
            out.append(None)
            continue
        pred = parse(_tagged(completion) or completion, parsing_timeout=limit)
        out.append(1.0 if pred and verify(golds[ref], pred, timeout_seconds=limit) else 0.0)
    unparsed = sum(v is None for v in out)
    if unparsed:
        logger.warning("math_verify: %d of %d reference answers could not be parsed (scored "
                       "None)", unparsed, len(out))
    return out
