"""Everything a training run is built from, derived from a Config once (`build_run`).

Nothing here trains: the loop (`train.loop`) restores or initialises the state, warms up and
steps. The built params and optimizer state are `Run.initial`, handed over once to the loop
(`Run.take_initial`), which then passes its `RunState` through every step; the samplers get
the params passed on every call.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from sagc_jax import checkpoint as ckpt
from sagc_jax.config import Config, ConfigError
from sagc_jax.data.columns import required_columns
from sagc_jax.data.lengths import check_prompt_lengths
from sagc_jax.data.pipeline import load_examples, make_prompt_iterator
from sagc_jax.data.prompt_stream import PromptStream
from sagc_jax.data.tokenizer import encode_text, load_run_tokenizer, stop_ids
from sagc_jax.hosts import Hosts
from sagc_jax.metrics import RunWriter
from sagc_jax.models.build import build_model
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.lora import trainable
from sagc_jax.models.sharding import state_shardings
from sagc_jax.optim import make_optimizer, make_schedule
from sagc_jax.parallel import make_mesh_from_config
from sagc_jax.rewards import RewardFn, build_reward_fns
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.rollout import CollectSettings
from sagc_jax.rollout.episodes import EpisodeSettings
from sagc_jax.sagc import make_policy
from sagc_jax.sampling import Sampler, SamplingConfig
from sagc_jax.sampling.turns import TurnSampler
from sagc_jax.shapes import ShapePlan
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import RunState, init_opt_state

logger = logging.getLogger("sagc_jax.train")


@dataclasses.dataclass
class EvalSet:
    """Greedy held-out accuracy during training: its examples and G = 1 sampler."""

    examples: list[dict[str, Any]]
    sampler: Sampler


@dataclasses.dataclass
class Run:
    """A built run. `initial`: the built (fresh) state, until the loop takes it over
    (`take_initial`); from then on the loop's `RunState` is the only copy of the params."""

    cfg: Config
    hosts: Hosts
    mesh: Any
    plan: ShapePlan
    tokenizer: Any
    pad_id: int
    model_cfg: ModelConfig
    graphdef: nnx.GraphDef
    param_shardings: Any
    initial: RunState | None
    learner: Learner
    lr_schedule: Any
    policy: Any
    reward_fns: list[RewardFn]
    sampler: Sampler
    prompts: PromptStream
    train_examples: Any
    collect_settings: CollectSettings
    episodes: EpisodeSettings | None  # the `env:` section's episodes; None = single-turn
    eval: EvalSet | None
    ckpt: ckpt.RunCheckpointer
    writer: RunWriter
    progress: bool
    run_dir: Path
    timing: dict[str, float] = dataclasses.field(default_factory=dict)

    def take_initial(self) -> RunState:
        """The built state, handed over once: the run keeps no reference, so a restored or
        updated state leaves no second copy of the params alive."""
        if self.initial is None:
            raise RuntimeError("Run.take_initial: the built state was already taken")
        state, self.initial = self.initial, None
        return state

    @property
    def show_progress(self) -> bool:
        return self.progress and self.hosts.is_main


def _make_policy(cfg: Config) -> Any:
    """The group-size policy, with the run's length as the controller's horizon: SAGC prices a
    second by the benefit rate the run can still end at (docs/sagc.md). The horizon is kept in
    the SAGC state, so a resumed run keeps the one it started with; the step's shape lets the
    first choice price the rungs."""
    return make_policy(cfg.sagc, horizon=cfg.run.steps, prompts=cfg.data.prompts_per_step,
                       max_new_tokens=cfg.sampling.max_new_tokens)


def _blueprint(graphdef: nnx.GraphDef, params: Any) -> Any:
    """A model of shapes only, for the samplers' static structure (params are passed per call,
    so no second live copy of the weights exists)."""
    return nnx.merge(graphdef, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                            params))


