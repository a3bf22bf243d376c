"""The tail bucket of the top-k reverse KL (issue 38): the student's and the teacher's mass
outside the student's top-k as one more outcome, so the loss is a divergence between two
proper distributions. Values against a float64 numpy computation, non-negativity where the
unbucketed loss goes negative, every implementation's value and gradient against autodiff of
the plain formula, and finite gradients where S holds the whole mass."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.kernels import (fused_linear_topk_reverse_kl, plain_topk_reverse_kl,
                           tail_bucket_kl, topk_reverse_kl)

V, KT, K = 96, 8, 4


def _case(seed: int, n: int = 12, vocab: int = V, kt: int = KT):
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=(n, vocab)) * 3.0).astype(np.float32)
    t_logits = (rng.normal(size=(n, vocab)) * 3.0).astype(np.float32)
    t_logp = np.asarray(jax.nn.log_softmax(jnp.asarray(t_logits), axis=-1))
    ids = np.argsort(-t_logp, axis=-1)[:, :kt].astype(np.int32)
    return z, ids, np.take_along_axis(t_logp, ids, axis=-1).astype(np.float32)


def _numpy_kl_tail(z, ids, logp, k, floor_min=-30.0):
    z = z.astype(np.float64)
    lp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        z.max(-1, keepdims=True)
    out = []
    for r in range(z.shape[0]):
        s = np.argsort(-z[r], kind="stable")[:k]
        listed = dict(zip(ids[r].tolist(), logp[r].astype(np.float64).tolist()))
        left = max(1.0 - np.exp(logp[r].astype(np.float64)).sum(), 0.0)
        floor = max(np.log(left) - np.log(z.shape[1] - len(listed)) if left > 0 else -np.inf,
                    floor_min)
        tau = np.array([listed.get(j, floor) for j in s])
        p = np.exp(lp[r, s])
        p_t, q_t = 1.0 - p.sum(), max(1.0 - np.exp(tau).sum(), np.exp(floor_min))
        out.append(np.sum(p * (lp[r, s] - tau)) + p_t * (np.log(p_t) - np.log(q_t)))
    return np.array(out)


def test_tail_bucket_values_and_a_proper_divergence():
    z, ids, logp = _case(0)
    got = np.asarray(topk_reverse_kl(z, ids, logp, k=K, impl="reference", tail=True))
    np.testing.assert_allclose(got, _numpy_kl_tail(z, ids, logp, K), rtol=2e-5, atol=2e-6)
    assert np.all(got >= -1e-6)                      # a KL between proper distributions
    # The unbucketed top-k KL is not a divergence: with the teacher's mass on S larger than
    # the student's it goes negative; the bucket restores the sign.
    z2 = np.zeros((1, V), np.float32)
    z2[0, :K] = 1.0                                  # S = first K tokens, P_S small
    ids2 = np.arange(KT, dtype=np.int32)[None]
    logp2 = np.log(np.full((1, KT), 0.12, np.float32))    # teacher: 96 % on its list
    plain = float(topk_reverse_kl(z2, ids2, logp2, k=K, impl="reference")[0])
    tailed = float(topk_reverse_kl(z2, ids2, logp2, k=K, impl="reference", tail=True)[0])
    assert plain < 0 < tailed
    # S holding every token: no tail, the bucket adds exactly 0.
    small, sids, slogp = _case(1, n=3, vocab=8, kt=8)
    np.testing.assert_allclose(topk_reverse_kl(small, sids, slogp, k=8, impl="reference",
                                               tail=True),
                               topk_reverse_kl(small, sids, slogp, k=8, impl="reference"),
                               atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "xla", "pallas"])
def test_every_impl_matches_autodiff_of_the_plain_formula(impl):
    z, ids, logp = _case(2)
    up = np.random.default_rng(3).normal(size=z.shape[0]).astype(np.float32)

    def vg(fn):
        return jax.jit(jax.value_and_grad(lambda x: jnp.sum(fn(x) * up)))(jnp.asarray(z))

    want_v, want_g = vg(lambda x: plain_topk_reverse_kl(x, ids, logp, K, tail=True))
    got_v, got_g = vg(lambda x: topk_reverse_kl(x, ids, logp, k=K, impl=impl, tail=True,
                                                block_v=32))
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_fused_linear_tail_bucket_gradients(impl):
    rng = np.random.default_rng(4)
    h = rng.normal(size=(10, 16)).astype(np.float32)
    w = (rng.normal(size=(16, V)) * 0.5).astype(np.float32)
    _, ids, logp = _case(5, n=10)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda a, b: jnp.sum(fn(a, b)), argnums=(0, 1)))(
            jnp.asarray(h), jnp.asarray(w))

    want = loss(lambda a, b: plain_topk_reverse_kl(a @ b, ids, logp, K, tail=True))
    got = loss(lambda a, b: fused_linear_topk_reverse_kl(a, b, ids, logp, k=K, impl=impl,
                                                         tail=True, block_v=32))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g, wg in zip(got[1], want[1]):
        np.testing.assert_allclose(g, wg, rtol=1e-4, atol=1e-5)


def test_gradient_finite_without_a_tail_and_with_masked_logits():
    z, ids, logp = _case(6, n=4, vocab=8, kt=8)
    z[1, 3:] = -np.inf                               # a row with fewer than k finite logits
    g = jax.grad(lambda x: jnp.sum(topk_reverse_kl(x, ids, logp, k=8, impl="xla",
                                                   tail=True)))(jnp.asarray(z))
    assert np.all(np.isfinite(np.asarray(g)[np.isfinite(z)]))
    # tail_bucket_kl alone: all mass in S -> 0 and a zero gradient.
    log_p_s = jnp.log(jnp.array([[0.5, 0.5]]))
    val, grad = jax.value_and_grad(lambda x: tail_bucket_kl(x, jnp.log(jnp.array(
        [[0.3, 0.3]])))[0])(log_p_s)
    assert float(val) == 0.0 and np.all(np.asarray(grad) == 0.0)
