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


def test_micro_batches_accumulate_exactly(single):
    """4 micro-batches of 4 rows give the same update as one batch of 16."""
    p1, m1 = single
    p_mb, m_mb = _run((1, 1, 1), _batch(), micro_rows=4)
    assert m_mb[0]["loss"] == pytest.approx(m1[0]["loss"], abs=1e-6)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p_mb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_nonfinite_loss_leaves_state_unchanged():
    batch = _batch()
    batch["rewards"][3] = np.nan  # one poisoned reward makes its group's advantages NaN
    params0 = nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))
    params, metrics = _run((1, 1, 1), batch, steps=1)
    assert metrics[0]["finite"] == 0.0
    for a, b in zip(jax.tree.leaves(params0), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_loss_changes_with_settings(single):
    """Sanity: the clip range is really wired in (a tiny clip range changes the loss)."""
    _, m1 = single
    s = dataclasses.replace(SETTINGS, epsilon=0.01, epsilon_high=0.01)
    _, m2 = _run((1, 1, 1), _batch(), settings=s)
    assert m2[0]["clip_frac"] > m1[0]["clip_frac"] + 0.1


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
