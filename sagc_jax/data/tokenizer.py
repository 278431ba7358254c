"""Tokenizer loading and prompt/completion helpers.

Every tokenizer — the packaged char-level one or a Hugging Face model's — is loaded through
``transformers.AutoTokenizer.from_pretrained`` so the rest of the code sees one interface.
The packaged asset (``sagc_jax/assets/tokenizer``, rebuilt by ``scripts/build_tokenizer.py``) is a
character-level tokenizer over printable ASCII + newline/tab with ``<pad>`` = 0, ``<bos>`` = 1,
``<eos>`` = 2, ``<unk>`` = 3 and a minimal chat template.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
from collections.abc import Iterable, Sequence

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = [
    "PACKAGED_TOKENIZER",
    "decode_completion",
    "encode_prompt",
    "encode_text",
    "load_tokenizer",
    "packaged_tokenizer_dir",
    "stop_ids",
]

#: Name accepted by :func:`load_tokenizer` (besides ``None``) for the packaged asset.
PACKAGED_TOKENIZER = "sagc-char"

_EXIT_STACK = contextlib.ExitStack()


def packaged_tokenizer_dir() -> str:
    """Filesystem path of the packaged tokenizer directory (``sagc_jax/assets/tokenizer``)."""
    ref = importlib.resources.files("sagc_jax") / "assets" / "tokenizer"
    # ``as_file`` is a no-op for a normal install; for a zipped install it extracts once and keeps
    # the temporary directory alive for the life of the process.
    return str(_EXIT_STACK.enter_context(importlib.resources.as_file(ref)))


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer with ``AutoTokenizer.from_pretrained``.

    Args:
      path: a local directory (HF tokenizer files), a model id already in the local HF cache, or
        ``None`` / ``"sagc-char"`` for the packaged char-level tokenizer. Nothing is downloaded
        unless the caller's environment allows it.

    Returns:
      The tokenizer. A pad token is guaranteed: if the tokenizer has none, its eos token is used.

    Raises:
      ValueError: the path does not hold a loadable tokenizer (message names the path).
    """
    where = packaged_tokenizer_dir() if path in (None, PACKAGED_TOKENIZER) else os.fspath(path)
    try:
        tok = AutoTokenizer.from_pretrained(where)
    except Exception as exc:  # HF raises OSError/ValueError/... depending on what is missing.
        raise ValueError(f"cannot load tokenizer from {where!r}: {exc}") from exc
    if tok.pad_token_id is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def encode_text(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Encode ``text`` with no special tokens added (special-token strings are still recognised)."""
    return list(tok.encode(text, add_special_tokens=False))


def encode_prompt(
    tok: PreTrainedTokenizerBase, text: str, chat_template: bool = False
) -> list[int]:
    """Token ids of a prompt, ready for generation.

    With ``chat_template`` the text becomes a single user message rendered by the tokenizer's chat
    template with the generation prompt appended. A bos token is prepended if the tokenizer has
    one and the ids do not already start with it (so templates that emit bos don't get two).
    For the packaged char-level tokenizer ``decode(encode_prompt(tok, x)[1:]) == x``.
    """
    if chat_template:
        if not getattr(tok, "chat_template", None):
            raise ValueError("chat_template=True but the tokenizer has no chat template")
        text = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    ids = encode_text(tok, text)
    bos = tok.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def _eos_ids(tok: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    eos = tok.eos_token_id
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Iterable):
        ids.update(int(i) for i in eos)
    return ids


def stop_ids(tok: PreTrainedTokenizerBase) -> list[int]:
    """Token ids generation stops on: the eos id(s) plus any generation-only ones
    (`generation_eos_ids`, e.g. a chat model's end-of-turn token)."""
    return sorted(_eos_ids(tok) | {int(i) for i in getattr(tok, "generation_eos_ids", None) or ()
                                   if i is not None})


def decode_completion(tok: PreTrainedTokenizerBase, ids: Sequence[int] | np.ndarray) -> str:
    """Decode generated ids: cut at the first eos, drop pad (and other special) tokens."""
    eos = _eos_ids(tok)
    pad = tok.pad_token_id
    out: list[int] = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
        if i in eos:
            break
        if i != pad:
            out.append(i)
    return tok.decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False)
