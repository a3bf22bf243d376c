"""The seam between the decoder and the CPU kernels: which implementation runs a projection or
an attention for given operands. The decoder hands each factory its XLA reference (every
platform, differentiable) and calls what comes back; the choice is made when tracing.

- ``projection(reference)``: ``project(spec, x, w, valid)`` -> fp32, the matmul kernel
  (``cpu.matmul``) where ``spec`` is one matmul (``as_matmul``), the kernel takes the operands
  and is on for their dtype; else, for bf16 operands, XLA's dot with the kernel path's
  mixed-precision derivatives (``cpu.matmul.xla_matmul``), else ``reference(spec, x, w)``
  (``w`` a ``LayerOf`` taken as its slice).
- ``attention(reference)``: ``attend(q, sources)``, the fused kernel (``cpu.attention``) where
  it takes the operands and is on; else ``reference``.
- ``segment_attention(reference, backward)``: ``attend(plan, q, k, v, slot, seg, sees, kseg,
  need)`` under the segment rule, the kernel's forward where it is on, differentiated by
  ``backward`` or, in bf16 on AMX, the backward kernel (a custom VJP: the forward keeps q, k,
  v and the output, and for the kernel each query vector's log-sum-exp).

On other platforms the kernels' own ``lax.platform_dependent`` runs the reference, and under
differentiation (forward mode) their custom JVPs do.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp

from jaxdm.models.cpu import attention as cpu_attention, matmul as cpu_matmul
from jaxdm.models.cpu.scan import LayerOf


def as_matmul(spec: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]
              ) -> tuple[tuple[int, ...], tuple[int, int], tuple[int, ...]] | None:
    """(x's shape as [..., K], w's as [K, N], the einsum's output shape) when ``spec``
    contracts x's trailing dims with w's leading ones in the same order and keeps the rest in
    order (every projection of the decoder); else None."""
    inputs, out = spec.split("->")
    xs, ws = inputs.split(",")
    c = len(set(xs) & set(ws))
    if c == 0 or xs[len(xs) - c:] != ws[:c] or out != xs[:len(xs) - c] + ws[c:]:
        return None
    k = math.prod(w_shape[:c])
    lead = tuple(x_shape[:len(x_shape) - c])
    return lead + (k,), (k, math.prod(w_shape[c:])), lead + tuple(w_shape[c:])


def projection(reference: Callable) -> Callable:
    """``project(spec, x, w, valid=None)``: the einsum ``spec`` of x and a weight w of x's
    dtype (an array, or a ``LayerOf`` the layer loop left unsliced) -> fp32.

    The matmul kernel (``cpu_matmul.matmul``; ``matmul_layer`` for a ``LayerOf``, reading the
    stack in place) where ``spec`` is one matmul, ``cpu_matmul.supports`` the operands and the
    kernel is on for their dtype; else, for bf16 operands and a ``spec`` that is one matmul,
    XLA's dot differentiated as the kernel path is (``cpu_matmul.xla_matmul``), else
    ``reference(spec, x, w)``, w as an array.
    valid (int [B], x [B, S, ...]): only x[b, :valid[b]] is wanted; the kernel computes no
    other row (their results are zeros), the reference every row."""

    def project(spec: str, x: jax.Array, w: jax.Array | LayerOf,
                valid: jax.Array | None = None) -> jax.Array:
        plan = as_matmul(spec, x.shape, w.shape)
        if (plan is not None and cpu_matmul.supports(x.reshape(plan[0]),
                                                     jax.ShapeDtypeStruct(plan[1], w.dtype))
                and cpu_matmul.enabled(w.dtype)):
            x_shape, (k, n), out_shape = plan
            if isinstance(w, LayerOf):
                stack = w.stack.reshape(w.stack.shape[0], k, n)
                return cpu_matmul.matmul_layer(x.reshape(x_shape), stack, w.layer,
                                               valid).reshape(out_shape)
            return cpu_matmul.matmul(x.reshape(x_shape), w.reshape(k, n),
                                     valid).reshape(out_shape)
        w = w.value() if isinstance(w, LayerOf) else w
        if plan is not None and x.dtype == w.dtype == jnp.bfloat16:
            # XLA's dot, with the kernel path's mixed-precision derivatives (no fp32 weights)
            x_shape, (k, n), out_shape = plan
            return cpu_matmul.xla_matmul(x.reshape(x_shape), w.reshape(k, n)).reshape(out_shape)
        return reference(spec, x, w)

    return project


def attention(reference: Callable) -> Callable:
    """``attend(q, sources)`` as ``reference`` computes it (q [B, S, K, G, H]; sources
    [(k, v, mask)]; -> [B, S, N, H]): the fused kernel where ``cpu_attention.supports`` the
    operands and it is on (its forward only: derivatives are ``reference``'s), else
    ``reference``."""
    fused = cpu_attention.make_attend(reference)

    def attend(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]
               ) -> jax.Array:
        if cpu_attention.supports(q, sources) and cpu_attention.enabled():
            return fused(q, sources)
        return reference(q, sources)

    return attend


def segment_attention(reference: Callable, backward: Callable) -> Callable:
    """``attend(plan, q, k, v, slot, seg, sees, kseg, need)`` -> [B, Sq, N, H]: attention under
    the segment rule as ``reference(q, k, v, slot, seg, sees, kseg, need, plan=plan)`` computes
    it (plan static), on the segment-rule kernel where ``cpu_attention.supports_segments`` the
    operands and it is on, else ``reference``. Differentiable with respect to q, k, v by
    ``backward(q, k, v, out, dout, slot, seg, sees, kseg, need, plan=plan)`` -> (dq, dk, dv),
    or by the backward kernel where ``cpu_attention.supports_segments_grad`` the operands and
    it is on (bf16 on AMX): the forward keeps only q, k, v and the output (training runs the
    kernel's forward too), and for the backward kernel each query vector's log-sum-exp (the
    forward is then the kernel's variant that returns it)."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def attend(plan, q, k, v, slot, seg, sees, kseg, need):
        xla = functools.partial(reference, plan=plan)
        if cpu_attention.supports_segments(q, k, v) and cpu_attention.segments_enabled():
            return cpu_attention.make_attend_segments(xla)(q, k, v, slot, seg, sees, kseg, need)
        return xla(q, k, v, slot, seg, sees, kseg, need)

    def kernel_backward(q, k, v) -> bool:
        return (cpu_attention.supports_segments_grad(q, k, v)
                and cpu_attention.segments_grad_enabled())

    def forward(plan, q, k, v, slot, seg, sees, kseg, need):
        lse = None
        if kernel_backward(q, k, v):  # the backward kernel reads the forward's log-sum-exp
            xla = functools.partial(reference, plan=plan)
            out, lse = cpu_attention.make_attend_segments_lse(xla)(q, k, v, slot, seg, sees,
                                                                   kseg, need)
        else:
            out = attend(plan, q, k, v, slot, seg, sees, kseg, need)
        return out, (q, k, v, slot, seg, sees, kseg, need, out, lse)

    def gradients(plan, residuals, dout):
        q, k, v, slot, seg, sees, kseg, need, out, lse = residuals
        xla = functools.partial(backward, plan=plan)
        if lse is not None:
            dq, dk, dv = cpu_attention.make_segments_grad(xla)(q, k, v, out, dout, lse, slot,
                                                               seg, sees, kseg, need)
        else:
            dq, dk, dv = xla(q, k, v, out, dout, slot, seg, sees, kseg, need)
        return dq, dk, dv, None, None, None, None, None

    attend.defvjp(forward, gradients)
    return attend
