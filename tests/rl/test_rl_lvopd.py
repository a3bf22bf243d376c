"""LVOPD: gates over the whole batch, the objective vs a numpy reference, the teachers."""
from __future__ import annotations

import http.server
import json
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.rl import losses, lvopd
from jaxdm.rl.distill import gate_weights, lvopd_distill_loss
from jaxdm.rl.terms import LOSS_TERMS, LossConfig

jax.config.update("jax_default_matmul_precision", "highest")


# ---- gates -----------------------------------------------------------------------------------
def test_gate_modes_hand_computed():
    adv = np.array([[0.5, -1.0, 0.0], [-0.5, 2.0, 9.0]], np.float32)
    mask = np.array([[True, True, False], [True, True, False]])
    success = np.array([True, False])
    # valid: 0.5, -1, -0.5, 2 -> mean 0.25, std = sqrt((.0625+1.5625+.5625+3.0625)/4)
    std = np.sqrt(5.25 / 4)
    np.testing.assert_allclose(gate_weights("lvopd", adv, mask),
                               [[0, 1 / std, 0], [0.5 / std, 0, 0]], rtol=1e-5)
    np.testing.assert_array_equal(gate_weights("pure", adv, mask), mask.astype(np.float32))
    np.testing.assert_array_equal(gate_weights("trajectory", adv, mask, success=success),
                                  [[0, 0, 0], [1, 1, 0]])
    with pytest.raises(ValueError, match="needs success"):
        gate_weights("trajectory", adv, mask)
    with pytest.raises(ValueError, match="unknown gate 'soft'"):
        gate_weights("soft", adv, mask)
    bad = adv.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match=r"trajectory 1, step 1"):
        gate_weights("lvopd", bad, mask)


def test_unit_gate_is_computed_over_the_whole_batch():
    rng = np.random.default_rng(0)
    adv = rng.normal(size=(6, 5)).astype(np.float32)
    mask = rng.random((6, 5)) < 0.8
    rows, cols = np.nonzero(mask)
    w = lvopd.unit_gate_weights("lvopd", adv, mask, rows, cols)
    full = gate_weights("lvopd", adv, mask)
    np.testing.assert_allclose(w, full[rows, cols])
    # A gate normalised on a mini-batch (the first 2 trajectories) differs: the std differs.
    sub = gate_weights("lvopd", adv[:2], mask[:2])
    first = rows < 2
    assert not np.allclose(sub[rows[first], cols[first]], w[first])


# ---- the objective vs numpy ------------------------------------------------------------------
def _np_topk_kl_and_grad(z, tids, tlps, k, vocab):
    """Per-row KL on the top-k support and dKL/dz by the SPEC formula (float64)."""
    z = z.astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) + z.max(-1,
                                                                                     keepdims=True)
    logp = z - lse
    p = np.exp(logp)
    kl = np.zeros(z.shape[0])
    grad = np.zeros_like(z)
    for n in range(z.shape[0]):
        support = np.argsort(-z[n])[:k]
        leftover = max(1 - np.exp(tlps[n].astype(np.float64)).sum(), 0.0)
        floor = max(np.log(leftover) - np.log(vocab - tids.shape[-1]), -30.0) if leftover > 0 \
            else -30.0
        tau = np.array([tlps[n][list(tids[n]).index(j)] if j in tids[n] else floor
                        for j in support])
        kl[n] = (p[n, support] * (logp[n, support] - tau)).sum()
        a = p[n, support] * (logp[n, support] - tau + 1)
        grad[n] = -p[n] * a.sum()
        grad[n, support] += a
    return kl, grad


