"""One comparison run: train it (or resume, or skip when finished) and evaluate its final
checkpoint. The SFT warm start is shared between the runs of a warm-start seed through
`init.params`."""

from __future__ import annotations

import gc
import json
import logging
import shutil
from pathlib import Path
from typing import Any

logger = logging.getLogger("sagc_jax.experiments")

TIMING_FILE = "compare_timing.json"
EVAL_FILE = "eval.json"
SFT_FINGERPRINT = "fingerprint.json"


def sft_fingerprint(cfg: Any) -> dict[str, Any]:
    """The config parts the SFT warm start depends on (warm-start seed, model, data, init,
    sampling); `init.params` is left out (it is how a shared warm start is handed on)."""
    from sagc_jax.config import config_to_dict

    d = config_to_dict(cfg)
    init = {k: v for k, v in d["init"].items() if k != "params"}
    return {"seed": cfg.warm_start_seed, "init": init,
            **{k: d[k] for k in ("model", "data", "sampling")}}


def _with_init_params(cfg: Any, path: Path) -> Any:
    from sagc_jax.config import config_from_dict, config_to_dict

    d = config_to_dict(cfg)
    d["init"]["params"] = str(path)
    return config_from_dict(d)


def _shared_sft(cfg: Any, cache: Path | None) -> Path | None:
    """The cached post-SFT params of this seed when their fingerprint matches `cfg`."""
    if cache is None or cfg.init.sft_steps == 0 or cfg.init.params:
        return None
    meta = cache / SFT_FINGERPRINT
    if (cache / "initial").is_dir() and meta.is_file() and json.loads(
            meta.read_text()) == json.loads(json.dumps(sft_fingerprint(cfg))):
        return cache / "initial"
    return None


def _store_sft(cfg: Any, run_dir: Path, cache: Path) -> None:
    """Keeps a fresh run's post-SFT params (its `checkpoints/initial`) for the seed's others."""
    src = run_dir / "checkpoints" / "initial"
    if not src.is_dir():
        return
    meta = cache / SFT_FINGERPRINT
    meta.unlink(missing_ok=True)
    shutil.rmtree(cache / "initial", ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, cache / "initial")
    meta.write_text(json.dumps(sft_fingerprint(cfg), indent=1))


def final_done(run_dir: Path, steps: int) -> bool:
    return (run_dir / "checkpoints" / str(steps)).is_dir()


def train_run(cfg: Any, sft_cache: Path | None) -> dict[str, Any]:
    """Trains (or resumes, or skips when finished) one run in this process; returns its
    timing record `{sft_s, sft_shared, compile_s}` (also in `<run>/compare_timing.json`)."""
    import jax

    from sagc_jax.train import train

    run_dir = Path(cfg.run.dir)
    timing_path = run_dir / TIMING_FILE
    if final_done(run_dir, cfg.run.steps):
        logger.info("compare: %s: final checkpoint exists, skipped", run_dir.name)
        return json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    logger.info("compare: %s: training %d steps", run_dir.name, cfg.run.steps)
    shared = _shared_sft(cfg, sft_cache)
    if shared is not None:
        logger.info("compare: SFT warm start restored from %s", shared.parent)
        cfg = _with_init_params(cfg, shared)
    phases: dict[str, float] = {}
    train(cfg, timing=phases)
    if sft_cache is not None and shared is None and "sft_s" in phases and cfg.init.sft_steps:
        _store_sft(cfg, run_dir, sft_cache)
    timing = {"sft_s": phases.get("sft_s", 0.0), "sft_shared": shared is not None,
              "compile_s": phases.get("compile_s")}
    gc.collect()
    jax.clear_caches()  # compiled executables of this run are not reused by the next
    timing_path.write_text(json.dumps(timing, indent=1) + "\n")
    return timing


