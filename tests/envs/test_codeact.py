"""CodeAct: tasks, validation, the sandboxed persistent REPL, pure states, pools, trainer."""
from __future__ import annotations

import json

import pytest

from jaxdm.envs.codeact import CodeActEnv, CodeActParams
from jaxdm.envs.codeact.sandbox import SandboxLimits
from jaxdm.envs.codeact.tasks import make_task
from jaxdm.envs.local import LocalVectorEnv
from jaxdm.envs.vector import EnvFactory, VectorEnv
from tests.http_fixtures import JSONHandler, serve


def _seed_of_type(task_type: str, split: str = "train") -> int:
    return next(s for s in range(100) if make_task(s, split).task_type == task_type)


@pytest.fixture(scope="module")
def env():
    e = CodeActEnv(CodeActParams(max_turns=20, limits=SandboxLimits(cell_timeout=0.5, grace=1.0)))
    yield e
    e.close()


def _play(env, seed, cells):
    obs, st = env.reset(seed)
    out = [obs]
    for c in cells:
        obs, st, r, d, info = env.step(0, st, c)
        out.append(obs)
        if d:
            return out, st, r, info
    return out, st, 0.0, info


@pytest.mark.parametrize("task_type", ["disable_alarms", "count_notes", "pay_back"])
def test_reference_solution_passes_the_validation_suite(env, task_type):
    seed = _seed_of_type(task_type)
    task = make_task(seed)
    obs, st, r, info = _play(env, seed, task.solution)
    assert r == 1.0 and st.done and st.won and info["won"] and not info["truncated"]
    assert all(e["passed"] for e in info["evaluation"]) and len(info["evaluation"]) >= 3
    assert obs[0].startswith(f"Task: {task.instruction}")
    assert set(task.solution) <= set(st.menu)


def test_semantic_pitfall_and_early_completion_fail(env):
    seed = _seed_of_type("disable_alarms")
    task = make_task(seed)
    wrong = [c for c in task.menu if "delete_alarm" in c]
    cells = list(task.solution[:3]) + wrong + ["apis.supervisor.complete_task()"]
    obs, st, r, info = _play(env, seed, cells)
    assert r == 0.0 and st.done and not st.won   # every call succeeded, the task failed
    failed = [e["requirement"] for e in info["evaluation"] if not e["passed"]]
    assert failed == ["no alarm was deleted"]
    obs, st, r, info = _play(env, seed, ["apis.supervisor.complete_task()"])
    assert r == 0.0 and st.steps == 1 and not info["truncated"]


def test_turn_budget_ends_and_evaluates(env):
    seed = _seed_of_type("count_notes")
    e = CodeActEnv(CodeActParams(max_turns=2))
    obs, st, r, info = _play(e, seed, ["x = 1", "print(x + 1)"])
    assert obs[-1] == "2" and st.done and info["truncated"] and r == 0.0
    assert [x["passed"] for x in info["evaluation"]][0] is False  # never marked complete
    e.close()


def test_sandbox_refuses_files_imports_escapes_and_limits_time_and_memory(env):
    obs, st = env.reset(3)
    cells = {"import os": "import of 'os' is not allowed",
             "import socket": "import of 'socket' is not allowed",
             "().__class__.__base__": "names starting with '_' are not allowed",
             "open('/etc/passwd')": "NameError: name 'open' is not defined",
             "getattr(apis, 'x')": "NameError: name 'getattr' is not defined",
             "while True: pass": "exceeded its 0.5 s time limit",
             "x = [0] * (10**9)": "MemoryError",
             "apis.clock.show_alarms(access_token='nope')": "ApiError: clock: invalid access"}
    for code, expect in cells.items():
        obs, st, r, d, info = env.step(0, st, code)
        assert expect in obs and not info["valid"] and not d, (code, obs)
    obs, st, r, d, info = env.step(0, st, "import math; y = math.floor(2.5); print(y)")
    assert obs == "2" and info["valid"]


def test_a_cell_past_its_alarm_loses_the_child_and_the_repl_recovers(env):
    obs, st = env.reset(4)
    obs, st, *_ = env.step(0, st, "kept = 41")
    hang = "sum(range(10**11))"  # one C call: the child's alarm cannot interrupt it
    obs, st, r, d, info = env.step(0, st, hang)
    assert "REPL was restarted" in obs and st.took_effect == (True, False)
    obs, st, *_ = env.step(0, st, "print(kept + 1)")
    assert obs == "42"


