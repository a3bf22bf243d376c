"""Shared pieces of the streaming log-sum-exp + top-k statistics.

Every implementation of the top-k reverse KL (reference, chunked XLA, Pallas) reduces the
student's vocabulary row to the same three statistics, and differentiates them the same way:

- ``lse``     [N]     float32: log-sum-exp of the row,
- ``values``  [N, k]  float32: the k largest logits, descending,
- ``indices`` [N, k]  int32:   their vocabulary ids; ties go to the lower id (as ``lax.top_k``).

The KL itself is a cheap function of these ([N, k] work, see ``topk_reverse_kl.py``), so JAX
differentiates it; the vocabulary-sized work lives only here. The vector-Jacobian product of
the statistics w.r.t. a logit z_m is

    dz_m = g_lse * softmax(z)_m + sum_j g_values[j] * 1[m == indices[j]]

(the top-k set is piecewise constant, so ``indices`` get no cotangent). Composed with the KL
epilogue this is exactly SPEC section 6's gradient
1[m in S] p_m (l_m - tau_m + 1) - p_m sum_{j in S} p_j (l_j - tau_j + 1).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Index given to "no entry yet" slots of a running top-k list: larger than any vocabulary id,
# so a real token always wins a tie against it.
SENTINEL_INDEX = jnp.iinfo(jnp.int32).max


class LseTopK(NamedTuple):
    """Streaming statistics of one batch of logit rows (see module docstring)."""

    lse: jax.Array  # [N] float32
    values: jax.Array  # [N, k] float32, descending
    indices: jax.Array  # [N, k] int32


def empty_running_stats(n_rows: int, k: int) -> tuple[jax.Array, ...]:
    """The running (max [N], sum [N], values [N, k], ids [N, k]) before the first vocabulary
    block: -inf, 0, -inf and ``SENTINEL_INDEX``."""
    return (
        jnp.full((n_rows,), -jnp.inf, jnp.float32),
        jnp.zeros((n_rows,), jnp.float32),
        jnp.full((n_rows, k), -jnp.inf, jnp.float32),
        jnp.full((n_rows, k), SENTINEL_INDEX, jnp.int32),
    )


def online_lse_update(
    running_max: jax.Array, running_sum: jax.Array, block: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Folds a [N, B] block of logits (padding = -inf) into a running (max, sum of exp)."""
    new_max = jnp.maximum(running_max, jnp.max(block, axis=-1))
    # A row that has seen only -inf so far keeps max -inf; shift by 0 there to avoid inf - inf.
    shift = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
    rescaled = running_sum * jnp.exp(running_max - shift)
    new_sum = rescaled + jnp.sum(jnp.exp(block - shift[..., None]), axis=-1)
    return new_max, new_sum


def finish_lse(running_max: jax.Array, running_sum: jax.Array) -> jax.Array:
    """log-sum-exp from a running (max, sum): max + log(sum), -inf for an all -inf row."""
    shift = jnp.where(jnp.isfinite(running_max), running_max, 0.0)
    return shift + jnp.log(running_sum)


def merge_topk_lax(
    run_values: jax.Array, run_indices: jax.Array, block: jax.Array, block_start: jax.Array | int
) -> tuple[jax.Array, jax.Array]:
    """Merges a block's top-k into a running top-k with ``lax.top_k`` (XLA path).

    The running entries come first in the concatenation and always have lower vocabulary ids
    than the block's, and ``lax.top_k`` keeps the earlier position on ties, so the result
    equals ``lax.top_k`` over the whole row, ties included.
    """
    k = run_values.shape[-1]
    width = block.shape[-1]
    block_values, block_pos = jax.lax.top_k(block, min(k, width))
    block_ids = block_pos.astype(jnp.int32) + jnp.asarray(block_start, jnp.int32)
    cand_values = jnp.concatenate([run_values, block_values], axis=-1)
    cand_ids = jnp.concatenate([run_indices, block_ids], axis=-1)
    values, pos = jax.lax.top_k(cand_values, k)
    return values, jnp.take_along_axis(cand_ids, pos, axis=-1)


