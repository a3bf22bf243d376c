"""decoder.attend against a plain softmax-attention reference (numpy, float64): the XLA
attention (``xla_attend``) and the fused CPU kernel (``attend`` where it is on)."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from jaxdm.models import decoder
from jaxdm.models.cpu import attention as cpu_attention
from tests.models.helpers_models import require_cpu_attention


@pytest.fixture(params=["xla", "kernel"])
def attend(request):
    if request.param == "xla":
        return decoder.xla_attend
    require_cpu_attention()  # the kernel whatever decoder.attend's policy would pick
    return cpu_attention.make_attend(decoder.xla_attend)


def reference(q, sources):
    """One softmax over the keys of all sources; q [B, S, K, G, H]; returns [B, S, K*G, H]."""
    q = np.asarray(q, np.float64)
    b, s, kh, g, hd = q.shape
    logits, values = [], []
    for k, v, mask in sources:
        k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
        k, v = np.broadcast_to(k, (b,) + k.shape[1:]), np.broadcast_to(v, (b,) + v.shape[1:])
        lg = np.einsum("bskgh,btkh->bkgst", q, k) / np.sqrt(hd)
        logits.append(np.where(np.asarray(mask)[:, None, None], lg, -np.inf))
        values.append(v)
    lg = np.concatenate(logits, -1)
    v = np.concatenate(values, 1)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bkgst,btkh->bskgh", p, v)
    return out.reshape(b, s, kh * g, hd)


def _inputs(seed, b, s, t, kh=2, g=3, hd=32, bk=None):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(ks[0], (b, s, kh, g, hd))
    k = jax.random.normal(ks[1], (bk or b, t, kh, hd))
    v = jax.random.normal(ks[2], (bk or b, t, kh, hd))
    return q, k, v


def test_attend_matches_reference_causal_rows(attend):
    q, k, v = _inputs(0, b=3, s=5, t=5)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (3, 5, 5))
    out = jax.jit(attend)(q, [(k, v, mask)])
    assert out.shape == (3, 5, 6, 32)
    np.testing.assert_allclose(out, reference(q, [(k, v, mask)]), atol=2e-6)


def test_attend_shared_cache_and_new_tokens_share_one_softmax(attend):
    # a cache shared by all rows (Bk = 1) plus each row's own tokens, rows with different
    # cache lengths: the shared-cache contraction must equal a per-row copy of the cache
    q, k_new, v_new = _inputs(1, b=4, s=3, t=3)
    _, k_cache, v_cache = _inputs(2, b=1, s=1, t=7, bk=1)
    lengths = jnp.array([7, 4, 1, 0])
    cache_mask = jnp.broadcast_to(jnp.arange(7)[None, None] < lengths[:, None, None], (4, 3, 7))
    self_mask = jnp.broadcast_to(jnp.tril(jnp.ones((3, 3), bool)), (4, 3, 3))
    sources = [(k_cache, v_cache, cache_mask), (k_new, v_new, self_mask)]
    out = jax.jit(attend)(q, sources)
    np.testing.assert_allclose(out, reference(q, sources), atol=2e-6)
    copied = [(jnp.repeat(k_cache, 4, 0), jnp.repeat(v_cache, 4, 0), cache_mask), sources[1]]
    np.testing.assert_allclose(out, attend(q, copied), atol=1e-6)


def test_attend_fully_masked_row_is_finite_uniform_average(attend):
    q, k, v = _inputs(3, b=1, s=2, t=4)
    mask = jnp.array([[[True, True, False, False], [False, False, False, False]]])
    out = attend(q, [(k, v, mask)])
    assert np.isfinite(np.asarray(out)).all()
    uniform = np.asarray(v[0]).mean(0)  # [K, H], each query head of a KV head the same
    np.testing.assert_allclose(np.asarray(out[0, 1]).reshape(2, 3, 32),
                               np.repeat(uniform[:, None], 3, 1), atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attend_gradient_matches_reference(dtype, attend):
    q, k, v = _inputs(4, b=2, s=4, t=6)
    mask = jnp.broadcast_to(jnp.arange(6)[None, None] <= jnp.arange(4)[None, :, None] + 2,
                            (2, 4, 6))
    w = jax.random.normal(jax.random.PRNGKey(5), (2, 4, 6, 32))

    def loss(q, k, v, fn):
        return jnp.sum(fn(q, [(k, v, mask)]).astype(jnp.float32) * w)

    cast = [x.astype(dtype) for x in (q, k, v)]
    got = jax.grad(loss, argnums=(0, 1, 2))(*cast, attend)
    # the reference: the same function in float64-free plain jnp softmax form
    def plain(q, sources):
        (k, v, m), = sources
        q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
        lg = jnp.einsum("bskgh,btkh->bkgst", q32, k32) / jnp.sqrt(32.0)
        p = jax.nn.softmax(jnp.where(m[:, None, None], lg, -jnp.inf), -1)
        return jnp.einsum("bkgst,btkh->bskgh", p, v32).reshape(2, 4, 6, 32)

    want = jax.grad(loss, argnums=(0, 1, 2))(*[x.astype(jnp.float32) for x in cast], plain)
    tol = 1e-5 if dtype == "float32" else 5e-2
    for a, b in zip(got, want):
        assert a.dtype == jnp.dtype(dtype)
        np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=tol, rtol=tol)
