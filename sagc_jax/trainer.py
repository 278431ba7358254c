"""The GRPO training loop: data -> SAGC.choose -> sampler -> rewards -> update -> SAGC.observe.

Everything with a shape is compiled before step 1 (the sampler's shape set and one train step per
(G, prompt bucket, completion bucket)), so `compiles` in metrics.jsonl stays 0 while G moves.
SAGC sits beside the loop: it is asked for G and told what the step observed, nothing more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from sagc_jax import checkpoint as ckpt
from sagc_jax.config import Config, save_config
from sagc_jax.data.pipeline import load_examples, make_prompt_iterator, make_sft_batches
from sagc_jax.data.tokenizer import decode_completion, load_tokenizer
from sagc_jax.metrics import RunWriter
from sagc_jax.models import ModelConfig, Transformer, from_pretrained
from sagc_jax.models.config import from_run_section
from sagc_jax.models.sharding import replicated, state_shardings
from sagc_jax.optim import make_optimizer, make_schedule
from sagc_jax.parallel import (
    allgather,
    broadcast_from_main,
    host_local_to_global,
    is_main_process,
    make_mesh_from_config,
)
from sagc_jax.rl.rewards import RewardFn, compute_rewards
from sagc_jax.rl.shaping import overlong_penalty
from sagc_jax.rl.train_step import BATCH_FIELDS, CompiledSteps, LossSettings, make_sft_step
from sagc_jax.sagc.controller import Observation, make_policy, prompts_for
from sagc_jax.sampling import Sampler, SamplingConfig, compile_count


class TrainingError(RuntimeError):
    """A run cannot continue (non-finite loss, exhausted data...); the message says what was
    saved."""


def _progress(iterable, *, enabled: bool, **kw):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, **kw)


def build_model(cfg: Config, vocab_size: int, tokenizer, mesh) -> tuple[Transformer, ModelConfig]:
    """An HF checkpoint (`model.path`) or a fresh random model from the `model.*` fields."""
    m = cfg.model
    if m.path is not None:
        model, mcfg = from_pretrained(m.path, dtype=m.dtype, mesh=mesh)
        if m.remat:
            model.cfg = dataclasses.replace(mcfg, remat=True)
            mcfg = model.cfg
        return model, mcfg
    mcfg = from_run_section(m, vocab_size, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    return Transformer(mcfg, rngs=nnx.Rngs(cfg.run.seed)), mcfg


def completion_buckets(max_new_tokens: int, chunk: int) -> tuple[int, ...]:
    """Train-step completion lengths: half and full `max_new_tokens` (multiples of the chunk).

    Two buckets make the update's cost follow the straggler tail (a batch without a long
    completion trains on half the length) for one extra compile per G.
    """
    half = -(-(max_new_tokens // 2) // chunk) * chunk
    return tuple(sorted({min(half, max_new_tokens), max_new_tokens}))


def _bucket(value: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


class FormatNoise(Sequence):
    """SFT examples where a fixed, seeded fraction `p` of solutions end in `answer: N` instead of
    `#### N`. The warm-started model then writes the wrong answer format about `p` of the time,
    a habit GRPO has to unlearn from the exact-answer reward (a realistic, quickly visible RL
    effect; see README)."""

    def __init__(self, base: Sequence, p: float, seed: int):
        self.base, self.p, self.seed = base, p, seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ex = dict(self.base[i])
        if np.random.default_rng([self.seed, 7, int(i)]).random() < self.p:
            ex["solution"] = ex["solution"].replace("#### ", "answer: ")
        return ex


@dataclasses.dataclass
class Rollout:
    """One step's sampled groups, in prompt-major row order."""

    examples: list[dict[str, Any]]  # one per group
    group_size: int
    tokens: np.ndarray  # [R, N]
    logprobs: np.ndarray  # [R, N]
    lengths: np.ndarray  # [R]
    truncated: np.ndarray  # [R]
    rewards: np.ndarray  # [R] (shaped)
    raw_rewards: np.ndarray  # [R] (before overlong shaping)
    valid: np.ndarray  # [R] rows in kept groups
    completions: list[str]
    stats: dict[str, float]
    first_round: Observation | None = None
    reward_errors: int = 0
    row_offset: int = 0  # global index of this process's first row (multi-process)


