"""The cross-call prefix cache (issue 41, section 2): a growing agent context reuses the keys and
values of its earlier calls in whole blocks, answers equal the uncached path to fp32 rounding,
the bytes never exceed the bound (8 interleaved sessions forcing eviction), bad settings are
named errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_fixtures import smollm2_pretrained, tiny_pretrained, with_params

from jaxdm.decision import MultipleChoice, YesNo, make_backend
from jaxdm.decision import shared_prefix as sp
from jaxdm.decision.local import LocalLikelihood, LocalReadout
from jaxdm.decision.prefix_cache import (Match, PrefixCache, PrefixCacheError, check_bound_mb,
                                         physical_memory_bytes)
from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig

OPTIONS = ("look", "take mug 1 from table 1", "go to cabinet 2", "open cabinet 2", "inventory")
# fp32: the cached keys come from an earlier program (other shapes), so sums are ordered
# differently; measured <= 3e-7 on the tiny model, ~1e-6 on SmolLM2
TOL = 1e-5


def _session_steps(session: int, n_steps: int) -> list[str]:
    """Contexts of one agent session: each step adds an observation and an action (~40
    tokens), as an agent's history grows."""
    ctx = f"Session {session}. Your task: put a clean mug {session} in cabinet {session % 5}."
    out = []
    for t in range(n_steps):
        ctx += (f"\nStep {t}: You see a table {t}, a sink {session} and a mug {t + session}. "
                f"> go to table {t}\nYou arrive at table {t}.")
        out.append(ctx)
    return out


def _step_questions(ctx: str) -> list[MultipleChoice]:
    # one question set per step: packed multi-question scoring over the shared context
    return [MultipleChoice(ctx, "Which action should the agent take next?", OPTIONS),
            MultipleChoice(ctx, "Is the task finished?", ("yes", "no"))]


def _probs(results) -> list[np.ndarray]:
    assert all(r.ok for r in results), [r.error for r in results]
    return [np.asarray(r.probs) for r in results]


def test_growing_context_equals_uncached_and_reuses_blocks():
    pre = tiny_pretrained()
    cached, plain = LocalReadout(pre), LocalReadout(pre, prefix_cache_mb=0)
    assert cached.prefix_cache is not None and plain.prefix_cache is None  # on by default
    for t, ctx in enumerate(_session_steps(0, 8)):
        before = dict(cached.stats)
        a = _probs(cached.choose(_step_questions(ctx)))
        b = _probs(plain.choose(_step_questions(ctx)))
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=TOL)
        if t > 0:  # everything but the last partial block of the previous context is reused
            run = cached.stats["unique_tokens"] - before["unique_tokens"]
            reused = cached.stats["cached_tokens"] - before["cached_tokens"]
            assert reused >= 32 * t and run < 200, (t, run, reused)
    st = cached.cache_stats()
    assert st["enabled"] and st["misses"] == 1 and st["hits"] == 7 and st["evictions"] == 0
    assert st["tokens_reused"] == cached.stats["cached_tokens"] > 0
    assert 0 < st["bytes"] <= st["max_bytes"] == 1024 << 20
    # 2 layers x (k, v) x 2 KV heads x head dim 8 x fp32 = 256 bytes per token
    assert st["bytes"] == st["blocks"] * 32 * 256
    off = plain.cache_stats()
    assert not off["enabled"] and off["bytes"] == off["hits"] == 0


def test_yesno_and_likelihood_over_a_cached_prefix():
    pre = tiny_pretrained()
    steps = _session_steps(3, 4)
    rd, rd0 = LocalReadout(pre), LocalReadout(pre, prefix_cache_mb=0)
    ll, ll0 = LocalLikelihood(pre), LocalLikelihood(pre, prefix_cache_mb=0)
    for ctx in steps:
        yn = [YesNo(ctx, "Did the last action help?"), YesNo(ctx, "Is the mug clean?")]
        np.testing.assert_allclose([r.score for r in rd.score(yn)],
                                   [r.score for r in rd0.score(yn)], atol=TOL)
        q = [MultipleChoice(ctx, "Which action next?", OPTIONS)]
        np.testing.assert_allclose(_probs(ll.choose(q))[0], _probs(ll0.choose(q))[0], atol=TOL)
    assert rd.cache_stats()["hits"] >= 3 and ll.cache_stats()["hits"] >= 3


