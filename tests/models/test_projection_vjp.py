"""The projections' own backward passes (``cpu.matmul``'s product, ``decoder._low_rank`` for
LoRA, both custom JVPs whose tangents are ``cpu.linear`` maps): gradients equal autodiff of the
plain fp32 einsum (fp32: to rounding; bf16: within the bf16 rounding of the cotangent), padded
rows (``valid``) get no gradient, forward mode and ``vmap`` inside ``grad`` work, and a frozen
weight costs no product."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.cpu import linear as cpu_linear, matmul as cpu_matmul

# Shapes the matmul kernel takes (K, N multiples of 32, >= 256 rows) where it is on.
SPECS = [("BSD,DNH->BSNH", (2, 300, 64), (64, 4, 32)),   # q: output heads split
         ("BSNH,NHD->BSD", (2, 300, 4, 16), (4, 16, 64)),  # o: input heads merged
         ("BSF,FD->BSD", (2, 300, 96), (96, 64))]          # down
VALID = jnp.array([300, 170])


def _loss(y):
    # Reads only the rows VALID keeps (as the decoder's downstream does) through a nonlinearity.
    keep = (jnp.arange(300)[None] < VALID[:, None]).reshape((2, 300) + (1,) * (y.ndim - 2))
    return jnp.sum(jnp.where(keep, jnp.sin(y), 0.0))


def _rel(u, v):
    u, v = np.asarray(u, np.float32), np.asarray(v, np.float32)
    return float(np.abs(u - v).max() / np.abs(v).max())


def _operands(xs, ws, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=xs), dtype),
            jnp.asarray(rng.normal(size=ws) * 0.1, dtype))


def _reference(spec, x, w):
    return decoder._einsum(spec, x.astype(jnp.float32), w.astype(jnp.float32))


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-6), (jnp.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_projection_gradients_match_fp32_autodiff(spec, xs, ws, dtype, tol):
    x, w = _operands(xs, ws, dtype)
    got = jax.grad(lambda x, w: _loss(decoder._mm(spec, x, w, VALID)), argnums=(0, 1))(x, w)
    ref = jax.grad(lambda x, w: _loss(_reference(spec, x, w)), argnums=(0, 1))(x, w)
    assert got[0].dtype == dtype and got[1].dtype == dtype
    for g, r in zip(got, ref):
        assert _rel(g, r) < tol          # bf16: the cotangent rounded to bf16 (2^-8), summed
    # rows past valid: no gradient (the kernel's outputs there are constants)
    assert float(jnp.max(jnp.abs(got[0][1, 170:].astype(jnp.float32)))) == 0.0


@pytest.mark.parametrize("spec,xs,ws", SPECS[:1])
def test_projection_forward_mode_and_vmap_inside_grad(spec, xs, ws):
    x, w = _operands(xs, ws, jnp.float32)
    dx, dw = _operands(xs, ws, jnp.float32, seed=3)
    got = jax.jvp(lambda x, w: decoder._mm(spec, x, w, VALID), (x, w), (dx, dw))[1]
    keep = (jnp.arange(300)[None] < VALID[:, None])[..., None, None]
    ref = jax.jvp(lambda x, w: _reference(spec, x, w), (x, w), (dx, dw))[1]
    np.testing.assert_allclose(got, jnp.where(keep, ref, 0.0), rtol=2e-5, atol=2e-5)
    # the shared-prefix scorer vmaps its groups inside grad: the linear maps batch
    per_row = jax.grad(lambda w: jnp.sum(jax.vmap(
        lambda x: jnp.sin(decoder._mm(spec, x[None], w)))(x)))(w)
    ref_rows = jax.grad(lambda w: jnp.sum(jnp.sin(_reference(spec, x, w))))(w)
    assert _rel(per_row, ref_rows) < 2e-6


def test_a_frozen_weight_costs_no_product():
    # Symbolic zeros: the gradient with respect to x alone holds one dot per product in the
    # backward pass (g·wᵀ), none for the weight (xᵀ·g).
    x, w = _operands((2, 300, 64), (64, 128), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(jax.grad(lambda x: _loss(cpu_matmul.matmul(x, w, VALID))))(x)
    assert str(jaxpr).count("dot_general") <= 2


def _dots(jaxpr) -> list:
    """The dot_general equations of a jaxpr and of every jaxpr inside it."""
    out = []
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            out.append(e)
        for p in e.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out += _dots(inner)
    return out


def test_few_rows_take_xla_s_dot_with_the_mixed_precision_backward():
    """The rows the kernel does not take (the last layer's read slots) run XLA's dot, and its
    backward is the kernel path's: the cotangent rounded to bf16, then g·wᵀ with fp32
    accumulation. Plain autodiff's fp32 cotangent times the bf16 weight is a mixed dot, which
    JAX lowers with the weight converted to fp32."""
    x, w = _operands((1, 64, 64), (64, 128), jnp.bfloat16)
    project = lambda x, w: decoder._mm("BSD,DF->BSF", x, w)  # noqa: E731
    assert not cpu_matmul.supports(x.reshape(64, 64), w)  # 64 rows: not the kernel's
    jaxpr = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(jnp.sin(project(x, w)))))(x)
    dots = _dots(jaxpr.jaxpr)
    assert dots and all(len({v.aval.dtype for v in e.invars}) == 1 for e in dots), dots
    out, vjp = jax.vjp(project, x, w)
    g = jax.random.normal(jax.random.key(5), out.shape, jnp.float32)
    dx, dw = vjp(g)
    gb = g.astype(jnp.bfloat16)
    want_dx = jnp.einsum("BSF,DF->BSD", gb, w, preferred_element_type=jnp.float32)
    want_dw = jnp.einsum("BSD,BSF->DF", x, gb, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(np.asarray(dx, np.float32),
                               np.asarray(want_dx.astype(jnp.bfloat16), np.float32),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(dw, np.float32),
                               np.asarray(want_dw.astype(jnp.bfloat16), np.float32),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-6), (jnp.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_adapted_gradients_match_the_merged_weight(spec, xs, ws, dtype, tol):
    rng = np.random.default_rng(1)
    x, w = _operands(xs, ws, dtype)
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
    for name, i in (("x", 0), ("w", 1), ("a", 2), ("b", 3)):
        assert got[i].dtype == (x, w, a, b)[i].dtype, name
        assert _rel(got[i], ref[i]) < tol, name
    assert float(jnp.max(jnp.abs(got[0][1, 170:].astype(jnp.float32)))) == 0.0
    lora_only = jax.grad(adapted, argnums=(2, 3))(x, w, a, b)   # the LoRA step: W frozen
    for g, r in zip(lora_only, got[2:]):
        np.testing.assert_array_equal(g, r)
    if dtype == jnp.float32:     # the forward is the merged product's to fp32 rounding
        np.testing.assert_allclose(adapted(x, w, a, b), merged(x, w, a, b), rtol=1e-5)
        tangents = jax.tree.map(lambda t: 0.1 * jnp.ones_like(t), (x, w, a, b))
        got_t = jax.jvp(adapted, (x, w, a, b), tangents)[1]
        ref_t = jax.jvp(merged, (x, w, a, b), tangents)[1]
        np.testing.assert_allclose(got_t, ref_t, rtol=1e-4)


def test_linear_map_batches_its_inputs_and_residuals():
    # vmap of a linear map inside grad: each combination of batched linear input / residual
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    ws = jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32)

    def mapped(x, w):
        return cpu_linear.linear_map(lambda r, d: (d[0] @ r,), lambda r, g: (g[0] @ r.T,),
                                     w, (x,))[0]

    for axes, args in (((0, None), (x, ws[0])), ((0, 0), (x, ws)), ((None, 0), (x[0], ws))):
        def loss(f):
            return lambda x: jnp.sum(jnp.sin(jax.vmap(f, in_axes=axes)(x, args[1])))
        got = jax.grad(loss(mapped))(args[0])
        ref = jax.grad(loss(lambda x, w: x @ w))(args[0])
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
