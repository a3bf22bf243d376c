"""cpu_scan.scan_layers: bf16 weights cross the layer loop as bit patterns (no fp32 copy of the
weight stack in the compiled program), with the same numbers and derivatives as lax.scan."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.cpu import scan as cpu_scan
from jaxdm.models import lora

CONFIG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0,
                     rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=256)


@pytest.fixture(autouse=True)
def _fresh_traces():
    yield
    jax.clear_caches()  # traces made with a swapped scan_layers (_plain_scan) go with the test


def _inputs(dtype):
    params = decoder.init_params(CONFIG, jax.random.key(0), dtype=dtype)
    tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, CONFIG.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(24), (2, 24))
    return params, tokens, positions


def _plain_scan(monkeypatch):
    """cpu_scan.scan_layers replaced by the plain lax.scan it stands for (the jitted entry
    points' traces cleared, so that they trace again with it)."""
    monkeypatch.setattr(cpu_scan, "scan_layers",
                        lambda layer, x, xs: jax.lax.scan(layer, x, cpu_scan.unmark_whole(xs),
                                                          unroll=cpu_scan.SCAN_UNROLL))
    jax.clear_caches()


def _hidden(params, tokens, positions):
    return decoder.forward(params, CONFIG, tokens, positions)


def _jit_hidden():
    return jax.jit(lambda *args: _hidden(*args))  # a new function: traced afresh


def test_bits_scan_keeps_the_numbers_and_drops_the_fp32_weight_copy(monkeypatch):
    dtype = jnp.bfloat16
    params, tokens, positions = _inputs(dtype)
    fast = _jit_hidden()
    out = fast(params, tokens, positions)
    text = fast.lower(params, tokens, positions).compile().as_text()
    # a stacked [L, ...] weight converted to fp32 is what the bit patterns avoid
    assert not re.search(rf"f32\[{CONFIG.num_layers},{CONFIG.hidden_size},", text)
    _plain_scan(monkeypatch)
    plain = _jit_hidden()
    ref = plain(params, tokens, positions)
    assert out.dtype == ref.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    # the plain scan is what XLA:CPU upcasts (the reason scan_layers exists); if a future XLA
    # stops doing it, this line says the workaround can go
    text = plain.lower(params, tokens, positions).compile().as_text()
    if jax.default_backend() == "cpu":
        assert re.search(rf"f32\[{CONFIG.num_layers},{CONFIG.hidden_size},", text)


def test_cache_outputs_keep_their_dtype_and_values(monkeypatch):
    params, tokens, positions = _inputs(jnp.bfloat16)
    lengths = jnp.array([24, 17])
    cache_mask = jnp.broadcast_to(jnp.arange(32) < lengths[:, None, None], (2, 5, 32))

    def run(params):  # one program per variant: prefill, then 5 tokens against the cache
        hidden, cache = decoder.prefill(params, CONFIG, tokens, positions, lengths,
                                        cache_size=32)
        more = decoder.forward_with_cache(params, CONFIG, tokens[:, :5],
                                          positions[:, :5] + 24, cache, cache_mask)
        return (hidden, cache.k, cache.v) + tuple(more)

    got = jax.jit(run)(params)
    _plain_scan(monkeypatch)
    ref = jax.jit(lambda p: run(p))(params)
    assert got[1].dtype == got[4].dtype == jnp.bfloat16
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_gradients_through_bf16_weights_and_adapters_match_the_plain_scan(monkeypatch):
    params, tokens, positions = _inputs(jnp.bfloat16)
    cfg = lora.LoraConfig(rank=2, alpha=4.0, targets=("q", "down"))
    adapters = lora.init_adapters(params, cfg, jax.random.key(2))
    adapters = jax.tree.map(lambda a: a + 0.01, adapters)  # b != 0: a non-zero merge
    tangent = jax.tree.map(jnp.ones_like, params)

    def loss(params, adapters):
        h = _hidden(lora.merge(params, adapters, cfg), tokens, positions)
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    def derivatives(params, adapters):  # reverse mode (both) and forward mode (weights)
        grads = jax.grad(loss, argnums=(0, 1))(params, adapters)
        return grads, jax.jvp(lambda p: loss(p, adapters), (params,), (tangent,))[1]

    got, got_jvp = jax.jit(derivatives)(params, adapters)
    _plain_scan(monkeypatch)
    ref, ref_jvp = jax.jit(lambda *a: derivatives(*a))(params, adapters)
    assert np.isfinite(float(got_jvp)) and float(got_jvp) == float(ref_jvp)
    flat_got, flat_ref = jax.tree.leaves(got), jax.tree.leaves(ref)
    assert len(flat_got) == len(flat_ref)
    assert any(float(jnp.abs(g.astype(jnp.float32)).max()) > 0 for g in flat_got)
    for g, r in zip(flat_got, flat_ref):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))