def _prompt_stream(cfg: Config, plan: ShapePlan, hosts: Hosts, examples: Any,
                   tokenizer: Any) -> PromptStream:
    """One grain iterator per virtual data shard this process owns."""
    s = cfg.sampling
    iters = [make_prompt_iterator(
        examples, tokenizer=tokenizer, seed=cfg.run.seed, shuffle=cfg.data.shuffle,
        num_epochs=cfg.data.num_epochs, process_index=shard, process_count=plan.data_shards,
        chat_template=cfg.data.chat_template, worker_count=cfg.data.worker_count,
        max_prompt_len=s.prompt_buckets[-1], truncate_prompts=s.prompt_too_long == "truncate")
        for shard in plan.owned_shards(hosts.index)]
    return PromptStream(iters, plan.data_shards, cfg.data.num_epochs)


def _check_lengths(cfg: Config, examples: Any, tokenizer: Any, split: str) -> None:
    """Every prompt of the split fits the largest prompt bucket (unless truncation is on)."""
    if cfg.sampling.prompt_too_long == "truncate":
        return
    path = getattr(cfg.data, f"{split}_file", None)
    where = f"data.{split}_file {path}" if path else f"data.task {cfg.data.task} ({split} split)"
    check_prompt_lengths(examples, tokenizer, max_len=cfg.sampling.prompt_buckets[-1],
                         where=where, chat_template=cfg.data.chat_template)


def _eval_examples(cfg: Config, hosts: Hosts, tokenizer: Any,
                   reward_fns: list[RewardFn]) -> list[dict[str, Any]] | None:
    """The held-out examples, checked (columns the rewards read, prompt lengths) before the
    model is built; None when the run evaluates nothing."""
    if cfg.run.eval_every <= 0:
        return None
    if not hosts.single:
        # Held-out eval runs host-local Python over a global batch; not wired up for several
        # processes yet.
        if hosts.is_main:
            logger.info("run.eval_every=%d ignored: evaluation during training is single-process "
                        "only (%d processes)", cfg.run.eval_every, hosts.count)
        return None
    examples = list(load_examples(cfg.data, "eval", seed=cfg.run.seed,
                                  required=required_columns(cfg, reward_fns, "eval")))
    _check_lengths(cfg, examples, tokenizer, "eval")
    return examples


def _sampler(cfg: Config, config: SamplingConfig, blueprint: Any, tokenizer: Any, pad_id: int,
             eos: list[int], mesh: Any, episodes: EpisodeSettings | None) -> Sampler:
    """The run's sampler for `config`: a `TurnSampler` (episodes, its stop strings as token ids)
    when the run has an environment."""
    if episodes is None:
        return Sampler(blueprint, config=config, pad_id=pad_id, eos_ids=eos, mesh=mesh)
    assert cfg.env is not None
    return TurnSampler(blueprint, config, pad_id=pad_id, eos_ids=eos,
                       stop_ids=[encode_text(tokenizer, s) for s in episodes.spec.stop],
                       reply_width=cfg.env.max_reply_tokens, mesh=mesh)


