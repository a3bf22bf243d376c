"""Registered stages: GAE, the clipped value loss, registries and config validation, PPO with
a learned critic (exact resume), errored episodes."""
import re

import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.rl import advantages as advmod
from jaxdm.rl import losses
from jaxdm.rl.estimators import ESTIMATORS, episode_batch, register_estimator
from jaxdm.rl.signals import register_signal
from jaxdm.rl.terms import LOSS_TERMS, LossConfig
from jaxdm.rl.trainer import TrainConfig


def gae_numpy(r, v, mask, gamma, lam, boot):
    b, t = mask.shape
    adv = np.zeros((b, t))
    for i in range(b):
        n = int(mask[i].sum())
        last = 0.0
        for k in reversed(range(n)):
            nxt = v[i, k + 1] if (k + 1 < n or boot[i]) else 0.0
            delta = r[i, k] + gamma * nxt - v[i, k]
            last = delta + gamma * lam * (last if k + 1 < n else 0.0)
            adv[i, k] = last
    return adv, np.where(mask, adv + v[:, :-1], 0.0)


def test_gae_matches_numpy_on_ragged_rows():
    rng = np.random.default_rng(0)
    b, t = 7, 6
    lengths = np.array([0, 1, 6, 3, 2, 6, 4])  # empty, single-step, full rows
    mask = np.arange(t)[None] < lengths[:, None]
    r = rng.normal(size=(b, t)).astype(np.float32)
    v = rng.normal(size=(b, t + 1)).astype(np.float32)
    boot = np.array([0, 1, 1, 0, 0, 0, 1], bool)  # truncated rows bootstrap V(s_T)
    for gamma, lam in ((1.0, 0.95), (0.9, 0.0), (0.99, 1.0)):
        adv, ret = advmod.gae_advantages(r, v, mask, gamma=gamma, lam=lam, bootstrap=boot)
        want_a, want_r = gae_numpy(r, v, mask, gamma, lam, boot)
        np.testing.assert_allclose(np.asarray(adv), want_a, atol=1e-5)
        np.testing.assert_allclose(np.asarray(ret), want_r, atol=1e-5)
        assert not np.asarray(adv)[~mask].any()
    # hand-computed: one terminal row, r = [0, 1], V = [0.5, 0.2, 9 (ignored)], γ = λ = 1:
    # δ1 = 1 − 0.2 = 0.8, δ0 = 0 + 0.2 − 0.5 = −0.3; A = [0.5, 0.8]
    a, _ = advmod.gae_advantages(np.array([[0.0, 1.0]]), np.array([[0.5, 0.2, 9.0]]),
                                 np.array([[True, True]]), gamma=1.0, lam=1.0)
    np.testing.assert_allclose(np.asarray(a), [[0.5, 0.8]], atol=1e-6)
    with pytest.raises(ValueError, match=r"values must have shape \[B, T\+1\]=\[1, 3\]"):
        advmod.gae_advantages(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2), bool))


def test_clipped_value_loss_hand_computed():
    v = np.array([1.0, 0.0, 0.5], np.float32)
    old = np.array([0.5, 0.0, 0.0], np.float32)
    ret = np.array([1.0, 1.0, 0.0], np.float32)
    mask = np.array([True, True, False])
    # row 0: err 0, clipped V = 0.7, err_clip 0.09 -> 0.09 (clipped); row 1: err 1, same -> 1
    loss, met = losses.clipped_value_loss(v, old, ret, mask, clip=0.2)
    assert float(loss) == pytest.approx(0.5 * (0.09 + 1.0) / 2)
    assert float(met["value/clip_frac"]) == pytest.approx(0.5)
    loss0, _ = losses.clipped_value_loss(v, old, ret, mask, clip=0.0)
    assert float(loss0) == pytest.approx(0.5 * (0.0 + 1.0) / 2)


