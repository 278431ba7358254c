"""One-token decode step over per-layer KV buffers with shared-prompt (prefix) attention.

The sampler's hot loop. Decode reads every weight and every cached key/value once per step, so
the layout is chosen for that read:
- Per-layer buffers (tuples of L arrays), so each layer's in-place update aliases its own
  buffer and attention reads it as stored. A stacked `[L, ...]` cache sliced per layer inside a
  layer scan materialised a copy of each layer's K and V every step on XLA:CPU.
- Shared prefix: a prompt's K/V is kept once per prompt (`PrefixKV`, [P, ...]); only the
  generated tokens' K/V is per row (`GenKV`, [P*G, ...]). Row r belongs to prompt r // G.
  Scores over both parts share one softmax.
- Keys are stored d-major ([.., D, S]) and values slot-major ([.., S, D]): both attention
  products then reduce over a non-minor axis with a contiguous minor axis, which XLA:CPU
  vectorises (scores from a [.., S, D] key layout ran ~3x slower).
The decode loop body is unrolled over layers (weights split once per call by
`decode_weights`); compile time per layer is measured in benchmarks/README.md.
- Sliding-window layers (Gemma 3) see keys less than `sliding_window` positions back, so their
  memory is bounded by the window whatever the prompt and completion lengths: the prefix keeps
  the prompt's last W - 1 slots (`kept_prefix`), the generated part is a ring of W slots
  (`gen_slots`; token t lives at slot t % W). Global layers keep everything.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.llama import Transformer, block_tail, embed_tokens, norm, project_qkv, softcap
from sagc_jax.models.lora import lora_scale, merge_lora
from sagc_jax.models.rope import layer_inv_frequencies

_NEG_INF = -1e30


class PrefixKV(NamedTuple):
    """Prompt keys/values once per prompt: k per layer [P, K, D, Lp], v per layer [P, K, Lp, D]."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


