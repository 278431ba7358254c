"""The run's start, before its first step: restore-or-init and the warm-up.

`restore_or_init(run)` -> (state, how): the newest good checkpoint (resume), else a fresh state
with initial params (`checkpoints/initial` reused after a kill before step 1, `init.params`, or
the SFT warm start), refusing a resume whose config changes what the checkpoints' arrays depend
on. `warm_up(run, state)` compiles every shape of the plan, so `compiles` stays 0 from step 1
while G moves. `snapshot` / `observed` tie a `RunState` to the checkpoint and to what the run's
policy and prompt stream hold; the loop (`train.loop`) uses them after every step too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from sagc_jax import checkpoint as ckpt
from sagc_jax.config import Config, config_to_dict, load_saved_config, save_config
from sagc_jax.config import sagc_constants as sc
from sagc_jax.data.pipeline import load_examples
from sagc_jax.models.lora import checkpointed
from sagc_jax.open_run import with_frozen_base
from sagc_jax.rollout import rollout_key
from sagc_jax.sagc.controller import copy_state
from sagc_jax.train.setup import Run
from sagc_jax.train.sft import sft_warm_start
from sagc_jax.train.state import RunState, copy_params


def snapshot(run: Run, state: RunState) -> ckpt.Snapshot:
    """The checkpoint of `state`. With LoRA only the adapters are saved: the frozen base is
    checkpoints/initial. The prompt iterators stand at `state.data` whenever a state is saved
    (after its step, or put back by `guarded_step`); grain saves them from the iterators."""
    return ckpt.Snapshot(step=state.step, params=checkpointed(state.params),
                         opt_state=state.opt_state, sagc=state.sagc,
                         data_iter=list(run.prompts.iterators))


def observed(run: Run, state: RunState) -> RunState:
    """`state` with the SAGC state and the data position the run's policy and prompt stream
    hold now (a copy of the SAGC state: the policy updates its own in place)."""
    return dataclasses.replace(state, sagc=copy_state(run.policy.state),
                               data=run.prompts.get_state())


def no_stop(where: str) -> None:
    """`StopFlag.check` stand-in when no signals are watched."""


def _recipe(cfg: Config) -> dict[str, Any]:
    """What `checkpoints/initial` depends on (JSON form): reused only if it is unchanged."""
    s = cfg.sampling
    return json.loads(json.dumps({
        "init": config_to_dict(cfg.init), "data": config_to_dict(cfg.data),
        "seed": cfg.warm_start_seed, "sft_len": s.prompt_buckets[-1] + s.max_new_tokens}))


def _fresh_params(run: Run, init: RunState, check: Callable[[str], None]) -> tuple[Any, str]:
    """(initial params, how): the params of `checkpoints/initial` when a run killed before its
    first step left one for the same model and recipe (so the SFT is not redone), else
    `init.params` or the SFT warm start (then saved as `checkpoints/initial`); `init` is the
    built state."""
    cfg = run.cfg
    if run.ckpt.initial_recipe() == _recipe(cfg):
        try:
            run.ckpt.check_model(run.model_cfg)
            return run.ckpt.restore_initial(init.params), (
                "fresh start from the warm start saved in checkpoints/initial (SFT not redone)")
        except Exception as e:  # another model, or damaged: redo it
            ckpt.warn(f"checkpoints/initial not reused ({ckpt.error_line(e)}); redoing it")
    if cfg.init.params:
        params = ckpt.restore_params(cfg.init.params, init.params)
        how = f"fresh start from init.params {cfg.init.params}"
    else:
        # The SFT examples follow the warm-start seed (`init.seed`), the RL prompts `run.seed`.
        examples = run.train_examples if cfg.warm_start_seed == cfg.run.seed else \
            load_examples(cfg.data, "train", seed=cfg.warm_start_seed)
        params, losses = sft_warm_start(
            cfg, init.params, graphdef=run.graphdef, param_shardings=run.param_shardings,
            mesh=run.mesh, examples=examples, tokenizer=run.tokenizer,
            progress=run.show_progress, check=check)
        how = f"fresh start; SFT loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else \
            "fresh start"
    run.ckpt.save_initial(params, run.model_cfg, recipe=_recipe(cfg))
    return params, how


# Settings a checkpoint's arrays depend on beyond the architecture (model.json checks that):
# the adapters' shapes, the params' storage dtype, the SAGC state's rungs. Changed on resume
# they would make every restore fail as if the files were damaged, or (rungs of the same
# count) reinterpret the controller's per-rung statistics silently.
_RESUME_KEYS = (("model", "lora"), ("model", "param_dtype"), ("sagc", "group_sizes"))


def _check_resume_config(run: Run) -> None:
    """Refuses (CheckpointMismatchError, exit 2) a resume whose config changes a `_RESUME_KEYS`
    setting from the run's saved `config.yaml`, naming the key, before anything is restored."""
    saved_path = run.run_dir / "config.yaml"
    if not saved_path.is_file():
        return
    try:
        saved = config_to_dict(load_saved_config(saved_path))
    except ValueError:  # an unreadable or foreign saved config: the restore's own checks decide
        return
    now = config_to_dict(run.cfg)
    for section, key in _RESUME_KEYS:
        a, b = saved[section].get(key), now[section].get(key)
        if a != b:
            raise ckpt.CheckpointMismatchError(
                f"{section}.{key}: the checkpoints in {run.ckpt.directory} were written with "
                f"{a!r}, this config has {b!r}; resume with the original value or use another "
                "run.dir")


