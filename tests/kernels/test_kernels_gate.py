"""The LVOPD gate inside the top-k reverse-KL kernels (issue 38): rows whose gate is 0 are not
computed (compacted into a static capacity), the KL and its gradients on the gated-on rows equal
the ungated computation's in every implementation, an overflow is a named error outside jit and
NaN inside it, and the compiled gated step's temporaries shrink with the capacity."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.kernels import (fused_linear_topk_reverse_kl, gate_capacity, topk_reverse_kl,
                           weighted_kl_loss)

V, D, KT, K, N = 96, 16, 8, 4, 24


def _case(seed: int = 0, n: int = N):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n, D)).astype(np.float32)
    w = (rng.normal(size=(D, V)) * 0.7).astype(np.float32)
    t_logp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(n, V)) * 3.0), -1))
    ids = np.argsort(-t_logp, axis=-1)[:, :KT].astype(np.int32)
    lp = np.take_along_axis(t_logp, ids, axis=-1).astype(np.float32)
    gate = np.where(rng.random(n) < 0.3, rng.random(n) + 0.1, 0.0).astype(np.float32)
    mask = rng.random(n) < 0.9
    return h, w, ids, lp, gate, mask


def test_gate_capacity_rounds_the_active_count():
    g = np.array([0.0, 0.5, 0.2, 0.0, 1.0], np.float32)
    assert gate_capacity(g, multiple=1) == 3
    assert gate_capacity(g, multiple=4) == 4
    assert gate_capacity(g, multiple=64) == 5                     # never above the row count
    assert gate_capacity(g, np.array([1, 0, 1, 1, 0], bool), multiple=1) == 1
    assert gate_capacity(np.zeros(3, np.float32)) == 1
    with pytest.raises(ValueError, match="mask .* must have the gate's shape"):
        gate_capacity(g, np.ones(4, bool))


@pytest.mark.parametrize("impl", ["reference", "xla", "pallas"])
@pytest.mark.parametrize("tail", [False, True])
def test_gated_values_and_gradients_equal_the_ungated_ones(impl, tail):
    h, w, ids, lp, gate, mask = _case(1)
    cap = gate_capacity(gate, mask, multiple=4)
    active = (gate > 0) & mask
    assert 0 < active.sum() <= cap < N

    def loss(fn_gate, hh, ww):
        kl = fused_linear_topk_reverse_kl(hh, ww, ids, lp, k=K, impl=impl, tail=tail,
                                          mask=jnp.asarray(mask),
                                          **({"gate": jnp.asarray(gate), "capacity": cap}
                                             if fn_gate else {}))
        return weighted_kl_loss(kl, jnp.asarray(gate), jnp.asarray(mask))[0], kl

    (l_full, kl_full), g_full = jax.value_and_grad(lambda a, b: loss(False, a, b), (0, 1),
                                                   has_aux=True)(h, w)
    (l_gate, kl_gate), g_gate = jax.value_and_grad(lambda a, b: loss(True, a, b), (0, 1),
                                                   has_aux=True)(h, w)
    kl_full, kl_gate = np.asarray(kl_full), np.asarray(kl_gate)
    np.testing.assert_allclose(kl_gate[active], kl_full[active], rtol=1e-5, atol=1e-6)
    assert np.all(kl_gate[~active] == 0.0)
    np.testing.assert_allclose(float(l_gate), float(l_full), rtol=1e-5, atol=1e-7)
    for a, b in zip(g_gate, g_full):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    # rows with gate 0 get no gradient at all
    assert np.all(np.asarray(g_gate[0])[~active] == 0.0)
    # the logits form too
    z = h @ w
    got = np.asarray(topk_reverse_kl(z, ids, lp, k=K, impl=impl, tail=tail, mask=mask,
                                     gate=gate, capacity=cap))
    want = np.asarray(topk_reverse_kl(z, ids, lp, k=K, impl=impl, tail=tail, mask=mask))
    np.testing.assert_allclose(got[active], want[active], rtol=1e-5, atol=1e-6)
    assert np.all(got[~active] == 0.0)


def test_overflow_is_an_error_outside_jit_and_nan_inside():
    h, w, ids, lp, gate, mask = _case(2)
    active = int(((gate > 0) & mask).sum())
    assert active >= 2
    with pytest.raises(ValueError, match=f"{active} gated-on rows exceed capacity {active - 1}"):
        fused_linear_topk_reverse_kl(h, w, ids, lp, k=K, impl="xla", mask=mask, gate=gate,
                                     capacity=active - 1)
    kl = np.asarray(jax.jit(lambda g: fused_linear_topk_reverse_kl(
        h, w, ids, lp, k=K, impl="xla", mask=mask, gate=g, capacity=active - 1))(gate))
    on = (gate > 0) & mask
    assert np.isnan(kl[on]).sum() == 1 and not np.isnan(kl[~on]).any()
    with pytest.raises(ValueError, match="capacity is given without a gate"):
        fused_linear_topk_reverse_kl(h, w, ids, lp, k=K, capacity=4)
    with pytest.raises(ValueError, match=r"needs a static int capacity in \[1, 24\]"):
        fused_linear_topk_reverse_kl(h, w, ids, lp, k=K, gate=gate)
    with pytest.raises(ValueError, match=r"gate must have shape \(24,\)"):
        topk_reverse_kl(h @ w, ids, lp, k=K, gate=gate[:5], capacity=4)
    with pytest.raises(ValueError, match="gate must be finite"):
        topk_reverse_kl(h @ w, ids, lp, k=K, gate=np.full(N, np.nan, np.float32), capacity=4)


def test_gated_step_temporaries_shrink_with_the_capacity():
    """The compiled gradient of the gated fused head at a quarter of the rows needs well under
    the ungated program's temporaries (the [rows, block_v] logit blocks and [rows, k] stats)."""
    n, d, v = 1024, 64, 4096
    rng = np.random.default_rng(3)
    h = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))
    w = jnp.asarray((rng.normal(size=(d, v)) * 0.3).astype(np.float32))
    ids = jnp.asarray(np.tile(np.arange(KT, dtype=np.int32), (n, 1)))
    lp = jnp.full((n, KT), np.log(0.1), jnp.float32)
    gate = jnp.asarray((np.arange(n) % 4 == 0).astype(np.float32))

    def temp_bytes(**kw):
        def f(hh):
            kl = fused_linear_topk_reverse_kl(hh, w, ids, lp, k=16, impl="xla", **kw)
            return weighted_kl_loss(kl, gate)[0]
        return jax.jit(jax.grad(f)).lower(h).compile().memory_analysis().temp_size_in_bytes

    full = temp_bytes()
    gated = temp_bytes(gate=gate, capacity=gate_capacity(np.asarray(gate)))
    assert gated < 0.5 * full, (gated, full)
