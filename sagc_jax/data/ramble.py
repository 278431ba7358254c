"""Built-in task ``ramble``: step-by-step arithmetic whose completions are heavy-tailed.

The prompts and the clean solutions are those of ``arith`` (a left-to-right chain of
single-digit additions/subtractions, one line per step, then ``#### N``), with a longer step
tail (``p_continue`` 0.75 instead of 0.7). What differs is the *SFT demonstrations*: a seeded
fraction ``ramble_rate`` of training solutions **ramble** — at a uniformly drawn step ``j`` the
demonstration starts repeating line ``j`` instead of moving on, the way small reasoning models
loop::

    7+5=12              7+5=12
    12-3=9              12-3=9
    9+8=17              12-3=9      <- loop on line j = 2
    #### 17             12-3=9
                        12-3=9
                        #### 9      <- gives up with the running total at j: wrong unless j = last

Of the rambling demonstrations, a fraction ``endless_frac`` never stops: the line repeats until
the text is ``ENDLESS_CHARS`` characters long, beyond any ``sampling.max_new_tokens`` the CPU
configs use, so the SFT sequence is cut at the cap with no answer. The others repeat the line
``k ~ Geometric(1 / mean_repeats)`` times and answer with the running total at ``j``.

What this gives a warm-started policy sampled at temperature 1 (see README "Results"):

- **heavy-tailed lengths within a group**: a member that enters the loop runs 2-10x the
  group's median or to the cap (a straggler event: ``max L > tau * median L`` or truncated),
  and the model cannot tell a finite loop from an endless one, so the longer it has looped the
  likelier it keeps looping (a decreasing hazard — a heavy tail, not a geometric one);
- **a reason for GRPO to shorten the tail**: a ramble is truncated (no answer) or answers the
  running total at ``j``; both score 0 under ``exact_answer`` unless ``j`` is the last step, so
  in a group with a correct member the advantage pushes against entering the loop. (Measured
  with ``configs/compare_straggle_cpu.yaml``, ``ramble_rate`` 0.06 and 600 SFT steps: at G = 16
  0.30-0.40 of groups straggle over the first 10 GRPO steps and ~0.1 by step 40, as the tail
  shrinks: p99 length 96 -> 64-78 tokens, truncated rows 1.2-1.8 % -> 0.1-0.5 %.)

Training ``answer`` is always the correct one (the rambling only changes ``solution``, which is
used by the SFT warm start alone); the held-out split has clean solutions. Example ``i`` is a
pure function of ``(seed, i)``; train and eval prompts are split by the same stable hash as
``arith``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from sagc_jax.data.arith import check_arith_solution, draw_chain
from sagc_jax.data.task import EVAL_SEED, MAX_REDRAWS, LazySource, Task, prompt_split

__all__ = [
    "ENDLESS_CHARS",
    "RambleSource",
    "ramble_example",
    "ramble_kind",
    "ramble_task",
    "solve_chain",
    "verify_ramble",
]

#: Length (characters = tokens with the built-in tokenizer) an endless ramble is written out to.
ENDLESS_CHARS = 256
_ANSWER_RE = re.compile(r"####\s*(-?\d+)")
_KINDS = ("clean", "finite", "endless")


def solve_chain(prompt: str) -> int:
    """The exact answer of a chain prompt such as ``"7+5-3+8="`` (left to right)."""
    toks = re.findall(r"\d+|[+-]", prompt.rstrip("="))
    if not toks or len(toks) % 2 == 0:
        raise ValueError(f"not a chain prompt: {prompt!r}")
    total = int(toks[0])
    for op, d in zip(toks[1::2], toks[2::2]):
        total = total + int(d) if op == "+" else total - int(d)
    return total


def verify_ramble(prompt: str, completion: str) -> bool:
    """True if ``completion``'s first ``#### N`` answer is the prompt's exact answer.

    The same rule as the ``exact_answer`` reward (first ``####`` marker): a truncated ramble has
    no answer line and scores False; a finite ramble answers the running total at its loop.
    """
    m = _ANSWER_RE.search(completion)
    return m is not None and int(m.group(1)) == solve_chain(prompt)


def ramble_kind(prompt: str, solution: str) -> str:
    """``"clean"`` (the reference solution of ``prompt``), ``"finite"`` (anything else with an
    answer line, e.g. a loop that gives up) or ``"endless"`` (no answer line)."""
    if check_arith_solution(prompt, solution):
        return "clean"
    return "finite" if _ANSWER_RE.search(solution) else "endless"


def _ramble(lines: list[str], rng: np.random.Generator, endless_frac: float,
            mean_repeats: float) -> str:
    """A rambling version of a clean solution's step ``lines`` (without the answer line)."""
    j = int(rng.integers(1, len(lines) + 1))  # 1-based line that loops
    line = lines[j - 1]
    out = lines[:j]
    if rng.random() < endless_frac:
        while sum(len(s) + 1 for s in out) < ENDLESS_CHARS:
            out.append(line)
        return "\n".join(out)
    k = int(rng.geometric(1.0 / mean_repeats))  # >= 1 repeats
    out += [line] * k
    out.append(f"#### {line.split('=')[1]}")
    return "\n".join(out)


def ramble_example(
    index: int,
    seed: int,
    *,
    min_steps: int = 1,
    max_steps: int = 12,
    p_continue: float = 0.75,
    ramble_rate: float = 0.06,
    endless_frac: float = 0.5,
    mean_repeats: float = 4.0,
    split: str = "train",
) -> dict[str, Any]:
    """Example ``index`` of the ramble ``split`` for ``seed`` (a pure function of its arguments).

    Returns ``prompt``, ``answer`` (always correct), ``solution`` (clean, or rambling for a
    seeded ``ramble_rate`` of train examples), ``num_steps`` and ``ramble`` (the kind:
    ``"clean"``, ``"finite"`` or ``"endless"``). Eval examples are always clean.
    """
    if split not in ("train", "eval", "all"):
        raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if not 0.0 < p_continue <= 1.0:
        raise ValueError(f"p_continue must be in (0, 1], got {p_continue}")
    if not (0.0 <= ramble_rate < 1.0 and 0.0 <= endless_frac <= 1.0 and mean_repeats >= 1.0):
        raise ValueError(f"need 0 <= ramble_rate < 1, 0 <= endless_frac <= 1, mean_repeats >= 1;"
                         f" got {ramble_rate}, {endless_frac}, {mean_repeats}")
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index), 0x7A3B])
    for _ in range(MAX_REDRAWS):
        ex = draw_chain(rng, min_steps, max_steps, p_continue)
        if split == "all" or prompt_split(ex["prompt"]) == split:
            break
    else:  # pragma: no cover
        raise RuntimeError(f"could not draw a ramble example for split {split!r}")
    ex["ramble"] = "clean"
    if split != "eval" and rng.random() < ramble_rate:
        ex["solution"] = _ramble(ex["solution"].split("\n")[:-1], rng, endless_frac,
                                 mean_repeats)
        ex["ramble"] = ramble_kind(ex["prompt"], ex["solution"])
    return ex


