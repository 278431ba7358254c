"""Offline evaluation of a trained policy (or any HF Llama / Qwen2 model).

The policy comes from `open_run.load_policy` (a run, one of its checkpoints or an HF directory).
`evaluate` drives the prompts through one `Sampler` whose declared group sizes are {1, k}:
G=1 greedy for accuracy and G=k sampled for pass@k (unbiased estimator of Chen et al. 2021).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from sagc_jax.config import Config
from sagc_jax.data.tokenizer import decode_completion, encode_prompt, stop_ids
from sagc_jax.models import Transformer
from sagc_jax.rewards import RewardFn, score_groups
from sagc_jax.sampling import Sampler, SamplingConfig

__all__ = [
    "evaluate",
    "format_table",
    "greedy_accuracy",
    "load_eval_examples",
    "pass_at_k",
]


def load_eval_examples(
    data: str | None,
    cfg: Config | None,
    *,
    limit: int | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Eval examples and the built-in task they come from (None for a file).

    `data` is a JSONL/Parquet path or a built-in task name (its held-out split); None means the
    run config's eval split (`data.eval_file`, else the task's held-out split of
    `data.num_eval` problems). Raises `DataError` / `ValueError` naming what is wrong.
    """
    from sagc_jax.data.pipeline import load_examples, task_options
    from sagc_jax.data.readers import DataError, read_examples
    from sagc_jax.data.tasks import TASKS, get_task

    task: str | None = None
    if data is None:
        if cfg is None:
            raise DataError("no eval data: pass --data FILE_OR_TASK (the checkpoint carries no "
                            "run config to take the eval split from)")
        examples = load_examples(cfg, "eval")
        task = None if cfg.data.eval_file is not None else cfg.data.task
    elif os.path.isfile(data):
        col = cfg.data if cfg is not None else None
        examples = read_examples(data, col.prompt_column if col else "prompt",
                                 col.answer_column if col else "answer")
    elif data in TASKS:
        task = data
        if cfg is not None and cfg.data.task == data:  # same task options as the run
            examples = get_task(data, **task_options(cfg.data)).eval_examples(
                cfg.data.num_eval or None)
        else:
            examples = get_task(data).eval_examples()
    else:
        raise DataError(f"--data {data}: no such file and not a built-in task "
                        f"({', '.join(sorted(TASKS))})")
    examples = list(examples[:limit] if limit is not None else examples)
    if not examples:
        raise DataError(f"no eval examples in {data or 'the run config eval split'}")
    return examples, task


