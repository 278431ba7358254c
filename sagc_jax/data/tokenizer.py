"""Tokenizer loading and prompt/completion helpers.

Every tokenizer — the packaged char-level one or a Hugging Face model's — is loaded through
``transformers.AutoTokenizer.from_pretrained`` so the rest of the code sees one interface.
The packaged asset (``sagc_jax/assets/tokenizer``, rebuilt by ``tools/build_tokenizer.py``) is a
character-level tokenizer over printable ASCII + newline/tab with ``<pad>`` = 0, ``<bos>`` = 1,
``<eos>`` = 2, ``<unk>`` = 3 and a minimal chat template.

How a prompt becomes ids is decided once, on the tokenizer object (:func:`set_prompt_rule`: its
bos token first if it has one, applied by :func:`load_tokenizer`), and read in one place
(:func:`encode_prompts`) by training, eval and the length checks; export saves that same
tokenizer, so ``AutoTokenizer.from_pretrained(export)(text)`` gives the ids training used.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
from collections.abc import Iterable, Sequence

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = [
    "PACKAGED_TOKENIZER",
    "TokenizerError",
    "check_saved_tokenizer",
    "decode_completion",
    "encode_prompt",
    "encode_prompts",
    "encode_reply",
    "encode_text",
    "load_run_tokenizer",
    "load_tokenizer",
    "packaged_tokenizer_dir",
    "set_prompt_rule",
    "stop_ids",
]

#: Files that make a directory a Hugging Face tokenizer directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class TokenizerError(ValueError):
    """`model.tokenizer` / `model.path` name no usable tokenizer, or one that does not fit the
    model (the message names the key)."""

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
      path: a local directory (HF tokenizer files), a ``.gguf`` file (its tokenizer metadata and
        chat template), a model id already in the local HF cache, or
        ``None`` / ``"sagc-char"`` for the packaged char-level tokenizer. Nothing is downloaded
        unless the caller's environment allows it.

    Returns:
      The tokenizer. A pad token is guaranteed: if the tokenizer has none, its eos token is used.

    Raises:
      ValueError: the path does not hold a loadable tokenizer (message names the path).
    """
    where = packaged_tokenizer_dir() if path in (None, PACKAGED_TOKENIZER) else os.fspath(path)
    try:
        if _is_gguf_file(where):  # vocabulary, merges, special ids and template from metadata
            tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(where)),
                                                gguf_file=os.path.basename(where))
            _gguf_chat_template(tok, where)
        else:
            tok = AutoTokenizer.from_pretrained(where)
    except Exception as exc:  # HF raises OSError/ValueError/... depending on what is missing.
        raise ValueError(f"cannot load tokenizer from {where!r}: {exc}") from exc
    if tok.pad_token_id is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return set_prompt_rule(tok)


def _is_gguf_file(path: str) -> bool:
    return path.lower().endswith(".gguf") and os.path.isfile(path)


def _gguf_fields(path: str) -> dict:
    """A GGUF file's metadata fields (gguf-py, the `real` extra; tensors are not read)."""
    import gguf

    return gguf.GGUFReader(path).fields


def _gguf_chat_template(tok: PreTrainedTokenizerBase, path: str) -> None:
    """Sets the file's `tokenizer.chat_template` when transformers did not copy it."""
    if getattr(tok, "chat_template", None):
        return
    field = _gguf_fields(path).get("tokenizer.chat_template")
    if field is not None:
        tok.chat_template = field.contents()


def _gguf_vocab(path: str) -> int | None:
    """A GGUF model's vocab size: `{arch}.vocab_size`, else the length of its token list."""
    fields = _gguf_fields(path)
    arch = fields["general.architecture"].contents()
    if f"{arch}.vocab_size" in fields:
        return int(fields[f"{arch}.vocab_size"].contents())
    tokens = fields.get("tokenizer.ggml.tokens")
    return len(tokens.data) if tokens is not None else None


