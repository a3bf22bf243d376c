"""``RecordedPool.start_tasks``: a slot gets a chosen task when it frees up, the other slots'
episodes are left alone (the harness's scheduler over an env pool), the same for the
in-process pool and worker processes; bad slots are named errors."""
from __future__ import annotations

import pytest

from jaxdm.envs.decision_gym import DecisionGym, GymParams, format_action
from jaxdm.envs.local import LocalVectorEnv
from jaxdm.envs.vector import VectorEnv

PARAMS = GymParams(split="fit")
FINISH = format_action("finish", {})


def _play(pool):
    begun = pool.start_tasks({0: 7, 1: 3})
    assert [begun[i][1]["task_seed"] for i in (0, 1)] == [7, 3]
    first = pool.states[1]
    out = pool.step([FINISH, None])               # slot 0 ends, slot 1 waits
    assert out.dones.tolist() == [True, False] and out.infos[1]["skipped"]
    (traj,) = pool.pop_trajectories()
    assert traj.metadata["task_seed"] == 7 and len(traj.steps) == 1
    again = pool.start_tasks({0: 11})               # slot 0's next task; slot 1 untouched
    assert again[0][1]["task_seed"] == 11 and pool.states[1] is not None
    assert pool.states[1].task == first.task and pool.states[1].t == 0
    with pytest.raises(ValueError, match=r"slots must be ints in \[0, 2\), got \[2\]"):
        pool.start_tasks({2: 1})
    with pytest.raises(TypeError, match="task seeds must be ints"):
        pool.start_tasks({0: "a"})
    return [s.task.task_id for s in pool.states]


def test_start_tasks_in_process_and_on_workers():
    local = LocalVectorEnv(DecisionGym(), 2, params=PARAMS)
    with pytest.raises(ValueError, match=r"slots \[1\] have no episode yet"):
        local.start_tasks({0: 1})
    got = _play(local)
    with VectorEnv(DecisionGym, 2, num_workers=2, params=PARAMS) as workers:
        assert _play(workers) == got
    assert got[0] != got[1]
