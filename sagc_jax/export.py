"""Export a trained policy as a Hugging Face model directory.

`export(checkpoint, out)` loads the params of a run / step / HF directory with
`open_run.load_policy` and writes `config.json` + `model.safetensors` (float32, torch names) and
the tokenizer files, which `transformers.AutoModelForCausalLM.from_pretrained` loads and
generates from. The run's resolved config is copied as `sagc_jax_config.yaml`, so
`sagc-jax eval` on the exported directory keeps the run's default eval data and rewards
(transformers ignores the file). LoRA runs: `fmt="merged"` merges the adapters into the weights;
`fmt="peft"` writes only the adapters as a PEFT adapter directory (`models/peft.py`) for the
run's `model.path`, with the tokenizer files beside them.

The tokenizer written is the one training encoded prompts with, its bos rule included
(`data.tokenizer.set_prompt_rule`), plus its chat template; after writing, it is reloaded with
`AutoTokenizer` and checked to encode probe prompts (chat-rendered too when the run had
`data.chat_template`) exactly as training does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

from sagc_jax.config import save_config
from sagc_jax.data.tokenizer import check_saved_tokenizer, set_prompt_rule
from sagc_jax.models import save_pretrained
from sagc_jax.models.peft import save_peft_adapter
from sagc_jax.open_run import CONFIG_IN_HF_DIR, load_policy

__all__ = ["export"]


def export(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    tokenizer: Any = None,
    fmt: str = "merged",
) -> Path:
    """Writes the HF directory `out` for `checkpoint`; returns its absolute path.

    Every process takes part (sharded params are gathered), only process 0 writes.

    Raises:
      CheckpointPathError: `checkpoint` is not loadable (see `load_policy`).
      FileExistsError: `out` is the checkpoint itself, an existing file, or a directory that is
        not empty (unless `overwrite`).
      NoAdaptersError: `fmt="peft"` for a policy without LoRA adapters.
      TokenizerError: the tokenizer cannot carry the bos rule in its files.
      ValueError: an unknown `fmt`; the saved tokenizer does not encode as training did.
    """
    if fmt not in ("merged", "peft"):
        raise ValueError(f"export format must be 'merged' or 'peft', got {fmt!r}")
    dest = Path(out).expanduser().absolute()
    src = Path(checkpoint).expanduser().absolute()
    if dest == src:
        raise FileExistsError(f"refusing to export into the checkpoint directory itself ({dest})")
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"--out {dest} is an existing file, not a directory (choose a "
                              "directory path; --force does not replace files)")
    # Only the writer checks: on a shared filesystem the others could see process 0's files.
    if jax.process_index() == 0 and not overwrite and dest.is_dir() and any(dest.iterdir()):
        raise FileExistsError(f"export directory {dest} exists and is not empty "
                              "(choose another --out or pass --force)")
    model, tok, cfg = load_policy(src, tokenizer=tokenizer)
    set_prompt_rule(tok)  # a caller's tokenizer too: the files must say what training did
    if fmt == "peft":
        base = cfg.model.path if cfg is not None else None
        save_peft_adapter(model, dest, base_model=base)  # gathers everywhere, process 0 writes
        if jax.process_index() == 0:
            tok.save_pretrained(dest)
    else:
        save_pretrained(model, dest, tokenizer=tok)  # gathers on every process, process 0 writes
        if jax.process_index() == 0 and cfg is not None:
            save_config(cfg, dest / CONFIG_IN_HF_DIR)
    if jax.process_index() == 0:
        check_saved_tokenizer(tok, dest, chat_template=cfg is not None and cfg.data.chat_template)
    return dest
