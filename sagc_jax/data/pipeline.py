"""grain pipelines: the RL prompt stream and SFT warm-start batches.

``make_prompt_iterator`` builds::

    MapDataset.source(examples)[process_index::process_count]   # per-process shard
        .shuffle(seed)                                           # (if shuffle)
        .repeat(num_epochs)                                      # reshuffled every epoch
        .map(tokenise prompt -> prompt_ids)
        .to_iter_dataset()                                       # (+ mp_prefetch if workers)

and returns its iterator, which yields ONE example dict per ``next()`` — the trainer pulls as many
as a step needs (prompts per step may change with the group size). The iterator is checkpointable:
``it.get_state()`` / ``it.set_state(state)`` (a small JSON-able dict) and the Orbax handler
``grain.checkpoint.CheckpointHandler`` with ``CheckpointSave(it)`` / ``CheckpointRestore(it)``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from transformers import PreTrainedTokenizerBase

from sagc_jax.data.readers import DataError, read_examples
from sagc_jax.data.tasks import STEP_TASKS, get_task
from sagc_jax.data.tokenizer import encode_prompt, encode_reply, encode_text

__all__ = [
    "SftIds",
    "TokenizePrompt",
    "load_examples",
    "make_prompt_iterator",
    "make_sft_batches",
    "sft_example_ids",
    "task_options",
]


class TokenizePrompt(grain.transforms.Map):
    """grain Map: adds ``prompt_ids`` (int32 array) to an example, keeping every other key.

    Picklable (the tokenizer is a plain attribute), so it works with grain worker processes.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template: bool = False,
        max_prompt_len: int | None = None,
        truncate: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.max_prompt_len = max_prompt_len
        self.truncate = truncate

    def map(self, element: Mapping[str, Any]) -> dict[str, Any]:
        """Tokenise ``element['prompt']``."""
        out = dict(element)
        ids = encode_prompt(self.tokenizer, out["prompt"], self.chat_template)
        if self.max_prompt_len is not None and len(ids) > self.max_prompt_len:
            if not self.truncate:
                raise DataError(
                    f"prompt of {len(ids)} tokens exceeds max_prompt_len={self.max_prompt_len} "
                    f"(prompt starts {out['prompt'][:60]!r}); raise the limit or enable truncation"
                )
            # Keep the end (where the question is) and the leading bos, if any.
            bos = self.tokenizer.bos_token_id
            keep_bos = bos is not None and ids[0] == bos and self.max_prompt_len > 1
            tail = ids[len(ids) - (self.max_prompt_len - int(keep_bos)) :]
            ids = [bos, *tail] if keep_bos else tail
        out["prompt_ids"] = np.asarray(ids, dtype=np.int32)
        return out


def _as_map_dataset(examples_source: Any) -> grain.MapDataset:
    if isinstance(examples_source, grain.MapDataset):
        ds = examples_source
    elif hasattr(examples_source, "__len__") and hasattr(examples_source, "__getitem__"):
        ds = grain.MapDataset.source(examples_source)
    else:
        raise TypeError(
            "examples_source must be a grain.MapDataset or a random-access sequence of dicts, "
            f"got {type(examples_source).__name__}"
        )
    if len(ds) == 0:
        raise DataError("examples source is empty")
    return ds


def _mark_absl_flags_parsed() -> None:
    """grain worker processes read absl flags; mark them parsed if nobody has (no argv parsing)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_prompt_iterator(
    examples_source: Any,
    *,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    chat_template: bool = False,
    worker_count: int = 0,
    max_prompt_len: int | None = None,
    truncate_prompts: bool = False,
    read_threads: int = 2,
    prefetch_buffer_size: int = 64,
) -> grain.DatasetIterator:
    """Checkpointable iterator over tokenised prompts, one example dict per ``next()``.

    Args:
      examples_source: list/sequence of example dicts (``prompt``, ``answer``, extra columns), a
        lazy source such as :class:`~sagc_jax.data.tasks.ArithSource`, or a ``grain.MapDataset``.
      tokenizer: used by :func:`~sagc_jax.data.tokenizer.encode_prompt`.
      seed: shuffle seed (each epoch is reshuffled with a seed derived from it).
      shuffle: shuffle (else file order).
      num_epochs: passes over this process's shard; ``None`` repeats forever.
      process_index, process_count: this process's shard is ``[process_index::process_count]``
        (disjoint across processes, covering the source).
      chat_template: render each prompt as a user message with the tokenizer's chat template.
      worker_count: > 0 runs the map in that many grain worker processes (absl flags are marked
        parsed first, as grain requires).
      max_prompt_len: if set, a longer prompt raises :class:`DataError` (or is left-truncated with
        ``truncate_prompts``).
      read_threads, prefetch_buffer_size: grain ``ReadOptions`` for the in-process prefetch.

    Yields (per ``next()``):
      the example dict plus ``prompt_ids`` (``np.ndarray`` int32, bos first when the tokenizer has
      one). ``StopIteration`` after ``num_epochs`` passes.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"need 0 <= process_index < process_count, got {process_index}, {process_count}"
        )
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs}")
    ds = _as_map_dataset(examples_source)
    if len(ds) < process_count:
        raise DataError(f"dataset has {len(ds)} examples, fewer than process_count={process_count}")
    ds = ds[process_index::process_count]
    if shuffle:
        ds = ds.shuffle(seed=int(seed))
    ds = ds.repeat(num_epochs)  # reseeds the shuffle every epoch
    ds = ds.map(TokenizePrompt(tokenizer, chat_template, max_prompt_len, truncate_prompts))
    it_ds = ds.to_iter_dataset(
        grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch_buffer_size)
    )
    if worker_count > 0:
        _mark_absl_flags_parsed()
        it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return iter(it_ds)


