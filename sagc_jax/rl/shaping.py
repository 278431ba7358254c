"""DAPO reward shaping for over-long completions (host-side NumPy); the masking of truncated
completions (`algo.mask_truncated`) is the `loss_rows` of `rl.batch.make_batch`.

References: DAPO (Yu et al., 2025), §3.4 "Overlong Reward Shaping": soft overlong punishment and
overlong filtering (masking truncated samples out of the loss).
"""

from __future__ import annotations

import jax
import numpy as np


def overlong_penalty(
    lengths: np.ndarray | jax.Array, max_new_tokens: int, buffer: int, penalty: float = 1.0
) -> np.ndarray:
    """DAPO soft overlong punishment, to be *added* to the task reward.

    With ``L_max = max_new_tokens`` and ``L_exp = L_max − buffer``::

        0                                   if L ≤ L_exp
        −penalty · (L − L_exp) / buffer      if L_exp < L ≤ L_max   (linear ramp)
        −penalty                            if L > L_max            (can't happen when capped)

    Args:
        lengths: ``int[R]`` generated completion lengths in tokens (EOS included, prompt excluded).
        max_new_tokens: generation cap ``L_max`` in tokens.
        buffer: ramp width ``L_cache`` in tokens; 0 disables shaping (all zeros).
        penalty: penalty magnitude at the cap (reward units); DAPO uses 1.

    Returns:
        ``f32[R]`` non-positive penalties.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer < 0 or buffer > max_new_tokens:
        raise ValueError(f"buffer must be in [0, max_new_tokens={max_new_tokens}], got {buffer}")
    if buffer == 0:
        return np.zeros(lengths.shape, np.float32)
    over = np.clip((lengths - (max_new_tokens - buffer)) / buffer, 0.0, 1.0)
    return (-penalty * over).astype(np.float32)
