"""The ``data:`` (prompt source) and ``sampling:`` (rollout shapes) sections."""

from __future__ import annotations

import itertools
import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, model_validator

from sagc_jax.config.base import Bool, Float, Int, PosInt, Section, Str, field, rule_error
from sagc_jax.config.errors import fmt

__all__ = ["DataConfig", "SamplingSection", "check_increasing"]


def check_increasing(field_name: str, values: tuple[int, ...]) -> None:
    """Raise a rule error unless ``values`` is non-empty and strictly increasing."""
    if not values:
        raise rule_error(field_name, "must not be empty")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise rule_error(field_name, f"must be strictly increasing, got {fmt(values)}")


class _FrozenDict(dict):
    """A dict that hashes by its JSON text, so sections holding one stay hashable."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True, default=repr))


def _frozen(value: dict[str, Any]) -> dict[str, Any]:
    return _FrozenDict(value)


class DataConfig(Section):
    """Prompt source: a built-in task or a JSONL/Parquet file."""

    section_key = "data"
    task: Str | None = field("arith", "Built-in task name; set to null when train_file is given.")
    train_file: Str | None = field(None, "JSONL or Parquet training prompts.")
    eval_file: Str | None = field(None, "JSONL or Parquet evaluation prompts.")
    prompt_column: Str = field("prompt", "Column holding the prompt text.")
    answer_column: Str = field("answer", "Column holding the reference answer.")
    solution_column: Str = field(
        "solution",
        "Column holding a reference completion per prompt (a file's; a built-in task has its "
        "own): what the SFT warm start (init.sft_steps > 0) trains on.",
    )
    prompts_per_step: Int = field(8, "Distinct prompts per step (each gets G rollouts).", ge=1)
    shuffle: Bool = field(True, "Shuffle prompts each epoch.")
    num_epochs: Int | None = field(None, "Passes over the data; None = repeat forever.", ge=1)
    chat_template: Bool = field(False, "Wrap prompts with the tokenizer's chat template.")
    num_eval: Int = field(200, "Held-out examples generated for a built-in task.", ge=0)
    task_min_steps: Int = field(1, "Built-in task: minimum reasoning steps per problem.", ge=1)
    task_max_steps: Int = field(12, "Built-in task: maximum reasoning steps per problem.", ge=1)
    task_ramble_rate: Float | None = field(
        None,
        "Built-in task `ramble` only: fraction of SFT demonstrations that loop on a line (how "
        "often the warm-started policy rambles); None = the task's default (0.06).",
        ge=0,
        lt=1,
    )
    task_options: Annotated[dict[Str, Any], AfterValidator(_frozen)] | None = field(
        None,
        "Built-in task options for its factory, e.g. for task reasoning_gym {system_prompt: "
        "default, datasets: {chain_sum: {weight: 1, min_terms: 2}}} (docs/tasks.md); checked "
        "when the task is built.",
    )
    worker_count: Int = field(0, "grain worker processes; 0 = in-process.", ge=0)
    shards: Int | None = field(
        None,
        "Virtual data shards (a multiple of the process count; prompts_per_step must divide by "
        "it); None = one per process. Fixing it makes the prompt order independent of how many "
        "processes run.",
        ge=1,
    )

    @model_validator(mode="after")
    def _source(self) -> DataConfig:
        if self.task is not None and self.train_file is not None:
            raise rule_error(
                "train_file",
                f"set data.task=null when using a train file "
                f"(got task={self.task!r}, train_file={self.train_file!r})",
            )
        if self.task is None and self.train_file is None:
            raise rule_error("task", "exactly one of data.task and data.train_file must be set")
        if self.task_ramble_rate is not None and self.task != "ramble":
            raise rule_error(
                "task_ramble_rate",
                f"applies to data.task=ramble only (got task={self.task!r})",
            )
        if self.task_min_steps > self.task_max_steps:
            raise rule_error(
                "task_min_steps",
                f"must be <= data.task_max_steps ({self.task_max_steps}), "
                f"got {self.task_min_steps}",
            )
        return self


class SamplingSection(Section):
    """Rollout generation and its compiled shape set (``sampling:``)."""

    section_key = "sampling"
    max_new_tokens: Int = field(128, "Maximum completion tokens per row.", ge=1)
    temperature: Float = field(1.0, "Sampling temperature.", gt=0)
    top_k: Int | None = field(None, "Keep the k most likely tokens; None = off.", ge=1)
    top_p: Float | None = field(None, "Nucleus sampling mass; None = off.", gt=0, le=1)
    prompt_buckets: tuple[PosInt, ...] = field(
        (32, 64, 128), "Prompt lengths (tokens) prompts are padded up to; strictly increasing."
    )
    cache_buckets: tuple[PosInt, ...] | None = field(
        None, "KV-cache lengths; None = derived from prompt_buckets + max_new_tokens."
    )
    decode_chunk: Int = field(16, "Decode tokens per chunk inside the while loop.", ge=1)
    prompt_too_long: Literal["error", "truncate"] = field(
        "error", "What to do with a prompt longer than the largest bucket."
    )

    @model_validator(mode="after")
    def _buckets(self) -> SamplingSection:
        check_increasing("prompt_buckets", self.prompt_buckets)
        if self.cache_buckets is not None:
            check_increasing("cache_buckets", self.cache_buckets)
            need = self.prompt_buckets[-1] + self.max_new_tokens
            if self.cache_buckets[-1] < need:
                raise rule_error(
                    "cache_buckets",
                    f"largest must be >= largest prompt bucket + max_new_tokens ({need}), "
                    f"got {self.cache_buckets[-1]}",
                )
        return self
