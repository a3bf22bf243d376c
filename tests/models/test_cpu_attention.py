"""The fused CPU attention kernel (jaxdm.models.cpu.attention): numbers against the XLA
attention at the readout's shapes, where it is used, vmap, derivatives, and how it is off."""
import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.cpu import attention as cpu_attention
from tests.models.helpers_models import require_cpu_attention


@pytest.fixture(scope="module")
def kernel_on():
    require_cpu_attention()


# The kernel on CPU whatever the operands (decoder.attend picks it only where it pays).
fused = cpu_attention.make_attend(decoder.xla_attend)


def _operands(dtype, b=2, s=37, kh=3, g=3, hd=64, seed=0):
    """A shared cache (Bk = 1, T = 83: not a multiple of 16) and each row's own keys, random
    masks with whole 16-key blocks masked for some rows, one fully masked row."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, s, kh, g, hd)), dtype)
    kc, vc = (jnp.asarray(rng.normal(size=(1, 83, kh, hd)), dtype) for _ in range(2))
    kn, vn = (jnp.asarray(rng.normal(size=(b, s, kh, hd)), dtype) for _ in range(2))
    cache_mask = rng.random((b, s, 83)) < 0.6
    cache_mask[:, ::3, 16:48] = False
    own_mask = np.tril(np.ones((s, s), bool))[None].repeat(b, 0)
    cache_mask[b - 1, s // 2], own_mask[b - 1, s // 2] = False, False
    return q, [(kc, vc, jnp.asarray(cache_mask)), (kn, vn, jnp.asarray(own_mask))]


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-6), ("bfloat16", 1.6e-2)])
# bf16 with >= 16 query vectors: AMX tiles or AVX-512 BF16 pairs where the CPU has them, in
# groups of 16 vectors (s = 9, 6: a last group of 11 / 2); s = 1: FMAs
@pytest.mark.parametrize("s", [37, 9, 6, 1])
def test_kernel_matches_xla_attention(kernel_on, dtype, tol, s):
    q, sources = _operands(jnp.dtype(dtype), s=s)
    got = jax.jit(fused)(q, sources)
    want = jax.jit(decoder.xla_attend)(q, sources)
    assert got.dtype == want.dtype == jnp.dtype(dtype) and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=tol, rtol=tol)


def test_kernel_is_the_compiled_attention_and_vmaps(kernel_on):
    def uses_kernel(fn, q, sources):
        return cpu_attention.TARGET in jax.jit(fn).lower(q, sources).as_text()

    q, sources = _operands(jnp.float32, b=2, s=20)
    assert uses_kernel(decoder.attend, q, sources)
    assert not uses_kernel(decoder.xla_attend, q, sources)
    # decoder.attend's policy: XLA for a decoding step (S * G = 3 query vectors per head) and
    # for bf16 against a cache shared by several rows
    assert not uses_kernel(decoder.attend, *_operands(jnp.float32, s=1))
    assert not uses_kernel(decoder.attend, *_operands(jnp.bfloat16, s=20))
    (kc, vc, mc), own = _operands(jnp.bfloat16, s=20)[1]
    per_row = [(jnp.repeat(kc, 2, 0), jnp.repeat(vc, 2, 0), mc), own]
    assert uses_kernel(decoder.attend, q.astype(jnp.bfloat16), per_row)
    # vmap over an extra leading axis (the shared_prefix groups): each slice on its own
    qs = jnp.stack([q, q[::-1]])
    srcs = [(jnp.stack([k, k]), jnp.stack([v, v]), jnp.stack([m, m[::-1]]))
            for k, v, m in sources]
    batched = jax.jit(jax.vmap(fused))(qs, srcs)
    for i in range(2):
        one = fused(qs[i], [(k[i], v[i], m[i]) for k, v, m in srcs])
        np.testing.assert_allclose(batched[i], one, atol=1e-6)


def test_derivatives_are_the_xla_attention_s(kernel_on):
    q, sources = _operands(jnp.float32, b=1, s=9)
    (kc, vc, mc), (kn, vn, mn) = sources

    def f(fn, q, kc, vn):
        return fn(q, [(kc, vc, mc), (kn, vn, mn)])

    tangents = tuple(jnp.ones_like(x) * 0.1 for x in (q, kc, vn))
    p1, t1 = jax.jvp(lambda *a: f(decoder.attend, *a), (q, kc, vn), tangents)
    p2, t2 = jax.jvp(lambda *a: f(decoder.xla_attend, *a), (q, kc, vn), tangents)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_allclose(p1, p2, atol=2e-6)
    g1 = jax.grad(lambda *a: jnp.sum(f(decoder.attend, *a) ** 2), argnums=(0, 1, 2))(q, kc, vn)
    g2 = jax.grad(lambda *a: jnp.sum(f(decoder.xla_attend, *a) ** 2), argnums=(0, 1, 2))(
        q, kc, vn)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)


def test_supports_only_what_the_kernel_takes():
    q, sources = _operands(jnp.float32, b=2, s=8)
    assert cpu_attention.supports(q, sources)
    assert not cpu_attention.supports(q[:, :5], [(k, v, m[:, :5]) for k, v, m in sources])
    assert not cpu_attention.supports(q.astype(jnp.float16), sources)  # dtype
    assert not cpu_attention.supports(q[..., :48], [(k[..., :48], v[..., :48], m)
                                                    for k, v, m in sources])  # head dim 48
    (kc, vc, mc), own = sources
    assert not cpu_attention.supports(q, [(kc.astype(jnp.bfloat16), vc, mc), own])
    assert not cpu_attention.supports(q, [(kc, vc, mc[:1]), own])  # mask not [B, S, T]


def _segment_rows(b=2, seed=0):
    """Rows of a context and continuations (decoder.forward_trunk_suffixes' layout): row 0 a
    100-token context padded to 112, continuations of 7 / 20 / 9 tokens seeing 30 / 100 / 64
    of it, then 5 padding slots; row 1 the same with shifted visibilities and a continuation
    that sees no context. Returns slot, seg, sees [B, S] (int32) and which slots are real."""
    t, rows = 112, []
    for r in range(b):
        seg, sees = [0] * 100 + [-1] * 12, list(range(1, 101)) + [0] * 12
        for i, (vis, n) in enumerate([(30 - 30 * r, 7), (100 - r, 20), (64 + r, 9)], 1):
            seg += [i] * n
            sees += [vis] * n
        rows.append((seg + [-1] * 5, sees + [0] * 5))
    seg = jnp.asarray([r[0] for r in rows], jnp.int32)
    sees = jnp.asarray([r[1] for r in rows], jnp.int32)
    slot = jnp.broadcast_to(jnp.arange(seg.shape[1], dtype=jnp.int32), seg.shape)
    return t, slot, seg, sees, np.asarray(seg) >= 0


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-6), ("bfloat16", 1.6e-2)])
def test_segment_kernel_matches_xla_on_every_real_query(kernel_on, dtype, tol):
    """One call of the segment-rule kernel = XLA's attention under the dense mask of the rule,
    for whole rows and for some slots read out of them (the last layer's queries)."""
    t, slot, seg, sees, real = _segment_rows()
    b, s = seg.shape
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(b, s, 3, 3, 64)), dtype)
    k, v = (jnp.asarray(rng.normal(size=(b, s, 3, 64)), dtype) for _ in range(2))
    kernel = cpu_attention.make_attend_segments(
        functools.partial(decoder._segment_attention_xla, plan=None))
    got = jax.jit(kernel)(q, k, v, slot, seg, sees, seg, sees)  # the last: the reference's need
    mask = decoder.segment_mask(slot, seg, sees, seg, 0, s, 0, s)
    want = jax.jit(decoder.xla_attend)(q, [(k, v, mask)])
    assert got.dtype == want.dtype and got.shape == want.shape == (b, s, 9, 64)
    np.testing.assert_allclose(np.asarray(got, np.float32)[real],
                               np.asarray(want, np.float32)[real], atol=tol, rtol=tol)
    # through decoder.attend_segments with the XLA path's plan as the reference
    plan = decoder.trunk_suffix_plan(s, t, 32, 32, 4)
    assert cpu_attention.SEGMENTS_KERNEL.target in jax.jit(
        lambda *a: decoder.attend_segments(*a, plan=plan)).lower(
            q, k, v, slot, seg, sees, seg).as_text()
    np.testing.assert_allclose(
        np.asarray(decoder.attend_segments(q, k, v, slot, seg, sees, seg, plan=plan),
                   np.float32)[real], np.asarray(want, np.float32)[real], atol=tol, rtol=tol)
    # queries at some slots only (repeats, context and continuation slots) against all keys
    read = jnp.asarray([[130, 3, 99, 130, 140, 112] * 3, [0, 119, 124, 125, 111, 50] * 3],
                       jnp.int32)
    at = lambda a: jnp.take_along_axis(a, read, axis=1)  # noqa: E731
    q_read = jnp.take_along_axis(q, read[:, :, None, None, None], axis=1)
    got = kernel(q_read, k, v, read, at(seg), at(sees), seg, at(sees))
    real_read = np.take_along_axis(real, np.asarray(read), axis=1)
    np.testing.assert_allclose(np.asarray(got, np.float32)[real_read],
                               np.asarray(want, np.float32)[np.arange(b)[:, None], read][
                                   real_read], atol=tol, rtol=tol)