def test_objective_value_and_gradient_equal_numpy_reference():
    rng = np.random.default_rng(1)
    m, s, d, vocab, r, kt = 3, 10, 8, 64, 4, lvopd.TEACHER_TOP_K
    hidden = rng.normal(size=(m, s, d)).astype(np.float32)
    head = (rng.normal(size=(d, vocab)) * 0.7).astype(np.float32)
    positions = np.stack([np.arange(r) + 3 + i for i in range(m)]).astype(np.int32)
    tmask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], bool)
    tlogits = rng.normal(size=(m, r, vocab)) * 2
    tl = tlogits - np.log(np.exp(tlogits).sum(-1, keepdims=True))
    tids = np.argsort(-tl, -1)[..., :kt].astype(np.int32)
    tlps = np.take_along_axis(tl, tids, -1).astype(np.float32)
    weights = np.array([0.7, 0.0, 1.3], np.float32)        # unit 1: gate zero
    logp = rng.normal(size=(m, s)).astype(np.float32) - 2
    old = logp + rng.uniform(-0.1, 0.1, size=(m, s)).astype(np.float32)  # inside the clip
    adv = np.array([0.5, -1.0, 2.0], np.float32)
    rmask = np.zeros((m, s), bool)
    rmask[np.arange(m)[:, None], positions + 1] = tmask
    batch = {"lvopd/weights": weights, "lvopd/positions": positions, "lvopd/mask": tmask,
             "lvopd/teacher_ids": tids, "lvopd/teacher_logprobs": tlps}
    coef = 0.8

    def f(lp, h, w):
        h_resp = jnp.take_along_axis(h, jnp.asarray(positions)[..., None], axis=1)
        return lvopd.lvopd_loss_from_hidden(lp, old, adv, rmask, h_resp, w, batch, coef=coef)[0]

    val, (g_lp, g_h, g_w) = jax.value_and_grad(f, argnums=(0, 1, 2))(logp, hidden, head)

    # numpy: surrogate -A r (unclipped) token-mean + coef * sum w KL / #tokens
    ratio = np.exp(logp - old)
    n_tok = rmask.sum()
    pg = (-(adv[:, None] * ratio) * rmask).sum() / n_tok
    h_resp = np.take_along_axis(hidden, positions[..., None], 1).astype(np.float64)
    z = h_resp.reshape(-1, d) @ head.astype(np.float64)
    kl, dz = _np_topk_kl_and_grad(z, tids.reshape(-1, kt), tlps.reshape(-1, kt),
                                  lvopd.STUDENT_TOP_K, vocab)
    wt = np.repeat(weights, r) * tmask.reshape(-1)
    n_d = tmask.sum()
    distill = (wt * kl).sum() / n_d
    np.testing.assert_allclose(float(val), pg + coef * distill, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g_lp), -(adv[:, None] * ratio) * rmask / n_tok,
                               rtol=1e-5, atol=1e-7)
    dz = dz * (coef * wt / n_d)[:, None]
    gh_resp = (dz @ head.T.astype(np.float64)).reshape(m, r, d)
    gh = np.zeros((m, s, d))
    for i in range(m):
        gh[i, positions[i]] += gh_resp[i]
    np.testing.assert_allclose(np.asarray(g_h), gh, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_w), h_resp.reshape(-1, d).T @ dz, rtol=1e-4,
                               atol=1e-6)
    # where the gate is zero (unit 1) the distillation contributes nothing
    assert np.abs(np.asarray(g_h)[1]).max() == 0.0


def test_distillation_is_zero_where_the_gate_is_zero():
    rng = np.random.default_rng(2)
    h = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(8, 40)), jnp.float32)
    ids = jnp.tile(jnp.arange(32, dtype=jnp.int32), (2, 5, 1))
    lps = jnp.full((2, 5, 32), np.log(0.02), jnp.float32)
    mask = jnp.ones((2, 5), bool)
    idx = jnp.zeros((2, 5), jnp.int32)
    zero = jnp.zeros((2, 1))
    loss, met = lvopd_distill_loss(h, ids, lps, zero, idx, mask, lm_head=head)
    g = jax.grad(lambda x: lvopd_distill_loss(x, ids, lps, zero, idx, mask, lm_head=head)[0])(h)
    assert float(loss) == 0.0 and float(jnp.abs(g).max()) == 0.0
    assert float(met["lvopd/kl_mean"]) > 0  # the KL itself is not zero


# ---- a tiny decoder: objective from one forward, the registered term, the teachers ----------
@pytest.fixture(scope="module")
def tiny():
    config = ModelConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_layers=2,
                         num_heads=2, num_kv_heads=1, head_dim=8)
    params = decoder.init_params(config, jax.random.key(0))
    rng = np.random.default_rng(3)
    trajs = [[{"prompt": rng.integers(1, 97, size=n).tolist(),
               "response": rng.integers(1, 97, size=r).tolist()} for n, r in spec]
             for spec in ([(7, 3), (9, 4)], [(5, 2)], [(6, 5), (4, 1), (8, 3)])]
    return config, params, trajs