def test_eight_interleaved_sessions_stay_within_the_bound():
    pre = tiny_pretrained()
    # 1,024 tokens of blocks, about 3 sessions at their last step: 8 interleaved ones must evict
    bound_mb = 0.25
    cached = LocalReadout(pre, prefix_cache_mb=bound_mb, max_groups_per_call=8)
    plain = LocalReadout(pre, prefix_cache_mb=0, max_groups_per_call=8)
    sessions = [_session_steps(s, 6) for s in range(8)]
    bound = int(bound_mb * (1 << 20))
    for t in range(6):
        for s in range(8):   # interleaved: one step of every session in turn
            qs = _step_questions(sessions[s][t])
            for x, y in zip(_probs(cached.choose(qs)), _probs(plain.choose(qs))):
                np.testing.assert_allclose(x, y, atol=TOL)
            st = cached.cache_stats()
            assert st["bytes"] <= st["max_bytes"] == bound, st
        # and all 8 sessions' questions of a step in one call (8 groups, 8 cached prefixes)
        qs = [q for s in range(8) for q in _step_questions(sessions[s][t] + " Then?")]
        for x, y in zip(_probs(cached.choose(qs)), _probs(plain.choose(qs))):
            np.testing.assert_allclose(x, y, atol=TOL)
        assert cached.cache_stats()["bytes"] <= bound
    st = cached.cache_stats()
    assert st["evictions"] > 0 and st["hits"] > 0 and st["blocks"] > 0, st


def test_new_params_clear_the_cache():
    pre = tiny_pretrained()
    rd = LocalReadout(pre)
    ctx = _session_steps(1, 2)[1]
    rd.choose(_step_questions(ctx))
    assert rd.cache_stats()["blocks"] > 0
    rd.params = jax.tree.map(lambda a: a * 1.01, pre.params)
    got = _probs(rd.choose(_step_questions(ctx)))
    ref = _probs(LocalReadout(with_params(pre, rd.params), prefix_cache_mb=0).choose(
        _step_questions(ctx)))
    for x, y in zip(got, ref):
        np.testing.assert_allclose(x, y, atol=TOL)
    assert rd.cache_stats()["clears"] == 1 and rd.cache_stats()["hits"] == 0


def _kv(n: int, fill: float, layers: int = 2) -> np.ndarray:
    return np.full((layers, n, 1, 4), fill, np.float32)   # [L, n, K, H]: 32 bytes per token


def test_block_matching_partial_blocks_and_lru_eviction():
    cache = PrefixCache(max_bytes=8 * 4 * 32 * 2, block_tokens=4)   # room for 8 blocks (k + v)
    a = list(range(100, 110))                                        # 10 tokens: 2 whole blocks
    m = cache.match(a)
    assert m == Match(0, ()) and cache.stats()["misses"] == 1
    assert cache.store(a, m, _kv(10, 1.0), _kv(10, 2.0)) == 2        # the partial block is not
    m = cache.match(a + [7, 7, 7])
    assert m.tokens == 8 and cache.stats()["hits"] == 1
    k, v = np.zeros((2, 8, 1, 4), np.float32), np.zeros((2, 8, 1, 4), np.float32)
    cache.gather(m, k, v)
    assert np.all(k == 1.0) and np.all(v == 2.0)
    assert cache.match([100, 101, 102, 9] + a[4:]).tokens == 0       # a block differs: no match
    # another session fills the rest; the older session's deepest block goes first
    b = list(range(200, 224))
    assert cache.store(b, cache.match(b), _kv(24, 3.0), _kv(24, 4.0)) == 6
    assert cache.stats()["bytes"] == cache.max_bytes and cache.stats()["evictions"] == 0
    c = list(range(300, 308))
    cache.store(c, cache.match(c), _kv(8, 5.0), _kv(8, 6.0))
    st = cache.stats()
    assert st["bytes"] <= st["max_bytes"] and st["evictions"] == 2
    assert cache.match(a).tokens == 0 and cache.match(b).tokens == 24  # a was least recent
    # a block larger than the whole bound is never stored
    tiny = PrefixCache(max_bytes=100, block_tokens=4)
    assert tiny.store(a, tiny.match(a), _kv(10, 1.0), _kv(10, 1.0)) == 0
    assert tiny.stats()["bytes"] == 0


