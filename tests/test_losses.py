"""Policy loss vs NumPy references of the papers' objectives (GRPO, DAPO, Dr. GRPO, GSPO), entropy,
clipping, micro-batch exactness, logprobs, optimizer."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sagc_jax.optim import make_optimizer, make_schedule
from sagc_jax.rl.losses import (
    entropy_threshold,
    loss_norms,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)

EPS, EPS_HIGH, BETA = 0.2, 0.28, 0.05
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MAX_TOK = 10


def _inputs(seed=0, R=6, T=7):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 0.5, (R, T)).astype(np.float32)
    # Ratios straddle the clip per token, and (through the row shift) per sequence too.
    logp = (old + rng.normal(0.0, 0.3, (R, 1)) + rng.normal(0.0, 0.3, (R, T))).astype(np.float32)
    ref = (old + rng.normal(0.0, 0.2, (R, T))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, R).astype(np.float32)
    ent = rng.uniform(0.0, 3.0, (R, T)).astype(np.float32)
    lens = np.array([7, 3, 5, 1, 0, 6])[:R]  # an empty row: e.g. a truncation-masked completion
    mask = (np.arange(T)[None] < lens[:, None]).astype(np.float32)
    logp[mask == 0] = -np.inf  # garbage on masked positions must not leak into loss or grads
    return logp, old, ref, adv, mask, ent


def _np_objective(logp, old, ref, adv, mask, *, agg, level, kl, delta, ent_keep):
    """The loss as the papers write it, float64, every row counted in Dr. GRPO's constant.

    token (GRPO eq. 3 / DAPO eq. 8):  ρ_t = π/π_old per token
    sequence (GSPO eq. 5):            s_i = exp(mean_t log(π/π_old)), one ratio per sequence
    per token: −min(min(ρ, δ)·A, clip(ρ, 1−ε, 1+ε_h)·A)·[H_t ≥ thr] + β·KL_t
    KL: k1 = logp − ref; k3 = e^d − d − 1 with d = ref − logp; "k3b" = ρ_token·k3 (DeepSeek-V3.2)
    aggregation: token-mean (DAPO), per-sequence mean then mean over sequences with tokens (GRPO),
    Σ / (rows · MAX_TOK) (Dr. GRPO).
    """
    logp = np.where(mask > 0, logp, 0.0).astype(np.float64)
    lr = (logp - old) * mask
    lens = mask.sum(-1)
    if level == "token":
        rho = np.exp(lr)
    else:
        rho = np.repeat(np.exp(lr.sum(-1) / np.maximum(lens, 1))[:, None], mask.shape[1], 1)
    a = adv[:, None].astype(np.float64)
    unc = rho if delta is None else np.minimum(rho, delta)
    per = -np.minimum(unc * a, np.clip(rho, 1 - EPS, 1 + EPS_HIGH) * a) * ent_keep
    if kl is not None:
        d = ref - logp
        k = -d if kl == "k1" else np.exp(d) - d - 1
        per = per + BETA * (k * np.exp(lr) if kl == "k3b" else k)
    per = per * mask
    if agg == "token-mean":
        return per.sum() / mask.sum()
    if agg == "seq-mean-token-mean":
        return (per.sum(-1) / np.maximum(lens, 1)).sum() / (lens > 0).sum()
    return per.sum() / (mask.shape[0] * MAX_TOK)


def _fd_grad(f, x, mask, h=1e-6):
    """Central finite differences of a float64 function on the masked entries."""
    g = np.zeros_like(x, np.float64)
    for idx in zip(*np.nonzero(mask)):
        xp, xm = x.astype(np.float64), x.astype(np.float64)
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (f(xp) - f(xm)) / (2 * h)
    return g


# One case per line, together covering every option with every aggregation at least once.
CASES = [  # (agg, level, kl, delta, top_entropy_quantile)
    ("token-mean", "token", "k3", None, None),               # DAPO
    ("seq-mean-token-mean", "token", "k1", 1.5, None),       # GRPO + two-sided clip
    ("seq-mean-token-sum-norm", "token", "k3b", 1.4, None),  # Dr. GRPO + bias-corrected KL
    ("token-mean", "sequence", "k3b", None, None),
    ("seq-mean-token-mean", "sequence", None, 1.4, None),    # GSPO as in the paper
    ("seq-mean-token-sum-norm", "sequence", "k1", None, None),
    ("token-mean", "token", "k3", None, 0.4),                # 80/20: keep high-entropy tokens
]


@pytest.mark.parametrize("agg,level,kl,delta,topq", CASES)
def test_matches_paper_objective(agg, level, kl, delta, topq):
    logp, old, ref, adv, mask, ent = _inputs()
    thr = None
    ent_keep = np.ones_like(mask)
    if topq is not None:
        thr = float(entropy_threshold(jnp.asarray(ent), mask, topq))
        ent_keep = (ent >= thr).astype(np.float64)
        assert 0.3 < (ent_keep * mask).sum() / mask.sum() < 0.5

    def f(lp):
        return policy_loss(
            lp, old, adv, mask, epsilon=EPS, epsilon_high=EPS_HIGH, clip_delta=delta,
            importance_sampling=level, loss_agg=agg, ref_logprobs=ref,
            beta=BETA if kl else 0.0, kl_estimator="k1" if kl == "k1" else "k3",
            kl_bias_correction=kl == "k3b", entropy=ent, entropy_min=thr,
            norms=loss_norms(mask, mask.shape[0]), max_tokens=MAX_TOK)

    (loss, metrics), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(jnp.asarray(logp))

    def ref_fn(lp):
        return _np_objective(lp, old, ref, adv, mask, agg=agg, level=level, kl=kl, delta=delta,
                             ent_keep=ent_keep)

    np.testing.assert_allclose(float(loss), ref_fn(logp), rtol=1e-5, atol=1e-7)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_allclose(np.asarray(grad), _fd_grad(ref_fn, logp, mask), rtol=2e-4,
                               atol=2e-6)
    # The inputs exercise both sides of the clip, and the metrics follow TRL's definitions.
    assert 0.0 < float(metrics["clip_ratio"]) < 1.0
    assert float(metrics["clip_ratio"]) >= float(metrics["clip_ratio_low"] +
                                                 metrics["clip_ratio_high"]) - 1e-7
    np.testing.assert_allclose(float(metrics["entropy"]), (ent * mask).sum() / mask.sum(),
                               rtol=1e-6)


def test_gspo_token_form_with_masked_tokens():
    """GSPO-token (paper eq. 13): token t's gradient is s_i·A_i·w_i (unclipped) or 0 (clipped,
    or dropped by the entropy mask); the other tokens of its sequence are unaffected."""
    logp, old, _, adv, mask, ent = _inputs(seed=3)
    thr = float(entropy_threshold(jnp.asarray(ent), mask, 0.5))
    grad, metrics = jax.jit(jax.grad(lambda lp: policy_loss(
        lp, old, adv, mask, epsilon=EPS, epsilon_high=EPS_HIGH, importance_sampling="sequence",
        loss_agg="seq-mean-token-mean", entropy=ent, entropy_min=thr), has_aux=True))(
            jnp.asarray(logp))
    lens = mask.sum(-1)
    s = np.exp((np.where(mask > 0, logp - old, 0.0)).sum(-1) / np.maximum(lens, 1))
    flat = ((adv > 0) & (s > 1 + EPS_HIGH)) | ((adv < 0) & (s < 1 - EPS))
    w = 1.0 / (np.maximum(lens, 1) * (lens > 0).sum())  # seq-mean-token-mean weight per token
    want = -(s * adv * w * ~flat)[:, None] * mask * (ent >= thr)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-5, atol=1e-8)
    assert flat.any() and (~flat & (lens > 0)).any()
    np.testing.assert_allclose(float(metrics["ratio_mean"]), (s[:, None] * mask).sum() / mask.sum(),
                               rtol=1e-5)


def test_beta_zero_or_no_ref_skips_kl():
    logp, old, ref, adv, mask, _ = _inputs()
    base, m0 = policy_loss(jnp.asarray(logp), old, adv, mask)
    with_ref, m1 = policy_loss(jnp.asarray(logp), old, adv, mask, ref_logprobs=ref, beta=0.0)
    np.testing.assert_allclose(float(base), float(with_ref))
    np.testing.assert_allclose(float(base), float(m0["pg_loss"]))
    assert float(m0["kl"]) == 0.0 and float(m1["kl"]) == 0.0
    assert "entropy" not in m0


@jax.jit
def _one_token_grad(lp, a):
    return jax.grad(lambda x: policy_loss(x, jnp.zeros((1, 1)), a, jnp.ones((1, 1)), epsilon=EPS,
                                          epsilon_high=EPS_HIGH, clip_delta=1.5)[0])(lp)


def _single_token_grad(rho, a):
    """d loss / d logp for one token with ratio ``rho`` (old logp = 0) and advantage ``a``."""
    lp = jnp.full((1, 1), np.log(rho), jnp.float32)
    return float(_one_token_grad(lp, jnp.full((1,), a, jnp.float32))[0, 0])


def test_clipping_engages_exactly_where_it_should():
    assert _single_token_grad(1.0 + EPS_HIGH + 0.05, +1.0) == 0.0  # A>0, ρ above ceiling
    assert _single_token_grad(1.0 - EPS - 0.05, -1.0) == 0.0  # A<0, ρ below floor
    # The other side of each bound stays unclipped (min picks the unclipped, steeper term).
    np.testing.assert_allclose(_single_token_grad(1.0 + EPS_HIGH + 0.05, -1.0), 1.33, rtol=1e-5)
    assert _single_token_grad(1.0 - EPS - 0.05, +1.0) != 0.0
    # Clip-higher: ρ between 1+ε and 1+ε_high still gets gradient for A>0.
    assert _single_token_grad(1.0 + (EPS + EPS_HIGH) / 2, +1.0) != 0.0
    np.testing.assert_allclose(_single_token_grad(1.1, 2.0), -1.1 * 2.0, rtol=1e-5)
    # Two-sided clip (δ = 1.5): A<0 with ρ > δ gets no gradient, and a bounded loss.
    assert _single_token_grad(1.6, -1.0) == 0.0
    with pytest.raises(ValueError, match="clip_delta"):
        policy_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1), jnp.ones((1, 1)),
                    clip_delta=0.9)
    with pytest.raises(ValueError, match="importance_sampling"):
        policy_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1), jnp.ones((1, 1)),
                    importance_sampling="seq")


@pytest.mark.parametrize("agg", AGGS)
def test_on_policy_is_policy_gradient(agg):
    """At π = π_old the clip is inactive: the gradient is −A·(aggregation weight), and GSPO's equals
    GRPO's (s_i = 1 and ∇s_i = mean_t ∇logp_t, which the aggregation weights reassemble)."""
    _, old, _, adv, mask, _ = _inputs()
    norms = loss_norms(mask, mask.shape[0])
    lens, ts = mask.sum(-1), (mask.sum(-1) > 0).sum()
    norm = {"token-mean": mask.sum(), "seq-mean-token-mean": np.maximum(lens, 1)[:, None] * ts,
            "seq-mean-token-sum-norm": mask.shape[0] * 10}[agg]
    for level in ("token", "sequence"):
        grad, metrics = jax.jit(jax.grad(lambda lp, lv=level: policy_loss(
            lp, old, adv, mask, loss_agg=agg, max_tokens=10, norms=norms,
            importance_sampling=lv), has_aux=True))(jnp.asarray(old))
        np.testing.assert_allclose(np.asarray(grad), -adv[:, None] * mask / norm, rtol=1e-5,
                                   atol=1e-8)
        assert float(metrics["clip_ratio"]) == 0.0
        np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0, rtol=1e-6)