def _stack_casts(text):
    """Bit casts of a whole [L, ...] stack in a compiled program (per call: a copy)."""
    return re.findall(rf"bitcast-convert[.\d]* = u16\[{CONFIG.num_layers},\d", text)


def test_bit_views_alias_the_weights_and_skip_the_per_call_cast():
    params, tokens, positions = _inputs(jnp.bfloat16)
    views = cpu_scan.bit_view_layers(params)
    q = views["layers"]["q"]
    assert isinstance(q, cpu_scan.BitView) and q.bits.dtype == jnp.uint16
    assert q.dtype == jnp.bfloat16 and q.shape == params["layers"]["q"].shape
    assert views["embed"] is params["embed"]  # only the scanned stack is viewed
    if jax.default_backend() == "cpu":  # the bits are the weights' own buffer
        assert q.bits.unsafe_buffer_pointer() == params["layers"]["q"].unsafe_buffer_pointer()
    fast = _jit_hidden()
    np.testing.assert_array_equal(np.asarray(fast(views, tokens, positions), np.float32),
                                  np.asarray(fast(params, tokens, positions), np.float32))
    with_params = fast.lower(params, tokens, positions).compile().as_text()
    with_views = fast.lower(views, tokens, positions).compile().as_text()
    assert _stack_casts(with_params) and not _stack_casts(with_views)
    # decoding against a cache reads the views too
    lengths = jnp.array([24, 17])
    _, cache = decoder.prefill(params, CONFIG, tokens, positions, lengths, cache_size=32)
    cache_mask = jnp.broadcast_to(jnp.arange(32) < lengths[:, None, None], (2, 5, 32))
    got = decoder.forward_with_cache(views, CONFIG, tokens[:, :5], positions[:, :5] + 24, cache,
                                     cache_mask)
    ref = decoder.forward_with_cache(params, CONFIG, tokens[:, :5], positions[:, :5] + 24, cache,
                                     cache_mask)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_bit_views_leave_fp32_alone_and_refuse_gradients():
    params, tokens, positions = _inputs(jnp.float32)
    views = cpu_scan.bit_view_layers(params)
    assert all(a is b for a, b in zip(jax.tree.leaves(views), jax.tree.leaves(params)))
    bf16 = cpu_scan.bit_view_layers(_inputs(jnp.bfloat16)[0])
    loss = lambda p: jnp.sum(_hidden(p, tokens, positions).astype(jnp.float32))  # noqa: E731
    try:
        jax.grad(loss)(bf16)
    except TypeError as exc:  # the views' leaves are integers: no derivative to take
        assert "uint16" in str(exc)
    else:
        raise AssertionError("a gradient with respect to bit views was taken")


@pytest.mark.parametrize("dtype,view", [(jnp.float32, False), (jnp.float32, True),
                                        (jnp.bfloat16, False), (jnp.bfloat16, True)])
