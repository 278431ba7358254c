"""The policy's matmuls in `model.matmul_dtype`: bfloat16 operands, float32 accumulation.

`matmul(x, w, dtype)` is every dense layer's and the LM head's product. With `dtype` float32
(or the operands already in it) it is the plain `x @ w`. With `dtype` bfloat16 under a float32
model it is mixed precision as torch autocast does it: both operands rounded to bf16, products
accumulated in float32, the result back in x's dtype; master weights, norms, softmax, the KV
cache and the loss stay in `model.dtype`. The backward runs its two products the same way
(a custom VJP: autodiff would hand XLA a float32 cotangent against a bf16 operand, which it
upcasts), and returns gradients in the primals' dtypes, accumulated in float32.

Why the explicit transposes (`row_major_t`): XLA:CPU runs a bf16 x bf16 -> f32 dot on its
fast path (2x the float32 rate on AVX512-BF16: 341 vs 159 GFLOP/s at [1664, 576] x [576,
1536], benchmarks/README.md) only when both operands are row-major with the canonical
contracting dims; a transposed operand (x^T dy, dy W^T, x E^T) is upcast to float32 instead.
A transpose XLA cannot fold into the dot's dimension numbers (through a 3-d view) costs one
copy of the operand and keeps the fast path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def row_major_t(a: jax.Array) -> jax.Array:
    """a [m, n] -> a^T [n, m], materialised row-major (not a layout XLA folds into a dot)."""
    m, n = a.shape
    return a.reshape(m, n, 1).transpose(1, 0, 2).reshape(n, m)


def dot_f32(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [m, k] @ b [k, n] accumulated (and returned) in float32 whatever the operands' dtype."""
    return jax.lax.dot(a, b, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def mixed_matmul(x: jax.Array, w: jax.Array, dtype: str, w_t: bool, out_dtype: str) -> jax.Array:
    """x [m, in] @ w [in, out] (w [out, in] with `w_t`) with operands rounded to `dtype`,
    float32 accumulation, the result in `out_dtype`; its custom VJP keeps the primals as the
    residuals (below). What `matmul` calls when any dtype is not float32; looked up at trace
    time, so a benchmark may patch in another VJP (benchmarks/packed_update.py)."""
    return _mixed_fwd(x, w, dtype, w_t, out_dtype)[0]


def _mixed_fwd(x, w, dtype, w_t, out_dtype):
    xc, wc = x.astype(dtype), w.astype(dtype)
    y = dot_f32(xc, row_major_t(wc) if w_t else wc).astype(out_dtype)
    return y, (x, w)


def _mixed_bwd(dtype, w_t, out_dtype, res, g):
    # The primals are the residuals, rounded again here: under `scan`, a weight residual is the
    # layer's own slice (no copy) and an activation one is what the layer saves anyway; saving
    # the bf16 copies instead made XLA convert every stacked copy back to f32 before the
    # backward loop (~3 s of a 12 s chunk gradient, benchmarks/README.md).
    x, w = res
    xc, wc, gc = x.astype(dtype), w.astype(dtype), g.astype(dtype)
    dx = dot_f32(gc, wc if w_t else row_major_t(wc)).astype(x.dtype)
    dw = dot_f32(row_major_t(xc), gc)  # [in, out]
    return dx, (row_major_t(dw) if w_t else dw).astype(w.dtype)


mixed_matmul.defvjp(_mixed_fwd, _mixed_bwd)


def matmul(x: jax.Array, w: jax.Array, dtype: str | None = None, *, w_t: bool = False,
           out_dtype: str | None = None) -> jax.Array:
    """x [..., in] @ w [in, out] (or w [out, in] transposed with `w_t`) -> [..., out].

    Operands in `dtype` (None: w's dtype), float32 accumulation, result in `out_dtype` (None:
    x's dtype). All float32: plain `x @ w`, bit-identical to the code before this module.
    """
    dtype = jnp.dtype(dtype or w.dtype).name
    out_dtype = jnp.dtype(out_dtype or x.dtype).name
    if x.dtype == w.dtype == dtype == out_dtype == "float32":
        return jnp.dot(x, w.T if w_t else w)
    lead = x.shape[:-1]
    y = mixed_matmul(x.reshape(-1, x.shape[-1]), w, dtype, w_t, out_dtype)
    return y.reshape(*lead, y.shape[-1])
