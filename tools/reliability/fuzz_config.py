"""Config fuzzing: generated ``key=value`` overrides and YAML documents through `load_config`.

Every case must either return a `Config` (whose shape plan is then checked too) or raise the
project's `ConfigError` with a one-line message; anything else is a "traceback" outcome (the CLI
would print one). The generator is seeded, so a failing case is reproduced by its index.

Cases mix valid dotted keys with misspelt, unknown and malformed ones, and valid values with
wrong types, out-of-range numbers, NaN/inf, huge and deep structures and broken YAML.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import yaml

from sagc_jax.config import Config, ConfigError, config_to_dict, load_config
from sagc_jax.config.errors import config_keys

DEFAULTS = config_to_dict(Config())
LEAVES = [k.replace("[*]", "[0]") for k in config_keys(Config)]
SECTIONS = [k for k, v in DEFAULTS.items() if isinstance(v, dict)]

_BAD_KEYS = ["", "=", ".", "a..b", "sagc.", ".sagc", "sagc[", "rewards[x]", "rewards[-1]",
             "rewards[99].weight", "sagc.delta.x", "sagc[0]", "run.steps[0]", "9run", "sägc.delta",
             "sagc delta", "__class__", "run.__dict__", "sagc.group_sizes[9]", "model[0].x"]
_RAW_VALUES = ["", "null", "~", "[", "]", "{", "{a", "[1, 2", ": :", "*alias", "&a [*a]",
               "!!python/object/apply:os.system ['true']", "!!binary aGk=", "\t1", "'unterminated",
               "{a: 1, a: 2}", "[" * 300 + "]" * 300, "- - - -", "? x", "%YAML 1.1", "---",
               "1e400", "-1e400", ".nan", ".inf", "-.inf", "0x10", "0o17", "1_000", "yes", "no",
               "on", "off", "2026-12-02", "12:30:00", "\x00", "\x1b[31m", "\ud800", "é" * 50,
               "9" * 5000, "1" + "0" * 400, "[1, [2, [3, [4]]]]", "{x: {y: {z: []}}}"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random YAML-able value: scalars of every type and range, or nested garbage."""
    r = rng.random()
    if r < 0.15:
        return rng.choice([0, 1, -1, 2, 3, 7, 8, 16, 10**9, -(10**9), 10**30, 2**63])
    if r < 0.30:
        return rng.choice([0.0, -0.0, 0.5, 1.5, -2.5, 1e-9, 1e308, float("nan"), float("inf"),
                           -float("inf"), 3e-5])
    if r < 0.40:
        return rng.choice([True, False, None])
    if r < 0.55:
        return rng.choice(["", "abc", "q90", "rate", "raise", "zero", "auto", "llama", "none",
                           "x" * rng.choice([1, 100, 10000]), "1.5", "true", "null", "[4,8]"])
    if r < 0.70 and depth < 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if r < 0.80 and depth < 3:
        keys = [rng.choice(LEAVES).rsplit(".", 1)[-1], "name", "weight", "x", "", "0"]
        return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    # A plausible value of a real field, so deep validation is reached too.
    section = DEFAULTS[rng.choice(SECTIONS)]
    return rng.choice(list(section.values()) or [0])


def _misspell(rng: random.Random, key: str) -> str:
    i = rng.randrange(len(key))
    op = rng.randrange(4)
    if op == 0:
        return key[:i] + key[i + 1:]
    if op == 1:
        return key[:i] + rng.choice("abcxyz_.") + key[i:]
    if op == 2 and i + 1 < len(key):
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    return key.upper() if rng.random() < 0.5 else key + "s"


