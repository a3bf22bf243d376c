"""The one episode recorder: schedule, recording, auto-reset, the Trajectory builder and the
batch type (text rows and stacked JAX states), driven in-process with a tiny stub env."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.envs.core import Environment, seed_of, step_key
from jaxdm.envs.recorder import (EpisodeRecorder, RecordedBatch, play_episode, reset_info_of,
                                 to_trajectory)


@dataclasses.dataclass(frozen=True)
class TickState:
    task: int
    count: int = 0


class TickEnv(Environment):
    """Task k ends (won) after k % 3 + 1 "tick"s; any other action is invalid."""

    @property
    def default_params(self):
        return None

    def reset_info(self, state, params):
        return {"goal": f"tick {state.task % 3 + 1}", "task_type": "tick", "budget": 5}

    def reset_env(self, key, params):
        return "start", TickState(seed_of(key))

    def step_env(self, key, state, action, params):
        valid = action == "tick"
        new = dataclasses.replace(state, count=state.count + valid)
        won = new.count >= new.task % 3 + 1
        info = {"valid": valid, "won": won, "milestone": won, "no_op": not valid,
                "key": key}
        return f"count {new.count}", new, 0.5 if won else 0.0, won, info


def _reset(env, seed):
    obs, state = env.reset(seed)
    return ("ok", (obs, state, reset_info_of(env, state, None)))


def _play(rec, env, actions_per_step):
    """Drive ``rec`` like a pool does, in-process; returns the BatchSteps."""
    outs = []
    for actions in actions_per_step:
        keys = rec.stepping(actions)
        results = {i: ("ok", env.step(k, rec.episodes[i].state, actions[i]))
                   for i, k in keys.items()}
        outs.append(rec.collect(actions, results,
                                lambda jobs: {i: _reset(env, s) for i, s in jobs.items()}))
    return outs


def test_schedule_recording_and_trajectory():
    env, rec = TickEnv(), EpisodeRecorder(4, group_size=2, env_name="tick")
    seeds = rec.begin(10)
    assert seeds == {0: 10, 1: 10, 2: 11, 3: 11}
    for i, s in seeds.items():
        obs, info = rec.start(i, s, _reset(env, s))
        assert info["task_seed"] == s and info["goal"] == f"tick {s % 3 + 1}"
    # task 10 needs 2 ticks, task 11 needs 3; slot 1 skips once, slot 3 acts invalidly once
    outs = _play(rec, env, [["tick", None, "tick", "bad"], ["tick", "tick", "tick", "tick"]])
    assert outs[0].infos[1]["skipped"] and outs[0].rewards[1] == 0
    assert outs[1].dones.tolist() == [True, False, False, False]
    ep0, ep3 = rec.episodes[0], rec.episodes[3]
    # the one key schedule: step t of task s gets step_key(s, t), whoever else stepped
    assert [s.command for s in ep3.steps] == ["bad", "tick"]
    assert outs[1].infos[3]["key"] == step_key(11, 1)
    assert rec.episodes[1].step_key() == step_key(10, 1)
    assert ep3.steps[0].valid is False and ep3.steps[0].annotations == {"no_op": True,
                                                                        "milestone": False}
    assert ep0.done and ep0.success and ep0.reward == 0.5
    assert outs[1].infos[0]["trajectory"] is ep0.trajectory
    traj = ep0.trajectory
    assert [s.action for s in traj.steps] == ["tick", "tick"]
    assert [s.observation for s in traj.steps] == ["start", "count 1"]
    assert traj.final_observation == "count 2" and traj.env == "tick" and traj.budget == 5
    assert traj.metadata == {"task_seed": 10, "episode_id": 0}
    assert rec.pop_trajectories() == [traj] and rec.trajectories == []
    # a finished slot is inactive; replaying the recorded states reproduces them
    out = _play(rec, env, [["tick"] * 4])[0]
    assert out.infos[0]["inactive"] and out.dones[0]
    state = ep3.initial_state
    for t, s in enumerate(ep3.steps):
        _, state, *_ = env.step(step_key(ep3.task_seed, t), state, s.command)
        assert state == s.state
    # the rollout's view: its own budget, validity, truncation and metadata
    live = rec.episodes[3]
    view = to_trajectory(live, env="x", budget=3, truncated=True, valid=[True, False, True],
                         metadata={"group": 1})
    assert [s.valid for s in view.steps] == [False, False, True]  # env AND policy validity
    assert (view.env, view.budget, view.truncated, dict(view.metadata)) == ("x", 3, True,
                                                                             {"group": 1})
    with pytest.raises(ValueError, match="valid has 1 entries"):
        to_trajectory(live, valid=[True])


def test_max_steps_errors_and_auto_reset():
    env, rec = TickEnv(), EpisodeRecorder(2, max_steps=2, auto_reset=True)
    for i, s in rec.begin(2).items():  # tasks 2 (3 ticks) and 3 (1 tick)
        rec.start(i, s, _reset(env, s))
    out = _play(rec, env, [["tick", "tick"]])[0]
    # slot 1 won and was reset at once onto task 3 + 1 * num_groups = 5
    assert out.dones.tolist() == [False, True]
    assert out.infos[1]["final_info"]["won"] and out.infos[1]["final_observation"] == "count 1"
    assert rec.episodes[1].task_seed == 5 and out.infos[1]["reset_info"]["task_seed"] == 5
    assert out.states[1] == TickState(5)
    out = _play(rec, env, [["tick", "tick"]])[0]
    assert out.dones[0] and out.infos[0]["truncated"]  # max_steps=2 cut task 2
    first = rec.pop_trajectories()
    assert [t.metadata["task_seed"] for t in first] == [3, 2]
    assert first[1].truncated and not first[1].success and first[1].budget == 2
    # an env error ends the episode truncated with the error, a failed reset too
    obs, r, done, info = rec.advance(1, "tick", ("error", "Traceback: boom"))
    assert done and info["error"] == "Traceback: boom" and info["trajectory"].error
    assert rec.episodes[1].steps[-1].valid is False
    obs, info = rec.start(1, 9, ("error", "reset failed"))
    assert obs == "" and rec.episodes[1].done and rec.episodes[1].trajectory.truncated
    with pytest.raises(TypeError, match="seed must be an int"):
        rec.begin("3")
    with pytest.raises(ValueError, match="group_size"):
        EpisodeRecorder(3, group_size=2)


def test_batch_from_episodes():
    env, rec = TickEnv(), EpisodeRecorder(3)
    for i, s in rec.begin(0).items():  # tasks 0, 1, 2 need 1, 2, 3 ticks
        rec.start(i, s, _reset(env, s))
    _play(rec, env, [["tick"] * 3, ["bad", "tick", "tick"], ["tick"] * 3])
    batch = RecordedBatch.from_episodes(rec.episodes, 4)
    assert batch.lengths.tolist() == [1, 2, 3]
    assert batch.mask.tolist() == [[True, False, False, False], [True, True, False, False],
                                   [True, True, True, False]]
    assert batch.actions[1].tolist() == ["tick", "tick", "", ""]
    assert batch.dones.tolist() == [[True] + [False] * 3, [False, True, False, False],
                                    [False, False, True, False]]
    assert batch.rewards[2].tolist() == [0.0, 0.0, 0.5, 0.0]
    assert batch.outcome.tolist() == [0.5] * 3 and batch.success.all()
    assert batch.state(2, 0) == TickState(2) and batch.state(2, 3) == TickState(2, 3)
    assert [t.success for t in batch.trajectories()] == [True] * 3
    with pytest.raises(IndexError):
        batch.state(0, 2)
    with pytest.raises(ValueError, match="more than num_steps=2"):
        RecordedBatch.from_episodes(rec.episodes, 2)


def test_play_episode():
    env = TickEnv()
    ep = play_episode(env, 4, lambda state, obs: "bad" if state.count == 0 and obs == "start"
                      else "tick", env_name="tick")  # task 4 needs 2 ticks
    assert ep.done and ep.success and [s.command for s in ep.steps] == ["bad", "tick", "tick"]
    assert ep.steps[1].state == TickState(4, 1) and ep.task_seed == 4
    assert to_trajectory(ep).steps[0].valid is False
    cut = play_episode(env, 4, lambda state, obs: None if state.count else "tick")
    assert not cut.done and len(cut.steps) == 1 and not to_trajectory(cut).truncated
    capped = play_episode(env, 5, lambda state, obs: "bad", max_steps=3)
    assert capped.done and capped.truncated and len(capped.steps) == 3


def _array_batch(states, **over):
    b, t = 2, 3
    lengths = np.array([3, 1], np.int32)
    kw = dict(actions=np.zeros((b, t), np.int32), rewards=np.zeros((b, t), np.float32),
              dones=np.zeros((b, t), bool), valid=np.ones((b, t), bool),
              mask=np.arange(t)[None] < lengths[:, None], lengths=lengths,
              task_seeds=np.arange(b), groups=np.zeros(b, np.int32),
              outcome=np.zeros(b, np.float32), success=np.zeros(b, bool),
              truncated=np.zeros(b, bool), errored=np.zeros(b, bool), states=states)
    kw.update(over)
    return RecordedBatch(**kw)


def test_batch_from_arrays_with_stacked_jax_states():
    states = {"pos": jnp.arange(2 * 4 * 2).reshape(2, 4, 2), "step": jnp.zeros((2, 4))}
    batch = _array_batch(states)
    assert batch.episodes is None and (batch.batch_size, batch.num_steps) == (2, 3)
    assert batch.state(0, 3)["pos"].tolist() == [6, 7]
    with pytest.raises(ValueError, match=r"leaf \['step'\] has shape \(2, 3\)"):
        _array_batch(dict(states, step=jnp.zeros((2, 3))))
    with pytest.raises(ValueError, match=r"rewards has shape \(2, 2\)"):
        _array_batch(states, rewards=np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="first lengths"):
        _array_batch(states, lengths=np.array([2, 1], np.int32))
    with pytest.raises(ValueError, match="no episodes"):
        _array_batch(states).trajectories()


class FirstOption:
    """A deterministic policy: the first admissible action, malformed on step 1."""
    form = "option"

    def act(self, params, states, key, *, greedy=False, pad_to=None):
        from jaxdm.rl.policy import ActionOut

        return [ActionOut(s.admissible[0], s.steps_taken != 1, s.admissible[0], -0.5, {})
                for s in states]


def test_rollout_uses_the_pools_records():
    import jax

    from jaxdm.envs.local import LocalVectorEnv
    from jaxdm.envs.toy import make_ordering_env
    from jaxdm.rl.estimators import episode_batch
    from jaxdm.rl.rollout import rollout

    env = make_ordering_env(budget=4)
    venv = LocalVectorEnv(env, 4, group_size=2, env_name="ordering")
    res = rollout(FirstOption(), None, venv, seed=3, key=jax.random.key(0), max_actions=3,
                  env_name="toy")
    for ep in res.episodes:
        rec = ep.record
        assert rec is venv.recorder.episodes[ep.slot] and ep.initial_state is rec.initial_state
        assert [a.command for a in ep.actions] == [s.command for s in rec.steps]
        assert [a.state for a in ep.actions] == [s.state for s in rec.steps]
        traj = ep.trajectory
        # the rollout's view of the pool's record: its env name, budget, group metadata and
        # the policy's validity (step 1 was malformed)
        assert traj.env == "toy" and traj.budget == 3 and traj.metadata["group"] == ep.group
        assert [s.valid for s in traj.steps] == [a.valid and a.env_valid for a in ep.actions]
        assert len(traj.steps) < 2 or not traj.steps[1].valid
        assert traj.reward == rec.reward == ep.reward and traj.success == ep.success
        assert traj.truncated == (ep.truncated if rec.done else True)
    batch = res.recorded_batch(3)
    assert batch.lengths.tolist() == [len(e.actions) for e in res.episodes]
    eb = episode_batch(res.episodes, 3, 0.1)
    assert eb.recorded is not None and eb.recorded.num_steps == 3
    np.testing.assert_array_equal(eb.recorded.mask, eb.mask)
    np.testing.assert_array_equal(eb.recorded.outcome, eb.outcome)
    # the per-step states replay with the one key schedule
    for i, ep in enumerate(res.episodes):
        for t, a in enumerate(ep.actions):
            _, state, *_ = env.step(step_key(ep.task_seed, t), batch.state(i, t), a.command)
            assert state == batch.state(i, t + 1)
