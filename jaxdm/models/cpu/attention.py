"""A fused attention kernel for XLA:CPU (``attention.cc``), called through XLA's FFI.

XLA:CPU has no fused attention: at head dim 64 the packed readout spent ~58 % of its bf16
time (~36 % fp32) in attention, its fp32 logits crossing memory 3-4 times per block (issue
17). The kernel takes a group of query vectors over the keys in blocks of 16: logits and
each vector's exact max, then probabilities, then the weighted values, the group's logits
and probabilities staying in L1/L2; blocks masked for the whole group are skipped. fp32 runs
on AVX-512 FMAs; bf16 at head dim 64 on AMX tiles where the CPU has them, else on AVX-512
BF16 pair dot products (``vdpbf16ps``, e.g. AMD Zen 4) where it has those. Work is spread over
XLA's intra-op thread pool. It is still a pure jitted function: an XLA custom call, no host
callback.

- ``make_attend(reference)`` is ``decoder.attend``'s fast path (``dispatch.attention`` picks
  it): on CPU the kernel, on every other platform ``reference`` (``lax.platform_dependent``).
  Differentiation runs ``reference`` (a custom JVP: the kernel is forward-only), so gradients
  are the XLA path's.
- ``make_attend_segments(reference)`` is ``decoder.attend_segments``'s: the same kernel with
  its mask given by a rule on int32 vectors (``decoder.segment_mask``: shared contexts and
  their continuations) instead of a pred array, so a packed row's whole self-attention is
  one call per layer (no query blocks, key slices, per-block packing or output concatenation
  in XLA: fp32 Prefix+Value batch 9.95 -> 9.71 s; issue 17). Training differentiates it
  through ``decoder.attend_segments``' own backward pass (``decoder.segment_attention_vjp``),
  so the kernel runs the forward there too; this function's JVP (``reference``'s) is then
  not used.
- ``make_segments_grad(reference)`` is that backward pass's fast path in bf16 at head dim 64
  on CPUs with AMX (``dispatch.segment_attention`` picks it): per group of 16 query vectors
  the logits, probabilities and dS stay in L1/L2 and every product runs on tiles (XLA's
  program crossed memory with fp32 [queries x keys] arrays several times: ~90 of its 125 ms
  per layer at 2,176 causal tokens). Same roundings as ``decoder.segment_attention_vjp``
  (bf16 product operands, fp32 softmax and accumulation); elsewhere that function runs.
- The kernel is built with jaxdm's other CPU kernels (``jaxdm.models.cpu.build``: one
  library, compiled on first use or ahead of time by ``make test`` and ``make demo``) and
  registered with XLA.
- ``JAXDM_CPU_ATTENTION=0`` (or ``off``/``false``/``no``) turns it off (``1``/``on``/``true``/
  ``yes`` or unset: on; anything else is an error naming the variable). It is also off where
  it cannot run: not x86-64 with AVX-512 F/BW/VL, no compiler, a failed build (one warning
  names why). ``status()`` says which. Off means the XLA attention, same results to fp32
  rounding.

Numbers: logits, softmax and accumulation in fp32. fp32 agrees with the XLA path to ~1e-6;
bf16 rounds the probabilities to bf16 before the value product as the XLA path does (on the
fp32 FMA path, a CPU without AMX and AVX-512 BF16 or fewer than 16 vectors, they stay fp32),
so the two agree to bf16 output rounding. A query vector that may attend to no key gets the
uniform average of the values, as in the XLA path.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.models.cpu import build

KERNEL = build.ATTENTION
SEGMENTS_KERNEL = build.ATTENTION_SEGMENTS
SEGMENTS_GRAD_KERNEL = build.ATTENTION_SEGMENTS_GRAD
SEGMENTS_LSE_KERNEL = build.ATTENTION_SEGMENTS_LSE
ENV_VAR = KERNEL.env_var
TARGET = KERNEL.target
HEAD_DIMS = (32, 64, 128, 256)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
status = KERNEL.status
enabled = KERNEL.enabled
cannot_run_here = KERNEL.cannot_run_here


# Query vectors (S * G) per (row, KV head) below which XLA's attention is used: the kernel
# packs each (row, head)'s keys once per call, which a decoding step (S = 1, G = 3) does not
# amortise (whole-program A/B, 16 x 32 greedy tokens: bf16 0.92x, fp32 ~1x; issue 17).
MIN_QUERY_VECTORS = 16


def supports(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]) -> bool:
    """Whether the kernel takes these operands (dtype, head dim, key batches) and is used for
    them: at least ``MIN_QUERY_VECTORS`` query vectors per (row, KV head), and in bf16 no cache
    shared by several rows (XLA contracts all B * G * S rows against it in one AMX matmul;
    Actor option scoring ran 0.94x with the kernel)."""
    if q.ndim != 5 or jnp.dtype(q.dtype) not in DTYPES or q.shape[-1] not in HEAD_DIMS:
        return False
    b, s, _, g, _ = q.shape
    if s * g < MIN_QUERY_VECTORS:
        return False
    for k, v, mask in sources:
        if k.dtype != q.dtype or v.dtype != q.dtype or k.shape != v.shape or k.ndim != 4:
            return False
        if k.shape[0] not in (1, b) or mask.shape != (b, s, k.shape[1]):
            return False
        if k.shape[0] == 1 < b and q.dtype == jnp.bfloat16:
            return False
    return True


def _kernel(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]) -> jax.Array:
    """The custom call: q [B, S, K, G, H], sources (k, v [Bk, T, K, H], mask [B, S, T]) ->
    [B, S, K, G, H] in q's dtype (scale 1/sqrt(H) applied inside)."""
    on, why = status()
    if not on:
        raise RuntimeError(f"the fused CPU attention kernel is {why}")
    operands = [q]
    for k, v, mask in sources:
        operands += [k, v, mask.astype(jnp.bool_)]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype),
                            vmap_method="broadcast_all")
    return call(*operands, scale=np.float32(1.0 / np.sqrt(q.shape[-1])))