# ----------------------------------------------------------------------------- metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Chen et al. 2021 (HumanEval), in their numerically stable product form.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def evaluate(
    model: Transformer,
    tokenizer: Any,
    examples: Sequence[Mapping[str, Any]],
    *,
    reward_fns: Sequence[RewardFn],
    num_samples: int = 8,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    batch_prompts: int = 8,
    seed: int = 0,
    chat_template: bool = False,
    prompt_buckets: Sequence[int] | None = None,
    decode_chunk: int = 16,
    correct_threshold: float = 0.5,
    on_error: str = "raise",
    details: bool = False,
    progress: bool = False,
    mesh: Mesh | None = None,
) -> dict[str, Any]:
    """Greedy accuracy and sampled pass@k of `model` on `examples`.

    A completion is *correct* when the first reward function's (unweighted) value is
    >= `correct_threshold` — the first reward is the task's verifier (e.g. `exact_answer`, 1/0);
    the weighted total of all rewards is reported separately as `*_reward_mean`.

    Args:
      examples: dicts with `prompt` (and `prompt_ids`, else it is encoded here) plus the columns
        the reward functions need (e.g. `answer`).
      reward_fns: the first one decides correctness.
      num_samples: k sampled completions per prompt for pass@k (0: greedy only).
      max_new_tokens, temperature: generation limits; greedy ignores the temperature.
      batch_prompts: prompts per sampler call (G=k calls decode batch_prompts * k rows).
      seed: sampling key seed (batch b uses fold_in(key(seed), b)).
      chat_template: render prompts with the tokenizer's chat template.
      prompt_buckets: sampler prompt buckets; default one bucket fitting the longest prompt
        (one compile per group size).
      details: also return `per_prompt` records (prompt, answer, greedy completion, correctness,
        number of correct samples).
      mesh: optional mesh for the sampler (rows sharded over data x fsdp).

    Returns:
      A flat dict: `num_prompts`, `num_samples`, `accuracy` (greedy), `greedy_reward_mean`,
      `len_mean` / `len_max` / `truncated_frac` (greedy completions), and with num_samples > 0
      `pass@1`, `pass@{k}`, `sample_reward_mean`, `sample_len_mean` / `sample_len_max` /
      `sample_truncated_frac`; plus `reward_errors`, the settings and `eval_s`.
    """
    if not reward_fns:
        raise ValueError("evaluate needs at least one reward function")
    if not examples:
        raise ValueError("no examples to evaluate")
    k = int(num_samples)
    if k < 0 or batch_prompts < 1 or max_new_tokens < 1 or not temperature > 0:
        raise ValueError(f"need num_samples >= 0, batch_prompts >= 1, max_new_tokens >= 1 and "
                         f"temperature > 0; got {k}, {batch_prompts}, {max_new_tokens}, "
                         f"{temperature}")
    t_start = time.perf_counter()
    exs = [dict(ex) for ex in examples]
    prompt_ids = [np.asarray(ex["prompt_ids"], np.int32) if "prompt_ids" in ex
                  else np.asarray(encode_prompt(tokenizer, ex["prompt"], chat_template), np.int32)
                  for ex in exs]
    if prompt_buckets is None:
        prompt_buckets = (_round_up(max(len(p) for p in prompt_ids), 16),)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sampler = Sampler(model, SamplingConfig(
        group_sizes=tuple(sorted({1, k} - {0})), prompts_per_step=int(batch_prompts),
        prompt_buckets=tuple(int(b) for b in prompt_buckets), max_new_tokens=int(max_new_tokens),
        decode_chunk=int(decode_chunk)), pad_id=int(pad_id), eos_ids=stop_ids(tokenizer),
        mesh=mesh)
    tally = _Tally(len(exs), k)
    batches = [list(range(s, min(s + batch_prompts, len(exs))))
               for s in range(0, len(exs), batch_prompts)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="evaluating")
    base_key = jax.random.key(seed)
    for b, idx in enumerate(batches):
        key = jax.random.fold_in(base_key, b)
        # G=1 greedy for accuracy, then G=k sampled for pass@k (k == 1 also samples at G=1).
        for g, is_greedy in [(1, True)] + ([(k, False)] if k > 0 else []):
            out = sampler.generate([prompt_ids[i] for i in idx], group_size=g, key=key,
                                   greedy=is_greedy, temperature=temperature,
                                   max_new_tokens=max_new_tokens)
            texts = [decode_completion(tokenizer, row[:ln])
                     for row, ln in zip(out.tokens, out.lengths)]
            res = score_groups(reward_fns, [exs[i] for i in idx], g, texts, on_error=on_error)
            tally.add(idx, g, is_greedy, out, texts, res, reward_fns[0].name, correct_threshold)
    result = tally.summary()
    result.update({"reward_errors": tally.errors, "correct_reward": reward_fns[0].name,
                   "max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
                   "seed": int(seed), "eval_s": time.perf_counter() - t_start})
    if details:
        result["per_prompt"] = tally.per_prompt(exs)
    return result


