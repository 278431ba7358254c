"""The built-in `calculator` environment: the model writes ``<calc>EXPR</calc>``, the tool
replies ``=VALUE`` and a newline, and the model goes on; a turn without a call ends the episode.

EXPR is arithmetic on numbers with ``+ - * / // %``, unary signs and parentheses, evaluated by
walking its Python syntax tree (never `eval`); anything else replies ``=error``. The tool scores
nothing (reward 0): the run's `rewards:` judge the episode's text, e.g. `exact_answer` on its
final ``#### N`` line (docs/environments.md).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Mapping
from typing import Any

from sagc_jax.envs.base import Environment, StepResult

_CALL = re.compile(r"<calc>(.*?)</calc>\s*$", re.S)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_ABS = 1e15  # a bound so "9**..."-style blow-ups cannot happen (no power operator anyway)


def evaluate(expr: str) -> str:
    """The value of `expr` as text (integers without a decimal point), or "error"."""
    try:
        value = _eval(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError, RecursionError):
        return "error"
    if abs(value) > _MAX_ABS:
        return "error"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6g}"


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"not arithmetic: {type(node).__name__}")


class Calculator(Environment):
    """One episode of tool use: any number of ``<calc>`` calls (up to `env.max_turns` turns)."""

    stop = ("</calc>",)

    def reset(self, example: Mapping[str, Any]) -> str:
        return ""  # the prompt alone opens the episode

    def step(self, action: str) -> StepResult:
        m = _CALL.search(action)
        if m is None:
            return StepResult("", 0.0, True)  # an answer, not a call: the episode is over
        return StepResult(f"={evaluate(m.group(1))}\n", 0.0, False)
