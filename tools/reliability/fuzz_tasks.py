"""Task options that cannot work: what `data.task` / `data.task_options` / the prompt buckets may
say that no run can train on.

Each case is `configs/tiny_cpu.yaml` plus seeded overrides of one kind:

  rg_unknown_dataset   a reasoning-gym dataset name that does not exist
  rg_bad_setting       a real dataset with a setting its generator rejects (negative or zero
                       sizes, min above max, an unknown keyword, a wrong type)
  rg_bad_weight        a dataset weight that is not a number > 0 (0, negative, NaN, inf, text)
  rg_bad_prompt        `system_prompt` that is not one of reasoning-gym's keys
  rg_no_datasets       `datasets` empty, missing, or not a mapping
  too_long_prompts     prompt buckets smaller than the task's prompts (reasoning-gym or the
                       built-in `arith`, with and without the chat template)
  builtin_bad_options  the built-in tasks' own options out of range (`task_min_steps` above
                       `task_max_steps`, negative, an unknown task name)

and the trainer's start-up checks run on it (`train.setup.check_inputs`, after `load_config`:
what `sagc-jax train` does before it builds a model). A case passes when it is refused with an
error the CLI exits 2 for (`sagc_jax.cli.input_errors`), on one line, naming a `data.` or
`sampling.` key. Every case is recorded (kind, seed, overrides, outcome, exit code, line).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from .cases import Result

KINDS = ("rg_unknown_dataset", "rg_bad_setting", "rg_bad_weight", "rg_bad_prompt",
         "rg_no_datasets", "too_long_prompts", "builtin_bad_options")
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tiny_cpu.yaml"
_RG = ["data.task=reasoning_gym", "rewards=[{name: reasoning_gym, weight: 1.0}]",
       "init.sft_steps=0"]
# Settings each generator rejects: (dataset, setting, bad values).
_BAD_SETTINGS = (
    ("chain_sum", "min_terms", [0, -1, -7]),
    ("chain_sum", "min_digits", [0, -2]),
    ("basic_arithmetic", "min_terms", [0, -3]),
    ("basic_arithmetic", "operators", [[], "+"]),
    ("products", "min_terms", [0, -1]),
    ("leg_counting", "min_animals", [0, -4]),
    ("chain_sum", "no_such_option", [1, "x"]),
    ("products", "max_digits", [-5, 0]),
)


def _yaml(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return ".nan" if v != v else (".inf" if v > 0 else "-.inf")
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    return str(v)


def _case(kind: str, rng: random.Random) -> list[str]:
    """The overrides of one case of `kind`."""
    if kind == "rg_unknown_dataset":
        name = rng.choice(["chain_summ", "arith", "gsm8k", "", "no_such_ds", "ChainSum",
                           "basic-arithmetic", "x" * rng.randrange(1, 40)])
        return [*_RG, f"data.task_options={{datasets: {{{name!r}: {{weight: 1}}}}}}"]
    if kind == "rg_bad_setting":
        ds, key, bad = rng.choice(_BAD_SETTINGS)
        return [*_RG, f"data.task_options={{datasets: {{{ds}: {{weight: 1, {key}: "
                      f"{_yaml(rng.choice(bad))}}}}}}}"]
    if kind == "rg_bad_weight":
        w = rng.choice([0, -1, -0.5, float("nan"), float("inf"), "heavy", None, [1]])
        return [*_RG, f"data.task_options={{datasets: {{chain_sum: {{weight: "
                      f"{'null' if w is None else _yaml(w)}}}}}}}"]
    if kind == "rg_bad_prompt":
        p = rng.choice(["nope", "Default", "deepseek", "", 7, "simple "])
        return [*_RG, f"data.task_options={{system_prompt: {_yaml(p)}, datasets: {{chain_sum: "
                      "{weight: 1}}}"]
    if kind == "rg_no_datasets":
        v = rng.choice(["{}", "[]", "null", "chain_sum", "[chain_sum]", "7"])
        return [*_RG, f"data.task_options={{datasets: {v}}}"]
    if kind == "too_long_prompts":
        bucket = rng.choice([4, 8, 12, 16])
        chat = rng.choice(["true", "false"])
        if rng.random() < 0.5:
            task = [*_RG, "data.task_options={datasets: {chain_sum: {weight: 1}}}"]
        else:
            task = ["data.task=arith", f"data.task_max_steps={rng.randrange(4, 12)}"]
        return [*task, f"sampling.prompt_buckets=[{bucket}]", f"data.chat_template={chat}"]
    lo = rng.randrange(2, 9)
    return rng.choice([
        ["data.task=arith", f"data.task_min_steps={lo + rng.randrange(1, 5)}",
         f"data.task_max_steps={lo}"],
        ["data.task=arith", f"data.task_min_steps={-rng.randrange(1, 5)}"],
        [f"data.task={rng.choice(['arith9', 'reasoninggym', 'gsm8k', 'Arith'])}"],
    ])


def check_one(overrides: list[str], run_dir: Path) -> tuple[str, int, str]:
    """(outcome, exit code, error line) of one case through load_config + check_inputs."""
    from sagc_jax.cli import input_errors
    from sagc_jax.config import load_config
    from sagc_jax.train.setup import check_inputs

    try:
        cfg = load_config(CONFIG, [*overrides, f"run.dir={run_dir}", "run.eval_every=0"])
        check_inputs(cfg)
    except input_errors() as e:
        line = str(e)
        if "\n" in line.strip():
            return "refused, several lines", 2, line
        if "data." not in line and "sampling." not in line and "rewards" not in line:
            return "refused, no key named", 2, line
        return "refused, one line naming the key", 2, line
    except Exception as e:  # the CLI would exit 1 with a runtime error: a failure here
        return f"exit 1: {type(e).__name__}", 1, f"{type(e).__name__}: {e}"[:400]
    return "accepted", 0, ""


def run_task_fuzz(per_kind: int, seed: int, work: Path) -> Result:
    """`per_kind` cases of every kind, seeded; a case passes when refused in one line."""
    rng = random.Random(seed)
    res = Result()
    for kind in KINDS:
        for i in range(per_kind):
            overrides = _case(kind, rng)
            outcome, code, line = check_one(overrides, work / f"{kind}-{i}")
            res.tried += 1
            res.outcomes[f"{kind}: {outcome}"] += 1
            res.records.append({"kind": kind, "seed": seed, "case": i, "overrides": overrides,
                                "outcome": outcome, "exit_code": code, "line": line})
            if outcome != "refused, one line naming the key":
                res.failures.append((kind, i, overrides, line))
    return res
