"""bf16 streaming: no full-size float32 copies, gradients rounded once to the input dtype.

The memory tests read XLA's compiled memory analysis (compile only, nothing runs) of the
loss + gradients at a moderate shape, and bound the working memory ("temp": everything beyond
the arguments and the returned gradients) below the size of ONE bf16 copy of the big operand.
A full float32 copy of the LM head (or the logits, or their gradient) is twice that, so an
upcast of the whole array, the regression these tests guard against, cannot pass. Before the
fix the bf16 fused temp was 40 MiB at this shape (bound 16 MiB, now about 8 MiB) and the
bf16 logits-form temp 68 MiB (bound 32 MiB, now about 4 MiB).

The accuracy tests check that bf16 gradients are float32 results rounded once: within one
bf16 ulp (2^-7 relative) of the float32 gradient of the same (upcast) numbers, for the chunked
XLA path and both Pallas layouts (interpreted on CPU), with several position tiles and
vocabulary blocks so that every accumulation crosses tiles.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.kernels import fused_linear_topk_reverse_kl, topk_reverse_kl

N_ROWS, DIM, VOCAB, K_TEACHER = 512, 256, 32_768, 32
BF16_ULP = 2.0**-7  # spacing of bf16 numbers relative to the lower power of two


def _analysis(fn, *shapes):
    return jax.jit(fn).lower(*shapes).compile().memory_analysis()


def _assert_outputs(analysis, expected_bytes: int) -> None:
    extra = analysis.output_size_in_bytes - expected_bytes
    assert 0 <= extra <= 64, (analysis.output_size_in_bytes, expected_bytes)


def _teacher_shapes(n_rows: int):
    return (
        jax.ShapeDtypeStruct((n_rows, K_TEACHER), jnp.int32),
        jax.ShapeDtypeStruct((n_rows, K_TEACHER), jnp.float32),
    )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_fused_loss_and_grads_stream_the_lm_head(dtype):
    def loss(hidden, head, ids, logprobs):
        kl = fused_linear_topk_reverse_kl(hidden, head, ids, logprobs, impl="xla")
        return jnp.mean(kl)

    analysis = _analysis(
        jax.value_and_grad(loss, argnums=(0, 1)),
        jax.ShapeDtypeStruct((N_ROWS, DIM), dtype),
        jax.ShapeDtypeStruct((DIM, VOCAB), dtype),
        *_teacher_shapes(N_ROWS),
    )
    itemsize = jnp.dtype(dtype).itemsize
    # Outputs: the float32 loss and the two gradients in the input dtype (plus XLA's few
    # bytes of tuple table), nothing else.
    _assert_outputs(analysis, 4 + (N_ROWS * DIM + DIM * VOCAB) * itemsize)
    one_bf16_head = DIM * VOCAB * 2  # 16 MiB; a float32 copy of the head is 32 MiB
    assert analysis.temp_size_in_bytes < one_bf16_head, (
        f"temp {analysis.temp_size_in_bytes / 2**20:.1f} MiB for {jnp.dtype(dtype).name}: "
        f"a full-size copy of the [d, V] LM head or its gradient is being made"
    )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_logits_loss_and_grad_stream_the_logits(dtype):
    def loss(logits, ids, logprobs):
        return jnp.mean(topk_reverse_kl(logits, ids, logprobs, impl="xla"))

    analysis = _analysis(
        jax.value_and_grad(loss),
        jax.ShapeDtypeStruct((N_ROWS, VOCAB), dtype),
        *_teacher_shapes(N_ROWS),
    )
    itemsize = jnp.dtype(dtype).itemsize
    _assert_outputs(analysis, 4 + N_ROWS * VOCAB * itemsize)
    one_bf16_logits = N_ROWS * VOCAB * 2  # 32 MiB; a float32 copy is 64 MiB
    assert analysis.temp_size_in_bytes < one_bf16_logits, (
        f"temp {analysis.temp_size_in_bytes / 2**20:.1f} MiB for {jnp.dtype(dtype).name}: "
        f"a full-size copy of the [T, V] logits or their gradient is being made"
    )


def _teacher(rng: np.random.Generator, n_rows: int, vocab: int):
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(n_rows, vocab)) * 2.0)))
    ids = np.argsort(-logp, axis=-1, kind="stable")[:, :K_TEACHER].astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(np.take_along_axis(logp, ids, axis=-1), jnp.float32)


def _assert_rounded_once(actual, exact, what):
    """Each bf16 entry is within one ulp of the float32 value (plus a tiny absolute slack)."""
    actual = np.asarray(actual, np.float64)
    exact = np.asarray(exact, np.float64)
    slack = 1e-6 * np.max(np.abs(exact))
    error = np.abs(actual - exact)
    bound = BF16_ULP * np.abs(exact) + slack
    worst = int(np.argmax(error - bound))
    assert np.all(error <= bound), (
        f"{what}: {int(np.sum(error > bound))} entries off by more than one bf16 ulp; worst "
        f"flat index {worst}: {actual.flat[worst]} vs float32 {exact.flat[worst]}"
    )


CASES = {
    "xla": dict(impl="xla", block_v=64),
    "pallas-loop": dict(impl="pallas", block_v=64, block_t=8, pallas_layout="loop",
                        interpret=True),
    "pallas-grid": dict(impl="pallas", block_v=64, block_t=8, pallas_layout="grid",
                        interpret=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_bf16_gradients_are_float32_rounded_once(case):
    # 20 rows = 3 position tiles of 8, V = 200 = 3 full blocks of 64 and a tail.
    rng = np.random.default_rng(31)
    n_rows, dim, vocab = 20, 48, 200
    hidden = jnp.asarray(rng.normal(size=(n_rows, dim)), jnp.bfloat16)
    head = jnp.asarray(rng.normal(size=(dim, vocab)) * 0.3, jnp.bfloat16)
    ids, logprobs = _teacher(rng, n_rows, vocab)
    weights = jnp.asarray(rng.uniform(0.5, 1.5, size=n_rows), jnp.float32)

    def loss(h, w, **kwargs):
        return jnp.sum(weights * fused_linear_topk_reverse_kl(h, w, ids, logprobs, **kwargs))

    grad_fn = jax.value_and_grad(loss, argnums=(0, 1))
    value, (d_hidden, d_head) = jax.jit(lambda h, w: grad_fn(h, w, **CASES[case]))(hidden, head)
    exact_value, (exact_d_hidden, exact_d_head) = jax.jit(
        lambda h, w: grad_fn(h, w, impl="reference")
    )(hidden.astype(jnp.float32), head.astype(jnp.float32))

    assert d_hidden.dtype == jnp.bfloat16 and d_hidden.shape == hidden.shape
    assert d_head.dtype == jnp.bfloat16 and d_head.shape == head.shape
    # bf16 x bf16 products are exact in float32, so the loss differs only by summation order.
    np.testing.assert_allclose(float(value), float(exact_value), rtol=1e-4)
    assert float(jnp.max(jnp.abs(exact_d_head))) > 1e-3  # a gradient worth comparing
    _assert_rounded_once(d_hidden, exact_d_hidden, f"{case} d hidden")
    _assert_rounded_once(d_head, exact_d_head, f"{case} d lm_head")


def test_staged_bf16_writes_match_float32():
    """XLA:CPU path with the float32 staging of gradient blocks (groups, leftovers and tail)."""
    from jaxdm.kernels import lse_topk_xla

    rng = np.random.default_rng(32)
    n_rows, dim, vocab, block_v = 12, 40, 1100, 64  # 17 full blocks of 64 and a tail of 12
    group = lse_topk_xla._staging_group(jnp.zeros((dim, vocab), jnp.bfloat16), block_v, 17)
    assert group == 2  # 8 staged groups, 1 block written alone, then the tail
    hidden = jnp.asarray(rng.normal(size=(n_rows, dim)), jnp.bfloat16)
    head = jnp.asarray(rng.normal(size=(dim, vocab)) * 0.3, jnp.bfloat16)
    ids, logprobs = _teacher(rng, n_rows, vocab)

    def fused(h, w, **kwargs):
        return jnp.sum(fused_linear_topk_reverse_kl(h, w, ids, logprobs, **kwargs))

    def from_logits(z, **kwargs):
        return jnp.sum(topk_reverse_kl(z, ids, logprobs, **kwargs))

    grads = jax.jit(jax.grad(lambda h, w: fused(h, w, impl="xla", block_v=block_v),
                             argnums=(0, 1)))(hidden, head)
    exact = jax.jit(jax.grad(lambda h, w: fused(h, w, impl="reference"), argnums=(0, 1)))(
        hidden.astype(jnp.float32), head.astype(jnp.float32)
    )
    for ours, ref, name in zip(grads, exact, ("d hidden", "d lm_head")):
        assert ours.dtype == jnp.bfloat16
        _assert_rounded_once(ours, ref, f"staged {name}")

    logits = (hidden.astype(jnp.float32) @ head.astype(jnp.float32)).astype(jnp.bfloat16)
    d_logits = jax.jit(jax.grad(lambda z: from_logits(z, impl="xla", block_v=block_v)))(logits)
    exact_d_logits = jax.jit(jax.grad(lambda z: from_logits(z, impl="reference")))(
        logits.astype(jnp.float32)
    )
    assert d_logits.dtype == jnp.bfloat16
    assert float(jnp.max(jnp.abs(exact_d_logits))) > 1e-3
    _assert_rounded_once(d_logits, exact_d_logits, "staged d logits")