def test_bad_settings_are_named_errors():
    pre = tiny_pretrained()
    for bad in (-1, -0.5, float("nan"), float("inf"), True, "big", None):
        with pytest.raises(PrefixCacheError, match="prefix_cache_mb"):
            check_bound_mb(bad)
    absurd = physical_memory_bytes() / (1 << 20) * 2
    with pytest.raises(PrefixCacheError, match="more than this machine's memory"):
        LocalReadout(pre, prefix_cache_mb=absurd)
    with pytest.raises(PrefixCacheError, match="prefix_cache_mb"):
        LocalReadout(pre, prefix_cache_mb=-8)
    with pytest.raises(PrefixCacheError, match="needs layout 'packed'"):
        LocalReadout(pre, layout="rows", prefix_cache_mb=64)
    assert LocalReadout(pre, layout="rows").prefix_cache is None        # off there by default
    with pytest.raises(PrefixCacheError, match="block_tokens"):
        LocalReadout(pre, prefix_cache_block=0)
    with pytest.raises(PrefixCacheError, match="prefix_cache_mb"):
        make_backend({"kind": "local_readout", "prefix_cache_mb": -5}, pretrained=pre)
    rd = make_backend({"kind": "local_readout", "prefix_cache_mb": 16, "prefix_cache_block": 64},
                      pretrained=pre)
    assert rd.cache_stats()["max_bytes"] == 16 << 20 and rd.cache_stats()["block_tokens"] == 64
    with pytest.raises(ValueError, match="needs layout 'packed'"):
        sp.score_requests(pre.params, pre.config, [sp.Request((1, 2, 3), (2,), ((4, 5),))],
                          layout="rows", prefix_cache=PrefixCache(1 << 20))


@pytest.mark.parametrize("head_dim", [8, 64])   # XLA's attention / the fused CPU kernel
def test_forward_cached_suffixes_equals_one_forward(head_dim):
    config = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=head_dim, rope_theta=10000.0,
                         rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=512)
    params = decoder.init_params(config, jax.random.key(1))
    rng = np.random.default_rng(0)
    full = rng.integers(0, 300, 100)
    ref = decoder.forward(params, config, jnp.asarray(full[None]), jnp.arange(100)[None])[0]
    # 40 tokens cached (in a 64-slot past), the row continues the context to 100 and holds two
    # suffixes: one seeing 60 context positions (past the cached part), one seeing 30 (within)
    _, past = decoder.prefill(params, config, jnp.asarray(full[None, :40]),
                              jnp.arange(40)[None], jnp.array([40]), cache_size=64)
    tails = [rng.integers(0, 300, 20), rng.integers(0, 300, 10)]
    sees = [60, 30]
    refs = [decoder.forward(params, config, jnp.asarray(np.r_[full[:v], t][None]),
                            jnp.arange(v + len(t))[None])[0, v:] for v, t in zip(sees, tails)]
    s = 128
    tokens, pos = np.zeros((1, s), np.int32), np.zeros((1, s), np.int32)
    seg, vis = np.full((1, s), -1, np.int32), np.zeros((1, s), np.int32)
    tokens[0, :60], pos[0, :60], seg[0, :60] = full[40:], np.arange(40, 100), 0
    at = 60
    for r, (v, t) in enumerate(zip(sees, tails), 1):
        sl = slice(at, at + len(t))
        tokens[0, sl], pos[0, sl], seg[0, sl], vis[0, sl] = t, np.arange(v, v + len(t)), r, v
        at += len(t)
    args = [jnp.asarray(a) for a in (tokens, pos, seg, vis)]
    hidden, ks, vs = decoder.forward_cached_suffixes(params, config, *args, past, keep=64)
    np.testing.assert_allclose(hidden[0, :60], ref[40:], atol=1e-5)
    np.testing.assert_allclose(hidden[0, 60:80], refs[0], atol=1e-5)
    np.testing.assert_allclose(hidden[0, 80:90], refs[1], atol=1e-5)
    _, whole = decoder.prefill(params, config, jnp.asarray(full[None]), jnp.arange(100)[None],
                               jnp.array([100]), cache_size=100)
    assert ks.shape == (2, 1, 64, 2, head_dim)
    np.testing.assert_allclose(ks[:, 0, :60], whole.k[:, 0, 40:], atol=1e-5)
    np.testing.assert_allclose(vs[:, 0, :60], whole.v[:, 0, 40:], atol=1e-5)
    read = jnp.array([[59, 79, 89]])
    picked, _, _ = decoder.forward_cached_suffixes(params, config, *args, past, keep=64,
                                                   read=read)
    np.testing.assert_allclose(picked[0], jnp.stack([ref[99], refs[0][-1], refs[1][-1]]),
                               atol=1e-5)
    with pytest.raises(ValueError, match="past k/v must be"):
        decoder.forward_cached_suffixes(params, config, *args, past._replace(
            lengths=jnp.array([40, 40])), keep=64)
    with pytest.raises(ValueError, match="keep"):
        decoder.forward_cached_suffixes(params, config, *args, past, keep=s + 1)