def make_attend(reference: Callable) -> Callable:
    """``attend(q, sources)`` -> [B, S, N, H] like ``reference`` (``decoder``'s XLA
    attention): the kernel on CPU, ``reference`` elsewhere and under differentiation."""

    @jax.custom_jvp
    def attend(q, sources):
        def on_cpu(q, sources):
            b, s, kh, g, hd = q.shape
            return _kernel(q, sources).reshape(b, s, kh * g, hd)

        return jax.lax.platform_dependent(q, sources, cpu=on_cpu, default=reference)

    @attend.defjvp
    def _jvp(primals, tangents):
        return jax.jvp(reference, primals, tangents)

    return attend


def supports_segments(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether the segment-rule kernel takes q [B, S, K, G, H] over k, v [B, T, K, H] (dtype,
    head dim, one key row per query row, at least ``MIN_QUERY_VECTORS`` vectors per head)."""
    if q.ndim != 5 or jnp.dtype(q.dtype) not in DTYPES or q.shape[-1] not in HEAD_DIMS:
        return False
    b, s, kh, g, hd = q.shape
    return (s * g >= MIN_QUERY_VECTORS and k.ndim == 4 and k.shape[0] == b
            and k.shape[2:] == (kh, hd) and k.dtype == q.dtype and v.shape == k.shape
            and v.dtype == q.dtype)


def segments_enabled() -> bool:
    """Whether the segment-rule attention kernel is on (built and registered here; off by its
    environment variable, by the CPU, or after a failed build)."""
    return SEGMENTS_KERNEL.enabled()


def _segments_kernel(q, k, v, slot, seg, sees, kseg) -> jax.Array:
    """The custom call under the segment rule (``decoder.segment_mask``): q [B, S, K, G, H],
    k, v [B, T, K, H], slot, seg, sees [B, S] and kseg [B, T] (int32) -> [B, S, K, G, H]."""
    on, why = SEGMENTS_KERNEL.status()
    if not on:
        raise RuntimeError(f"the fused CPU attention kernel is {why}")
    call = jax.ffi.ffi_call(SEGMENTS_KERNEL.target, jax.ShapeDtypeStruct(q.shape, q.dtype),
                            vmap_method="broadcast_all")
    ints = [a.astype(jnp.int32) for a in (slot, seg, sees, kseg)]
    return call(q, k, v, *ints, scale=np.float32(1.0 / np.sqrt(q.shape[-1])))


def make_attend_segments(reference: Callable) -> Callable:
    """``attend(q, k, v, slot, seg, sees, kseg, *extra)`` -> [B, S, N, H] like ``reference``
    (which also takes ``extra``, e.g. bounds for its own blocking): the segment-rule kernel on
    CPU, ``reference`` elsewhere and under differentiation."""

    @jax.custom_jvp
    def attend(q, k, v, slot, seg, sees, kseg, *extra):
        def on_cpu(q, k, v, slot, seg, sees, kseg, *extra):
            b, s, kh, g, hd = q.shape
            return _segments_kernel(q, k, v, slot, seg, sees, kseg).reshape(b, s, kh * g, hd)

        return jax.lax.platform_dependent(q, k, v, slot, seg, sees, kseg, *extra, cpu=on_cpu,
                                          default=reference)

    @attend.defjvp
    def _jvp(primals, tangents):
        return jax.jvp(reference, primals, tangents)

    return attend


def supports_segments_grad(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether the backward kernel takes these operands: the segment kernel's, in bf16 at head
    dim 64 (its only path is on AMX tiles)."""
    return (supports_segments(q, k, v) and jnp.dtype(q.dtype) == jnp.bfloat16
            and q.shape[-1] == 64)


def segments_grad_enabled() -> bool:
    """Whether the segment-rule backward kernel (and its forward with the log-sum-exp) is on:
    built and registered here on a CPU with AMX, neither ``JAXDM_CPU_ATTENTION`` nor
    ``JAXDM_CPU_AMX`` off."""
    return (SEGMENTS_GRAD_KERNEL.enabled() and SEGMENTS_LSE_KERNEL.enabled()
            and build.env_switch(build.AMX_ENV_VAR))


def _segments_lse_kernel(q, k, v, slot, seg, sees, kseg):
    """The segment kernel's forward with each query vector's log2-sum-exp2 of its scaled
    logits: -> (out [B, S, K, G, H] bf16, lse [B, S, K, G] fp32), for the backward kernel."""
    on, why = SEGMENTS_LSE_KERNEL.status()
    if not on:
        raise RuntimeError(f"the fused CPU attention kernel is {why}")
    call = jax.ffi.ffi_call(SEGMENTS_LSE_KERNEL.target,
                            (jax.ShapeDtypeStruct(q.shape, q.dtype),
                             jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32)),
                            vmap_method="broadcast_all")
    ints = [a.astype(jnp.int32) for a in (slot, seg, sees, kseg)]
    return call(q, k, v, *ints, scale=np.float32(1.0 / np.sqrt(q.shape[-1])))


