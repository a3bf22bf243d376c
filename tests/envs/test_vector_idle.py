"""issue 15 #11: a worker that dies while idle loses no episode (the parent holds the
states; the jobs go to a replacement unchanged)."""
import os
import signal
import time

from jaxdm.envs.vector import VectorEnv
from tests.envs.test_vector_env import CounterEnv, _alive


def test_idle_worker_death_loses_no_episode():
    with VectorEnv(CounterEnv, num_envs=4, num_workers=2, group_size=2, step_timeout=5.0,
                   env_name="counter") as venv:
        venv.reset(seed=50)
        venv.step(["inc"] * 4)
        victim = venv.worker_pids[0]
        os.kill(victim, signal.SIGKILL)  # dies between steps, holding slots 0 and 1
        deadline = time.monotonic() + 10
        while _alive(victim) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = venv.step(["inc"] * 4)
        assert all(info["error"] is None for info in out.infos), out.infos
        assert out.observations == ["task 50 count 2"] * 2 + ["task 51 count 2"] * 2
        assert venv.worker_pids[0] != victim and venv.num_worker_restarts >= 1
        trajs = venv.step(["inc"] * 4)
        assert trajs.observations[0] == "task 50 count 3"