@dataclasses.dataclass(frozen=True)
class SftIds:
    """One SFT example as ids: ``prompt`` (never trained), ``completion`` (the solution + eos) and
    ``trained`` (per completion token: False on an environment reply of a tool trace)."""

    prompt: list[int]
    completion: list[int]
    trained: list[bool]


def sft_example_ids(
    tokenizer: PreTrainedTokenizerBase,
    example: Mapping[str, Any],
    *,
    chat_template: bool = False,
    solution_key: str = "solution",
) -> SftIds:
    """An SFT example's ids: completion = solution tokens + eos.

    A solution is text, or a **tool trace**: a list of texts, the model's turns and an
    environment's replies alternating (``["<calc>23+48</calc>", "=71\n", "<answer>71</answer>"]``).
    A reply is encoded as a rollout feeds it (``encode_reply``: with ``chat_template``, the
    template's user turn after a turn cut by a stop string) and is not trained, as in GRPO.
    """
    if solution_key not in example:
        raise DataError(f"SFT needs a {solution_key!r} column; example keys: {sorted(example)}")
    prompt_ids = encode_prompt(tokenizer, example["prompt"], chat_template)
    solution = example[solution_key]
    parts = list(solution) if isinstance(solution, list | tuple) else [str(solution)]
    completion: list[int] = []
    trained: list[bool] = []
    for i, text in enumerate(parts):
        reply = i % 2 == 1
        ids = (encode_reply(tokenizer, str(text), chat_template, after_eos=False) if reply
               else encode_text(tokenizer, str(text)))
        completion += ids
        trained += [not reply] * len(ids)
    if tokenizer.eos_token_id is not None:
        completion.append(int(tokenizer.eos_token_id))
        trained.append(True)
    return SftIds(prompt_ids, completion, trained)


