"""The jitted GRPO step: sharded over 4 fake devices == single device; accumulation is exact;
a non-finite loss leaves the state untouched."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.sharding import state_shardings
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.train.learner import CompiledSteps

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8)
G, P, LP, N = 4, 4, 8, 8  # group size, prompts, prompt bucket, completion bucket


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = G * P
    prompt_lens = rng.integers(2, LP + 1, rows // G).repeat(G)
    lengths = rng.integers(1, N + 1, rows).astype(np.int32)
    tokens = rng.integers(3, CFG.vocab_size, (rows, LP + N)).astype(np.int32)
    return {
        "tokens": tokens, "prompt_pad": (LP - prompt_lens).astype(np.int32), "lengths": lengths,
        # Near the untrained model's uniform log-prob, so ratios sit around 1.
        "old_logprobs": rng.normal(-np.log(CFG.vocab_size), 0.05, (rows, N)).astype(np.float32),
        "ref_logprobs": rng.normal(-np.log(CFG.vocab_size), 0.05, (rows, N)).astype(np.float32),
        "rewards": rng.integers(0, 2, rows).astype(np.float32),
        "group_ids": (np.arange(rows) // G).astype(np.int32),
        "valid": np.ones(rows, bool), "loss_rows": np.ones(rows, bool),
    }


SETTINGS = LossSettings(beta=0.04, max_tokens=N)


def _run(mesh_shape: tuple[int, int, int], batch, settings=SETTINGS,
         micro_rows=None, steps: int = 2):
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    mesh = make_mesh(*mesh_shape, devices=devices)
    graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    shard = state_shardings(params, mesh)
    params = jax.device_put(params, shard)
    opt = optax.adamw(1e-2)
    opt_state = jax.jit(opt.init)(params)
    opt_shard = jax.tree.map(lambda x: x.sharding, opt_state)
    if not all(isinstance(s, jax.sharding.NamedSharding) for s in jax.tree.leaves(opt_shard)):
        rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        opt_shard = jax.tree.map(lambda s: s if isinstance(s, jax.sharding.NamedSharding)
                                 else rep, opt_shard)
        opt_state = jax.device_put(opt_state, opt_shard)
    steps_ = CompiledSteps(graphdef, opt, settings, mesh, shard, opt_shard, micro_rows)
    rows = len(batch["lengths"])
    fn = steps_.train_fn(rows, rows // G, LP)
    bs = steps_.batch_shardings(rows)
    dev = {k: jax.device_put(v, bs[k]) for k, v in batch.items()}
    metrics = []
    for _ in range(steps):
        params, opt_state, m = fn(params, opt_state, dev)
        metrics.append({k: float(v) for k, v in m.items()})
    return params, metrics


@pytest.fixture(scope="module")
def single():
    return _run((1, 1, 1), _batch())


def test_sharded_step_matches_single_device(single):
    """data=1, fsdp=2, tensor=2 over 4 fake CPU devices; tolerance 2e-5 (f32 reduction order)."""
    p1, m1 = single
    p4, m4 = _run((1, 2, 2), _batch())
    leaf = jax.tree.leaves(p4)[3]
    assert len(leaf.sharding.device_set) == 4
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    for x, y in zip(m1, m4):
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)


def test_data_parallel_step_matches_single_device(single):
    p1, _ = single
    p4, _ = _run((4, 1, 1), _batch())
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_fsdp_micro_batched_step_matches_single_device(single):
    """fsdp=4 with 2 micro-batches of 8 rows: the interleaved split and the pinned rows
    sharding (each layer's weights gathered, activations kept sharded) change nothing."""
    p1, m1 = single
    p4, m4 = _run((1, 4, 1), _batch(), micro_rows=8)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    assert m4[0]["loss"] == pytest.approx(m1[0]["loss"], abs=1e-5)


def test_micro_batches_accumulate_exactly(single):
    """4 micro-batches of 4 rows give the same update as one batch of 16."""
    p1, m1 = single
    p_mb, m_mb = _run((1, 1, 1), _batch(), micro_rows=4)
    assert m_mb[0]["loss"] == pytest.approx(m1[0]["loss"], abs=1e-6)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p_mb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_nonfinite_loss_leaves_state_unchanged():
    batch = _batch()
    batch["ref_logprobs"][3, 0] = np.inf  # an infinite k3 KL on a loss token (beta > 0)
    params0 = nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))
    params, metrics = _run((1, 1, 1), batch, steps=1)
    assert metrics[0]["finite"] == 0.0
    for a, b in zip(jax.tree.leaves(params0), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# Every new algo option at once: GSPO ratios, two-sided clip, bias-corrected KL, batch-scaled
# advantages with the unbiased std, 80/20 entropy masking, Dr. GRPO aggregation.
ALL_OPTIONS = dataclasses.replace(
    SETTINGS, importance_sampling="sequence", clip_delta=1.5, kl_bias_correction=True,
    scale_rewards="batch", std_ddof=1, top_entropy_quantile=0.5, off_policy_threshold=0.05,
    loss_agg="seq-mean-token-sum-norm")


def _all_options_batch():
    batch = _batch(5)
    batch["rewards"][2] = np.nan  # a row every reward function scored None
    batch["loss_rows"][7] = False  # a truncation-masked row
    return batch


@pytest.fixture(scope="module")
def all_options():
    return _run((1, 1, 1), _all_options_batch(), settings=ALL_OPTIONS)


def test_all_options_accumulate_exactly_over_mu_steps(all_options):
    """4 micro-batches == 1 batch with every option on, over 2 updates on the same rollouts
    (μ = 2: the second update is off-policy): the entropy threshold and normalisers are the
    full batch's."""
    p1, m1 = all_options
    p_mb, m_mb = _run((1, 1, 1), _all_options_batch(), settings=ALL_OPTIONS, micro_rows=4)
    for x, y in zip(m1, m_mb):
        assert x["finite"] == 1.0
        for k in ("loss", "grad_norm", "entropy", "clip_ratio", "frac_reward_zero_std", "kl",
                  "off_policy_masked"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), k
    assert m1[1]["ratio_mean"] != pytest.approx(1.0, abs=1e-4)  # really off-policy at step 2
    # Adam divides by sqrt(v): f32 summation-order noise in a near-zero gradient entry shows up
    # as a sizeable fraction of one step (lr = 1e-2), hence 1e-4 (1 % of a step). The order is
    # the CPU's: an AVX-512 machine put one entry of 4096 at 5.4e-5 (2026-12-04).
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p_mb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_all_options_sharded_matches_single_device(all_options):
    p1, m1 = all_options
    p4, m4 = _run((2, 2, 1), _all_options_batch(), settings=ALL_OPTIONS)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):  # atol: see the test above
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)
    assert m4[0]["loss"] == pytest.approx(m1[0]["loss"], abs=1e-5)


