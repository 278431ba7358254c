"""Sequence packing for the train step: several (prompt + completion) sequences per row.

The unpacked layout pads every row to `prompt bucket + completion bucket`, so one long completion
makes every row long. Packed, each sequence takes only the slots it needs: its prompt and
completion minus the last token (which predicts nothing we score), placed first-fit-decreasing
into rows of `pack_len` slots. Rows are then run in chunks whose sizes come from a small declared
set (`chunk_sizes`), so the compiled shapes never change.

Packed layout of one chunk (all int32 [rows, pack_len]):
    tokens       input ids; sequence s occupies slots [col_s, col_s + n_s), n_s = p_s + l_s - 1
    targets      next token of the same sequence (what each slot's logits score)
    positions    0 .. n_s - 1 per sequence (RoPE restarts)
    segment_ids  1, 2, ... per sequence within a row; 0 on padding (attention stays inside one id)

The completion token t of sequence s is scored at slot `start_s + t`, `start_s = col_s + p_s - 1`,
in row `row_s` of chunk `chunk_s`. Only those slots need logits (the LM head and the vocab softmax
are ~a quarter of the forward, and prompt slots are often half a row), so each row also lists its
scored slots, compacted: `head_slots` [rows, loss_cap] (int32; sequences in column order, 0 past
the end), where sequence s's first one sits at `hstart_s`. Rows are packed so that none holds more
than `loss_cap` scored slots, which gives that gather a static size. `unpack` gathers per-slot (or
per-listed-slot) values back to the per-sequence `[S, N]` layout the losses take, so packing
changes where a token sits, never the loss.

Only sequences that carry loss (completion length > 0 and `loss_rows`) are packed: the others'
log-probs are masked out of every loss term and metric, so computing them would be waste.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """Where each sequence sits; arrays are per sequence [S] (int32).

    Attributes:
      chunks: row count of each chunk, in run order (each one of the declared chunk sizes).
      pack_len: slots per row.
      chunk / row / start: the sequence's chunk, its row inside the chunk, and the slot whose
        logits score its first completion token; chunk -1 (row, start 0) for sequences not
        packed (`packed` False), so a per-chunk mask `chunk == i` never selects them.
      col: first slot of the sequence in its row.
      hstart: index of the sequence's first scored slot in its row's `head_slots`.
      loss_cap: scored slots a row may hold (the width of `head_slots`).
      packed: True for sequences placed in the layout.
      real_tokens: slots holding a packed sequence (Σ n_s).
    """

    chunks: tuple[int, ...]
    pack_len: int
    chunk: np.ndarray
    row: np.ndarray
    col: np.ndarray
    start: np.ndarray
    packed: np.ndarray
    real_tokens: int
    hstart: np.ndarray
    loss_cap: int

    @property
    def computed_tokens(self) -> int:
        """Slots the forward computes: Σ chunk rows × pack_len."""
        return sum(self.chunks) * self.pack_len

    @property
    def token_util(self) -> float:
        """Real tokens ÷ computed tokens (1.0 for an empty plan)."""
        return self.real_tokens / self.computed_tokens if self.chunks else 1.0


def first_fit_decreasing(sizes: np.ndarray, capacity: int, loads: np.ndarray | None = None,
                         load_capacity: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Bin-packs item `sizes` [S] (each in [1, capacity]) into rows of `capacity` slots; with
    `loads` [S] (each <= `load_capacity`), a row's summed loads also stay <= `load_capacity`.

    Returns (row [S], col [S], rows used); items are placed longest first, each into the first
    row with room, at that row's current end. Deterministic (stable sort on -size).
    """
    sizes = np.asarray(sizes, np.int64)
    if sizes.size and (sizes.min() < 1 or sizes.max() > capacity):
        raise ValueError(f"first_fit_decreasing: item sizes must lie in [1, {capacity}], got "
                         f"{sizes.min()}..{sizes.max()}")
    loads = np.zeros_like(sizes) if loads is None else np.asarray(loads, np.int64)
    cap2 = int(loads.max(initial=0)) if load_capacity is None else load_capacity
    if loads.size and loads.max() > cap2:
        raise ValueError(f"first_fit_decreasing: an item's load {loads.max()} exceeds "
                         f"load_capacity {cap2}")
    row = np.zeros(sizes.shape, np.int32)
    col = np.zeros(sizes.shape, np.int32)
    fill: list[int] = []
    fill2: list[int] = []
    for i in np.argsort(-sizes, kind="stable"):
        n, m = int(sizes[i]), int(loads[i])
        r = next((j for j, used in enumerate(fill)
                  if used + n <= capacity and fill2[j] + m <= cap2), len(fill))
        if r == len(fill):
            fill.append(0)
            fill2.append(0)
        row[i], col[i] = r, fill[r]
        fill[r] += n
        fill2[r] += m
    return row, col, len(fill)


