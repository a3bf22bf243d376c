"""The projections' own backward passes (``decoder._low_precision_project`` for bf16 weights,
``decoder._adapted_project`` for LoRA-adapted ones): gradients equal autodiff of the plain
fp32 einsum (fp32: to rounding; bf16: within the bf16 rounding of the cotangent), padded rows
(``valid``) get no gradient, and the frozen weight gets none under LoRA."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder

SPECS = [("BSD,DNH->BSNH", (2, 300, 64), (64, 4, 32)),   # q: output heads split
         ("BSNH,NHD->BSD", (2, 300, 4, 16), (4, 16, 48)),  # o: input heads merged
         ("BSF,FD->BSD", (2, 300, 96), (96, 64))]          # down
VALID = jnp.array([300, 170])


def _loss(y):
    # Reads only the rows VALID keeps (as the decoder's downstream does) through a nonlinearity.
    keep = (jnp.arange(300)[None] < VALID[:, None]).reshape((2, 300) + (1,) * (y.ndim - 2))
    return jnp.sum(jnp.where(keep, jnp.sin(y), 0.0))


def _rel(u, v):
    u, v = np.asarray(u, np.float32), np.asarray(v, np.float32)
    return float(np.abs(u - v).max() / np.abs(v).max())


@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_bf16_projection_gradients_match_fp32_autodiff(spec, xs, ws):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=xs), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=ws) * 0.1, jnp.bfloat16)
    got = jax.grad(lambda x, w: _loss(decoder._mm(spec, x, w, VALID)), argnums=(0, 1))(x, w)
    ref = jax.grad(lambda x, w: _loss(decoder._einsum(spec, x.astype(jnp.float32),
                                                      w.astype(jnp.float32))),
                   argnums=(0, 1))(x, w)
    assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.bfloat16
    for g, r in zip(got, ref):
        assert _rel(g, r) < 1.5e-2          # the cotangent rounded to bf16 (2^-8), then summed
    # rows past valid: no gradient (the kernel's outputs there are constants)
    assert float(jnp.max(jnp.abs(got[0][1, 170:].astype(jnp.float32)))) == 0.0


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-6), (jnp.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_adapted_gradients_match_the_merged_weight(spec, xs, ws, dtype, tol):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=xs), dtype)
    w = jnp.asarray(rng.normal(size=ws) * 0.1, dtype)
    n_in = int(np.prod(xs[2:]))
    n_out = int(np.prod(ws)) // n_in
    a = jnp.asarray(rng.normal(size=(n_in, 8)) * 0.1, jnp.float32)
    b = jnp.asarray(rng.normal(size=(8, n_out)) * 0.1, jnp.float32)

    def adapted(x, w, a, b):
        return _loss(decoder._mm(spec, x, decoder.Adapted(w, a, b, 2.0), VALID))

    def merged(x, w, a, b):
        full = w.astype(jnp.float32) + 2.0 * (a @ b).reshape(ws)
        return _loss(decoder._einsum(spec, x.astype(jnp.float32), full))

    got = jax.grad(adapted, argnums=(0, 1, 2, 3))(x, w, a, b)
    ref = jax.grad(merged, argnums=(0, 1, 2, 3))(x, w, a, b)
    for name, i in (("x", 0), ("a", 2), ("b", 3)):
        assert _rel(got[i], ref[i]) < tol, name
    assert float(jnp.max(jnp.abs(got[1].astype(jnp.float32)))) == 0.0   # W is frozen
    assert float(jnp.max(jnp.abs(got[0][1, 170:].astype(jnp.float32)))) == 0.0
    if dtype == jnp.float32:     # the forward is the merged product's to fp32 rounding
        np.testing.assert_allclose(adapted(x, w, a, b), merged(x, w, a, b), rtol=1e-5)
