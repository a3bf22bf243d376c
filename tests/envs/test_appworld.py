"""AppWorld through the official package: fixture tasks written in its formats by its own code
(``appworld_fixture.py``), loaded by the real ``AppWorld(task_id=...)``, graded by its
``evaluate()``. Needs the appworld venv (``make appworld``); skipped without it."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from jaxdm.envs.appworld import AppWorldEnv, AppWorldParams, make_appworld_env
from jaxdm.envs.appworld.env import AppWorldError, appworld_python
from jaxdm.envs.vector import EnvFactory, VectorEnv

HERE = os.path.dirname(os.path.abspath(__file__))
LOGIN = ("tok = apis.simple_note.login(username='ada@example.com', "
         "password='pw-12345')['access_token']")
COUNT = "notes = apis.simple_note.search_notes(access_token=tok)\nprint(len(notes))"
ANSWER = "apis.supervisor.complete_task(answer=len(notes))"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    try:
        python = appworld_python()
    except AppWorldError as e:
        pytest.skip(f"needs the appworld venv (make appworld): {e}")
    path = tmp_path_factory.mktemp("appworld") / "root"
    done = subprocess.run([python, os.path.join(HERE, "appworld_fixture.py"), str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(path)


def _play(env, seed, cells):
    obs, state = env.reset(seed)
    outs, info, reward = [obs], {}, 0.0
    for code in cells:
        obs, state, reward, done, info = env.step(0, state, code)
        outs.append(obs)
        if done:
            break
    return outs, state, reward, info


def test_the_right_answer_passes_the_official_evaluation(root):
    env = AppWorldEnv(AppWorldParams(root=root, dataset="fixture"))
    assert env.task_ids() == ("fixnotes_1", "fixnotes_2")      # appworld.load_task_ids
    cells = ["print(apis.supervisor.show_account_passwords())", LOGIN, COUNT,
             "import os\nos.listdir('/')", ANSWER]
    outs, state, reward, info = _play(env, 1, cells)
    assert outs[0].startswith("Task: How many notes do I have in SimpleNote?")
    assert "Ada Byron" in outs[0] and state.task_type == "fixnotes"
    assert '"password": "pw-12345"' in outs[1] and outs[3] == "5\n"
    assert "not allowed: os.listdir" in outs[4]                  # AppWorld's safety guard
    assert reward == 1.0 and state.done and state.won and not info["truncated"]
    assert info["evaluation"] == [
        {"requirement": "success (appworld evaluate)", "passed": True},
        {"requirement": "assert the answer is the number of notes.", "passed": True}]
    env.close()


def test_a_wrong_answer_fails_and_the_budget_ends_an_episode(root):
    env = make_appworld_env(root=root, task_ids=["fixnotes_1"], max_turns=3)
    _, state, reward, info = _play(env, 0, [LOGIN, "apis.supervisor.complete_task(answer=5)"])
    assert reward == 0.0 and state.done and not state.won and not info["truncated"]
    assert [e["passed"] for e in info["evaluation"]] == [False, False]
    outs, state, reward, info = _play(env, 0, ["x = 1", "print(x + 1)", "print(x + 2)"])
    assert outs[-1] == "3\n" and info["truncated"] and reward == 0.0   # never completed
    env.close()


def _workers_of(pid: int) -> list[int]:
    """Pids of the AppWorld workers (child.py) this process started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if ppid == pid and any(a.endswith(b"appworld/child.py") for a in argv):
            found.append(int(entry))
    return found


def test_a_killed_worker_and_a_fresh_env_replay_the_transcript(root):
    env = AppWorldEnv(AppWorldParams(root=root, task_ids=("fixnotes_1",)))
    obs, state = env.reset(0)
    obs, state, *_ = env.step(0, state, LOGIN)
    for pid in _workers_of(os.getpid()):
        os.kill(pid, signal.SIGKILL)               # the live world is lost
    obs, state, _, _, info = env.step(0, state, COUNT)
    assert obs.startswith("Execution failed. the child process") and not info["valid"]
    assert state.took_effect == (True, False)      # replayed into a new worker
    obs, counted, _, _, info = env.step(0, state, COUNT)
    assert obs == "3\n" and info["valid"]
    env.close()
    fresh = AppWorldEnv(AppWorldParams(root=root, task_ids=("fixnotes_1",)))
    obs, new, reward, done, info = fresh.step(0, counted, ANSWER)   # MC continuation
    assert fresh.num_replays == 1 and reward == 1.0 and not info["replay_diverged"]
    fresh.close()
    assert _workers_of(os.getpid()) == []          # every worker ended


def test_vector_env_worker_plays_an_appworld_episode(root):
    factory = EnvFactory("jaxdm.envs.appworld:make_appworld_env",
                         {"root": root, "task_ids": ["fixnotes_2"]})
    with VectorEnv(factory, num_envs=1, num_workers=1, step_timeout=120.0,
                   env_name="appworld") as venv:
        venv.reset(0)
        for code in (LOGIN, COUNT, ANSWER):
            out = venv.step([code])
        (traj,) = venv.pop_trajectories()
    assert bool(out.dones[0]) and traj.success and traj.reward == 1.0
    assert traj.env == "appworld" and [s.action for s in traj.steps] == [LOGIN, COUNT, ANSWER]
    assert traj.steps[2].observation == "5\n"