def test_unscored_row_is_padding_for_the_update(single):
    """A NaN reward (all reward functions returned None) updates exactly like a padding row."""
    nan_batch, pad_batch = _batch(), _batch()
    nan_batch["rewards"][5] = np.nan
    pad_batch["valid"][5] = pad_batch["loss_rows"][5] = False
    p_nan, m_nan = _run((1, 1, 1), nan_batch, steps=1)
    p_pad, _ = _run((1, 1, 1), pad_batch, steps=1)
    assert m_nan[0]["finite"] == 1.0
    for a, b in zip(jax.tree.leaves(p_nan), jax.tree.leaves(p_pad)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, m1 = single  # ... and not like scoring the row
    assert m_nan[0]["loss"] != pytest.approx(m1[0]["loss"], abs=1e-6)


def test_metrics_rows(single):
    _, m = single
    assert 0.0 < m[0]["entropy"] <= np.log(CFG.vocab_size) + 1e-4  # nats, at most uniform
    assert 0.0 <= m[0]["frac_reward_zero_std"] <= 1.0
    assert m[1]["clip_ratio"] >= m[1]["clip_ratio_low"] + m[1]["clip_ratio_high"] - 1e-7


def test_loss_changes_with_settings(single):
    """Sanity: the clip range is really wired in (a tiny clip range changes the loss)."""
    _, m1 = single
    s = dataclasses.replace(SETTINGS, epsilon=0.01, epsilon_high=0.01)
    _, m2 = _run((1, 1, 1), _batch(), settings=s)
    assert m2[0]["clip_ratio"] > m1[0]["clip_ratio"] + 0.1


def test_update_moves_probability_toward_rewarded_tokens():
    """End-to-end direction check: rows whose first completion token is the rewarded one gain
    log-probability after one GRPO update; the others lose it."""
    from sagc_jax.rl.train_step import completion_logprobs

    batch = _batch(3)
    rows = len(batch["lengths"])
    target = 7
    batch["tokens"][::2, LP] = target  # half the rows start with the rewarded token
    batch["rewards"] = (batch["tokens"][:, LP] == target).astype(np.float32)
    graphdef, params0 = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    lp0 = completion_logprobs(graphdef, params0, batch["tokens"], batch["prompt_pad"],
                              batch["lengths"], LP, 1.0)
    batch["old_logprobs"] = np.asarray(lp0)
    params1, _ = _run((1, 1, 1), batch, settings=LossSettings(max_tokens=N), steps=1)
    lp1 = completion_logprobs(graphdef, params1, batch["tokens"], batch["prompt_pad"],
                              batch["lengths"], LP, 1.0)
    delta_first = np.asarray(lp1 - lp0)[:, 0]
    rewarded = batch["rewards"] > 0
    assert delta_first[rewarded].mean() > 0 > delta_first[~rewarded].mean()
    assert rows == G * P
