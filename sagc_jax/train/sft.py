"""Supervised warm start on the task's reference solutions (`init.sft_steps`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.data.pipeline import make_sft_batches
from sagc_jax.models.lora import BASE
from sagc_jax.optim import make_sft_optimizer, sft_seq_len
from sagc_jax.rl.train_step import make_sft_step
from sagc_jax.train.state import init_opt_state


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


def progress_bar(iterable, *, enabled: bool, **kw):
    """tqdm over `iterable` when enabled, else `iterable` itself."""
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, **kw)


def sft_warm_start(cfg: Any, params: Any, *, graphdef: nnx.GraphDef, param_shardings: Any,
                   mesh: Mesh, examples: Sequence, tokenizer: Any, progress: bool = False,
                   check: Callable[[str], None] | None = None) -> tuple[Any, list[float]]:
    """(params after `init.sft_steps` AdamW steps, the loss every 25 steps). `params` is
    donated. Sequences are cut at the largest prompt bucket + max_new_tokens. `check(where)` is
    called before every step (a pending Ctrl-C stops there: `StopFlag.check`)."""
    n = cfg.init.sft_steps
    if n == 0:
        return params, []
    opt = make_sft_optimizer(cfg.init)
    # The base only (`lora.BASE`): with LoRA, the warm start is the frozen base's.
    opt_state, opt_shard = init_opt_state(opt, nnx.split_state(params, BASE, ...)[0], mesh)
    step = jax.jit(make_sft_step(graphdef, opt),
                   in_shardings=(param_shardings, opt_shard, None, None),
                   out_shardings=(param_shardings, opt_shard, None), donate_argnums=(0, 1))
    seq_len = sft_seq_len(cfg)
    if cfg.init.sft_format_noise > 0:
        examples = FormatNoise(examples, cfg.init.sft_format_noise, cfg.warm_start_seed)
    batches = make_sft_batches(examples, tokenizer=tokenizer, batch_size=cfg.init.sft_batch_size,
                               seed=cfg.warm_start_seed + 1, num_epochs=None,
                               chat_template=cfg.data.chat_template,
                               pad_multiple=32)  # few distinct lengths = few compiles
    losses: list[float] = []
    bar = progress_bar(range(n), enabled=progress, desc="SFT warm start")
    for i, batch in zip(bar, batches):
        if check is not None:
            check(f"during the SFT warm start (step {i + 1} of {n}; nothing saved yet)")
        tokens = batch["tokens"][:, :seq_len]
        params, opt_state, loss = step(params, opt_state, tokens, batch["loss_mask"][:, :seq_len])
        if i % 25 == 0 or i == n - 1:
            losses.append(float(loss))
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return params, losses
