"""bf16 matmuls for XLA:CPU (``cpu_matmul.cc``), called through XLA's FFI.

XLA:CPU's bf16 dots (fp32 results) ran 1.7-3.3x slower than oneDNN's at the decoder's shapes
on an AMX CPU (issue 17). The kernel computes ``x [..., K] @ w [K, N]`` from bf16 operands into
fp32 (products of bf16 pairs, fp32 accumulation: what ``jnp.einsum(...,
preferred_element_type=float32)`` computes, to summation order) on the AMX tiles of x86-64
CPUs that have them (``amx_bf16``), else with AVX-512 BF16 pair dot products
(``avx512_bf16``, e.g. AMD Zen 4).

- ``matmul(x, w)`` is the decoder's bf16 projection path: on CPU the kernel, elsewhere and
  under differentiation the einsum (a custom JVP: the kernel is forward-only), so gradients
  are XLA's.
- ``supports(x, w)`` says where it is used: bf16 operands, K and N multiples of 32, at least
  ``MIN_ROWS`` rows (a decoding step's few rows leave the tiles mostly empty).
- ``JAXDM_CPU_MATMUL=0`` (or ``off``/``false``/``no``) turns it off; it is off where it cannot
  run (no AVX-512 BF16, no compiler, a failed build: one warning names why). ``status()`` says
  which. The kernel is built with jaxdm's other CPU kernels (``jaxdm.models.cpu_kernels``).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxdm.models import cpu_kernels

KERNEL = cpu_kernels.MATMUL
ENV_VAR = KERNEL.env_var
TARGET = KERNEL.target
# Rows (x's leading dims) below which XLA's dot is used: at 64-128 rows packing w on every call
# costs more than the tiles save (0.66-1.17x at 64 rows; 1.02-1.66x at 256; 2026-12-03).
MIN_ROWS = 256

status = KERNEL.status
enabled = KERNEL.enabled
cannot_run_here = KERNEL.cannot_run_here


def supports(x: jax.Array, w: jax.Array) -> bool:
    """Whether the kernel takes x [..., K] and w [K, N] and is used for them."""
    if x.dtype != jnp.bfloat16 or w.dtype != jnp.bfloat16 or w.ndim != 2 or x.ndim < 1:
        return False
    k, n = w.shape
    if x.shape[-1] != k or k % 32 or n % 32 or k == 0 or n == 0:
        return False
    return math.prod(x.shape[:-1]) >= MIN_ROWS


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    """XLA's dot: what the kernel computes (every platform, differentiable)."""
    return jnp.einsum("...K,KN->...N", x, w, preferred_element_type=jnp.float32)


@jax.custom_batching.custom_vmap
def _kernel(x: jax.Array, w: jax.Array) -> jax.Array:
    on, why = status()
    if not on:
        raise RuntimeError(f"the bf16 matmul kernel is {why}")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(x.shape[:-1] + w.shape[1:],
                                                         jnp.float32))
    return call(x, w)


@_kernel.def_vmap
def _kernel_vmap(axis_size, in_batched, x, w):
    x_batched, w_batched = in_batched
    if w_batched:  # one weight per slice: XLA's batched dot
        return jax.vmap(reference, in_axes=(0 if x_batched else None, 0))(x, w), True
    # a batch axis of x alone is more rows for the one weight
    return _kernel(x, w), x_batched


@jax.custom_jvp
def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., K] @ w [K, N] (bf16) -> [..., N] fp32: the kernel on CPU, ``reference``
    elsewhere and under differentiation."""
    return jax.lax.platform_dependent(x, w, cpu=_kernel, default=reference)


@matmul.defjvp
def _jvp(primals, tangents):
    return jax.jvp(reference, primals, tangents)
