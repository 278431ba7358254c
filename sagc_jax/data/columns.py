"""Which dataset columns a run reads, so a file lacking one is refused at start-up.

The SFT warm start (``init.sft_steps > 0``) trains on each example's reference completion (the
``solution`` column; ``data.solution_column`` names it in a file), and each reward function reads
its own columns as keyword arguments (``answer``; ``rg_entry`` / ``rg_config`` for the
reasoning-gym verifiers). A file without one used to fail inside the first SFT or GRPO step with
a bare ``KeyError``; :func:`required_columns` lists them with why each is needed and the ways
out, and the readers (``required=``) stop at the first row that lacks one, naming the file, the
row and the column, before a model is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BUILTIN_REWARD_COLUMNS", "check_examples", "required_columns", "reward_columns"]

#: Columns each built-in reward cannot score without (``answer`` is the reader's own
#: ``data.answer_column``, always present; see sagc_jax/rewards/answers.py and verifiers.py).
BUILTIN_REWARD_COLUMNS: dict[str, tuple[str, ...]] = {
    "exact_answer": ("answer",),
    "gsm8k": ("answer",),
    "math_verify": ("answer",),
    "format": (),
    "reasoning_gym": ("rg_entry", "rg_config"),
    "reasoning_gym_strict": ("rg_entry", "rg_config"),
}

#: Where a column that a built-in reward reads comes from, for the error's way out.
_PROVIDED_BY = {"rg_entry": "data.task=reasoning_gym", "rg_config": "data.task=reasoning_gym"}


def reward_columns(name: str, fn: Any) -> tuple[str, ...]:
    """Columns the reward `name` (callable `fn`) needs.

    A built-in's are listed above. A user's function (TRL convention ``fn(prompts, completions,
    **columns)``) needs the keyword parameters after the first two that have no default: Python
    would refuse the call without them. One whose signature cannot be read needs nothing known.
    """
    if name in BUILTIN_REWARD_COLUMNS:
        return BUILTIN_REWARD_COLUMNS[name]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return ()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    skipped, out = 0, []
    for p in params:
        if p.kind in positional and skipped < 2:  # prompts, completions
            skipped += 1
            continue
        if p.default is inspect.Parameter.empty and p.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            out.append(p.name)
    return tuple(out)


def required_columns(cfg: Any | None, reward_fns: Sequence[Any], split: str) -> dict[str, str]:
    """File column -> why the run needs it, with the ways out, for the `split` ("train" or
    "eval") of a run config `cfg` and its reward functions (objects with `.name` and `.fn`).

    The train split needs the warm start's solution column when ``init.sft_steps > 0``; both
    splits need every reward's columns (held-out evals score with the same functions). The
    answer column is left out: the readers require ``data.answer_column`` in every row already.
    """
    out: dict[str, str] = {}
    steps = cfg.init.sft_steps if cfg is not None else 0
    if split == "train" and steps > 0:
        out[cfg.data.solution_column] = (
            f"the SFT warm start (init.sft_steps={steps}) trains on it: set "
            "data.solution_column to the column holding a reference completion, or "
            "init.sft_steps=0 to skip the warm start")
    for rf in reward_fns:
        for col in reward_columns(rf.name, rf.fn):
            if col == "answer" or col in out:
                continue
            source = _PROVIDED_BY.get(col)
            out[col] = (f"reward {rf.name!r} reads it: add the column"
                        f"{f' (or use {source}, which provides it)' if source else ''}, or "
                        f"remove {rf.name!r} from rewards")
    return out


def check_examples(examples: Sequence[Mapping[str, Any]], required: Mapping[str, str],
                   where: str) -> None:
    """Every example has every `required` column (not null): DataError naming `where` (the
    file or task), the 0-based example and the column otherwise. For examples already loaded
    (`sagc-jax eval`); the trainer checks while reading (the readers' ``required=``)."""
    from sagc_jax.data.readers import DataError

    for i, ex in enumerate(examples):
        for col, why in required.items():
            if ex.get(col) is None:
                raise DataError(f"{where} example {i}: column {col!r} is missing, and {why} "
                                f"(columns: {sorted(ex)})")
