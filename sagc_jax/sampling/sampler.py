"""Bucketed, prefix-sharing autoregressive sampler for the `Transformer` (GRPO rollouts).

Per call: prompts are left-padded to a prompt bucket Lp; the P distinct prompts are prefilled
once ([P, Lp]) and their K/V kept once per prompt for decode (`models/decode.py`: shared-prefix
attention, per-layer buffers); only generated tokens' K/V is per row. Decoding runs
`decode_chunk` steps per iteration of one `lax.while_loop` that stops when every row hit EOS or
n tokens were produced. Two programs per (G, Lp): prefill and decode. Everything a call can vary
within a shape (prompt lengths, n <= max_new_tokens, temperature, top-k/top-p values, greedy, key,
params values) is traced, so after `compile_all()` calls never compile.

Cache layout: prompt token i of a prompt with pad = Lp - len sits at prefix slot i with
position i - pad and prefix_mask[slot] = slot >= pad; decode step t feeds the token sampled at
step t into generated slot t with position len + t, and samples token t + 1 from its logits.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from sagc_jax.models.decode import (
    GenKV,
    PrefixKV,
    decode_step,
    decode_weights,
    init_gen,
    prefix_from_prefill,
)
from sagc_jax.models.llama import Transformer
from sagc_jax.models.sharding import BATCH_AXES, state_shardings
from sagc_jax.parallel import allgather, global_to_host_local, host_local_to_global, process_rows
from sagc_jax.sampling.buckets import SamplingConfig, Shape, declared_shapes, prompt_bucket_for
from sagc_jax.sampling.compile_counter import compile_count, install
from sagc_jax.sampling.draw import sample_step

Params = Any  # pure dict of arrays (nnx.to_pure_dict layout) or an nnx.State


@dataclasses.dataclass
class SampleStats:
    """Per-call bookkeeping. padding_waste = rows * decode_steps - sum(lengths)."""

    decode_steps: int
    padding_waste: int
    prefill_s: float
    decode_s: float
    tokens_per_s: float
    compiles: int
    prompt_bucket: int
    cache_bucket: int
    rows: int

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SampleOutput:
    """Rows are prompt-major: row r belongs to prompt r // group_size.

    tokens [rows, n] int32 (pad_id after EOS), lengths [rows] int32 (generated tokens including
    EOS), truncated [rows] bool (no EOS within n), logprobs [rows, n] float32 of the sampled tokens
    under softmax(logits / temperature) (no top-k/top-p truncation; 0 after EOS).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    logprobs: np.ndarray
    stats: SampleStats


