"""What a dry run checks about a config's inputs without loading weights: the tokenizer, the
data files and task options, the reward names, and the model's architecture (from what exists
here, `models.build.describe_model`)."""

from __future__ import annotations

import os

from sagc_jax.config import Config
from sagc_jax.models.build import ModelSource, ModelSourceError, describe_model
from sagc_jax.models.gguf import is_gguf

__all__ = ["MISSING", "DryRunError", "model_and_inputs"]

MISSING = "not checked (path missing)"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class DryRunError(ValueError):
    """The config cannot run at all (bad mesh, unreadable model config...); one line."""



def _tokenizer_check(path: str | None, model_path: str | None = None) -> tuple[str, int | None]:
    """(status, vocab length) of ``model.tokenizer`` (unset: a GGUF ``model.path``'s own
    tokenizer); loads only what exists locally."""
    if path is None and is_gguf(model_path):  # the file's own tokenizer (missing: unchecked)
        path = model_path
    if path is not None and not os.path.exists(path):
        return MISSING, None
    if path is not None and os.path.isdir(path) and not any(
            os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return "not checked (no tokenizer files)", None
    from sagc_jax.data.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(path)
    except ValueError as e:
        return f"error: {str(e).splitlines()[0]}", None
    return f"ok ({len(tok)} tokens)", len(tok)


def _check_paths(cfg: Config) -> dict[str, str]:
    d = cfg.data
    out: dict[str, str] = {}
    if d.task is not None:
        from sagc_jax.data.tasks import TASKS

        out["data.task"] = ("ok" if d.task in TASKS
                            else f"error: unknown task (built-ins: {', '.join(sorted(TASKS))})")
        if d.task in TASKS:  # the options, e.g. reasoning-gym dataset names and settings
            from sagc_jax.data.pipeline import task_options
            from sagc_jax.data.tasks import get_task

            try:
                get_task(d.task, **task_options(d))
                if d.task_options:
                    out["data.task_options"] = "ok"
            except ValueError as e:  # "data.task_options.x: why" or "unknown key ..."
                msg = str(e).splitlines()[0]
                key, sep, why = msg.partition(": ")
                if not (sep and key.startswith("data.task_options")):
                    key, why = "data.task_options", msg
                out[key] = f"error: {why}"
    for key, path in (("data.train_file", d.train_file), ("data.eval_file", d.eval_file)):
        if path is not None:
            out[key] = f"exists ({os.path.getsize(path)} bytes)" if os.path.isfile(path) \
                else MISSING
    from sagc_jax.rewards import resolve_reward

    for i, r in enumerate(cfg.rewards):
        try:
            resolve_reward(r.name)
            out[f"rewards[{i}].name"] = f"ok ({r.name}, weight {r.weight:g})"
        except ValueError as e:
            out[f"rewards[{i}].name"] = f"error: {str(e).splitlines()[0]}"
    return out


def model_and_inputs(cfg: Config) -> tuple[ModelSource, dict[str, str], list[str]]:
    """(the architecture the config describes and its source, the input checks, their errors):
    the model from what exists here (`describe_model`), the tokenizer and data paths."""
    tok_status, tok_len = _tokenizer_check(cfg.model.tokenizer, cfg.model.path)
    checks = {"model.tokenizer": tok_status, **_check_paths(cfg)}
    try:
        described = describe_model(cfg, tok_len)
    except ModelSourceError as e:
        raise DryRunError(str(e)) from None
    errors = [f"{k}: {v[len('error: '):]}" for k, v in checks.items() if v.startswith("error")]
    if tok_len is not None and tok_len > described.config.vocab_size:
        errors.insert(0, f"model.tokenizer: {tok_len} tokens but the model's vocab_size is "
                      f"{described.config.vocab_size}")
    return described, checks, errors
