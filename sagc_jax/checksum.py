"""Content fingerprints of saved arrays, so a checkpoint that reads back different bits is caught.

Orbax verifies the structure of what it restores (shapes, dtypes), not the values: a bit flip in a
data file restores silently. We store a 64-bit fingerprint per array with every checkpoint and
compare it after restore.

The fingerprint is two position-weighted sums of the array's 32-bit words, modulo 2**32:

    h1 = sum_i w_i * (2 i + 1)            h2 = sum_i rotl(w_i, 13) * (((i ^ C1) * C2) | 1)

with `i` the word's row-major position. Integer sums are exact, so the value does not depend on
how the array is sharded or reduced: it is computed on device (`fingerprints`, one jitted pass, no
host copy, fine for arrays spread over many hosts) and equally by numpy for host arrays
(`fingerprints_np`). Both multipliers are odd, so changing any single word always changes both
sums; a multi-word change goes unnoticed with probability about 2**-64. Not a cryptographic hash:
it guards against storage faults, not against tampering.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["fingerprints", "fingerprints_np", "format_fp", "mismatches"]

_C1, _C2 = 0x2545F491, 0x9E3779B1
_MASK = 0xFFFFFFFF


# ------------------------------------------------------------------------------ device (jax)


def _words(x: jax.Array) -> jax.Array:
    """The array's bits as uint32 words, same shape (8-byte dtypes: a trailing axis of 2)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size in (1, 2):
        return jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16}[size]).astype(
            jnp.uint32)
    if size == 8:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    raise TypeError(f"cannot fingerprint dtype {x.dtype}")


def _leaf_fp(x: jax.Array) -> jax.Array:
    """[2] uint32 fingerprint of one array (see the module docstring)."""
    w = _words(jnp.asarray(x))
    # Row-major position from per-axis iotas: no reshape, so a sharded array stays sharded.
    idx = jnp.zeros(w.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(w.ndim)):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, w.shape, axis) * np.uint32(
            stride & _MASK)
        stride *= w.shape[axis]
    h1 = jnp.sum(w * (idx * np.uint32(2) + np.uint32(1)), dtype=jnp.uint32)
    rot = (w << np.uint32(13)) | (w >> np.uint32(19))
    mult = ((idx ^ np.uint32(_C1)) * np.uint32(_C2)) | np.uint32(1)
    h2 = jnp.sum(rot * mult, dtype=jnp.uint32)
    return jnp.stack([h1, h2])


@jax.jit
def _tree_fp(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([_leaf_fp(x) for x in leaves]) if leaves else jnp.zeros((0, 2), jnp.uint32)


def fingerprints(tree: Any) -> list[str]:
    """Hex fingerprints of the tree's array leaves, in `jax.tree.leaves` order.

    One jitted program per tree structure (compiled on first use); works for sharded arrays on
    any number of processes (every process must call it, as for any collective).
    """
    out = _tree_fp(jax.tree.leaves(tree))
    if not out.is_fully_addressable:
        from jax.experimental import multihost_utils

        out = multihost_utils.process_allgather(out, tiled=True)
    return [format_fp(a, b) for a, b in np.asarray(out).tolist()]


# ------------------------------------------------------------------------------ host (numpy)


def _words_np(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    size = x.dtype.itemsize
    if size in (1, 2, 4):
        return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[size]).astype(np.uint64)
    if size == 8:
        return x.view(np.uint32).reshape(*x.shape, 2).astype(np.uint64)
    raise TypeError(f"cannot fingerprint dtype {x.dtype}")


def _leaf_fp_np(x: Any) -> tuple[int, int]:
    w = _words_np(np.asarray(x)).reshape(-1)
    idx = np.arange(w.size, dtype=np.uint64) & _MASK
    h1 = int(np.sum((w * ((idx * 2 + 1) & _MASK)) & _MASK, dtype=np.uint64)) & _MASK
    rot = ((w << np.uint64(13)) | (w >> np.uint64(19))) & _MASK
    mult = (((idx ^ _C1) * _C2) & _MASK) | 1
    h2 = int(np.sum((rot * mult) & _MASK, dtype=np.uint64)) & _MASK
    return h1, h2


def fingerprints_np(tree: Any) -> list[str]:
    """`fingerprints` computed on the host with numpy (for small host-side state)."""
    return [format_fp(*_leaf_fp_np(x)) for x in jax.tree.leaves(tree)]


# ------------------------------------------------------------------------------ comparison


def format_fp(h1: int, h2: int) -> str:
    return f"{int(h1) & _MASK:08x}{int(h2) & _MASK:08x}"


def mismatches(tree: Any, saved: list[str], got: list[str]) -> list[str]:
    """Key paths of the leaves whose fingerprints differ (all of them if the counts differ)."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if len(saved) != len(got):
        return paths or ["<tree>"]
    return [p for p, a, b in zip(paths, saved, got, strict=True) if a != b]
