"""Generate ``docs/config.md``, the configuration reference, from the config schema.

The generator walks the pydantic models under :class:`sagc_jax.config.Config` — every section,
nested sections (``model.lora``) and list-of-section fields (``rewards[*]``) — and writes one
table per section: key, type, default, constraints (pydantic's ``gt/ge/lt/le`` on the field or
on a list's items) and the field's doc string, which carries the unit. Nothing is written per
key except :data:`TRL_EQUIVALENTS`, the TRL ``GRPOConfig`` (and its base ``TrainingArguments``)
options that map onto a key, taken from docs/algorithms.md. A key added, moved or re-documented
in the schema shows up on the next run; ``tests/test_docs.py`` fails while the file is stale.

Usage::

    python -m tools.gen_config_docs            # rewrite docs/config.md
    python -m tools.gen_config_docs --check    # exit 1 if docs/config.md is stale
"""

from __future__ import annotations

import argparse
import enum
import inspect
import pathlib
import re
import sys
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config.md"
REGENERATE = "python -m tools.gen_config_docs"

# Our key -> the TRL option(s) it corresponds to (docs/algorithms.md, "TRL GRPOConfig ->
# sagc-jax"; the optimiser and bookkeeping rows are GRPOConfig's TrainingArguments base).
# A key that is not in the schema any more fails tests/test_docs.py.
TRL_EQUIVALENTS: dict[str, str] = {
    "run.steps": "`max_steps`",
    "run.seed": "`seed`",
    "run.log_every": "`logging_steps`",
    "run.eval_every": "`eval_steps`",
    "model.remat": "`gradient_checkpointing`",
    "data.prompts_per_step": "`generation_batch_size` / `steps_per_generation`",
    "data.shuffle": "`shuffle_dataset`",
    "sampling.max_new_tokens": "`max_completion_length`",
    "sampling.temperature": "`temperature`",
    "sampling.top_k": "`top_k`",
    "sampling.top_p": "`top_p`",
    "sampling.prompt_buckets": "`max_prompt_length` (older TRL)",
    "sampling.prompt_too_long": "`max_prompt_length` (older TRL)",
    "sagc.group_sizes": "`num_generations` (SAGC picks G each step)",
    "sagc.initial_group_size": "`num_generations` (with `sagc.enabled: false`)",
    "sagc.batch_policy": "`generation_batch_size` / `steps_per_generation`",
    "algo.beta": "`beta`",
    "algo.kl_estimator": "(k3 only)",
    "algo.epsilon": "`epsilon`",
    "algo.epsilon_high": "`epsilon_high` (TRL's defaults to `epsilon`)",
    "algo.loss_agg": "`loss_type`: `dapo`/`bnpo` = token-mean, `grpo` = seq-mean-token-mean, "
                     "`dr_grpo` = seq-mean-token-sum-norm",
    "algo.num_iterations": "`num_iterations`",
    "algo.importance_sampling": "`importance_sampling_level`",
    "algo.clip_delta": "`delta`",
    "algo.kl_bias_correction": "`use_bias_correction_kl`",
    "algo.scale_rewards": "`scale_rewards`",
    "algo.std_ddof": "(`torch.std`, unbiased: 1)",
    "algo.adv_eps": "(hard-coded `1e-4`)",
    "algo.top_entropy_quantile": "`top_entropy_quantile`",
    "algo.off_policy_mask_threshold": "`off_policy_mask_threshold`",
    "algo.micro_batch_rows": "`gradient_accumulation_steps`",
    "algo.dynamic_sampling": "— (DAPO; not in TRL)",
    "algo.overlong_buffer": "(a reward function in TRL)",
    "algo.overlong_penalty": "(a reward function in TRL)",
    "algo.mask_truncated": "`mask_truncated_completions`",
    "optim.lr": "`learning_rate`",
    "optim.warmup_steps": "`warmup_steps`",
    "optim.schedule": "`lr_scheduler_type`",
    "optim.weight_decay": "`weight_decay`",
    "optim.b1": "`adam_beta1`",
    "optim.b2": "`adam_beta2`",
    "optim.eps": "`adam_epsilon`",
    "optim.max_grad_norm": "`max_grad_norm`",
    "rewards[*].name": "`reward_funcs`",
    "rewards[*].weight": "`reward_weights`",
    "checkpoint.every": "`save_steps`",
    "checkpoint.keep": "`save_total_limit`",
}