def _eval_set(cfg: Config, plan: ShapePlan, examples: list[dict[str, Any]] | None,
              blueprint: Any, tokenizer: Any, pad_id: int, eos: list[int], mesh: Any,
              episodes: EpisodeSettings | None) -> EvalSet | None:
    if examples is None:
        return None
    sampler = _sampler(cfg, SamplingConfig.for_eval(plan, cfg.sampling), blueprint, tokenizer,
                       pad_id, eos, mesh, episodes)
    return EvalSet(examples, sampler)


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What a run reads before it builds a model: all checked by `check_inputs`."""

    tokenizer: Any
    reward_fns: list[RewardFn]
    train_examples: Any
    eval_examples: list[dict[str, Any]] | None
    episodes: EpisodeSettings | None


def check_inputs(cfg: Config, hosts: Hosts | None = None) -> RunInputs:
    """The input checks, before the model is built or anything compiled: tokenizer vs model
    file, reward and environment names, the columns the warm start and rewards read, the task's
    options, every prompt's length. Raises the CLI's exit-2 errors (one line naming key, file
    or row)."""
    hosts = hosts or Hosts.current()
    tokenizer = load_run_tokenizer(cfg.model.tokenizer, cfg.model.path)
    reward_fns = build_reward_fns(cfg.rewards, cfg.reward_timeout_s)
    episodes = EpisodeSettings.from_config(cfg) if cfg.env is not None else None
    train_examples = load_examples(cfg.data, "train", seed=cfg.run.seed,
                                   required=required_columns(cfg, reward_fns, "train"))
    _check_lengths(cfg, train_examples, tokenizer, "train")
    return RunInputs(tokenizer, reward_fns, train_examples,
                     _eval_examples(cfg, hosts, tokenizer, reward_fns), episodes)


def build_run(cfg: Config, *, progress: bool | None = None) -> Run:
    """Builds mesh, tokenizer, model, state, learner, samplers, data and writers from `cfg`.

    Raises ValueError naming the config key at fault (shape plan, vocab, DAPO with hosts).
    """
    hosts = Hosts.current()
    if not hosts.single and cfg.algo.dynamic_sampling:
        raise ValueError("algo.dynamic_sampling is single-process only (its refill rounds "
                         f"would differ per host); got {hosts.count} processes")
    if not hosts.single and cfg.env is not None:
        raise ValueError(f"env: multi-turn episodes are single-process only; got {hosts.count} "
                         "processes")
    mesh = make_mesh_from_config(cfg.mesh)
    plan = ShapePlan.from_config(cfg, batch_ways=mesh.shape["data"] * mesh.shape["fsdp"],
                                 num_processes=hosts.count)
    errors, _ = plan.problems()
    if errors:
        raise ConfigError(errors[0])
    inputs = check_inputs(cfg, hosts)
    tokenizer, reward_fns = inputs.tokenizer, inputs.reward_fns
    train_examples, eval_examples = inputs.train_examples, inputs.eval_examples
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    eos = stop_ids(tokenizer)
    run_dir = Path(cfg.run.dir)
    checkpointer = ckpt.RunCheckpointer(run_dir / "checkpoints", every=cfg.checkpoint.every,
                                        keep=cfg.checkpoint.keep,
                                        async_save=cfg.checkpoint.async_save)
    model, model_cfg = build_model(cfg, len(tokenizer), tokenizer, mesh)
    if model_cfg.vocab_size < len(tokenizer):
        raise ValueError(f"model.vocab_size {model_cfg.vocab_size} is smaller than the "
                         f"tokenizer's {len(tokenizer)} tokens")
    graphdef, params = nnx.split(model)
    del model
    param_shardings = state_shardings(params, mesh)
    params = jax.device_put(params, param_shardings)
    optimizer = make_optimizer(cfg.optim, cfg.run.steps)
    # With LoRA only the adapters carry optimizer state (`lora.trainable`).
    opt_state, opt_shardings = init_opt_state(optimizer, trainable(params), mesh)
    learner = Learner(graphdef, optimizer, LossSettings.from_config(cfg), mesh, param_shardings,
                      opt_shardings, plan.train_layout, num_iterations=cfg.algo.num_iterations,
                      hosts=hosts)
    blueprint = _blueprint(graphdef, params)
    episodes = inputs.episodes
    sampler = _sampler(cfg, SamplingConfig.from_plan(plan, cfg.sampling), blueprint, tokenizer,
                       pad_id, eos, mesh, episodes)
    return Run(
        cfg=cfg, hosts=hosts, mesh=mesh, plan=plan, tokenizer=tokenizer, pad_id=pad_id,
        model_cfg=model_cfg, graphdef=graphdef, param_shardings=param_shardings,
        initial=RunState(params, opt_state), learner=learner,
        lr_schedule=make_schedule(cfg.optim, cfg.run.steps), policy=_make_policy(cfg),
        reward_fns=reward_fns, sampler=sampler,
        prompts=_prompt_stream(cfg, plan, hosts, train_examples, tokenizer),
        train_examples=train_examples, collect_settings=CollectSettings.from_config(cfg, pad_id),
        episodes=episodes,
        eval=_eval_set(cfg, plan, eval_examples, blueprint, tokenizer, pad_id, eos, mesh,
                       episodes),
        ckpt=checkpointer,
        writer=RunWriter(run_dir, enabled=hosts.is_main),
        progress=cfg.run.progress if progress is None else progress, run_dir=run_dir)
