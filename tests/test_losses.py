"""Policy loss vs a NumPy reference, clipping, micro-batch exactness, logprobs, optimizer."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sagc_jax.optim import make_optimizer, make_schedule
from sagc_jax.rl.losses import policy_loss, token_logprobs

EPS, EPS_HIGH, BETA = 0.2, 0.28, 0.05
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _inputs(seed=0, R=6, T=7):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 0.5, (R, T)).astype(np.float32)
    logp = (old + rng.normal(0.0, 0.3, (R, T))).astype(np.float32)  # ratios straddle the clip
    ref = (old + rng.normal(0.0, 0.2, (R, T))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, R).astype(np.float32)
    lens = np.array([7, 3, 5, 1, 0, 6])[:R]  # includes an empty row
    mask = (np.arange(T)[None] < lens[:, None]).astype(np.float32)
    logp[mask == 0] = -np.inf  # garbage on masked positions must not leak into loss or grads
    return logp, old, ref, adv, mask


def _np_loss_and_grad(logp, old, ref, adv, mask, agg, kl, beta, total_tokens, total_seqs, max_tok):
    """Plain NumPy reference: loss and analytic d loss / d logp (float64)."""
    logp, old, ref, adv, mask = (np.asarray(x, np.float64) for x in (logp, old, ref, adv, mask))
    logp = np.where(mask > 0, logp, 0.0)
    rho = np.exp(logp - old)
    a = adv[:, None]
    per = -np.minimum(rho * a, np.clip(rho, 1 - EPS, 1 + EPS_HIGH) * a)
    flat = ((a > 0) & (rho > 1 + EPS_HIGH)) | ((a < 0) & (rho < 1 - EPS))
    g = np.where(flat, 0.0, -rho * a)
    if beta:
        d = ref - logp
        per = per + beta * (-d if kl == "k1" else np.exp(d) - d - 1)
        g = g + beta * (1.0 if kl == "k1" else 1.0 - np.exp(d))
    lens = mask.sum(-1)
    if agg == "token-mean":
        w = mask / total_tokens
    elif agg == "seq-mean-token-mean":
        w = mask / np.maximum(lens, 1)[:, None] / total_seqs
    else:
        w = mask / (total_seqs * max_tok)
    return (per * w).sum(), g * w


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("kl", ["k1", "k3"])
def test_matches_numpy_reference(agg, kl):
    logp, old, ref, adv, mask = _inputs()
    tt, ts, mt = mask.sum(), (mask.sum(-1) > 0).sum(), 10

    def f(lp):
        return policy_loss(
            lp,
            old,
            adv,
            mask,
            epsilon=EPS,
            epsilon_high=EPS_HIGH,
            loss_agg=agg,
            ref_logprobs=ref,
            beta=BETA,
            kl_estimator=kl,
            max_tokens=mt,
        )

    (loss, metrics), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(jnp.asarray(logp))
    ref_loss, ref_grad = _np_loss_and_grad(logp, old, ref, adv, mask, agg, kl, BETA, tt, ts, mt)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-7)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=1e-5, atol=1e-7)
    assert 0.0 < float(metrics["clip_frac"]) < 1.0  # the inputs do exercise both regimes
    assert set(metrics) == {"clip_frac", "kl", "ratio_mean", "pg_loss"}


def test_beta_zero_or_no_ref_skips_kl():
    logp, old, ref, adv, mask = _inputs()
    base, m0 = policy_loss(jnp.asarray(logp), old, adv, mask)
    with_ref, m1 = policy_loss(jnp.asarray(logp), old, adv, mask, ref_logprobs=ref, beta=0.0)
    np.testing.assert_allclose(float(base), float(with_ref))
    np.testing.assert_allclose(float(base), float(m0["pg_loss"]))
    assert float(m0["kl"]) == 0.0 and float(m1["kl"]) == 0.0


@jax.jit
def _one_token_grad(lp, a):
    return jax.grad(
        lambda x: policy_loss(
            x, jnp.zeros((1, 1)), a, jnp.ones((1, 1)), epsilon=EPS, epsilon_high=EPS_HIGH
        )[0]
    )(lp)


def _single_token_grad(rho, a):
    """d loss / d logp for one token with ratio ``rho`` (old logp = 0) and advantage ``a``."""
    lp = jnp.full((1, 1), np.log(rho), jnp.float32)
    return float(_one_token_grad(lp, jnp.full((1,), a, jnp.float32))[0, 0])


def test_clipping_engages_exactly_where_it_should():
    assert _single_token_grad(1.0 + EPS_HIGH + 0.05, +1.0) == 0.0  # A>0, ρ above ceiling
    assert _single_token_grad(1.0 - EPS - 0.05, -1.0) == 0.0  # A<0, ρ below floor
    # The other side of each bound stays unclipped (min picks the unclipped, steeper term).
    assert _single_token_grad(1.0 + EPS_HIGH + 0.05, -1.0) != 0.0
    assert _single_token_grad(1.0 - EPS - 0.05, +1.0) != 0.0
    # Clip-higher: ρ between 1+ε and 1+ε_high still gets gradient for A>0.
    assert _single_token_grad(1.0 + (EPS + EPS_HIGH) / 2, +1.0) != 0.0
    np.testing.assert_allclose(_single_token_grad(1.1, 2.0), -1.1 * 2.0, rtol=1e-5)


@pytest.mark.parametrize("agg", AGGS)
def test_on_policy_is_policy_gradient(agg):
    _, old, _, adv, mask = _inputs()
    grad, metrics = jax.jit(
        jax.grad(
            lambda lp: policy_loss(lp, old, adv, mask, loss_agg=agg, max_tokens=10), has_aux=True
        )
    )(jnp.asarray(old))
    tt, ts, lens = mask.sum(), (mask.sum(-1) > 0).sum(), mask.sum(-1)
    norm = {
        "token-mean": tt,
        "seq-mean-token-mean": np.maximum(lens, 1)[:, None] * ts,
        "seq-mean-token-sum-norm": ts * 10,
    }[agg]
    np.testing.assert_allclose(np.asarray(grad), -adv[:, None] * mask / norm, rtol=1e-5, atol=1e-8)
    assert float(metrics["clip_frac"]) == 0.0
    np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0, rtol=1e-6)


@pytest.mark.parametrize("agg", AGGS)
def test_microbatch_sum_equals_full_batch(agg):
    """Losses and param grads of 2 micro-batches, normalised over the full batch, sum exactly."""
    R, T, V, D = 6, 5, 11, 4
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(R, T, D)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, (R, T)))
    w = jnp.asarray(rng.normal(size=(D, V)), jnp.float32)
    old = token_logprobs(x @ w, targets, 0.7) + jnp.asarray(rng.normal(0, 0.2, (R, T)), jnp.float32)
    ref = old + 0.1
    adv = jnp.asarray(rng.normal(size=R), jnp.float32)
    mask = jnp.asarray(np.arange(T)[None] < np.array([5, 2, 4, 1, 3, 5])[:, None], jnp.float32)
    totals = dict(total_tokens=mask.sum(), total_seqs=jnp.float32(R), max_tokens=T)

    def loss_fn(w, x, targets, old, adv, mask, ref):
        lp = token_logprobs(x @ w, targets, 0.7)
        return policy_loss(
            lp,
            old,
            adv,
            mask,
            epsilon=EPS,
            epsilon_high=EPS_HIGH,
            loss_agg=agg,
            ref_logprobs=ref,
            beta=BETA,
            **totals,
        )

    vg = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    batch = (x, targets, old, adv, mask, ref)
    (full, m_full), g_full = vg(w, *batch)
    (l1, m1), g1 = vg(w, *(b[:3] for b in batch))
    (l2, m2), g2 = vg(w, *(b[3:] for b in batch))
    np.testing.assert_allclose(float(l1 + l2), float(full), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g1 + g2), np.asarray(g_full), rtol=1e-4, atol=1e-7)
    for k in m_full:  # metrics use the same normalisers, so they sum too
        np.testing.assert_allclose(float(m1[k] + m2[k]), float(m_full[k]), rtol=1e-5, atol=1e-7)


def test_token_logprobs():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 3, 9)).astype(np.float32)
    targets = rng.integers(0, 9, (2, 3))
    for temp in (1.0, 0.5):
        z = logits / temp
        ls = z - z.max(-1, keepdims=True)
        ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
        want = np.take_along_axis(ls, targets[..., None], -1)[..., 0]
        got = jax.jit(token_logprobs, static_argnums=2)(jnp.asarray(logits), targets, temp)
        assert got.shape == (2, 3) and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    bf16 = token_logprobs(jnp.asarray(logits, jnp.bfloat16), targets)
    assert bf16.dtype == jnp.float32
    with pytest.raises(ValueError):
        token_logprobs(jnp.asarray(logits), targets, 0.0)


def _cfg(**kw):
    base = dict(
        lr=1e-3,
        warmup_steps=10,
        schedule="cosine",
        min_lr_ratio=0.1,
        weight_decay=0.01,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        max_grad_norm=1.0,
    )
    return types.SimpleNamespace(**{**base, **kw})


def test_schedules():
    s = make_schedule(_cfg(), total_steps=100)
    np.testing.assert_allclose(
        [float(s(0)), float(s(5)), float(s(10)), float(s(100))],
        [0.0, 5e-4, 1e-3, 1e-4],
        rtol=1e-6,
        atol=1e-12,
    )
    assert 1e-4 < float(s(55)) < 1e-3
    c = make_schedule(_cfg(schedule="constant"), total_steps=100)
    np.testing.assert_allclose(
        [float(c(0)), float(c(5)), float(c(10)), float(c(100))],
        [0.0, 5e-4, 1e-3, 1e-3],
        rtol=1e-6,
        atol=1e-12,
    )
    np.testing.assert_allclose(float(make_schedule(_cfg(warmup_steps=0), 100)(0)), 1e-3)
    with pytest.raises(ValueError, match="schedule"):
        make_schedule(_cfg(schedule="linear"), 100)


@pytest.mark.parametrize("max_norm", [1.0, 0.0])
def test_optimizer_clips_global_norm(max_norm):
    tx = make_optimizer(_cfg(max_grad_norm=max_norm, warmup_steps=0), total_steps=10)
    params = {"a": jnp.zeros(3), "b": jnp.zeros((2, 2))}
    grads = {"a": jnp.full(3, 10.0), "b": jnp.full((2, 2), -10.0)}  # global norm sqrt(700)
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    mu = optax.tree_utils.tree_get(state, "mu")  # Adam first moment = (1 − b1) · clipped grad
    norm = float(optax.tree.norm(mu)) / (1 - 0.9)
    np.testing.assert_allclose(norm, 1.0 if max_norm else np.sqrt(700), rtol=1e-5)
    assert float(optax.tree.norm(updates)) > 0