def test_states_are_pure_replay_branches_and_mc_replay_agrees(env):
    from jaxdm.rl.mc_validation import ReplayStats, replay_actions

    seed = _seed_of_type("pay_back")
    task = make_task(seed)
    obs0, s0 = env.reset(seed)
    o1, s1, *_ = env.step(0, s0, task.solution[0])
    o2, s2, *_ = env.step(0, s1, task.solution[1])
    o3, s3, *_ = env.step(0, s2, task.solution[2])
    before = env.num_replays
    # s1 was stepped already: stepping it again replays its transcript into a new session
    b2, t2, *_ = env.step(0, s1, task.solution[1])
    b3, t3, _, _, info = env.step(0, t2, task.solution[2])
    assert (b2, b3) == (o2, o3) and t3 == s3 and env.num_replays == before + 1
    assert info["replay_diverged"] is False
    stats = ReplayStats()
    states, kept = replay_actions(env, seed, list(task.solution[:3]), [obs0, o1, o2, o3],
                                  stats=stats)
    assert kept == 3 and states[-1] == s3 and stats.diverged == 0
    assert env.replay(seed, task.solution[:3])[1] == s3


def test_vector_env_workers_match_in_process_and_survive_a_killed_worker():
    import os
    import signal
    import time

    seeds = [_seed_of_type("count_notes"), _seed_of_type("pay_back")]
    cells = {s: make_task(s).solution for s in seeds}
    factory = EnvFactory("jaxdm.envs.codeact:make_codeact_env", {"max_turns": 6})

    def play(venv):
        results = []
        for s in seeds:
            obs, _ = venv.reset(s)
            seen = [obs[0]]
            for k, c in enumerate(cells[s]):
                res = venv.step([c])
                seen.append(res.observations[0])
                if k == 1 and isinstance(venv, VectorEnv):
                    # killed while idle: replaced before the next step, which replays
                    os.kill(venv.worker_pids[0], signal.SIGKILL)
                    time.sleep(0.5)
                if res.dones[0]:
                    results.append((seen, float(res.rewards[0])))
                    break
        return results

    local = LocalVectorEnv(factory(), 1)
    with VectorEnv(factory, 1, num_workers=1, step_timeout=30) as venv:
        remote = play(venv)
        assert venv.num_worker_restarts >= 1
    assert remote == play(local) and [r for _, r in remote] == [1.0, 1.0]
    local.env.close()


class _ValueHandler(JSONHandler):
    """A JSON-list value model; keeps the prompts it was sent."""
    prompts: list = []

    def do_POST(self):
        body = self.request_json()
        user = body["messages"][-1]["content"]
        type(self).prompts.append(user)
        n = int(user.split("JSON list of exactly ")[1].split()[0])
        text = json.dumps([round(0.3 + 0.4 * j / max(n - 1, 1), 3) for j in range(n)])
        self.reply_chat(text, 10, 5)


def test_trainer_runs_lvrl_on_codeact(tmp_path):
    """The existing trainer, a tiny option-scoring policy, no special case: LVRL with value
    queries over the REPL transcripts to a real HTTP value model (GRPO is the same run with
    algo.advantage=grpo: the README's command)."""
    from jaxdm import config as cfgmod
    from jaxdm.rl.trainer import TrainConfig, Trainer

    base = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
            "model.num_kv_heads=1", "model.head_dim=16", "policy.form=option",
            "policy.max_prompt_tokens=256", "policy.max_option_tokens=48", "progress=false",
            "algo.kl_coef=0.0", "mesh_data=1", "env.name=codeact",
            "env.factory=jaxdm.envs.codeact:make_codeact_env",
            "env.kwargs={max_turns: 6, task_types: [count_notes]}",
            "env.eval_kwargs={split: test}", "max_actions=6", "tasks_per_iter=2",
            "group_size=2", "algo.mini_batch=16", "teacher.kind=none", "optim.lr=1e-3",
            "checkpoint_every=0"]
    with serve(_ValueHandler) as srv:
        cfg = cfgmod.load_config(TrainConfig, None, [
            *base, f"out_dir={tmp_path / 'lvrl'}", "algo.advantage=lvrl", "iterations=1",
            "value={kind: list, generator: {base_url: '" + srv.url + "', model: m, "
            "concurrency: 1}}"])
        tr = Trainer(cfg, log=False)
        recs = tr.run()
        tr.close()
    (train,) = [r for r in recs if "train/success" in r]
    assert 0.0 <= train["train/success"] <= 1.0 and train["env/errors"] == 0
    assert train["train/actions"] >= 1 and train["value/queries"] >= 1 and train["value/failures"] == 0
    assert any("apis." in p and "Task:" in p for p in _ValueHandler.prompts)
