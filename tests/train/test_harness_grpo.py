"""Harness GRPO: the reward on hand cases (and under jit); a 1-iteration smoke with the tiny
decision model: the sampled tool choices are the executed ones, rewards follow the formula,
the registered grpo estimator and ppo term update the parameters."""
import json

import jax
import numpy as np
import pytest

from jaxdm.train.harness_grpo import (HarnessGRPO, HarnessGRPOConfig, harness_reward,
                                      rollout)


def test_harness_reward_hand_cases():
    # r = success - 0.5 * max(0, C - 10) / 10 - 0.2 * E
    success = [1, 1, 0, 0, 1]
    calls = [5, 15, 30, 10, 10]
    errors = [0, 0, 1, 0, 1]
    want = [1.0, 0.75, -1.2, 0.0, 0.8]
    np.testing.assert_allclose(harness_reward(success, calls, errors), want, atol=1e-6)
    np.testing.assert_allclose(jax.jit(harness_reward)(np.array(success), np.array(calls),
                                                       np.array(errors)), want, atol=1e-6)
    # other constants
    assert float(harness_reward(1, 14, 0, lam=1.0, n0=4, eta=0.0)) == pytest.approx(-1.5)
    with pytest.raises(ValueError, match="one shape"):
        harness_reward([1, 0], [3], [0, 0])
    with pytest.raises(ValueError, match="n0"):
        harness_reward(1, 3, 0, n0=0)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="group_size"):
        HarnessGRPOConfig(group_size=0)
    with pytest.raises(ValueError, match="lam"):
        HarnessGRPOConfig(lam=float("nan"))


TINY = dict(model="tiny", iterations=1, tasks_per_iter=1, group_size=2, max_steps=3,
            hidden_size=16, num_layers=1, max_context_tokens=32, max_option_tokens=2,
            mini_batch=8, eval_tasks=0, lr=1e-2)


def test_one_iteration_smoke(tmp_path):
    g = HarnessGRPO(HarnessGRPOConfig(out_dir=str(tmp_path), **TINY))
    # the policy's sampled choices are the executed tool choices, one per DM call
    eps, rows = rollout(g.policy, g.params, g.cfg, "train", [3], jax.random.key(1),
                        group_size=2)
    for ep, row in zip(eps, rows):
        assert len(ep.actions) == row["dm_calls"] >= 1
        assert ep.reward == pytest.approx(float(harness_reward(
            float(row["success"]), row["llm_calls"], row["irreversible_errors"])))
        assert all(a.out.unit["chosen"] < len(a.out.unit["options"]) for a in ep.actions)
    before = jax.tree.leaves(g.params)
    met = g.step()
    assert met["iteration"] == 1 and met["decisions"] >= 2 and met["ppo/updates"] >= 1
    assert np.isfinite(met["loss/total"]) and np.isfinite(met["optim/grad_norm"])
    after = jax.tree.leaves(g.params)
    moved = any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(before, after))
    # GRPO moves the parameters iff some group has reward variance
    assert moved == (met["groups_with_signal"] > 0)
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["iteration"] == 1


def test_a_second_run_never_appends_to_the_first(tmp_path):
    from jaxdm.train.harness_grpo import train
    (tmp_path / "metrics.jsonl").write_text('{"eval": "before"}\n')
    with pytest.raises(FileExistsError, match="metrics.jsonl"):
        train(HarnessGRPOConfig(out_dir=str(tmp_path), **TINY))
    assert (tmp_path / "metrics.jsonl").read_text() == '{"eval": "before"}\n'