@pytest.mark.slow
def test_smollm2_growing_context_equals_uncached():
    """The real model: a 4-step session, cached vs uncached readout (packed questions)."""
    pre = smollm2_pretrained()
    cached = LocalReadout(pre)
    plain = LocalReadout(pre, prefix_cache_mb=0)
    for ctx in _session_steps(2, 4):
        for x, y in zip(_probs(cached.choose(_step_questions(ctx))),
                        _probs(plain.choose(_step_questions(ctx)))):
            np.testing.assert_allclose(x, y, atol=TOL)
    st = cached.cache_stats()
    assert st["hits"] == 3 and st["tokens_reused"] > 0 and st["bytes"] <= st["max_bytes"]


def test_gathered_reuses_its_buffers_and_zeroes_what_a_longer_context_left():
    cache = PrefixCache(max_bytes=1 << 20, block_tokens=4)
    a, b = list(range(100, 112)), list(range(200, 208))          # 3 and 2 whole blocks
    cache.store(a, cache.match(a), _kv(12, 1.0), _kv(12, 2.0))
    cache.store(b, cache.match(b), _kv(8, 3.0), _kv(8, 4.0))
    shape = (2, 2, 16, 1, 4)                                       # [L, G, C, K, H]
    with cache.gathered([cache.match(a), cache.match(b)], shape, np.float32) as (k, v):
        assert k.shape == shape and np.all(k[:, 0, :12] == 1) and np.all(v[:, 1, :8] == 4)
        assert not k[:, 0, 12:].any() and not v[:, 1, 8:].any()
        first = k
        # a call while the buffers are in use gets fresh ones
        with cache.gathered([cache.match(b)], shape, np.float32) as (k2, _):
            assert k2 is not first and np.all(k2[:, 0, :8] == 3) and not k2[:, 1].any()
    # the next call of that shape reuses them: slot 0 now holds the shorter b, slot 1 nothing
    with cache.gathered([cache.match(b)], shape, np.float32) as (k, v):
        assert k is first
        assert np.all(k[:, 0, :8] == 3) and not k[:, 0, 8:].any() and not k[:, 1].any()
        assert np.all(v[:, 0, :8] == 4) and not v[:, 0, 8:].any() and not v[:, 1].any()
    assert cache.stats()["scratch_bytes"] == 2 * first.nbytes
    with pytest.raises(ValueError, match="does not fit"):
        with cache.gathered([cache.match(a)], (2, 1, 8, 1, 4), np.float32):
            pass
    with pytest.raises(ValueError, match="blocks are"):
        with cache.gathered([cache.match(a)], (3, 1, 16, 1, 4), np.float32):
            pass