def test_dr_grpo_normaliser_ignores_truncation_masking():
    """Masking a row out (DAPO overlong filtering) leaves Dr. GRPO's per-token weight unchanged,
    while seq-mean (a mean over the kept sequences) re-weights the rest."""
    _, old, _, adv, mask, _ = _inputs()
    masked = mask.copy()
    masked[0] = 0.0

    def grad(m, agg):
        return np.asarray(jax.grad(lambda lp: policy_loss(
            lp, old, adv, m, loss_agg=agg, max_tokens=10, norms=loss_norms(m, 6))[0])(
                jnp.asarray(old)))

    for agg, same in (("seq-mean-token-sum-norm", True), ("seq-mean-token-mean", False)):
        g_full, g_masked = grad(mask, agg), grad(masked, agg)
        np.testing.assert_array_equal(g_masked[0], 0.0)
        assert np.allclose(g_full[1:], g_masked[1:], rtol=1e-6) == same


@pytest.mark.parametrize("agg", AGGS)
def test_microbatch_sum_equals_full_batch(agg):
    """Losses, metrics and param grads of 2 micro-batches, with full-batch normalisers and entropy
    threshold, sum exactly to the full batch's (sequence IS, δ, bias-corrected KL, 80/20 mask)."""
    R, T, V, D = 6, 5, 11, 4
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(R, T, D)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, (R, T)))
    w = jnp.asarray(rng.normal(size=(D, V)), jnp.float32)
    old = token_logprobs(x @ w, targets, 0.7) + jnp.asarray(rng.normal(0, 0.2, (R, T)), jnp.float32)
    ref = old + 0.1
    adv = jnp.asarray(rng.normal(size=R), jnp.float32)
    mask = jnp.asarray(np.arange(T)[None] < np.array([5, 2, 4, 0, 3, 5])[:, None], jnp.float32)
    norms = loss_norms(mask, R)
    _, ent = token_logprobs_and_entropy(x @ w, targets, 0.7)
    thr = entropy_threshold(ent, mask, 0.5)

    def loss_fn(w, x, targets, old, adv, mask, ref):
        lp, h = token_logprobs_and_entropy(x @ w, targets, 0.7)
        return policy_loss(lp, old, adv, mask, epsilon=EPS, epsilon_high=EPS_HIGH, clip_delta=1.3,
                           importance_sampling="sequence", loss_agg=agg, ref_logprobs=ref,
                           beta=BETA, kl_bias_correction=True, entropy=h, entropy_min=thr,
                           norms=norms, max_tokens=T)

    vg = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    batch = (x, targets, old, adv, mask, ref)
    (full, m_full), g_full = vg(w, *batch)
    (l1, m1), g1 = vg(w, *(b[:3] for b in batch))
    (l2, m2), g2 = vg(w, *(b[3:] for b in batch))
    np.testing.assert_allclose(float(l1 + l2), float(full), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g1 + g2), np.asarray(g_full), rtol=1e-4, atol=1e-7)
    assert float(optax.tree.norm(g_full)) > 0
    for k in m_full:  # metrics use the same normalisers, so they sum too
        np.testing.assert_allclose(float(m1[k] + m2[k]), float(m_full[k]), rtol=1e-5, atol=1e-7)


