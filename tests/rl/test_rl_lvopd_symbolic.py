"""LVOPD for the symbolic policy on the JAX BabyAI env: the privileged teacher's ``teacher_topk``
signal (K_T = 6) at the rollout's states, the ``lvopd`` term (the MLP's output layer as the LM
head) against a numpy reference, zero where the gate is zero, and a 2-iteration trainer run
that resumes exactly."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.envs.babyai.value import distance_field
from jaxdm.rl import babyai_teacher as bt
from jaxdm.rl import lvopd
from jaxdm.rl.signals import SIGNALS
from jaxdm.rl.symbolic import SymbolicMLPPolicy
from jaxdm.rl.terms import LOSS_TERMS, LossConfig, TermContext
from jaxdm.rl.trainer import TrainConfig, Trainer
from tests.rl.test_rl_jax_trainer import _leaves_equal, tiny

# noisy Oracle values: with 6 actions the plain Oracle is 0 at every state (no gate opens)
LVOPD = ("algo.advantage=lvrl", "value={kind: oracle, noise: 0.1}",
         "teacher.kind=babyai_privileged", "algo.terms={lvopd: 1.0}")


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory):
    """A random (untrained) teacher saved as a checkpoint: the tests check plumbing and
    numbers, not teaching quality (tests/rl/test_rl_babyai_teacher.py trains one)."""
    path = tmp_path_factory.mktemp("teacher") / "teacher.npz"
    bt.save_teacher(bt.init_teacher(jax.random.key(7), hidden=8), path)
    return path


def test_teacher_topk_is_the_teachers_log_probs_at_the_rollout_states(teacher_file, tmp_path):
    cfg = tiny(tmp_path / "r", *LVOPD, f"teacher.path={teacher_file}")
    tr = Trainer(cfg, log=False)
    eb, _ = tr.collector.collect(tr.params, jax.random.key(3), 0)
    sig = SIGNALS.get("teacher_topk").produce(eb, tr.signal_backends["teacher_topk"], cfg)
    tr.close()
    n = len(eb.units)
    assert sig.arrays["logprobs"].shape == sig.arrays["ids"].shape == (n, 6)   # K_T = 6
    np.testing.assert_array_equal(sig.arrays["ids"], np.tile(np.arange(6), (n, 1)))
    np.testing.assert_array_equal(sig.arrays["offsets"], np.arange(n + 1))
    assert sig.arrays["unit_ok"].all() and sig.stats["teacher_topk/tokens"] == n
    # Independently: each unit's state from the recorded batch; its observation row must be
    # the one the policy acted on, and the teacher's log-probs there (distance field of the
    # episode's first state) must be the signal's.
    states, rows, cols = eb.recorded.states, eb.unit_rows, eb.unit_cols
    at = jax.tree.map(lambda x: x[rows, cols], states)
    first = jax.tree.map(lambda x: x[rows, 0], states)
    spec, params = tr.collector.spec, bt.load_teacher(teacher_file)

    @jax.jit
    def check(at, first):
        obs_rows = jax.vmap(lambda s: spec.obs_row(spec.env.get_obs(s), s))(at)
        lp = jax.vmap(lambda s, s0: jax.nn.log_softmax(
            bt.teacher_logits(params, s, distance_field(s0))))(at, first)
        return obs_rows, lp

    obs_rows, lp = check(at, first)
    np.testing.assert_array_equal(np.asarray(obs_rows), eb.units[:, :-1])
    np.testing.assert_allclose(sig.arrays["logprobs"], np.asarray(lp), rtol=1e-5, atol=1e-5)


def _small_policy():
    return SymbolicMLPPolicy(features=lambda r: r.astype(jnp.float32) / 3.0, row_width=3,
                             feature_dim=3, num_actions=6, hidden=(5,), temperature=1.3)


def _numpy_term(params, rows, w, teacher_lp, temp):
    """Value and gradient of Σ_i w_i KL(π_i ‖ τ_i) / #units in float64 numpy (backprop by hand
    through the 1-hidden-layer tanh MLP)."""
    p = [{k: np.asarray(v, np.float64) for k, v in layer.items()} for layer in params]
    x = rows.astype(np.float64) / 3.0
    h = np.tanh(x @ p[0]["w"] + p[0]["b"])
    z = (h @ p[1]["w"] + p[1]["b"]) / temp
    logp = z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - \
        z.max(1, keepdims=True)
    pr = np.exp(logp)
    d = logp - teacher_lp
    kl = (pr * d).sum(1)
    n = len(rows)
    loss = (w * kl).sum() / n
    dz = (w / n)[:, None] * pr * (d - kl[:, None])        # d KL / d z for full support
    dz /= temp
    grads = [{"w": x.T @ ((dz @ p[1]["w"].T) * (1 - h ** 2)),
              "b": ((dz @ p[1]["w"].T) * (1 - h ** 2)).sum(0)},
             {"w": h.T @ dz, "b": dz.sum(0)}]
    return loss, grads


def _term_batch(policy, rows, chosen, w, teacher_lp):
    units = np.concatenate([rows, chosen[:, None]], 1)
    lists = [lvopd.TeacherTopK(np.arange(6, dtype=np.int32)[None], lp[None].astype(np.float32))
             for lp in teacher_lp]
    arrays = lvopd.lvopd_unit_arrays(units, w, lists, len(units), 6, form="symbolic")
    return {"policy": policy.training_batch(units, len(units)), **arrays}


def test_symbolic_lvopd_term_matches_numpy_and_is_zero_where_the_gate_is_zero():
    policy = _small_policy()
    params = policy.init_params(jax.random.key(0))
    params[-1]["w"] = params[-1]["w"] * 20.0              # a non-uniform student
    rng = np.random.default_rng(0)
    n = 7
    rows = rng.integers(0, 4, (n, 3)).astype(np.int32)
    chosen = rng.integers(0, 6, n).astype(np.int32)
    teacher_lp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(0, 2, (n, 6)))))
    w = np.array([0.0, 1.5, 0.3, 0.0, 2.0, 1.0, 0.7], np.float32)
    batch = _term_batch(policy, rows, chosen, w, teacher_lp)
    assert batch["lvopd/positions"].shape == (n, 1)                  # one "token" per unit
    aux = TermContext(policy, None, LossConfig(terms=(("ppo", 1.0), ("lvopd", 1.0))))
    term = LOSS_TERMS.get("lvopd").fn

    def f(p, b):
        return term({"policy": p}, b, aux)[0]

    vg = jax.jit(jax.value_and_grad(f))  # one program for every call below
    val, grads = vg(params, batch)
    ref, ref_grads = _numpy_term(params, rows, w, teacher_lp, policy.temperature)
    np.testing.assert_allclose(float(val), ref, rtol=2e-5)
    for g, rg in zip(grads, ref_grads):
        for k in ("w", "b"):
            np.testing.assert_allclose(np.asarray(g[k]), rg[k], rtol=1e-4, atol=1e-7)
    # the train step's shared forward gives the same value
    shared = {**batch, "policy/hidden": policy.hidden_states(params, batch["policy"])}
    np.testing.assert_allclose(float(jax.jit(f)(params, shared)), ref, rtol=2e-5)
    # zero where the gate is zero: a gated-off unit's teacher lists do not matter ...
    other = teacher_lp.copy()
    other[[0, 3]] = other[[0, 3]][:, ::-1]
    moved = _term_batch(policy, rows, chosen, w, other)
    np.testing.assert_allclose(float(vg(params, moved)[0]), float(val), rtol=1e-6)
    # ... and with every gate 0 the term and its gradient vanish
    zero = _term_batch(policy, rows, chosen, np.zeros(n, np.float32), teacher_lp)
    v0, g0 = vg(params, zero)
    assert float(v0) == 0.0
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g0))


def test_lvopd_on_babyai_jax_runs_and_resumes_exactly(teacher_file, tmp_path):
    extra = (*LVOPD, f"teacher.path={teacher_file}", "checkpoint_every=0")  # exit checkpoints
    full = Trainer(tiny(tmp_path / "full", *extra), log=False)
    recs = full.run()
    assert len(recs) == 2
    for r in recs:
        assert r["teacher_topk/failures"] == 0.0 and r["teacher_topk/tokens"] > 0
        assert np.isfinite(r["loss/lvopd"]) and r["loss/lvopd"] > 0.0
        assert 0.0 < r["lvopd/gated_token_fraction"] < 1.0        # max(0, −Â): some gated
    part = Trainer(tiny(tmp_path / "part", *extra), log=False)
    part.run(stop_after=1)
    part.close()
    resumed = Trainer(tiny(tmp_path / "part", *extra), log=False)
    resumed.run(resume=True)
    assert resumed.iteration == 2
    _leaves_equal(full.state.params, resumed.state.params)
    _leaves_equal(full.state.opt_states, resumed.state.opt_states)
    full.close()
    resumed.close()


@pytest.mark.parametrize("overrides, key", [
    (("teacher.kind=babyai_privileged", "policy.kind=text", "env.name=toy_ordering"),
     "teacher.kind"),
    (("teacher.kind=nope",), "teacher.kind"),
    (("teacher.kind=babyai_privileged", "policy.kind=text", "env.name=toy_ordering",
      "teacher.kind=local_readout", "teacher.path=x", "policy.form=option"), "policy.form"),
])
def test_bad_teacher_config_names_the_key(overrides, key, tmp_path):
    with pytest.raises(cfgmod.ConfigError, match=key):
        cfgmod.load_config(TrainConfig, None, [
            "policy.kind=symbolic_mlp",
            "env.name=babyai_jax", "env.kwargs={room_size: 7, compass: true}",
            "algo.advantage=lvrl", "value={kind: oracle}", "algo.terms={lvopd: 1.0}",
            f"out_dir={tmp_path}", *overrides])


def test_teacher_checkpoint_errors_name_teacher_path(tmp_path):
    with pytest.raises(ValueError, match="teacher.path: no teacher checkpoint"):
        Trainer(tiny(tmp_path / "r", *LVOPD, f"teacher.path={tmp_path / 'missing.npz'}"),
                log=False)
    bad = tmp_path / "bad.npz"
    np.savez(bad, format=np.int64(1), **{"layer0/w": np.zeros((3, 6), np.float32),
                                         "layer0/b": np.zeros((6,), np.float32)})
    with pytest.raises(ValueError, match="teacher.path: .*layer0 has w"):
        bt.load_teacher(bad)


def test_tail_bucket_config_reaches_the_term(teacher_file, tmp_path):
    """algo.lvopd_tail_bucket -> LossConfig.distill_tail -> the lvopd term. The symbolic
    policy's support is every action (k = K_T = V = 6), so its tail is empty and the bucketed
    term equals the plain one; a bad value names the key."""
    base = ["policy.kind=symbolic_mlp", "env.name=babyai_jax",
            "env.kwargs={room_size: 7, compass: true}", "algo.advantage=lvrl",
            "value={kind: oracle}", "algo.terms={lvopd: 1.0}", "teacher.kind=babyai_privileged",
            f"teacher.path={teacher_file}", f"out_dir={tmp_path}"]
    cfg = cfgmod.load_config(TrainConfig, None, [*base, "algo.lvopd_tail_bucket=true"])
    assert cfg.loss_config().distill_tail is True
    assert cfgmod.load_config(TrainConfig, None, base).loss_config().distill_tail is False
    with pytest.raises(cfgmod.ConfigError, match="lvopd_tail_bucket"):
        cfgmod.load_config(TrainConfig, None, [*base, "algo.lvopd_tail_bucket=maybe"])
    policy = _small_policy()
    params = policy.init_params(jax.random.key(1))
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 4, (5, 3)).astype(np.int32)
    batch = _term_batch(policy, rows, rng.integers(0, 6, 5).astype(np.int32),
                        np.ones(5, np.float32),
                        np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(0, 2, (5, 6))))))
    vals = [float(LOSS_TERMS.get("lvopd").fn({"policy": params}, batch, TermContext(
        policy, None, LossConfig(terms=(("ppo", 1.0), ("lvopd", 1.0)), distill_tail=t)))[0])
        for t in (False, True)]
    np.testing.assert_allclose(vals[1], vals[0], rtol=1e-6)


def test_gate_slots_length_is_a_power_of_two_capacity():
    w = np.array([0.0, 0.5, 0.2, 0.0], np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], bool)
    slots = lvopd.gate_slots(w, mask, minimum=1)              # 3 + 1 gated-on tokens
    assert slots.tolist() == [True, True, True, True]
    assert lvopd.gate_slots(w, mask).tolist() == [True] * 4 + [False] * 4   # minimum 8
    # 9 tokens on: the next power of two, 16, is more than the 12 slots: capped
    assert len(lvopd.gate_slots(np.ones(4, np.float32), mask, minimum=1)) == 12
    assert lvopd.gate_slots(np.ones(4, np.float32), mask, minimum=1).sum() == 9
    assert len(lvopd.gate_slots(np.zeros(4, np.float32), mask)) == 8


def test_gate_in_kernel_term_equals_the_numpy_reference():
    """The lvopd term with the gate inside the kernel (LossConfig.distill_gate_in_kernel, the
    batch's lvopd/gate_slots as capacity): the float64 value and gradient, with the gated-off
    units (w = 0) never computed."""
    policy = _small_policy()
    params = policy.init_params(jax.random.key(2))
    rng = np.random.default_rng(2)
    rows = rng.integers(0, 4, (7, 3)).astype(np.int32)
    w = np.array([0.0, 1.3, 0.0, 0.4, 0.0, 0.0, 2.0], np.float32)
    tlp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(0, 2, (7, 6)))))
    batch = _term_batch(policy, rows, rng.integers(0, 6, 7).astype(np.int32), w, tlp)
    batch["lvopd/gate_slots"] = lvopd.gate_slots(batch["lvopd/weights"], batch["lvopd/mask"],
                                                 minimum=1)
    assert batch["lvopd/gate_slots"].tolist() == [True, True, True, False]   # 3 on, capacity 4
    aux = TermContext(policy, None, LossConfig(terms=(("ppo", 1.0), ("lvopd", 1.0)),
                                               distill_gate_in_kernel=True))

    def f(p):
        return LOSS_TERMS.get("lvopd").fn({"policy": p}, batch, aux)

    (val, met), grads = jax.value_and_grad(f, has_aux=True)(params)
    want, want_grads = _numpy_term(params, rows, w, tlp, 1.3)
    np.testing.assert_allclose(float(val), want, rtol=1e-5)
    for g, gw in zip(grads, want_grads):
        for k in ("w", "b"):
            np.testing.assert_allclose(np.asarray(g[k]), gw[k], rtol=1e-4, atol=1e-7)
    assert "lvopd/kl_mean_gated" in met and "lvopd/kl_mean" not in met
    del batch["lvopd/gate_slots"]
    with pytest.raises(ValueError, match="lacks 'lvopd/gate_slots'"):
        f(params)


def test_gate_in_kernel_trains_the_same_run(teacher_file, tmp_path):
    """algo.lvopd_gate_in_kernel: the lvopd term's kernel computes only the gated-on tokens
    (each mini-batch's lvopd/gate_slots gives the capacity); the losses of a two-iteration run
    equal the ungated one's; the KL metric is over the gated tokens."""
    extra = (*LVOPD, f"teacher.path={teacher_file}", "checkpoint_every=0")
    plain = Trainer(tiny(tmp_path / "plain", *extra), log=False)
    gated = Trainer(tiny(tmp_path / "gated", *extra, "algo.lvopd_gate_in_kernel=true"),
                    log=False)
    assert gated.cfg.loss_config().distill_gate_in_kernel is True
    r0, r1 = plain.run(), gated.run()
    # (Adam turns summation-order noise in near-zero gradients into visible parameter
    # differences, so the run is compared by its losses; the term's gradients are checked
    # against float64 above)
    for a, b in zip(r0, r1):
        for key in ("loss/lvopd", "loss/total", "optim/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4)
        assert "lvopd/kl_mean_gated" in b and "lvopd/kl_mean" not in b
        assert b["lvopd/kl_mean_gated"] >= 0.0
    plain.close()
    gated.close()
