"""Sequence packing: the plan is a valid layout, the packed forward scores each token as the
unpacked one does, and the packed update equals the unpacked update for every aggregation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.sharding import state_shardings
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.packing import first_fit_shared, pack_batch, plan_packing, split_rows
from sagc_jax.rl.train_step import LossSettings, completion_logprobs, make_train_step
from sagc_jax.sampling import compile_count
from sagc_jax.train.packed import PackedSteps

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)
LP, N, PACK_LEN, PAD = 8, 8, 16, 0
P = 4  # prompts per step; S = P x the largest G
G_MAX = 4
S = P * G_MAX


def _batch(seed: int, g: int = G_MAX) -> dict[str, np.ndarray]:
    """A ragged rollout batch: prompt lengths 1..LP, completion lengths 0..N, one dropped group
    (valid False) and a few truncated rows left out of the loss (DAPO masking). Each group's
    rows share their prompt, except the last group's (distinct prompts of one length)."""
    rng = np.random.default_rng(seed)
    rows = P * g
    prompt_lens = rng.integers(1, LP + 1, P).repeat(g)
    lengths = rng.integers(0, N + 1, rows).astype(np.int32)
    tokens = rng.integers(3, CFG.vocab_size, (rows, LP + N)).astype(np.int32)
    tokens[:-g, :LP] = tokens[:-g:g, :LP].repeat(g, 0)
    valid = np.ones(rows, bool)
    valid[g:2 * g] = False
    truncated = (lengths == N) & (rng.random(rows) < 0.5)
    return {
        "tokens": tokens, "prompt_pad": (LP - prompt_lens).astype(np.int32), "lengths": lengths,
        "old_logprobs": rng.normal(-np.log(CFG.vocab_size), 0.05, (rows, N)).astype(np.float32),
        "ref_logprobs": rng.normal(-np.log(CFG.vocab_size), 0.05, (rows, N)).astype(np.float32),
        "rewards": rng.integers(0, 2, rows).astype(np.float32),
        "group_ids": (np.arange(rows) // g).astype(np.int32),
        "valid": valid, "loss_rows": valid & ~truncated,
    }


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


def test_pack_batch_layout():
    b = _batch(1)
    chunks, seqs, plan = pack_batch(b, LP, seqs=S, completion_len=N, pack_len=PACK_LEN,
                                    chunk_sizes=(2,), pad_id=PAD)
    include = b["loss_rows"] & (b["lengths"] > 0)
    np.testing.assert_array_equal(plan.packed, include)
    assert (seqs["chunk"][:len(include)][~include] == -1).all() and (seqs["chunk"][16:] == -1).all()
    p = LP - b["prompt_pad"]
    own = (b["lengths"] - 1)[include].sum()
    assert own + p[include].min() <= plan.real_tokens < int((p + b["lengths"] - 1)[include].sum())
    assert plan.computed_tokens == sum(c["tokens"].size for c in chunks)
    shared = 0
    for s in np.flatnonzero(include):
        ch = chunks[plan.chunk[s]]
        r, a, col, ln = plan.row[s], plan.pcol[s], plan.col[s], b["lengths"][s]
        prompt = b["tokens"][s, b["prompt_pad"][s]:LP]
        comp = b["tokens"][s, LP:LP + ln]
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
        h = plan.hstart[s]
        np.testing.assert_array_equal(ch["head_slots"][r, h:h + ln],
                                      np.concatenate([[a + p[s] - 1], col + np.arange(ln - 1)]))
        np.testing.assert_array_equal(ch["head_targets"][r, h:h + ln], comp)
        sib = include & (plan.chunk == plan.chunk[s]) & (plan.row == r) & (plan.pcol == a)
        shared += sib.sum() > 1
    assert shared > 0  # some rows hold one prompt for several completions
    for c in chunks:  # no row scores more than the cap (= completion_len)
        assert c["head_slots"].shape == c["head_targets"].shape == (len(c["tokens"]), N)


def test_rows_hold_at_most_loss_cap_scored_slots():
    """The second capacity: short prompts with long completions would fit 3 to a row by
    slots, but only 2 by scored slots."""
    p, ln = np.full(6, 2), np.full(6, 5)
    by_slots = plan_packing(p, ln, np.ones(6, bool), pack_len=18, chunk_sizes=(1,))
    capped = plan_packing(p, ln, np.ones(6, bool), pack_len=18, chunk_sizes=(1,), loss_cap=10)
    assert len(by_slots.chunks) == 2 and len(capped.chunks) == 3
    rows = capped.chunk * 10 + capped.row
    assert max(ln[rows == r].sum() for r in set(rows)) <= 10
    assert sorted(capped.hstart) == [0, 0, 0, 5, 5, 5]


def test_plan_rejects_a_sequence_longer_than_a_row():
    with pytest.raises(ValueError, match="pack_len"):
        plan_packing(np.array([8]), np.array([10]), np.array([True]), pack_len=16,
                     chunk_sizes=(1,))


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


# ------------------------------------------------------------------ the update
def _model():
    return nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))


