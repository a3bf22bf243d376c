"""The backward pass of ``decoder.attend_segments`` (``segment_attention_vjp``): gradients
equal XLA's autodiff of the reference attention on rows with contexts, continuations, padding
and masked keys, with and without a plan (context cuts included), at read slots, in fp32 and
bf16; and the compiled gradient holds one block's probabilities, not every block's."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.cpu import attention as cpu_attention
from tests.models.test_cpu_attention import _segment_rows


def _operands(dtype, b=2, seed=1):
    t, slot, seg, sees, real = _segment_rows(b=b)
    s = seg.shape[1]
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, s, 3, 3, 64)), dtype)
    k, v = (jnp.asarray(rng.normal(size=(b, s, 3, 64)), dtype) for _ in range(2))
    # a cotangent on real slots only: padding outputs are never read
    w = jnp.asarray(rng.normal(size=(b, s, 9, 64)), jnp.float32) * real[..., None, None]
    return t, slot, seg, sees, q, k, v, w


def _grads(fn, q, k, v, w):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-forward", "xla-forward"])
@pytest.mark.parametrize("planned", [False, True], ids=["one-block", "plan-with-cuts"])
def test_gradients_equal_xla_autodiff_of_the_reference(monkeypatch, kernel, planned):
    if kernel and not cpu_attention.segments_enabled():
        pytest.skip("the fused CPU attention kernel is off here")
    if not kernel:
        monkeypatch.setattr(cpu_attention, "segments_enabled", lambda: False)
    t, slot, seg, sees, q, k, v, w = _operands(jnp.float32)
    s = seg.shape[1]
    plan = decoder.trunk_suffix_plan(s, t, 32, 32, 4) if planned else None
    ours = _grads(lambda q, k, v: decoder.attend_segments(q, k, v, slot, seg, sees, seg,
                                                          plan=plan), q, k, v, w)
    ref = functools.partial(decoder._segment_attention_xla, plan=plan)
    want = _grads(lambda q, k, v: ref(q, k, v, slot, seg, sees, seg, sees), q, k, v, w)
    for name, got, exp in zip("qkv", ours, want):
        assert got.shape == exp.shape and got.dtype == exp.dtype, name
        scale = float(jnp.max(jnp.abs(exp)))
        assert scale > 0.1, name  # a gradient that is there
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), atol=2e-5 * scale,
                                   err_msg=f"d{name}")
    # keys nobody may see (the padding slots) get no gradient
    pad = np.asarray(seg) < 0
    assert np.all(np.asarray(ours[1])[pad] == 0) and np.all(np.asarray(ours[2])[pad] == 0)


def test_gradients_at_read_slots_and_in_bf16():
    """The last layer's path: queries at some slots only (repeats, context and continuation
    slots) against a whole row, one block per VJP_QUERY_BLOCK queries; bf16 operands give
    bf16 gradients within bf16 rounding of the fp32 ones."""
    t, slot, seg, sees, q, k, v, _ = _operands(jnp.float32)
    b = seg.shape[0]
    read = jnp.asarray([[130, 3, 99, 130, 140, 112] * 3, [0, 119, 124, 125, 111, 50] * 3],
                       jnp.int32)
    at = lambda a: jnp.take_along_axis(a, read, axis=1)  # noqa: E731
    q_read = jnp.take_along_axis(q, read[:, :, None, None, None], axis=1)
    w = jnp.asarray(np.random.default_rng(3).normal(size=(b, read.shape[1], 9, 64)),
                    jnp.float32)
    # slot 111 of row 1 is padding: it sees no key, so its output (the mean of the values)
    # does not depend on q or k, while autodiff of the reference differentiates the finite
    # mask bias there; its cotangent is zero here (the kernel test below covers such a query)
    w = w.at[1, 4].set(0.0).at[1, 10].set(0.0).at[1, 16].set(0.0)
    fn = lambda q, k, v: decoder.attend_segments(q, k, v, read, at(seg), at(sees), seg)  # noqa
    ref = lambda q, k, v: decoder._segment_attention_xla(  # noqa: E731
        q, k, v, read, at(seg), at(sees), seg, at(sees), plan=None)
    for got, exp in zip(_grads(fn, q_read, k, v, w), _grads(ref, q_read, k, v, w)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp),
                                   atol=2e-5 * float(jnp.max(jnp.abs(exp))))
    f32 = _grads(fn, q_read, k, v, w)
    bf16 = _grads(fn, *(x.astype(jnp.bfloat16) for x in (q_read, k, v)), w)
    for got, exp in zip(bf16, f32):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(exp),
                                   atol=3e-2 * float(jnp.max(jnp.abs(exp))))


def test_the_gradient_holds_one_blocks_probabilities():
    """XLA's compiled temporaries of the gradient, at a 1,024-slot row with a 512-token
    context and context cuts: below a bound from one block's arrays, and below what autodiff
    of the planned reference needs (it keeps every block's and every cut's residuals)."""
    b, s, trunk, chunk, kh, g, hd = 1, 1024, 512, 128, 3, 3, 64
    seg = np.full((b, s), -1, np.int32)
    seg[:, :trunk] = 0
    for i, start in enumerate(range(trunk, 1000, 12)):
        seg[:, start:start + 12] = i + 1
    slot = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    seg = jnp.asarray(seg)
    sees = jnp.where(seg == 0, slot + 1, jnp.where(seg > 0, trunk - 100, 0)).astype(jnp.int32)
    plan = decoder.trunk_suffix_plan(s, trunk, 64, chunk, 8)
    q = jax.ShapeDtypeStruct((b, s, kh, g, hd), jnp.float32)
    kv = jax.ShapeDtypeStruct((b, s, kh, hd), jnp.float32)

    def temp_bytes(fn):
        loss = lambda q, k, v: jnp.sum(fn(q, k, v))  # noqa: E731
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    ours = temp_bytes(lambda q, k, v: decoder.attend_segments(q, k, v, slot, seg, sees, seg,
                                                              plan=plan))
    ref = functools.partial(decoder._segment_attention_xla, plan=plan)
    theirs = temp_bytes(lambda q, k, v: ref(q, k, v, slot, seg, sees, seg, sees))
    widest = trunk + 64 + chunk                       # keys of a continuation block
    block = b * g * chunk * widest * 4                # one head's [G*q, keys] fp32 array
    operands = b * s * (kh * g + 2 * kh) * hd * 4     # q, k, v (or their gradients) once
    assert ours <= 8 * block + 8 * operands, (ours, block, operands)
    assert ours < theirs / 2, (ours, theirs)


def _grad_kernel_on():
    if not cpu_attention.segments_grad_enabled():
        pytest.skip("the attention backward kernel is off here (it needs AMX)")


def test_backward_kernel_equals_the_xla_backward_in_bf16():
    """The AMX backward kernel against ``segment_attention_vjp`` (the same roundings: bf16
    product operands, fp32 softmax and sums) on rows with contexts, continuations, padding,
    and a query that sees no key but gets a cotangent (the forward gave it the mean of all
    values: its gradient goes to every value, none to q or k); at whole rows and at read
    slots (queries fewer than keys)."""
    _grad_kernel_on()
    t, slot, seg, sees, q, k, v, w = _operands(jnp.bfloat16)
    seg_q, sees_q = seg, sees   # row 1 slot 105 (padding) sees nothing: a cotangent there
    blind = np.zeros(seg.shape, bool)
    blind[1, 105] = True
    w = w.at[1, 105].set(1.0)
    out, lse = jax.jit(cpu_attention._segments_lse_kernel)(q, k, v, slot, seg_q, sees_q, seg)
    # the training forward: the segment kernel's output, and each vector's log2-sum-exp2 of
    # its scaled logits over the keys it sees (a bound far above any where it sees none)
    assert np.array_equal(np.asarray(out.reshape(w.shape), np.float32), np.asarray(
        decoder.attend_segments(q, k, v, slot, seg_q, sees_q, seg), np.float32))
    mask = np.asarray(decoder.segment_mask(slot, seg_q, sees_q, seg, 0, seg.shape[1], 0,
                                           seg.shape[1]))
    logits = np.einsum("bskgh,btkh->bskgt", np.asarray(q, np.float32),
                       np.asarray(k, np.float32)) / 8.0
    logits = np.where(mask[:, :, None, None, :], logits, -np.inf)
    seen = mask.any(-1)
    want_lse = np.log2(np.sum(np.exp(logits[seen]), axis=-1))
    np.testing.assert_allclose(np.asarray(lse)[seen], want_lse, atol=2e-4)
    assert np.all(np.asarray(lse)[~seen] >= 1e29)
    dout = w.astype(jnp.bfloat16)
    args = (q, k, v, out, dout, slot, seg_q, sees_q, seg)
    want = jax.jit(functools.partial(decoder.segment_attention_vjp, plan=None))(*args, sees_q)
    got = jax.jit(cpu_attention._segments_grad_kernel)(*args[:5], lse, *args[5:])
    for name, a, e in zip("qkv", got, want):
        assert a.shape == e.shape and a.dtype == e.dtype == jnp.bfloat16, name
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        scale = float(np.abs(e).max())
        assert scale > 0.1, name
        np.testing.assert_allclose(a, e, atol=4e-3 * scale, err_msg=f"d{name}")
    assert np.all(np.asarray(got[0], np.float32)[blind] == 0)
    # deterministic: the per-slot sums of dk and dv do not depend on which thread ran what
    again = jax.jit(cpu_attention._segments_grad_kernel)(*args[:5], lse, *args[5:])
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, again))
    # read slots: queries at some slots of a row against all its keys
    read = jnp.asarray([[130, 3, 99, 130, 140, 112] * 3, [0, 119, 124, 125, 111, 50] * 3],
                       jnp.int32)
    at = lambda a: jnp.take_along_axis(a, read, axis=1)  # noqa: E731
    q_read = jnp.take_along_axis(q, read[:, :, None, None, None], axis=1)
    out, lse = jax.jit(cpu_attention._segments_lse_kernel)(q_read, k, v, read, at(seg),
                                                           at(sees), seg)
    dout = jnp.asarray(np.random.default_rng(5).normal(size=out.shape), jnp.bfloat16)
    args = (q_read, k, v, out, dout, read, at(seg), at(sees), seg)
    want = jax.jit(functools.partial(decoder.segment_attention_vjp, plan=None))(*args, at(sees))
    got = jax.jit(cpu_attention._segments_grad_kernel)(*args[:5], lse, *args[5:])
    for name, a, e in zip("qkv", got, want):
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        np.testing.assert_allclose(a, e, atol=4e-3 * float(np.abs(e).max()), err_msg=f"d{name}")


def test_bf16_training_runs_the_backward_kernel_and_matches_fp32(monkeypatch):
    """jax.grad of ``attend_segments`` in bf16 calls the backward kernel (not with
    JAXDM_CPU_AMX=0), and its gradients are the fp32 ones within bf16 rounding."""
    _grad_kernel_on()
    t, slot, seg, sees, q, k, v, w = _operands(jnp.float32)
    plan = decoder.trunk_suffix_plan(seg.shape[1], t, 32, 32, 4)
    fn = lambda q, k, v: decoder.attend_segments(q, k, v, slot, seg, sees, seg,  # noqa: E731
                                                 plan=plan)
    low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)  # noqa: E731
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*low).as_text()
    assert cpu_attention.SEGMENTS_GRAD_KERNEL.target in text
    for got, exp in zip(_grads(fn, *low, w), _grads(fn, q, k, v, w)):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(exp),
                                   atol=3e-2 * float(jnp.max(jnp.abs(exp))))
    monkeypatch.setenv("JAXDM_CPU_AMX", "0")
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*low).as_text()
    assert cpu_attention.SEGMENTS_GRAD_KERNEL.target not in text
