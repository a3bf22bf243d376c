"""The matmul kernel (jaxdm.models.cpu.matmul), bf16 and fp32: numbers against XLA's dot and
exact products, where the decoder uses it, vmap, derivatives, and how it is off."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.cpu import build as cpu_build, dispatch as cpu_dispatch, matmul as cpu_matmul


def _require(dtype):
    on, why = cpu_matmul.status(dtype)
    if not on:
        if cpu_matmul.cannot_run_here(why):
            pytest.skip(f"{jnp.dtype(dtype).name} matmul {why}")
        pytest.fail(f"{jnp.dtype(dtype).name} matmul {why}")


@pytest.fixture(scope="module")
def kernel_on():
    _require(jnp.bfloat16)


@pytest.fixture(scope="module")
def f32_kernel_on():
    _require(jnp.float32)


def _operands(m, k, n, seed=0, lead=(), dtype=jnp.bfloat16):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(*lead, m, k)), dtype)
    w = jnp.asarray(rng.normal(size=(k, n)) / np.sqrt(k), dtype)
    return x, w


def _exact(x, w):
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


# rows not a multiple of 32 (the last strip through the tail buffer), one strip, many strips;
# N = 32 (one block: one thread's range), K = 32 (one tile step) and the decoder's shapes
@pytest.mark.parametrize("m,k,n", [(64, 32, 32), (97, 64, 96), (300, 576, 192),
                                   (1000, 1536, 576)])
def test_kernel_matches_exact_products(kernel_on, m, k, n):
    x, w = _operands(m, k, n)
    got = jax.jit(cpu_matmul.matmul)(x, w)
    xla = jax.jit(cpu_matmul.reference)(x, w)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    exact = _exact(x, w)
    # bf16 products are exact in fp32; only the fp32 summation order differs from XLA's
    scale = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
    assert np.all(np.abs(np.asarray(got) - exact) <= 1e-6 * scale + 1e-7)
    np.testing.assert_allclose(got, xla, rtol=1e-5, atol=1e-5 * float(scale.max()))


# one row (a decoding step: w read in place), a partial 6-row block, rows past the size
# from which w is packed, K = 32, and the decoder's shapes
@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (97, 32, 96), (700, 576, 192),
                                   (1000, 1536, 576), (5, 576, 1536)])
def test_fp32_kernel_matches_exact_products(f32_kernel_on, m, k, n):
    x, w = _operands(m, k, n, seed=1, dtype=jnp.float32)
    hlo = jax.jit(cpu_matmul.matmul).lower(x, w).as_text()
    assert cpu_build.MATMUL_F32.target in hlo
    got = jax.jit(cpu_matmul.matmul)(x, w)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    # fp32 products and sums round: within k units of fp32 rounding of sum |x| |w| (the
    # standard bound for a dot product), like XLA's (in another order)
    scale = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
    bound = k * 2.0 ** -24 * scale
    assert np.all(np.abs(np.asarray(got, np.float64) - _exact(x, w)) <= bound)
    xla = np.asarray(jax.jit(cpu_matmul.reference)(x, w), np.float64)
    assert np.all(np.abs(xla - _exact(x, w)) <= bound)
    assert np.median(np.abs(np.asarray(got) - xla) / scale) < 1e-7


def test_the_kernel_is_what_runs_and_vmaps(kernel_on):
    x, w = _operands(80, 64, 64, lead=(3,))
    hlo = jax.jit(cpu_matmul.matmul).lower(x, w).as_text()
    assert cpu_matmul.TARGET in hlo
    np.testing.assert_allclose(jax.jit(cpu_matmul.matmul)(x, w), _exact(x, w), rtol=1e-5,
                               atol=1e-4)
    # vmap over x: the batch is more rows for one kernel call (no loop)
    batched = jax.jit(jax.vmap(cpu_matmul.matmul, in_axes=(0, None)))
    assert batched.lower(x, w).as_text().count(cpu_matmul.TARGET) == 1
    np.testing.assert_allclose(batched(x, w), _exact(x, w), rtol=1e-5, atol=1e-4)
    # vmap over both: one weight per slice (XLA's batched dot)
    ws = jnp.stack([w, -w, 2 * w])
    both = jax.jit(jax.vmap(cpu_matmul.matmul))(x, ws)
    for i in range(3):
        np.testing.assert_allclose(both[i], _exact(x[i], ws[i]), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_layer_reads_each_layer_of_the_stack_in_place(dtype):
    _require(dtype)
    rng = np.random.default_rng(3)
    rows = max(300, cpu_matmul.MIN_ROWS[jnp.dtype(dtype)])
    x = jnp.asarray(rng.normal(size=(2, rows // 2, 64)), dtype)
    stack = jnp.asarray(rng.normal(size=(3, 64, 96)) / 8, dtype)
    f = jax.jit(cpu_matmul.matmul_layer)
    assert cpu_matmul.KERNELS[jnp.dtype(dtype)].target in f.lower(x, stack, 0).as_text()
    operands = [stack]
    if dtype == jnp.bfloat16:  # a bf16 stack's uint16 bits (cpu.scan.BitView) read the same
        operands.append(jax.lax.bitcast_convert_type(stack, jnp.uint16))
    for w in operands:
        for i in range(3):
            got = f(x, w, jnp.int32(i))
            # the layer alone through matmul: the same kernel on the same numbers
            np.testing.assert_array_equal(got, jax.jit(cpu_matmul.matmul)(x, stack[i]))
            np.testing.assert_allclose(got, jax.jit(cpu_matmul.reference_layer)(x, w, i),
                                       rtol=1e-5, atol=1e-4)
    # a layer index outside the stack is the kernel's error, naming it
    with pytest.raises(Exception, match="layer index 3 is outside w's stack of 3"):
        jax.block_until_ready(f(x, stack, jnp.int32(3)))
    with pytest.raises(TypeError, match="integer scalar"):
        cpu_matmul.matmul_layer(x, stack, jnp.zeros(2, jnp.int32))
    # derivatives are XLA's (forward and reverse; the layer index has none)
    h = lambda fn: lambda x, w: jnp.sum(jnp.sin(fn(x, w, 1)))  # noqa: E731
    for a, b in zip(jax.grad(h(cpu_matmul.matmul_layer), argnums=(0, 1))(x, stack),
                    jax.grad(h(cpu_matmul.reference_layer), argnums=(0, 1))(x, stack)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=2e-2, atol=2e-2)
    # vmap over x: more rows for the one call; over the index: XLA's batched dot
    vx = jax.jit(jax.vmap(cpu_matmul.matmul_layer, in_axes=(0, None, None)))
    np.testing.assert_array_equal(vx(x, stack, 2), f(x, stack, 2))
    vi = jax.jit(jax.vmap(cpu_matmul.matmul_layer, in_axes=(None, None, 0)))(
        x, stack, jnp.arange(3))
    for i in range(3):
        np.testing.assert_allclose(vi[i], f(x, stack, i), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_valid_rows_are_computed_and_the_rest_are_zeros(dtype):
    _require(dtype)
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(3, 130, 64)), dtype)  # 390 rows: 3 groups of 130
    w = jnp.asarray(rng.normal(size=(64, 96)) / 8, dtype)
    valid = jnp.array([130, 7, 0], jnp.int32)  # whole, a partial 6-row block, none
    f = jax.jit(cpu_matmul.matmul)
    got = np.asarray(f(x, w, valid))
    full = np.asarray(f(x, w))
    for b, n in enumerate([130, 7, 0]):
        np.testing.assert_array_equal(got[b, :n], full[b, :n])  # the same kernel's rows
        assert not got[b, n:].any()
    np.testing.assert_allclose(got, jax.jit(cpu_matmul.reference)(x, w, valid), rtol=1e-5,
                               atol=1e-4)
    # the layer form takes it too
    np.testing.assert_array_equal(jax.jit(cpu_matmul.matmul_layer)(x, w[None], 0, valid), got)
    # a count outside [0, rows per group] or groups that do not divide the rows: named errors
    with pytest.raises(Exception, match=r"valid\[1\] = 131 is outside \[0, 130\]"):
        jax.block_until_ready(f(x, w, jnp.array([1, 131, 0], jnp.int32)))
    with pytest.raises(ValueError, match="valid must be \\[B\\]"):
        cpu_matmul.matmul(x, w, jnp.array([1, 2], jnp.int32))
    with pytest.raises(TypeError, match="valid must hold integers"):
        cpu_matmul.matmul(x, w, jnp.array([1.0, 2.0, 3.0]))


def test_derivatives_are_xla_s(kernel_on):
    x, w = _operands(64, 64, 32)
    f = lambda x, w: jnp.sum(jnp.sin(cpu_matmul.matmul(x, w)))  # noqa: E731
    g = lambda x, w: jnp.sum(jnp.sin(cpu_matmul.reference(x, w)))  # noqa: E731
    for a, b in zip(jax.grad(f, argnums=(0, 1))(x, w), jax.grad(g, argnums=(0, 1))(x, w)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("r,n,h", [(96, 64, 64), (768, 416, 64), (100, 64, 64), (96, 70, 64)])
def test_contract_rows_is_the_transposed_product(dtype, r, n, h):
    # aᵀ·b summed over rows: on the kernel as (bᵀ·a)ᵀ where R and N are multiples of 32
    # (the first two shapes), XLA's einsum otherwise; both the exact product to rounding
    rng = np.random.default_rng(5)
    a = jnp.asarray(rng.normal(size=(r, n)), dtype)
    b = jnp.asarray(rng.normal(size=(r, h)) / np.sqrt(r), dtype)
    got = jax.jit(cpu_matmul.contract_rows)(a, b)
    assert got.shape == (n, h) and got.dtype == jnp.float32
    exact = np.asarray(a, np.float64).T @ np.asarray(b, np.float64)
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4)
    if r % 32 == 0 and n % 32 == 0 and cpu_matmul.enabled(dtype):
        text = jax.jit(cpu_matmul.contract_rows).lower(a, b).as_text()
        assert "custom_call" in text          # the kernel ran, not XLA's slow form
    with pytest.raises(ValueError, match="contract_rows takes"):
        cpu_matmul.contract_rows(a, b[:-1])


def test_supports_only_what_the_kernel_takes():
    rows = cpu_matmul.MIN_ROWS[jnp.dtype(jnp.bfloat16)]
    x, w = _operands(rows, 64, 64)
    assert cpu_matmul.supports(x, w)
    assert cpu_matmul.supports(x[:1].astype(jnp.float32), w.astype(jnp.float32))  # fp32
    assert not cpu_matmul.supports(x.astype(jnp.float32), w)  # mixed dtypes
    assert not cpu_matmul.supports(x.astype(jnp.float16), w.astype(jnp.float16))  # dtype
    assert not cpu_matmul.supports(x[: rows - 1], w)  # few rows (bf16)
    assert not cpu_matmul.supports(x[:, :48], w[:48])  # K not a multiple of 32
    assert not cpu_matmul.supports(x, w[:, :48])  # N not a multiple of 32
    assert not cpu_matmul.supports(x, w[None])  # a weight of rank 3
    with pytest.raises(ValueError, match="no kernel for float16 operands"):
        cpu_matmul.status(jnp.float16)
    if jax.default_backend() == "cpu":  # the kernel's own check (elsewhere XLA's dot runs)
        with pytest.raises(TypeError, match="got x float32 and w bfloat16"):
            jax.jit(cpu_matmul.matmul)(x.astype(jnp.float32), w)


def _tiny(dtype):
    return ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16, dtype=dtype)


def test_the_decoder_s_bf16_projections_run_on_it(kernel_on):
    cfg = _tiny("bfloat16")
    params = decoder.init_params(cfg, jax.random.key(0))
    s = cpu_matmul.MIN_ROWS[jnp.dtype(jnp.bfloat16)] // 2  # 2 x s rows: enough for the kernel
    tokens = jax.random.randint(jax.random.key(1), (2, s), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(s), (2, s))
    hlo = jax.jit(lambda p, t, q: decoder.forward(p, cfg, t, q)).lower(
        params, tokens, positions).as_text()
    # q, k, v, o, gate, up, down in the layer scan's body
    assert hlo.count(cpu_matmul.TARGET) == 7
    got = decoder.forward(params, cfg, tokens, positions)
    f32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    want = decoder.forward(f32, _tiny("float32"), tokens, positions)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=0.1)


def test_the_decoder_s_fp32_projections_run_on_it(f32_kernel_on, monkeypatch):
    cfg = _tiny("float32")
    params = decoder.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
    run = lambda p, t, q: decoder.forward(p, cfg, t, q)  # noqa: E731
    hlo = jax.jit(run).lower(params, tokens, positions).as_text()
    assert hlo.count(cpu_build.MATMUL_F32.target) == 7
    got = np.asarray(jax.jit(run)(params, tokens, positions))
    # the same forward on XLA's dots (a fresh trace: the kernel's switch is read when tracing)
    monkeypatch.setattr(cpu_matmul, "enabled", lambda dtype=None: False)
    jax.clear_caches()
    assert cpu_build.MATMUL_F32.target not in jax.jit(run).lower(
        params, tokens, positions).as_text()
    want = np.asarray(jax.jit(run)(params, tokens, positions))
    jax.clear_caches()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_as_matmul_reads_the_decoder_s_specs():
    x, w = (2, 3, 8), (8, 4, 5)
    assert cpu_dispatch.as_matmul("BSD,DNH->BSNH", x, w) == ((2, 3, 8), (8, 20), (2, 3, 4, 5))
    assert cpu_dispatch.as_matmul("BSNH,NHD->BSD", (2, 3, 4, 5), (4, 5, 8)) == (
        (2, 3, 20), (20, 8), (2, 3, 8))
    assert cpu_dispatch.as_matmul("BSD,VD->BSV", x, (9, 8)) is None  # w transposed
    assert cpu_dispatch.as_matmul("BSD,DF->BFS", x, (8, 6)) is None  # reordered out


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


_PROBE = """
    import jax, jax.numpy as jnp
    from jaxdm.models import decoder
    from jaxdm.models.cpu import matmul as cpu_matmul
    x = jnp.ones((256, 32), jnp.bfloat16); w = jnp.ones((32, 32), jnp.bfloat16)
    hlo = jax.jit(lambda x, w: decoder._mm("MK,KN->MN", x, w)).lower(x, w).as_text()
    print("STATUS", cpu_matmul.status(), cpu_matmul.TARGET in hlo,
          float(decoder._mm("MK,KN->MN", x, w).sum()))
    x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    hlo = jax.jit(lambda x, w: decoder._mm("MK,KN->MN", x, w)).lower(x, w).as_text()
    print("F32", cpu_matmul.status(jnp.float32), "jaxdm_cpu_matmul" in hlo)