def split_rows(rows: int, chunk_sizes: Sequence[int]) -> tuple[int, ...]:
    """Chunk sizes (from `chunk_sizes`) covering `rows` rows: the largest that fits while any
    does, then the smallest, so the padding rows are fewer than the smallest size."""
    sizes = sorted(set(int(c) for c in chunk_sizes), reverse=True)
    out: list[int] = []
    left = rows
    while left > 0:
        c = next((c for c in sizes if c <= left), sizes[-1])
        out.append(c)
        left -= c
    return tuple(out)


def plan_packing(prompt_lens: np.ndarray, lengths: np.ndarray, include: np.ndarray, *,
                 pack_len: int, chunk_sizes: Sequence[int],
                 loss_cap: int | None = None) -> PackPlan:
    """The pack plan of S sequences.

    Args:
      prompt_lens: int [S] real prompt tokens p_s (>= 1).
      lengths: int [S] completion tokens l_s.
      include: bool [S]; sequences that carry loss (others are left out, see module doc).
      pack_len: slots per row; every included p_s + l_s - 1 must fit.
      chunk_sizes: the declared chunk row counts.
      loss_cap: scored (completion) slots a row may hold, >= every l_s; None = pack_len.
    """
    p = np.asarray(prompt_lens, np.int64)
    n = p + np.asarray(lengths, np.int64) - 1
    packed = np.asarray(include, bool) & (np.asarray(lengths) > 0)
    if packed.any() and (p[packed].min() < 1 or n[packed].max() > pack_len):
        raise ValueError(f"plan_packing: a sequence of {int(n[packed].max())} slots does not "
                         f"fit pack_len {pack_len} (or a prompt is empty)")
    idx = np.flatnonzero(packed)
    ls = np.asarray(lengths, np.int64)
    cap = pack_len if loss_cap is None else int(loss_cap)
    row_g, col, rows = first_fit_decreasing(n[idx], pack_len, ls[idx], cap)
    chunks = split_rows(rows, chunk_sizes) if rows else ()
    bounds = np.cumsum((0, *chunks))  # first global row of each chunk
    S = len(p)
    chunk = np.full(S, -1, np.int32)
    row = np.zeros(S, np.int32)
    cols = np.zeros(S, np.int32)
    c_of = np.searchsorted(bounds, row_g, side="right") - 1
    chunk[idx] = c_of
    row[idx] = row_g - bounds[c_of]
    cols[idx] = col
    start = np.where(packed, cols + p - 1, 0).astype(np.int32)
    # A sequence's scored slots follow those of the sequences left of it in its row.
    hstart = np.zeros(S, np.int32)
    for k, s in enumerate(idx):
        left = (row_g == row_g[k]) & (col < col[k])
        hstart[s] = ls[idx[left]].sum()
    return PackPlan(chunks, pack_len, chunk, row, cols, start, packed, int(n[packed].sum()),
                    hstart, cap)


