"""The train layout's host plan: sequences placed in rows, each prompt once per row.

One layout serves every update. A row holds *units*: one prompt, then completions of it (each
placed at the row's end, so siblings need not be adjacent). A completion attends to its unit's
prompt and to its own slots, never to a sibling's: its logits are those of its sequence run
alone, while the prompt's forward, the same for every row of a group, runs once per row instead
of once per completion. Its gradient is then the sum over the completions that read it, as it
would be over G copies. Completions share a unit when their prompt ids are equal: the rollout's
group index (`rl.batch.make_batch`). The padded layout (`algo.packing: false`) is the case of
one sequence per row (`one_per_row`): the same arrays, the same compiled steps.

Packed layout of one chunk (int32 [rows, pack_len]):
    tokens       a unit's prompt (p ids) at [pcol_s, pcol_s + p); completion s's first l_s - 1
                 ids at [col_s, col_s + l_s - 1) (its last id predicts nothing we score)
    positions    0 .. p - 1 on the prompt, p .. p + l_s - 2 on the completion (RoPE as unpacked)
    segment_ids  1, 2, ... per unit within a row; 0 on padding (attention stays inside one id)
    branch_ids   0 on prompt slots and padding, 1, 2, ... per completion within a row: a slot
                 sees the earlier slots of its segment whose branch is 0 or its own

Completion token t of sequence s is scored (predicted) at slot pcol_s + p - 1 for t = 0 and at
col_s + t - 1 after: only those slots need logits (the LM head and vocab softmax are ~a quarter of
the forward, prompts often half a row). So each row lists its scored slots, compacted:
`head_slots` [rows, loss_cap] and the token each one scores, `head_targets` (sequences in
placement order, 0 past the end; sequence s's first at `hstart_s`; a prompt's last slot appears
once per completion of its unit). Rows are packed so that none holds more than `loss_cap` scored
slots, which gives that gather a static size. `rl.train_step.unpack` gathers per-listed-slot
values back to the per-sequence `[S, N]` layout the losses take, so packing changes where a
token is computed, never the loss.

Only sequences that carry loss (completion length > 0 and `loss_rows`) are packed: the others'
log-probs are masked out of every loss term and metric, so computing them would be waste.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """Where each of S sequences sits among this process's rows; arrays are [S] (int32).

    Attributes:
      pack_len: slots per row.
      loss_cap: scored slots a row may hold (the width of `head_slots`).
      rows: rows the plan uses.
      row: the sequence's row (0 .. rows - 1; 0 for sequences not packed).
      col / pcol: first slot of the completion's own ids / of its unit's prompt, in its row.
      segment / branch: its unit's and its own id within the row (`segment_ids`, `branch_ids`).
      hstart: index of the sequence's first scored slot in its row's `head_slots`.
      packed: True for sequences placed in the layout.
      real_tokens: slots holding a token (each unit's prompt once, plus Σ (l_s - 1)).
    """

    pack_len: int
    loss_cap: int
    rows: int
    row: np.ndarray
    col: np.ndarray
    pcol: np.ndarray
    segment: np.ndarray
    branch: np.ndarray
    hstart: np.ndarray
    packed: np.ndarray
    real_tokens: int


@dataclasses.dataclass(frozen=True)
class ChunkSplit:
    """The plan's rows cut into compiled chunks, the same on every process.

    Attributes:
      sizes: global rows of each chunk, in run order (each a declared chunk size).
      local: this process's rows of each chunk (`sizes / processes`, a contiguous block
        starting at `index * local` of the chunk's global rows).
      chunk: [S] the sequence's chunk; -1 for sequences not packed, so a per-chunk mask
        `chunk == i` never selects them.
      row: [S] the sequence's global row inside its chunk (0 when not packed).
    """

    sizes: tuple[int, ...]
    local: tuple[int, ...]
    chunk: np.ndarray
    row: np.ndarray


@dataclasses.dataclass
class _Row:
    fill: int = 0  # slots used
    load: int = 0  # scored slots used
    units: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # id: pcol, seg
    branches: int = 0


def first_fit_shared(prompt_ids: np.ndarray, prompt_lens: np.ndarray, own: np.ndarray,
                     loads: np.ndarray, capacity: int, load_capacity: int | None = None
                     ) -> tuple[dict[str, np.ndarray], int]:
    """Bin-packs S completions into rows of `capacity` slots, each prompt placed once per row.

    Completion s takes `own[s]` slots and `loads[s]` of a row's `load_capacity` (default: no
    limit); its prompt (`prompt_ids[s]`, `prompt_lens[s]` >= 1 slots) must sit in the same row
    before it. Longest first (prompt + own, stable sort), each completion goes to the first row
    that holds its prompt and has room for `own`, else to the first with room for prompt + own
    (the prompt placed first), else to a new row; slots are taken at the row's end. With every
    prompt id distinct this is first-fit-decreasing on prompt + own. Deterministic.

    Returns ({row, col, pcol, segment, branch, hstart}: int32 [S], rows used): col / pcol the
    first own / prompt slot, segment / branch the unit's / completion's id (1, 2, ...) and hstart
    the load used before it in its row.
    """
    p, n = np.asarray(prompt_lens, np.int64), np.asarray(own, np.int64)
    m = np.asarray(loads, np.int64)
    cap2 = int(m.sum()) if load_capacity is None else int(load_capacity)
    if p.size and (p.min() < 1 or n.min() < 0 or (p + n).max() > capacity):
        raise ValueError(f"first_fit_shared: every prompt + own slots must lie in "
                         f"[1, {capacity}], got {(p + n).min()}..{(p + n).max()}")
    if m.size and m.max() > cap2:
        raise ValueError(f"first_fit_shared: a load of {m.max()} exceeds load_capacity {cap2}")
    out = {k: np.zeros(p.shape, np.int32)
           for k in ("row", "col", "pcol", "segment", "branch", "hstart")}
    rows: list[_Row] = []

    def room(r: _Row, slots: int, load: int) -> bool:
        return r.fill + slots <= capacity and r.load + load <= cap2

    for i in np.argsort(-(p + n), kind="stable"):
        key = int(prompt_ids[i])
        j = next((j for j, r in enumerate(rows) if key in r.units and room(r, n[i], m[i])), None)
        if j is None:  # a new unit: the prompt first
            j = next((j for j, r in enumerate(rows) if room(r, p[i] + n[i], m[i])), len(rows))
            if j == len(rows):
                rows.append(_Row())
            r = rows[j]
            r.units[key] = (r.fill, len(r.units) + 1)
            r.fill += int(p[i])
        r = rows[j]
        r.branches += 1
        out["row"][i], out["col"][i], out["hstart"][i] = j, r.fill, r.load
        out["pcol"][i], out["segment"][i] = r.units[key]
        out["branch"][i] = r.branches
        r.fill += int(n[i])
        r.load += int(m[i])
    return out, len(rows)


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
                 pack_len: int, loss_cap: int | None = None,
                 prompt_ids: np.ndarray | None = None, one_per_row: bool = False) -> PackPlan:
    """The pack plan of S sequences.

    Args:
      prompt_lens: int [S] real prompt tokens p_s (>= 1).
      lengths: int [S] completion tokens l_s.
      include: bool [S]; sequences that carry loss (others are left out, see module doc).
      pack_len: slots per row; every included p_s + l_s - 1 must fit.
      loss_cap: scored (completion) slots a row may hold, >= every l_s; None = pack_len.
      prompt_ids: int [S]; sequences with equal ids have the same prompt (may share its slots).
        None = all distinct (no sharing).
      one_per_row: each sequence in a row of its own (the padded layout: no packing, no
        sharing); the same arrays and compiled steps as the packed layout.
    """
    p = np.asarray(prompt_lens, np.int64)
    ls = np.asarray(lengths, np.int64)
    packed = np.asarray(include, bool) & (ls > 0)
    if packed.any() and (p[packed].min() < 1 or (p + ls - 1)[packed].max() > pack_len):
        raise ValueError(f"plan_packing: a sequence of {int((p + ls - 1)[packed].max())} slots "
                         f"does not fit pack_len {pack_len} (or a prompt is empty)")
    S = len(p)
    ids = np.arange(S) if prompt_ids is None else np.asarray(prompt_ids)
    idx = np.flatnonzero(packed)
    cap = pack_len if loss_cap is None else int(loss_cap)
    if one_per_row:  # row i for the i-th sequence: its prompt at slot 0, its completion after
        rows, zeros, ones = len(idx), np.zeros(len(idx), np.int32), np.ones(len(idx), np.int32)
        where = {"row": np.arange(rows, dtype=np.int32), "col": p[idx].astype(np.int32),
                 "pcol": zeros, "segment": ones, "branch": ones, "hstart": zeros}
    else:
        where, rows = first_fit_shared(ids[idx], p[idx], ls[idx] - 1, ls[idx], pack_len, cap)
    per_seq = {k: np.zeros(S, np.int32) for k in where}
    for k, v in where.items():
        per_seq[k][idx] = v
    units = {(r, s): int(q) for r, s, q in zip(where["row"], where["segment"], p[idx])}
    real = sum(units.values()) + int((ls[idx] - 1).sum())
    return PackPlan(pack_len, cap, rows, per_seq["row"], per_seq["col"], per_seq["pcol"],
                    per_seq["segment"], per_seq["branch"], per_seq["hstart"], packed, real)


def split_chunks(plan: PackPlan, rows: int, chunk_sizes: Sequence[int], *, processes: int = 1,
                 index: int = 0) -> ChunkSplit:
    """The chunks of `rows` rows per process (>= `plan.rows`: with several processes, the most
    any process's plan uses), each process holding `size / processes` rows of every chunk.

    Row r of process `index` lands in local chunk block k at local row r - bounds[k], i.e. global
    row `index * local_k + r - bounds[k]` of chunk k: `make_array_from_process_local_data` puts
    process i's block there for a mesh whose batch rows are contiguous per process.
    """
    local_sizes = sorted({int(c) // processes for c in chunk_sizes}, reverse=True)
    if local_sizes[-1] < 1:
        raise ValueError(f"chunk sizes {tuple(chunk_sizes)} must be multiples of the "
                         f"{processes} processes")
    local = split_rows(rows, local_sizes) if rows else ()
    bounds = np.cumsum((0, *local))  # first local row of each chunk
    chunk = np.full(len(plan.row), -1, np.int32)
    row = np.zeros(len(plan.row), np.int32)
    idx = np.flatnonzero(plan.packed)
    c_of = np.searchsorted(bounds, plan.row[idx], side="right") - 1
    chunk[idx] = c_of
    row[idx] = index * np.asarray(local, np.int64)[c_of] + plan.row[idx] - bounds[c_of]
    return ChunkSplit(tuple(c * processes for c in local), local, chunk, row)


def pack_chunks(plan: PackPlan, split: ChunkSplit, prompts: Sequence[np.ndarray],
                completions: np.ndarray, lengths: np.ndarray, pad_id: int, *,
                index: int = 0) -> list[dict[str, np.ndarray]]:
    """This process's rows of each chunk: `tokens`, `positions`, `segment_ids`, `branch_ids`
    (int32 [local rows, pack_len]), `head_slots` and `head_targets` (int32 [local rows,
    loss_cap]); prompts[s] holds p_s ids, completions [S, >= max l] each completion's ids
    (right-padded)."""
    L, K = plan.pack_len, plan.loss_cap
    out = []
    for c in split.local:
        ch = {k: np.zeros((c, L), np.int32) for k in ("positions", "segment_ids", "branch_ids")}
        ch["tokens"] = np.full((c, L), pad_id, np.int32)
        ch["head_slots"] = np.zeros((c, K), np.int32)
        ch["head_targets"] = np.full((c, K), pad_id, np.int32)
        out.append(ch)
    for s in np.flatnonzero(plan.packed):
        k = int(split.chunk[s])
        ch, r = out[k], int(split.row[s]) - index * split.local[k]
        prompt, p = np.asarray(prompts[s], np.int32), len(prompts[s])
        comp, ln = np.asarray(completions[s, :lengths[s]], np.int32), int(lengths[s])
        a, b, h = int(plan.pcol[s]), int(plan.col[s]), int(plan.hstart[s])
        ch["tokens"][r, a:a + p] = prompt  # rewritten (same values) by each sibling in the row
        ch["positions"][r, a:a + p] = np.arange(p)
        ch["segment_ids"][r, a:a + p] = plan.segment[s]
        ch["tokens"][r, b:b + ln - 1] = comp[:-1]
        ch["positions"][r, b:b + ln - 1] = p + np.arange(ln - 1)
        ch["segment_ids"][r, b:b + ln - 1] = plan.segment[s]
        ch["branch_ids"][r, b:b + ln - 1] = plan.branch[s]
        ch["head_slots"][r, h:h + ln] = np.concatenate([[a + p - 1], b + np.arange(ln - 1)])
        ch["head_targets"][r, h:h + ln] = comp
    return out
