"""Built-in task ``arith`` — verifiable multi-step arithmetic built for the straggler problem.

A prompt is a left-to-right chain of single-digit additions/subtractions, e.g. ``"7+5-3+8="``;
the reference solution writes one line per step and then the answer::

    7+5=12
    12-3=9
    9+8=17
    #### 17

(followed by EOS in training). The number of steps is geometric-ish — most prompts are short,
with a tail of long ones up to ``max_steps`` — so completion lengths vary prompt to prompt
(about 7 characters per step). Operands are digits 0..9 and every running total stays in 0..99:
at each step the operator is drawn from those that keep the total in range (``+`` is impossible
above 90, ``-`` below the operand), so no modular arithmetic is needed and every line is a true
equation.

Example ``i`` of a split is a pure function of ``(seed, i)``, so the 100k-example training set is
a lazy random-access source (:class:`ArithSource`), never a list in memory. Train and eval are
disjoint by construction: every prompt is assigned to a split by a stable hash of its text
(1 in ``EVAL_BUCKETS`` prompts are eval-only); a generator for one split redraws until it lands in
its split.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from sagc_jax.data.task import EVAL_SEED, MAX_REDRAWS, LazySource, Task, prompt_split

__all__ = ["ArithSource", "arith_calc_example", "arith_calc_task", "arith_example", "arith_task",
           "calc_solution", "check_arith_solution", "make_arith_examples"]

_MAX_TOTAL = 99


def _num_steps(rng: np.random.Generator, min_steps: int, max_steps: int, p_continue: float) -> int:
    """Truncated geometric: P(k) ∝ p_continue**(k - min_steps) on [min_steps, max_steps]."""
    k = np.arange(min_steps, max_steps + 1)
    w = p_continue ** (k - min_steps).astype(np.float64)
    return int(rng.choice(k, p=w / w.sum()))


def draw_chain(rng: np.random.Generator, min_steps: int, max_steps: int,
               p_continue: float) -> dict:
    """One chain prompt with its reference solution, drawn from ``rng`` (no split filter)."""
    steps = _num_steps(rng, min_steps, max_steps, p_continue)
    total = int(rng.integers(0, 10))
    prompt = [str(total)]
    lines = []
    for _ in range(steps):
        d = int(rng.integers(0, 10))
        ops = [op for op, ok in (("+", total + d <= _MAX_TOTAL), ("-", total - d >= 0)) if ok]
        op = ops[int(rng.integers(0, len(ops)))]
        new = total + d if op == "+" else total - d
        prompt.append(f"{op}{d}")
        lines.append(f"{total}{op}{d}={new}")
        total = new
    lines.append(f"#### {total}")
    return {
        "prompt": "".join(prompt) + "=",
        "answer": str(total),
        "solution": "\n".join(lines),
        "num_steps": steps,
    }


def arith_example(
    index: int,
    seed: int,
    *,
    min_steps: int = 1,
    max_steps: int = 12,
    p_continue: float = 0.7,
    split: str = "train",
) -> dict[str, Any]:
    """Example ``index`` of the arith ``split`` for ``seed`` (a pure function of its arguments).

    Returns a dict with ``prompt`` (e.g. ``"7+5-3+8="``), ``answer`` (``"17"``), ``solution``
    (reference completion without EOS) and ``num_steps``. ``split`` is ``"train"``, ``"eval"`` or
    ``"all"`` (no split filter).
    """
    if split not in ("train", "eval", "all"):
        raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if not 0.0 < p_continue <= 1.0:
        raise ValueError(f"p_continue must be in (0, 1], got {p_continue}")
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index), 0x5A6C])
    for _ in range(MAX_REDRAWS):
        ex = draw_chain(rng, min_steps, max_steps, p_continue)
        if split == "all" or prompt_split(ex["prompt"]) == split:
            return ex
    raise RuntimeError(f"could not draw an arith example for split {split!r}")  # pragma: no cover


def make_arith_examples(
    n: int,
    seed: int,
    min_steps: int = 1,
    max_steps: int = 12,
    *,
    p_continue: float = 0.7,
    split: str = "train",
) -> list[dict[str, Any]]:
    """The first ``n`` examples of :class:`ArithSource` (``seed``, ``split``) as a list."""
    return list(ArithSource(n, seed, min_steps, max_steps, p_continue=p_continue, split=split))


def check_arith_solution(prompt: str, solution: str) -> bool:
    """True if ``solution`` is a correct step-by-step solution of ``prompt`` (used by tests)."""
    toks = re.findall(r"\d+|[+-]", prompt.rstrip("="))
    total = int(toks[0])
    lines = solution.strip().split("\n")
    if len(lines) != (len(toks) - 1) // 2 + 1:
        return False
    for j, line in enumerate(lines[:-1]):
        op, d = toks[1 + 2 * j], int(toks[2 + 2 * j])
        new = total + d if op == "+" else total - d
        if line != f"{total}{op}{d}={new}" or not 0 <= new <= _MAX_TOTAL:
            return False
        total = new
    return lines[-1] == f"#### {total}"


class ArithSource(LazySource):
    """Lazy random-access source of arith examples: ``src[i]`` is ``arith_example(i, ...)``."""

    def __init__(
        self,
        n: int,
        seed: int,
        min_steps: int = 1,
        max_steps: int = 12,
        *,
        p_continue: float = 0.7,
        split: str = "train",
    ) -> None:
        super().__init__(arith_example, n, seed=int(seed), min_steps=int(min_steps),
                         max_steps=int(max_steps), p_continue=float(p_continue), split=split)

    def longest_prompts(self) -> list[str]:
        """Prompts of the longest possible length (`max_steps` single-digit steps): checking
        these bounds every prompt of the source without generating them all."""
        steps = self._kw["max_steps"]
        return ["9" + "-9" * steps + "=", "0" + "+9" * steps + "="]


def arith_task(
    name: str = "arith",
    min_steps: int = 1,
    max_steps: int = 12,
    p_continue: float = 0.7,
) -> Task:
    """The ``arith`` task (registered in :data:`sagc_jax.data.tasks.TASKS`)."""
    kw = dict(min_steps=min_steps, max_steps=max_steps, p_continue=p_continue)
    ArithSource(0, 0, **kw)  # type: ignore[arg-type]  # validate
    return Task(
        name=name,
        default_reward="exact_answer",
        description=(
            f"multi-step single-digit +/- arithmetic, {min_steps}..{max_steps} steps "
            f"(truncated geometric, p_continue={p_continue}), answer after '#### '"
        ),
        make_train=lambda seed, n: ArithSource(n, seed, split="train", **kw),  # type: ignore[arg-type]
        make_eval=lambda n: list(ArithSource(n, EVAL_SEED, split="eval", **kw)),  # type: ignore[arg-type]
    )


# ---- arith_calc: the same problems, solved with the calculator environment (envs/) ----------


def calc_solution(example: dict[str, Any]) -> str:
    """The tool trace of an arith example: one ``<calc>`` call on the whole chain, the
    calculator's reply (``=N`` and a newline, what `envs.Calculator` answers), then the answer:
    ``<calc>7+5-3+8</calc>=17\n#### 17``."""
    expr, answer = example["prompt"].rstrip("="), example["answer"]
    return f"<calc>{expr}</calc>={answer}\n#### {answer}"