def eval_run(run_dir: Path, *, num_samples: int, limit: int | None,
             batch_prompts: int, at_step: int | None = None) -> dict[str, Any]:
    """Greedy accuracy (and pass@k with num_samples > 0) of a run's newest checkpoint — or,
    with `at_step`, its newest checkpoint at or before that step (a wall-clock budget's cut;
    0 = `checkpoints/initial`) — on the run config's held-out split; every result is kept in
    `<run>/eval.json`, keyed by checkpoint step, samples and limit (an accuracy curve reads
    several)."""
    from sagc_jax.evaluate import evaluate, load_eval_examples
    from sagc_jax.experiments.budget import checkpoint_at_or_before
    from sagc_jax.open_run import load_policy, resolve_checkpoint
    from sagc_jax.rewards import build_reward_fns

    ckpt: Path = run_dir
    if at_step == 0:
        ckpt = run_dir / "checkpoints" / "initial"
    elif at_step is not None:
        found = checkpoint_at_or_before(run_dir, at_step)
        if found is None:
            raise FileNotFoundError(f"{run_dir}: no checkpoint at or before step {at_step}")
        ckpt = found
    src = resolve_checkpoint(ckpt)
    path = run_dir / EVAL_FILE
    step = src.step or 0
    key = {"step": step, "num_samples": num_samples, "limit": limit}
    cache = _read_cache(path)
    name = f"{step}/{num_samples}/{limit}"
    if name in cache:
        return cache[name]
    if step == 0 and num_samples == 0:
        shared = _sibling_initial_eval(run_dir, name)
        if shared is not None:  # the same initial params and eval settings: the same result
            cache[name] = shared
            path.write_text(json.dumps(cache, indent=1) + "\n")
            return shared
    model, tok, cfg = load_policy(ckpt)
    assert cfg is not None
    examples, _ = load_eval_examples(None, cfg, limit=limit)
    s = cfg.sampling
    res = evaluate(model, tok, examples, reward_fns=build_reward_fns(cfg.rewards,
                                                               cfg.reward_timeout_s),
                   num_samples=num_samples, max_new_tokens=s.max_new_tokens,
                   temperature=s.temperature, batch_prompts=batch_prompts, seed=cfg.run.seed,
                   chat_template=cfg.data.chat_template, prompt_buckets=s.prompt_buckets,
                   decode_chunk=s.decode_chunk)
    out = {**key, **res}
    cache[name] = out
    path.write_text(json.dumps(cache, indent=1) + "\n")
    logger.info("compare: %s: held-out accuracy %.3f (%d problems, %.0fs)", run_dir.name,
                res["accuracy"], res["num_prompts"], res["eval_s"])
    return out


#: Config sections a greedy held-out eval depends on (besides the params).
_EVAL_SECTIONS = ("model", "data", "sampling", "rewards", "reward_timeout_s")


def _eval_fingerprint(run_dir: Path) -> tuple[Any, Any] | None:
    """(initial params' checksums, the eval's config sections) of a run, None if unreadable."""
    import yaml

    try:
        sums = json.loads((run_dir / "checkpoints" / "initial.checksums.json").read_text())
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        return sums["params"], {k: cfg.get(k) for k in _EVAL_SECTIONS}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None


def _sibling_initial_eval(run_dir: Path, name: str) -> dict[str, Any] | None:
    """The step-0 greedy eval of another run in the same folder that starts from identical
    params (checksums of `checkpoints/initial`) with identical eval settings: every policy of a
    comparison seed starts from the same weights, and that eval is the costliest (the
    untrained model's rows run long: ~7 min of a run's ~30 on the real model)."""
    mine = _eval_fingerprint(run_dir)
    if mine is None:
        return None
    for other in sorted(p for p in run_dir.parent.iterdir() if p.is_dir() and p != run_dir):
        res = _read_cache(other / EVAL_FILE).get(name)
        if res is not None and _eval_fingerprint(other) == mine:
            logger.info("compare: %s: step-0 eval shared with %s (identical initial params)",
                        run_dir.name, other.name)
            return {**res, "shared_from": other.name}
    return None


def _read_cache(path: Path) -> dict[str, Any]:
    """`eval.json` as {"step/num_samples/limit": result}; a file of the one-result format
    written before curves (a top-level "step") is read as that one entry."""
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    if "step" in old:
        return {f"{old['step']}/{old.get('num_samples')}/{old.get('limit')}": old}
    return old