def test_token_logprobs_and_entropy():
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
        lp, h = token_logprobs_and_entropy(jnp.asarray(logits), targets, temp)
        np.testing.assert_allclose(np.asarray(lp), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(h), -(np.exp(ls) * ls).sum(-1), rtol=1e-5)
    bf16 = token_logprobs(jnp.asarray(logits, jnp.bfloat16), targets)
    assert bf16.dtype == jnp.float32
    with pytest.raises(ValueError):
        token_logprobs(jnp.asarray(logits), targets, 0.0)


def test_entropy_threshold_is_masked_quantile():
    rng = np.random.default_rng(4)
    ent = rng.uniform(0, 2, (3, 5)).astype(np.float32)
    mask = rng.random((3, 5)) < 0.6
    ent_masked_out = np.where(mask, ent, 100.0)  # masked values must not count
    for q in (0.0, 0.2, 1.0):
        got = float(entropy_threshold(jnp.asarray(ent_masked_out), mask, q))
        np.testing.assert_allclose(got, np.quantile(ent[mask], 1 - q), rtol=1e-6)
    assert np.isnan(float(entropy_threshold(jnp.asarray(ent), np.zeros((3, 5)), 0.2)))
    with pytest.raises(ValueError, match="top_quantile"):
        entropy_threshold(jnp.asarray(ent), mask, 1.5)


