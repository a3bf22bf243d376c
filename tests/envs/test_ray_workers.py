"""VectorEnv(backend="ray"): the process pool's contract with env workers as Ray actors.

One local Ray instance (started here, no dashboard) serves the module; the Ray tests skip
when the ``[ray]`` extra is not installed.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest

from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.vector import VectorEnv

HERE = os.path.dirname(os.path.abspath(__file__))
# ray.init starts Ray's processes with subprocess (fork + exec at once), which JAX's at-fork
# hook warns about in a process that has imported JAX; nothing runs between fork and exec.
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")


@dataclasses.dataclass(frozen=True)
class TallyState:
    task: int
    count: int = 0


class TallyEnv(Environment):
    """Task k: say "inc" until the count reaches k % 3 + 2. "die" SIGKILLs the worker, "slow"
    sleeps 3 s, "hang" 60 s, "boom" raises inside the env."""

    warmed = False

    def warm_up(self):
        self.warmed = True

    @property
    def default_params(self):
        return None

    def reset_info(self, state, params):
        return {"goal": f"count to {state.task % 3 + 2}", "budget": 6, "warmed": self.warmed,
                "pid": os.getpid()}

    def reset_env(self, key, params):
        return f"task {seed_of(key)} count 0", TallyState(task=seed_of(key))

    def step_env(self, key, state, action, params):
        if action == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if action in ("slow", "hang"):
            time.sleep(3.0 if action == "slow" else 60.0)
        if action == "boom":
            raise RuntimeError("boom in env")
        new = dataclasses.replace(state, count=state.count + (action == "inc"))
        won = new.count >= new.task % 3 + 2
        return (f"task {new.task} count {new.count}", new, float(won), won,
                {"valid": action == "inc", "won": won})


def broken_env():
    raise ValueError("no such task file: tasks.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _gone_soon(pids, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    # The actors import this module (its env class) under the name pytest gave it; Ray's
    # workers inherit the environment of the instance started here (a runtime_env would
    # do the same but costs seconds per actor).
    path = os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", path)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def venv(local_ray):
    env = VectorEnv(TallyEnv, num_envs=6, num_workers=2, group_size=3, step_timeout=1.5,
                    backend="ray")
    yield env
    env.close()


def test_same_api_as_the_process_pool(venv):
    obs, infos = venv.reset(seed=10)
    assert obs == ["task 10 count 0"] * 3 + ["task 11 count 0"] * 3
    assert [i["task_seed"] for i in infos] == [10, 10, 10, 11, 11, 11]
    assert all(i["warmed"] for i in infos)  # the actor ran the env's warm_up hook
    # Slots 0-2 run in one actor, 3-5 in the other, neither in this process.
    assert [i["pid"] for i in infos] == [venv.worker_pids[0]] * 3 + [venv.worker_pids[1]] * 3
    assert len(set(venv.worker_pids)) == 2 and os.getpid() not in venv.worker_pids
    venv.step_async(["inc", "look", "inc", "inc", "inc", "inc"])
    out = venv.step_wait()
    assert out.observations[1] == "task 10 count 0" and out.infos[1]["valid"] is False
    venv.pop_trajectories()
    out = venv.step(["inc", None, "inc", "inc", "inc", "inc"])  # None: slot 1 skipped
    assert out.infos[1]["skipped"] and out.observations[1] == "task 10 count 0"
    out = venv.step(["inc"] * 6)
    # Task 10 needs 3 incs (slots 0, 2 are done), task 11 needs 4.
    np.testing.assert_array_equal(out.dones, [True, False, True, False, False, False])
    np.testing.assert_array_equal(out.rewards, [1, 0, 1, 0, 0, 0])
    trajs = venv.pop_trajectories()
    assert [len(t.steps) for t in trajs] == [3, 3] and all(t.success for t in trajs)
    assert trajs[0].goal == "count to 3" and trajs[0].error is None


def test_env_exception_is_an_errored_episode(venv):
    venv.reset(seed=0)
    restarts = venv.num_worker_restarts
    out = venv.step(["inc", "boom", "inc", "inc", "inc", "inc"])
    assert out.dones[1] and out.infos[1]["truncated"] and "boom in env" in out.infos[1]["error"]
    assert out.infos[0]["error"] is None and out.observations[2] == "task 0 count 1"
    assert venv.num_worker_restarts == restarts  # the actor survived the exception


def test_actor_killed_mid_batch_is_replaced(venv):
    venv.reset(seed=20)
    pids = venv.worker_pids
    # Slot 1 kills its own actor; slots 0 and 2 share that actor (before and after it).
    out = venv.step(["inc", "die", "inc", "inc", "inc", "inc"])
    assert out.dones[1] and out.infos[1]["truncated"] and "died" in out.infos[1]["error"]
    assert out.observations[0] == "task 20 count 1"
    assert out.observations[2] == "task 20 count 1"  # re-sent to the replacement actor
    assert out.observations[3:] == ["task 21 count 1"] * 3
    assert all(info["error"] is None for i, info in enumerate(out.infos) if i != 1)
    assert venv.worker_pids[0] != pids[0] and venv.worker_pids[1] == pids[1]
    assert out.infos[1]["trajectory"].error is not None
    out = venv.step(["inc"] * 6)  # the pool keeps working on the new actor
    assert out.observations[2] == "task 20 count 2" and out.infos[1]["inactive"]


def test_actor_killed_from_outside_and_hung_actor(venv):
    venv.reset(seed=30)
    victim = venv.worker_pids[1]
    killer = threading.Timer(0.5, os.kill, args=(victim, signal.SIGKILL))
    killer.start()
    try:
        out = venv.step(["inc", "inc", "inc", "slow", "inc", "inc"])
    finally:
        killer.cancel()
    assert out.dones[3] and "died" in out.infos[3]["error"]
    assert out.observations[:3] == ["task 30 count 1"] * 3
    assert out.observations[4:] == ["task 31 count 1"] * 2
    assert venv.worker_pids[1] != victim and _gone_soon([victim])
    # A hung step: step_timeout (1.5 s) kills the actor, only that episode is lost.
    hung = venv.worker_pids[0]
    t0 = time.monotonic()
    out = venv.step(["inc", "hang", "inc", "inc", "inc", "inc"])
    assert time.monotonic() - t0 < 20.0
    assert out.dones[1] and "step_timeout" in out.infos[1]["error"]
    assert out.observations[0] == "task 30 count 2" and out.observations[2] == "task 30 count 2"
    assert out.observations[4:] == ["task 31 count 2"] * 2
    assert _gone_soon([hung])


def test_actor_killed_while_idle_loses_no_episode(venv):
    venv.reset(seed=50)
    restarts, victim = venv.num_worker_restarts, venv.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    assert _gone_soon([victim])
    time.sleep(2.0)  # Ray tells the driver (fails the actor's pending watch call)
    out = venv.step(["inc"] * 6)  # the dead actor is replaced before it gets jobs
    assert all(info["error"] is None for info in out.infos)
    assert out.observations == ["task 50 count 1"] * 3 + ["task 51 count 1"] * 3
    assert venv.num_worker_restarts == restarts + 1 and venv.worker_pids[1] != victim


def test_close_leaves_no_actors(venv):
    # Runs last among the tests of the shared pool (file order), and closes it.
    pids = venv.worker_pids
    assert all(_alive(p) for p in pids)
    venv.close()
    venv.close()  # idempotent
    assert _gone_soon(pids)
    with pytest.raises(RuntimeError, match="closed"):
        venv.reset(0)


def test_build_errors_and_bad_options(local_ray):
    with pytest.raises(RuntimeError, match="no such task file"):
        VectorEnv(broken_env, num_envs=1, num_workers=1, backend="ray")
    with pytest.raises(ValueError, match="must not set 'num_cpus'"):
        VectorEnv(TallyEnv, num_envs=1, backend="ray",
                  backend_options={"actor_options": {"num_cpus": 2}})
    with pytest.raises(TypeError, match="unexpected keyword"):
        VectorEnv(TallyEnv, num_envs=1, backend="ray", backend_options={"gpus": 1})


def test_backend_names_are_checked():
    with pytest.raises(ValueError, match=r"backend must be one of \['process', 'ray'\]"):
        VectorEnv(TallyEnv, num_envs=1, backend="threads")
    with pytest.raises(ValueError, match="'process' takes no backend_options"):
        VectorEnv(TallyEnv, num_envs=1, backend_options={"num_cpus": 1})
