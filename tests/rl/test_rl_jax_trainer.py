"""The trainer on the pure-JAX BabyAI env (policy.kind symbolic_mlp, rollout kind jax): GRPO,
PPO (MLP critic, GAE) and LVRL (Oracle values) run through the same update loop, and a run
killed after iteration 1 and resumed equals the uninterrupted one; the rollout's batch and
key schedule; config validation names the key."""
import jax
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.envs.core import step_key
from jaxdm.rl.trainer import TrainConfig, Trainer

METHODS = {
    "grpo": ("algo.advantage=grpo",),
    "gae": ("algo.advantage=gae", "critic.kind=mlp"),
    "lvrl": ("algo.advantage=lvrl", "value={kind: oracle, noise: 0.1}"),
}


def tiny(out, *extra):
    return cfgmod.load_config(TrainConfig, None, [
        "policy.kind=symbolic_mlp", "policy.mlp_hidden=[16]", "env.name=babyai_jax",
        "env.kwargs={room_size: 7, compass: true}", "teacher.kind=none", "tasks_per_iter=2",
        "group_size=3", "max_actions=6", "algo.mini_batch=8", "algo.ppo_epochs=2",
        "algo.kl_coef=0", "optim.lr=0.01", "eval_tasks=0", "iterations=2", "progress=false",
        "checkpoint_every=1", f"out_dir={out}", *extra])


def _leaves_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_jax_env_trainer_runs_and_resumes_exactly(method, tmp_path):
    extra = METHODS[method]
    full = Trainer(tiny(tmp_path / "full", *extra), log=False)
    p0 = full.state.params
    recs = full.run()
    assert len(recs) == 2 and all(np.isfinite(r["loss/total"]) for r in recs)
    assert recs[0]["rollout/env_steps"] > 0 and recs[0]["ppo/updates"] >= 2
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(full.state.params)))
    assert moved > 1e-5
    if method == "lvrl":
        assert recs[0]["value/failures"] == 0 and recs[0]["value/requests"] == 6
    if method == "gae":
        assert "critic" in full.state.params and np.isfinite(recs[0]["loss/value"])
    part = Trainer(tiny(tmp_path / "part", *extra), log=False)
    part.run(stop_after=1)
    assert part.iteration == 1
    part.close()
    resumed = Trainer(tiny(tmp_path / "part", *extra), log=False)
    resumed.run(resume=True)
    assert resumed.iteration == 2 and resumed.cursor == full.cursor == 4
    _leaves_equal(full.state.params, resumed.state.params)
    _leaves_equal(full.state.opt_states, resumed.state.opt_states)
    np.testing.assert_array_equal(jax.random.key_data(full.state.key),
                                  jax.random.key_data(resumed.state.key))
    assert full.state.host_rng.bit_generator.state == resumed.state.host_rng.bit_generator.state
    full.close()
    resumed.close()


def test_jax_rollout_batch_matches_its_arrays(tmp_path):
    """EpisodeBatch from the scan: units = (observation row, action) of the executed steps in
    row-major order, rewards on the last step, groups, the recorded oracle values, and the
    step key schedule of envs.core.step_key."""
    from jaxdm.rl.jax_rollout import step_key_data

    tr = Trainer(tiny(tmp_path / "b", *METHODS["lvrl"]), log=False)
    eb, met = tr.collector.collect(tr.params, jax.random.key(3), 11)
    b, t = eb.mask.shape
    assert (b, t) == (6, 6) and eb.groups.tolist() == [0, 0, 0, 1, 1, 1]
    n = eb.mask.sum(1)
    assert len(eb.units) == n.sum() == met["rollout/env_steps"]
    # executed actions are a prefix of each row; units are row-major
    assert all(eb.mask[i, :n[i]].all() and not eb.mask[i, n[i]:].any() for i in range(b))
    assert eb.unit_rows.tolist() == [i for i in range(b) for _ in range(n[i])]
    width = tr.policy.row_width
    assert eb.units.shape == (n.sum(), width + 1)
    assert set(eb.units[:, width].tolist()) <= set(range(tr.policy.num_actions))
    # the sampling log-probs equal the policy's log-probs of the recorded rows
    batch = tr.policy.training_batch(eb.units, len(eb.units))
    logp = np.asarray(tr.policy.logp_and_entropy(tr.params, batch)[0])[:, 0]
    np.testing.assert_allclose(logp, eb.unit_logp, atol=1e-5)
    for i in range(b):
        tj = eb.trajectories[i]
        assert len(tj.steps) == n[i] and tj.reward == eb.outcome[i]
        assert len(tj.metadata["oracle_values"]) == n[i] + 1
        assert eb.step_rewards[i, n[i] - 1] == eb.outcome[i]
    kd = step_key_data([11, 12], 6)
    k = (int(kd[5, 1, 0]) << 32) | int(kd[5, 1, 1])
    assert k == step_key(12, 5)
    tr.close()


@pytest.mark.parametrize("overrides,key", [
    (("policy.kind=symbolic", "env.name=babyai_jax"), "policy.kind"),
    (("policy.kind=symbolic_mlp", "env.name=toy_ordering"), "env.name"),
    (("policy.kind=symbolic_mlp", "env.name=babyai_jax", "algo.advantage=gigpo"),
     "algo.advantage"),
    (("policy.kind=symbolic_mlp", "env.name=babyai_jax", "algo.advantage=gae",
      "critic.kind=decoder"), "critic.kind"),
    (("policy.kind=symbolic_mlp", "env.name=babyai_jax", "algo.advantage=lvrl",
      "value={kind: list, generator: {path: smollm2}}"), "value.kind"),
    (("algo.advantage=gae", "critic.kind=mlp"), "critic.kind"),
    (("algo.advantage=gae", "critic.kind=lstm"), "critic.kind"),
])
def test_bad_policy_env_combinations_name_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        cfgmod.load_config(TrainConfig, None, ["teacher.kind=none", "algo.advantage=grpo",
                                               *overrides])