def _cfg(**kw):
    base = dict(lr=1e-3, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1, weight_decay=0.01,
                b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0)
    return types.SimpleNamespace(**{**base, **kw})


def test_schedules():
    s = make_schedule(_cfg(), total_steps=100)
    np.testing.assert_allclose([float(s(0)), float(s(5)), float(s(10)), float(s(100))],
                               [0.0, 5e-4, 1e-3, 1e-4], rtol=1e-6, atol=1e-12)
    assert 1e-4 < float(s(55)) < 1e-3
    c = make_schedule(_cfg(schedule="constant"), total_steps=100)
    np.testing.assert_allclose([float(c(0)), float(c(5)), float(c(10)), float(c(100))],
                               [0.0, 5e-4, 1e-3, 1e-3], rtol=1e-6, atol=1e-12)
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


@pytest.mark.parametrize("agg", AGGS)
def test_off_policy_sequence_masking(agg):
    """DeepSeek-V3.2's mask: a negative-advantage sequence whose mean log(π_old/π) exceeds δ
    loses its policy-gradient term (its KL stays); every other sequence is untouched."""
    logp, old, ref, _, mask, _ = _inputs(seed=5)
    adv = np.array([-1.0, -0.5, 0.8, -1.2, -0.3, 0.6], np.float32)
    lens = mask.sum(-1)
    drift = (np.where(mask > 0, old - logp, 0.0)).sum(-1) / np.maximum(lens, 1)
    neg = (adv < 0) & (lens > 0)
    d = np.sort(drift[neg])
    delta = float(d[0] + d[1]) / 2  # masks some negative rows, keeps others
    off = (adv < 0) & (drift > delta)
    assert off.any() and (neg & ~off).any()

    def f(lp, thr):
        return policy_loss(lp, old, adv, mask, epsilon=EPS, epsilon_high=EPS_HIGH,
                           loss_agg=agg, ref_logprobs=ref, beta=BETA, off_policy_threshold=thr,
                           norms=loss_norms(mask, mask.shape[0]), max_tokens=MAX_TOK)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp), delta)
    keep = np.repeat((~off)[:, None], mask.shape[1], 1).astype(np.float64)

    def ref_fn(lp):
        return _np_objective(lp, old, ref, adv, mask, agg=agg, level="token", kl="k3",
                             delta=None, ent_keep=keep)

    np.testing.assert_allclose(float(loss), ref_fn(logp), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), _fd_grad(ref_fn, logp, mask), rtol=2e-4,
                               atol=2e-6)
    np.testing.assert_allclose(float(metrics["off_policy_masked"]),
                               (mask * off[:, None]).sum() / mask.sum(), rtol=1e-6)
    # δ above every drift masks nothing: the loss is the unmasked one.
    (l_off, m_off), _ = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp), 1e9)
    (l_none, _), _ = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp), None)
    assert float(l_off) == pytest.approx(float(l_none)) and float(m_off["off_policy_masked"]) == 0
    assert float(loss) != pytest.approx(float(l_none))