def _key(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.55:
        return rng.choice(LEAVES)
    if r < 0.70:
        return _misspell(rng, rng.choice(LEAVES))
    if r < 0.80:
        return rng.choice([*SECTIONS, "rewards", "rewards[0]", "rewards[1]"])
    if r < 0.90:
        return rng.choice(SECTIONS) + "." + rng.choice(["foo", "x1", "delta2", "lr_", "steps"])
    return rng.choice(_BAD_KEYS)


def _dump(v: Any) -> str:
    try:
        return yaml.safe_dump(v, default_flow_style=True, width=10**9).strip().removesuffix(
            "\n...").removesuffix("...").strip()
    except (yaml.YAMLError, RecursionError):
        return "null"


def _default(key: str) -> Any:
    cur: Any = DEFAULTS
    for part in key.replace("[0]", ".0").split("."):
        if isinstance(cur, list):
            cur = cur[int(part)] if part.isdigit() and int(part) < len(cur) else None
        elif isinstance(cur, dict):
            cur = cur.get(part)
        else:
            return None  # a section that defaults to null (model.lora): no default to vary
    return cur


def _plausible(rng: random.Random, key: str) -> Any:
    """A value near the field's default (often valid), so the valid path is exercised too."""
    v = _default(key)
    if isinstance(v, bool):
        return rng.choice([v, not v])
    if isinstance(v, int):
        return max(v + rng.choice([-1, 0, 1, 2]), 0)
    if isinstance(v, float):
        return v * rng.choice([0.5, 1.0, 2.0])
    return v


def override_case(rng: random.Random) -> list[str]:
    """1-4 ``key=value`` strings (sometimes without '=', sometimes a raw YAML value)."""
    out = []
    for _ in range(rng.randrange(1, 5)):
        if rng.random() < 0.4:
            key = rng.choice(LEAVES)
            out.append(f"{key}={_dump(_plausible(rng, key))}")
            continue
        key = _key(rng)
        raw = rng.choice(_RAW_VALUES) if rng.random() < 0.25 else _dump(_value(rng))
        out.append(key if rng.random() < 0.03 else f"{key}={raw}")
    return out


def yaml_case(rng: random.Random) -> str:
    """A YAML document: mutated real sections, duplicate keys, or broken text."""
    r = rng.random()
    if r < 0.1:
        return rng.choice([*_RAW_VALUES, "- a\n- b", "42", "sagc: [1, 2]", "sagc:\n  - x",
                                         "a: 1\n---\nb: 2", "run: {steps: 1}\nrun: {steps: 2}",
                                         "\xff\xfe", "sagc:\n\tdelta: 0.1"])
    doc: dict[str, Any] = {}
    for _ in range(rng.randrange(1, 5)):
        sec = rng.choice([*SECTIONS, "rewards", "reward_on_error", "reward_timeout_s", "bogus"])
        base = DEFAULTS.get(sec)
        if isinstance(base, dict) and rng.random() < 0.8:
            sub = {}
            for _ in range(rng.randrange(1, 4)):
                k = rng.choice(list(base) or ["x"])
                sub[_misspell(rng, k) if rng.random() < 0.15 else k] = _value(rng)
            doc[sec] = sub
        else:
            doc[sec] = _value(rng)
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) if rng.random() < 0.95 \
        else _dump(doc)
    if rng.random() < 0.1:  # repeat a top-level block (a second `sagc:` further down)
        first = text.splitlines()[0]
        text += first + ("\n  x: 1\n" if first.rstrip().endswith(":") else "\n")
    if rng.random() < 0.05 and len(text) > 2:  # cut mid-document
        text = text[: rng.randrange(1, len(text))]
    return text


@dataclass
class ConfigFuzzResult:
    """Counts of a config fuzz run; `failures` holds (case index, case, what happened)."""

    tried: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: list[tuple[int, Any, str]] = field(default_factory=list)


def check_one(overrides: list[str] | None, text: str | None, path: str) -> str:
    """Outcome of one case: 'ok' (a Config, its shape plan checked), 'error' (a one-line
    ConfigError); raises AssertionError for anything else (what the CLI would print as a
    traceback, or a multi-line message)."""
    from sagc_jax.shapes import ShapePlan

    if text is not None:
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write(text)
    try:
        cfg = load_config(path if text is not None else None, overrides or [])
    except ConfigError as e:
        msg = str(e)
        assert msg and "\n" not in msg, f"ConfigError message is not one line: {msg!r:.300}"
        return "error"
    except Exception as e:  # that is what we look for
        raise AssertionError(f"{type(e).__name__}: {e!s:.300}") from e
    assert isinstance(cfg, Config)
    try:  # what `train` checks next, before anything is built
        ShapePlan.from_config(cfg).problems()
    except (ConfigError, ValueError) as e:  # train reports these in one line
        assert "\n" not in str(e), f"plan error is not one line: {e!s:.300}"
        return "ok_plan_error"
    return "ok"


def run_config_fuzz(n: int, seed: int = 0) -> ConfigFuzzResult:
    """`n` cases (half overrides, half YAML documents) from seed `seed`."""
    rng = random.Random(seed)
    res = ConfigFuzzResult()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.yaml")
        for i in range(n):
            kind = "overrides" if i % 2 == 0 else "yaml"
            case: Any = override_case(rng) if kind == "overrides" else yaml_case(rng)
            try:
                out = check_one(case if kind == "overrides" else None,
                                case if kind == "yaml" else None, path)
            except AssertionError as e:
                res.failures.append((i, case, str(e)))
                out = "traceback"
            res.tried += 1
            res.outcomes[f"{kind}:{out}"] += 1
    return res
