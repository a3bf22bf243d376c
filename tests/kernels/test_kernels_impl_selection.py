"""impl="auto": the top-k reverse-KL implementation is picked by backend (Pallas on GPU/TPU,
chunked XLA on CPU), for the public functions and the LVOPD loss head."""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.kernels import AUTO_IMPL, fused_linear_topk_reverse_kl, resolve_impl, topk_reverse_kl

trk = importlib.import_module("jaxdm.kernels.topk_reverse_kl")


@pytest.mark.parametrize("backend, expected", [("cpu", "xla"), ("gpu", "pallas"),
                                               ("cuda", "pallas"), ("rocm", "pallas"),
                                               ("tpu", "pallas"), ("metal", "xla")])
def test_auto_resolves_by_patched_backend(monkeypatch, backend, expected):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert resolve_impl("auto") == expected
    assert resolve_impl("auto", backend) == expected


def test_explicit_impls_pass_through_and_bad_names_are_rejected(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for impl in ("reference", "xla", "pallas"):
        assert resolve_impl(impl) == impl
    with pytest.raises(ValueError, match="impl must be one of"):
        resolve_impl("triton")
    assert set(AUTO_IMPL.values()) <= {"xla", "pallas"}
    assert resolve_impl("auto", "cpu") == "xla"


def _inputs(t=3, v=64, d=8, kt=6):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(t, v)), jnp.float32)
    hidden = jnp.asarray(rng.normal(size=(t, d)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    ids = jnp.asarray(np.stack([rng.choice(v, kt, replace=False) for _ in range(t)]), jnp.int32)
    lps = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(t, kt)), jnp.float32)) - 0.5
    return logits, hidden, head, ids, lps


@pytest.mark.parametrize("backend, expected", [("cpu", "xla"), ("gpu", "pallas"),
                                               ("tpu", "pallas")])
def test_public_functions_dispatch_the_resolved_impl(monkeypatch, backend, expected):
    """The compiled programs receive the backend's implementation (spied: a patched backend
    cannot compile Pallas on this CPU)."""
    seen = []

    def spy(rows_in, lm_head, *args, **kwargs):
        seen.append(("logits" if lm_head is None else "fused", kwargs["impl"]))
        return jnp.zeros(rows_in.shape[:-1], jnp.float32)

    # both public functions share the one compiled program; lm_head tells them apart
    monkeypatch.setattr(trk, "_topk_reverse_kl_jit", spy)
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    logits, hidden, head, ids, lps = _inputs()
    topk_reverse_kl(logits, ids, lps, k=4)
    fused_linear_topk_reverse_kl(hidden, head, ids, lps, k=4)
    topk_reverse_kl(logits, ids, lps, k=4, impl="reference")
    assert seen == [("logits", expected), ("fused", expected), ("logits", "reference")]


def test_auto_on_this_cpu_equals_the_xla_path():
    assert jax.default_backend() == "cpu"
    logits, hidden, head, ids, lps = _inputs()
    np.testing.assert_array_equal(topk_reverse_kl(logits, ids, lps, k=4),
                                  topk_reverse_kl(logits, ids, lps, k=4, impl="xla"))
    np.testing.assert_allclose(topk_reverse_kl(logits, ids, lps, k=4),
                               topk_reverse_kl(logits, ids, lps, k=4, impl="reference"),
                               rtol=1e-5, atol=1e-6)