def test_local_teacher_packed_pass_equals_one_forward_per_action(tiny):
    config, params, trajs = tiny
    teacher = lvopd.LocalTeacher(params, config, k=32, rows_per_call=2)
    packed = teacher.topk(trajs)
    single = teacher.topk_one_per_action(trajs)
    for a, b in zip(packed, single):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.ids, y.ids)
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    # and they are the model's own top-32 next-token log-probs
    u = trajs[0][1]
    seq = jnp.asarray([u["prompt"] + u["response"]])
    full = jax.nn.log_softmax(decoder.logits(params, config, seq)[0], -1)
    p = len(u["prompt"])
    top = jax.lax.top_k(full[p - 1:p - 1 + len(u["response"])], 32)
    np.testing.assert_allclose(packed[0][1].logprobs, top[0], atol=1e-5)
    with pytest.raises(ValueError, match="share the tokenizer"):
        lvopd.LocalTeacher(params, config, vocab_size=98)


def test_registered_term_and_objective_on_a_decoder(tiny):
    config, params, trajs = tiny
    assert "lvopd" in LOSS_TERMS
    LossConfig(terms=(("ppo", 1.0), ("lvopd", 0.5)))
    units = [u for t in trajs for u in t]
    teacher = lvopd.LocalTeacher(params, config).topk(trajs)
    lists = [x for t in teacher for x in t]
    lists[1] = None                                         # a failed teacher: no distillation
    weights = [1.0, 0.5, 0.0, 2.0, 1.0, 0.3]
    arrays = lvopd.lvopd_unit_arrays(units, weights, lists, pad_to=8)
    assert not arrays["lvopd/mask"][1].any() and arrays["lvopd/mask"][0, :3].all()
    s = 32
    tokens = np.zeros((8, s), np.int32)
    valid = np.zeros((8, s), bool)
    resp = np.zeros((8, s), bool)
    for i, u in enumerate(units):
        seq = u["prompt"] + u["response"]
        tokens[i, :len(seq)], valid[i, :len(seq)] = seq, True
        resp[i, len(u["prompt"]):len(seq)] = True
    batch = {"policy": types.SimpleNamespace(tokens=tokens, valid=valid, response_mask=resp),
             **arrays}
    aux = types.SimpleNamespace(policy=types.SimpleNamespace(form="generative", config=config),
                                loss=LossConfig(terms=(("ppo", 1.0), ("lvopd", 1.0))))
    term_loss, met = LOSS_TERMS["lvopd"].fn({"policy": params}, batch, aux)
    # The teacher is the student itself: the KL on the top-16 support is 0 (rounding).
    assert abs(float(met["lvopd/kl_mean"])) < 1e-5
    # The objective's distillation part equals the term; its surrogate part is PPO's.
    old = np.asarray(rng_old := np.random.default_rng(5).normal(size=(8, s)) - 5, np.float32)
    del rng_old
    adv = np.linspace(-1, 1, 8).astype(np.float32)
    total, omet = lvopd.lvopd_objective(params, config, tokens, valid, old, adv, arrays,
                                        coef=2.0)
    np.testing.assert_allclose(float(omet["lvopd/loss"]), float(term_loss), rtol=1e-5)
    hidden = decoder.forward(params, config, jnp.asarray(tokens),
                             jnp.broadcast_to(jnp.arange(s), (8, s)), attn_mask=valid)
    lp = jnp.pad(decoder.token_logprobs(params, config, hidden[:, :-1], tokens[:, 1:]),
                 ((0, 0), (1, 0)))
    pg, _ = losses.ppo_loss(jnp.where(resp, lp, 0.0), old, None,
                            np.where(resp, adv[:, None], 0.0), resp, kl_coef=0.0,
                            entropy_coef=0.0)
    np.testing.assert_allclose(float(omet["loss/pg"]), float(pg), rtol=1e-5)
    np.testing.assert_allclose(float(total), float(pg) + 2 * float(term_loss), rtol=1e-5)
    with pytest.raises(ValueError, match="generative policy"):
        LOSS_TERMS["lvopd"].fn({"policy": params}, batch,
                               types.SimpleNamespace(policy=types.SimpleNamespace(form="option")))