class GenKV(NamedTuple):
    """Generated keys/values per row: k per layer [R, K, D, M], v per layer [R, K, M, D]."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


class DecodeWeights(NamedTuple):
    """Weights in compute dtype (LoRA merged), split per layer once per call (not inside the
    decode loop)."""

    embed: jax.Array  # [V, H]
    layers: tuple[dict[str, jax.Array], ...]
    final_norm: jax.Array  # [H]
    head: jax.Array  # [H, V]


def decode_weights(model: Transformer) -> DecodeWeights:
    """The decode loop's weights. The matrices it reads (layer kernels, LM head) are cast once
    to `cfg.matmul_dtype` (None = `cfg.dtype`); norms, biases and the embedding gather stay in
    `cfg.dtype`. A bfloat16 copy under a float32 model halves the bytes a decode step reads;
    `precision.matmul` then rounds activations to bf16 at each matmul and accumulates in
    float32, as the training forward does."""
    cfg = model.cfg
    dt = jnp.dtype(cfg.dtype)
    wdt = jnp.dtype(cfg.matmul_dtype or dt)
    # LoRA adapters are merged here, once per call, so the token loop reads plain weights.
    stacked = merge_lora(nnx.to_pure_dict(nnx.state(model.layers)), lora_scale(cfg))
    # Stacked kernels are [L, in, out]; norms and biases [L, n].
    stacked = {k: v.astype(wdt if v.ndim == 3 else dt) for k, v in stacked.items()}
    layers = tuple({k: v[i] for k, v in stacked.items()} for i in range(cfg.num_layers))
    embed = model.embed[...]
    head = embed.T if cfg.tie_word_embeddings else model.lm_head[...]
    return DecodeWeights(embed, layers, model.final_norm[...], head.astype(wdt))


def kept_prefix(cfg: ModelConfig | None, layer: int, lp: int) -> int:
    """Prompt slots layer `layer` keeps for decode out of a left-padded prompt of `lp` slots:
    all on a global layer; on a sliding one the last W - 1 (the first decode query, generated
    slot 0, is W - 1 positions past the oldest prompt key it can see), at least 1."""
    if cfg is None or not cfg.sliding_layers[layer]:
        return lp
    return min(lp, max(cfg.sliding_window - 1, 1))


def gen_slots(cfg: ModelConfig, layer: int, slots: int) -> int:
    """Generated-token slots of layer `layer`: `slots` on a global layer, a ring of at most W on a
    sliding one (a query sees its own slot and the W - 1 before it)."""
    return min(slots, cfg.sliding_window) if cfg.sliding_layers[layer] else slots


def kv_layer_slots(cfg: ModelConfig, prompt_slots: int, cache_slots: int) -> int:
    """Key/value slots a row holds over all layers while decoding a `prompt_slots` prompt into a
    `cache_slots` cache (prompt + generated): L * cache_slots without sliding layers; a sliding
    layer holds `kept_prefix` + `gen_slots`. The dry run's KV bytes are this times
    kv_heads * head_dim * 2 (K and V) * dtype bytes."""
    new = cache_slots - prompt_slots
    return sum(kept_prefix(cfg, i, prompt_slots) + gen_slots(cfg, i, new)
               for i in range(cfg.num_layers))


def prefix_from_prefill(k: jax.Array, v: jax.Array, cfg: ModelConfig | None = None) -> PrefixKV:
    """Prefill's stacked k, v [L, P, K, Lp, D] -> per-layer `PrefixKV` (keys d-major); with `cfg`,
    a sliding layer keeps only its last `kept_prefix` slots."""
    lp = k.shape[3]
    keep = [kept_prefix(cfg, i, lp) for i in range(k.shape[0])]
    return PrefixKV(tuple(jnp.swapaxes(k[i, :, :, lp - n:], -1, -2) for i, n in enumerate(keep)),
                    tuple(v[i, :, :, lp - n:] for i, n in enumerate(keep)))


def init_gen(cfg: ModelConfig, rows: int, slots: int) -> GenKV:
    """Zeroed generated-token buffers for `slots` decode steps (sliding layers: `gen_slots`)."""
    dt = jnp.dtype(cfg.dtype)
    kd, d = cfg.num_kv_heads, cfg.head_dim
    n = [gen_slots(cfg, i, slots) for i in range(cfg.num_layers)]
    return GenKV(tuple(jnp.zeros((rows, kd, d, m), dt) for m in n),
                 tuple(jnp.zeros((rows, kd, m, d), dt) for m in n))


# ---- T=1 attention products: the one place that picks the form per backend ------------------

def _multiply_reduce(m: int) -> bool:
    """Broadcast-multiply-and-reduce instead of a batched `dot` for m query rows per kv head.

    XLA:CPU lowers small batched dots (m of a few rows against one layer's cache) to a generic
    loop that reads K/V well below bandwidth; an elementwise product reduced over a non-minor
    axis is one vectorised fusion that streams K/V once. With many rows per kv head (a shared
    prefix seen by G rows) the dot is a real matmul and wins. On GPU/TPU the dot (cuBLAS / MXU
    batched matmul) is kept: not measured on a GPU in this change.
    """
    return jax.default_backend() == "cpu" and m <= 16


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
    """q [..., M, D], k [..., D, S] (d-major) -> [..., M, S] float32."""
    if _multiply_reduce(q.shape[-2]):
        return jnp.sum(q.astype(jnp.float32)[..., :, :, None] * k[..., None, :, :], axis=-2)
    return jnp.einsum("...md,...ds->...ms", q, k, preferred_element_type=jnp.float32)


def _weighted(p: jax.Array, v: jax.Array) -> jax.Array:
    """p [..., M, S] float32, v [..., S, D] -> [..., M, D] float32."""
    if _multiply_reduce(p.shape[-2]):
        return jnp.sum(p[..., :, :, None] * v[..., None, :, :], axis=-2)
    return jnp.einsum("...ms,...sd->...md", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32)


def decode_attention(q: jax.Array, pk: jax.Array, pv: jax.Array, prefix_mask: jax.Array,
                     gk: jax.Array, gv: jax.Array, t: jax.Array, group: int,
                     scale: float | None = None, cap: float | None = None,
                     window: int | None = None) -> jax.Array:
    """One query token per row over its prompt's prefix and its own generated slots [0, t].

    q [R, N, D]; pk [P, K, D, Lp], pv [P, K, Lp, D] (the last Lp slots of the left-padded
    prompt), prefix_mask [P, >= Lp] bool (its last Lp columns are used); gk [R, K, D, M],
    gv [R, K, M, D]; R = P * group. Returns [R, N*D] in q's dtype. Softmax in float32 over the
    prefix and generated scores together; scores times `scale` (default D ** -0.5), softcapped
    by `cap`. With `window` (a sliding layer) only keys less than `window` positions back are
    seen: the query sits at generated step t, so prefix slot s is Lp - s + t positions back,
    whatever the prompt's length; and the generated buffer is a ring (step j at slot j % M).
    """
    R, N, D = q.shape
    P, K, _, Lp = pk.shape
    hr = N // K
    scale = D ** -0.5 if scale is None else scale
    M = gk.shape[-1]
    prefix_mask = prefix_mask[:, prefix_mask.shape[1] - Lp:]
    if window is None:
        # t is one step for every row, or [R] (multi-turn episodes: each row at its own step).
        gen_ok = (jnp.arange(M) <= t if t.ndim == 0
                  else (jnp.arange(M)[None] <= t[:, None])[:, None, None, :])
    else:
        prefix_mask = prefix_mask & (Lp - jnp.arange(Lp) + t < window)[None]
        step = t - (t - jnp.arange(M)) % M  # the step ring slot r holds (negative: none yet)
        gen_ok = (step >= 0) & (t - step < window)
    # Prefix: the group's rows and heads of one kv head form the m = group * hr query rows.
    qp = q.reshape(P, group, K, hr, D).transpose(0, 2, 1, 3, 4).reshape(P, K, group * hr, D)
    sp = softcap(_scores(qp, pk) * scale, cap)
    sp = jnp.where(prefix_mask[:, None, None, :], sp, _NEG_INF)
    sp = sp.reshape(P, K, group, hr, Lp).transpose(0, 2, 1, 3, 4).reshape(R, K, hr, Lp)
    sg = softcap(_scores(q.reshape(R, K, hr, D), gk) * scale, cap)  # [R, K, hr, M]
    sg = jnp.where(gen_ok, sg, _NEG_INF)
    m = jnp.maximum(sp.max(-1), sg.max(-1))[..., None]
    ep, eg = jnp.exp(sp - m), jnp.exp(sg - m)
    den = ep.sum(-1) + eg.sum(-1)
    ep = ep.reshape(P, group, K, hr, Lp).transpose(0, 2, 1, 3, 4).reshape(P, K, group * hr, Lp)
    op = _weighted(ep, pv).reshape(P, K, group, hr, D).transpose(0, 2, 1, 3, 4)
    out = (op.reshape(R, K, hr, D) + _weighted(eg, gv)) / den[..., None]
    return out.reshape(R, N * D).astype(q.dtype)


def decode_step(cfg: ModelConfig, w: DecodeWeights, tokens: jax.Array, positions: jax.Array,
                prefix: PrefixKV, prefix_mask: jax.Array, gen: GenKV, t: jax.Array,
                group: int) -> tuple[jax.Array, GenKV]:
    """Feeds tokens [R] at positions [R] into generated slot t; returns (logits [R, V] f32, gen).

    Each layer writes its new key/value into its own buffers in place, then attends over the
    row's prompt prefix (prefix_mask) and generated slots [0, t]. `t` is a scalar (every row at
    the same step) or int32 [R], each row's own slot (multi-turn episodes, whose rows advance
    apart; global-attention models only: a sliding layer's window is per step).
    """
    R = tokens.shape[0]
    t = jnp.asarray(t)
    if t.ndim and any(cfg.sliding_layers):
        raise ValueError("decode_step: per-row slots need a model without sliding-window layers")
    rows = jnp.arange(R)
    inv_freqs = layer_inv_frequencies(cfg)  # host constants: the layer loop is unrolled
    x = embed_tokens(cfg, w.embed, tokens)  # [R, H]
    gk, gv = list(gen.k), list(gen.v)
    for i, (p, local) in enumerate(zip(w.layers, cfg.sliding_layers, strict=True)):
        q, k, v = project_qkv(cfg, p, x, positions[:, None], inv_freqs[i], R, 1)
        if t.ndim:  # per-row slots: a scatter, one [K, D] write per row
            gk[i] = gk[i].at[rows, :, :, t].set(k[:, :, 0, :].astype(gk[i].dtype))
            gv[i] = gv[i].at[rows, :, t, :].set(v[:, :, 0, :].astype(gv[i].dtype))
        else:
            slot = t % gk[i].shape[-1] if local else t  # a sliding layer's ring
            gk[i] = jax.lax.dynamic_update_slice(gk[i], jnp.swapaxes(k, -1, -2), (0, 0, 0, slot))
            gv[i] = jax.lax.dynamic_update_slice(gv[i], v, (0, 0, slot, 0))
        attn = decode_attention(q[:, 0], prefix.k[i], prefix.v[i], prefix_mask, gk[i], gv[i],
                                t, group, cfg.attn_scale, cfg.attn_logit_softcapping,
                                cfg.sliding_window if local else None)
        x = block_tail(cfg, p, x, attn)
    x = norm(cfg, x, w.final_norm)
    logits = jnp.dot(x.astype(w.head.dtype), w.head, preferred_element_type=jnp.float32)
    return softcap(logits, cfg.final_logit_softcapping), GenKV(tuple(gk), tuple(gv))