class Sampler:
    """Generates G completions for each of up to P prompts from a declared set of shapes.

    Args:
      model: the policy `Transformer`; `params=None` in `generate` reads its current state.
      config: static settings / shape set.
      pad_id: token written after EOS and used to left-pad prompts.
      eos_ids: tokens that end a row (may be empty: rows always run to n).
      mesh: optional; rows are sharded over ('data', 'fsdp') when divisible, params with
        `state_shardings`.
    """

    def __init__(self, model: Transformer, config: SamplingConfig, *, pad_id: int,
                 eos_ids: Sequence[int] = (), mesh: Mesh | None = None):
        install()
        self.model = model
        self.config = config
        self.cfg = model.cfg
        self.pad_id = int(pad_id)
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.mesh = mesh
        self._graphdef, state = nnx.split(model)
        pure = nnx.to_pure_dict(state)
        self._treedef = jax.tree.structure(state)
        self._param_shardings = state_shardings(pure, mesh) if mesh is not None else None
        self._abstract_params = jax.tree.map(
            lambda x, s=None: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), pure,
            *([self._param_shardings] if mesh is not None else []))
        self.shapes: tuple[Shape, ...] = declared_shapes(config)
        self._shape = {(s.group_size, s.prompt_bucket): s for s in self.shapes}
        self._prefill = jax.jit(self._prefill_impl, static_argnames=("g",))
        # The generated-token cache lives only inside decode (zeros, updated in place in the
        # loop carry); the prompt prefix is read-only there.
        self._decode = jax.jit(self._decode_impl, static_argnames=("g", "lp"))

    # ---- public helpers -------------------------------------------------------------------

    def prompt_bucket_for(self, length: int) -> int:
        """Prompt bucket for a prompt of `length` tokens; ValueError if longer than all."""
        b = prompt_bucket_for(length, self.config.prompt_buckets)
        if b is None:
            if self.config.prompt_too_long == "truncate":
                return self.config.prompt_buckets[-1]
            raise ValueError(f"prompt of {length} tokens is longer than the largest prompt bucket "
                             f"{self.config.prompt_buckets[-1]} (buckets "
                             f"{self.config.prompt_buckets})")
        return b

    def compile_all(self, progress: bool = True) -> int:
        """Compiles prefill + decode for every declared shape; returns the compiles it caused."""
        before = compile_count()
        for s in tqdm(self.shapes, desc="compiling sampler shapes", disable=not progress):
            for fn, args, kw in self._abstract_calls(s):
                fn.lower(*args, **kw).compile()
            if jax.process_count() > 1:
                self._warm_gathers(s)
        return compile_count() - before

    def _warm_gathers(self, s: Shape) -> None:
        """Runs `_pack_global`'s cross-process gathers once on dummy data of shape `s` (each
        gather is a small jitted program per shape), assuming every process passes an equal
        share of the prompts. A collective: every process must call it in the same order."""
        k = max(s.prompts // jax.process_count(), 1)
        allgather(np.zeros((1, 2), np.int64))
        allgather(np.zeros((k, s.prompt_bucket), np.int32))
        allgather(np.zeros((k,), np.int32))

    # ---- generate -------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], *, group_size: int, key: jax.Array,
                 max_new_tokens: int | None = None, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
                 params: Params | None = None) -> SampleOutput:
        """Samples `group_size` completions per prompt.

        prompts: up to P_g token-id sequences (any lengths within the prompt buckets).
        Returns arrays for rows = len(prompts) * group_size, prompt-major.
        """
        c = self.config
        g = int(group_size)
        if g not in c.group_sizes:
            raise ValueError(f"group_size {g} is not in the declared set {c.group_sizes}")
        n = c.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if not 1 <= n <= c.max_new_tokens:
            raise ValueError(f"max_new_tokens must be in [1, {c.max_new_tokens}] (the configured "
                             f"max), got {n}")
        if top_k is not None and not c.use_top_k:
            raise ValueError("top_k given but SamplingConfig.use_top_k=False (not compiled in)")
        if top_p is not None and not c.use_top_p:
            raise ValueError("top_p given but SamplingConfig.use_top_p=False (not compiled in)")
        p_max = c.prompts_for(g)
        if not prompts:
            raise ValueError("no prompts given")
        multi = jax.process_count() > 1
        if multi:
            # Multi-controller: `prompts` are this process's block of the global prompts.
            ids, lens, lp, num_real = self._pack_global(prompts, p_max)
        else:
            if len(prompts) > p_max:
                raise ValueError(f"{len(prompts)} prompts given but the sampler is compiled for "
                                 f"at most {p_max} prompts at group_size {g}")
            ids, lens, lp = self._pack(prompts, p_max)
            num_real = len(prompts)
        shape = self._shape[(g, lp)]

        before = compile_count()
        pure = self._params(params)
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            # A raw uint32 key becomes a typed key, so both kinds hit one program.
            key = jax.random.wrap_key_data(key)
        t0 = time.perf_counter()
        prefix, last = self._prefill(pure, ids, lens, g=g)
        jax.block_until_ready(last)
        t1 = time.perf_counter()
        out = self._decode(pure, prefix, last, lens, key, np.int32(n), np.int32(num_real),
                           np.float32(temperature),
                           np.int32(top_k if top_k is not None else self.cfg.vocab_size),
                           np.float32(top_p if top_p is not None else 1.0), np.bool_(greedy),
                           g=g, lp=lp)
        if multi:
            tokens, logprobs, lengths, hit, steps = self._local_rows(out, len(prompts), g, p_max)
        else:
            tokens, logprobs, lengths, hit, steps = jax.device_get(out)  # the one host sync
        t2 = time.perf_counter()

        rows = len(prompts) * g
        lengths = lengths[:rows].astype(np.int32)
        steps = int(steps)
        n_tok = int(lengths.sum())
        stats = SampleStats(
            decode_steps=steps, padding_waste=rows * steps - n_tok, prefill_s=t1 - t0,
            decode_s=t2 - t1, tokens_per_s=n_tok / max(t2 - t0, 1e-9),
            compiles=compile_count() - before, prompt_bucket=lp,
            cache_bucket=shape.cache_bucket, rows=rows)
        return SampleOutput(tokens=np.asarray(tokens[:rows, :n], np.int32), lengths=lengths,
                            truncated=~hit[:rows], logprobs=np.asarray(logprobs[:rows, :n]),
                            stats=stats)

    # ---- host-side packing -----------------------------------------------------------------

    def _pack(self, prompts: Sequence[Sequence[int]], p_max: int) -> tuple[Any, Any, int]:
        """Left-pads to the bucket of the longest prompt: ids [P, Lp] int32, lens [P] int32.

        Dummy prompts (rows dropped from the output) are one pad token long.
        """
        seqs = self._checked(prompts)
        lp = self.prompt_bucket_for(max(a.size for a in seqs))
        ids, lens = self._left_pad(seqs, p_max, lp)
        if self.mesh is not None:
            ids, lens = self._put_rows(ids), self._put_rows(lens)
        return ids, lens, lp

    def _left_pad(self, seqs: list[np.ndarray], rows: int,
                  lp: int) -> tuple[np.ndarray, np.ndarray]:
        """ids [rows, lp] (left-padded), lens [rows]; rows past len(seqs) are 1-token dummies."""
        ids = np.full((rows, lp), self.pad_id, np.int32)
        lens = np.ones((rows,), np.int32)
        for i, a in enumerate(seqs):
            ids[i, lp - a.size:] = a
            lens[i] = a.size
        return ids, lens

    def _pack_global(self, prompts: Sequence[Sequence[int]],
                     p_max: int) -> tuple[jax.Array, jax.Array, int, int]:
        """Multi-process `_pack`: this process's prompts -> the global ids [P, Lp] / lens [P].

        Every process passes the same number k of prompts, its contiguous block of the global
        prompt order (process p holds prompts [p*k, (p+1)*k)). The prompt bucket is the one of the
        longest prompt over all processes (every process must run the same program), and dummy
        padding stays at the global end, so the arrays equal a single process's `_pack` of the
        concatenated prompts. Returns (ids, lens, Lp, number of real prompts).
        """
        if self.mesh is None:
            raise ValueError("a multi-process Sampler needs a mesh")
        seqs = self._checked(prompts)
        info = allgather(np.asarray([[len(seqs), max(a.size for a in seqs)]], np.int64))
        if (info[:, 0] != info[0, 0]).any():
            raise ValueError(f"every process must pass the same number of prompts, got "
                             f"{info[:, 0].tolist()}")
        total = int(info[:, 0].sum())
        if total > p_max:
            raise ValueError(f"{total} prompts given over {len(info)} processes but the sampler "
                             f"is compiled for at most {p_max}")
        spec = self._rows_spec(p_max)
        if spec is None:
            ways = int(np.prod([self.mesh.shape[a] for a in BATCH_AXES]))
            raise ValueError(f"{p_max} prompts do not split over data x fsdp = {ways} devices; "
                             "with several processes every rows count must")
        lp = self.prompt_bucket_for(int(info[:, 1].max()))
        block_ids, block_lens = self._left_pad(seqs, len(seqs), lp)
        # Small ([P, Lp] int32): gather everyone's prompts so each process lays out the exact
        # global arrays, then contributes the rows its devices hold.
        ids, lens = self._left_pad([], p_max, lp)
        ids[:total], lens[:total] = allgather(block_ids), allgather(block_lens)
        sh = NamedSharding(self.mesh, spec)
        mine = process_rows(p_max, sh)
        ids_g = host_local_to_global(ids[mine], NamedSharding(self.mesh, self._rows_spec(
            p_max, 0, 2)))
        return ids_g, host_local_to_global(lens[mine], sh), lp, total

    def _local_rows(self, out: tuple[jax.Array, ...], k: int, g: int,
                    p_max: int) -> tuple[np.ndarray, ...]:
        """This process's rows (its k prompts' groups) of the global decode outputs, as numpy.

        With k * processes == P (the trainer's case) a process's prompts are exactly the rows
        its devices hold; otherwise (dummy padding) the blocks are gathered and sliced.
        """
        tokens, logprobs, lengths, hit, steps = (global_to_host_local(x) for x in out)
        if k * jax.process_count() != p_max:
            tokens, logprobs, lengths, hit = allgather((tokens, logprobs, lengths, hit))
        else:
            held = process_rows(p_max * g, out[2].sharding)
            if held != slice(jax.process_index() * k * g, (jax.process_index() + 1) * k * g):
                raise ValueError(f"this process's devices hold rows {held}, not its prompts' "
                                 "rows: the mesh must keep jax.devices() order (make_mesh)")
            return tokens, logprobs, lengths, hit, steps
        mine = slice(jax.process_index() * k * g, (jax.process_index() + 1) * k * g)
        return tokens[mine], logprobs[mine], lengths[mine], hit[mine], steps

    def _checked(self, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Prompts as int32 arrays, validated (non-empty, within the buckets or truncated)."""
        seqs = []
        for i, p in enumerate(prompts):
            a = np.asarray(p, np.int32).reshape(-1)
            if a.size == 0:
                raise ValueError(f"prompt {i} is empty")
            if prompt_bucket_for(a.size, self.config.prompt_buckets) is None:
                if self.config.prompt_too_long == "truncate":
                    a = a[-self.config.prompt_buckets[-1]:]
                else:
                    raise ValueError(
                        f"prompt {i} has {a.size} tokens, longer than the largest prompt bucket "
                        f"{self.config.prompt_buckets[-1]} (buckets {self.config.prompt_buckets})")
            seqs.append(a)
        return seqs

    def _params(self, params: Params | None) -> dict:
        """Pure-dict params (the jit argument), from the model's live state by default."""
        if params is None:
            params = nnx.state(self.model)
        if isinstance(params, nnx.State):
            params = nnx.to_pure_dict(params)
        if self._param_shardings is not None:
            params = jax.device_put(params, self._param_shardings)
        return params

    def _rows_spec(self, n: int, axis: int = 0, ndim: int = 1) -> PartitionSpec | None:
        if self.mesh is None:
            return None
        ways = int(np.prod([self.mesh.shape[a] for a in BATCH_AXES]))
        if n % ways:
            return None
        spec = [None] * ndim
        spec[axis] = BATCH_AXES
        return PartitionSpec(*spec)

    def _put_rows(self, x: np.ndarray) -> Any:
        spec = self._rows_spec(x.shape[0], 0, x.ndim)
        return x if spec is None else jax.device_put(x, NamedSharding(self.mesh, spec))

    def _constrain(self, x: jax.Array, axis: int) -> jax.Array:
        spec = self._rows_spec(x.shape[axis], axis, x.ndim)
        if spec is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def _abstract_calls(self, s: Shape) -> list[tuple[Any, tuple, dict]]:
        """(jitted fn, abstract args, static kwargs) matching what `generate` passes for `s`."""
        def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
            spec = self._rows_spec(shape[0], 0, len(shape)) if shape else None
            sh = NamedSharding(self.mesh, spec) if spec is not None else None
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

        ids, lens = sds((s.prompts, s.prompt_bucket), jnp.int32), sds((s.prompts,), jnp.int32)
        pre_out = jax.eval_shape(lambda p, i, l: self._prefill_impl(p, i, l, g=s.group_size),
                                 self._abstract_params, ids, lens)
        prefix, last = pre_out
        if self.mesh is not None:
            def put(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
                return sds(x.shape, x.dtype)

            prefix = jax.tree.map(put, prefix)
            last = put(last)
        scalar = lambda dt: jax.ShapeDtypeStruct((), dt)  # noqa: E731
        key = jax.eval_shape(lambda: jax.random.key(0))
        return [
            (self._prefill, (self._abstract_params, ids, lens), {"g": s.group_size}),
            (self._decode, (self._abstract_params, prefix, last, lens, key, scalar(jnp.int32),
                            scalar(jnp.int32), scalar(jnp.float32), scalar(jnp.int32),
                            scalar(jnp.float32), scalar(jnp.bool_)),
             {"g": s.group_size, "lp": s.prompt_bucket}),
        ]

    # ---- jitted programs -------------------------------------------------------------------

    def _merge(self, pure: dict) -> Transformer:
        state = jax.tree.unflatten(self._treedef, jax.tree.leaves(pure))
        return nnx.merge(self._graphdef, state)

    def _prefill_impl(self, pure: dict, ids: jax.Array, lens: jax.Array, *,
                      g: int) -> tuple[PrefixKV, jax.Array]:
        """ids [P, Lp], lens [P] -> (prompt K/V per layer [P', ...], last logits [P', V]).

        P' = P with prefix sharing (each prompt's K/V kept once for its g rows), else P * g
        (every row prefilled on its own: the Tunix-style baseline).
        """
        model = self._merge(pure)
        lp = ids.shape[1]
        if not self.config.prefix_sharing:
            ids, lens = jnp.repeat(ids, g, axis=0), jnp.repeat(lens, g, axis=0)
        pad = lp - lens
        positions = jnp.maximum(jnp.arange(lp)[None] - pad[:, None], 0)
        kv_mask = jnp.arange(lp)[None] >= pad[:, None]
        logits, (k, v) = model(ids, positions=positions, kv_mask=kv_mask, last_only=True,
                               return_kv=True)
        prefix = prefix_from_prefill(k, v, self.cfg)  # sliding layers: the window's tail only
        prefix = PrefixKV(*(tuple(self._constrain(x, 0) for x in part) for part in prefix))
        return prefix, self._constrain(logits[:, -1], 0)

    def _decode_impl(self, pure: dict, prefix: PrefixKV, last: jax.Array, lens: jax.Array,
                     key: jax.Array, n: jax.Array, num_real: jax.Array, temperature: jax.Array,
                     top_k: jax.Array, top_p: jax.Array, greedy: jax.Array, *, g: int,
                     lp: int) -> tuple[jax.Array, ...]:
        """Chunked decode loop.

        prefix / last [P', V] from prefill, lens [P] prompt lengths (per prompt; repeated here),
        n / num_real / sampling values traced scalars. Returns tokens [R, Nbuf] int32, logprobs
        [R, Nbuf] f32, lengths [R] int32, eos_hit [R] bool, steps () int32 (decode steps run, a
        multiple of decode_chunk).
        """
        c = self.config
        model = self._merge(pure)
        # Per-layer split (and any matmul_dtype cast) once per call, outside the loop.
        weights = decode_weights(model)
        rows = lens.shape[0] * g
        group = g if c.prefix_sharing else 1
        nbuf = c.out_buffer
        row = jnp.arange(rows, dtype=jnp.int32)
        plens = lens if c.prefix_sharing else jnp.repeat(lens, g, axis=0)
        lens = jnp.repeat(lens, g, axis=0)
        last = self._constrain(jnp.repeat(last, group, axis=0), 0)
        # Hoisted out of the loop: the prompt mask never changes during decode, nor do row keys.
        prefix_mask = self._constrain(jnp.arange(lp)[None] >= (lp - plens)[:, None], 0)
        row_keys = jax.vmap(jax.random.fold_in, (None, 0))(key, row)
        eos = jnp.asarray(self.eos_ids or (-1,), jnp.int32)
        gen = init_gen(self.cfg, rows, c.max_new_tokens)
        gen = GenKV(*(tuple(self._constrain(x, 0) for x in part) for part in gen))

        def step(carry, _):
            t, gen, logits, done, hit, length = carry
            keys = jax.vmap(jax.random.fold_in, (0, None))(row_keys, t)
            tok, lp_tok = sample_step(logits, keys, temperature, top_k, top_p, greedy,
                                      use_top_k=c.use_top_k, use_top_p=c.use_top_p)
            active = ~done
            tok = jnp.where(active, tok, self.pad_id)
            lp_tok = jnp.where(active, lp_tok, 0.0)
            is_eos = active & jnp.any(tok[:, None] == eos[None], axis=-1)
            length = length + active.astype(jnp.int32)
            hit = hit | is_eos
            done = done | is_eos | (t + 1 >= n)
            # Steps past n-1 write at clamped slots nobody reads again.
            new_logits, gen = decode_step(self.cfg, weights, tok, lens + t, prefix, prefix_mask,
                                          gen, t, group)
            return (t + 1, gen, new_logits, done, hit, length), (tok, lp_tok)

        def chunk(state):
            t, gen, logits, done, hit, length, tok_buf, lp_buf = state
            (t2, gen, logits, done, hit, length), (toks, lps) = jax.lax.scan(
                step, (t, gen, logits, done, hit, length), None, length=c.decode_chunk)
            tok_buf = jax.lax.dynamic_update_slice(tok_buf, toks.T, (0, t))
            lp_buf = jax.lax.dynamic_update_slice(lp_buf, lps.T, (0, t))
            return t2, gen, logits, done, hit, length, tok_buf, lp_buf

        def cond(state):
            t, done = state[0], state[3]
            return (t < n) & ~jnp.all(done)

        done0 = (row // g) >= num_real  # dummy prompts' rows start done
        init = (jnp.int32(0), gen, last, done0, jnp.zeros(rows, bool),
                jnp.zeros(rows, jnp.int32), jnp.full((rows, nbuf), self.pad_id, jnp.int32),
                jnp.zeros((rows, nbuf), jnp.float32))
        t, _, _, _, hit, length, tok_buf, lp_buf = jax.lax.while_loop(cond, chunk, init)
        return tok_buf, lp_buf, length, hit, t
