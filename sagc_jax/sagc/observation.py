"""What SAGC observes of a step: `observation_from(rollout)` -> `Observation`.

The controller sees the first sampling round over all processes (lengths, truncated flags, raw
rewards) and its seconds. With `sagc.timing: model` the seconds come from the linear time model
instead of the clock, so decisions are reproducible (exact resume, seed-for-seed comparisons).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sagc_jax.sagc.controller import Observation
from sagc_jax.sagc.timing import TimeModel


def observation_from(rollout: Any, sagc_cfg: Any, *, max_new_tokens: int, decode_chunk: int,
                     agree_seconds: Any = None) -> Observation:
    """The `Observation` of `rollout.first_round` (a `rollout.FirstRound`).

    `agree_seconds(prefill_s, decode_s) -> (prefill_s, decode_s)` makes measured seconds equal
    on every process (process 0's), so the SAGC state and the next G stay identical everywhere.
    """
    fr = rollout.first_round
    g = rollout.group_size
    rows, steps = fr.prompts * g, int(fr.decode_steps)
    env_s = 0.0  # the model clock prices the accelerator: host-side environment time is not
    if sagc_cfg.timing == "model":  # reproducible, so it counts only on the measured clock
        tm = TimeModel.from_sagc(sagc_cfg)
        prefill_s, decode_s = tm.prefill_s(rows), steps * tm.decode_step_s(rows)
    else:
        prefill_s, decode_s, env_s = float(fr.prefill_s), float(fr.decode_s), float(fr.env_s)
        if agree_seconds is not None:
            prefill_s, decode_s = agree_seconds(prefill_s, decode_s)
    return Observation(
        group_size=g, lengths=np.asarray(fr.lengths), truncated=np.asarray(fr.truncated),
        rewards=np.asarray(fr.rewards), max_new_tokens=max_new_tokens, prefill_s=prefill_s,
        decode_s=decode_s, decode_steps=steps, rows=rows, prompts=fr.prompts,
        decode_chunk=decode_chunk, env_s=env_s)