# ---- remote teacher against a fake OpenAI-compatible server on 127.0.0.1 ---------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.log.append(body)
        if body["model"] == "down" or (body["model"] == "flaky" and body["prompt"][0] % 2):
            data = json.dumps({"error": "boom"}).encode()
            self.send_response(500)
        else:
            k = body["logprobs"] if body["model"] != "short" else body["logprobs"] - 1
            seq = jnp.asarray([body["prompt"]])
            full = np.asarray(jax.nn.log_softmax(
                decoder.logits(srv.params, srv.config, seq)[0], -1))
            top = [None] + [{f"token_id:{int(j)}": float(full[i - 1, j])
                             for j in np.argsort(-full[i - 1])[:k]}
                            for i in range(1, len(body["prompt"]))]
            data = json.dumps({"choices": [{"text": "x", "logprobs": {
                "top_logprobs": top}}]}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server(tiny):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.config, srv.params, _ = tiny
    srv.log = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_remote_teacher_equals_local_and_counts_failures(tiny, server):
    config, params, trajs = tiny
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    local = lvopd.LocalTeacher(params, config).topk(trajs)
    rt = lvopd.RemoteTeacher(url, "jaxdm", max_retries=0)
    remote = rt.topk(trajs)
    for a, b in zip(local, remote):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.ids, y.ids)
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
    body = server.log[0]
    assert body["echo"] is True and body["logprobs"] == 32 and body["return_tokens_as_token_ids"]
    assert rt.requests == 3 and rt.failures == 0
    short = lvopd.RemoteTeacher(url, "short", max_retries=0)
    assert short.topk(trajs[:1]) == [None] and short.failures == 1
    assert "need 32" in short.last_error
    # the signal: a failed trajectory (odd first prompt token under "flaky") has mask False
    flaky = lvopd.RemoteTeacher(url, "flaky", max_retries=0)
    units = [u for t in trajs for u in t]
    rows = np.repeat(np.arange(3), [len(t) for t in trajs])
    eb = types.SimpleNamespace(episodes=[None] * 3, units=units, unit_rows=rows)
    sig = lvopd.teacher_topk_signal(eb, flaky)
    expect_ok = np.array([all(u["prompt"][0] % 2 == 0 for u in t) for t in trajs])
    np.testing.assert_array_equal(sig.mask, expect_ok)
    assert sig.stats["teacher_topk/failures"] == float((~expect_ok).sum())
    lists = lvopd.unit_teacher_lists(sig)
    for j, u in enumerate(units):
        ok = expect_ok[rows[j]]
        assert (lists[j] is not None) == ok
        if ok:
            assert lists[j].ids.shape == (len(u["response"]), 32)


@pytest.mark.parametrize("tail", [False, True])
def test_fused_loss_head_equals_the_two_pass_form(tail):
    """One streaming pass for log π(target) and the KL == chunked log-probs + fused KL (with
    and without the tail bucket; the bucket changes the loss)."""
    rng = np.random.default_rng(4)
    m, r, d, vocab, kt = 3, 5, 8, 300, lvopd.TEACHER_TOP_K
    h = jnp.asarray(rng.normal(size=(m, r, d)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(d, vocab)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, size=(m, r)), jnp.int32)
    old = jnp.asarray(rng.normal(size=(m, r)) - 6, jnp.float32)
    adv = jnp.asarray([0.4, -1.0, 1.5], jnp.float32)
    w = jnp.asarray([1.0, 0.0, 0.6], jnp.float32)
    mask = jnp.asarray(rng.random((m, r)) < 0.8)
    tl = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(m, r, vocab)) * 2), -1)
    lps, ids = jax.lax.top_k(tl, kt)
    batch = {"lvopd/weights": w, "lvopd/positions": jnp.zeros((m, r), jnp.int32),
             "lvopd/mask": mask, "lvopd/teacher_ids": ids.astype(jnp.int32),
             "lvopd/teacher_logprobs": lps}

    def fused(h, head):
        return lvopd.lvopd_loss_fused(h, head, targets, old, adv, w, mask, ids.astype(jnp.int32),
                                      lps, coef=0.7, block_v=64, tail=tail)[0]

    def two_pass(h, head):
        lp = jnp.take_along_axis(jax.nn.log_softmax(h @ head, -1), targets[..., None], -1)[..., 0]
        return lvopd.lvopd_loss_from_hidden(lp, old, adv, mask, h, head, batch, coef=0.7,
                                            tail=tail)[0]

    v1, g1 = jax.value_and_grad(fused, argnums=(0, 1))(h, head)
    v2, g2 = jax.value_and_grad(two_pass, argnums=(0, 1))(h, head)
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)
    if tail:
        plain = lvopd.lvopd_loss_fused(h, head, targets, old, adv, w, mask,
                                       ids.astype(jnp.int32), lps, coef=0.7, block_v=64)[0]
        assert abs(float(v1) - float(plain)) > 1e-4
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_batcher_gates_the_whole_batch_and_builds_minibatches(tiny):
    config, params, trajs = tiny
    units = [u for t in trajs for u in t]
    rows = np.repeat(np.arange(3), [len(t) for t in trajs])
    cols = np.concatenate([np.arange(len(t)) for t in trajs])
    mask = np.zeros((3, 3), bool)
    mask[rows, cols] = True
    adv = np.where(mask, np.array([[-1.0, 0.5, 0], [0.2, 0, 0], [-0.3, -2.0, 1.0]]), 0)
    eb = types.SimpleNamespace(episodes=[None] * 3, units=units, unit_rows=rows,
                               unit_cols=cols, mask=mask, outcome=np.array([0.0, 1.0, 0.0]))
    sig = lvopd.teacher_topk_signal(eb, lvopd.LocalTeacher(params, config))
    for gate, expect in (("lvopd", gate_weights("lvopd", adv, mask)[rows, cols]),
                         ("pure", np.ones(6)), ("trajectory", np.array([1, 1, 0, 1, 1, 1]))):
        b = lvopd.LVOPDBatcher(eb, adv, sig, gate=gate)
        np.testing.assert_allclose(b.weights, expect, rtol=1e-6)
        a = b.arrays([5, 0], pad_to=4)
        np.testing.assert_allclose(a["lvopd/weights"], [expect[5], expect[0], 0, 0], rtol=1e-6)
        assert a["lvopd/mask"][0, :3].all() and not a["lvopd/mask"][0, 3:].any()
        assert a["lvopd/response"][1, :3].all() and not a["lvopd/response"][2:].any()