def pack_chunks(plan: PackPlan, prompts: Sequence[np.ndarray], completions: np.ndarray,
                lengths: np.ndarray, pad_id: int) -> list[dict[str, np.ndarray]]:
    """Per-chunk packed arrays (`tokens`, `targets`, `positions`, `segment_ids`, int32
    [chunk rows, pack_len], and `head_slots` [chunk rows, loss_cap]) of the plan's sequences;
    prompts[s] holds p_s ids, completions [S, >= max l] holds each completion's ids
    (right-padded)."""
    L = plan.pack_len
    out = [{k: np.full((c, L), pad_id if k in ("tokens", "targets") else 0, np.int32)
            for k in ("tokens", "targets", "positions", "segment_ids")} for c in plan.chunks]
    for c, ch in zip(plan.chunks, out, strict=True):
        ch["head_slots"] = np.zeros((c, plan.loss_cap), np.int32)
    seg_next: dict[tuple[int, int], int] = {}
    for s in np.flatnonzero(plan.packed):
        seq = np.concatenate([np.asarray(prompts[s], np.int32),
                              np.asarray(completions[s, :lengths[s]], np.int32)])
        c, r, a, m = int(plan.chunk[s]), int(plan.row[s]), int(plan.col[s]), len(seq) - 1
        seg = seg_next.get((c, r), 1)
        seg_next[(c, r)] = seg + 1
        ch = out[c]
        ch["tokens"][r, a:a + m] = seq[:-1]
        ch["targets"][r, a:a + m] = seq[1:]
        ch["positions"][r, a:a + m] = np.arange(m)
        ch["segment_ids"][r, a:a + m] = seg
        h, ln = int(plan.hstart[s]), int(lengths[s])
        ch["head_slots"][r, h:h + ln] = plan.start[s] + np.arange(ln)
    return out


def unpack(values: jax.Array, row: jax.Array, start: jax.Array, n: int) -> jax.Array:
    """Per-slot packed values [rows, L] -> per-sequence [S, n]: out[s, t] = values[row_s,
    start_s + t]. Slots past the row end are clamped (garbage the caller masks out)."""
    cols = jnp.minimum(start[:, None] + jnp.arange(n)[None, :], values.shape[1] - 1)
    return values[row[:, None], cols]


def pack_batch(arrays: dict[str, np.ndarray], prompt_len: int, *, seqs: int, completion_len: int,
               pack_len: int, chunk_sizes: Sequence[int], pad_id: int
               ) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray], PackPlan]:
    """An unpacked host batch (`rl.train_step.BATCH_FIELDS`, tokens [R, Lp + n] with the prompt
    left-padded to `prompt_len`) -> (packed chunks, per-sequence arrays, plan).

    Per-sequence arrays are padded to `seqs` rows (invalid, no loss) and `completion_len`
    columns, so their shapes are the same every step; they carry `chunk`, `row` and
    `hstart` of the plan besides the batch's own per-row fields. `completion_len` is also
    each row's cap on scored slots (the width of `head_slots`).
    """
    R = len(arrays["lengths"])
    if seqs < R:
        raise ValueError(f"pack_batch: {R} rows exceed the declared {seqs} sequences")
    tokens, pad = arrays["tokens"], arrays["prompt_pad"]
    lengths = np.asarray(arrays["lengths"], np.int32)
    prompts = [tokens[r, pad[r]:prompt_len] for r in range(R)]
    plan = plan_packing(prompt_len - pad, lengths, arrays["loss_rows"], pack_len=pack_len,
                        chunk_sizes=chunk_sizes, loss_cap=completion_len)
    chunks = pack_chunks(plan, prompts, tokens[:, prompt_len:], lengths, pad_id)

    def padded(x: np.ndarray, dtype) -> np.ndarray:
        out = np.zeros((seqs, *x.shape[1:]), dtype)
        out[:R] = x
        return out

    n = arrays["old_logprobs"].shape[1]
    out = {k: padded(np.asarray(arrays[k]), arrays[k].dtype)
           for k in ("lengths", "loss_rows", "rewards", "group_ids", "valid")}
    for k in ("old_logprobs", "ref_logprobs"):
        out[k] = np.zeros((seqs, completion_len), np.float32)
        out[k][:R, :n] = arrays[k]
    out["chunk"] = np.full(seqs, -1, np.int32)
    out["chunk"][:R] = plan.chunk
    out["row"], out["hstart"] = padded(plan.row, np.int32), padded(plan.hstart, np.int32)
    return chunks, out, plan
