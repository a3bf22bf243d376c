"""Potential-based shaping as a control for LVRL (issue 40 §4): the shaped step rewards and
GRPO with step rewards against hand computations, and the two registered estimators
(``grpo_shaped``, ``gae_shaped``) training through the trainer on the JAX BabyAI env."""
import numpy as np
import pytest

from jaxdm.rl import advantages as adv
from jaxdm.rl.estimators import ESTIMATORS
from jaxdm.rl.trainer import Trainer
from tests.rl.test_rl_jax_trainer import tiny


def test_shaped_rewards_move_credit_and_keep_the_total():
    rewards = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    phi = np.array([[0.5, 0.6, 0.8, 0.9, 0.3], [0.4, 0.2, 0.1, 0.7, 0.9]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    got = np.asarray(adv.potential_shaped_rewards(rewards, phi, mask))
    # row 0: 3 actions, Φ(s_3) := 0 after the last; row 1: 4 actions, Φ(s_4) := 0
    want = np.array([[0.6 - 0.5, 0.8 - 0.6, 1.0 + 0.0 - 0.8, 0.0],
                     [0.2 - 0.4, 0.1 - 0.2, 0.7 - 0.1, 0.0 - 0.7]], np.float32)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), rewards.sum(1) - phi[:, 0], atol=1e-6)
    g = np.asarray(adv.potential_shaped_rewards(rewards, phi, mask, gamma=0.9))
    np.testing.assert_allclose(g[0, :3], [0.9 * 0.6 - 0.5, 0.9 * 0.8 - 0.6, 1.0 - 0.8],
                               atol=1e-6)
    with pytest.raises(ValueError, match=r"potentials must have shape \[B, T\+1\]=\[2, 5\]"):
        adv.potential_shaped_rewards(rewards, phi[:, :4], mask)


def test_process_grpo_sums_group_normalised_step_rewards():
    r = np.array([[0.1, 0.2, 0.7], [-0.2, 0.0, 0.0], [0.3, 0.3, 0.3], [0.5, 0.1, 0.0]],
                 np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    groups = np.array([0, 0, 1, 1], np.int32)
    got = np.asarray(adv.process_grpo_advantages(r, groups, mask, num_groups=2, eps=0.0))
    want = np.zeros_like(r)
    for g in (0, 1):
        rows = groups == g
        vals = r[rows][mask[rows]]
        mu, sd = vals.mean(), vals.std(ddof=1)
        for i in np.flatnonzero(rows):
            n = mask[i].sum()
            normed = (r[i, :n] - mu) / sd
            want[i, :n] = np.cumsum(normed[::-1])[::-1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    same = np.asarray(adv.process_grpo_advantages(np.ones_like(r), groups, mask, num_groups=2))
    assert np.all(same == 0.0)


def _tiny(out, *extra):
    # the trainer test's tiny run, one iteration of one epoch, with Oracle values to shape by
    return tiny(out, "algo.ppo_epochs=1", "iterations=1", "value={kind: oracle}", *extra)


@pytest.mark.parametrize("method,extra", [("grpo_shaped", ()), ("gae_shaped", ("critic.kind=mlp",))])
def test_shaped_estimators_train_through_the_trainer(method, extra, tmp_path):
    assert "values" in ESTIMATORS[method].needs
    tr = Trainer(_tiny(tmp_path / method, f"algo.advantage={method}", *extra), log=False)
    [rec] = tr.run()
    assert np.isfinite(rec["loss/total"]) and rec["value/requests"] == 6
    assert rec["shaping/unshaped_rows"] == 0
    if method == "gae_shaped":
        assert "critic" in tr.state.params and np.isfinite(rec["loss/value"])