def tiny(tmp_path, *extra):
    from tests.rl import test_rl_trainer as base
    return base.ordering_cfg(tmp_path, *extra)


def test_registries_refuse_unknown_names_and_missing_signals(tmp_path):
    bad = [("algo.advantage=nope", "algo.advantage: unknown estimator 'nope'"),
           ("algo.advantage=gae", "critic.kind"),
           ("teacher.kind=none", "teacher.kind"),
           ("teacher.kind=local", "teacher.kind: unknown teacher kind 'local'; known: "
            "['babyai_privileged', 'local_likelihood', 'local_readout', 'none', 'oracle', "
            "'prompted', 'remote']"),
           ("teacher.question=vibes",
            "teacher.question: unknown question 'vibes'; known: ['progress', 'value']"),
           ("critic.kind=big", "critic.kind: unknown critic 'big'; known: ['decoder', 'mlp', "
            "'none']"),
           ("policy.kind=lstm", "policy.kind: unknown policy kind 'lstm'; known: ["),
           ("algo.lvopd_gate=soft", "algo.lvopd_gate: unknown gate 'soft'; known: ['lvopd', "
            "'pure', 'trajectory']"),
           ("algo.aggregation=sum", "algo.aggregation: unknown aggregation mode 'sum'; known: "
            "['seq-mean-token-mean', 'seq-mean-token-sum', 'token-mean']"),
           ("algo.terms={nope: 1.0}", "algo.terms: unknown loss term 'nope'"),
           ("algo.terms={value: 1.0}", "algo.terms.value"),
           ("algo.lvrl_normalize=zscore", "algo.lvrl_normalize")]
    for override, msg in bad:
        with pytest.raises(cfgmod.ConfigError, match=re.escape(msg)):
            cfgmod.load_config(TrainConfig, None, [override])
    with pytest.raises(ValueError, match="unknown loss term"):
        LossConfig(terms=(("nope", 1.0),))
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo", lambda *a: None)
    with pytest.raises(ValueError, match="already registered"):
        register_signal("teacher_scores", lambda *a: None)
    assert {"grpo", "teacher", "gigpo", "gae", "lvrl"} <= set(ESTIMATORS)
    assert {"ppo", "value"} <= set(LOSS_TERMS) and LOSS_TERMS["value"].needs_critic
    cfg = cfgmod.load_config(TrainConfig, None, ["algo.advantage=gae", "critic.kind=decoder"])
    assert cfg.loss_config().terms == (("ppo", 1.0), ("value", 0.5))


def test_errored_episodes_are_excluded_and_counted(tmp_path):
    """issue 15 #11: an episode lost to an env error is masked out of every estimator (its
    group is computed over the rest) and not trained on."""
    from jaxdm.rl.policy import ActionOut
    from jaxdm.rl.rollout import ActionRecord, EpisodeRecord

    def ep(group, reward, n, error=None):
        acts = [ActionRecord("o", ActionOut("a", True, "a", -1.0, {"context": [1]}), "a", 0.0,
                             {}, True) for _ in range(n)]
        return EpisodeRecord(slot=0, group=group, task_seed=group, goal="g", task_type="t",
                             budget=5, actions=acts, reward=reward, success=reward > 0,
                             error=error)
    eps = [ep(0, 1.0, 2), ep(0, 0.0, 2), ep(0, 0.0, 3, error="worker died"), ep(1, 1.0, 1),
           ep(1, 0.0, 1)]
    eb = episode_batch(eps, 4, 0.1)
    assert eb.errored.tolist() == [False, False, True, False, False]
    assert not eb.mask[2].any() and len(eb.units) == 2 + 2 + 1 + 1
    cfg = cfgmod.load_config(TrainConfig, None, ["algo.advantage=grpo", "teacher.kind=none"])
    adv = ESTIMATORS["grpo"].fn(eb, {}, cfg.algo, 2).adv
    # group 0 over the two kept rows only: returns 1,1,0,0 -> ±(0.5 / std(ddof=1)=0.577)
    np.testing.assert_allclose(adv[0, :2], 0.5 / np.std([1, 1, 0, 0], ddof=1), rtol=1e-5)
    assert not adv[2].any()
    without = episode_batch([eps[i] for i in (0, 1, 3, 4)], 4, 0.1)
    np.testing.assert_allclose(ESTIMATORS["grpo"].fn(without, {}, cfg.algo, 2).adv,
                               adv[[0, 1, 3, 4]], rtol=1e-6)