def make_sft_batches(
    examples: Sequence[Mapping[str, Any]],
    *,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    seed: int = 0,
    num_epochs: int | None = 1,
    chat_template: bool = False,
    seq_len: int | None = None,
    pad_multiple: int = 16,
    drop_remainder: bool = True,
    solution_key: str = "solution",
) -> Iterator[dict[str, np.ndarray]]:
    """Deterministic SFT warm-start batches of ``prompt_ids + solution_ids + eos``.

    Each epoch visits the examples in the order ``np.random.default_rng([seed, epoch])``
    permutes them. Sequences are right-padded with the pad id.

    Args:
      examples: sequence of dicts with ``prompt`` and ``solution`` (e.g. a task's train source).
      batch_size: rows per batch (every batch has exactly this many rows).
      seed: order seed.
      num_epochs: passes; ``None`` = forever.
      chat_template: as in :func:`make_prompt_iterator`.
      seq_len: fixed ``T`` (a longer example raises :class:`DataError`); ``None`` = the batch's
        longest sequence rounded up to ``pad_multiple``.
      drop_remainder: drop the last partial batch of an epoch; otherwise fill it with all-pad
        rows whose masks are 0.

    Yields:
      ``{"tokens": int32 [B, T], "loss_mask": int32 [B, T] (1 on solution + eos tokens, 0 on a
      tool trace's environment replies),
      "input_mask": int32 [B, T] (1 on every real token)}``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(examples)
    if n == 0:
        raise DataError("SFT examples are empty")
    if drop_remainder and n < batch_size:
        raise DataError(f"only {n} SFT examples, fewer than batch_size={batch_size}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
        order = np.random.default_rng([int(seed) & 0xFFFFFFFF, epoch]).permutation(n)
        stop = n - n % batch_size if drop_remainder else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            rows = []
            for i in idx:
                ex = sft_example_ids(
                    tokenizer,
                    examples[int(i)],
                    chat_template=chat_template,
                    solution_key=solution_key,
                )
                n_tok = len(ex.prompt) + len(ex.completion)
                if seq_len is not None and n_tok > seq_len:
                    raise DataError(
                        f"SFT example {int(i)} has {n_tok} tokens > seq_len={seq_len}"
                    )
                rows.append(ex)
            longest = max(len(ex.prompt) + len(ex.completion) for ex in rows)
            t = seq_len if seq_len is not None else -(-longest // pad_multiple) * pad_multiple
            tokens = np.full((batch_size, t), pad, dtype=np.int32)
            loss_mask = np.zeros((batch_size, t), dtype=np.int32)
            input_mask = np.zeros((batch_size, t), dtype=np.int32)
            for r, ex in enumerate(rows):
                p, c = len(ex.prompt), len(ex.completion)
                tokens[r, : p + c] = ex.prompt + ex.completion
                loss_mask[r, p : p + c] = ex.trained
                input_mask[r, : p + c] = 1
            yield {"tokens": tokens, "loss_mask": loss_mask, "input_mask": input_mask}
        epoch += 1


_MISSING = object()


def _cfg_get(cfg: Any, name: str, default: Any = None) -> Any:
    """`cfg.name` (or `cfg[name]` for a mapping); None counts as unset."""
    val = cfg.get(name, _MISSING) if isinstance(cfg, Mapping) else getattr(cfg, name, _MISSING)
    return default if val is _MISSING or val is None else val


def task_options(data_cfg_like: Any) -> dict[str, Any]:
    """Options for :func:`get_task` from a data config: ``task_options`` plus, for the
    arithmetic tasks (:data:`~sagc_jax.data.tasks.STEP_TASKS`), ``task_min_steps`` /
    ``task_max_steps`` / ``task_ramble_rate`` (an explicit ``task_options`` entry wins)."""
    options = dict(_cfg_get(data_cfg_like, "task_options", {}))
    if _cfg_get(data_cfg_like, "task") in STEP_TASKS:
        for key, cast in (("min_steps", int), ("max_steps", int), ("ramble_rate", float)):
            val = _cfg_get(data_cfg_like, f"task_{key}")
            if val is not None:
                options.setdefault(key, cast(val))
    return options


def load_examples(
    data_cfg_like: Any, split: str = "train", *, seed: int | None = None,
    required: Mapping[str, str] | None = None,
) -> Sequence[dict[str, Any]]:
    """The example source for a data config (dataclass, namespace or mapping).

    Recognised fields (``sagc_jax.config.DataConfig`` names first; ``None`` counts as unset):
      ``task`` (built-in task name) with ``task_min_steps`` / ``task_max_steps`` /
      ``task_ramble_rate`` and optional
      ``task_options`` (dict for :func:`get_task`), or ``train_file`` / ``eval_file``
      (``.jsonl`` or ``.parquet``) with ``prompt_column`` (default ``"prompt"``) and
      ``answer_column`` (default ``"answer"``), ``solution_column`` (default ``"solution"``,
      copied to ``solution``); ``num_eval`` / ``num_train`` (built-in task sizes;
      defaults 512 / 100k). A file takes precedence over a task for that split.
      A whole ``Config`` (with ``.data`` and ``.run.seed``) is accepted too.

    Args:
      seed: train-data seed for a built-in task (default: the config's ``seed``/``run.seed``, 0).
      required: columns every example must have, each with why
        (:func:`sagc_jax.data.columns.required_columns`): a file's every row is checked, a
        built-in task's first example (its columns are the same for all).

    Returns:
      A random-access sequence of example dicts (lazy for built-in train splits).

    Raises:
      DataError: nothing configured for the split, a file problem, or a required column missing
        (one line naming the file and row, or the task).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    cfg = data_cfg_like
    if not isinstance(cfg, Mapping) and hasattr(cfg, "data") and not hasattr(cfg, "task"):
        if seed is None and hasattr(getattr(cfg, "run", None), "seed"):
            seed = cfg.run.seed
        cfg = cfg.data
    path = _cfg_get(cfg, f"{split}_file")
    if path is not None:
        return read_examples(
            os.fspath(path),
            _cfg_get(cfg, "prompt_column", "prompt"),
            _cfg_get(cfg, "answer_column", "answer"),
            solution_column=_cfg_get(cfg, "solution_column", "solution"),
            required=required,
        )
    name = _cfg_get(cfg, "task")
    if name is None:
        raise DataError(f"no {split} data configured: set a built-in task or {split}_file")
    task = get_task(name, **task_options(cfg))
    if split == "train":
        seed = int(seed if seed is not None else _cfg_get(cfg, "seed", 0))
        examples = task.train_examples(seed, _cfg_get(cfg, "num_train"))
    else:
        examples = task.eval_examples(_cfg_get(cfg, "num_eval"))
    # A task's examples share their columns; the task's own name stands for the file's.
    required = {"solution" if c == _cfg_get(cfg, "solution_column", "solution") else c: why
                for c, why in (required or {}).items()}
    for col, why in required.items():
        if len(examples) and examples[0].get(col) is None:
            raise DataError(f"data.task {name} ({split} split): column {col!r} is missing, and "
                            f"{why} (columns: {sorted(examples[0])})")
    return examples
