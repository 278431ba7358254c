"""One-line configuration errors: pydantic's ``ValidationError`` -> :class:`ConfigError`.

Every message names the dotted key (list items as ``rewards[0].weight``) and what is allowed::

    sagc.delta: must be in (0, 1), got 1.5
    unknown key 'sagc.detla' (did you mean 'sagc.delta'?)
    optim.lr: expected float, got 'abc'

The allowed range, choices and type names are read back from the schema's annotations, so the
messages stay in step with the declarations.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import annotated_types as at
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

__all__ = ["RULE", "ConfigError", "config_keys", "format_validation_error", "rule_error"]

# pydantic error type of the schema's own rules (cross-field and special ranges).
RULE = "config_rule"


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the offending key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).splitlines()))


def rule_error(field: str, msg: str) -> PydanticCustomError:
    """An error for a schema rule: ``field`` is relative to where it is raised ("" = there)."""
    return PydanticCustomError(RULE, "{msg}", {"field": field, "msg": msg})


def fmt(value: Any) -> str:
    """Render a value for an error message (repr, but lists for tuples)."""
    if isinstance(value, tuple):
        value = list(value)
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:160]}...{text[-20:]} ({len(text)} chars)"


# --------------------------------------------------------------------------------------------
# Reading the schema back: types, bounds, keys
# --------------------------------------------------------------------------------------------


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, m1, m2]`` -> (X, [m1, m2]) (nested Annotated flattened)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        tp, *more = typing.get_args(tp)
        meta.extend(more)
    return tp, meta


def _non_none(tp: Any) -> Any:
    """``X | None`` -> X (other unions unchanged)."""
    if _is_union(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return _strip(rest[0])[0]
    return tp


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def type_name(tp: Any) -> str:
    """Short human name for a type hint, used in 'expected ...' messages."""
    tp = _strip(tp)[0]
    if tp is type(None):
        return "None"
    if _is_union(tp):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping) or _is_section(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _annotation_at(model: type[BaseModel], loc: Sequence[str | int]) -> tuple[Any, list[Any]]:
    """The type hint and constraint metadata at an error location of ``model``."""
    tp: Any = model
    meta: list[Any] = []
    for part in loc:
        base = _non_none(_strip(tp)[0])
        if isinstance(part, str) and _is_section(base) and part in base.model_fields:
            f = base.model_fields[part]
            tp, meta = _strip(f.annotation)
            meta = list(f.metadata) + meta
        elif isinstance(part, int) and typing.get_origin(base) in (tuple, list):
            args = typing.get_args(base)
            tp, meta = _strip(args[0] if args else Any)
        else:
            return Any, []
    return tp, meta


def _bounds(meta: list[Any]) -> str:
    """Human text for the numeric bounds in ``meta``: ``in (0, 1)``, ``>= 1``, ``> 0``."""
    lo = hi = None
    lo_open = hi_open = False
    for m in meta:
        if isinstance(m, at.Gt):
            lo, lo_open = m.gt, True
        elif isinstance(m, at.Ge):
            lo, lo_open = m.ge, False
        elif isinstance(m, at.Lt):
            hi, hi_open = m.lt, True
        elif isinstance(m, at.Le):
            hi, hi_open = m.le, False
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return "any number"


def config_keys(model: type[BaseModel], *, sections: bool = False) -> list[str]:
    """All valid dotted keys of ``model`` (leaves; with ``sections`` also section names).

    Items of list-of-section fields appear as ``rewards[*].weight``.
    """
    out: list[str] = []

    def walk(cls: type[BaseModel], prefix: str) -> None:
        for name, f in cls.model_fields.items():
            tp = _non_none(_strip(f.annotation)[0])
            key = prefix + name
            args = typing.get_args(tp)
            if _is_section(tp):
                if sections:
                    out.append(key)
                walk(tp, key + ".")
            elif typing.get_origin(tp) in (tuple, list) and args and _is_section(args[0]):
                out.append(key)
                walk(args[0], key + "[*].")
            else:
                out.append(key)

    walk(model, "")
    return out


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


def join_key(prefix: str, loc: Sequence[str | int]) -> str:
    """``("rewards", 1, "weight")`` -> ``rewards[1].weight`` (after ``prefix`` if given)."""
    key = prefix
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part:
            key = f"{key}.{part}" if key else str(part)
    return key


def _first_leaf(key: str, value: Any) -> str:
    """Descend into a mapping to name a full dotted key (``sagcc`` -> ``sagcc.delta``)."""
    while isinstance(value, Mapping) and value:
        k, value = next(iter(value.items()))
        key = f"{key}.{k}"
    return key


def unknown_key(key: str, known: Sequence[str]) -> str:
    """``unknown key 'sagc.detla' (did you mean 'sagc.delta'?)``; ``known`` may hold ``[*]``."""
    generic = re.sub(r"\[\d+\]", "[*]", key)
    match = difflib.get_close_matches(generic, list(known), n=1, cutoff=0.6)
    msg = f"unknown key {key!r}"
    if match:
        indices = iter(re.findall(r"\[\d+\]", key))
        suggestion = re.sub(r"\[\*\]", lambda _m: next(indices, "[0]"), match[0])
        msg += f" (did you mean {suggestion!r}?)"
    return msg


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], prefix: str = ""
) -> str:
    """One line for the first problem in ``exc`` (unknown keys first: a typo explains the rest).

    ``model`` is what was validated; ``prefix`` is its own dotted key ("" for the root).
    """
    errs = exc.errors(include_url=False)
    err = next((e for e in errs if e["type"] == "extra_forbidden"), errs[0])
    loc, kind, value = err["loc"], err["type"], err.get("input")
    key = join_key(prefix, loc)
    if kind == "extra_forbidden":
        known = [join_key(prefix, [k]) for k in config_keys(model, sections=True)]
        return unknown_key(_first_leaf(key, value), known)
    if kind == RULE:
        ctx = err["ctx"]
        return f"{join_key(key, [ctx['field']])}: {ctx['msg']}"
    tp, meta = _annotation_at(model, loc)
    if kind == "missing":
        return f"{key}: required"
    if _non_none(tp) is float and type(value) is int and abs(value) < 2**1023:
        value = float(value)  # what the field would hold (a 400-digit int would not fit)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{key}: must be {_bounds(meta)}, got {fmt(value)}"
    if kind == "finite_number":
        return f"{key}: must be a finite number, got {fmt(value)}"
    if kind == "literal_error":
        choices = typing.get_args(_non_none(tp))
        return f"{key}: must be one of {', '.join(repr(c) for c in choices)}, got {fmt(value)}"
    return f"{key}: expected {type_name(tp)}, got {fmt(value)}"