def make_attend_segments_lse(reference: Callable) -> Callable:
    """``attend(q, k, v, slot, seg, sees, kseg, *extra)`` -> (out [B, S, N, H], lse): the
    kernel's forward and log-sum-exp on CPU; elsewhere ``reference``'s output and zeros
    (the backward then runs ``reference``'s XLA backward, which does not read them)."""

    def attend(q, k, v, slot, seg, sees, kseg, *extra):
        def on_cpu(q, k, v, slot, seg, sees, kseg, *extra):
            b, s, kh, g, hd = q.shape
            out, lse = _segments_lse_kernel(q, k, v, slot, seg, sees, kseg)
            return out.reshape(b, s, kh * g, hd), lse

        def elsewhere(q, k, v, slot, seg, sees, kseg, *extra):
            return (reference(q, k, v, slot, seg, sees, kseg, *extra),
                    jnp.zeros(q.shape[:-1], jnp.float32))

        return jax.lax.platform_dependent(q, k, v, slot, seg, sees, kseg, *extra, cpu=on_cpu,
                                          default=elsewhere)

    return attend


def _segments_grad_kernel(q, k, v, out, dout, lse, slot, seg, sees, kseg):
    """The backward custom call: q [B, S, K, G, H], k, v [B, T, K, H], the forward's output
    and its cotangent as q [B, S, K, G, H] (bf16), its log-sum-exp (``_segments_lse_kernel``),
    the segment vectors -> (dq, dk, dv) in bf16."""
    on, why = SEGMENTS_GRAD_KERNEL.status()
    if not on:
        raise RuntimeError(f"the fused CPU attention backward kernel is {why}")
    call = jax.ffi.ffi_call(SEGMENTS_GRAD_KERNEL.target,
                            (jax.ShapeDtypeStruct(q.shape, q.dtype),
                             jax.ShapeDtypeStruct(k.shape, k.dtype),
                             jax.ShapeDtypeStruct(v.shape, v.dtype)),
                            vmap_method="broadcast_all")
    ints = [a.astype(jnp.int32) for a in (slot, seg, sees, kseg)]
    return call(q, k, v, out.astype(q.dtype).reshape(q.shape),
                dout.astype(q.dtype).reshape(q.shape), lse.astype(jnp.float32), *ints,
                scale=np.float32(1.0 / np.sqrt(q.shape[-1])))


def make_segments_grad(reference: Callable) -> Callable:
    """``grad(q, k, v, out, dout, lse, slot, seg, sees, kseg, *extra)`` -> (dq, dk, dv) like
    ``reference(q, k, v, out, dout, slot, seg, sees, kseg, *extra)``
    (``decoder.segment_attention_vjp``, which reads no lse): the backward kernel on CPU,
    ``reference`` elsewhere."""

    def grad(q, k, v, out, dout, lse, slot, seg, sees, kseg, *extra):
        def on_cpu(q, k, v, out, dout, lse, slot, seg, sees, kseg, *extra):
            return _segments_grad_kernel(q, k, v, out, dout, lse, slot, seg, sees, kseg)

        def elsewhere(q, k, v, out, dout, lse, *rest):
            return reference(q, k, v, out, dout, *rest)

        return jax.lax.platform_dependent(q, k, v, out, dout, lse, slot, seg, sees, kseg,
                                          *extra, cpu=on_cpu, default=elsewhere)

    return grad