class _Tally:
    """Per-prompt outcomes of `evaluate`: greedy (G=1) and k samples per prompt."""

    def __init__(self, n: int, k: int):
        self.k = k
        kk = max(k, 1)
        self.greedy = {"correct": np.zeros(n, bool), "reward": np.zeros(n),
                       "len": np.zeros(n, int), "trunc": np.zeros(n, bool)}
        self.greedy_text = [""] * n
        self.sample = {"correct": np.zeros((n, kk), bool), "reward": np.zeros((n, kk)),
                       "len": np.zeros((n, kk), int), "trunc": np.zeros((n, kk), bool)}
        self.errors = 0

    def add(self, idx: list[int], g: int, is_greedy: bool, out: Any, texts: list[str], res: Any,
            first: str, threshold: float) -> None:
        self.errors += res.num_errors
        ok = res.per_fn[first] >= threshold
        sl = np.asarray(idx)
        if is_greedy:
            gr = self.greedy
            gr["correct"][sl], gr["reward"][sl] = ok, res.total
            gr["len"][sl], gr["trunc"][sl] = out.lengths, out.truncated
            for i, t in zip(idx, texts):
                self.greedy_text[i] = t
        else:
            for key, v in (("correct", ok), ("reward", res.total), ("len", out.lengths),
                           ("trunc", out.truncated)):
                self.sample[key][sl] = np.asarray(v).reshape(-1, g)

    def summary(self) -> dict[str, Any]:
        gr, sm, k = self.greedy, self.sample, self.k
        result: dict[str, Any] = {
            "num_prompts": len(gr["correct"]), "num_samples": k,
            "accuracy": float(gr["correct"].mean()),
            "greedy_reward_mean": float(gr["reward"].mean()),
            "len_mean": float(gr["len"].mean()), "len_max": int(gr["len"].max()),
            "truncated_frac": float(gr["trunc"].mean()),
        }
        if k > 0:
            num_correct = sm["correct"].sum(axis=1)
            result["pass@1"] = float(np.mean([pass_at_k(k, int(c), 1) for c in num_correct]))
            result[f"pass@{k}"] = float(np.mean([pass_at_k(k, int(c), k) for c in num_correct]))
            result.update({
                "sample_reward_mean": float(sm["reward"].mean()),
                "sample_len_mean": float(sm["len"].mean()),
                "sample_len_max": int(sm["len"].max()),
                "sample_truncated_frac": float(sm["trunc"].mean()),
            })
        return result

    def per_prompt(self, exs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prompt": ex["prompt"], "answer": ex.get("answer"),
                 "greedy": self.greedy_text[i],
                 "greedy_correct": bool(self.greedy["correct"][i]),
                 **({"num_correct": int(self.sample["correct"][i].sum())} if self.k > 0 else {})}
                for i, ex in enumerate(exs)]


def greedy_accuracy(sampler: Sampler, tokenizer: Any, examples: Sequence[Mapping[str, Any]],
                    reward_fns: Sequence[RewardFn], *, params: Any, key: jax.Array,
                    chat_template: bool = False, on_error: str = "raise", batch: int = 64,
                    correct_threshold: float = 0.5) -> float:
    """Fraction of `examples` whose greedy completion scores >= `correct_threshold` on the first
    reward function; `sampler` must declare G = 1 with `batch` prompts per call."""
    correct, total = 0, 0
    first = reward_fns[0].name
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        ids = [encode_prompt(tokenizer, e["prompt"], chat_template) for e in chunk]
        out = sampler.generate(ids, group_size=1, key=key, greedy=True, params=params)
        texts = [decode_completion(tokenizer, r[:n]) for r, n in zip(out.tokens, out.lengths)]
        res = score_groups(reward_fns, chunk, 1, texts, on_error=on_error)
        correct += int((res.per_fn[first] >= correct_threshold).sum())
        total += len(chunk)
    return correct / max(total, 1)


def format_table(result: Mapping[str, Any]) -> str:
    """Two-column text table of the scalar metrics (per-prompt records are left out)."""
    rows = []
    for key, v in result.items():
        if isinstance(v, (list, dict)):
            continue
        if isinstance(v, float):
            v = f"{v:.4f}" if math.isfinite(v) else str(v)
        rows.append((key, str(v)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