def test_segment_kernel_derivatives_and_what_it_takes(kernel_on):
    t, slot, seg, sees, real = _segment_rows(b=1)
    s = seg.shape[1]
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.normal(size=(1, s, 3, 3, 64)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(1, s, 3, 64)), jnp.float32) for _ in range(2))
    plan = decoder.trunk_suffix_plan(s, t, 32, 32, 4)
    ref = functools.partial(decoder._segment_attention_xla, plan=plan)

    def loss(fn, q, k, v):
        return jnp.sum(jnp.where(real[..., None, None], fn(q, k, v, slot, seg, sees, seg, sees), 0) ** 2)

    kernel = cpu_attention.make_attend_segments(ref)
    for g1, g2 in zip(jax.grad(functools.partial(loss, kernel), argnums=(0, 1, 2))(q, k, v),
                      jax.grad(functools.partial(loss, ref), argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_array_equal(g1, g2)
    assert cpu_attention.supports_segments(q, k, v)
    assert not cpu_attention.supports_segments(q[:, :5], k, v)         # 15 query vectors
    assert not cpu_attention.supports_segments(q, k[:, :, :1], v[:, :, :1])  # K heads differ
    assert not cpu_attention.supports_segments(q, k.astype(jnp.bfloat16), v)
    assert not cpu_attention.supports_segments(jnp.concatenate([q, q]), k, v)  # key rows != B
    with pytest.raises(Exception, match="kseg must be int32"):
        cpu_attention._segments_kernel(q, k, v, slot, seg, sees, seg[:, :-1]).block_until_ready()


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


_PROBE = """
    import warnings
    warnings.simplefilter("always")
    import jax, jax.numpy as jnp
    from jaxdm.models import decoder
    from jaxdm.models.cpu import attention as cpu_attention
    q = jnp.ones((1, 8, 1, 2, 64)); k = jnp.ones((1, 8, 1, 64))
    m = jnp.ones((1, 8, 8), bool)
    hlo = jax.jit(decoder.attend).lower(q, [(k, k, m)]).as_text()
    print("STATUS", cpu_attention.status(), cpu_attention.TARGET in hlo,
          float(decoder.attend(q, [(k, k, m)]).sum()))
"""


def test_env_var_turns_it_off():
    proc = _run(_PROBE, JAXDM_CPU_ATTENTION="off")
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATUS"))
    assert "(False, 'off: JAXDM_CPU_ATTENTION=off') False 1024.0" in line


def test_a_bad_env_value_is_an_error():
    proc = _run(_PROBE, JAXDM_CPU_ATTENTION="maybe")
    assert proc.returncode != 0
    assert "JAXDM_CPU_ATTENTION='maybe': expected one of" in proc.stderr


def test_a_failed_build_warns_and_falls_back_to_xla(tmp_path, kernel_on):
    fake = tmp_path / "broken-cxx"
    fake.write_text("#!/bin/sh\necho 'broken-cxx: cannot compile' >&2\nexit 3\n")
    fake.chmod(0o755)
    proc = _run(_PROBE, CXX=str(fake), JAXDM_CACHE=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATUS"))
    assert "(False, 'off: " in line and "failed (exit 3)" in line and line.endswith(
        "False 1024.0")
    assert "fused CPU attention kernel is off" in proc.stderr
    assert "broken-cxx: cannot compile" in proc.stderr
    assert not list((tmp_path / "cache" / "kernels").glob("*.so"))  # nothing half-built kept
