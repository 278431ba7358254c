"""YAML files and ``key=value`` overrides -> a validated :class:`~sagc_jax.config.schema.Config`.

Usage::

    cfg = load_config("configs/tiny_cpu.yaml", ["sagc.group_sizes=[4,8]", "optim.lr=3e-5"])

YAML values (from files and overrides) are parsed with a ``yaml.SafeLoader`` subclass that also
reads exponent floats without a dot (``3e-5``) as floats, as YAML 1.2 does; PyYAML alone would
read them as strings. The simulator (``sagc-jax simulate``) reads its files with the same
:func:`read_yaml` and :func:`apply_overrides`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from sagc_jax.config.errors import ConfigError, fmt
from sagc_jax.config.sagc import REMOVED_KEYS, migrate_legacy_sagc
from sagc_jax.config.schema import Config

__all__ = [
    "DuplicateKeyError",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "load_saved_config",
    "read_yaml",
    "save_config",
    "yaml_load",
]


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names the same key twice (YAML says keys are unique; PyYAML keeps the
    last silently, so a second ``sagc:`` block would replace the first)."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"duplicate key {key!r} on lines {first} and {second}")


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` / ``3E5`` (no dot) as floats, like YAML 1.2, and
    refuses duplicate keys (:class:`DuplicateKeyError`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` keys are meant to be overridden
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKeyError(key, seen[key], line)
                    seen[key] = line
                except TypeError:
                    continue  # unhashable: SafeConstructor reports it
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_load(text: str) -> Any:
    """Parse YAML text (safe; ``3e-5`` is a float)."""
    return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader


def _why(e: BaseException) -> str:
    """A parse error in one line (PyYAML's span several; a too-deep document has no text)."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:300] + "..."


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML file's top-level mapping (empty file = ``{}``); one-line ConfigError otherwise."""
    name = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {name!r}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {name!r}: {e.strerror}") from None
    try:
        data = yaml_load(text)
    except DuplicateKeyError as e:
        raise ConfigError(f"{name}: {e}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: a 5000-digit int
        raise ConfigError(f"{name}: invalid YAML ({_why(e)})") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{name}: expected a mapping at the top level, got {type(data).__name__}"
        )
    return dict(data)


def _merge(base: Any, new: Any) -> Any:
    """Deep-merge mappings; ``None`` over a section keeps the section; otherwise replace."""
    if isinstance(base, Mapping) and new is None:
        return base
    if isinstance(base, Mapping) and isinstance(new, Mapping):
        out = dict(base)
        for k, v in new.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    return new


_PATH_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def _parse_path(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in key.split("."):
        m = _PATH_PART.match(piece)
        if not m:
            raise ConfigError(
                f"bad override key {key!r}: expected a dotted path like "
                f"'sagc.delta' or 'rewards[0].weight'"
            )
        parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return parts


def _copy(v: Any) -> Any:
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    return v


def _set(root: dict[str, Any], key: str, path: list[str | int], value: Any) -> None:
    """Set ``path`` in nested dict/list ``root`` (copying containers on the way down)."""
    cur: Any = root
    for i, part in enumerate(path):
        last = i == len(path) - 1
        where = key if last else ".".join(str(p) for p in path[: i + 1])
        if isinstance(part, int):
            if not isinstance(cur, list):
                raise ConfigError(f"{where}: not a list, cannot index it")
            if part > len(cur):
                raise ConfigError(
                    f"{key}: index {part} out of range (list has "
                    f"{len(cur)} items; use index {len(cur)} to append)"
                )
            if part == len(cur):
                cur.append({} if not last else None)
        elif not isinstance(cur, dict):
            raise ConfigError(f"{key}: {where.rsplit('.', 1)[0]!r} is not a section")
        if last:
            # An explicit `key=null` replaces (`model.lora=null`: full fine-tuning); only a
            # file's empty section header keeps the section (``_merge``).
            old = cur[part] if isinstance(part, int) else cur.get(part)
            cur[part] = None if value is None else _merge(old, value)
            return
        nxt = cur[part] if isinstance(part, int) else cur.get(part)
        if nxt is None:
            nxt = {} if isinstance(path[i + 1], str) else []
        cur[part] = _copy(nxt)
        cur = cur[part]


def apply_overrides(d: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of nested dict ``d`` with ``key=value`` overrides applied.

    Values are YAML (``sagc.group_sizes=[4,8]``, ``model.path=null``); mapping values are
    merged into existing sections, ``null`` replaces one (``model.lora=null``). List items are
    addressed as ``rewards[0].weight``.
    """
    root: dict[str, Any] = _merge({}, d)
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value")
        key, raw = ov.split("=", 1)
        key = key.strip()
        try:
            value = yaml_load(raw)
        except (yaml.YAMLError, ValueError, RecursionError) as e:
            shown = raw if len(raw) <= 80 else f"{raw[:60]}... ({len(raw)} chars)"
            raise ConfigError(f"{key}: cannot parse value {shown!r} as YAML ({_why(e)})") from None
        _set(root, key, _parse_path(key), value)
    return root


def config_from_dict(d: Mapping[str, Any]) -> Config:
    """Validate a nested dict (missing keys take defaults) and build a :class:`Config`."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"config: expected a mapping at the top level, got {fmt(d)}")
    return Config.from_dict(d)


def config_to_dict(cfg: Any) -> Any:
    """Plain nested dict/list/scalar form of a config (tuples become lists), YAML-safe."""
    if isinstance(cfg, BaseModel):
        return {name: config_to_dict(getattr(cfg, name)) for name in type(cfg).model_fields}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg


def default_dict() -> dict[str, Any]:
    """The defaults as a nested dict, what a config file is merged into."""
    return config_to_dict(Config())


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (``None`` = all defaults), apply ``key=value`` overrides, validate."""
    data = read_yaml(path) if path is not None else {}
    merged = _merge(default_dict(), data)
    if overrides:
        merged = apply_overrides(merged, list(overrides))
    return config_from_dict(merged)


def load_saved_config(path: str | os.PathLike[str]) -> Config:
    """Load a config a run or an export *saved* (``config.yaml``, ``sagc_jax_config.yaml``).

    As :func:`load_config`, but a ``sagc:`` section written before the issue-32 rewrite is
    mapped to today's schema first (:func:`~sagc_jax.config.sagc.migrate_legacy_sagc`): an old
    run stays evaluable and exportable. A removed key holding a setting the controller no
    longer has is a one-line error naming the file and the key. A section saved before
    ``sagc.benefit`` existed gets the ``groups`` it ran under, not today's default.
    """
    data = read_yaml(path)
    sagc = data.get("sagc") if isinstance(data, Mapping) else None
    if isinstance(sagc, Mapping) and any(k in REMOVED_KEYS for k in sagc):
        try:
            data = {**data, "sagc": migrate_legacy_sagc(dict(sagc))}
        except ValueError as e:
            raise ConfigError(f"{os.fspath(path)}: {e}") from None
    sagc = data.get("sagc") if isinstance(data, Mapping) else None
    if isinstance(sagc, Mapping) and "benefit" not in sagc:
        # Saved before `sagc.benefit` existed (2026-12-06): every such run priced a step by
        # `groups`, whatever today's default, and its replay must see what it ran under.
        data = {**data, "sagc": {**sagc, "benefit": "groups"}}
    return config_from_dict(_merge(default_dict(), data))


def save_config(cfg: Config, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML; :func:`load_config` reads it back to an equal Config."""
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(config_to_dict(cfg), fh, sort_keys=False, default_flow_style=None)
