"""Linear maps with their own transposes: the tangents of the projections' custom JVPs
(``cpu.matmul``'s product, ``decoder``'s LoRA update), so reverse mode multiplies the way a
mixed-precision backward pass should and forward mode still works.

Why not ``jax.custom_vjp``: the decoder's layer loop (``cpu.scan``) differentiates through a
custom JVP, and a custom VJP inside it has no forward mode. Why not plain autodiff: JAX
transposes ``dot(x_bf16, w_bf16) -> fp32`` into ``dot(g_fp32, w_bf16)``, which XLA:CPU runs
with w upcast to fp32 (~300 GFLOP/s against 1.7 TFLOP/s for the bf16 product on an AMX CPU,
2026-12-07), and ``xᵀ·g`` for a LoRA factor transposes the activations first.

``linear_map(fun, transpose, residuals, linear)`` is ``jax.custom_derivatives.linear_call``
(``fun(residuals, linear)``, linear in ``linear``; ``transpose(residuals, cotangent)`` its
transpose). JAX ships no batching rule for it, so one is registered here: under ``vmap``
(the shared-prefix scorer vmaps its groups inside ``grad``) the map and its transpose are
vmapped, the linear inputs broadcast to the batch (their cotangents are then summed by the
broadcast's own transpose).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
from jax.custom_derivatives import linear_call

try:  # JAX's primitive and batching table (no public handle): see the module docstring
    from jax._src.custom_derivatives import linear_call_p as _LINEAR_CALL
    from jax._src.interpreters import batching as _batching
except ImportError:  # pragma: no cover - a JAX without them: linear_map vmaps nowhere
    _LINEAR_CALL = _batching = None
# (a JAX whose tables moved raises AttributeError below: the import fails loudly, not slowly)


def linear_map(fun: Callable, transpose: Callable, residuals: Any, linear: Any) -> Any:
    """``fun(residuals, linear)``, whose transpose in ``linear`` is ``transpose(residuals,
    cotangent)`` (see the module docstring)."""
    return linear_call(fun, transpose, residuals, linear)


def _batched_linear_call(args, dims, *, callee, transpose_thunk, num_callee_consts, num_res):
    """vmap of one linear_call: a linear_call of the vmapped map and its vmapped transpose,
    every output and linear input batched on axis 0."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    n_fixed = num_callee_consts + num_res
    fixed, lin = list(args[:n_fixed]), list(args[n_fixed:])
    fixed_dims = list(dims[:n_fixed])
    lin = [jax.numpy.broadcast_to(a, (size,) + a.shape) if d is None
           else jax.numpy.moveaxis(a, d, 0) for a, d in zip(lin, dims[n_fixed:])]

    def fun(fixed, lin):
        return jax.vmap(lambda f, l: jax.core.eval_jaxpr(callee.jaxpr, callee.consts, *f, *l),
                        in_axes=(fixed_dims, 0))(fixed, lin)

    def fun_transpose(fixed, cts):
        t_jaxpr, t_consts = transpose_thunk()
        res, res_dims = fixed[num_callee_consts:], fixed_dims[num_callee_consts:]
        return jax.vmap(lambda r, c: jax.core.eval_jaxpr(t_jaxpr.jaxpr, t_jaxpr.consts,
                                                          *t_consts, *r, *c),
                        in_axes=(res_dims, 0))(res, cts)

    out = linear_call(fun, fun_transpose, fixed, lin)
    return out, [0] * len(out)


if _LINEAR_CALL is not None and _LINEAR_CALL not in _batching.fancy_primitive_batchers:
    _batching.primitive_batchers[_LINEAR_CALL] = _batched_linear_call
