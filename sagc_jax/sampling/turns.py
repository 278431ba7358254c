"""Multi-turn sampling on the sampler's KV cache: episodes of model turns and environment replies.

An episode row is the sampler's row (`sampler.py`: the prompt prefilled once, its K/V shared by
the group's G rows) whose generated region holds every turn: the model's tokens and, between
turns, the environment's reply. One compiled program per (G, prompt bucket) runs a turn for all
rows at once (`TurnSampler.turn`): each live row first feeds its pending reply tokens ("forced"
tokens, teacher-forced one per decode step into the same KV cache, logprob 0, marked as
environment tokens), then samples until a stop sequence, EOS, or the episode's token budget. The
history is never prefilled again: a row's next turn continues from its cache slots, so its logits
equal those of the whole sequence run at once (tests/test_episodes.py).

Rows advance apart (a reply's length differs per row), so each row has its own slot `pos`
(`models.decode.decode_step` with per-row slots); a row not live this turn, or whose turn ended,
keeps its state (its step writes only at its own next slot, overwritten before it is read).

Shapes: rows = P_G x G, the generated buffer `max_new_tokens` (model and environment tokens
together: the episode's total-token cap), the reply buffer `reply_width`; the turn count, reply
lengths, stop hits and sampling values are traced or host-side, so after `compile_all` no turn,
episode or G compiles. Finished rows stop costing work the way the single-turn sampler's do: a
turn's loop ends when every live row's turn ended (checked once per `decode_chunk` steps; on
CPU the steps left in that chunk are skipped, `skip_idle_steps`), and a row whose episode is
over is not live in later turns, but until the loop ends it rides along in the batch (rows are
not compacted between turns).

Per turn, beyond its decode steps: the decode weights are made once per batch of episodes, by
`begin` (`Episodes.weights`), not per turn; the host reads the tokens and positions back once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm.auto import tqdm

from sagc_jax.models.decode import (
    DecodeWeights,
    GenKV,
    PrefixKV,
    decode_step,
    decode_weights,
    init_gen,
)
from sagc_jax.models.llama import Transformer
from sagc_jax.sampling.buckets import SamplingConfig
from sagc_jax.sampling.compile_counter import compile_count
from sagc_jax.sampling.draw import sample_step
from sagc_jax.sampling.sampler import Params, Sampler


class EpisodeState(NamedTuple):
    """The rows' device state between turns (R rows, Nbuf = the sampler's output buffer).

    gen: generated K/V (`GenKV`, `max_new_tokens` slots); logits [R, V] f32 of each row's next
    token; pos [R] int32: tokens in the row's episode (its next slot); tokens [R, Nbuf] int32;
    logprobs [R, Nbuf] f32 (sampled tokens under softmax(logits / T); 0 on environment tokens);
    env [R, Nbuf] bool: environment (reply) tokens.
    """

    gen: GenKV
    logits: jax.Array
    pos: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    env: jax.Array


class TurnEnd(NamedTuple):
    """How a turn ended, host arrays [R]: tokens [R, Nbuf] so far, pos, eos (the model wrote an
    EOS), stop (a stop sequence), full (the token budget is used up), and the decode steps run."""

    tokens: np.ndarray
    pos: np.ndarray
    eos: np.ndarray
    stop: np.ndarray
    full: np.ndarray
    steps: int


@dataclasses.dataclass
class Episodes:
    """A batch of episodes in flight: the prompts' shared K/V (device), the rows' state, and
    what every turn reuses. `rows`: real rows (prompts x G); the compiled batch may be larger.

    `weights`: the decode loop's weights (`models.decode.decode_weights`: LoRA merged, split per
    layer, in the matmul dtype), made once by `begin` and read by every turn: the policy the
    episodes are sampled from is fixed when they begin. Deriving them copies every weight (the
    split of the stacked kernels, a tied head's transpose); once per turn that cost 2.5-3 decode
    steps of the real model on a 2-core CPU (benchmarks/README.md, "Multi-turn rollouts"). They
    live as long as the batch: one model-sized buffer more between turns, the peak inside a
    turn is unchanged (the turn program held the same copy).
    """

    prefix: PrefixKV
    lens: Any
    state: EpisodeState
    weights: DecodeWeights
    key: jax.Array
    group_size: int
    prompt_bucket: int
    rows: int
    prefill_s: float
    decode_s: float = 0.0
    decode_steps: int = 0


def skip_idle_steps() -> bool:
    """Whether a turn skips the decode steps left in its last chunk once every row's turn ended
    (a `lax.cond` per step). On XLA:CPU the branch is taken on the host thread running the
    program, for free; on GPU a conditional reads its predicate back to the host each step, the
    per-step sync the chunked loop exists to avoid, so there the idle steps run (not measured
    on a GPU in this change)."""
    return jax.default_backend() == "cpu"


def stop_table(stops: Sequence[Sequence[int]]) -> np.ndarray:
    """Stop sequences as int32 [S, L], right-aligned with -1 before the shorter ones (S >= 1;
    no stops = one row of -1, which never matches: a match needs a real token)."""
    stops = [list(s) for s in stops if len(s)]
    width = max((len(s) for s in stops), default=1)
    table = np.full((max(len(stops), 1), width), -1, np.int32)
    for i, s in enumerate(stops):
        table[i, width - len(s):] = s
    return table


class TurnSampler(Sampler):
    """The sampler's shapes and prefill, with episodes: `begin`, then `turn` until every episode
    is over (the caller, `rollout.episodes`, asks the environment between turns), then `tokens`.

    Args (besides `Sampler`'s): stop_ids: token sequences that end a turn besides EOS (matched
    within the turn's own model tokens); reply_width: most tokens of one environment reply.
    """

    def __init__(self, model: Transformer, config: SamplingConfig, *, pad_id: int,
                 eos_ids: Sequence[int] = (), stop_ids: Sequence[Sequence[int]] = (),
                 reply_width: int = 16, mesh: Mesh | None = None):
        super().__init__(model, config, pad_id=pad_id, eos_ids=eos_ids, mesh=mesh)
        if any(self.cfg.sliding_layers):
            raise ValueError("multi-turn episodes (env:) need a model without sliding-window "
                             "layers (per-row cache slots); this one has some")
        self.stops = stop_table(stop_ids)
        self.reply_width = int(reply_width)
        self._begin = jax.jit(self._begin_impl, static_argnames=("g",))
        self._turn = jax.jit(self._turn_impl, static_argnames=("g", "lp"),
                             donate_argnames=("state",))

    # ---- host API ---------------------------------------------------------------------------

    def begin(self, prompts: Sequence[Sequence[int]], *, group_size: int, key: jax.Array,
              params: Params | None = None) -> Episodes:
        """Prefills `prompts` once; starts `len(prompts) * group_size` episodes (prompt-major)."""
        if jax.process_count() > 1:
            raise ValueError("multi-turn episodes are single-process only")
        g = int(group_size)
        if g not in self.config.group_sizes:
            raise ValueError(f"group_size {g} is not in the declared set {self.config.group_sizes}")
        p_max = self.config.prompts_for(g)
        if not 1 <= len(prompts) <= p_max:
            raise ValueError(f"{len(prompts)} prompts given; the sampler is compiled for 1 to "
                             f"{p_max} at group_size {g}")
        ids, lens, lp = self._pack(prompts, p_max)
        pure = self._params(params)
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.wrap_key_data(key)
        t0 = time.perf_counter()
        prefix, state, weights = self._begin(pure, ids, lens, g=g)
        jax.block_until_ready(state.logits)
        return Episodes(prefix, lens, state, weights, key, g, lp, len(prompts) * g,
                        time.perf_counter() - t0)

    def turn(self, ep: Episodes, *, live: np.ndarray, replies: Sequence[Sequence[int]],
             max_new_tokens: int | None = None, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None,
             greedy: bool = False) -> TurnEnd:
        """One turn of every `live` row ([rows] bool): its reply (`replies[r]`, token ids, at
        most `reply_width`; [] for none) is fed, then the model samples until a stop sequence,
        EOS or `max_new_tokens` episode tokens. Updates `ep.state`."""
        c, total = self.config, len(ep.lens) * ep.group_size
        n = c.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if not 1 <= n <= c.max_new_tokens:
            raise ValueError(f"max_new_tokens must be in [1, {c.max_new_tokens}], got {n}")
        forced = np.full((total, self.reply_width), self.pad_id, np.int32)
        nforced = np.zeros(total, np.int32)
        for r, reply in enumerate(replies):
            if len(reply) > self.reply_width:
                raise ValueError(f"a reply of {len(reply)} tokens is longer than the reply "
                                 f"buffer ({self.reply_width}: env.max_reply_tokens)")
            forced[r, :len(reply)] = reply
            nforced[r] = len(reply)
        on = np.zeros(total, bool)
        on[:len(live)] = live
        t0 = time.perf_counter()
        ep.state, ends = self._turn(
            ep.weights, ep.prefix, ep.lens, ep.state, self._put_rows(forced),
            self._put_rows(nforced), self._put_rows(on), ep.key, np.int32(n),
            np.float32(temperature),
            np.int32(top_k if top_k is not None else self.cfg.vocab_size),
            np.float32(top_p if top_p is not None else 1.0), np.bool_(greedy),
            g=ep.group_size, lp=ep.prompt_bucket)
        tokens, pos, (eos, stop, steps) = jax.device_get((ep.state.tokens, ep.state.pos, ends))
        ep.decode_s += time.perf_counter() - t0
        ep.decode_steps += int(steps)
        return TurnEnd(np.asarray(tokens), np.asarray(pos), np.asarray(eos), np.asarray(stop),
                       np.asarray(pos) >= n, int(steps))

    def outputs(self, ep: Episodes, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray]:
        """(tokens [rows, n] int32, logprobs [rows, n] f32, env [rows, n] bool, lengths [rows])
        of the real rows: each episode's tokens, model and environment ones in order."""
        tokens, logprobs, env, pos = jax.device_get(
            (ep.state.tokens, ep.state.logprobs, ep.state.env, ep.state.pos))
        r = ep.rows
        return (np.asarray(tokens[:r, :n], np.int32), np.asarray(logprobs[:r, :n], np.float32),
                np.asarray(env[:r, :n], bool), np.asarray(pos[:r], np.int32))

    def compile_all(self, progress: bool = True) -> int:
        """Compiles both programs of every declared shape by running them once on dummy data
        (an empty turn): the same calls `begin` / `turn` make, so their caches are hit later."""
        before = compile_count()
        params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype, device=s.sharding),
                              self._abstract_params)
        for s in tqdm(self.shapes, desc="compiling episode shapes", disable=not progress):
            dummy = [[self.pad_id] * s.prompt_bucket]
            ep = self.begin(dummy, group_size=s.group_size, key=jax.random.key(0),
                            params=params)
            self.turn(ep, live=np.zeros(0, bool), replies=[], temperature=1.0)
        return compile_count() - before

    # ---- jitted programs --------------------------------------------------------------------

    def _begin_impl(self, pure: dict, ids: jax.Array, lens: jax.Array, *,
                    g: int) -> tuple[PrefixKV, EpisodeState, DecodeWeights]:
        """Prefill (`Sampler._prefill_impl`), the rows' empty state and the decode weights
        every turn reads (`Episodes.weights`)."""
        c = self.config
        prefix, last = self._prefill_impl(pure, ids, lens, g=g)
        rows = lens.shape[0] * g
        group = g if c.prefix_sharing else 1
        nbuf = c.out_buffer
        state = EpisodeState(
            init_gen(self.cfg, rows, c.max_new_tokens), jnp.repeat(last, group, axis=0),
            jnp.zeros(rows, jnp.int32), jnp.full((rows, nbuf), self.pad_id, jnp.int32),
            jnp.zeros((rows, nbuf), jnp.float32), jnp.zeros((rows, nbuf), bool))
        return prefix, state, decode_weights(self._merge(pure))

    def _turn_impl(self, weights: DecodeWeights, prefix: PrefixKV, lens: jax.Array,
                   state: EpisodeState, forced: jax.Array, nforced: jax.Array,
                   live: jax.Array, key: jax.Array, n: jax.Array, temperature: jax.Array,
                   top_k: jax.Array, top_p: jax.Array, greedy: jax.Array, *, g: int,
                   lp: int) -> tuple[EpisodeState, tuple[jax.Array, jax.Array, jax.Array]]:
        """One turn (see `turn`): forced [R, F] / nforced [R] the replies, live [R]. Returns the
        new state and (eos [R], stop [R], decode steps ()). The steps are the loop's, whole
        chunks (what `sagc.timing` prices a turn by); on CPU the idle ones are skipped for free
        (`skip_idle_steps`), so there decode_s / steps is the cost per counted step."""
        c = self.config
        rows = lens.shape[0] * g
        group = g if c.prefix_sharing else 1
        row = jnp.arange(rows, dtype=jnp.int32)
        plens = lens if c.prefix_sharing else jnp.repeat(lens, g, axis=0)
        lens_r = jnp.repeat(lens, g, axis=0)
        prefix_mask = jnp.arange(lp)[None] >= (lp - plens)[:, None]
        row_keys = jax.vmap(jax.random.fold_in, (None, 0))(key, row)
        eos = jnp.asarray(self.eos_ids or (-1,), jnp.int32)
        stops = jnp.asarray(self.stops)  # [S, L], right-aligned, -1 = no token
        stop_len = (stops >= 0).sum(-1)
        width, nbuf, slots = stops.shape[1], state.tokens.shape[1], state.gen.k[0].shape[-1]
        turn_from = state.pos + nforced  # first slot of this turn's model tokens
        f_width = forced.shape[1]
        skip_idle = skip_idle_steps()

        def work(carry):
            st, fi, ended, eos_hit, stop_hit = carry
            forcing = live & (fi < nforced)
            sampling = live & ~forcing & ~ended
            active = forcing | sampling
            # A row's draw at slot pos: keys never repeat across turns or rows.
            keys = jax.vmap(jax.random.fold_in)(row_keys, st.pos)
            tok, lp_tok = sample_step(st.logits, keys, temperature, top_k, top_p, greedy,
                                      use_top_k=c.use_top_k, use_top_p=c.use_top_p)
            reply_tok = jnp.take_along_axis(forced, jnp.minimum(fi, f_width - 1)[:, None], 1)
            tok = jnp.where(forcing, reply_tok[:, 0], tok)
            at = jnp.minimum(st.pos, nbuf - 1)
            put = lambda buf, x: buf.at[row, at].set(jnp.where(active, x, buf[row, at]))  # noqa: E731
            tokens = put(st.tokens, tok)
            logprobs = put(st.logprobs, jnp.where(sampling, lp_tok, 0.0))
            env = put(st.env, forcing)
            # A stop sequence: the turn's last tokens (its own model tokens only) equal one.
            idx = at[:, None] - (width - 1) + jnp.arange(width)[None]
            window = jnp.take_along_axis(tokens, jnp.clip(idx, 0, nbuf - 1), 1)  # [R, L]
            same = (window[:, None, :] == stops[None]) | (stops[None] < 0)
            inside = (at[:, None] - stop_len[None] + 1) >= turn_from[:, None]
            is_eos = sampling & jnp.any(tok[:, None] == eos[None], axis=-1)
            is_stop = sampling & ~is_eos & jnp.any(same.all(-1) & inside & (stop_len > 0), -1)
            pos = st.pos + active.astype(jnp.int32)
            ended = ended | is_eos | is_stop | (active & (pos >= n))
            logits, gen = decode_step(self.cfg, weights, tok, lens_r + st.pos, prefix,
                                      prefix_mask, st.gen, jnp.minimum(st.pos, slots - 1), group)
            logits = jnp.where(active[:, None], logits, st.logits)
            new = EpisodeState(gen, logits, pos, tokens, logprobs, env)
            return (new, fi + forcing.astype(jnp.int32), ended, eos_hit | is_eos,
                    stop_hit | is_stop)

        def step(carry, _):
            if not skip_idle:
                return work(carry), None
            # Once every row's turn ended, the rest of the chunk would run full decode steps
            # whose results are all discarded (about decode_chunk / 2 steps per turn); skip them.
            # An idle step changes nothing a later step reads (`work` with no active row only
            # writes K/V at each row's next slot, rewritten before it is read).
            _, fi, ended = carry[:3]
            busy = jnp.any(live & ((fi < nforced) | ~ended))
            return jax.lax.cond(busy, work, lambda x: x, carry), None

        def chunk(loop):
            t, carry = loop
            carry, _ = jax.lax.scan(step, carry, None, length=c.decode_chunk)
            return t + c.decode_chunk, carry

        def cond(loop):
            t, (_, _, ended, _, _) = loop
            return (t < n + f_width) & jnp.any(live & ~ended)

        zeros = jnp.zeros(rows, bool)
        init = (jnp.int32(0), (state, jnp.zeros(rows, jnp.int32), ~live, zeros, zeros))
        t, (state, _, _, eos_hit, stop_hit) = jax.lax.while_loop(cond, chunk, init)
        return state, (eos_hit, stop_hit, t)
