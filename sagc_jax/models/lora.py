"""LoRA on the stacked decoder weights: adapter params, the adapter math, trainable/frozen split.

Our layer weights are stacked raw `nnx.Param`s ([L, in, out], run under a layer scan), so
`nnx.LoRA` / `nnx.LinearGeneral` modules do not drop in. The adapters are Flax NNX's own
`nnx.LoRAParam` variables stored next to the weight they adapt, stacked the same way:

    layers.{name}_lora_a  [L, in, r]   (PEFT's kaiming-uniform init, bound 1/sqrt(in))
    layers.{name}_lora_b  [L, r, out]  (zeros: a fresh adapter leaves the model unchanged)

y = x @ W + (alpha / r) * (x @ A) @ B. The variable type is the filter: `nnx.LoRAParam` is
trainable, every other `nnx.Param` frozen (`split_trainable`). Adapters are stored float32
whatever `model.param_dtype` is (they are small and trained).

Where the math runs:
- training forward / log-prob passes / prefill: unmerged (`dense`): no weight-gradient matmul
  for the frozen W (x^T dy, T x in x out flops) and the adapter delta is never rounded into a
  bfloat16 W;
- sampler decode: merged once per decode call (`merge_lora`, L x in x out x r flops) before the
  token loop, which then reads plain weights (decode.py's hot loop is unchanged).
Adapters off (the KL reference) = adapters set to zero (`disable_adapters`): exactly the base model,
sharing the base's arrays (no second copy of the weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.models.precision import matmul

# Stacked weights of models/llama.py an adapter may target (HF module names).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"
# Frozen part of the model when adapters are trained; the SFT warm start trains it.
BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))


def check_targets(targets: Iterable[str]) -> tuple[str, ...]:
    """The targets as a tuple; ValueError naming an unknown one."""
    targets = tuple(targets)
    for t in targets:
        if t not in LORA_TARGETS:
            raise ValueError(f"LoRA target '{t}' is not a layer weight; known: "
                             f"{', '.join(LORA_TARGETS)}")
    if len(set(targets)) != len(targets) or not targets:
        raise ValueError(f"LoRA targets must be distinct and non-empty, got {list(targets)}")
    return targets


def add_lora(layers: nnx.Module, targets: Iterable[str], rank: int, rngs: nnx.Rngs) -> None:
    """Adds A [L, in, r] (kaiming-uniform, PEFT's default) and B [L, r, out] (zeros) float32
    `nnx.LoRAParam`s beside each targeted stacked weight of `layers` (a `DecoderLayers`)."""
    # variance_scaling(1/3, fan_in, uniform) = U(-1/sqrt(in), 1/sqrt(in)): torch's
    # kaiming_uniform_(a=sqrt(5)), which PEFT uses for lora_A. Axis 0 (layers) is a batch axis.
    init_a = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=-2,
                                               out_axis=-1, batch_axis=(0,))
    for t in check_targets(targets):
        L, d_in, d_out = getattr(layers, t).shape
        setattr(layers, t + A_SUFFIX,
                nnx.LoRAParam(init_a(rngs.params(), (L, d_in, rank), jnp.float32)))
        setattr(layers, t + B_SUFFIX, nnx.LoRAParam(jnp.zeros((L, rank, d_out), jnp.float32)))


def dense(x: jax.Array, p: Mapping[str, jax.Array], name: str, scale: float,
          dtype: str | None = None) -> jax.Array:
    """x [..., in] @ weight `name` of one layer's params `p`, plus its adapter when `p` has one:
    x @ W + scale * (x @ A) @ B -> [..., out]. `dtype`: the base product's operand dtype
    (`model.matmul_dtype`, `precision.matmul`); the rank-r adapter product stays in x's."""
    y = matmul(x, p[name], dtype)
    a = p.get(name + A_SUFFIX)
    if a is None:
        return y
    return y + ((x @ a) @ p[name + B_SUFFIX]) * jnp.asarray(scale, y.dtype)


def merge_lora(layer_params: Mapping[str, jax.Array], scale: float) -> dict[str, jax.Array]:
    """Effective weights W + scale * A @ B for every adapted weight, adapter entries dropped.

    Works per layer (W [in, out], A [in, r], B [r, out]) or stacked ([L, ...], batched matmul);
    the sum is in W's dtype.
    """
    out = {k: v for k, v in layer_params.items() if not k.endswith((A_SUFFIX, B_SUFFIX))}
    for k in list(out):
        a = layer_params.get(k + A_SUFFIX)
        if a is not None:
            w = out[k]
            delta = jnp.matmul(a.astype(jnp.float32), layer_params[k + B_SUFFIX].astype(
                jnp.float32)) * scale
            out[k] = (w.astype(jnp.float32) + delta).astype(w.dtype)
    return out


def has_lora(params: Any) -> bool:
    """Whether an `nnx.State` of the model holds adapter params (static under jit)."""
    return bool(jax.tree.leaves(nnx.split_state(params, nnx.LoRAParam, ...)[0]))


def split_trainable(params: Any) -> tuple[Any, Any]:
    """(trainable, frozen) `nnx.State`s: the adapters and the rest when the model has adapters,
    else every param and an empty state. `nnx.merge_state(trainable, frozen)` rejoins them."""
    if has_lora(params):
        return nnx.split_state(params, nnx.LoRAParam, ...)
    return nnx.split_state(params, nnx.Param, ...)


def trainable(params: Any) -> Any:
    """The part of `params` (or of a same-structure tree of shardings) the optimizer updates."""
    return split_trainable(params)[0]


def adapter_zeros(params: Any) -> Any:
    """Zeros shaped and placed like `params`' adapters (an `nnx.State`; empty without any).
    Built on the host: no compile, so none shows up after the warm-up."""
    lora = nnx.split_state(params, nnx.LoRAParam, ...)[0]
    return jax.tree.map(lambda x: jax.device_put(np.zeros(x.shape, x.dtype), x.sharding), lora)


def disable_adapters(params: Any, zeros: Any = None) -> Any:
    """`params` with every adapter (A and B) set to zero (`zeros`: from `adapter_zeros`, made
    when None): the base model exactly, sharing the base's arrays. Identity for a model without
    adapters."""
    lora, rest = nnx.split_state(params, nnx.LoRAParam, ...)
    if not jax.tree.leaves(lora):
        return params
    return nnx.merge_state(adapter_zeros(params) if zeros is None else zeros, rest)


def checkpointed(params: Any) -> Any:
    """What a run checkpoint stores of `params`: the adapters when the model has them (the
    frozen base is rebuilt from its source), else every param."""
    return nnx.split_state(params, nnx.LoRAParam, ...)[0] if has_lora(params) else params


def with_base(adapters: Any, params: Any) -> Any:
    """`params` (any state of the same model: its base is kept) with `adapters` put in."""
    return nnx.merge_state(adapters, nnx.split_state(params, nnx.LoRAParam, ...)[1])


def lora_scale(cfg: Any) -> float:
    """alpha / r of a ModelConfig (0 without adapters)."""
    return cfg.lora_alpha / cfg.lora_rank if cfg.lora_rank else 0.0
