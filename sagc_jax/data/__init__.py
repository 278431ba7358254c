"""Data: built-in tasks, tokenizer helpers, JSONL/Parquet readers and grain pipelines.

Names are re-exported lazily so ``import sagc_jax.data.tasks`` does not pull in grain or
transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # tasks
    "ArithSource": "arith",
    "LazySource": "task",
    "Task": "task",
    "TASKS": "tasks",
    "arith_example": "arith",
    "check_arith_solution": "arith",
    "get_task": "tasks",
    "make_arith_examples": "arith",
    "RambleSource": "ramble",
    "verify_ramble": "ramble",
    "ReasoningGymSource": "reasoning_gym",
    # readers
    "DataError": "readers",
    "read_examples": "readers",
    "read_jsonl": "readers",
    "read_parquet": "readers",
    # tokenizer
    "decode_completion": "tokenizer",
    "encode_prompt": "tokenizer",
    "load_tokenizer": "tokenizer",
    # pipeline
    "load_examples": "pipeline",
    "make_prompt_iterator": "pipeline",
    "make_sft_batches": "pipeline",
    # prompt stream
    "PromptStream": "prompt_stream",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