def _model_vocab(model_path: str) -> int | None:
    """The model's vocab size from `config.json` or GGUF metadata; None when unreadable
    (loading the model names the problem)."""
    try:
        if _is_gguf_file(model_path):
            return _gguf_vocab(model_path)
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
            return int(json.load(f)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _check_gguf(path: str, key: str) -> None:
    """Reads a GGUF file's metadata with gguf-py: GGUFError (one line naming the file) for a
    truncated or corrupt file or, for `model.path`, a model we cannot load (architecture,
    missing numbers), which transformers' tokenizer loader would report as a tokenizer
    problem; TokenizerError when gguf-py is not installed. A `model.tokenizer` GGUF may be a
    vocabulary-only file: only its readability is checked."""
    from sagc_jax.models.gguf import GGUFError, gguf_hf_dict, open_gguf  # lazily: jax, flax

    try:
        reader = open_gguf(path)
        if key == "model.path":
            gguf_hf_dict(reader, path)
    except ImportError as e:
        raise TokenizerError(f"{key}: {e}") from None
    except GGUFError as e:
        raise GGUFError(f"{key}: {e}") from None


def _looks_like_path(name: str) -> bool:
    return os.sep in name or name.startswith(("~", ".")) or os.path.exists(name)


def has_tokenizer(directory: str | os.PathLike[str]) -> bool:
    return any(os.path.isfile(os.path.join(directory, f)) for f in TOKENIZER_FILES)


def load_run_tokenizer(
    tokenizer: str | None, model_path: str | None
) -> PreTrainedTokenizerBase:
    """The tokenizer a run uses, checked against the model before anything is built.

    `model.tokenizer` if set; else `model.path`'s own tokenizer (its tokenizer files, or a GGUF
    file's metadata) if it has one; else the
    packaged char-level tokenizer — which, with `model.path` set, must match that model's
    vocabulary size exactly (a 400-token model with the 101-token built-in is refused, not
    trained). A tokenizer with more tokens than the model's vocabulary is refused too.

    Raises:
      TokenizerError: one line naming `model.path` / `model.tokenizer` and what is wrong.
    """
    vocab = None
    if model_path is not None:
        from sagc_jax.models.pretrained import resolve_model_path  # jax-free callers stay light

        try:  # a hub id: its snapshot in the local HF cache (downloaded if the user allows)
            model_path = resolve_model_path(model_path)
        except FileNotFoundError as e:
            raise TokenizerError(str(e)) from None
        gguf = model_path.lower().endswith(".gguf")
        if not (os.path.isfile(model_path) if gguf else os.path.isdir(model_path)):
            what = ("does not exist" if not os.path.exists(model_path)
                    else "is not a file" if gguf else "is not a directory")
            raise TokenizerError(f"model.path: {model_path} {what}")
        # A GGUF's own tokenizer is its vocabulary: only another tokenizer needs the check.
        vocab = None if gguf and tokenizer is None else _model_vocab(model_path)
    source = tokenizer
    if source is None and model_path is not None and (
            _is_gguf_file(model_path) or has_tokenizer(model_path)):
        source = model_path
    key = "model.tokenizer" if tokenizer is not None else "model.path"
    if source not in (None, PACKAGED_TOKENIZER):
        expanded = os.path.expanduser(source)
        if _looks_like_path(source) and not (os.path.isdir(expanded) or _is_gguf_file(expanded)):
            raise TokenizerError(f"{key}: tokenizer directory {source} does not exist")
        if _is_gguf_file(expanded):
            _check_gguf(expanded, key)  # a damaged file is named as damaged, before transformers
        try:
            tok = load_tokenizer(expanded)
        except ValueError as e:
            if _is_gguf_file(expanded) and isinstance(e.__cause__, ImportError):
                # transformers' GGUF reader imports torch: say so rather than blame the file.
                raise TokenizerError(
                    f"{key}: reading the tokenizer of {source} needs torch (transformers "
                    "imports it to read a GGUF file): pip install 'sagc-jax[real]'") from None
            raise TokenizerError(
                f"{key}: no loadable tokenizer at {source} (not a tokenizer directory nor a model "
                "id in the local Hugging Face cache)") from None
    else:
        tok = load_tokenizer(None)
    if vocab is not None and len(tok) > vocab:
        raise TokenizerError(f"{key}: tokenizer {source or PACKAGED_TOKENIZER} has {len(tok)} "
                             f"tokens, more than model.path {model_path}'s vocab_size {vocab}")
    if vocab is not None and source in (None, PACKAGED_TOKENIZER) and vocab != len(tok):
        raise TokenizerError(
            f"model.tokenizer is null and model.path {model_path} has no tokenizer files: the "
            f"built-in {len(tok)}-token tokenizer does not fit its vocab_size {vocab}; set "
            "model.tokenizer to the model's tokenizer directory")
    return tok


def encode_text(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Encode ``text`` with no special tokens added (special-token strings are still recognised)."""
    return list(tok.encode(text, add_special_tokens=False))


#: Stands for the model's turn when the template renders what follows it (plain text: no
#: template escapes it).
_TURN_MARK = "SAGC-MODEL-TURN-7f3a"


def encode_reply(tok: PreTrainedTokenizerBase, text: str, chat_template: bool = False,
                 after_eos: bool = True) -> list[int]:
    """Token ids of an environment's reply, appended to an episode after a model turn.

    Plain: the text's ids, no special tokens (as a completion's). With ``chat_template``: what
    the tokenizer's template writes after an assistant message's text when a user message with
    ``text`` follows, up to the next generation prompt (the assistant turn's closing markup, the
    user turn, the assistant header), so the model's next turn opens as an assistant message
    does. What a template writes once at a conversation's start (a bos, a default system
    message) is not repeated. ``after_eos``: the model's turn ended with its EOS, which is then
    the closing markup's first token already in the episode (a turn cut by a stop string gets it
    from the reply).
    """
    if not chat_template:
        return encode_text(tok, text) if text else []
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _TURN_MARK},
            {"role": "user", "content": text}]
    rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    tail = rendered[rendered.index(_TURN_MARK) + len(_TURN_MARK):]
    if after_eos and tok.eos_token and tail.startswith(tok.eos_token):
        tail = tail[len(tok.eos_token):]
    return encode_text(tok, tail)


#: Set on a tokenizer once :func:`set_prompt_rule` has configured it (checked, not re-done).
_RULE_ATTR = "_sagc_prompt_rule"


def set_prompt_rule(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Make ``tok`` itself encode a prompt the way training does: its bos token first if it has
    one (Llama-style), nothing if it has none (Qwen2-style), never an eos. Returns ``tok``.

    The rule lives on the tokenizer object, so ``tok(text)``, ``encode_prompt`` and the files
    ``tok.save_pretrained`` writes agree: transformers 5 keeps the rule as the
    ``TemplateProcessing`` post-processor in tokenizer.json (it drops ``add_bos_token`` from
    tokenizer_config.json) and applies it on reload (whose ``add_bos_token`` property then reads
    False: the post-processor is what counts). Idempotent; mutates ``tok``.

    Raises:
      TokenizerError: the tokenizer ignores ``add_bos_token`` (the message names it).
    """
    want = tok.bos_token_id is not None
    if getattr(tok, _RULE_ATTR, None) == want:
        return tok
    # TokenizersBackend rebuilds its post-processor to exactly `[bos] $A` / `$A` on each set.
    tok.add_eos_token = False
    tok.add_bos_token = want
    plain = tok("1", add_special_tokens=False)["input_ids"]
    if tok("1")["input_ids"] != [tok.bos_token_id] * want + plain:
        raise TokenizerError(
            f"tokenizer {tok.name_or_path or type(tok).__name__} ({type(tok).__name__}) does "
            f"not honour add_bos_token={want}; use a fast (tokenizer.json) tokenizer")
    setattr(tok, _RULE_ATTR, want)
    return tok


