"""`models.precision.matmul` (`model.matmul_dtype`): bf16 operands, float32 accumulation, in
the forward and in both backward products; the all-float32 path is the plain product."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sagc_jax.models.config import ModelConfig, ModelConfigError
from sagc_jax.models.llama import Transformer
from sagc_jax.models.precision import matmul, row_major_t

BF = jnp.bfloat16


def _bf(a: np.ndarray) -> np.ndarray:
    """a rounded to bfloat16, as float64 (the exact product of rounded operands)."""
    return np.asarray(jnp.asarray(a, BF), np.float64)


@pytest.fixture(scope="module")
def xwg() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.normal(size=(6, 48)).astype(np.float32),
            rng.normal(size=(48, 40)).astype(np.float32),
            rng.normal(size=(6, 40)).astype(np.float32))


def test_float32_is_the_plain_product(xwg):
    x, w, _ = xwg
    np.testing.assert_array_equal(np.asarray(matmul(jnp.asarray(x), jnp.asarray(w), "float32")),
                                  np.asarray(jnp.asarray(x) @ jnp.asarray(w)))
    np.testing.assert_array_equal(np.asarray(row_major_t(jnp.asarray(w))), w.T)


@pytest.mark.parametrize("w_t", [False, True])
def test_bf16_forward_and_backward(xwg, w_t):
    """y = bf16(x) bf16(w) and, for a cotangent g, dx = bf16(g) bf16(w)^T and dw = bf16(x)^T
    bf16(g): each the float32-accumulated product of bf16-rounded operands, in the primals'
    dtype (float32). With `w_t` the weight is stored [out, in] (a tied LM head)."""
    x, w, g = xwg
    ws = w.T.copy() if w_t else w
    f = lambda x, w: matmul(x, w, "bfloat16", w_t=w_t)  # noqa: E731
    y, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(ws))
    dx, dw = vjp(jnp.asarray(g))
    assert y.dtype == dx.dtype == dw.dtype == jnp.float32
    tol = dict(rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(y), _bf(x) @ _bf(w), **tol)
    np.testing.assert_allclose(np.asarray(dx), _bf(g) @ _bf(w).T, **tol)
    want_dw = _bf(x).T @ _bf(g)
    np.testing.assert_allclose(np.asarray(dw), want_dw.T if w_t else want_dw, **tol)
    assert np.abs(np.asarray(y) - x @ w).max() > 1e-3  # the rounding did happen


def test_bf16_under_a_bf16_model_accumulates_in_float32():
    """bf16 x bf16 operands: the result is the float32 sum rounded once to bf16."""
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 512)), rng.normal(size=(512, 8))
    y = matmul(jnp.asarray(x, BF), jnp.asarray(w, BF))
    assert y.dtype == BF
    np.testing.assert_array_equal(np.asarray(y, np.float64), _bf(_bf(x) @ _bf(w)))


def test_model_gradient_tracks_float32():
    """A tied-head model's loss gradient under bf16 matmuls is the float32 one up to bf16
    rounding (cosine > 0.999), and is not the float32 one (the setting took effect)."""
    cfg = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)

    def grads(matmul_dtype):
        model = nnx.merge(graphdef, params)
        model.cfg = dataclasses.replace(cfg, matmul_dtype=matmul_dtype)
        gd, p = nnx.split(model)

        def loss(p):
            logits = nnx.merge(gd, p)(ids[:, :-1])
            return -jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], -1).mean()

        g = jax.grad(loss)(p)
        return np.concatenate([np.ravel(a) for a in jax.tree.leaves(g)])

    g32, g16 = grads(None), grads("bfloat16")
    cos = g32 @ g16 / np.linalg.norm(g32) / np.linalg.norm(g16)
    assert 0.999 < cos < 1.0 - 1e-9, cos


def test_bad_matmul_dtype_names_the_field():
    with pytest.raises(ModelConfigError, match="matmul_dtype"):
        ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                    num_heads=1, num_kv_heads=1, head_dim=8, matmul_dtype="float16")
