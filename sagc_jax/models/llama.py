"""The decoder of every family (Llama, Qwen2, Qwen3, Gemma 3 text) in flax.nnx.

Families differ by flags (`models/families.py`: q/k norms, Gemma's four norms and (1 + w) scale,
scaled embeddings) and by config numbers (GeGLU, attention scale, softcaps, sliding-window layers
with their own RoPE base); one block function serves them all.

Layer weights are stacked along a leading `layers` axis and the blocks run under `jax.lax.scan`,
so compile time does not grow with depth (a 24-layer model compiles like a 1-layer one) — the
sampler and learner are compile-bound on small machines. The KV cache is stacked the same way and
updated in place inside the scan carry.

Call contract:
- `model(ids)`: ids [B, T] right-aligned, unpadded -> logits [B, T, V] float32.
- `model(ids, positions=..., kv_mask=...)`: padded input; positions [B, T] int, kv_mask [B, T]
  bool (False on padding). Causality is by slot index. `last_only=True` returns logits of the
  last position only ([B, 1, V]).
- `model(ids, positions=..., segment_ids=...)`: packed input (full-sequence forward only, no
  cache): several sequences share a row; segment_ids [B, T] int labels each slot's sequence
  (0 = padding) and attention never crosses segments; positions restart per sequence.
  With `branch_ids=...` [B, T] several completions share one prompt's slots in a segment
  (0 on the prompt, a row-unique id per completion; siblings never see each other).
- `model(ids, positions=..., kv_mask=..., cache=cache, cache_index=i)`: writes the T new keys/values
  at slots [i, i+T) of the cache and attends to every slot j <= i+t with kv_mask[b, j] True;
  kv_mask is [B, S] over cache slots. Returns (logits, new_cache).
- `return_kv=True` (no cache): also returns every layer's keys/values, (k, v) each
  [layers, B, K, T, D] — the sampler's prefill, which keeps them as per-prompt prefixes.

Token-by-token decode over per-layer caches (the sampler's hot loop) is in `models/decode.py`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.lora import add_lora, dense, lora_scale
from sagc_jax.models.precision import matmul
from sagc_jax.models.rope import apply_rope, layer_inv_frequencies

_NEG_INF = -1e30  # finite, so fully masked (padding) query rows give uniform weights, not NaN


class KVCache(NamedTuple):
    """Stacked key/value cache: k, v [layers, batch, kv_heads, slots, head_dim] (compute dtype).

    Heads before slots so attention reads a layer's cache as stored: decode is bound by reading
    the cache, and a [slots, heads] layout would cost a transposed copy of it every step.
    """

    k: jax.Array
    v: jax.Array

    @property
    def slots(self) -> int:
        return self.k.shape[3]


def init_cache(cfg: ModelConfig, batch: int, slots: int) -> KVCache:
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, slots, cfg.head_dim)
    dt = jnp.dtype(cfg.dtype)
    return KVCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, plus_one: bool = False) -> jax.Array:
    """HF RMSNorm over the last axis: x [..., H], weight [H] -> [..., H] in x's dtype.

    Llama: normalise in float32, cast back, then scale by w. Gemma (`plus_one`): scale by
    (1 + w) in float32, then cast (Gemma3RMSNorm's order; it differs in bf16).
    """
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if plus_one:
        return (y * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def norm(cfg: ModelConfig, x: jax.Array, weight: jax.Array) -> jax.Array:
    """The family's RMSNorm (`rms_norm`) with the config's epsilon; shapes as `rms_norm`."""
    return rms_norm(x, weight, cfg.rms_norm_eps, cfg.family.norm_plus_one)


def embed_tokens(cfg: ModelConfig, table: jax.Array, ids: jax.Array) -> jax.Array:
    """ids [N] int -> embeddings [N, H] in the compute dtype; Gemma scales them by sqrt(H),
    the scale rounded to the compute dtype first as HF does."""
    dt = jnp.dtype(cfg.dtype)
    x = jnp.take(table, ids, axis=0).astype(dt)
    if cfg.family.embed_scale:
        x = x * jnp.asarray(cfg.hidden_size ** 0.5, dt)
    return x


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap) (any shape); identity when cap is None."""
    return x if cap is None else jnp.tanh(x / cap) * cap



def project_qkv(cfg: ModelConfig, p: dict[str, jax.Array], x: jax.Array, positions: jax.Array,
                inv_freq: np.ndarray, B: int, T: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer's attention input: x [B*T, H] -> q [B, T, N, D] (roped), k [B, K, T, D] (roped),
    v [B, K, T, D] — keys/values already in the cache's heads-before-slots layout. `inv_freq`
    [D/2] is this layer's RoPE (a traced row of `layer_inv_frequencies` inside the scan).
    LoRA adapters in `p` (`*_lora_a` / `*_lora_b`) are applied unmerged (`lora.dense`).

    Activations stay 2-D [B*T, H] around the dense layers: XLA:CPU's backward for
    [B, T, H] @ [H, O] (two batch dims contracted for the weight grad) is ~2x slower.
    """
    n, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = norm(cfg, x, p["attn_norm"])
    s, md = lora_scale(cfg), cfg.matmul_dtype
    q, k, v = (dense(h, p, name, s, md) for name in ("q_proj", "k_proj", "v_proj"))
    if cfg.qkv_bias:
        q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
    q, k = q.reshape(B, T, n, d), k.reshape(B, T, kv, d)
    if cfg.family.qk_norm:  # Qwen3 / Gemma 3: per-head RMSNorm over head_dim, before RoPE
        q, k = norm(cfg, q, p["q_norm"]), norm(cfg, k, p["k_norm"])
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, kv, d).transpose(0, 2, 1, 3)
    return q, k, v


def block_tail(cfg: ModelConfig, p: dict[str, jax.Array], x: jax.Array,
               attn: jax.Array) -> jax.Array:
    """Rest of a decoder block: x [B*T, H] residual, attn [B*T, N*D] -> x [B*T, H].
    Gemma (`sandwich_norms`) also normalises the attention and MLP outputs before each residual
    add; its GeGLU uses tanh-GELU where Llama's SwiGLU uses SiLU."""
    s, md = lora_scale(cfg), cfg.matmul_dtype
    sandwich = cfg.family.sandwich_norms
    attn = dense(attn, p, "o_proj", s, md)
    if cfg.o_bias:
        attn = attn + p["o_bias"]
    x = x + (norm(cfg, attn, p["post_attn_norm"]) if sandwich else attn)
    h = norm(cfg, x, p["mlp_norm"])
    gate, up = dense(h, p, "gate_proj", s, md), dense(h, p, "up_proj", s, md)
    if cfg.mlp_bias:
        gate, up = gate + p["gate_bias"], up + p["up_bias"]
    act = (jax.nn.silu(gate) if cfg.hidden_act == "silu"
           else jax.nn.gelu(gate, approximate=True))
    mlp = dense(act * up, p, "down_proj", s, md)
    if cfg.mlp_bias:
        mlp = mlp + p["down_bias"]
    return x + (norm(cfg, mlp, p["post_mlp_norm"]) if sandwich else mlp)


class DecoderLayers(nnx.Module):
    """All decoder blocks' weights, stacked on axis 0 (`layers`). Kernels are [in, out].
    With `cfg.lora_rank > 0`, LoRA adapters (`nnx.LoRAParam`, models/lora.py) sit beside the
    targeted kernels (added by `Transformer` after every base weight: same seed, same base)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        L, H, I = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size
        qd, kvd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        normal = nnx.initializers.normal(0.02)
        pdt = jnp.dtype(cfg.param_dtype)  # storage dtype; the forward casts to cfg.dtype

        def w(*shape: int) -> nnx.Param:
            return nnx.Param(normal(rngs.params(), (L, *shape), pdt))

        def zeros(*shape: int) -> nnx.Param:
            return nnx.Param(jnp.zeros((L, *shape), pdt))

        def unit(*shape: int) -> nnx.Param:  # a norm's identity scale: 1, or 0 under (1 + w)
            return zeros(*shape) if cfg.family.norm_plus_one else nnx.Param(
                jnp.ones((L, *shape), pdt))

        self.attn_norm = unit(H)
        self.q_proj, self.k_proj = w(H, qd), w(H, kvd)
        self.v_proj, self.o_proj = w(H, kvd), w(qd, H)
        self.mlp_norm = unit(H)
        if cfg.family.qk_norm:
            self.q_norm, self.k_norm = unit(cfg.head_dim), unit(cfg.head_dim)
        if cfg.family.sandwich_norms:
            self.post_attn_norm, self.post_mlp_norm = unit(H), unit(H)
        self.gate_proj, self.up_proj, self.down_proj = w(H, I), w(H, I), w(I, H)
        if cfg.qkv_bias:
            self.q_bias, self.k_bias, self.v_bias = zeros(qd), zeros(kvd), zeros(kvd)
        if cfg.o_bias:
            self.o_bias = zeros(H)
        if cfg.mlp_bias:
            self.gate_bias, self.up_bias, self.down_bias = zeros(I), zeros(I), zeros(H)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
               scale: float | None = None, cap: float | None = None) -> jax.Array:
    """Grouped-query attention.

    q [B, T, N, D], k/v [B, K, S, D], mask [B, T, S] bool -> [B, T, N*D].
    Scores (times `scale`, default D ** -0.5, then softcapped by `cap`) and softmax in
    float32; N = K * R query heads share each kv head.
    """
    B, T, N, D = q.shape
    K = k.shape[1]
    q = q.reshape(B, T, K, N // K, D)
    scores = jnp.einsum("btkrd,bksd->bkrts", q, k, preferred_element_type=jnp.float32)
    scores = softcap(scores * (D ** -0.5 if scale is None else scale), cap)
    scores = jnp.where(mask[:, None, None], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkrts,bksd->btkrd", probs, v)
    return out.reshape(B, T, N * D)


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                    implementation: str | None = "cudnn", scale: float | None = None,
                    ) -> jax.Array:
    """`_attention`'s contract (no softcap) through `jax.nn.dot_product_attention`
    (`implementation` 'cudnn': cuDNN's fused kernel, the [T, S] scores never written to memory;
    'xla' runs the same layout on any backend, which is how the CPU tests check it)."""
    B, T, N, D = q.shape
    out = jax.nn.dot_product_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2),
                                       mask=mask[:, None], scale=scale,
                                       implementation=implementation)
    return out.reshape(B, T, N * D)


def attention_impl(dtype: str, head_dim: int) -> str:
    """'cudnn' (`fused_attention`) or 'einsum' (`_attention`) for the packed forward.

    On a GPU the einsum form writes [rows, heads, T, T] float32 scores and transposes them in
    the backward; cuDNN's fused attention made the packed GRPO update 1.94x faster on an H200
    (Qwen2.5-0.5B, 256 rows: 1.63 -> 0.84 s, losses equal; benchmarks/README.md). cuDNN takes
    bf16/fp16 and head dims that are multiples of 8 up to 128 (measured at 64 only); every other
    case, and every other backend, keeps the einsum.
    """
    ok = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if ok and jax.default_backend() == "gpu" else "einsum"


def _segment_mask(segment_ids: jax.Array, branch_ids: jax.Array | None,
                  cache: KVCache | None) -> jax.Array:
    """[B, T, T] True where the key slot is visible to the query slot's packed sequence: same
    segment and, with `branch_ids`, the key on the shared prompt (branch 0) or on the query's
    own branch (sibling completions of one prompt never see each other).

    Padding (id 0) attends to padding only, so no query row is fully masked.
    """
    if cache is not None:
        raise ValueError("Transformer: segment_ids (packed sequences) is for the full-sequence "
                         "forward; it cannot be combined with a KV cache")
    mask = segment_ids[:, :, None] == segment_ids[:, None, :]
    if branch_ids is not None:
        key = branch_ids[:, None, :]
        mask = mask & ((key == 0) | (key == branch_ids[:, :, None]))
    return mask


def window_mask(q_pos: jax.Array, k_pos: jax.Array, window: int) -> jax.Array:
    """Sliding-window visibility: q_pos [..., T, 1], k_pos [..., 1, S] -> [..., T, S] bool, True
    where the key is among the last `window` positions up to the query (HF's `kv > q - W`).
    Causality and padding are the caller's mask; this only cuts the far past."""
    return q_pos - k_pos < window


class Transformer(nnx.Module):
    """Decoder-only LM for every family in `models/families.py` (they differ in config flags)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        normal, pdt = nnx.initializers.normal(0.02), jnp.dtype(cfg.param_dtype)
        self.embed = nnx.Param(normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size), pdt))
        self.layers = DecoderLayers(cfg, rngs)
        self.final_norm = nnx.Param((jnp.zeros if cfg.family.norm_plus_one else jnp.ones)(
            (cfg.hidden_size,), pdt))
        if not cfg.tie_word_embeddings:
            self.lm_head = nnx.Param(normal(rngs.params(), (cfg.hidden_size, cfg.vocab_size),
                                            pdt))
        if cfg.lora_rank:
            add_lora(self.layers, cfg.lora_targets, cfg.lora_rank, rngs)

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        kv_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_index: jax.Array | int = 0,
        last_only: bool = False,
        rows_sharding: jax.sharding.Sharding | None = None,
        return_kv: bool = False,
        segment_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
        logits_at: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache] | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """`rows_sharding` (train step under FSDP): the embedded [B*T, H] rows' sharding.
        The lookup otherwise comes out sharded on H like the embedding, and GSPMD keeps every
        activation whole on each device (gathering activations, all-reducing partial sums: full
        logits per device); pinned rows make it gather each layer's weights instead.
        `segment_ids` [B, T] (packed training rows): attention stays inside a segment;
        `branch_ids` [B, T] (optional, with it): 0 on a shared prompt's slots, a row-unique id on
        each completion's, which sees the prompt and itself only (`rl.packing`).
        `logits_at` [B, K] int (no cache): logits of those slots only, [B, K, V] (the packed
        train step's scored slots; the LM head and vocab softmax skip the prompt slots)."""
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        B, T = input_ids.shape
        q_slots = jnp.asarray(cache_index, jnp.int32) + jnp.arange(T, dtype=jnp.int32)
        S = T if cache is None else cache.slots
        if positions is None:
            positions = jnp.broadcast_to(q_slots, (B, T))
        if kv_mask is None:
            kv_mask = jnp.ones((B, S), bool)
        mask = (jnp.arange(S)[None, None, :] <= q_slots[None, :, None]) & kv_mask[:, None, :]
        if segment_ids is not None:
            mask = mask & _segment_mask(segment_ids, branch_ids, cache)
        sliding = np.asarray(cfg.sliding_layers)
        local_mask = mask
        if sliding.any():
            # Without a cache every key's position is known (packed rows restart positions, and a
            # branch's prompt is nearer in positions than in slots); a cache's keys are contiguous
            # slots of one left-padded row, so slot distance is position distance there.
            if cache is None:
                local_mask = mask & window_mask(positions[:, :, None], positions[:, None, :],
                                                cfg.sliding_window)
            else:
                local_mask = mask & window_mask(q_slots[None, :, None],
                                                jnp.arange(S)[None, None, :], cfg.sliding_window)

        # The fused kernel only on the packed path (the one measured on a GPU; its rows are never
        # fully masked, unlike a left-padded prompt's padding slots); it has no softcap.
        fused = (segment_ids is not None and cfg.attn_logit_softcapping is None
                 and attention_impl(cfg.dtype, cfg.head_dim) == "cudnn")
        inv_freqs = jnp.asarray(layer_inv_frequencies(cfg))  # [L, D/2]
        x = embed_tokens(cfg, self.embed[...], input_ids.reshape(-1))  # [B*T, H]
        if rows_sharding is not None:
            x = jax.lax.with_sharding_constraint(x, rows_sharding)
        params = {k: v.astype(dt) for k, v in nnx.to_pure_dict(nnx.state(self.layers)).items()}
        n, d = cfg.num_heads, cfg.head_dim

        def block(carry, layer):
            x, cache = carry
            p, idx, inv_freq, is_local = layer
            q, k, v = project_qkv(cfg, p, x, positions, inv_freq, B, T)
            new_kv = (k, v)
            if cache is not None:
                # In-place write of this layer's new slots; then attend over the whole cache.
                start = (idx, 0, 0, jnp.asarray(cache_index, jnp.int32), 0)
                cache = KVCache(jax.lax.dynamic_update_slice(cache.k, k[None], start),
                                jax.lax.dynamic_update_slice(cache.v, v[None], start))
                k, v = cache.k[idx], cache.v[idx]
            m = jnp.where(is_local, local_mask, mask) if sliding.any() else mask
            if fused:
                attn = fused_attention(q, k, v, m, scale=cfg.attn_scale)
            else:
                attn = _attention(q, k, v, m, cfg.attn_scale, cfg.attn_logit_softcapping)
            attn = attn.reshape(B * T, n * d)
            return (block_tail(cfg, p, x, attn), cache), (new_kv if return_kv else None)

        if cfg.remat:
            block = jax.checkpoint(block)
        (x, cache), kv = jax.lax.scan(block, (x, cache),
                                      (params, jnp.arange(cfg.num_layers, dtype=jnp.int32),
                                       inv_freqs, jnp.asarray(sliding)))
        if last_only:  # prefill needs one position: skip the [B, T, V] logits
            x, T = x.reshape(B, T, -1)[:, -1], 1
        elif logits_at is not None:
            x = jnp.take_along_axis(x.reshape(B, T, -1), logits_at[..., None], axis=1)
            x, T = x.reshape(-1, x.shape[-1]), logits_at.shape[1]
        x = norm(cfg, x, self.final_norm[...])
        tied = cfg.tie_word_embeddings
        head = (self.embed if tied else self.lm_head)[...].astype(dt)
        logits = matmul(x, head, cfg.matmul_dtype or dt, w_t=tied, out_dtype="float32")
        logits = softcap(logits, cfg.final_logit_softcapping).reshape(B, T, cfg.vocab_size)
        if return_kv:
            return logits, kv
        return logits if cache is None else (logits, cache)