def restore_or_init(run: Run, check: Callable[[str], None] = no_stop) -> tuple[RunState, str]:
    """(the state to start from, how): the newest good checkpoint (run.resume), else a fresh
    state from the run's built one (`Run.take_initial`) with initial params.

    `config.yaml` is written only once the run dir's checkpoints are known to fit this config,
    so a refused resume (another model, group sizes...) leaves the run's own config in place.
    """
    cfg, init = run.cfg, run.take_initial()
    mode = cfg.run.resume
    run.ckpt.check_space(init.params, init.opt_state, steps=cfg.run.steps)
    restored = None
    if mode != "never":
        if run.ckpt.latest_step() is not None:
            _check_resume_config(run)
        template = dataclasses.replace(init, sagc=run.policy.state)
        restored = run.ckpt.restore_latest(snapshot(run, template), run.model_cfg)
    if restored is None and mode == "required":
        raise FileNotFoundError(f"run.resume=required but no checkpoint in {run.ckpt.directory}")
    if restored is None and mode == "never" and run.ckpt.latest_step() is not None:
        raise FileExistsError(f"{run.ckpt.directory} already holds checkpoints and "
                              "run.resume=never; choose another run.dir")
    if run.hosts.is_main:
        save_config(cfg, run.run_dir / "config.yaml")
        # The controller's constants live in code, which moves on; the run keeps its own so
        # its decisions replay exactly later (a resume keeps the file its start wrote).
        if cfg.sagc.enabled and not (run.run_dir / sc.CONSTANTS_FILE).is_file():
            sc.save_constants(run.run_dir / sc.CONSTANTS_FILE)
    copy_ref = cfg.algo.beta > 0 and cfg.model.lora is None
    if restored is None:
        t0 = time.perf_counter()
        params, how = _fresh_params(run, init, check)
        run.timing["sft_s"] = time.perf_counter() - t0
        # The reference must survive donation of the params in the train step. With LoRA it is
        # the frozen base itself (adapters off): no copy (`Learner.reference`).
        ref = copy_params(params) if copy_ref else None
        run.writer.resume_from(0)
        return observed(run, RunState(params, init.opt_state, ref)), how
    # A LoRA run's steps hold the adapters only: its frozen base is checkpoints/initial.
    params = with_frozen_base(run.ckpt.directory, restored.params, init.params)
    run.policy.load_state(restored.sagc)
    # With LoRA the reference is the restored base: checkpoints/initial unread.
    ref = run.ckpt.restore_initial(params) if copy_ref else None
    state = RunState(params, restored.opt_state, ref, step=restored.step)
    run.writer.resume_from(state.step)
    if (missing := run.writer.missing_rows(state.step)):
        raise ckpt.CheckpointMismatchError(
            f"run.dir {run.run_dir}: checkpoint step {state.step} but metrics.jsonl has no "
            f"rows for steps {missing[0]}..{missing[-1]} (was the run dir removed or edited "
            "while a run wrote it?); move it aside and rerun to start again")
    return observed(run, state), f"resumed from step {state.step}"


def warm_up(run: Run, state: RunState, check: Callable[[str], None] = no_stop) -> float:
    """Compiles every shape (samplers, train steps, gathers) ahead of step 1; returns seconds.
    `check` is called between compile phases (a pending Ctrl-C stops there)."""
    t0 = time.perf_counter()
    where = "while compiling (the initial params are saved in checkpoints/initial)"
    run.sampler.compile_all(progress=run.show_progress)
    check(where)
    if run.eval is not None:
        run.eval.sampler.compile_all(progress=run.show_progress)
        check(where)
    run.learner.warm_up(state.params, state.opt_state)
    check(where)
    # Host-side eager ops (key derivation, the lr schedule for logging) compile once per
    # signature: do it here so `compiles` is 0 from step 1 on.
    rollout_key(run.cfg.run.seed, 0, 0)
    float(run.lr_schedule(0))
    run.hosts.warm_up({g: run.hosts.local_rows(p) * g for g, p in run.plan.prompts_per_g.items()},
                      measured_timing=run.cfg.sagc.timing != "model")
    return time.perf_counter() - t0
