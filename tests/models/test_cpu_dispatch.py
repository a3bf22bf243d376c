"""The seam between the decoder and the CPU kernels (jaxdm.models.cpu.dispatch): what each
factory hands to its XLA reference, when the kernel runs instead, and that the segment
attention's gradient is its ``backward``'s."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.cpu import dispatch as cpu_dispatch, matmul as cpu_matmul
from jaxdm.models.cpu.scan import LayerOf


def _recording(fn):
    """fn, and the list of the arguments' (type, shape) it is called with (at trace time)."""
    calls = []

    def wrapped(*args, **kwargs):
        calls.append(tuple((isinstance(a, jax.Array), getattr(a, "shape", a)) for a in args))
        return fn(*args, **kwargs)

    return wrapped, calls


def _einsum(spec, x, w):
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)


def test_projection_hands_the_reference_a_layer_s_slice_where_the_kernel_does_not_run():
    reference, calls = _recording(_einsum)
    project = cpu_dispatch.projection(reference)
    x = jax.random.normal(jax.random.key(0), (2, 3, 48))
    stack = jax.random.normal(jax.random.key(1), (4, 48, 20))  # K = 48, N = 20: not the kernel's
    got = jax.jit(lambda x, s, i: project("BSD,DF->BSF", x, LayerOf(s, i, s.dtype)))(
        x, stack, jnp.int32(2))
    # the layer's slice (an array), not the LayerOf
    assert calls == [((False, "BSD,DF->BSF"), (True, (2, 3, 48)), (True, (48, 20)))]
    np.testing.assert_allclose(got, _einsum("BSD,DF->BSF", x, stack[2]), rtol=1e-6, atol=1e-6)
    # a spec that is not one matmul (w transposed) goes to the reference too
    w = jax.random.normal(jax.random.key(2), (20, 48))
    np.testing.assert_allclose(project("BSD,FD->BSF", x, w), _einsum("BSD,FD->BSF", x, w),
                               rtol=1e-6, atol=1e-6)
    assert len(calls) == 2


def test_projection_runs_the_kernel_where_it_takes_the_operands():
    if not cpu_matmul.enabled(jnp.float32):
        pytest.skip(f"fp32 matmul {cpu_matmul.status(jnp.float32)[1]}")
    reference, calls = _recording(_einsum)
    project = cpu_dispatch.projection(reference)
    x = jax.random.normal(jax.random.key(0), (2, 3, 64))
    w = jax.random.normal(jax.random.key(1), (64, 2, 16))  # [D, N, H]: N * H = 32
    fn = jax.jit(lambda x, w: project("BSD,DNH->BSNH", x, w))
    assert cpu_matmul.KERNELS[jnp.dtype(jnp.float32)].target in fn.lower(x, w).as_text()
    assert calls == []
    got = fn(x, w)
    assert got.shape == (2, 3, 2, 16) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, _einsum("BSD,DNH->BSNH", x, w), rtol=1e-5, atol=1e-5)


def test_attention_falls_back_to_the_reference_for_operands_the_kernel_does_not_take():
    reference, calls = _recording(decoder.xla_attend)
    attend = cpu_dispatch.attention(reference)
    b, s, kh, g, hd = 1, 1, 2, 2, 48  # head dim 48 and one query: never the kernel's
    q = jax.random.normal(jax.random.key(0), (b, s, kh, g, hd))
    k = jax.random.normal(jax.random.key(1), (b, 5, kh, hd))
    sources = [(k, k, jnp.ones((b, s, 5), bool))]
    np.testing.assert_array_equal(jax.jit(attend)(q, sources),
                                  jax.jit(decoder.xla_attend)(q, sources))
    assert len(calls) == 1


def test_segment_attention_is_differentiated_by_its_backward():
    b, s, kh, g, hd = 1, 4, 1, 2, 48  # head dim 48: XLA's forward on every CPU
    q = jax.random.normal(jax.random.key(0), (b, s, kh, g, hd))
    k = jax.random.normal(jax.random.key(1), (b, s, kh, hd))
    v = jax.random.normal(jax.random.key(2), (b, s, kh, hd))
    slot = jnp.arange(s, dtype=jnp.int32)[None]
    seg = jnp.zeros((b, s), jnp.int32)
    sees = slot + 1
    seen = {}

    def backward(q, k, v, out, dout, *rest, plan):
        seen["plan"], seen["out"] = plan, out
        return 2 * jnp.ones_like(q), 3 * jnp.ones_like(k), 4 * jnp.ones_like(v)

    attend = cpu_dispatch.segment_attention(decoder._segment_attention_xla, backward)
    plan = decoder.causal_plan(s, 2)
    out = jax.jit(lambda *a: attend(plan, *a))(q, k, v, slot, seg, sees, seg, sees)
    want = jax.jit(functools.partial(decoder._segment_attention_xla, plan=plan))(
        q, k, v, slot, seg, sees, seg, sees)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    loss = lambda q, k, v: jnp.sum(attend(plan, q, k, v, slot, seg, sees, seg, sees))  # noqa: E731
    dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert seen["plan"] == plan and seen["out"].shape == (b, s, kh * g, hd)
    assert float(dq.min()) == float(dq.max()) == 2.0
    assert float(dk.min()) == float(dk.max()) == 3.0
    assert float(dv.min()) == float(dv.max()) == 4.0