# --------------------------------------------------------------------------------------------
# Reading the schema
# --------------------------------------------------------------------------------------------


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, m1, m2]`` -> ``(X, [m1, m2])`` (nested Annotated flattened)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        tp, *more = typing.get_args(tp)
        meta.extend(more)
    return tp, meta


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; anything else -> ``(tp, False)``."""
    if _is_union(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(typing.get_args(tp)):
            return _strip(rest[0])[0], True
    return tp, False


def _items(tp: Any) -> Any | None:
    """The item type of ``tuple[X, ...]`` / ``list[X]``, else None."""
    if typing.get_origin(tp) in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return args[0] if args else Any
    return None


def type_text(tp: Any) -> str:
    """A short name for a type hint: ``int``, ``float | null``, ``list[int]``, ``"a" | "b"``."""
    tp = _strip(tp)[0]
    if tp is type(None):
        return "null"
    if _is_union(tp):
        return " | ".join(type_text(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a)
                          for a in typing.get_args(tp))
    item = _items(tp)
    if item is not None:
        return f"list[{type_text(item)}]"
    if _is_model(tp):
        return "section"
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in tp)
    return getattr(tp, "__name__", str(tp))


def bounds_text(meta: list[Any]) -> str:
    """``[Gt(0), Lt(1)]`` -> ``> 0, < 1``; other metadata is ignored."""
    ops = {at.Gt: ("gt", ">"), at.Ge: ("ge", "≥"), at.Lt: ("lt", "<"), at.Le: ("le", "≤")}
    parts = []
    for m in meta:
        for cls, (attr, sym) in ops.items():
            if isinstance(m, cls):
                parts.append(f"{sym} {getattr(m, attr)}")
    return ", ".join(parts)


def constraints_text(f: FieldInfo) -> str:
    """Bounds on the field itself, and on its items for a list field (``each ≥ 2``)."""
    tp, meta = _strip(f.annotation)
    own = bounds_text(list(f.metadata) + meta)
    inner, _ = _optional(tp)
    item = _items(_strip(inner)[0])
    each = bounds_text(_strip(item)[1]) if item is not None else ""
    return ", ".join(p for p in (own, f"each {each}" if each else "") if p)


def _plain(value: Any) -> Any:
    """A default as the YAML a user would write: tuples as lists, sections as mappings."""
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value.model_dump().items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in value.items()) + "}"
    return repr(value)


def default_text(f: FieldInfo) -> str:
    """The default in YAML spelling, or ``required``."""
    if f.default is PydanticUndefined and f.default_factory is None:
        return "required"
    value = f.get_default(call_default_factory=True)
    return _yaml_scalar(_plain(value))


def rst_to_md(text: str) -> str:
    """Doc-string markup to markdown: ``x`` -> `x`, :func:`~a.b` -> `a.b`; one line."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return " ".join(text.replace("``", "`").split())


def _doc(obj: Any) -> str:
    """First paragraph of a class doc string, on one line."""
    return rst_to_md((inspect.getdoc(obj) or "").split("\n\n")[0])


class KeyDoc(typing.NamedTuple):
    """One key of the reference table."""

    key: str
    type: str
    default: str
    constraints: str
    doc: str
    trl: str


class SectionDoc(typing.NamedTuple):
    """One section (``run``, ``model.lora``, ``rewards[*]``, or the top level ``""``)."""

    key: str
    model: type[BaseModel]
    rows: list[KeyDoc]


def walk(model: type[BaseModel], prefix: str = "") -> Iterator[SectionDoc]:
    """Yield ``model``'s own scalar keys as one section, then each nested section in order."""
    rows: list[KeyDoc] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, f in model.model_fields.items():
        key = prefix + name
        tp, _ = _optional(_strip(f.annotation)[0])
        item = _items(tp)
        if _is_model(tp):
            nested.append((key, tp))
            if f.default is None:  # an optional section: null = off
                rows.append(KeyDoc(key, "section | null", "null", "", " ".join(
                    (f.description or "").split()), TRL_EQUIVALENTS.get(key, "")))
            continue
        if item is not None and _is_model(_strip(item)[0]):
            nested.append((key + "[*]", _strip(item)[0]))
            rows.append(KeyDoc(key, "list[section]", default_text(f), constraints_text(f),
                            rst_to_md(f.description or ""),
                            TRL_EQUIVALENTS.get(key, "")))
            continue
        rows.append(KeyDoc(key, type_text(f.annotation), default_text(f), constraints_text(f),
                        rst_to_md(f.description or ""), TRL_EQUIVALENTS.get(key, "")))
    if rows or not prefix:
        yield SectionDoc(prefix.rstrip("."), model, rows)
    for key, sub in nested:
        yield from walk(sub, key + ".")


def schema_keys(model: type[BaseModel]) -> list[str]:
    """Every documented key (sections' leaves, list fields, optional sections)."""
    return [r.key for s in walk(model) for r in s.rows]


# --------------------------------------------------------------------------------------------
# Writing markdown
# --------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else ""


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _anchor(key: str) -> str:
    """GitHub's heading anchor for a section heading ``key``."""
    return "".join(c for c in key.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def render(model: type[BaseModel] | None = None) -> str:
    """The whole of docs/config.md for ``model`` (default :class:`sagc_jax.config.Config`)."""
    if model is None:
        from sagc_jax.config import Config as model
    sections = list(walk(model))
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated by `{REGENERATE}` from the schema's field docs; do not edit. -->",
        "",
        "One YAML file (`sagc-jax train --config FILE`), overridden with dotted keys "
        "(`sagc.delta=0.05 run.steps=50`). Every key is checked when the config is loaded: an "
        "unknown key, a wrong type or a value out of range exits with code 2 and one line "
        "naming the key. `null` is YAML's None. The TRL column names the TRL `GRPOConfig` "
        "option (or its `TrainingArguments` base) that does the same; "
        "[algorithms.md](algorithms.md) has the full map and the differences.",
        "",
        "Sections: " + ", ".join(
            f"[`{s.key or 'top level'}`](#{_anchor(s.key or 'top level')})" for s in sections
        ) + ".",
        "",
    ]
    for s in sections:
        title = s.key or "top level"
        lines += [f"## {title}", ""]
        where = f"`{s.model.__module__}.{s.model.__qualname__}`"
        lines += [f"{_doc(s.model)} ({where})", ""] if _doc(s.model) else [f"({where})", ""]
        if not s.rows:
            continue
        lines += ["| key | type | default | constraints | description | TRL |",
                  "|---|---|---|---|---|---|"]
        for r in s.rows:
            lines.append("| " + " | ".join([
                f"`{r.key}`", _cell(_code(r.type)), _cell(_code(r.default)),
                _cell(r.constraints), _cell(r.doc), _cell(r.trl)]) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write docs/config.md, or with ``--check`` report whether it is up to date."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is stale")
    p.add_argument("--out", type=pathlib.Path, default=OUT)
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale; regenerate with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