def test_whole_weight_stacks_feed_the_matmul_kernel_without_slices(monkeypatch, dtype, view):
    """Where the matmul kernel is on, the projections' stacks go to it whole with the layer
    index (no per-layer copy of a slice); the numbers and derivatives are the plain scan's."""
    from jaxdm.models.cpu import matmul as cpu_matmul
    if not cpu_matmul.enabled(dtype):
        pytest.skip(f"{jnp.dtype(dtype).name} matmul {cpu_matmul.status(dtype)[1]}")
    params = decoder.init_params(CONFIG, jax.random.key(0), dtype=dtype)
    rows = 160  # x 2 rows: past the bf16 kernel's MIN_ROWS
    tokens = jax.random.randint(jax.random.key(1), (2, rows), 0, CONFIG.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(rows), (2, rows))
    weights = cpu_scan.inference_layers(params)
    assert isinstance(weights["layers"]["q"], cpu_scan.Whole)
    assert isinstance(weights["layers"]["q"].stack, cpu_scan.BitView) == (dtype == jnp.bfloat16)
    if not view:  # the Whole marks on plain arrays: the bf16 stacks then cast inside the call
        weights = {**params, "layers": {**params["layers"], **{
            k: cpu_scan.Whole(params["layers"][k]) for k in ("q", "o", "gate", "up", "down")}}}
    fast = _jit_hidden()
    out = fast(weights, tokens, positions)
    text = fast.lower(weights, tokens, positions).compile().as_text()
    target = cpu_matmul.KERNELS[jnp.dtype(dtype)].target
    calls = [ln for ln in text.splitlines() if f'custom_call_target="{target}"' in ln]
    # q, o, gate, up, down (k and v, N = 16, are not the kernel's: XLA's dot on their slice)
    assert len(calls) == 5
    # each call's weight operand is the stack itself (a parameter of the loop), not a slice
    weights_in = [re.search(r"custom-call\(%[\w.-]+, %([\w.-]+),", ln).group(1) for ln in calls]
    assert not [w for w in weights_in if "slice" in w], weights_in
    _plain_scan(monkeypatch)
    ref = _jit_hidden()(params, tokens, positions)  # (a plain scan takes no views)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    if view:
        return  # (inference views refuse derivatives: differentiate the params)
    monkeypatch.undo()
    jax.clear_caches()
    loss = lambda p: jnp.mean(jnp.square(_hidden(p, tokens, positions).astype(jnp.float32)))  # noqa: E731
    got = jax.jit(jax.grad(loss))(params)
    _plain_scan(monkeypatch)
    want = jax.jit(jax.grad(lambda p: loss(p)))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_inference_layers_leave_sharded_stacks_sliced():
    """A stack spread over devices is not marked Whole: the kernel's custom call would gather
    the whole stack in every layer."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    if jax.device_count() < 2:
        pytest.skip("needs 2 (fake) devices")
    params = decoder.init_params(CONFIG, jax.random.key(0), dtype=jnp.float32)
    mesh = jax.make_mesh((2,), ("model",))
    q = jax.device_put(params["layers"]["q"], NamedSharding(mesh, P(None, None, "model")))
    got = cpu_scan.inference_layers({**params, "layers": {**params["layers"], "q": q}})
    assert got["layers"]["q"] is q


def test_a_lora_step_carries_its_frozen_bf16_weights_as_bits(monkeypatch):
    """Under differentiation the frozen bf16 weights (no tangent) still cross the
    rematerialised loop as their bits: the compiled gradient holds no fp32 copy of a weight
    stack (the plain scan's XLA:CPU converts each one), and the gradients are the plain
    scan's."""
    params, tokens, positions = _inputs(jnp.bfloat16)
    cfg = lora.LoraConfig(rank=3, alpha=4.0)  # (3: no weight dim, so no factor matches below)
    adapters = jax.tree.map(lambda a: a + 0.01, lora.init_adapters(params, cfg,
                                                                  jax.random.key(2)))
    remat = CONFIG.replace(remat=True)

    def loss(adapters):
        h = decoder.forward(lora.adapt(params, adapters, cfg), remat, tokens, positions)
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    grad = jax.jit(jax.grad(loss))
    got = grad(adapters)
    text = grad.lower(adapters).compile().as_text()
    # a weight stack [L, D | F, D | F | heads | kv heads, ...] in fp32
    stack = rf"f32\[{CONFIG.num_layers},(32|64),(32|64|4|2)[,\]]"
    assert not re.search(stack, text)
    _plain_scan(monkeypatch)
    plain = jax.jit(jax.grad(lambda a: loss(a)))
    ref = plain(adapters)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        assert g.dtype == r.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-6, atol=1e-9)
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(got))
    if jax.default_backend() == "cpu":  # what the bits avoid
        assert re.search(stack, plain.lower(adapters).compile().as_text())
