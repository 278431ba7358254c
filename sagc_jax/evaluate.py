"""Offline evaluation of a trained policy (or any HF Llama / Qwen2 model).

`load_policy` turns a path into `(model, tokenizer, config)`:

- a run directory (`config.yaml` + `checkpoints/`): its newest checkpoint step (or, before the
  first step was saved, `checkpoints/initial`, the params right after the SFT warm start);
- a run's `checkpoints/` directory: its newest step;
- one step directory `.../checkpoints/<step>` (or `.../checkpoints/initial`);
- a Hugging Face model directory (`config.json` + safetensors), e.g. a base model or the output
  of `sagc-jax export` (which also carries the run config as `sagc_jax_config.yaml`).

Only the `params` item of a checkpoint is read (no optimizer state), restored by Orbax into the
abstract param tree of the model described by the run's `config.yaml`.

`evaluate` drives the prompts through one `Sampler` whose declared group sizes are {1, k}:
G=1 greedy for accuracy and G=k sampled for pass@k (unbiased estimator of Chen et al. 2021).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from sagc_jax.config import Config, load_saved_config
from sagc_jax.data.tokenizer import (
    decode_completion,
    encode_prompt,
    load_run_tokenizer,
    load_tokenizer,
    stop_ids,
)
from sagc_jax.models import Transformer, from_pretrained
from sagc_jax.models.lora import A_SUFFIX, B_SUFFIX
from sagc_jax.models.sharding import state_shardings
from sagc_jax.rl.rewards import RewardFn, score_groups
from sagc_jax.sampling import Sampler, SamplingConfig

__all__ = [
    "CONFIG_IN_HF_DIR",
    "CheckpointPathError",
    "PolicySource",
    "evaluate",
    "format_table",
    "greedy_accuracy",
    "load_eval_examples",
    "load_policy",
    "pass_at_k",
    "resolve_checkpoint",
]

#: The run config an exported HF directory carries (eval defaults: data, rewards, sampling).
CONFIG_IN_HF_DIR = "sagc_jax_config.yaml"
_RUN_CONFIG = "config.yaml"
_CKPT_DIR = "checkpoints"
_INITIAL = "initial"
_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class CheckpointPathError(ValueError):
    """A path is not a run, checkpoint or HF model directory (the message names the path)."""


@dataclasses.dataclass(frozen=True)
class PolicySource:
    """What a checkpoint path resolved to.

    kind: "orbax" (a CheckpointManager step), "initial" (`checkpoints/initial`) or "hf".
    path: the HF directory, the step directory or the `initial` directory.
    run_dir: the run directory holding `config.yaml` (None for an HF directory).
    step: the step number for "orbax", else None.
    """

    kind: str
    path: Path
    run_dir: Path | None = None
    step: int | None = None


# ----------------------------------------------------------------------------- resolution


def _is_hf_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any((p / w).is_file() for w in _HF_WEIGHTS)


def _steps(ckpt_dir: Path) -> list[int]:
    """Finished CheckpointManager steps (Orbax writes `<step>.orbax-checkpoint-tmp-*` first and
    renames on commit, so a plain integer name is a committed step)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(d.name) for d in ckpt_dir.iterdir() if d.is_dir() and d.name.isdigit())


def _from_checkpoints_dir(ckpt_dir: Path, run_dir: Path) -> PolicySource:
    steps = _steps(ckpt_dir)
    if steps:
        return PolicySource("orbax", ckpt_dir / str(steps[-1]), run_dir, steps[-1])
    if (ckpt_dir / _INITIAL).is_dir():
        return PolicySource("initial", ckpt_dir / _INITIAL, run_dir)
    raise CheckpointPathError(f"{ckpt_dir} holds no checkpoint steps (and no '{_INITIAL}')")


