"""The one train step over the one layout: loss and gradients equal the unjitted padded reference
(`reference_step.py`) for every combination of aggregation, importance sampling, KL and entropy
masking, with ragged lengths, unscored rows and dropped groups; the shared-prompt and
one-sequence-per-row layouts agree; group order changes nothing; sharded == single device; no
compile after warm-up for any G or length; a non-finite loss leaves the state untouched."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from reference_step import padded_batch, padded_logprobs, reference_loss, reorder, rollout

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.sharding import state_shardings
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.sampling import compile_count
from sagc_jax.shapes import TrainLayout
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import RunState, init_opt_state

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)
LP, N, PACK_LEN = 8, 8, 16  # prompt bucket, completion length, slots per row
P, G_MAX = 4, 4  # prompts per step, the largest G
S = P * G_MAX


def _model():
    return nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))


def _ro(seed: int, g: int = G_MAX, **kw):
    return rollout(seed, g=g, prompts=P, lp=LP, n=N, vocab=CFG.vocab_size, **kw)


def _layout(chunk_sizes, share=True):
    return TrainLayout(seqs=S, num_groups=P, completion_len=N, pack_len=PACK_LEN,
                       chunk_sizes=chunk_sizes, share_prompts=share)


def _steps(settings: LossSettings, opt, params, *, mesh_shape=(1, 1, 1), chunk_sizes=(2,),
           iterations=1):
    """(Learner, params placed on the mesh, fresh optimizer state)."""
    mesh = make_mesh(*mesh_shape, devices=jax.devices()[:int(np.prod(mesh_shape))])
    shard = state_shardings(params, mesh)
    p = jax.device_put(jax.tree.map(np.asarray, params), shard)  # fresh: the steps donate them
    o, o_shard = init_opt_state(opt, p, mesh)
    learner = Learner(_model()[0], opt, settings, mesh, shard, o_shard, _layout(chunk_sizes),
                      num_iterations=iterations)
    return learner, p, o


def _layout_update(ro, settings, opt, params, *, iterations=1, ref=None, share=True,
                   mesh_shape=(1, 1, 1), chunk_sizes=(2,)):
    """The trainer's update of rollout `ro`: make_batch -> Learner.update; (params, metrics,
    the batch, the learner)."""
    learner, p, o = _steps(settings, opt, params, mesh_shape=mesh_shape,
                           chunk_sizes=chunk_sizes, iterations=iterations)
    batch = make_batch(ro, _layout(chunk_sizes, share), mask_truncated=True)
    state, m = learner.update(RunState(p, o, ref_params=ref, step=3), batch)
    assert state.step == (3 if m["finite"] < 1 else 4)  # the update is step's only writer
    return state.params, m, batch, learner


def _reference(ro, settings, params, ref=None):
    """(loss, metrics, params after one SGD(1) step) of the padded reference."""
    batch = padded_batch(ro, lp=LP, n=N)
    if settings.beta > 0:
        batch["ref_logprobs"] = np.asarray(padded_logprobs(*_model()[:1], ref, batch, LP)[0])
    loss, m, grads = reference_loss(_model()[0], params, batch, settings, num_groups=P, lp=LP)
    return float(loss), m, jax.tree.map(lambda p, g: p - g, params, grads)


def _assert_params(a, b, atol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-4)


AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
COMBOS = list(itertools.product(AGGS, ("token", "sequence"), (0.0, 0.04), (1.0, 0.5)))


@pytest.mark.parametrize("agg,isw,beta,quantile", COMBOS)
def test_loss_and_grads_equal_the_padded_reference(agg, isw, beta, quantile):
    """Plain SGD (lr 1): the parameter change IS the gradient. Ragged prompts and completions
    (some empty), a dropped group, two unscored rows, truncation-masked rows; a KL reference
    that differs from the policy."""
    settings = LossSettings(loss_agg=agg, importance_sampling=isw, beta=beta,
                            top_entropy_quantile=quantile, max_tokens=N)
    params = _model()[1]
    ref = jax.tree.map(lambda x: x + 0.01, params) if beta > 0 else None
    ro = _ro(3, unscored=(1, 9))
    loss, m_ref, want = _reference(ro, settings, params, ref)
    got, m, batch, _ = _layout_update(ro, settings, optax.sgd(1.0), params, ref=ref)
    assert len(batch.chunks) > 2 and m["finite"] == 1.0
    assert m["loss"] == pytest.approx(loss, abs=1e-5, rel=1e-5)
    for k in ("pg_loss", "kl", "clip_ratio", "entropy"):
        assert m[k] == pytest.approx(float(m_ref[k]), abs=1e-5, rel=1e-5), k
    _assert_params(got, want)


@pytest.mark.parametrize("settings", [
    LossSettings(beta=0.04, max_tokens=N),
    LossSettings(importance_sampling="sequence", scale_rewards="batch", std_ddof=1,
                 clip_delta=3.0, beta=0.04, kl_bias_correction=True, top_entropy_quantile=0.5,
                 off_policy_threshold=0.05, loss_agg="seq-mean-token-sum-norm", max_tokens=N)])
def test_one_sequence_per_row_equals_shared_prompts_over_mu_2(settings):
    """The padded case of the layout (`algo.packing: false`) and the packed one give the same
    loss and params over μ = 2 iterations (the second off-policy), with the reference and old
    log-prob passes; packing computes fewer slots."""
    params = _model()[1]
    ref = jax.tree.map(lambda x: x + 0.01, params)
    ro = _ro(11, unscored=(2,))
    out = {share: _layout_update(ro, settings, optax.sgd(0.5), params, iterations=2, ref=ref,
                                 share=share) for share in (True, False)}
    (pa, ma, ba, _), (pb, mb, bb, _) = out[True], out[False]
    for k in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "clip_ratio", "ratio_mean",
              "adv_abs_mean", "frac_reward_zero_std", "loss_tokens"):
        assert ma[k] == pytest.approx(mb[k], abs=1e-5, rel=1e-5), k
    assert ma["kl"] > 0
    _assert_params(pa, pb)
    assert ba.computed_tokens < bb.computed_tokens
    assert ma["train_token_util"] > mb["train_token_util"] > 0


def test_group_order_changes_nothing():
    settings = LossSettings(loss_agg="seq-mean-token-mean", max_tokens=N)
    params = _model()[1]
    ro = _ro(5)
    pa, ma, _, _ = _layout_update(ro, settings, optax.sgd(1.0), params)
    pb, mb, _, _ = _layout_update(reorder(ro, [2, 0, 3, 1]), settings, optax.sgd(1.0), params)
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-6)
    _assert_params(pa, pb, atol=1e-6)


def test_no_compile_after_warm_up_for_any_g_or_length():
    """Warm-up compiles every program; then batches of G = 4, 2, 1 with short and full-length
    completions (different chunk counts) compile nothing."""
    settings = LossSettings(beta=0.04, top_entropy_quantile=0.5, max_tokens=N)
    params = _model()[1]
    learner, p, o = _steps(settings, optax.sgd(0.1), params, chunk_sizes=(4, 1), iterations=2)
    state = RunState(p, o, ref_params=jax.tree.map(lambda x: x + 0.01, p))
    learner.warm_up(state.params, state.opt_state)
    chunks = set()
    c0 = compile_count()
    for i, g in enumerate((4, 2, 1, 4)):
        ro = _ro(20 + i, g=g, drop=())
        if i == 3:
            ro.lengths[:] = 1  # one token each: few rows
        batch = make_batch(ro, _layout((4, 1)))
        chunks.add(batch.sizes)
        state, m = learner.update(state, batch)
        assert m["finite"] == 1.0
    assert compile_count() - c0 == 0
    assert len(chunks) > 1


def test_sharded_update_matches_single_device():
    """data=2, fsdp=2 over 4 fake devices: chunks and per-sequence rows sharded over the batch."""
    settings = LossSettings(loss_agg="seq-mean-token-mean", beta=0.04, max_tokens=N)
    params = _model()[1]
    ref = jax.tree.map(lambda x: x + 0.01, params)
    ro = _ro(9)
    # SGD with momentum, not Adam: Adam divides each gradient element by its own running RMS,
    # so an element whose gradient is ~0 moves by ~±lr on the sign of its rounding noise, and
    # a sharded sum's other order flips that sign (seen with jax 0.10.2: one element of 4,096
    # off by 2.7e-4 after two iterations). Momentum keeps a sharded optimizer state while the
    # update stays proportional to the gradient: the two agree to ~1e-8 (params move ~3e-2).
    opt = optax.sgd(1e-1, momentum=0.9)
    p1, m1, _, _ = _layout_update(ro, settings, opt, params, iterations=2, ref=ref,
                                  chunk_sizes=(4,))
    p4, m4, _, _ = _layout_update(ro, settings, opt, params, iterations=2, ref=ref,
                                  chunk_sizes=(4,), mesh_shape=(2, 2, 1))
    assert len(jax.tree.leaves(p4)[3].sharding.device_set) == 4
    assert m1["loss"] == pytest.approx(m4["loss"], abs=1e-5)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(params)))
    assert moved > 1e-3  # the update moved the params: the comparison below is not vacuous
    _assert_params(p1, p4, atol=1e-6)


def test_nonfinite_loss_leaves_state_unchanged():
    params = _model()[1]
    ref = jax.tree.map(lambda x: x * np.nan, params)  # a NaN KL on every loss token (beta > 0)
    settings = LossSettings(beta=0.04, max_tokens=N)
    got, m, _, _ = _layout_update(_ro(4), settings, optax.sgd(1.0), params, ref=ref)
    assert m["finite"] == 0.0
    _assert_params(got, params, atol=0)


def test_loss_changes_with_settings():
    """Sanity: the clip range is really wired in (a tiny clip range changes the clip ratio)."""
    params = _model()[1]
    ro = _ro(6)
    s = LossSettings(max_tokens=N)
    _, m1, _, _ = _layout_update(ro, s, optax.sgd(0.5), params, iterations=2)
    s2 = dataclasses.replace(s, epsilon=0.001, epsilon_high=0.001)
    _, m2, _, _ = _layout_update(ro, s2, optax.sgd(0.5), params, iterations=2)
    assert m2["clip_ratio"] > m1["clip_ratio"]


def test_update_moves_probability_toward_rewarded_tokens():
    """End-to-end direction check: rows whose first completion token is the rewarded one gain
    log-probability after one GRPO update; the others lose it."""
    graphdef, params0 = _model()
    ro = _ro(3, drop=(), truncate=False)
    target = 7
    ro.tokens[::2, 0] = target  # half the rows start with the rewarded token
    ro.lengths = np.maximum(ro.lengths, 1)
    ro.rewards = (ro.tokens[:, 0] == target).astype(np.float32)
    batch = padded_batch(ro, lp=LP, n=N)
    lp0 = np.asarray(padded_logprobs(graphdef, params0, batch, LP)[0])
    ro.logprobs = lp0
    params1, _, _, _ = _layout_update(ro, LossSettings(max_tokens=N), optax.adamw(1e-2),
                                      params0)
    lp1 = np.asarray(padded_logprobs(graphdef, params1, batch, LP)[0])
    delta_first = (lp1 - lp0)[:, 0]
    rewarded = ro.rewards > 0
    assert delta_first[rewarded].mean() > 0 > delta_first[~rewarded].mean()


@pytest.mark.parametrize("agg", AGGS)
def test_noise_scale_terms_are_the_chunks_own(agg):
    """The update's noise-scale terms (`rl.noise_scale`) are its chunks': Σ|c_i|² of each
    chunk's gradient taken alone, and the chunks' weight share Σw²/(Σw)² in [1/k, 1); one
    chunk holding the whole batch has Σ|c_i|² = |g|² and share 1."""
    settings = LossSettings(loss_agg=agg, max_tokens=N)
    params = _model()[1]
    ro = _ro(3, unscored=(1,))
    _, m, batch, _ = _layout_update(ro, settings, optax.sgd(1.0), params)
    k = len(batch.chunks)
    assert k > 2 and 1.0 / k - 1e-6 <= m["noise_weight_share"] < 1.0
    learner2, p, o = _steps(settings, optax.sgd(1.0), params)
    learner2.warm_up(p, o)
    chunks, seqs = learner2.to_device(batch)
    alone = 0.0
    for i, c in enumerate(chunks):
        acc = learner2._compiled[("zeros", 0)](p)
        grads, _ = learner2._compiled[("grad", len(c["tokens"]))](p, acc, c, seqs,
                                                                  learner2._chunk_index(i))
        alone += float(optax.tree.norm(grads, squared=True))
    assert m["noise_chunk_grad_sq"] == pytest.approx(alone, rel=1e-5)
    assert m["noise_chunk_grad_sq"] != pytest.approx(m["grad_norm"] ** 2, rel=1e-3)
    _, m1, batch1, _ = _layout_update(ro, settings, optax.sgd(1.0), params, chunk_sizes=(S,))
    assert len(batch1.chunks) == 1 and m1["noise_weight_share"] == pytest.approx(1.0)
    assert m1["noise_chunk_grad_sq"] == pytest.approx(m1["grad_norm"] ** 2, rel=1e-5)
    assert m1["scored_rows"] == m["scored_rows"] == float((ro.valid & ro.scored).sum())