class Trainer:
    """Builds everything from a Config and runs `train()`; state is checkpointed with Orbax."""

    def __init__(self, cfg: Config, *, progress: bool | None = None):
        self.cfg = cfg
        self.progress = cfg.run.progress if progress is None else progress
        self.run_dir = Path(cfg.run.dir)
        self.is_main = is_main_process()
        self.num_processes, self.process_index = jax.process_count(), jax.process_index()
        self._stop = False
        if self.num_processes > 1 and cfg.algo.dynamic_sampling:
            raise ValueError("algo.dynamic_sampling is single-process only (its refill rounds "
                             f"would differ per host); got {self.num_processes} processes")
        self.mesh = make_mesh_from_config(cfg.mesh)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                          else 0)
        self.eos_ids = self._eos_ids()
        self.ckpt = ckpt.RunCheckpointer(self.run_dir / "checkpoints", every=cfg.checkpoint.every,
                                         keep=cfg.checkpoint.keep,
                                         async_save=cfg.checkpoint.async_save)
        model, self.model_cfg = build_model(cfg, len(self.tokenizer), self.tokenizer, self.mesh)
        if self.model_cfg.vocab_size < len(self.tokenizer):
            raise ValueError(f"model.vocab_size {self.model_cfg.vocab_size} is smaller than the "
                             f"tokenizer's {len(self.tokenizer)} tokens")
        self.graphdef, params = nnx.split(model)
        self.param_shardings = state_shardings(params, self.mesh)
        self.params = jax.device_put(params, self.param_shardings)
        self.model = nnx.merge(self.graphdef, self.params)
        self.optimizer = make_optimizer(cfg.optim, cfg.run.steps)
        self.lr_schedule = make_schedule(cfg.optim, cfg.run.steps)
        self.opt_state, self.opt_shardings = self._init_opt(self.optimizer, self.params)
        self.policy = make_policy(cfg.sagc)
        self.reward_fns = [RewardFn.from_name(r.name, r.weight) for r in cfg.rewards]
        self.group_sizes = tuple(cfg.sagc.group_sizes)
        self.prompts_per_g = {g: prompts_for(cfg.sagc, g, cfg.data.prompts_per_step)
                              for g in self.group_sizes}
        s = cfg.sampling
        self.completion_buckets = completion_buckets(s.max_new_tokens, s.decode_chunk)
        self.sampler = Sampler(self.model, config=SamplingConfig(
            group_sizes=self.group_sizes, prompts_per_step=max(self.prompts_per_g.values()),
            prompts_for_group=self.prompts_per_g, prompt_buckets=tuple(s.prompt_buckets),
            cache_buckets=None if s.cache_buckets is None else tuple(s.cache_buckets),
            max_new_tokens=s.max_new_tokens, decode_chunk=s.decode_chunk,
            use_top_k=s.top_k is not None, use_top_p=s.top_p is not None,
            prompt_too_long=s.prompt_too_long),
            pad_id=self.pad_id, eos_ids=self.eos_ids, mesh=self.mesh)
        a = cfg.algo
        self.steps = CompiledSteps(
            self.graphdef, self.optimizer,
            LossSettings(epsilon=a.epsilon, epsilon_high=a.epsilon_high, clip_delta=a.clip_delta,
                         importance_sampling=a.importance_sampling, loss_agg=a.loss_agg,
                         beta=a.beta, kl_estimator=a.kl_estimator,
                         kl_bias_correction=a.kl_bias_correction, scale_rewards=a.scale_rewards,
                         std_ddof=a.std_ddof, adv_eps=a.adv_eps,
                         top_entropy_quantile=a.top_entropy_quantile, temperature=s.temperature,
                         max_tokens=s.max_new_tokens),
            self.mesh, self.param_shardings, self.opt_shardings, a.micro_batch_rows)
        self.ref_params = None
        self.train_examples = load_examples(cfg.data, "train", seed=cfg.run.seed)
        self.num_shards, self.owned_shards = self._data_shards()
        # One iterator per owned virtual shard: the global batch is the shards' next prompts in
        # shard order, so it does not depend on how many processes share the shards.
        self.data_iters = [make_prompt_iterator(
            self.train_examples, tokenizer=self.tokenizer, seed=cfg.run.seed,
            shuffle=cfg.data.shuffle, num_epochs=cfg.data.num_epochs,
            process_index=shard, process_count=self.num_shards,
            chat_template=cfg.data.chat_template, worker_count=cfg.data.worker_count,
            max_prompt_len=s.prompt_buckets[-1],
            truncate_prompts=s.prompt_too_long == "truncate") for shard in self.owned_shards]
        self.eval_sampler = None
        if cfg.run.eval_every > 0 and self.num_processes > 1:
            # Held-out eval runs host-local Python over a global batch; not wired up for
            # several processes yet.
            self._log(f"run.eval_every={cfg.run.eval_every} ignored: evaluation during training "
                      f"is single-process only ({self.num_processes} processes)")
        elif cfg.run.eval_every > 0:
            # Greedy held-out accuracy during training; its shapes compile in warm-up too.
            self.eval_examples = list(load_examples(cfg.data, "eval", seed=cfg.run.seed))
            self.eval_sampler = Sampler(self.model, config=SamplingConfig(
                group_sizes=(1,), prompts_per_step=64, prompt_buckets=tuple(s.prompt_buckets),
                cache_buckets=None if s.cache_buckets is None else tuple(s.cache_buckets),
                max_new_tokens=s.max_new_tokens, decode_chunk=s.decode_chunk,
                prompt_too_long=s.prompt_too_long), pad_id=self.pad_id, eos_ids=self.eos_ids,
                mesh=self.mesh)
        self.writer = RunWriter(self.run_dir, enabled=self.is_main)
        self.start_step = 0

    # ------------------------------------------------------------------ setup helpers
    @property
    def data_iter(self):
        """The data iterator of a single-shard process (the common case); see `data_iters`."""
        if len(self.data_iters) != 1:
            raise AttributeError(f"this process owns {len(self.data_iters)} data shards; use "
                                 "data_iters")
        return self.data_iters[0]

    def _data_shards(self) -> tuple[int, list[int]]:
        """(number of virtual data shards, the shards this process owns), validated.

        Process p owns the contiguous shards [p*S/n, (p+1)*S/n); every step takes P/S prompts
        from each shard, so P (for every G) must divide by S.
        """
        n, p = self.num_processes, self.process_index
        shards = self.cfg.data.shards or n
        if shards % n:
            raise ValueError(f"data.shards: must be a multiple of the process count {n}, got "
                             f"{shards}")
        for g, prompts in self.prompts_per_g.items():
            if prompts % shards:
                raise ValueError(
                    f"data.prompts_per_step: {prompts} prompts per step at G={g} do not split "
                    f"over data.shards={shards} (each shard gives the same number of prompts)")
        per = shards // n
        return shards, list(range(p * per, (p + 1) * per))

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        extra = getattr(self.tokenizer, "generation_eos_ids", None)
        if extra:
            ids |= set(extra)
        return sorted(int(i) for i in ids if i is not None)

    def _init_opt(self, optimizer: optax.GradientTransformation, params: Any):
        opt_state = jax.jit(optimizer.init)(params)
        shard = jax.tree.map(
            lambda x: x.sharding if isinstance(x.sharding, NamedSharding)
            else replicated(self.mesh), opt_state)
        return jax.device_put(opt_state, shard), shard

    def _next_prompts(self, step: int, num_prompts: int) -> list[dict[str, Any]]:
        """This process's block of the step's global prompts: num_prompts / S from each owned
        shard, in shard order."""
        per_shard = num_prompts // self.num_shards
        try:
            return [next(it) for it in self.data_iters for _ in range(per_shard)]
        except StopIteration as e:
            raise TrainingError(f"training data exhausted at step {step} "
                                f"(data.num_epochs={self.cfg.data.num_epochs})") from e

    def _sync_model(self) -> None:
        """Points the sampler's model at the latest params (no copy, no recompile)."""
        nnx.update(self.model, self.params)

    # ------------------------------------------------------------------ phases
    def sft_warm_start(self) -> list[float]:
        """Supervised warm start on the task's reference solutions (`init.sft_steps`)."""
        n = self.cfg.init.sft_steps
        if n == 0:
            return []
        opt = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(optax.warmup_cosine_decay_schedule(
                              0.0, self.cfg.init.sft_lr, min(20, n // 4), max(n, 2),
                              self.cfg.init.sft_lr * 0.1)))
        opt_state, opt_shard = self._init_opt(opt, self.params)
        step = jax.jit(make_sft_step(self.graphdef, opt),
                       in_shardings=(self.param_shardings, opt_shard, None, None),
                       out_shardings=(self.param_shardings, opt_shard, None),
                       donate_argnums=(0, 1))
        s = self.cfg.sampling
        seq_len = s.prompt_buckets[-1] + s.max_new_tokens
        examples = self.train_examples
        if self.cfg.init.sft_format_noise > 0:
            examples = FormatNoise(examples, self.cfg.init.sft_format_noise, self.cfg.run.seed)
        batches = make_sft_batches(examples, tokenizer=self.tokenizer,
                                   batch_size=self.cfg.init.sft_batch_size,
                                   seed=self.cfg.run.seed + 1, num_epochs=None,
                                   chat_template=self.cfg.data.chat_template,
                                   pad_multiple=32)  # few distinct lengths = few compiles
        losses = []
        bar = _progress(range(n), enabled=self.progress and self.is_main, desc="SFT warm start")
        for i, batch in zip(bar, batches):
            tokens = batch["tokens"][:, :seq_len]
            self.params, opt_state, loss = step(self.params, opt_state, tokens,
                                                batch["loss_mask"][:, :seq_len])
            if i % 25 == 0 or i == n - 1:
                losses.append(float(loss))
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{losses[-1]:.3f}")
        self._sync_model()
        return losses

    def warm_up(self) -> float:
        """Compiles every shape (sampler and train step) ahead of step 1; returns seconds."""
        t0 = time.perf_counter()
        self.sampler.compile_all(progress=self.progress and self.is_main)
        if self.eval_sampler is not None:
            self.eval_sampler.compile_all(progress=self.progress and self.is_main)
        need_logp = self.cfg.algo.beta > 0 or self.cfg.algo.num_iterations > 1
        shapes = [(g, lp, n) for g in self.group_sizes for lp in self.sampler.config.prompt_buckets
                  for n in self.completion_buckets]
        bar = _progress(shapes, enabled=self.progress and self.is_main,
                        desc="compiling train step")
        for g, lp, n in bar:
            p = self.prompts_per_g[g]
            self.steps.warm_up(self.params, self.opt_state, p * g, p, lp, n, need_logp)
        # Host-side eager ops (key derivation, the lr schedule for logging) compile once per
        # signature: do it here so `compiles` is 0 from step 1 on.
        self._rng_key(0, 0)
        float(self.lr_schedule(0))
        if self.num_processes > 1:
            self._warm_gathers()
        return time.perf_counter() - t0

    def _warm_gathers(self) -> None:
        """Runs a step's cross-process gathers / broadcasts once per G on dummy data (each is a
        small jitted program per shape), so `compiles` stays 0 after warm-up with several
        processes too. Mirrors `collect` and `_global_view`; every process calls it."""
        for g in self.group_sizes:
            rows = self.prompts_per_g[g] // self.num_processes * g
            i32, f32, b = (np.zeros(rows, t) for t in (np.int32, np.float32, bool))
            allgather({"lengths": i32, "truncated": b, "rewards": f32})
            allgather({"lengths": i32, "truncated": b, "rewards": f32, "raw_rewards": f32,
                       "valid": b, "plen": np.zeros(1, np.int64)})
        if self.cfg.sagc.timing != "model":
            broadcast_from_main(np.zeros(2, np.float64))
            broadcast_from_main(np.int32(0))

    def _rng_key(self, step: int, round_: int) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(self.cfg.run.seed), step),
                                  round_)

    # ------------------------------------------------------------------ one step
    def _rewards(self, examples: list[dict], g: int, completions: list[str]):
        prompts = [ex["prompt"] for ex in examples for _ in range(g)]
        skip = {"prompt", "prompt_ids", "solution"}
        keys = [k for k in examples[0] if k not in skip] if examples else []
        columns = {k: [ex.get(k) for ex in examples for _ in range(g)] for k in keys}
        return compute_rewards(self.reward_fns, prompts, completions, columns,
                               on_error=self.cfg.reward_on_error)

    def _sample_round(self, step: int, round_: int, examples: list[dict], g: int):
        s = self.cfg.sampling
        out = self.sampler.generate(
            [ex["prompt_ids"] for ex in examples], group_size=g, key=self._rng_key(step, round_),
            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
            top_p=s.top_p, params=self.params)
        completions = [decode_completion(self.tokenizer, row[:n])
                       for row, n in zip(out.tokens, out.lengths)]
        return out, completions

    def collect(self, step: int, g: int, num_prompts: int) -> Rollout:
        """Samples groups; DAPO dynamic sampling drops zero-variance groups and refills from
        fresh prompts for up to `dynamic_sampling_rounds` extra rounds."""
        a, s = self.cfg.algo, self.cfg.sampling
        rounds = 1 + (a.dynamic_sampling_rounds if a.dynamic_sampling else 0)
        kept: list[tuple] = []  # per group: (example, tokens, logp, len, trunc, rew, raw, comps)
        stats = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0, "padding_waste": 0,
                 "compiles": 0, "rollout_rounds": 0, "reward_s": 0.0}
        first = None
        errors = 0
        # With several processes `num_prompts` is this process's share (DAPO is single-process).
        num_prompts //= self.num_processes
        for r in range(rounds):
            need = num_prompts - len(kept)
            if need == 0:
                break
            examples = (self._next_prompts(step, num_prompts * self.num_processes) if r == 0
                        else self._refill_prompts(step, need))
            out, comps = self._sample_round(step, r, examples, g)
            for k in ("prefill_s", "decode_s", "decode_steps", "padding_waste", "compiles"):
                stats[k] += float(getattr(out.stats, k))
            stats["rollout_rounds"] += 1
            t0 = time.perf_counter()
            res = self._rewards(examples, g, comps)
            stats["reward_s"] += time.perf_counter() - t0
            errors += res.num_errors
            raw = res.total.astype(np.float32)
            shaped = raw + overlong_penalty(out.lengths, s.max_new_tokens, a.overlong_buffer,
                                            a.overlong_penalty)
            if r == 0:
                # SAGC sees the global rollout so every process makes the same decision.
                glob = allgather({"lengths": np.asarray(out.lengths),
                                  "truncated": np.asarray(out.truncated), "rewards": raw})
                first = self._observation(g, len(examples) * self.num_processes, glob,
                                          out.stats)
            for i, ex in enumerate(examples):
                sl = slice(i * g, (i + 1) * g)
                if a.dynamic_sampling and r < rounds - 1 and np.ptp(shaped[sl]) == 0:
                    continue  # no learning signal; replaced next round
                if a.dynamic_sampling and np.ptp(shaped[sl]) == 0:
                    continue  # last round: dropped (row stays invalid)
                if len(kept) < num_prompts:
                    kept.append((ex, out.tokens[sl], out.logprobs[sl], out.lengths[sl],
                                 out.truncated[sl], shaped[sl], raw[sl], comps[sl]))
        n_max = self.cfg.sampling.max_new_tokens
        rows = num_prompts * g
        tokens = np.full((rows, n_max), self.pad_id, np.int32)
        logp = np.zeros((rows, n_max), np.float32)
        lengths = np.zeros(rows, np.int32)
        trunc = np.zeros(rows, bool)
        rew = np.zeros(rows, np.float32)
        raw_r = np.zeros(rows, np.float32)
        valid = np.zeros(rows, bool)
        comps_all = [""] * rows
        examples = []
        for i, (ex, t, lp, ln, tr, sh, rw, cm) in enumerate(kept):
            sl = slice(i * g, (i + 1) * g)
            tokens[sl], logp[sl], lengths[sl], trunc[sl] = t, lp, ln, tr
            rew[sl], raw_r[sl], valid[sl] = sh, rw, True
            comps_all[sl] = cm
            examples.append(ex)
        # Padding groups reuse the first prompt so the batch keeps its compiled shape.
        filler = examples[0] if examples else None
        while len(examples) < num_prompts:
            examples.append(filler if filler is not None else {"prompt_ids": [self.pad_id]})
        return Rollout(examples, g, tokens, logp, lengths, trunc, rew, raw_r, valid, comps_all,
                       stats, first, errors, row_offset=self.process_index * rows)

    def _refill_prompts(self, step: int, need: int) -> list[dict[str, Any]]:
        """DAPO refill: `need` fresh prompts, cycling over the owned shards."""
        try:
            return [next(self.data_iters[i % len(self.data_iters)]) for i in range(need)]
        except StopIteration as e:
            raise TrainingError(f"training data exhausted at step {step} "
                                f"(data.num_epochs={self.cfg.data.num_epochs})") from e

    def _observation(self, g: int, prompts: int, glob: dict[str, np.ndarray],
                     stats) -> Observation:
        """What SAGC sees of a rollout (`glob`: the global lengths, truncated flags and raw
        rewards); with `sagc.timing: model` the seconds come from the linear time model instead
        of the clock, so decisions are reproducible."""
        sc, rows, steps = self.cfg.sagc, prompts * g, int(stats.decode_steps)
        if sc.timing == "model":
            prefill_s = sc.model_prefill_a + sc.model_prefill_b * rows
            decode_s = steps * (sc.model_decode_a + sc.model_decode_b * rows)
        else:
            prefill_s, decode_s = float(stats.prefill_s), float(stats.decode_s)
            if self.num_processes > 1:
                # Each host's clock differs: all feed process 0's seconds to the controller, so
                # the SAGC state (and the next G) stays identical everywhere.
                t = broadcast_from_main(np.asarray([prefill_s, decode_s], np.float64))
                prefill_s, decode_s = float(t[0]), float(t[1])
        return Observation(
            group_size=g, lengths=np.asarray(glob["lengths"]),
            truncated=np.asarray(glob["truncated"]),
            rewards=np.asarray(glob["rewards"]), max_new_tokens=self.cfg.sampling.max_new_tokens,
            prefill_s=prefill_s, decode_s=decode_s, decode_steps=steps, rows=rows,
            prompts=prompts, decode_chunk=self.cfg.sampling.decode_chunk)

    def _global_view(self, ro: Rollout) -> tuple[Rollout, int]:
        """(the rollout's per-row metrics over all processes, the longest prompt anywhere).

        Single process: the rollout itself. Otherwise lengths, flags and rewards are gathered
        (tokens stay host-local), so metrics and the train step's buckets agree on every host.
        """
        plen = max(len(ex["prompt_ids"]) for ex in ro.examples)
        if self.num_processes == 1:
            return ro, plen
        glob = allgather({"lengths": ro.lengths, "truncated": ro.truncated, "rewards": ro.rewards,
                          "raw_rewards": ro.raw_rewards, "valid": ro.valid,
                          "plen": np.asarray([plen], np.int64)})
        stats = dict(ro.stats)
        # Global rows x global decode steps, as a single process would count it.
        stats["padding_waste"] = (len(glob["lengths"]) * int(stats["decode_steps"])
                                  - int(glob["lengths"][glob["valid"]].sum()))
        gv = dataclasses.replace(
            ro, lengths=glob["lengths"], truncated=glob["truncated"], rewards=glob["rewards"],
            raw_rewards=glob["raw_rewards"], valid=glob["valid"], stats=stats, row_offset=0)
        return gv, int(glob["plen"].max())

    def make_batch(self, ro: Rollout, buckets: tuple[int, int] | None = None
                   ) -> tuple[dict[str, np.ndarray], int, int]:
        """Host arrays of the train step for a rollout (this process's rows), plus its
        (prompt, completion) buckets; `buckets` overrides them (several processes must agree on
        the global ones)."""
        g = ro.group_size
        rows = len(ro.lengths)
        if buckets is None:
            plen = max(len(ex["prompt_ids"]) for ex in ro.examples)
            lp = self.sampler.prompt_bucket_for(plen)
            n = _bucket(max(int(ro.lengths.max()), 1), self.completion_buckets)
        else:
            lp, n = buckets
        tokens = np.full((rows, lp + n), self.pad_id, np.int32)
        pad = np.zeros(rows, np.int32)
        for r in range(rows):
            ids = np.asarray(ro.examples[r // g]["prompt_ids"], np.int32)
            tokens[r, lp - len(ids):lp] = ids
            pad[r] = lp - len(ids)
        tokens[:, lp:] = ro.tokens[:, :n]
        loss_rows = ro.valid.copy()
        if self.cfg.algo.mask_truncated:
            loss_rows &= ~ro.truncated
        batch = {"tokens": tokens, "prompt_pad": pad, "lengths": ro.lengths.astype(np.int32),
                 "old_logprobs": ro.logprobs[:, :n].astype(np.float32),
                 "ref_logprobs": np.zeros((rows, n), np.float32), "rewards": ro.rewards,
                 # Global group ids: this process's rows start at row_offset.
                 "group_ids": ((ro.row_offset + np.arange(rows)) // g).astype(np.int32),
                 "valid": ro.valid,
                 "loss_rows": loss_rows}
        return batch, lp, n

    def update(self, batch: dict[str, np.ndarray], num_groups: int, lp: int,
               n: int) -> dict[str, float]:
        rows = len(batch["lengths"]) * self.num_processes  # global rows
        shard = self.steps.batch_shardings(rows)
        if self.num_processes == 1:
            dev = {k: jax.device_put(np.asarray(batch[k]), shard[k]) for k in BATCH_FIELDS}
        else:
            ways = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
            if rows % ways:
                # A replicated batch cannot be assembled from host-local rows.
                raise ValueError(f"{rows} batch rows do not split over data x fsdp = {ways} "
                                 "devices; with several processes they must (see the dry run)")
            dev = {k: host_local_to_global(np.asarray(batch[k]), shard[k]) for k in BATCH_FIELDS}
        a = self.cfg.algo
        if a.beta > 0 or a.num_iterations > 1:
            logp_fn = self.steps.logprob_fn(rows, lp, n)
            if a.beta > 0:
                dev["ref_logprobs"] = logp_fn(self.ref_params, dev["tokens"], dev["prompt_pad"],
                                              dev["lengths"])
            if a.num_iterations > 1:
                # μ > 1: the ratio is against the policy that sampled, recomputed in full precision.
                dev["old_logprobs"] = logp_fn(self.params, dev["tokens"], dev["prompt_pad"],
                                              dev["lengths"])
        fn = self.steps.train_fn(rows, num_groups, lp, n)
        sums: dict[str, float] = {}
        for _ in range(a.num_iterations):
            self.params, self.opt_state, m = fn(self.params, self.opt_state, dev)
            m = {k: float(v) for k, v in m.items()}
            if m["finite"] < 1:
                return m
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / a.num_iterations
        return sums

    # ------------------------------------------------------------------ the loop
    def _install_signal_handlers(self):
        def handler(signum, frame):
            if self._stop:  # second Ctrl-C: stop now
                raise KeyboardInterrupt
            self._stop = True

        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in old:
            with contextlib.suppress(ValueError):  # not in the main thread
                signal.signal(s, handler)
        return old

    def _state(self, step: int) -> ckpt.TrainState:
        return ckpt.TrainState(step=step, params=self.params, opt_state=self.opt_state,
                               sagc=self.policy.state, data_iter=list(self.data_iters))

    def restore_or_init(self) -> str:
        """Resumes from the newest good checkpoint (run.resume), else runs the SFT warm start."""
        mode = self.cfg.run.resume
        # params + AdamW moments, twice over (a checkpoint being written while `keep` exist).
        param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.params))
        self.ckpt.check_writable(min_free_bytes=6 * param_bytes)
        restored = None
        if mode != "never":
            restored = self.ckpt.restore_latest(self._state(0), self.model_cfg)
        if restored is None:
            if mode == "required":
                raise FileNotFoundError(f"run.resume=required but no checkpoint in "
                                        f"{self.ckpt.directory}")
            if self.ckpt.latest_step() is not None and mode == "never":
                raise FileExistsError(f"{self.ckpt.directory} already holds checkpoints and "
                                      "run.resume=never; choose another run.dir")
            if self.cfg.init.params:
                self.params = ckpt.restore_params(self.cfg.init.params, self.params)
                self._sync_model()
                sft = []
            else:
                sft = self.sft_warm_start()
            self.ckpt.save_initial(self.params, self.model_cfg)
            self.ref_params = self.params if self.cfg.algo.beta > 0 else None
            if self.ref_params is not None:
                # The reference must survive donation of self.params in the train step.
                self.ref_params = jax.tree.map(lambda x: x.copy(), self.params)
            self.writer.resume_from(0)
            if sft:
                return f"fresh start; SFT loss {sft[0]:.3f} -> {sft[-1]:.3f}"
            return "fresh start"
        self.params, self.opt_state = restored.params, restored.opt_state
        self.policy.load_state(restored.sagc)
        self.start_step = restored.step
        if self.cfg.algo.beta > 0:
            self.ref_params = self.ckpt.restore_initial(self.params)
        self._sync_model()
        self.writer.resume_from(self.start_step)
        return f"resumed from step {self.start_step}"

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
        how = self.restore_or_init()
        self._log(f"{how}; model {self.model_cfg.num_params() / 1e6:.2f}M params, "
                  f"mesh {dict(self.mesh.shape)}")
        compile_s = self.warm_up()
        self._log(f"compiled {len(self.sampler.shapes)} sampler shapes and the train steps in "
                  f"{compile_s:.1f}s")
        if self.eval_sampler is not None and self.start_step == 0:
            acc = self.eval_greedy()
            self._log(f"held-out greedy accuracy before GRPO: {acc:.3f} "
                      f"({len(self.eval_examples)} problems)")
            if self.is_main:
                (self.run_dir / "eval_initial.json").write_text(
                    json.dumps({"step": 0, "eval_accuracy": acc}) + "\n")
        old_handlers = self._install_signal_handlers()
        last = None
        bar = _progress(range(self.start_step, cfg.run.steps),
                        enabled=self.progress and self.is_main, desc="GRPO",
                        initial=self.start_step, total=cfg.run.steps)
        step = self.start_step
        try:
            for step in bar:
                row = self._guarded_step(step)
                last = row
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(reward=f"{row['reward_mean']:.3f}", G=row["group_size"],
                                    strag=f"{row['straggler_rate']:.2f}",
                                    s_step=f"{row['step_s']:.2f}")
                elif self.is_main and (step + 1) % cfg.run.log_every == 0:
                    self._log(f"step {step + 1}: reward {row['reward_mean']:.3f} "
                              f"G={row['group_size']} strag {row['straggler_rate']:.2f} "
                              f"{row['step_s']:.2f}s")
                done = step + 1
                if self._stop:
                    self.ckpt.save(done, self._state(done), force=True)
                    self._log(f"stopped by signal after step {done}; checkpoint saved")
                    break
                self.ckpt.save(done, self._state(done), force=done == cfg.run.steps)
        finally:
            self.ckpt.wait()
            for s, h in old_handlers.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(s, h)
            self.writer.close(plots=cfg.run.plots)
        return last or {}

    def eval_greedy(self) -> float:
        """Greedy accuracy (first reward fn >= 0.5) on the held-out examples."""
        from sagc_jax.data.tokenizer import encode_prompt

        correct, total = 0, 0
        ex = self.eval_examples
        for i in range(0, len(ex), 64):
            batch = ex[i:i + 64]
            ids = [encode_prompt(self.tokenizer, e["prompt"], self.cfg.data.chat_template)
                   for e in batch]
            out = self.eval_sampler.generate(ids, group_size=1, key=self._rng_key(0, 0),
                                             greedy=True, params=self.params)
            comps = [decode_completion(self.tokenizer, r[:n])
                     for r, n in zip(out.tokens, out.lengths)]
            res = self._rewards(batch, 1, comps)
            first = res.per_fn[self.reward_fns[0].name]
            correct += int((first >= 0.5).sum())
            total += len(batch)
        return correct / max(total, 1)

    def _guarded_step(self, step: int) -> dict[str, Any]:
        """Runs one step; if it fails (a reward fn raises, bad data, non-finite loss) the state
        from before the step — params, optimizer, SAGC, data position — is checkpointed first,
        so a fixed run resumes exactly where this one stopped."""
        data_states = [it.get_state() for it in self.data_iters]
        sagc_state = {k: np.copy(v) for k, v in self.policy.state.items()}
        try:
            return self.train_one(step)
        except Exception as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            for it, st in zip(self.data_iters, data_states):
                it.set_state(st)
            self.policy.load_state(sagc_state)
            self.ckpt.save(step, self._state(step), force=True)
            self.ckpt.wait()
            where = f"state before step {step + 1} saved in {self.ckpt.directory}"
            if isinstance(e, TrainingError):
                raise TrainingError(f"{e} ({where})") from e
            raise TrainingError(f"step {step + 1} failed: {type(e).__name__}: {e} ({where})") from e

    def train_one(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        t_step = time.perf_counter()
        c0 = compile_count()
        g = self.policy.choose()
        if self.num_processes > 1 and cfg.sagc.timing != "model":
            # Measured timings differ per host; process 0 decides (the states are kept equal by
            # broadcasting its seconds in `_observation`, this is the belt to those braces).
            g = int(broadcast_from_main(np.int32(g)))
        num_prompts = self.prompts_per_g[g]
        t0 = time.perf_counter()
        ro = self.collect(step, g, num_prompts)
        rollout_s = time.perf_counter() - t0
        gv, plen = self._global_view(ro)
        buckets = None
        if self.num_processes > 1:
            buckets = (self.sampler.prompt_bucket_for(plen),
                       _bucket(max(int(gv.lengths.max()), 1), self.completion_buckets))
        batch, lp, n = self.make_batch(ro, buckets)
        t0 = time.perf_counter()
        m = self.update(batch, num_prompts, lp, n)
        train_s = time.perf_counter() - t0
        if m.get("finite", 1.0) < 1:
            raise TrainingError(
                f"non-finite loss or gradient at step {step + 1} (loss={m.get('loss')}, "
                f"grad_norm={m.get('grad_norm')}); params were not updated. Lower optim.lr or "
                "check the rewards")
        sagc_m = self.policy.observe(ro.first_round)
        self._sync_model()
        ro = gv  # metrics and the trace describe the global rollout
        v = ro.valid
        lens = ro.lengths[v] if v.any() else ro.lengths
        row = {
            "step": step + 1, "group_size": g, "prompts": num_prompts, "rows": len(ro.lengths),
            "reward_mean": float(ro.raw_rewards[v].mean()) if v.any() else 0.0,
            "reward_std": float(ro.raw_rewards[v].std()) if v.any() else 0.0,
            "shaped_reward_mean": float(ro.rewards[v].mean()) if v.any() else 0.0,
            "len_mean": float(lens.mean()), "len_max": int(ro.lengths.max()),
            "truncated_frac": float(ro.truncated.mean()),
            "kept_groups": int(v.sum() // g), "rollout_rounds": ro.stats["rollout_rounds"],
            "reward_errors": ro.reward_errors,
            "padding_waste": int(ro.stats["padding_waste"]),
            "decode_steps": int(ro.stats["decode_steps"]), "train_len": n, "prompt_len": lp,
            "lr": float(self.lr_schedule(step)),
            **{k: m[k] for k in ("loss", "pg_loss", "kl", "grad_norm", "clip_ratio",
                                 "ratio_mean", "adv_abs_mean", "entropy",
                                 "frac_reward_zero_std") if k in m},
            **sagc_m,
            "prefill_s": ro.stats["prefill_s"], "decode_s": ro.stats["decode_s"],
            "reward_s": ro.stats["reward_s"], "rollout_s": rollout_s, "train_s": train_s,
        }
        ev = cfg.run.eval_every
        if self.eval_sampler is not None and ((step + 1) % ev == 0
                                              or step + 1 == cfg.run.steps):
            t0 = time.perf_counter()
            row["eval_accuracy"] = self.eval_greedy()
            row["eval_s"] = time.perf_counter() - t0
        row["compiles"] = compile_count() - c0
        row["step_s"] = time.perf_counter() - t_step
        trace = {"step": step + 1, "group_size": g, "max_new_tokens": cfg.sampling.max_new_tokens,
                 "groups": [{"lengths": ro.lengths[i * g:(i + 1) * g].tolist(),
                             "truncated": ro.truncated[i * g:(i + 1) * g].tolist(),
                             "rewards": ro.raw_rewards[i * g:(i + 1) * g].round(6).tolist()}
                            for i in range(num_prompts) if ro.valid[i * g]]}
        self.writer.write(row, trace)
        return row

    def _log(self, msg: str) -> None:
        if self.is_main:
            print(f"[sagc-jax] {msg}", flush=True)


def summarize(rows: list[dict[str, Any]], window: int = 10) -> dict[str, float]:
    """First/last-window means of the headline metrics (for the README and the CLI)."""
    def mean(key: str, part: list) -> float:
        vals = [r[key] for r in part if isinstance(r.get(key), (int, float))]
        return float(np.mean(vals)) if vals else math.nan

    first, last = rows[:window], rows[-window:]
    out = {}
    for key in ("reward_mean", "len_mean", "group_size", "straggler_rate", "step_s"):
        out[f"{key}_first"] = mean(key, first)
        out[f"{key}_last"] = mean(key, last)
    out["compiles_after_warmup"] = float(sum(r.get("compiles", 0) for r in rows))
    return out


__all__ = ["Trainer", "TrainingError", "build_model", "summarize"]