def test_ppo_with_critic_trains_and_resumes_exactly(tmp_path):
    """PPO + learned critic (GAE): the value loss falls in use, the critic moves, and a run
    killed after iteration 1 and resumed equals the uninterrupted one (critic included)."""
    import jax

    from jaxdm.rl.trainer import Trainer
    extra = ("algo.advantage=gae", "critic.kind=decoder", "teacher.kind=none",
             "checkpoint_every=1", "iterations=2")
    full = Trainer(tiny(tmp_path / "full", *extra), log=False)
    critic0 = full.state.params["critic"]
    recs = full.run()
    assert all(np.isfinite(r["loss/value"]) and np.isfinite(r["optim/critic_grad_norm"])
               for r in recs)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
                zip(jax.tree.leaves(critic0), jax.tree.leaves(full.state.params["critic"])))
    assert moved > 1e-4
    part = Trainer(tiny(tmp_path / "part", *extra), log=False)
    part.run(stop_after=1)
    part.close()
    resumed = Trainer(tiny(tmp_path / "part", *extra), log=False)
    resumed.run(resume=True)
    for name in ("policy", "critic"):
        for a, b in zip(jax.tree.leaves(full.state.params[name]),
                        jax.tree.leaves(resumed.state.params[name])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(full.state.opt_states), jax.tree.leaves(
            resumed.state.opt_states)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    full.close()
    resumed.close()


def _ramp_values(episodes, backend, cfg):
    """A test value model: V(s_t) = t / (T_i + 1) per row (row 0 'fails')."""
    from jaxdm.rl.signals import Signal
    b, t = episodes.mask.shape
    n = episodes.mask.sum(1)
    values = (np.arange(t + 1)[None] / (n[:, None] + 1.0)).astype(np.float32)
    rows = np.ones((b,), bool)
    rows[0] = False
    return Signal({"values": values}, rows, {"value/requests": float(b)})


register_signal("test_ramp_values", _ramp_values)
register_estimator("test_lvrl", lambda eb, sig, algo, g: ESTIMATORS["lvrl"].fn(
    eb, {"values": sig["test_ramp_values"]}, algo, g), needs=("test_ramp_values",))


def test_lvrl_without_value_model_fails_naming_the_key():
    with pytest.raises(cfgmod.ConfigError, match=r"value(\.kind)?: .*'values' signal"):
        cfgmod.load_config(TrainConfig, None, ["algo.advantage=lvrl"])


def test_value_signal_estimator_trains_and_resumes_exactly(tmp_path):
    """A registered value signal reaches the LVRL estimator through the trainer (row 0 falls
    back to GRPO), and kill-after-1 + resume equals the uninterrupted run."""
    import jax

    from jaxdm.rl.trainer import Trainer
    extra = ("algo.advantage=test_lvrl", "teacher.kind=none", "checkpoint_every=1",
             "iterations=2")
    full = Trainer(tiny(tmp_path / "full", *extra), log=False)
    recs = full.run()
    assert recs[0]["lvrl/fallback_rows"] == 1.0 and recs[0]["value/requests"] == 8.0
    part = Trainer(tiny(tmp_path / "part", *extra), log=False)
    part.run(stop_after=1)
    part.close()
    resumed = Trainer(tiny(tmp_path / "part", *extra), log=False)
    resumed.run(resume=True)
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    full.close()
    resumed.close()
