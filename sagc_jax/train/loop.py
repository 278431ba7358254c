"""The GRPO training loop, in one direction:

    g = policy.choose() -> rollout = collect(...) -> batch = make_batch(rollout)
      -> state, m = learner.update(state, batch) -> policy.observe(observation_from(rollout))
      -> writer.write(row)

The run's state (`train.state.RunState`) is passed through, `train_one(run, state, step) ->
(state, row)`; a checkpoint is a `RunState`.

`train(cfg)`: build -> restore-or-init (resume, or `init.params`, or the SFT warm start) ->
warm-up (every shape of the plan compiled before step 1, so `compiles` stays 0 while G moves)
-> guarded steps (a failing step checkpoints the state from before it) -> signals (Ctrl-C /
SIGTERM stop after the current step and save). SAGC sits beside the loop: it is asked for G and
told what the step observed, nothing more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from sagc_jax.config import Config
from sagc_jax.errors import TrainingError
from sagc_jax.evaluate import greedy_accuracy
from sagc_jax.rl.batch import make_batch
from sagc_jax.rollout import collect, global_view, rollout_key
from sagc_jax.rollout.episodes import collect_episodes, episode_accuracy
from sagc_jax.runlock import RunLock
from sagc_jax.sagc.observation import observation_from
from sagc_jax.sampling import compile_count
from sagc_jax.train.records import metrics_row, trace_row
from sagc_jax.train.setup import Run, build_run
from sagc_jax.train.sft import progress_bar
from sagc_jax.train.signals import StopFlag
from sagc_jax.train.start import no_stop, observed, restore_or_init, snapshot, warm_up
from sagc_jax.train.state import RunState

logger = logging.getLogger("sagc_jax.train")


def _log(run: Run, msg: str, *args: Any) -> None:
    if run.hosts.is_main:
        logger.info(msg, *args)


def eval_greedy(run: Run, params: Any) -> float:
    """Greedy held-out accuracy (first reward fn >= 0.5) with `params`."""
    assert run.eval is not None
    cfg, ev = run.cfg, run.eval
    kw = dict(params=params, key=rollout_key(cfg.run.seed, 0, 0),
              chat_template=cfg.data.chat_template, on_error=cfg.reward_on_error)
    if run.episodes is not None:
        return episode_accuracy(ev.sampler, run.episodes, run.tokenizer, ev.examples,
                                run.reward_fns, max_new_tokens=cfg.sampling.max_new_tokens, **kw)
    return greedy_accuracy(ev.sampler, run.tokenizer, ev.examples, run.reward_fns, **kw)


# ---------------------------------------------------------------------------- one step
class _Updated(Exception):
    """A step failed after its update, which donated the old state's arrays: `state` holds the
    live params and optimizer state (equal to the old ones when the loss was non-finite)."""

    def __init__(self, state: RunState):
        super().__init__("the step failed after its update")
        self.state = state


def train_one(run: Run, state: RunState, step: int) -> tuple[RunState, dict[str, Any]]:
    """One GRPO step (0-based `step` = `state.step`, the module docstring's loop) -> (new
    state, metrics row); a failure after the update is raised as `_Updated` (cause chained)."""
    cfg, hosts = run.cfg, run.hosts
    t_step = time.perf_counter()
    c0 = compile_count()
    g = run.policy.choose()
    if cfg.sagc.timing != "model":
        # Measured timings differ per host; process 0 decides (the states are kept equal by
        # agreeing on its seconds in `observation_from`, this is the belt to those braces).
        g = int(hosts.agree(np.int32(g))) if not hosts.single else g
    t0 = time.perf_counter()
    kw = dict(step=step, num_prompts=run.plan.prompts_per_g[g], params=state.params,
              tokenizer=run.tokenizer, settings=run.collect_settings)
    ro = (collect(run.sampler, run.prompts, g, run.reward_fns, hosts=hosts, **kw)
          if run.episodes is None else
          collect_episodes(run.sampler, run.prompts, g, run.reward_fns, episodes=run.episodes,
                           **kw))
    rollout_s = time.perf_counter() - t0
    gv, plen = global_view(ro, hosts)
    batch = make_batch(ro, run.learner.layout, hosts, pad_id=run.pad_id,
                       mask_truncated=cfg.algo.mask_truncated)
    t0 = time.perf_counter()
    new, m = run.learner.update(state, batch)
    train_s = time.perf_counter() - t0
    try:
        if m.get("finite", 1.0) < 1:
            raise TrainingError(
                f"non-finite loss or gradient at step {step + 1} (loss={m.get('loss')}, "
                f"grad_norm={m.get('grad_norm')}); params were not updated. Lower optim.lr or "
                "check the rewards")
        sagc_m = run.policy.observe(observation_from(
            ro, cfg.sagc, max_new_tokens=cfg.sampling.max_new_tokens,
            decode_chunk=cfg.sampling.decode_chunk, agree_seconds=hosts.seconds))
        new = observed(run, new)
        row = metrics_row(step, gv, m, sagc_m, run.sampler.prompt_bucket_for(plen),
                          run.learner.layout.completion_len, float(run.lr_schedule(step)))
        row.update(rollout_s=rollout_s, train_s=train_s)
        ev = cfg.run.eval_every
        if run.eval is not None and ((step + 1) % ev == 0 or step + 1 == cfg.run.steps):
            t0 = time.perf_counter()
            row["eval_accuracy"] = eval_greedy(run, new.params)
            row["eval_s"] = time.perf_counter() - t0
        row["compiles"] = compile_count() - c0
        row["step_s"] = time.perf_counter() - t_step
        # The host's 1-minute load average beside every measured second: a step timed on a
        # busy machine is read as such (the `measured` clock of `sagc-jax compare`).
        row["load_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
        run.writer.write(row, trace_row(step, gv, cfg.sampling.max_new_tokens))
    except Exception as e:
        raise _Updated(new) from e
    return new, row


def guarded_step(run: Run, state: RunState, step: int) -> tuple[RunState, dict[str, Any]]:
    """Runs one step; if it fails (a reward fn raises, bad data, non-finite loss) the state
    from before the step — params, optimizer, SAGC, data position — is checkpointed first,
    so a fixed run resumes exactly where this one stopped. After the update (which donated the
    old arrays) its params and optimizer state are saved instead: unchanged for a non-finite
    loss, the only failure there that is not a bug."""
    try:
        return train_one(run, state, step)
    except Exception as e:
        if isinstance(e, _Updated):
            state = dataclasses.replace(state, params=e.state.params,
                                        opt_state=e.state.opt_state)
            e = e.__cause__ if isinstance(e.__cause__, Exception) else e
        _check_run_dir(run)
        run.prompts.set_state(state.data)
        run.policy.load_state(state.sagc)
        run.ckpt.save(step, snapshot(run, state), force=True)
        run.ckpt.wait()
        where = f"state before step {step + 1} saved in {run.ckpt.directory}"
        if isinstance(e, TrainingError):
            raise TrainingError(f"{e} ({where})") from e
        raise TrainingError(f"step {step + 1} failed: {type(e).__name__}: {e} ({where})") from e


def _check_run_dir(run: Run) -> None:
    """Before a checkpoint is written: a run dir removed under the run would be recreated by the
    save with checkpoints but none of the metrics rows before them (steps lost on resume)."""
    if run.hosts.is_main and not (run.run_dir / "config.yaml").is_file():
        raise TrainingError(f"run.dir {run.run_dir}: removed while the run was writing it "
                            "(config.yaml is gone); nothing more is saved. Rerun the same "
                            "command to start again")


# ---------------------------------------------------------------------------- the loop
def _initial_eval(run: Run, params: Any) -> None:
    acc = eval_greedy(run, params)
    _log(run, "held-out greedy accuracy before GRPO: %.3f (%d problems)", acc,
         len(run.eval.examples))
    if run.hosts.is_main:
        (run.run_dir / "eval_initial.json").write_text(
            json.dumps({"step": 0, "eval_accuracy": acc}) + "\n")


def _report(run: Run, bar: Any, step: int, row: dict[str, Any]) -> None:
    if hasattr(bar, "set_postfix"):
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", G=row["group_size"],
                        strag=f"{row['straggler_rate']:.2f}", s_step=f"{row['step_s']:.2f}")
    elif (step + 1) % run.cfg.run.log_every == 0:
        _log(run, "step %d: reward %.3f G=%d strag %.2f %.2fs", step + 1, row["reward_mean"],
             row["group_size"], row["straggler_rate"], row["step_s"])


def _close_writer(run: Run) -> None:
    run.writer.close()
    if run.cfg.run.plots and run.writer.enabled:  # the run's plots, by the writing process
        from sagc_jax.plots import plot_run  # matplotlib only when plotting

        plot_run(run.writer.metrics_path, run.writer.dir / "plots")


def _close(run: Run, *, quietly: bool) -> None:
    """Finishes pending checkpoint writes and the metrics writer; when the run is already
    failing (`quietly`), their own errors (often the same full disk) are not raised again.
    Both are always tried: a writer left open when the checkpoint wait fails would flush at
    interpreter exit (TensorBoard's atexit hook) into the same full disk, with a traceback."""
    first: Exception | None = None
    for fn in (run.ckpt.wait, lambda: _close_writer(run)):
        try:
            fn()
        except Exception as e:
            first = first or e
    if first is not None and not quietly:
        raise first


def run_loop(run: Run, stop: StopFlag | None = None) -> dict[str, Any]:
    """Restore-or-init, warm up, then steps until `run.steps` or a signal; returns the last
    metrics row ({} when no step ran). A signal (`stop`) ends it with `Interrupted` at the next
    safe point: after the current step, with that step saved."""
    check = stop.check if stop is not None else no_stop
    run.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        last = _run(run, stop, check)
    except BaseException:
        _close(run, quietly=True)
        raise
    _close(run, quietly=False)
    return last


def _run(run: Run, stop: StopFlag | None, check: Callable[[str], None]) -> dict[str, Any]:
    cfg = run.cfg
    state, how = restore_or_init(run, check)
    _log(run, "%s; model %.2fM params, mesh %s", how, run.model_cfg.num_params() / 1e6,
         dict(run.mesh.shape))
    start = state.step
    if start >= cfg.run.steps:
        _log(run, "run already finished: step %d of run.steps=%d in %s; raise run.steps to "
             "train further", start, cfg.run.steps, run.run_dir)
        return {}
    check("before compiling (the initial params are saved in checkpoints/initial)")
    run.timing["compile_s"] = warm_up(run, state, check)
    _log(run, "compiled %d sampler shapes and the train steps in %.1fs",
         len(run.sampler.shapes), run.timing["compile_s"])
    if run.eval is not None and start == 0:
        _initial_eval(run, state.params)
    last: dict[str, Any] = {}
    bar = progress_bar(range(start, cfg.run.steps), enabled=run.show_progress, desc="GRPO",
                       initial=start, total=cfg.run.steps)
    for step in bar:
        state, last = guarded_step(run, state, step)
        _report(run, bar, step, last)
        done = step + 1
        _check_run_dir(run)
        if stop is not None and stop.set:
            run.ckpt.save(done, snapshot(run, state), force=True)
            run.ckpt.wait()
            check(f"after step {done}; checkpoint saved in {run.ckpt.directory}; rerun the same "
                  "command to resume")
        run.ckpt.save(done, snapshot(run, state), force=done == cfg.run.steps)
    return last


def train(cfg: Config, *, progress: bool | None = None,
          timing: dict[str, float] | None = None) -> dict[str, Any]:
    """Builds and runs a training job from `cfg`; returns the last metrics row.

    Holds the run dir's lock (`runlock.RunLock`, raises `RunDirLocked`) and watches Ctrl-C /
    SIGTERM (`signals.StopFlag`, raises `errors.Interrupted`) for the whole run.
    `timing`, when given, receives the seconds of the start-up phases: `sft_s` (SFT warm start
    or `init.params` restore; absent on resume) and `compile_s` (warm-up).
    """
    with RunLock(cfg.run.dir, enabled=jax.process_index() == 0), StopFlag() as stop:
        run = build_run(cfg, progress=progress)
        try:
            stop.check("while building the run (nothing saved)")
            return run_loop(run, stop)
        finally:
            with contextlib.suppress(Exception):  # after a failure; a clean run has waited
                run.ckpt.close()
            if timing is not None:
                timing.update(run.timing)
