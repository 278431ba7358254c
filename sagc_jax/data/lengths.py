"""Every prompt's token length, checked before step 1 (not when training reaches it, hours in).

The grain pipeline tokenises lazily, so a prompt longer than the largest prompt bucket would
otherwise surface only when its batch is drawn — after the SFT warm start and compilation. Here
an in-memory split (a dataset file) is tokenised once up front (batched through the fast
tokenizer; per prompt only with a chat template). A lazily generated built-in task instead offers
`longest_prompts()`, prompts of its maximal length, so its 100k examples need not be generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sagc_jax.data.readers import DataError
from sagc_jax.data.tokenizer import encode_prompts

__all__ = ["check_prompt_lengths", "prompt_lengths"]

_CHUNK = 4096


def prompt_lengths(examples: Sequence[dict[str, Any]], tokenizer: Any,
                   chat_template: bool = False) -> list[int]:
    """Token length of each example's prompt exactly as the pipeline encodes it
    (`encode_prompts`, the one encoder: chat template if set, the tokenizer's bos if it has
    one)."""
    out: list[int] = []
    for start in range(0, len(examples), _CHUNK):
        texts = [examples[i]["prompt"] for i in range(start, min(start + _CHUNK, len(examples)))]
        out.extend(len(ids) for ids in encode_prompts(tokenizer, texts, chat_template))
    return out


def check_prompt_lengths(examples: Sequence[dict[str, Any]], tokenizer: Any, *, max_len: int,
                         where: str, chat_template: bool = False) -> int:
    """Raises DataError naming the first example longer than `max_len` tokens (its index in
    `where`, e.g. "data.train_file x.jsonl", its length and start) and the two config keys that
    fix it; returns the longest prompt's length."""
    fix = (f"longer than the largest sampling.prompt_buckets entry {max_len}; add a larger "
           "bucket or set sampling.prompt_too_long: truncate")
    longest = getattr(examples, "longest_prompts", None)
    if callable(longest):  # a generated task: its worst case bounds every example
        n = max(prompt_lengths([{"prompt": p} for p in longest()], tokenizer, chat_template))
        if n > max_len:
            raise DataError(f"{where}: its longest prompts are {n} tokens, {fix}")
        return n
    lengths = prompt_lengths(examples, tokenizer, chat_template)
    for i, n in enumerate(lengths):
        if n > max_len:
            text = examples[i]["prompt"]
            raise DataError(f"{where}: example {i} (prompt starts {text[:40]!r}) is {n} tokens, "
                            f"{fix}")
    return max(lengths, default=0)
