"""Subset stepping: a ``None`` action leaves a slot alone, in ``VectorEnv`` (real workers) and in
the in-process ``LocalVectorEnv``; a slot's trajectory never depends on which others stepped."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.vector import VectorEnv
from jaxdm.rl.rollout import LocalVectorEnv


@dataclasses.dataclass(frozen=True)
class TraceState:
    task: int
    count: int = 0


class TraceEnv(Environment):
    """Task k ends after k % 3 + 2 steps; observations show the step's env key and action, so
    any change in the keys a slot gets shows up in its observations."""

    name = "trace"

    @property
    def default_params(self):
        return None

    def reset_info(self, state, params=None):
        return {"goal": f"task {state.task}", "budget": 8}

    def reset_env(self, key, params):
        state = TraceState(task=seed_of(key))
        return f"task {state.task} start", state

    def step_env(self, key, state, action, params):
        new = dataclasses.replace(state, count=state.count + 1)
        done = new.count >= new.task % 3 + 2
        obs = f"task {new.task} step {new.count} key {seed_of(key)} did {action}"
        return obs, new, 1.0 if done else 0.0, done, {"valid": True, "won": done}


B = 4  # tasks 3, 4, 5, 6 (seed 3, group size 1) need 2, 3, 4, 2 steps


@pytest.fixture(scope="module", params=["workers", "local"])
def pool(request):
    if request.param == "workers":
        venv = VectorEnv(TraceEnv, num_envs=B, num_workers=2, step_timeout=10.0)
        yield venv
        venv.close()
    else:
        yield LocalVectorEnv(TraceEnv(), B)


def test_skipped_slots_are_untouched(pool):
    obs0, _ = pool.reset(seed=3)
    out = pool.step(["x", None, "y", None])
    assert out.observations[0] == "task 3 step 1 key 3000009 did x"  # key 3 * 1_000_003 + 0
    assert out.observations[2] == "task 5 step 1 key 5000015 did y"
    for i in (1, 3):  # skipped: current observation, reward 0, not done, marked
        assert out.observations[i] == obs0[i]
        assert out.rewards[i] == 0.0 and not out.dones[i]
        assert out.infos[i]["skipped"] is True and "inactive" not in out.infos[i]
        assert out.infos[i]["error"] is None and out.infos[i]["task_seed"] == 3 + i
    assert "skipped" not in out.infos[0] and "skipped" not in out.infos[2]
    if isinstance(pool, VectorEnv):
        assert pool.states[1] == TraceState(task=4, count=0)
        assert pool.states[0] == TraceState(task=3, count=1)
    # Everything skipped: nothing moves.
    out = pool.step([None] * B)
    assert all(info["skipped"] for info in out.infos)
    assert out.observations[0] == "task 3 step 1 key 3000009 did x"
    np.testing.assert_array_equal(out.rewards, np.zeros(B, np.float32))
    # The skipped slot's first real step still uses its own first key (step count 0).
    out = pool.step([None, "z", None, None])
    assert out.observations[1] == "task 4 step 1 key 4000012 did z"


def test_finished_slot_reports_done_when_skipped_or_stepped(pool):
    pool.reset(seed=3)
    pool.step(["a"] * B)
    out = pool.step(["a", "a", None, "a"])  # slot 0 (task 3) and slot 3 (task 6) end now
    np.testing.assert_array_equal(out.dones, [True, False, False, True])
    np.testing.assert_array_equal(out.rewards, [1.0, 0.0, 0.0, 1.0])
    out = pool.step([None, "a", "a", "a"])
    # Slot 0 ended earlier and is skipped: done, inactive and skipped; slot 3 is inactive.
    assert out.dones[0] and out.infos[0]["inactive"] and out.infos[0]["skipped"]
    assert out.observations[0] == "task 3 step 2 key 3000010 did a"
    assert out.dones[3] and out.infos[3]["inactive"] and "skipped" not in out.infos[3]
    assert out.rewards[0] == out.rewards[3] == 0.0
    assert out.dones[1] and out.rewards[1] == 1.0  # task 4: its third step


def _play(pool, schedule) -> list[list[str]]:
    """Step with a schedule of slot subsets until every slot is done; per-slot observations."""
    obs, _ = pool.reset(seed=3)
    seen = [[o] for o in obs]
    done = np.zeros(B, bool)
    for _ in range(40):
        for subset in schedule:
            out = pool.step(["go" if i in subset and not done[i] else None for i in range(B)])
            for i in subset:
                if not done[i]:
                    seen[i].append(out.observations[i])
                    done[i] = out.dones[i]
        if done.all():
            return seen
    raise AssertionError("episodes did not end")


def test_trajectories_do_not_depend_on_skipping(pool):
    together = _play(pool, [range(B)])
    halves = _play(pool, [(0, 2), (1, 3)])
    one_by_one = _play(pool, [(3,), (1,), (0,), (2,)])
    assert together == halves == one_by_one
    # task 5 (slot 2) takes 4 steps, with keys 5 * 1_000_003 + 0..3
    assert together[2][1:] == [f"task 5 step {n + 1} key {5_000_015 + n} did go"
                               for n in range(4)]
    assert [len(s) - 1 for s in together] == [2, 3, 4, 2]


def test_worker_trajectories_match_under_skipping():
    with VectorEnv(TraceEnv, num_envs=B, num_workers=2) as venv:
        _play(venv, [range(B)])
        full = {t.metadata["task_seed"]: t for t in venv.pop_trajectories()}
        _play(venv, [(0, 2), (1, 3)])
        split = {t.metadata["task_seed"]: t for t in venv.pop_trajectories()}
    assert sorted(full) == [3, 4, 5, 6]
    for seed in full:
        assert full[seed].steps == split[seed].steps
        assert full[seed].final_observation == split[seed].final_observation
        assert (full[seed].reward, full[seed].success) == (split[seed].reward,
                                                           split[seed].success) == (1.0, True)


def test_auto_reset_only_for_slots_that_stepped():
    with VectorEnv(TraceEnv, num_envs=2, num_workers=1, auto_reset=True) as venv:
        venv.reset(seed=3)  # tasks 3 and 4 need 2 and 3 steps
        venv.step(["a", None])
        out = venv.step(["a", None])
        assert out.dones[0] and out.infos[0]["reset_info"]["task_seed"] == 5
        assert out.observations[0] == "task 5 start"
        assert out.infos[1]["skipped"] and out.observations[1] == "task 4 start"
        out = venv.step([None, "a"])
        assert out.observations[1] == "task 4 step 1 key 4000012 did a"


def test_bad_actions(pool):
    pool.reset(seed=0)
    with pytest.raises(ValueError, match="expected num_envs=4"):
        pool.step_async([None] * 3)
    with pytest.raises(ValueError, match="has length 5"):
        pool.step(["a"] * 5)
    with pytest.raises(TypeError, match="sequence of num_envs=4"):
        pool.step("abcd")  # a string of the right length is not a batch
    with pytest.raises(RuntimeError, match="without step_async"):
        pool.step_wait()
    pool.step_async(["a", None, None, None])
    with pytest.raises(RuntimeError, match="twice"):
        pool.step_async(["a"] * B)
    with pytest.raises(RuntimeError, match="in flight"):
        pool.reset(0)
    out = pool.step_wait()
    assert out.observations[0] == "task 0 step 1 key 0 did a" and out.infos[1]["skipped"]


def test_local_pool_step_before_reset():
    with pytest.raises(RuntimeError, match="before reset"):
        LocalVectorEnv(TraceEnv(), 2).step(["a", "a"])