def _unpacked(graphdef, params, batch, settings, opt, steps):
    fn = jax.jit(make_train_step(graphdef, opt, settings, num_groups=P, prompt_len=LP))
    opt_state = opt.init(params)
    ms = []
    for _ in range(steps):
        params, opt_state, m = fn(params, opt_state, batch)
        ms.append({k: float(v) for k, v in m.items()})
    return params, ms


def _packed(graphdef, params, batch, settings, opt, steps, *, mesh_shape=(1, 1, 1),
            chunk_sizes=(2,), packed_steps=None):
    mesh = make_mesh(*mesh_shape, devices=jax.devices()[:int(np.prod(mesh_shape))])
    shard = state_shardings(params, mesh)
    params = jax.device_put(jax.tree.map(np.asarray, params), shard)  # fresh: steps donate them
    opt_state = opt.init(params)
    ps = packed_steps or PackedSteps(graphdef, opt, settings, mesh, shard,
                                     jax.tree.map(lambda x: x.sharding, opt_state),
                                     num_groups=P, seqs=S, completion_len=N, pack_len=PACK_LEN,
                                     chunk_sizes=chunk_sizes)
    chunks, seqs, plan = pack_batch(batch, LP, seqs=S, completion_len=N, pack_len=PACK_LEN,
                                    chunk_sizes=chunk_sizes, pad_id=PAD)
    dev_chunks, dev_seqs = ps.to_device(chunks, seqs)
    ms = []
    for _ in range(steps):
        params, opt_state, m = ps.update(params, opt_state, dev_chunks, dev_seqs)
        ms.append({k: float(v) for k, v in m.items()})
    return params, ms, plan, ps


def _assert_same(pa, ma, pb, mb, atol=1e-5):
    for x, y in zip(ma, mb):
        for k in ("loss", "pg_loss", "kl", "clip_ratio", "ratio_mean", "grad_norm", "entropy",
                  "frac_reward_zero_std", "off_policy_masked", "adv_abs_mean", "loss_tokens"):
            assert x[k] == pytest.approx(y[k], abs=atol, rel=1e-5), k
    for a, b in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@pytest.mark.parametrize("agg", AGGS)
def test_packed_update_equals_unpacked(agg):
    """Plain SGD (lr 1): the parameter change IS the gradient, so equal params after two
    updates mean equal loss and gradients, also off-policy on the second one (ratios != 1)."""
    settings = LossSettings(loss_agg=agg, beta=0.04 if agg == "token-mean" else 0.0,
                            max_tokens=N)
    opt = optax.sgd(1.0)
    graphdef, params = _model()
    batch = _batch(3)
    pu, mu = _unpacked(graphdef, params, batch, settings, opt, steps=2)
    pp, mp, plan, _ = _packed(graphdef, params, batch, settings, opt, steps=2)
    assert len(plan.chunks) > 2  # several accumulated chunks
    assert mu[1]["clip_ratio"] > 0 or mu[1]["ratio_mean"] != 1.0
    _assert_same(pu, mu, pp, mp)


def test_packed_update_equals_unpacked_with_algo_options():
    """GSPO sequence ratios, batch reward scaling, two-sided clipping, the KL bias correction,
    entropy masking (a full-batch threshold across chunks) and unscored (NaN-reward) rows: the
    packed path applies each exactly as the unpacked step does."""
    settings = LossSettings(importance_sampling="sequence", scale_rewards="batch", std_ddof=1,
                            clip_delta=3.0, beta=0.04, kl_bias_correction=True,
                            top_entropy_quantile=0.5, off_policy_threshold=0.05, max_tokens=N)
    opt = optax.sgd(1.0)
    graphdef, params = _model()
    batch = _batch(4)
    batch["rewards"][[1, 9]] = np.nan  # every reward function returned None
    pu, mu = _unpacked(graphdef, params, batch, settings, opt, steps=2)
    pp, mp, plan, _ = _packed(graphdef, params, batch, settings, opt, steps=2)
    assert len(plan.chunks) > 2
    assert mu[0]["entropy"] > 0 and 0 <= mu[0]["frac_reward_zero_std"] <= 1
    _assert_same(pu, mu, pp, mp)


