"""XLA's own memory plan for the real programs, compiled from abstract arrays (no weights).

:func:`compiled_memory` lowers and compiles the train step and the sampler's prefill and decode
programs at the largest shapes of a run, on a real mesh (fake CPU devices do: see
``sagc_jax.fakepod``), from ``jax.ShapeDtypeStruct`` inputs that carry the trainer's shardings;
nothing is allocated. ``compiled.memory_analysis()`` then gives, per device, the bytes of the
arguments, outputs, aliased (donated) buffers and temporaries of each program.

Per-device peak of a run (the phases do not overlap):
- train: ``arguments + outputs - aliased + temporaries`` of the train step's grad program at its
  largest chunk of the one train layout (``ShapePlan.train_layout``, built as the trainer does:
  ``train.learner.Learner``; its arguments hold the params, the gradient accumulator and
  the batch), plus
  the AdamW state, which stays on the device but is an argument of the apply program only;
- sampling: the same sum for prefill and for decode (params, KV cache, logits...), plus the
  AdamW state, which stays on the device during sampling but is not an argument of those programs;
- plus a frozen reference copy of the params when ``algo.beta > 0``.

XLA:CPU's buffer assignment is what this measures; a GPU/TPU backend fuses and schedules
differently, so treat it as a second opinion beside the hand estimate of ``sagc_jax.dryrun``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.lora import trainable
from sagc_jax.models.sharding import opt_state_shardings, state_shardings

__all__ = ["ProgramMemory", "abstract_train_state", "compiled_memory", "train_step_memory"]


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """``memory_analysis()`` of one compiled program, bytes per device."""

    name: str
    shape: str
    argument: int
    output: int
    alias: int
    temp: int
    compile_s: float

    @property
    def total(self) -> int:
        """Live bytes while the program runs: inputs + outputs (less donated) + temporaries."""
        return self.argument + self.output - self.alias + self.temp

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total": self.total}


def _measure(name: str, shape: str, lowered_fn) -> ProgramMemory:
    t0 = time.perf_counter()
    compiled = lowered_fn().compile()
    dt = time.perf_counter() - t0
    m = compiled.memory_analysis()
    return ProgramMemory(name, shape, int(m.argument_size_in_bytes),
                         int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                         int(m.temp_size_in_bytes), dt)


def _with_shardings(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def abstract_train_state(mcfg: ModelConfig, mesh: Mesh, optimizer) -> dict[str, Any]:
    """Abstract params and AdamW state with the trainer's shardings (nothing allocated).

    Returns ``{"graphdef", "params", "param_shardings", "opt_state", "opt_shardings"}``;
    ``params`` / ``opt_state`` are trees of ``jax.ShapeDtypeStruct`` carrying shardings.
    """
    model = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model)
    p_shard = state_shardings(params, mesh)
    params = _with_shardings(params, p_shard)
    # With LoRA only the adapters carry optimizer state, as in the trainer (train/setup.py).
    opt_abs = jax.eval_shape(optimizer.init, trainable(params))
    o_shard = opt_state_shardings(optimizer, opt_abs, trainable(p_shard), mesh)
    return {"graphdef": graphdef, "params": params, "param_shardings": p_shard,
            "opt_state": _with_shardings(opt_abs, o_shard), "opt_shardings": o_shard}


def _bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shard) * x.dtype.itemsize
    return total


def train_step_memory(state: dict[str, Any], mesh: Mesh, optimizer, settings: Any,
                      layout: Any) -> ProgramMemory:
    """Compile the train step's grad program at the largest chunk of ``layout`` (a
    ``shapes.TrainLayout``, the run's ``ShapePlan.train_layout``), as the trainer builds it
    (``train.learner.Learner``).

    ``state`` is :func:`abstract_train_state`'s result for ``optimizer``; ``settings`` the
    run's ``LossSettings`` (``LossSettings.from_config``).
    """
    from sagc_jax.train.learner import Learner

    learner = Learner(state["graphdef"], optimizer, settings, mesh, state["param_shardings"],
                      state["opt_shardings"], layout)
    c = max(layout.chunk_sizes)
    return _measure("train_step", f"rows={layout.seqs} chunk={c}x{layout.pack_len}",
                    lambda: learner.lower("grad", c, state["params"], state["opt_state"]))


def sft_step_memory(cfg: Any, state: dict[str, Any], mesh: Mesh) -> ProgramMemory:
    """Compile the SFT warm start's step (``train/sft.py``) at ``init.sft_batch_size`` rows of
    the longest SFT sequence: its arguments hold the params and its own AdamW state (the
    base's), both donated."""
    from sagc_jax.models.lora import BASE
    from sagc_jax.optim import make_sft_optimizer, sft_seq_len
    from sagc_jax.rl.train_step import make_sft_step

    opt = make_sft_optimizer(cfg.init)
    p_shard = state["param_shardings"]
    base = nnx.split_state(state["params"], BASE, ...)[0]
    opt_abs = jax.eval_shape(opt.init, base)
    o_shard = opt_state_shardings(opt, opt_abs, nnx.split_state(p_shard, BASE, ...)[0], mesh)
    step = jax.jit(make_sft_step(state["graphdef"], opt), in_shardings=(p_shard, o_shard, None,
                   None), out_shardings=(p_shard, o_shard, None), donate_argnums=(0, 1))
    rows, seq = cfg.init.sft_batch_size, sft_seq_len(cfg)
    tok = jax.ShapeDtypeStruct((rows, seq), jnp.int32)
    return _measure("sft_step", f"rows={rows} x {seq} tokens",
                    lambda: step.lower(state["params"], _with_shardings(opt_abs, o_shard), tok,
                                       tok))


def _sampler_programs(cfg: Any, mcfg: ModelConfig, mesh: Mesh, plan: Any, g: int,
                      lp: int) -> list[ProgramMemory]:
    from sagc_jax.sampling import SamplingConfig
    from sagc_jax.sampling.sampler import Sampler

    model = nnx.eval_shape(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(model, SamplingConfig.from_plan(plan, cfg.sampling), pad_id=0, mesh=mesh)
    shape = next(x for x in sampler.shapes if (x.group_size, x.prompt_bucket) == (g, lp))
    desc = f"G={g} rows={shape.rows} Lp={lp} cache={shape.cache_bucket}"
    return [_measure(name, desc, lambda fn=fn, args=args, kw=kw: fn.lower(*args, **kw))
            for name, (fn, args, kw) in zip(("prefill", "decode"),
                                            sampler._abstract_calls(shape))]


def compiled_memory(cfg: Any, mcfg: ModelConfig, mesh: Mesh, *, plan: Any) -> dict[str, Any]:
    """Compile the largest train-step and sampler shapes of ``cfg`` on ``mesh``; per device.

    Args:
      cfg: the run config (``sampling``, ``algo``, ``optim``, ``run.steps``).
      mcfg: the architecture (its ``param_dtype`` / ``remat`` apply).
      mesh: a concrete mesh (fake CPU devices are fine).
      plan: the run's ``shapes.ShapePlan`` (G -> prompts, buckets, the train layout).

    Returns:
      ``{"programs": [ProgramMemory.as_dict()...], "opt_state", "params", "train_peak",
      "sampler_peak", "reference", "peak", "compile_s"}``: the train step's largest chunk of
      the one layout, the sampler's G with the most rows at the longest prompt bucket.
    """
    from sagc_jax.optim import make_optimizer
    from sagc_jax.rl.train_step import LossSettings

    optimizer = make_optimizer(cfg.optim, cfg.run.steps)
    state = abstract_train_state(mcfg, mesh, optimizer)
    ppg = plan.prompts_per_g
    g = max(ppg, key=lambda k: (ppg[k] * k, k))
    lp = max(plan.prompt_buckets)
    progs = [train_step_memory(state, mesh, optimizer, LossSettings.from_config(cfg),
                               plan.train_layout)]
    progs += _sampler_programs(cfg, mcfg, mesh, plan, g, lp)
    sft = (sft_step_memory(cfg, state, mesh)
           if cfg.init.sft_steps > 0 and not cfg.init.params else None)
    opt_b, param_b = _bytes_per_device(state["opt_state"]), _bytes_per_device(state["params"])
    ref = param_b if cfg.algo.beta > 0 else 0
    train_peak = progs[0].total + opt_b  # the optimizer state stays on device, not an argument
    sampler_peak = max(p.total for p in progs[1:]) + opt_b
    # The warm start's program holds the params and its own AdamW state; the GRPO optimizer
    # state exists already (train/setup.py builds it first), the KL reference not yet.
    sft_total = sft.total + opt_b if sft else 0
    progs += [sft] if sft else []
    return {"programs": [p.as_dict() for p in progs], "opt_state": opt_b, "params": param_b,
            "train_peak": train_peak, "sampler_peak": sampler_peak, "reference": ref,
            "sft_total": sft_total, "peak": max(max(train_peak, sampler_peak) + ref, sft_total),
            "compile_s": sum(p.compile_s for p in progs)}