def arith_calc_example(index: int, seed: int, *, tool_rate: float = 1.0,
                       **kw: Any) -> dict[str, Any]:
    """`arith_example(index, seed, **kw)` whose solution is the tool trace (`calc_solution`)
    for a seeded `tool_rate` fraction of the examples, the step-by-step one otherwise."""
    if not 0.0 <= tool_rate <= 1.0:
        raise ValueError(f"tool_rate must be in [0, 1], got {tool_rate}")
    ex = arith_example(index, seed, **kw)
    if np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index), 0xCA1C]).random() < tool_rate:
        ex["solution"] = calc_solution(ex)
    return ex


class _CalcSource(ArithSource):
    """`ArithSource` with `arith_calc_example`'s solutions."""

    def __init__(self, n: int, seed: int, *, tool_rate: float, **kw: Any) -> None:
        LazySource.__init__(self, arith_calc_example, n, seed=int(seed), tool_rate=float(tool_rate),
                            **kw)


def arith_calc_task(name: str = "arith_calc", min_steps: int = 1, max_steps: int = 12,
                    p_continue: float = 0.7, tool_rate: float = 1.0) -> Task:
    """The ``arith_calc`` task: arith's problems and answers (so `exact_answer` scores them),
    SFT solutions that call the calculator (`tool_rate` of them; the rest step by step). Train
    with ``env: {name: calculator}``; without it, the model's own text follows ``</calc>``."""
    kw = dict(min_steps=min_steps, max_steps=max_steps, p_continue=p_continue,
              tool_rate=tool_rate)
    _CalcSource(0, 0, **kw)  # validate
    return Task(
        name=name,
        default_reward="exact_answer",
        description=(f"arith ({min_steps}..{max_steps} steps) with calculator tool traces "
                     f"(tool_rate={tool_rate}), answer after '#### '"),
        make_train=lambda seed, n: _CalcSource(n, seed, split="train", **kw),
        make_eval=lambda n: list(_CalcSource(n, EVAL_SEED, split="eval", **kw)),
    )