def test_variable_group_size_and_chunk_sizes_share_compiled_steps():
    """G = 4 then G = 2 (rows padded to S) on the same compiled steps, with chunks of two
    sizes: still equal to the unpacked update, and no new compile for the second batch."""
    settings = LossSettings(max_tokens=N)
    opt = optax.sgd(1.0)
    graphdef, params = _model()
    ps, compiles = None, []
    for g, seed in ((4, 5), (2, 6)):
        batch = _batch(seed, g)
        pu, mu = _unpacked(graphdef, params, batch, settings, opt, 1)
        c0 = compile_count()
        pp, mp, _, ps = _packed(graphdef, params, batch, settings, opt, 1,
                                   chunk_sizes=(4, 1), packed_steps=ps)
        if g == 4:
            ps.warm_up(params, opt.init(params), need_logprobs=False)
        compiles.append(compile_count() - c0)
        _assert_same(pu, mu, pp, mp)
    assert compiles[0] > 0 and compiles[1] == 0


def test_packed_logprob_pass_matches_unpacked():
    """The old / reference log-prob pass (μ > 1, KL) scores every loss token as unpacked."""
    graphdef, params = _model()
    batch = _batch(7)
    _, _, plan, ps = _packed(graphdef, params, batch, LossSettings(max_tokens=N), optax.sgd(1.0),
                             0)
    chunks, seqs, _ = pack_batch(batch, LP, seqs=S, completion_len=N, pack_len=PACK_LEN,
                                 chunk_sizes=(2,), pad_id=PAD)
    got = np.asarray(ps.logprobs(params, *ps.to_device(chunks, seqs)))
    want = np.asarray(completion_logprobs(graphdef, params, batch["tokens"], batch["prompt_pad"],
                                          batch["lengths"], LP, 1.0))
    mask = (np.arange(N)[None] < batch["lengths"][:, None]) & plan.packed[:, None]
    np.testing.assert_allclose(got[:len(mask)][mask], want[mask], atol=1e-5, rtol=1e-5)
    assert (got[16:] == 0).all()


def test_sharded_packed_update_matches_single_device():
    """data=2, fsdp=2 over 4 fake devices, chunks of 4 rows sharded over the batch."""
    settings = LossSettings(loss_agg="seq-mean-token-mean", max_tokens=N)
    opt = optax.sgd(1.0)
    graphdef, params = _model()
    batch = _batch(9)
    pu, mu = _unpacked(graphdef, params, batch, settings, opt, steps=1)
    p4, m4, _, _ = _packed(graphdef, params, batch, settings, opt, 1, mesh_shape=(2, 2, 1),
                            chunk_sizes=(4,))
    assert len(jax.tree.leaves(p4)[3].sharding.device_set) == 4
    _assert_same(pu, mu, p4, m4, atol=2e-5)


# ------------------------------------------------------------------ the learner and the plan
def test_learner_packed_equals_padded_with_kl_and_mu_2():
    """The wiring: Learner.update with packing (reference and old log-prob passes, μ = 2
    iterations, KL) gives the padded learner's params and metrics; util is reported."""
    from sagc_jax.rl.batch import TrainBatch
    from sagc_jax.train.learner import CompiledSteps, Learner
    from sagc_jax.train.state import TrainState

    settings = LossSettings(beta=0.04, max_tokens=N)
    opt = optax.sgd(0.5)
    graphdef, params = _model()
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    shard = state_shardings(params, mesh)
    batch = _batch(11)
    out = {}
    for name in ("padded", "packed"):
        p = jax.device_put(jax.tree.map(np.asarray, params), shard)
        o = opt.init(p)
        o_shard = jax.tree.map(lambda x: x.sharding, o)
        steps = CompiledSteps(graphdef, opt, settings, mesh, shard, o_shard)
        packed = PackedSteps(graphdef, opt, settings, mesh, shard, o_shard, num_groups=P,
                             seqs=S, completion_len=N, pack_len=PACK_LEN,
                             chunk_sizes=(2,)) if name == "packed" else None
        learner = Learner(steps, beta=0.04, num_iterations=2, packed=packed, pad_id=PAD)
        learner.ref_params = jax.tree.map(lambda x: x + 0.01, p)  # a reference != the policy
        state, m = learner.update(TrainState(p, o, 0),
                                  TrainBatch(dict(batch), LP, N, num_groups=P))
        out[name] = (state.params, m)
    (pa, ma), (pb, mb) = out["padded"], out["packed"]
    assert ma["kl"] > 0
    _assert_same(pa, [ma], pb, [mb])
    assert mb["train_token_util"] > ma["train_token_util"] > 0


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
    assert plan.completion_bucket(3) == plan.completion_buckets[-1]
    assert not ShapePlan.from_config(cfg, num_processes=2).packing  # single-process only
    bad = load_config(None, ["sampling.prompt_buckets=[16,32]", "sampling.max_new_tokens=100",
                             "algo.pack_len=64"])
    errors, _ = ShapePlan.from_config(bad).problems()
    assert any("algo.pack_len" in e for e in errors)