def _need_config(run_dir: Path, what: Path) -> Path:
    if not (run_dir / _RUN_CONFIG).is_file():
        raise CheckpointPathError(f"{what} looks like a checkpoint but {run_dir / _RUN_CONFIG} "
                                  "(the run config that describes the model) is missing")
    return run_dir


def resolve_checkpoint(checkpoint: str | os.PathLike[str]) -> PolicySource:
    """Classifies `checkpoint` (see the module docstring); `CheckpointPathError` if it is none
    of the accepted kinds or does not exist."""
    p = Path(checkpoint).expanduser().absolute()
    if not p.exists():
        raise CheckpointPathError(f"checkpoint path {p} does not exist")
    if not p.is_dir():
        raise CheckpointPathError(f"checkpoint path {p} is not a directory")
    if _is_hf_dir(p):
        return PolicySource("hf", p)
    if (p / _RUN_CONFIG).is_file() and (p / _CKPT_DIR).is_dir():  # (a) a run directory
        return _from_checkpoints_dir(p / _CKPT_DIR, p)
    if p.name.isdigit() and (p / "params").is_dir():  # (c) one step directory
        return PolicySource("orbax", p, _need_config(p.parent.parent, p), int(p.name))
    if p.name == _INITIAL and (p.parent / "model.json").is_file():
        return PolicySource("initial", p, _need_config(p.parent.parent, p))
    if _steps(p) or (p / "model.json").is_file():  # (b) a run's checkpoints/ directory
        return _from_checkpoints_dir(p, _need_config(p.parent, p))
    raise CheckpointPathError(
        f"{p} is not a run directory (config.yaml + checkpoints/), a checkpoints/ or step "
        "directory, nor a Hugging Face model directory (config.json + model.safetensors)")


# ----------------------------------------------------------------------------- loading


def _abstract_run_model(cfg: Config, tokenizer: Any) -> Transformer:
    """The model `build_model` builds for `cfg`, as shapes only (nothing allocated)."""
    from sagc_jax.models.build import model_config  # the trainer's recipe: they can't drift

    try:
        mcfg = model_config(cfg, len(tokenizer), tokenizer)
    except OSError as e:
        raise CheckpointPathError(
            f"the run was initialised from {cfg.model.path}, whose config.json (needed to know "
            f"the architecture) cannot be read: {e.strerror}") from None
    return nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(cfg.run.seed)))


def _restore_params(src: PolicySource, abstract_model: Transformer,
                    mesh: Mesh | None) -> Transformer:
    """Restores only the params item of the checkpoint into `abstract_model`'s tree, verified
    against the fingerprints saved with it. A LoRA run's step holds only the adapters: the base
    comes from the run's `checkpoints/initial`."""
    from sagc_jax import checkpoint as ckpt

    graphdef, state = nnx.split(abstract_model)
    pure = nnx.to_pure_dict(state)
    if mesh is not None:
        shardings = state_shardings(pure, mesh)
    else:
        one = SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: one, pure)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          pure, shardings)
    adapters = {k: v for k, v in target["layers"].items() if k.endswith((A_SUFFIX, B_SUFFIX))}
    if src.kind == "initial":
        params = ckpt.restore_pure_params(src.path, target)
    elif adapters:  # a LoRA run's steps hold the adapters; the frozen base is `initial`
        params = ckpt.restore_pure_params(src.path.parent / _INITIAL, target)
        got = ckpt.restore_pure_params(src.path.parent, {"layers": adapters}, step=src.step)
        params["layers"].update(got["layers"])
    else:
        params = ckpt.restore_pure_params(src.path.parent, target, step=src.step)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def _fallbacks(src: PolicySource, named: Path) -> list[PolicySource]:
    """What to try, in order: `src`, then, when `named` is a run or checkpoints dir (not one
    step), the older steps and `initial` (as training falls back past a damaged step)."""
    if src.kind != "orbax" or named == src.path:
        return [src]
    ckpt_dir = src.path.parent
    older = [PolicySource("orbax", ckpt_dir / str(s), src.run_dir, s)
             for s in reversed(_steps(ckpt_dir)) if s < (src.step or 0)]
    initial = ([PolicySource("initial", ckpt_dir / _INITIAL, src.run_dir)]
               if (ckpt_dir / _INITIAL).is_dir() else [])
    return [src, *older, *initial]