"""


def test_env_var_turns_it_off():
    proc = _run(_PROBE, JAXDM_CPU_MATMUL="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATUS"))
    assert line == "STATUS (False, 'off: JAXDM_CPU_MATMUL=0') False 262144.0"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("F32"))
    assert line == "F32 (False, 'off: JAXDM_CPU_MATMUL=0') False"


def test_a_bad_env_value_is_an_error():
    proc = _run(_PROBE, JAXDM_CPU_MATMUL="fast")
    assert proc.returncode != 0
    assert "JAXDM_CPU_MATMUL='fast': expected one of" in proc.stderr


def test_fingerprint_names_every_kernel():
    fp = cpu_build.fingerprint()
    assert fp.startswith("cpu_attention:") and ",cpu_matmul:" in fp and ",cpu_matmul_f32:" in fp


_BF16_PATHS = """
    import numpy as np, jax, jax.numpy as jnp
    from jaxdm.models import decoder
    from jaxdm.models.cpu import attention as cpu_attention, matmul as cpu_matmul
    from tests.models.test_cpu_attention import _operands
    print("ON", cpu_matmul.enabled(), cpu_attention.enabled())
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(301, 576)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(576, 96)) / 24, jnp.bfloat16)
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    scale = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64))
    got = np.asarray(jax.jit(cpu_matmul.matmul)(x, w))
    print("MATMUL", bool(np.all(np.abs(got - exact) <= 1e-6 * scale + 1e-7)))
    q, sources = _operands(jnp.bfloat16, s=37)
    fused = cpu_attention.make_attend(decoder.xla_attend)
    a = np.asarray(jax.jit(fused)(q, sources), np.float32)
    b = np.asarray(jax.jit(decoder.xla_attend)(q, sources), np.float32)
    print("ATTEND", float(np.max(np.abs(a - b))))
"""


def test_amx_off_runs_the_avx512_bf16_paths(kernel_on):
    # JAXDM_CPU_AMX=0: on an AMX CPU both kernels take the paths CPUs without AMX run (on
    # others it changes nothing); the numbers hold either way
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = _run(_BF16_PATHS, JAXDM_CPU_AMX="0", PYTHONPATH=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if " " in ln)
    assert out["ON"] == "True True" and out["MATMUL"] == "True"
    assert float(out["ATTEND"]) < 1.6e-2
    bad = _run(_PROBE, JAXDM_CPU_AMX="tiles")
    assert bad.returncode != 0 and "JAXDM_CPU_AMX='tiles': expected one of" in bad.stderr