def merge_topk_select(
    run_values: jax.Array,
    run_indices: jax.Array,
    block: jax.Array,
    block_ids: jax.Array,
    block_valid: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Merges a [N, B] block into a sorted running top-k by k rounds of selection (Pallas path).

    Kernels have no sort or top-k primitive, so this merges two sorted streams: the running
    list (already descending) and the block, whose next-largest element is found by a max and
    an index-min reduction. Only element-wise ops, row reductions and selects are used, which
    lower on Mosaic (TPU) and Triton (GPU). Ties go to the lower vocabulary id. Padding
    columns are excluded by ``block_valid`` (not by value), so real -inf logits still count.
    """
    n, k = run_values.shape
    slot = jax.lax.broadcasted_iota(jnp.int32, (n, k), 1)

    def one_round(i, carry):
        out_values, out_ids, taken_from_run, eligible = carry
        masked = jnp.where(eligible, block, -jnp.inf)
        block_best = jnp.max(masked, axis=1)
        is_best = eligible & (block == block_best[:, None])
        block_best_id = jnp.min(jnp.where(is_best, block_ids, SENTINEL_INDEX), axis=1)
        block_has = block_best_id < SENTINEL_INDEX
        at_head = slot == taken_from_run[:, None]
        run_best = jnp.sum(jnp.where(at_head, run_values, 0.0), axis=1)
        run_best_id = jnp.sum(jnp.where(at_head, run_indices, 0), axis=1)
        take_run = (
            ~block_has
            | (run_best > block_best)
            | ((run_best == block_best) & (run_best_id < block_best_id))
        )
        value = jnp.where(take_run, run_best, block_best)
        index = jnp.where(take_run, run_best_id, block_best_id)
        out_values = jnp.where(slot == i, value[:, None], out_values)
        out_ids = jnp.where(slot == i, index[:, None], out_ids)
        taken_from_run = taken_from_run + take_run.astype(jnp.int32)
        chosen = (~take_run)[:, None] & (block_ids == block_best_id[:, None])
        return out_values, out_ids, taken_from_run, eligible & ~chosen

    init = (
        jnp.full((n, k), -jnp.inf, jnp.float32),
        jnp.full((n, k), SENTINEL_INDEX, jnp.int32),
        jnp.zeros((n,), jnp.int32),
        block_valid,
    )
    out_values, out_ids, _, _ = jax.lax.fori_loop(0, k, one_round, init)
    return out_values, out_ids


def sparse_dense_cotangent(
    block_ids: jax.Array, indices: jax.Array, g_values: jax.Array
) -> jax.Array:
    """sum_j g_values[:, j] * 1[block_ids == indices[:, j]] for a [N, B] block of ids.

    A loop over the k slots of element-wise selects: k * N * B compares, negligible next to
    the N * B * d multiply-adds of the LM head, and no [N, k, B] tensor is built.
    """
    out = jnp.zeros(block_ids.shape, jnp.float32)
    for j in range(indices.shape[-1]):
        out = out + jnp.where(block_ids == indices[:, j : j + 1], g_values[:, j : j + 1], 0.0)
    return out


def logits_cotangent(
    block: jax.Array,
    block_ids: jax.Array,
    block_valid: jax.Array,
    lse: jax.Array,
    indices: jax.Array,
    g_lse: jax.Array,
    g_values: jax.Array,
) -> jax.Array:
    """The statistics' VJP on one [N, B] block of logits (see module docstring)."""
    probs = jnp.exp(block - jnp.where(jnp.isfinite(lse), lse, 0.0)[:, None])
    dense = g_lse[:, None] * probs + sparse_dense_cotangent(block_ids, indices, g_values)
    return jnp.where(block_valid, dense, 0.0)
