"""Pallas kernels: streaming log-sum-exp + top-k, from logits or fused with the LM head.

Same statistics and VJP as ``lse_topk_xla`` (see ``_streaming``): the vocabulary is walked in
``block_v`` columns with an online max/sum and a running top-k (merged by selection, since
kernels have no sort), so the [T, V] logits of the fused form exist only one
[block_t, block_v] tile at a time, in the forward and in the backward. Two layouts:

``"loop"`` (GPU: Triton / Mosaic GPU; the default off TPU), laid out like JAX's GPU flash
attention: one program per tile of ``block_t`` positions loops over the vocabulary inside
the kernel, reading LM-head blocks from global memory.
  forward            grid (T/bt,):       tile -> lse, top-k values, ids
  backward, hidden   grid (T/bt,):       dh tile = sum over V blocks of dz @ W_blk^T
  backward, lm_head  grid (V/bv,):       dW block = sum over T tiles of h_tile^T @ dz

``"grid"`` (TPU Mosaic; the default on TPU): the reduction is the last, sequential
("arbitrary") grid axis and the running statistics / gradient accumulators are output blocks
that stay resident across it, so each step holds one [bt, d] and one [d, bv] tile in VMEM.
For bf16 (any non-float32) inputs the gradient accumulators are float32 VMEM scratch tiles and
the output blocks are written once, in the input dtype, at the last reduction step: no
float32 [d, V] gradient is ever allocated.
  forward            grid (T/bt, V/bv)
  backward, hidden   grid (T/bt, V/bv)   accumulate dh over V
  backward, lm_head  grid (V/bv, T/bt)   accumulate dW over T

Both fused backward passes recompute their logit tiles (as flash attention's dq and dkv
kernels do), so no program writes another's output and no atomics are needed. The logits
form's backward is one fully parallel grid of dz tiles.

Status: **only verified with ``interpret=True`` on CPU**; not compiled on a GPU or TPU yet.
GPU Triton wants power-of-two ``block_t``/``block_v`` and loads the hidden size d whole (the
loop layout), so d must suit its tile limits; TPU wants ``block_t`` a multiple of 8 and
``block_v`` of 128. Inputs are zero-padded to tile multiples (padding columns are excluded by
index, not value); for the logits form this copies the [T, V] logits when V or T is not a
multiple of the tiles.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxdm.kernels._streaming import (
    SENTINEL_INDEX,
    LseTopK,
    empty_running_stats,
    finish_lse,
    logits_cotangent,
    merge_topk_select,
    online_lse_update,
)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes: ``block_t`` positions x ``block_v`` vocabulary columns per step."""

    block_t: int = 32
    block_v: int = 512

    def __post_init__(self):
        for name in ("block_t", "block_v"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BlockSizes.{name} must be a positive int, got {value!r}")

    @classmethod
    def make(cls, block_t: int | None = None, block_v: int | None = None) -> "BlockSizes":
        """Defaults for the sizes left as None."""
        default = cls()
        return cls(block_t or default.block_t, block_v or default.block_v)

    def fitted(self, n_rows: int, vocab_size: int) -> "BlockSizes":
        """Shrinks tiles to the problem (power-of-two) so small inputs are not over-padded."""
        return BlockSizes(
            min(self.block_t, pl.next_power_of_2(n_rows)),
            min(self.block_v, pl.next_power_of_2(vocab_size)),
        )


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _default_interpret(interpret: bool | None) -> bool:
    return jax.default_backend() == "cpu" if interpret is None else interpret


# -------------------------------------------------------------------------------- kernels


def _stream_tile(load_block, n_rows: int, *, k: int, block_v: int, num_blocks: int,
                 vocab_size: int):
    """Walks the vocabulary for one tile of rows; ``load_block(start) -> [rows, bv]`` f32."""

    def body(j, carry):
        run_max, run_sum, top_values, top_ids = carry
        start = pl.multiple_of(j * block_v, block_v)
        ids = start + jax.lax.broadcasted_iota(jnp.int32, (n_rows, block_v), 1)
        valid = ids < vocab_size
        block = jnp.where(valid, load_block(start), -jnp.inf)
        run_max, run_sum = online_lse_update(run_max, run_sum, block)
        top_values, top_ids = merge_topk_select(top_values, top_ids, block, ids, valid)
        return run_max, run_sum, top_values, top_ids

    init = empty_running_stats(n_rows, k)
    run_max, run_sum, top_values, top_ids = jax.lax.fori_loop(0, num_blocks, body, init)
    return finish_lse(run_max, run_sum), top_values, top_ids


def _forward_logits_kernel(z_ref, lse_ref, values_ref, ids_ref, **static):
    # z_ref: [bt, Vp] logits tile; outputs [bt], [bt, k], [bt, k].
    n_rows = z_ref.shape[0]
    block_v = static["block_v"]

    def load(start):
        return z_ref[:, pl.ds(start, block_v)].astype(jnp.float32)

    lse, values, ids = _stream_tile(load, n_rows, **static)
    lse_ref[...] = lse
    values_ref[...] = values
    ids_ref[...] = ids


def _forward_linear_kernel(h_ref, w_ref, lse_ref, values_ref, ids_ref, **static):
    # h_ref: [bt, d] hidden tile; w_ref: [d, Vp] whole LM head (read one block at a time).
    hidden = h_ref[...]
    block_v = static["block_v"]

    def load(start):
        return jnp.dot(
            hidden, w_ref[:, pl.ds(start, block_v)], preferred_element_type=jnp.float32
        )

    lse, values, ids = _stream_tile(load, hidden.shape[0], **static)
    lse_ref[...] = lse
    values_ref[...] = values
    ids_ref[...] = ids


def _backward_logits_kernel(z_ref, lse_ref, ids_ref, g_lse_ref, g_values_ref, dz_ref, *,
                            block_v: int, vocab_size: int):
    # One [bt, bv] tile of dz, fully parallel over the grid.
    block = z_ref[...].astype(jnp.float32)
    start = pl.program_id(1) * block_v
    ids = start + jax.lax.broadcasted_iota(jnp.int32, block.shape, 1)
    d_block = logits_cotangent(
        block, ids, ids < vocab_size, lse_ref[...], ids_ref[...], g_lse_ref[...],
        g_values_ref[...],
    )
    dz_ref[...] = d_block.astype(dz_ref.dtype)


def _backward_hidden_kernel(h_ref, w_ref, lse_ref, ids_ref, g_lse_ref, g_values_ref, dh_ref,
                            *, block_v: int, num_blocks: int, vocab_size: int):
    # dh tile [bt, d] = sum over vocabulary blocks of dz [bt, bv] @ W_blk^T; logits recomputed.
    hidden = h_ref[...]
    lse, top_ids = lse_ref[...], ids_ref[...]
    g_lse, g_values = g_lse_ref[...], g_values_ref[...]

    def body(j, d_hidden):
        start = pl.multiple_of(j * block_v, block_v)
        w_block = w_ref[:, pl.ds(start, block_v)]
        block = jnp.dot(hidden, w_block, preferred_element_type=jnp.float32)
        ids = start + jax.lax.broadcasted_iota(jnp.int32, block.shape, 1)
        d_block = logits_cotangent(block, ids, ids < vocab_size, lse, top_ids, g_lse, g_values)
        return d_hidden + jax.lax.dot_general(
            d_block, w_block.astype(jnp.float32), (((1,), (1,)), ((), ())),
            preferred_element_type=jnp.float32,
        )

    init = jnp.zeros(dh_ref.shape, jnp.float32)
    dh_ref[...] = jax.lax.fori_loop(0, num_blocks, body, init).astype(dh_ref.dtype)


def _backward_head_kernel(h_ref, w_ref, lse_ref, ids_ref, g_lse_ref, g_values_ref, dw_ref,
                          *, block_t: int, num_tiles: int, vocab_size: int):
    # dW block [d, bv] = sum over position tiles of h_tile^T @ dz_tile; logits recomputed.
    w_block = w_ref[...]
    block_v = w_block.shape[1]
    start = pl.program_id(0) * block_v

    def body(i, d_head):
        rows = pl.ds(pl.multiple_of(i * block_t, block_t), block_t)
        hidden = h_ref[rows, :]
        block = jnp.dot(hidden, w_block, preferred_element_type=jnp.float32)
        ids = start + jax.lax.broadcasted_iota(jnp.int32, block.shape, 1)
        d_block = logits_cotangent(
            block, ids, ids < vocab_size, lse_ref[rows], ids_ref[rows, :], g_lse_ref[rows],
            g_values_ref[rows, :],
        )
        return d_head + jax.lax.dot_general(
            hidden.astype(jnp.float32), d_block, (((0,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )

    init = jnp.zeros(dw_ref.shape, jnp.float32)
    dw_ref[...] = jax.lax.fori_loop(0, num_tiles, body, init).astype(dw_ref.dtype)


# Grid layout (TPU Mosaic): the vocabulary is the last, sequential ("arbitrary") grid axis and
# the running statistics live in output blocks that stay resident across it, so each program
# touches one [block_t, d] x [d, block_v] pair of VMEM tiles. GPU Triton runs grid programs
# concurrently, so it must use the loop layout above instead.


def _init_stats(max_ref, sum_ref, values_ref, ids_ref):
    max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
    sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
    values_ref[...] = jnp.full(values_ref.shape, -jnp.inf, jnp.float32)
    ids_ref[...] = jnp.full(ids_ref.shape, SENTINEL_INDEX, jnp.int32)


def _update_stats(block, max_ref, sum_ref, values_ref, ids_ref, *, block_v, vocab_size):
    start = pl.program_id(1) * block_v
    ids = start + jax.lax.broadcasted_iota(jnp.int32, block.shape, 1)
    valid = ids < vocab_size
    block = jnp.where(valid, block, -jnp.inf)
    run_max, run_sum = online_lse_update(max_ref[...], sum_ref[...], block)
    max_ref[...] = run_max
    sum_ref[...] = run_sum
    values, top_ids = merge_topk_select(values_ref[...], ids_ref[...], block, ids, valid)
    values_ref[...] = values
    ids_ref[...] = top_ids


def _forward_logits_grid_kernel(z_ref, max_ref, sum_ref, values_ref, ids_ref, **static):
    # Grid (T tiles, V blocks); z_ref: [bt, bv].
    @pl.when(pl.program_id(1) == 0)
    def _():
        _init_stats(max_ref, sum_ref, values_ref, ids_ref)

    _update_stats(z_ref[...].astype(jnp.float32), max_ref, sum_ref, values_ref, ids_ref,
                  **static)


def _forward_linear_grid_kernel(h_ref, w_ref, max_ref, sum_ref, values_ref, ids_ref, **static):
    # Grid (T tiles, V blocks); h_ref: [bt, d], w_ref: [d, bv].
    @pl.when(pl.program_id(1) == 0)
    def _():
        _init_stats(max_ref, sum_ref, values_ref, ids_ref)

    block = jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    _update_stats(block, max_ref, sum_ref, values_ref, ids_ref, **static)


def _grid_accumulator(out_ref, scratch):
    """The float32 accumulator of a grid-layout backward kernel, zeroed at the first
    reduction step.

    A float32 output block stays resident across the reduction axis and accumulates in place.
    For a bf16/f16 output, accumulating there would round every partial sum, and a float32
    output would be a full-size float32 copy of the gradient (a [d, V] LM-head gradient); so
    the kernel accumulates in a float32 VMEM scratch tile and writes the block once, converted,
    at the last reduction step (``_finish_grid_accumulator``).
    """
    acc_ref = scratch[0] if scratch else out_ref

    @pl.when(pl.program_id(1) == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    return acc_ref


def _finish_grid_accumulator(out_ref, scratch) -> None:
    if scratch:
        @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
        def _():
            out_ref[...] = scratch[0][...].astype(out_ref.dtype)


def _grid_logits_cotangent(hidden, w_block, vocab_axis: int, lse_ref, ids_ref, g_lse_ref,
                           g_values_ref, *, block_v: int, vocab_size: int) -> jax.Array:
    """dz [bt, bv] of one grid program: its logit block recomputed from ``hidden`` [bt, d]
    and ``w_block`` [d, bv]; ``vocab_axis`` is the grid axis that walks the vocabulary."""
    block = jnp.dot(hidden, w_block, preferred_element_type=jnp.float32)
    ids = (pl.program_id(vocab_axis) * block_v
           + jax.lax.broadcasted_iota(jnp.int32, block.shape, 1))
    return logits_cotangent(
        block, ids, ids < vocab_size, lse_ref[...], ids_ref[...], g_lse_ref[...],
        g_values_ref[...],
    )


def _backward_hidden_grid_kernel(h_ref, w_ref, lse_ref, ids_ref, g_lse_ref, g_values_ref,
                                 dh_ref, *scratch, **static):
    # Grid (T tiles, V blocks); dh [bt, d] accumulates in float32 over the V axis.
    acc_ref = _grid_accumulator(dh_ref, scratch)
    w_block = w_ref[...]
    d_block = _grid_logits_cotangent(h_ref[...], w_block, 1, lse_ref, ids_ref, g_lse_ref,
                                     g_values_ref, **static)
    acc_ref[...] += jax.lax.dot_general(
        d_block, w_block.astype(jnp.float32), (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    _finish_grid_accumulator(dh_ref, scratch)


def _backward_head_grid_kernel(h_ref, w_ref, lse_ref, ids_ref, g_lse_ref, g_values_ref,
                               dw_ref, *scratch, **static):
    # Grid (V blocks, T tiles); dW [d, bv] accumulates in float32 over the T axis.
    acc_ref = _grid_accumulator(dw_ref, scratch)
    hidden = h_ref[...]
    d_block = _grid_logits_cotangent(hidden, w_ref[...], 0, lse_ref, ids_ref, g_lse_ref,
                                     g_values_ref, **static)
    acc_ref[...] += jax.lax.dot_general(
        hidden.astype(jnp.float32), d_block, (((0,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    _finish_grid_accumulator(dw_ref, scratch)


# ------------------------------------------------------------------------ pallas_call glue


def _pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    pads = [(0, target - size) for size, target in zip(x.shape, shape)]
    return x if all(p == (0, 0) for p in pads) else jnp.pad(x, pads)


def _compiler_params(layout: str, interpret: bool):
    """TPU grid semantics for the grid layout: position tiles parallel, reduction sequential."""
    if layout != "grid" or interpret:
        return None
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


def _f32_scratch(shape: tuple[int, int], out_dtype) -> list:
    """A float32 VMEM accumulator tile for a grid-layout output that is not float32."""
    if jnp.dtype(out_dtype) == jnp.float32:
        return []
    from jax.experimental.pallas import tpu as pltpu

    return [pltpu.VMEM(shape, jnp.float32)]


def _row_specs(bt: int, k: int, row_block):
    """BlockSpecs of the four per-row inputs (lse, ids, g_lse, g_values); row_block(*grid)."""
    return [
        pl.BlockSpec((bt,), lambda *g: (row_block(*g),)),
        pl.BlockSpec((bt, k), lambda *g: (row_block(*g), 0)),
        pl.BlockSpec((bt,), lambda *g: (row_block(*g),)),
        pl.BlockSpec((bt, k), lambda *g: (row_block(*g), 0)),
    ]


def _forward(operands, in_block, k, sizes: BlockSizes, layout: str, interpret: bool,
             n_rows: int, vocab_size: int, linear: bool) -> LseTopK:
    """Runs the forward kernel of either layout on padded operands; returns unpadded stats."""
    bt, bv = sizes.block_t, sizes.block_v
    rows_p, vocab_p = _round_up(n_rows, bt), _round_up(vocab_size, bv)
    num_blocks = vocab_p // bv
    stat_shapes = [
        jax.ShapeDtypeStruct((rows_p,), jnp.float32),
        jax.ShapeDtypeStruct((rows_p, k), jnp.float32),
        jax.ShapeDtypeStruct((rows_p, k), jnp.int32),
    ]
    if layout == "loop":
        kernel = _forward_linear_kernel if linear else _forward_logits_kernel
        kernel = functools.partial(
            kernel, k=k, block_v=bv, num_blocks=num_blocks, vocab_size=vocab_size
        )
        grid = (rows_p // bt,)
        out_specs = [
            pl.BlockSpec((bt,), lambda i: (i,)),
            pl.BlockSpec((bt, k), lambda i: (i, 0)),
            pl.BlockSpec((bt, k), lambda i: (i, 0)),
        ]
    else:
        kernel = _forward_linear_grid_kernel if linear else _forward_logits_grid_kernel
        kernel = functools.partial(kernel, block_v=bv, vocab_size=vocab_size)
        grid = (rows_p // bt, num_blocks)
        stat_shapes = [stat_shapes[0]] + stat_shapes  # running max and running sum
        out_specs = [
            pl.BlockSpec((bt,), lambda i, j: (i,)),
            pl.BlockSpec((bt,), lambda i, j: (i,)),
            pl.BlockSpec((bt, k), lambda i, j: (i, 0)),
            pl.BlockSpec((bt, k), lambda i, j: (i, 0)),
        ]
    outs = pl.pallas_call(
        kernel,
        out_shape=stat_shapes,
        grid=grid,
        in_specs=in_block(layout, bt, bv, rows_p, vocab_p),
        out_specs=out_specs,
        interpret=interpret,
        compiler_params=_compiler_params(layout, interpret),
        name=f"lse_topk_{'linear' if linear else 'logits'}_fwd_{layout}",
    )(*operands)
    if layout == "grid":
        lse = finish_lse(outs[0], outs[1])
        values, ids = outs[2], outs[3]
    else:
        lse, values, ids = outs
    return LseTopK(lse[:n_rows], values[:n_rows], ids[:n_rows])


def _forward_logits(logits, k, sizes: BlockSizes, layout: str, interpret: bool) -> LseTopK:
    n_rows, vocab_size = logits.shape
    rows_p = _round_up(n_rows, sizes.block_t)
    vocab_p = _round_up(vocab_size, sizes.block_v)

    def in_block(layout, bt, bv, rows_p, vocab_p):
        if layout == "loop":
            return [pl.BlockSpec((bt, vocab_p), lambda i: (i, 0))]
        return [pl.BlockSpec((bt, bv), lambda i, j: (i, j))]

    z = _pad_to(logits, (rows_p, vocab_p))
    return _forward((z,), in_block, k, sizes, layout, interpret, n_rows, vocab_size, False)


def _forward_linear(hidden, lm_head, k, sizes: BlockSizes, layout: str, interpret: bool):
    n_rows, dim = hidden.shape
    vocab_size = lm_head.shape[1]
    rows_p = _round_up(n_rows, sizes.block_t)
    vocab_p = _round_up(vocab_size, sizes.block_v)

    def in_block(layout, bt, bv, rows_p, vocab_p):
        if layout == "loop":
            return [
                pl.BlockSpec((bt, dim), lambda i: (i, 0)),
                pl.BlockSpec((dim, vocab_p), lambda i: (0, 0)),
            ]
        return [
            pl.BlockSpec((bt, dim), lambda i, j: (i, 0)),
            pl.BlockSpec((dim, bv), lambda i, j: (0, j)),
        ]

    h = _pad_to(hidden, (rows_p, dim))
    w = _pad_to(lm_head, (dim, vocab_p))
    return _forward((h, w), in_block, k, sizes, layout, interpret, n_rows, vocab_size, True)


def _padded_cotangents(lse, indices, g_lse, g_values, rows_p):
    """Pads the per-row residuals/cotangents; padded rows get zero cotangent, finite lse."""
    k = indices.shape[1]
    return (
        _pad_to(jnp.where(jnp.isfinite(lse), lse, 0.0), (rows_p,)),
        _pad_to(indices, (rows_p, k)),
        _pad_to(g_lse.astype(jnp.float32), (rows_p,)),
        _pad_to(g_values.astype(jnp.float32), (rows_p, k)),
    )


def _backward_logits(logits, lse, indices, g_lse, g_values, k, sizes, interpret):
    """dz for the logits form: one fully parallel grid, the same for both layouts."""
    n_rows, vocab_size = logits.shape
    bt, bv = sizes.block_t, sizes.block_v
    rows_p, vocab_p = _round_up(n_rows, bt), _round_up(vocab_size, bv)
    z = _pad_to(logits, (rows_p, vocab_p))
    row_inputs = _padded_cotangents(lse, indices, g_lse, g_values, rows_p)
    kernel = functools.partial(_backward_logits_kernel, block_v=bv, vocab_size=vocab_size)
    dz = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows_p, vocab_p), logits.dtype),
        grid=(rows_p // bt, vocab_p // bv),
        in_specs=[pl.BlockSpec((bt, bv), lambda i, j: (i, j))]
        + _row_specs(bt, k, lambda i, j: i),
        out_specs=pl.BlockSpec((bt, bv), lambda i, j: (i, j)),
        interpret=interpret,
        name="lse_topk_logits_bwd",
    )(z, *row_inputs)
    return dz[:n_rows, :vocab_size]


def _backward_linear(hidden, lm_head, lse, indices, g_lse, g_values, k, sizes, layout,
                     interpret):
    """(d hidden, d lm_head) for the fused form, logits recomputed tile by tile."""
    n_rows, dim = hidden.shape
    vocab_size = lm_head.shape[1]
    bt, bv = sizes.block_t, sizes.block_v
    rows_p, vocab_p = _round_up(n_rows, bt), _round_up(vocab_size, bv)
    n_tiles, n_blocks = rows_p // bt, vocab_p // bv
    h = _pad_to(hidden, (rows_p, dim))
    w = _pad_to(lm_head, (dim, vocab_p))
    row_inputs = _padded_cotangents(lse, indices, g_lse, g_values, rows_p)
    params = _compiler_params(layout, interpret)

    if layout == "loop":
        hidden_call = dict(
            kernel=functools.partial(_backward_hidden_kernel, block_v=bv, num_blocks=n_blocks,
                                     vocab_size=vocab_size),
            grid=(n_tiles,),
            in_specs=[pl.BlockSpec((bt, dim), lambda i: (i, 0)),
                      pl.BlockSpec((dim, vocab_p), lambda i: (0, 0))]
            + _row_specs(bt, k, lambda i: i),
            out_specs=pl.BlockSpec((bt, dim), lambda i: (i, 0)),
            out_dtype=hidden.dtype,
        )
        whole = lambda j: 0  # noqa: E731  (every program reads all rows)
        head_call = dict(
            kernel=functools.partial(_backward_head_kernel, block_t=bt, num_tiles=n_tiles,
                                     vocab_size=vocab_size),
            grid=(n_blocks,),
            in_specs=[pl.BlockSpec((rows_p, dim), lambda j: (0, 0)),
                      pl.BlockSpec((dim, bv), lambda j: (0, j))]
            + _row_specs(rows_p, k, whole),
            out_specs=pl.BlockSpec((dim, bv), lambda j: (0, j)),
            out_dtype=lm_head.dtype,
        )
    else:
        hidden_call = dict(
            kernel=functools.partial(_backward_hidden_grid_kernel, block_v=bv,
                                     vocab_size=vocab_size),
            grid=(n_tiles, n_blocks),
            in_specs=[pl.BlockSpec((bt, dim), lambda i, j: (i, 0)),
                      pl.BlockSpec((dim, bv), lambda i, j: (0, j))]
            + _row_specs(bt, k, lambda i, j: i),
            out_specs=pl.BlockSpec((bt, dim), lambda i, j: (i, 0)),
            out_dtype=hidden.dtype,
            scratch=_f32_scratch((bt, dim), hidden.dtype),
        )
        head_call = dict(
            kernel=functools.partial(_backward_head_grid_kernel, block_v=bv,
                                     vocab_size=vocab_size),
            grid=(n_blocks, n_tiles),
            in_specs=[pl.BlockSpec((bt, dim), lambda j, i: (i, 0)),
                      pl.BlockSpec((dim, bv), lambda j, i: (0, j))]
            + _row_specs(bt, k, lambda j, i: i),
            out_specs=pl.BlockSpec((dim, bv), lambda j, i: (0, j)),
            out_dtype=lm_head.dtype,
            scratch=_f32_scratch((dim, bv), lm_head.dtype),
        )
    d_hidden, d_head = (
        pl.pallas_call(
            call["kernel"],
            out_shape=jax.ShapeDtypeStruct(shape, call["out_dtype"]),
            grid=call["grid"],
            in_specs=call["in_specs"],
            out_specs=call["out_specs"],
            scratch_shapes=call.get("scratch", ()),
            interpret=interpret,
            compiler_params=params,
            name=f"lse_topk_linear_bwd_{name}_{layout}",
        )(h, w, *row_inputs)
        for call, shape, name in (
            (hidden_call, (rows_p, dim), "hidden"),
            (head_call, (dim, vocab_p), "head"),
        )
    )
    # Both layouts return the gradients in the input dtypes (float32 accumulation inside).
    return d_hidden[:n_rows], d_head[:, :vocab_size]


# ------------------------------------------------------------------------------ custom_vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _lse_topk_logits(logits, k, sizes, layout, interpret):
    return _forward_logits(logits, k, sizes, layout, interpret)


def _lse_topk_logits_fwd(logits, k, sizes, layout, interpret):
    stats = _forward_logits(logits, k, sizes, layout, interpret)
    return stats, (logits, stats.lse, stats.indices)


def _lse_topk_logits_bwd(k, sizes, layout, interpret, residuals, cotangents):
    logits, lse, indices = residuals
    g_lse, g_values, _ = cotangents
    return (_backward_logits(logits, lse, indices, g_lse, g_values, k, sizes, interpret),)


_lse_topk_logits.defvjp(_lse_topk_logits_fwd, _lse_topk_logits_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _lse_topk_linear(hidden, lm_head, k, sizes, layout, interpret):
    return _forward_linear(hidden, lm_head, k, sizes, layout, interpret)


def _lse_topk_linear_fwd(hidden, lm_head, k, sizes, layout, interpret):
    stats = _forward_linear(hidden, lm_head, k, sizes, layout, interpret)
    return stats, (hidden, lm_head, stats.lse, stats.indices)


def _lse_topk_linear_bwd(k, sizes, layout, interpret, residuals, cotangents):
    hidden, lm_head, lse, indices = residuals
    g_lse, g_values, _ = cotangents
    return _backward_linear(
        hidden, lm_head, lse, indices, g_lse, g_values, k, sizes, layout, interpret
    )


_lse_topk_linear.defvjp(_lse_topk_linear_fwd, _lse_topk_linear_bwd)


# ------------------------------------------------------------------------------ wrappers


LAYOUTS = ("loop", "grid")


def _resolve_layout(layout: str | None) -> str:
    """Default: the grid layout on TPU (Mosaic), the loop layout elsewhere (GPU, CPU)."""
    if layout is None:
        return "grid" if jax.default_backend() == "tpu" else "loop"
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
    return layout


def lse_topk_logits(
    logits: jax.Array, *, k: int, block_sizes: BlockSizes | None = None,
    layout: str | None = None, interpret: bool | None = None,
) -> LseTopK:
    """Streaming statistics of [N, V] logits with Pallas kernels (differentiable)."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, V], got shape {logits.shape}")
    sizes = (block_sizes or BlockSizes()).fitted(*logits.shape)
    return _lse_topk_logits(
        logits, k, sizes, _resolve_layout(layout), _default_interpret(interpret)
    )


def lse_topk_linear(
    hidden: jax.Array, lm_head: jax.Array, *, k: int, block_sizes: BlockSizes | None = None,
    layout: str | None = None, interpret: bool | None = None,
) -> LseTopK:
    """Streaming statistics of ``hidden [N, d] @ lm_head [d, V]`` with fused Pallas kernels."""
    if hidden.ndim != 2 or lm_head.ndim != 2 or hidden.shape[1] != lm_head.shape[0]:
        raise ValueError(
            f"need hidden [N, d] and lm_head [d, V]; got {hidden.shape} and {lm_head.shape}"
        )
    sizes = (block_sizes or BlockSizes()).fitted(hidden.shape[0], lm_head.shape[1])
    return _lse_topk_linear(
        hidden, lm_head, k, sizes, _resolve_layout(layout), _default_interpret(interpret)
    )
