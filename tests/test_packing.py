"""The train layout's host plan: rows hold each prompt once for its completions, within both
capacities; chunks split the same way on every process; the packed forward scores each token
as the sequence run alone does. (The update over the layout: tests/test_train_step.py.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from reference_step import rollout

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.packing import first_fit_shared, plan_packing, split_chunks, split_rows
from sagc_jax.shapes import TrainLayout

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)
LP, N, PACK_LEN, PAD = 8, 8, 16, 0
P = 4  # prompts per step; S = P x the largest G
G_MAX = 4
S = P * G_MAX


# ------------------------------------------------------------------ the host plan
def test_first_fit_shared_without_sharing_is_first_fit_decreasing():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 41, 200)
    zero = np.zeros_like(sizes)
    where, rows = first_fit_shared(np.arange(200), sizes, zero, zero, 40)
    assert rows >= -(-sizes.sum() // 40)
    assert rows <= -(-sizes.sum() // 40) * 11 // 9 + 1  # FFD's 11/9 OPT + 1 bound
    used = np.zeros((rows, 40), int)
    for r, c, n in zip(where["row"], where["pcol"], sizes):
        used[r, c:c + n] += 1
    assert used.max() == 1 and used.sum() == sizes.sum()  # in bounds, no overlap
    assert first_fit_shared(np.arange(200), sizes, zero, sizes, 40)[1] == rows  # loads: no cap
    with pytest.raises(ValueError, match="first_fit_shared"):
        first_fit_shared(np.array([0]), np.array([41]), np.array([0]), np.array([0]), 40)


def test_first_fit_shared_places_each_prompt_once_per_row():
    """Two prompts of 6 slots with 5 completions each (own slots 1..5, loads own + 1): each row
    holds a prompt once, before the completions that read it, and nothing overlaps."""
    ids = np.repeat([0, 1], 5)
    p, own = np.full(10, 6), np.tile(np.arange(1, 6), 2)
    where, rows = first_fit_shared(ids, p, own, own + 1, 20, 12)
    _, unshared = first_fit_shared(np.arange(10), p, own, own + 1, 20, 12)
    assert rows == 4 < unshared == 5
    used = np.zeros((rows, 20), int)
    units = {}
    for i in range(10):
        r, c, a = where["row"][i], where["col"][i], where["pcol"][i]
        assert a + p[i] <= c  # the prompt precedes its completion
        units.setdefault((r, a), set()).add(ids[i])
        used[r, c:c + own[i]] += 1
    for (r, a), key in units.items():
        assert len(key) == 1
        used[r, a:a + 6] += 1
    assert used.max() == 1 and used.sum() == 30 + 6 * len(units) and len(units) == 6
    for r in range(rows):
        in_row = where["row"] == r
        assert (own + 1)[in_row].sum() <= 12
        assert len(set(where["branch"][in_row])) == in_row.sum()  # row-unique completion ids


@pytest.mark.parametrize("rows", [0, 1, 5, 13, 32, 33])
def test_split_rows_covers_with_little_padding(rows):
    chunks = split_rows(rows, (8, 4, 2))
    assert set(chunks) <= {8, 4, 2}
    assert rows <= sum(chunks) < rows + 2


def test_make_batch_layout():
    """Each loss sequence's prompt and completion sit where the plan says, a group's prompt
    once per row for its completions there (the rollout's groups, no hashing)."""
    ro = rollout(1, g=G_MAX, prompts=P, lp=LP, n=N, vocab=CFG.vocab_size)
    spec = TrainLayout(seqs=S, num_groups=P, completion_len=N, pack_len=PACK_LEN,
                       chunk_sizes=(2,))
    b = make_batch(ro, spec, pad_id=PAD, mask_truncated=True)
    seqs, chunks = b.seqs, b.chunks
    include = ro.valid & ~ro.truncated & (ro.lengths > 0)
    R = len(include)
    np.testing.assert_array_equal(seqs["chunk"][:R] >= 0, include)
    assert (seqs["chunk"][R:] == -1).all() and seqs["old_logprobs"].shape == (S, N)
    p = np.array([len(ro.examples[r // G_MAX]["prompt_ids"]) for r in range(R)])
    assert (ro.lengths - 1)[include].sum() + p[include].min() <= b.real_tokens
    assert b.real_tokens < int((p + ro.lengths - 1)[include].sum())
    assert b.computed_tokens == sum(c["tokens"].size for c in chunks) == sum(b.sizes) * PACK_LEN
    plan = plan_packing(p, ro.lengths, ro.valid & ~ro.truncated, pack_len=PACK_LEN, loss_cap=N,
                        prompt_ids=np.arange(R) // G_MAX)
    shared = 0
    for s in np.flatnonzero(include):
        ch = chunks[seqs["chunk"][s]]
        r, a, col, ln = seqs["row"][s], plan.pcol[s], plan.col[s], ro.lengths[s]
        prompt = np.asarray(ro.examples[s // G_MAX]["prompt_ids"])
        comp = ro.tokens[s, :ln]
        np.testing.assert_array_equal(ch["tokens"][r, a:a + p[s]], prompt)
        np.testing.assert_array_equal(ch["tokens"][r, col:col + ln - 1], comp[:-1])
        np.testing.assert_array_equal(ch["positions"][r, a:a + p[s]], np.arange(p[s]))
        np.testing.assert_array_equal(ch["positions"][r, col:col + ln - 1],
                                      p[s] + np.arange(ln - 1))
        seg = np.concatenate([ch["segment_ids"][r, a:a + p[s]],
                              ch["segment_ids"][r, col:col + ln - 1]])
        assert seg.min() == seg.max() > 0
        assert (ch["branch_ids"][r, a:a + p[s]] == 0).all()
        assert (ch["branch_ids"][r, col:col + ln - 1] == plan.branch[s]).all()
        # its scored slots, listed from `hstart` on: the prompt's last slot, then its own slots
        h = seqs["hstart"][s]
        np.testing.assert_array_equal(ch["head_slots"][r, h:h + ln],
                                      np.concatenate([[a + p[s] - 1], col + np.arange(ln - 1)]))
        np.testing.assert_array_equal(ch["head_targets"][r, h:h + ln], comp)
        sib = include & (plan.row == plan.row[s]) & (plan.pcol == a)
        shared += sib.sum() > 1
    assert shared > 0  # some rows hold one prompt for several completions
    for c in chunks:  # no row scores more than the cap (= completion_len)
        assert c["head_slots"].shape == c["head_targets"].shape == (len(c["tokens"]), N)
    # rewards: NaN where no reward function applied; group ids global (row_offset)
    ro.scored[3], ro.row_offset = False, 0
    assert np.isnan(make_batch(ro, spec, pad_id=PAD, mask_truncated=True).seqs["rewards"][3])


def test_one_sequence_per_row_is_the_padded_layout():
    """`share_prompts=False`: each loss sequence alone in its row, prompt at slot 0."""
    ro = rollout(2, g=2, prompts=P, lp=LP, n=N, vocab=CFG.vocab_size)
    spec = TrainLayout(seqs=S, num_groups=P, completion_len=N, pack_len=PACK_LEN,
                       chunk_sizes=(4, 1), share_prompts=False)
    b = make_batch(ro, spec, mask_truncated=True)
    include = ro.valid & ~ro.truncated & (ro.lengths > 0)
    assert sum(b.sizes) == include.sum()  # chunks of 4, then 1s: no padding rows
    where = {(int(b.seqs["chunk"][s]), int(b.seqs["row"][s])) for s in np.flatnonzero(include)}
    assert len(where) == include.sum()
    assert all((c["segment_ids"][:, 0] == 1).all() for c in b.chunks)


def test_chunks_split_alike_on_every_process():
    """Two processes, each with its own plan: local rows 5 (the larger) -> global chunks of 4
    and 2 rows (2 + 1 local each), process 1's rows after process 0's in every chunk."""
    p, ln = np.full(5, 2), np.full(5, 3)
    plan = plan_packing(p, ln, np.ones(5, bool), pack_len=8, one_per_row=True)
    assert plan.rows == 5
    split = split_chunks(plan, 5, (4, 2), processes=2, index=1)
    assert split.sizes == (4, 4, 2) and split.local == (2, 2, 1)
    assert split.chunk.tolist() == [0, 0, 1, 1, 2]
    assert split.row.tolist() == [2, 3, 2, 3, 1]
    with pytest.raises(ValueError, match="multiples"):
        split_chunks(plan, 5, (1,), processes=2)


def test_rows_hold_at_most_loss_cap_scored_slots():
    """The second capacity: short prompts with long completions would fit 3 to a row by
    slots, but only 2 by scored slots."""
    p, ln = np.full(6, 2), np.full(6, 5)
    by_slots = plan_packing(p, ln, np.ones(6, bool), pack_len=18)
    capped = plan_packing(p, ln, np.ones(6, bool), pack_len=18, loss_cap=10)
    assert by_slots.rows == 2 and capped.rows == 3
    assert max(ln[capped.row == r].sum() for r in set(capped.row)) <= 10
    assert sorted(capped.hstart) == [0, 0, 0, 5, 5, 5]


def test_plan_rejects_a_sequence_longer_than_a_row():
    with pytest.raises(ValueError, match="pack_len"):
        plan_packing(np.array([8]), np.array([10]), np.array([True]), pack_len=16)


# ------------------------------------------------------------------ the forward
def test_packed_forward_matches_per_sequence_forward():
    """Segment ids keep attention inside a sequence and positions restart: each packed
    sequence's logits equal those of the same sequence run alone."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(2)
    seqs = [rng.integers(3, CFG.vocab_size, n).astype(np.int32) for n in (5, 7, 3)]
    tokens = np.zeros((1, 16), np.int32)
    seg = np.zeros((1, 16), np.int32)
    pos = np.zeros((1, 16), np.int32)
    a = 0
    for i, s in enumerate(seqs):
        tokens[0, a:a + len(s)], seg[0, a:a + len(s)] = s, i + 1
        pos[0, a:a + len(s)] = np.arange(len(s))
        a += len(s)
    packed = np.asarray(model(tokens, positions=pos, segment_ids=seg))
    assert np.isfinite(packed).all()  # padding rows attend to padding, never to nothing
    a = 0
    for s in seqs:
        alone = np.asarray(model(s[None]))
        np.testing.assert_allclose(packed[0, a:a + len(s)], alone[0], atol=1e-5, rtol=1e-5)
        a += len(s)


def test_shared_prompt_forward_matches_per_sequence_forward():
    """One prompt, two completions after it (branch ids): each completion's logits and the
    prompt's equal those of prompt + completion run alone; siblings never see each other."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, CFG.vocab_size, 5).astype(np.int32)
    comps = [rng.integers(3, CFG.vocab_size, n).astype(np.int32) for n in (4, 6)]
    tokens = np.zeros((1, 16), np.int32)
    tokens[0, :5], tokens[0, 5:9], tokens[0, 9:15] = prompt, comps[0], comps[1]
    pos = np.concatenate([np.arange(5), 5 + np.arange(4), 5 + np.arange(6), [0]])[None]
    seg = np.array([[1] * 15 + [0]])
    branch = np.array([[0] * 5 + [1] * 4 + [2] * 6 + [0]])
    packed = np.asarray(model(tokens, positions=pos, segment_ids=seg, branch_ids=branch))
    for c, a in zip(comps, (5, 9)):
        alone = np.asarray(model(np.concatenate([prompt, c])[None]))
        np.testing.assert_allclose(packed[0, :5], alone[0, :5], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(packed[0, a:a + len(c)], alone[0, 5:], atol=1e-5, rtol=1e-5)


def test_fused_attention_layout_matches_einsum_attention():
    """The GPU's fused attention (cuDNN there) runs here through the same
    `jax.nn.dot_product_attention` layout with XLA's kernel: same outputs as the einsum form,
    with grouped-query heads and a packed segment + branch mask."""
    from sagc_jax.models.llama import _attention, _segment_mask, fused_attention

    rng = np.random.default_rng(5)
    B, T, N, K, D = 2, 16, 4, 2, 8
    q = jnp.asarray(rng.standard_normal((B, T, N, D)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, K, T, D)), jnp.float32) for _ in range(2))
    seg = jnp.asarray([[1] * 10 + [2] * 5 + [0], [1] * 16])
    branch = jnp.asarray([[0] * 4 + [1] * 3 + [2] * 3 + [0] * 6, [0] * 16])
    mask = _segment_mask(seg, branch, None) & jnp.tril(jnp.ones((T, T), bool))[None]
    np.testing.assert_allclose(np.asarray(fused_attention(q, k, v, mask, "xla")),
                               np.asarray(_attention(q, k, v, mask)), atol=1e-5, rtol=1e-5)


def test_attention_impl_fuses_only_bf16_on_a_gpu(monkeypatch):
    from sagc_jax.models import llama

    assert llama.attention_impl("bfloat16", 64) == "einsum"  # this CPU
    monkeypatch.setattr(llama.jax, "default_backend", lambda: "gpu")
    assert llama.attention_impl("bfloat16", 64) == "cudnn"
    assert llama.attention_impl("float16", 128) == "cudnn"
    assert llama.attention_impl("float32", 64) == "einsum"  # cuDNN: half precision only
    assert llama.attention_impl("bfloat16", 256) == "einsum"
    assert llama.attention_impl("bfloat16", 60) == "einsum"


# ------------------------------------------------------------------ the plan
def test_plan_declares_packing_shapes():
    from sagc_jax.config import load_config
    from sagc_jax.shapes import ShapePlan, default_chunk_rows

    assert default_chunk_rows(None, 1) == (8, 4, 2, 1)
    assert default_chunk_rows(None, 4) == (32, 16, 8, 4)
    assert default_chunk_rows(6, 1) == (6, 3)
    cfg = load_config(None, ["sampling.prompt_buckets=[16,32]", "sampling.max_new_tokens=100",
                             "sagc.group_sizes=[4,8]", "data.prompts_per_step=8"])
    plan = ShapePlan.from_config(cfg)
    assert plan.packing and plan.pack_len == 136 and plan.max_rows == 64
    assert ShapePlan.from_config(cfg, num_processes=2).packing  # one layout for any processes
    bad = load_config(None, ["sampling.prompt_buckets=[16,32]", "sampling.max_new_tokens=100",
                             "algo.pack_len=64"])
    errors, _ = ShapePlan.from_config(bad).problems()
    assert any("algo.pack_len" in e for e in errors)