class RambleSource(LazySource):
    """Lazy random-access source of ramble examples: ``src[i]`` is ``ramble_example(i, ...)``."""

    def __init__(self, n: int, seed: int, **options: Any) -> None:
        super().__init__(ramble_example, n, seed=int(seed), **options)


def ramble_task(
    name: str = "ramble",
    min_steps: int = 1,
    max_steps: int = 12,
    p_continue: float = 0.75,
    ramble_rate: float = 0.06,
    endless_frac: float = 0.5,
    mean_repeats: float = 4.0,
) -> Task:
    """The ``ramble`` task (registered in :data:`sagc_jax.data.tasks.TASKS`)."""
    kw = dict(min_steps=min_steps, max_steps=max_steps, p_continue=p_continue,
              ramble_rate=ramble_rate, endless_frac=endless_frac, mean_repeats=mean_repeats)
    RambleSource(0, 0, **kw)  # validate
    return Task(
        name=name,
        default_reward="exact_answer",
        description=(
            f"step-by-step +/- arithmetic, {min_steps}..{max_steps} steps; {ramble_rate:.0%} of "
            f"SFT demonstrations loop on a line ({endless_frac:.0%} of those never answer)"
        ),
        make_train=lambda seed, n: RambleSource(n, seed, split="train", **kw),
        make_eval=lambda n: list(RambleSource(n, EVAL_SEED, split="eval", **kw)),
    )