def encode_prompts(
    tok: PreTrainedTokenizerBase, texts: Sequence[str], chat_template: bool = False
) -> list[list[int]]:
    """Token ids of prompts, ready for generation: the one place a prompt becomes ids.

    Plain: ``tok(text).input_ids`` with the tokenizer's own special tokens, which after
    :func:`set_prompt_rule` (applied here) are its bos token, if it has one. A prompt that
    already starts with the bos string gets no second one. With ``chat_template`` the text
    becomes a single user message and the ids are ``tok.apply_chat_template(...,
    add_generation_prompt=True)``'s exactly (the template decides about bos, as it does for
    transformers, vLLM and TRL). An exported tokenizer reproduces both (``export`` checks).
    """
    set_prompt_rule(tok)
    if chat_template:
        if not getattr(tok, "chat_template", None):
            raise ValueError("chat_template=True but the tokenizer has no chat template")
        return [list(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True,
                                             add_generation_prompt=True, return_dict=False))
                for t in texts]
    if not texts:
        return []
    out = [list(ids) for ids in tok(list(texts))["input_ids"]]
    bos, bos_id = tok.bos_token, tok.bos_token_id
    if bos is not None:
        for i, t in enumerate(texts):
            if t.startswith(bos) and out[i][:2] == [bos_id, bos_id]:
                del out[i][0]  # the text's own bos plus the tokenizer's: keep one
    return out


def encode_prompt(
    tok: PreTrainedTokenizerBase, text: str, chat_template: bool = False
) -> list[int]:
    """Token ids of one prompt (see :func:`encode_prompts`).
    For the packaged char-level tokenizer ``decode(encode_prompt(tok, x)[1:]) == x``.
    """
    return encode_prompts(tok, [text], chat_template)[0]


#: Prompts an export's reloaded tokenizer must encode exactly as training did.
PROBE_PROMPTS = ("2+6+7+2=", "9-3+5=", "Hello, World!\nWhat is 2*3?", "")


def check_saved_tokenizer(
    tok: PreTrainedTokenizerBase, directory: str | os.PathLike[str], chat_template: bool = False,
    prompts: Sequence[str] = PROBE_PROMPTS,
) -> None:
    """Reloads the tokenizer saved in ``directory`` with ``AutoTokenizer`` (as a user would)
    and checks it encodes ``prompts`` (and, with ``chat_template``, their chat renderings)
    exactly as :func:`encode_prompts` does with ``tok``.

    Raises:
      ValueError: the first prompt whose ids differ, and both id lists.
    """
    saved = AutoTokenizer.from_pretrained(os.fspath(directory))
    modes = (False, True) if chat_template else (False,)
    for chat in modes:
        ours = encode_prompts(tok, prompts, chat)
        for text, want in zip(prompts, ours):
            msg = [{"role": "user", "content": text}]
            got = (list(saved.apply_chat_template(msg, tokenize=True, add_generation_prompt=True,
                                                  return_dict=False))
                   if chat else list(saved(text)["input_ids"]))
            if got != want:
                raise ValueError(f"the tokenizer saved in {directory} encodes {text!r}"
                                 f"{' (chat)' if chat else ''} as {got}, training as {want}")


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
