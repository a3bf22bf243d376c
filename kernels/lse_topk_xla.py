"""Chunked XLA streaming log-sum-exp + top-k, from logits or fused with the LM head.

The vocabulary is walked in blocks of ``block_v`` columns with ``lax.fori_loop`` (plus one
static tail block when V is not a multiple of ``block_v``, so nothing is padded or copied).
Each block updates an online (max, sum-of-exp) and a running top-k. The backward pass walks
the vocabulary again, recomputing each block (for the fused form: ``hidden @ lm_head[:, blk]``)
instead of storing probabilities, so the only vocabulary-sized buffers are the inputs and the
gradients that JAX must return anyway ([T, V] for logits, [d, V] for the LM head).

Shapes: N rows (flattened positions), V vocabulary, d hidden size, k top-k width.

Low-precision inputs (bf16, f16) are converted to float32 one block at a time and the
gradients are written block by block into a buffer of the input dtype, so no full-size float32
copy of the logits, the LM head or its gradient exists (the [N, d] hidden-gradient accumulator
is float32: it is small). This needs care on XLA:CPU, whose float normalisation has no bf16
data movement: it rewrites a bf16 ``dynamic_slice`` as a slice of a float32 copy of the whole
operand, and loop-invariant code motion would then hoist that copy out of the loop (0.9 GB for
a Qwen2.5-1.5B LM head, 4.7 GB for [8192, 151936] logits). ``_fold_blocks`` therefore threads
the big operands through the loop state and an optimisation barrier with the loop index, so
the conversion stays in the loop body and fuses into the slice of the block. XLA:CPU also
performs each bf16 ``dynamic_update_slice`` of a gradient block as a float32 pass over the
whole gradient buffer (time, not memory: the buffer is updated in place): 75 such passes
made the bf16 loss + gradients at T = 32, V = 151,936, d = 1,536 take 16.5 s against 0.96 s in
float32. ``_fold_blocks_writing`` therefore stages a few gradient blocks in float32 (at most
``STAGING_BYTES``, 60 MiB there) and writes them with one update: 19 passes, 5.2 s. Backends
with bf16 data movement (GPU, TPU) need neither.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxdm.kernels._streaming import (
    LseTopK,
    empty_running_stats,
    finish_lse,
    logits_cotangent,
    merge_topk_lax,
    online_lse_update,
)

DEFAULT_BLOCK_V = 2048


def _block_plan(vocab_size: int, block_v: int) -> tuple[int, int, int]:
    """(block width, number of full blocks, tail width) for walking the vocabulary."""
    width = min(block_v, vocab_size)
    return width, vocab_size // width, vocab_size % width


def _fold_range(step, carry, operands, first, count: int, width: int):
    """Folds ``step(carry, operands, start, width)`` over ``count`` full blocks from ``first``.

    ``operands`` (a tuple of the big arrays that ``step`` slices) travel in the loop state and
    through an ``optimization_barrier`` together with the block index, so XLA cannot prove
    them loop invariant and hoist a whole-array conversion out of the loop (module docstring).
    The barrier only orders computation: the arrays are neither copied nor converted by it.

    Returns (carry, operands). Later stages must slice the returned ``operands`` (the loop's
    outputs), not the originals: using the originals after the loop makes XLA copy them into
    the loop state (measured: +48 MiB, a [8192, 1536] float32 hidden, at Qwen scale).
    """

    def body(b, state):
        carry, operands = state
        operands, b = jax.lax.optimization_barrier((operands, b))
        return step(carry, operands, (first + b) * width, width), operands

    return jax.lax.fori_loop(0, count, body, (carry, operands))


def _fold_blocks(step, carry, operands, vocab_size: int, block_v: int):
    """Folds ``step(carry, operands, start, width) -> carry`` over the vocabulary blocks."""
    width, n_full, tail = _block_plan(vocab_size, block_v)
    carry, operands = _fold_range(step, carry, operands, 0, n_full, width)
    if tail:
        carry = step(carry, jax.lax.optimization_barrier(operands), n_full * width, tail)
    return carry


# Float32 staging of low-precision gradient writes on XLA:CPU (module docstring): at most this
# many bytes, and at most an eighth of the blocks per write (so at most 1/8 of a float32 copy
# of the gradient; at Qwen2.5-1.5B scale 5 blocks of [1536, 2048], 60 MiB, 19 writes, not 75).
STAGING_BYTES = 64 * 2**20


def _staging_group(out: jax.Array, width: int, n_full: int) -> int:
    """How many gradient blocks to stage in float32 before one write into ``out`` [R, V].

    1 (write every block) unless ``out`` is low precision on XLA:CPU, where every write of a
    bf16/f16 block costs a float32 pass over the whole of ``out``.
    """
    if jnp.dtype(out.dtype).itemsize >= 4 or jax.default_backend() != "cpu":
        return 1
    block_bytes = out.shape[0] * width * 4
    return max(1, min(n_full // 8, STAGING_BYTES // block_bytes))


def _fold_blocks_writing(step, carry, operands, out: jax.Array, vocab_size: int,
                         block_v: int):
    """Folds ``step(carry, operands, start, width) -> (carry, block)`` over the vocabulary,
    writing each float32 [R, width] ``block`` into columns [start, start + width) of ``out``
    [R, V] (in ``out``'s dtype, which may be bf16). Returns (carry, out).

    Blocks are staged ``_staging_group`` at a time in a float32 [R, group * width] buffer and
    written with one ``dynamic_update_slice`` per group (one per block when group = 1).
    """
    width, n_full, tail = _block_plan(vocab_size, block_v)
    group = _staging_group(out, width, n_full)
    n_groups = n_full // group if group > 1 else 0

    def write(out, block, start):
        return jax.lax.dynamic_update_slice_in_dim(out, block.astype(out.dtype), start, 1)

    def per_block(state, operands, start, size):
        carry, out = state
        carry, block = step(carry, operands, start, size)
        return carry, write(out, block, start)

    if n_groups:
        def group_body(g, state):
            carry, out, operands = state
            operands, g = jax.lax.optimization_barrier((operands, g))
            first = g * group

            def stage(state, operands, start, size):
                carry, staging = state
                carry, block = step(carry, operands, start, size)
                offset = start - first * width
                return carry, jax.lax.dynamic_update_slice_in_dim(staging, block, offset, 1)

            staging = jnp.zeros((out.shape[0], group * width), jnp.float32)
            (carry, staging), operands = _fold_range(
                stage, (carry, staging), operands, first, group, width
            )
            return carry, write(out, staging, first * width), operands

        carry, out, operands = jax.lax.fori_loop(
            0, n_groups, group_body, (carry, out, operands)
        )
    done = n_groups * group
    (carry, out), operands = _fold_range(
        per_block, (carry, out), operands, done, n_full - done, width
    )
    if tail:
        carry, out = per_block((carry, out), jax.lax.optimization_barrier(operands),
                               n_full * width, tail)
    return carry, out


def _walk_forward(block_fn, operands, n_rows: int, vocab_size: int, k: int,
                  block_v: int) -> LseTopK:
    """Streams ``block_fn(operands, start, width) -> [N, width] float32 logits``."""

    def step(carry, operands, start, size):
        run_max, run_sum, top_values, top_ids = carry
        block = block_fn(operands, start, size)
        run_max, run_sum = online_lse_update(run_max, run_sum, block)
        top_values, top_ids = merge_topk_lax(top_values, top_ids, block, start)
        return run_max, run_sum, top_values, top_ids

    carry = empty_running_stats(n_rows, k)
    run_max, run_sum, top_values, top_ids = _fold_blocks(
        step, carry, operands, vocab_size, block_v
    )
    return LseTopK(finish_lse(run_max, run_sum), top_values, top_ids)


def _block_ids(n_rows: int, start, size: int) -> jax.Array:
    return jnp.asarray(start, jnp.int32) + jax.lax.broadcasted_iota(jnp.int32, (n_rows, size), 1)


# ----------------------------------------------------------------------------- from logits


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def lse_topk_logits(logits: jax.Array, k: int, block_v: int = DEFAULT_BLOCK_V) -> LseTopK:
    """Streaming statistics of [N, V] logits (any float dtype; computed in float32)."""
    n_rows, vocab_size = logits.shape
    return _walk_forward(_logits_block, (logits,), n_rows, vocab_size, k, block_v)


def _logits_block(operands, start, size: int) -> jax.Array:
    (logits,) = operands
    return jax.lax.dynamic_slice_in_dim(logits, start, size, axis=1).astype(jnp.float32)


def _logits_fwd(logits, k, block_v):
    stats = lse_topk_logits(logits, k, block_v)
    return stats, (logits, stats.lse, stats.indices)


def _logits_bwd(k, block_v, residuals, cotangents):
    logits, lse, indices = residuals
    g_lse, g_values, _ = cotangents
    n_rows, vocab_size = logits.shape

    def block_grad(carry, operands, start, size):
        block = _logits_block(operands, start, size)
        ids = _block_ids(n_rows, start, size)
        valid = jnp.ones(block.shape, bool)
        return carry, logits_cotangent(block, ids, valid, lse, indices, g_lse, g_values)

    # Written block by block in the logits' dtype: no float32 [N, V] gradient buffer.
    _, grad = _fold_blocks_writing(
        block_grad, (), (logits,), jnp.zeros_like(logits), vocab_size, block_v
    )
    return (grad,)


lse_topk_logits.defvjp(_logits_fwd, _logits_bwd)


# ----------------------------------------------------------------------- fused with LM head


def _linear_block(operands, start, size: int) -> jax.Array:
    hidden, lm_head = operands
    w_block = jax.lax.dynamic_slice_in_dim(lm_head, start, size, axis=1)  # [d, B]
    return jnp.dot(hidden, w_block, preferred_element_type=jnp.float32)  # [N, B]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def lse_topk_linear(
    hidden: jax.Array, lm_head: jax.Array, k: int, block_v: int = DEFAULT_BLOCK_V
) -> LseTopK:
    """Streaming statistics of ``hidden [N, d] @ lm_head [d, V]`` without the [N, V] logits."""
    n_rows = hidden.shape[0]
    vocab_size = lm_head.shape[1]
    return _walk_forward(_linear_block, (hidden, lm_head), n_rows, vocab_size, k, block_v)


def _linear_fwd(hidden, lm_head, k, block_v):
    stats = lse_topk_linear(hidden, lm_head, k, block_v)
    return stats, (hidden, lm_head, stats.lse, stats.indices)


def _linear_bwd(k, block_v, residuals, cotangents):
    hidden, lm_head, lse, indices = residuals
    g_lse, g_values, _ = cotangents
    n_rows = hidden.shape[0]
    vocab_size = lm_head.shape[1]

    # The d lm_head products take the hidden states in float32: one [N, d] copy (small), made
    # once and kept, rather than one per block.
    hidden_f32 = hidden.astype(jnp.float32)

    def block_grad(d_hidden, operands, start, size):
        hidden, lm_head = operands
        w_block = jax.lax.dynamic_slice_in_dim(lm_head, start, size, axis=1)  # [d, B]
        block = jnp.dot(hidden, w_block, preferred_element_type=jnp.float32)  # [N, B]
        ids = _block_ids(n_rows, start, size)
        valid = jnp.ones(block.shape, bool)
        d_block = logits_cotangent(block, ids, valid, lse, indices, g_lse, g_values)
        # The gradient products run in float32 even for bf16 weights (accuracy over speed);
        # only this block of the weight is converted.
        d_hidden = d_hidden + jnp.dot(d_block, w_block.astype(jnp.float32).T)
        return d_hidden, jnp.dot(hidden_f32.T, d_block)  # [d, B] float32 block of d lm_head

    # d lm_head is written block by block in the LM head's dtype: no float32 [d, V] buffer.
    d_hidden, d_head = _fold_blocks_writing(
        block_grad, jnp.zeros(hidden.shape, jnp.float32), (hidden, lm_head),
        jnp.zeros_like(lm_head), vocab_size, block_v,
    )
    return d_hidden.astype(hidden.dtype), d_head


lse_topk_linear.defvjp(_linear_fwd, _linear_bwd)
