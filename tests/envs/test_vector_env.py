"""VectorEnv contract, pinned with a tiny stub environment, for every worker backend: the
shared-pool tests run once with worker processes and once with Ray actors (one local Ray
instance, no dashboard; the Ray half skips when the ``[ray]`` extra is not installed)."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.vector import EnvFactory, VectorEnv
from jaxdm.trajectory import Trajectory
from tests.ray_fixtures import local_ray_with

HERE = os.path.dirname(os.path.abspath(__file__))
# ray.init starts Ray's processes with subprocess (fork + exec at once), which JAX's at-fork
# hook warns about in a process that has imported JAX; nothing runs between fork and exec.
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")


@dataclasses.dataclass(frozen=True)
class CounterState:
    task: int
    count: int = 0

    @property
    def target(self) -> int:
        return self.task % 3 + 2  # tasks need 2, 3 or 4 "inc" actions


class CounterEnv(Environment):
    """Task k: say "inc" until the count reaches k % 3 + 2.

    Special actions exercise the pool: "die" SIGKILLs the worker, "slow" sleeps 3 s,
    "hang" sleeps 60 s, "boom" raises inside the env.
    """

    name = "counter"
    warmed = False

    def warm_up(self):
        self.warmed = True

    @property
    def default_params(self):
        return None

    def reset_info(self, state, params):
        return {"goal": f"count to {state.target}", "task_type": f"t{state.target}",
                "budget": 6, "env": self.name, "warmed": self.warmed, "pid": os.getpid()}

    def reset_env(self, key, params):
        state = CounterState(task=seed_of(key))
        return f"task {state.task} count 0", state

    def step_env(self, key, state, action, params):
        if action == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "slow":
            time.sleep(3.0)
        if action == "hang":
            time.sleep(60.0)
        if action == "boom":
            raise RuntimeError("boom in env")
        valid = action == "inc"
        new = dataclasses.replace(state, count=state.count + 1) if valid else state
        won = new.count >= new.target
        info = {"valid": valid, "won": won, "milestone": won, "no_op": not valid,
                "admissible_actions": ["inc"], "subgoal": "target" if won else None}
        return (f"task {new.task} count {new.count}", new, 1.0 if won else 0.0, won, info)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A reaped child is gone; an unreaped zombie still counts as not running, but only once
    # every thread has exited: a SIGKILLed leader shows "Z" while its other threads still
    # exit, and until then the parent cannot reap it (it still looks alive to the pool).
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            pass
    return False


def broken_env():
    raise ValueError("no such task file: tasks.json")


def _gone_soon(pids, seconds: float = 30.0) -> bool:
    # generous: a SIGKILLed Ray worker is reaped by its raylet, which on a loaded 2-core
    # machine once took over 10 s (returns as soon as the processes are gone)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


@pytest.fixture(scope="module")
def local_ray():
    with local_ray_with(HERE) as ray:   # the actors import this module (its env class)
        yield ray


@pytest.fixture(scope="module", params=["process", "ray"])
def backend(request):
    if request.param == "ray":
        request.getfixturevalue("local_ray")
    return request.param


@pytest.fixture(scope="module")
def venv(backend):
    env = VectorEnv(CounterEnv, num_envs=6, num_workers=2, group_size=3, step_timeout=1.5,
                    env_name="counter", backend=backend)
    yield env
    env.close()


def test_group_seeding_and_slices(venv):
    obs, infos = venv.reset(seed=10)
    # Slot i gets task 10 + i // 3; the two workers each own three slots.
    assert obs == ["task 10 count 0"] * 3 + ["task 11 count 0"] * 3
    assert [i["task_seed"] for i in infos] == [10, 10, 10, 11, 11, 11]
    assert venv.slot_ranges == [range(0, 3), range(3, 6)]
    assert len(set(venv.worker_pids)) == 2 and os.getpid() not in venv.worker_pids
    assert infos[0]["goal"] == "count to 3" and infos[3]["goal"] == "count to 4"
    assert all(i["warmed"] for i in infos)  # workers ran the env's warm_up hook
    # Slots 0-2 run in one worker, 3-5 in the other, neither in this process.
    assert [i["pid"] for i in infos] == [venv.worker_pids[0]] * 3 + [venv.worker_pids[1]] * 3


def test_step_records_trajectories(venv):
    venv.reset(seed=10)  # targets: 3 for slots 0-2, 4 for slots 3-5
    venv.pop_trajectories()
    out = venv.step(["inc", "look", "inc", "inc", "inc", "inc"])
    assert out.observations[1] == "task 10 count 0"  # invalid action: state unchanged
    assert out.infos[1]["valid"] is False and out.infos[1]["no_op"] is True
    np.testing.assert_array_equal(out.rewards, np.zeros(6, np.float32))
    out = venv.step(["inc"] * 6)
    out = venv.step(["inc"] * 6)
    # Slots 0 and 2 reached 3; slot 1 is at 2; slots 3-5 are at 3 (need 4).
    np.testing.assert_array_equal(out.dones, [True, False, True, False, False, False])
    np.testing.assert_array_equal(out.rewards, [1, 0, 1, 0, 0, 0])
    trajs = venv.pop_trajectories()
    assert len(trajs) == 2
    t0 = out.infos[0]["trajectory"]
    assert isinstance(t0, Trajectory) and t0 is trajs[0]
    assert t0.goal == "count to 3" and t0.task_type == "t3" and t0.env == "counter"
    assert t0.budget == 6 and t0.reward == 1.0 and t0.success and not t0.truncated
    assert [s.observation for s in t0.steps] == [f"task 10 count {k}" for k in range(3)]
    assert [s.action for s in t0.steps] == ["inc"] * 3
    assert t0.final_observation == "task 10 count 3"
    assert t0.action_types == ("other", "other", "milestone")
    assert t0.metadata["task_seed"] == 10
    # Slot 1's trajectory is still running; its invalid step was recorded as a no-op.
    out = venv.step(["inc"] * 6)
    assert out.infos[0]["inactive"] is True and out.dones[0]  # ended slots are skipped
    t1 = out.infos[1]["trajectory"]
    assert [s.valid for s in t1.steps] == [False, True, True, True]
    assert t1.action_types == ("no_op", "other", "other", "milestone")


def test_step_async_then_wait(venv):
    venv.reset(seed=7)
    venv.step_async(["inc"] * 6)
    with pytest.raises(RuntimeError, match="twice"):
        venv.step_async(["inc"] * 6)
    with pytest.raises(RuntimeError, match="in flight"):
        venv.reset(0)
    out = venv.step_wait()  # the caller may do other work between the two calls
    assert out.observations == ["task 7 count 1"] * 3 + ["task 8 count 1"] * 3
    with pytest.raises(RuntimeError, match="without step_async"):
        venv.step_wait()


def test_env_exception_is_an_errored_episode(venv):
    venv.reset(seed=0)
    restarts = venv.num_worker_restarts
    out = venv.step(["inc", "boom", "inc", "inc", "inc", "inc"])
    assert out.dones[1] and out.infos[1]["truncated"]
    assert "boom in env" in out.infos[1]["error"]
    assert out.infos[0]["error"] is None and out.observations[2] == "task 0 count 1"
    assert venv.num_worker_restarts == restarts  # the worker survived the exception
    t = out.infos[1]["trajectory"]
    assert t.error is not None and t.truncated and not t.success and t.reward == 0.0


def test_killed_worker_mid_batch(venv):
    venv.reset(seed=20)
    pids = venv.worker_pids
    # Slot 1 kills its own worker; slots 0 and 2 share that worker (before and after it).
    out = venv.step(["inc", "die", "inc", "inc", "inc", "inc"])
    assert out.dones[1] and out.infos[1]["truncated"]
    assert "died" in out.infos[1]["error"]
    assert out.observations[0] == "task 20 count 1"
    assert out.observations[2] == "task 20 count 1"  # re-sent to the replacement worker
    assert out.observations[3:] == ["task 21 count 1"] * 3
    assert all(info["error"] is None for i, info in enumerate(out.infos) if i != 1)
    new_pids = venv.worker_pids
    assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
    assert _gone_soon([pids[0]])
    # The pool keeps working: slot 2 continues its episode on the new worker.
    out = venv.step(["inc"] * 6)
    assert out.observations[2] == "task 20 count 2" and out.infos[1]["inactive"]


def test_worker_killed_from_outside(venv):
    venv.reset(seed=30)
    victim = venv.worker_pids[1]
    killer = threading.Timer(0.5, os.kill, args=(victim, signal.SIGKILL))
    killer.start()
    try:
        out = venv.step(["inc", "inc", "inc", "slow", "inc", "inc"])
    finally:
        killer.cancel()
    assert out.dones[3] and "died" in out.infos[3]["error"]
    assert out.observations[4:] == ["task 31 count 1"] * 2
    assert out.observations[:3] == ["task 30 count 1"] * 3
    assert venv.worker_pids[1] != victim and _gone_soon([victim])


def test_hanging_worker_hits_timeout(venv):
    venv.reset(seed=40)
    t0 = time.monotonic()
    out = venv.step(["inc", "inc", "hang", "inc", "inc", "inc"])
    elapsed = time.monotonic() - t0
    assert elapsed < 20.0  # step_timeout is 1.5 s, plus starting the replacement worker
    assert out.dones[2] and out.infos[2]["truncated"]
    assert "step_timeout" in out.infos[2]["error"]
    assert out.observations[:2] == ["task 40 count 1"] * 2
    assert out.observations[3:] == ["task 41 count 1"] * 3


def test_worker_killed_while_idle_loses_no_episode(venv):
    # The parent holds the states; the jobs go to a replacement unchanged.
    venv.reset(seed=50)
    venv.step(["inc"] * 6)
    restarts, victim = venv.num_worker_restarts, venv.worker_pids[1]
    os.kill(victim, signal.SIGKILL)  # dies between steps, holding slots 3-5
    assert _gone_soon([victim])
    if venv.backend == "ray":
        time.sleep(2.0)  # Ray tells the driver (fails the actor's pending watch call)
    out = venv.step(["inc"] * 6)  # the dead worker is replaced before it gets jobs
    assert all(info["error"] is None for info in out.infos), [i["error"] for i in out.infos]
    assert out.observations == ["task 50 count 2"] * 3 + ["task 51 count 2"] * 3
    assert venv.num_worker_restarts == restarts + 1 and venv.worker_pids[1] != victim


def test_auto_reset_keeps_groups_aligned():
    with VectorEnv(CounterEnv, num_envs=4, num_workers=2, group_size=2, auto_reset=True) as venv:
        obs, _ = venv.reset(seed=5)  # tasks 5, 5, 6, 6 with targets 4, 4, 2, 2
        for _ in range(2):
            out = venv.step(["inc"] * 4)
        # Slots 2 and 3 finished (target 2) and restarted on task 5 + 1 * 2 + 1 = 8.
        np.testing.assert_array_equal(out.dones, [False, False, True, True])
        assert out.observations[2:] == ["task 8 count 0"] * 2
        assert out.infos[2]["final_observation"] == "task 6 count 2"
        assert out.infos[2]["reset_info"]["task_seed"] == 8
        assert out.infos[2]["trajectory"].reward == 1.0
        assert venv.task_seed(0, 1) == 7 and venv.task_seed(3, 1) == 8
        for _ in range(2):
            out = venv.step(["inc"] * 4)
        # Slots 0-1 finished task 5 (4 incs) and restarted on task 7; slots 2-3 are half-way
        # through task 8 (target 4).
        assert out.observations == ["task 7 count 0"] * 2 + ["task 8 count 2"] * 2
        assert [t.metadata["task_seed"] for t in venv.trajectories] == [6, 6, 5, 5]


def test_max_steps_truncates():
    with VectorEnv(CounterEnv, num_envs=2, num_workers=1, max_steps=2) as venv:
        venv.reset(seed=2)  # target 4 > max_steps
        venv.step(["inc", "x"])
        out = venv.step(["inc", "x"])
        assert out.dones.all() and out.infos[0]["truncated"] and not out.infos[0]["won"]
        t = out.infos[0]["trajectory"]
        assert t.truncated and t.budget == 2 and len(t) == 2 and t.error is None


def test_bad_input_errors(venv):
    with pytest.raises(TypeError, match="cannot be pickled"):
        VectorEnv(lambda: CounterEnv(), num_envs=2)
    with pytest.raises(ValueError, match="group_size"):
        VectorEnv(CounterEnv, num_envs=3, group_size=2)
    with pytest.raises(ValueError, match="start_method"):
        VectorEnv(CounterEnv, num_envs=2, start_method="fork")
    with pytest.raises(ValueError, match="module:callable"):
        EnvFactory("no_colon_here")
    venv.reset(seed=0)
    with pytest.raises(ValueError, match="expected num_envs=6"):
        venv.step(["inc"] * 5)
    with pytest.raises(RuntimeError, match="failed to build"):
        VectorEnv(EnvFactory("jaxdm.envs.vector:NoSuchEnv"), num_envs=1, num_workers=1)


def test_close_leaves_no_workers(backend):
    venv = VectorEnv(CounterEnv, num_envs=2, num_workers=2, backend=backend)
    pids = venv.worker_pids
    assert all(_alive(p) for p in pids)
    venv.close()
    venv.close()  # idempotent
    assert _gone_soon(pids)
    with pytest.raises(RuntimeError, match="closed"):
        venv.reset(0)


def test_ray_build_errors_and_bad_options(local_ray):
    with pytest.raises(RuntimeError, match="no such task file"):
        VectorEnv(broken_env, num_envs=1, num_workers=1, backend="ray")
    with pytest.raises(ValueError, match="must not set 'num_cpus'"):
        VectorEnv(CounterEnv, num_envs=1, backend="ray",
                  backend_options={"actor_options": {"num_cpus": 2}})
    with pytest.raises(TypeError, match="unexpected keyword"):
        VectorEnv(CounterEnv, num_envs=1, backend="ray", backend_options={"gpus": 1})


def test_backend_names_are_checked():
    with pytest.raises(ValueError, match=r"backend: unknown worker backend 'threads'; known: "
                                         r"\['process', 'ray'\]"):
        VectorEnv(CounterEnv, num_envs=1, backend="threads")
    with pytest.raises(ValueError, match="'process' takes no backend_options"):
        VectorEnv(CounterEnv, num_envs=1, backend_options={"num_cpus": 1})


_PARENT_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    from jaxdm.envs.vector import VectorEnv
    from test_vector_env import CounterEnv
    venv = VectorEnv(CounterEnv, num_envs=2, num_workers=2)
    print(" ".join(map(str, venv.worker_pids)), flush=True)
    if {mode!r} == "exit":
        sys.exit(0)  # no close(): the atexit hook must clean up
    time.sleep(120)
""")


@pytest.mark.parametrize("mode", ["exit", "sigkill"])
def test_no_orphans_when_parent_exits_or_dies(mode):
    proc = subprocess.Popen([sys.executable, "-c", _PARENT_SCRIPT.format(here=HERE, mode=mode)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2
        if mode == "sigkill":
            proc.kill()
        proc.wait(timeout=60)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