def _restore_with_fallback(src: PolicySource, named: Path, abstract_model: Transformer,
                           mesh: Mesh | None) -> Transformer:
    """`_restore_params` of the newest restorable candidate (`_fallbacks`). Read-only: damaged
    steps are reported, not moved (training moves them aside, under the run lock)."""
    from sagc_jax import checkpoint as ckpt

    candidates = _fallbacks(src, named)
    first = ""
    for cand in candidates:
        try:
            return _restore_params(cand, abstract_model, mesh)
        except ckpt.CheckpointMismatchError:
            raise
        except Exception as e:
            first = first or f"{cand.path}: {ckpt.error_line(e)}"
            if cand is not candidates[-1]:
                ckpt.warn(f"checkpoint {cand.path} is unreadable or corrupt "
                          f"({ckpt.error_line(e)}); falling back to the previous one")
    if len(candidates) == 1:
        raise ckpt.CheckpointCorruptError(f"checkpoint {first}") from None
    raise ckpt.CheckpointCorruptError(f"no checkpoint in {src.path.parent} could be restored "
                                      f"(newest: {first})") from None


def _hf_tokenizer(path: Path, cfg: Config | None) -> Any:
    """The HF directory's own tokenizer if it has one, else the run's / the packaged one."""
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        return load_tokenizer(path)
    return load_tokenizer(cfg.model.tokenizer if cfg is not None else None)


def load_policy(
    checkpoint: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    mesh: Mesh | None = None,
) -> tuple[Transformer, Any, Config | None]:
    """Loads a policy for evaluation or export.

    Args:
      checkpoint: a run directory, its `checkpoints/` directory, a step directory or an HF model
        directory (see the module docstring).
      tokenizer: overrides the tokenizer (default: the run's `model.tokenizer`, or the HF
        directory's own, or the packaged char-level one).
      mesh: place params with `state_shardings` on this mesh; default: the first local device.

    Returns:
      `(model, tokenizer, cfg)`; `cfg` is the run's resolved Config, or None for an HF directory
      that carries none.

    Raises:
      CheckpointPathError: the path is missing or not one of the accepted kinds (names it).
      CheckpointMismatchError: the checkpoint was written for a different model than the
        run's config.yaml describes.
    """
    src = resolve_checkpoint(checkpoint)
    if src.kind == "hf":
        cfg_path = src.path / CONFIG_IN_HF_DIR
        cfg = load_saved_config(cfg_path) if cfg_path.is_file() else None
        model, mcfg = from_pretrained(src.path, mesh=mesh)
        tok = tokenizer if tokenizer is not None else _hf_tokenizer(src.path, cfg)
    else:
        from sagc_jax.checkpoint import RunCheckpointer

        assert src.run_dir is not None
        cfg = load_saved_config(src.run_dir / _RUN_CONFIG)
        tok = (tokenizer if tokenizer is not None
               else load_run_tokenizer(cfg.model.tokenizer, cfg.model.path))
        abstract = _abstract_run_model(cfg, tok)
        mcfg = abstract.cfg
        # model.json (written beside the steps) names any mismatch with config.yaml clearly,
        # before Orbax fails on a shape.
        RunCheckpointer(src.path.parent, every=0, keep=1).check_model(mcfg)
        model = _restore_with_fallback(src, Path(checkpoint).expanduser().absolute(), abstract,
                                       mesh)
    if mcfg.vocab_size < len(tok):
        raise ValueError(f"model vocab_size {mcfg.vocab_size} is smaller than the tokenizer's "
                         f"{len(tok)} tokens (wrong tokenizer for {src.path}?)")
    return model, tok, cfg


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