def test_train_step_runs_one_policy_forward_for_ppo_and_lvopd(tiny, monkeypatch):
    """In the trainer's step the lvopd term reads the hidden states of the policy forward the
    ppo term uses (one decoder forward traced, not two), with unchanged term values."""
    import optax

    from jaxdm.rl import terms
    from jaxdm.rl.policy import GenerativePolicy, TokenBatch
    from jaxdm.rl.text import WordTokenizer

    config, params, trajs = tiny
    units = [u for t in trajs for u in t]
    lists = [x for t in lvopd.LocalTeacher(params, config).topk(trajs) for x in t]
    arrays = lvopd.lvopd_unit_arrays(units, [1.0, 0.5, 0.0, 2.0, 1.0, 0.3], lists, pad_to=8)
    s = 32
    tokens, valid, resp = np.zeros((8, s), np.int32), np.zeros((8, s), bool), np.zeros((8, s), bool)
    for i, u in enumerate(units):
        seq = u["prompt"] + u["response"]
        tokens[i, :len(seq)], valid[i, :len(seq)] = seq, True
        resp[i, len(u["prompt"]):len(seq)] = True
    rng = np.random.default_rng(1)
    batch = {"policy": TokenBatch(tokens, valid, resp), **arrays,
             "adv": np.linspace(-1, 1, 8).astype(np.float32),
             "old_logp": (rng.normal(size=(8, s)) - 5).astype(np.float32),
             "ref_logp": np.zeros((8, s), np.float32)}
    policy = GenerativePolicy(config, WordTokenizer([]))
    loss = LossConfig(terms=(("ppo", 1.0), ("lvopd", 0.5)))
    aux = terms.TermContext(policy, None, loss)
    calls = []
    real_forward = decoder.forward

    def counting_forward(*args, **kwargs):
        calls.append(1)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", counting_forward)
    jax.clear_caches()  # every jitted helper is traced afresh (its forward counted)
    opt = {"policy": optax.sgd(0.0).init(params)}
    _, _, met = terms.make_train_step(aux, {"policy": optax.sgd(0.0)})(
        {"policy": params}, opt, batch)
    assert len(calls) == 1, f"{len(calls)} decoder forwards traced in the ppo + lvopd step"
    # a policy without hidden_states: each term runs its own forward (what sharing removes)
    calls.clear()
    bare = types.SimpleNamespace(form="generative", config=config,
                                 logp_and_entropy=policy.logp_and_entropy)
    terms.make_train_step(terms.TermContext(bare, None, loss), {"policy": optax.sgd(0.0)})(
        {"policy": params}, opt, batch)
    assert len(calls) == 2
    ppo_alone = float(terms.LOSS_TERMS.get("ppo").fn({"policy": params}, batch, aux)[0])
    lvopd_alone = float(terms.LOSS_TERMS.get("lvopd").fn({"policy": params}, batch, aux)[0])
    np.testing.assert_allclose(float(met["loss/ppo"]), ppo_alone, rtol=1e-5)
    np.testing.assert_allclose(float(met["loss/lvopd"]), lvopd_alone, rtol=1e-5)
    np.testing.assert_allclose(float(met["loss/total"]), ppo_alone + 0.5 * lvopd_alone,
                               rtol=1e-5)
