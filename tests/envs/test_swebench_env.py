"""The SWE-bench tool-call environment on a tiny repository built here, graded by the package."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("swebench", reason="needs the swebench extra: pip install 'jaxdm[swebench]'")

from jaxdm.envs.swebench.env import (SWE_TURN_BUDGET, SWEBenchEnv, SWEParams,  # noqa: E402
                                     ToolCallError, make_swebench_env, parse_tool_call,
                                     tool_call)
from jaxdm.envs.vector import EnvFactory, VectorEnv  # noqa: E402
from tests.envs.swebench_fixtures import BUG, FIX, make_calc_instance  # noqa: E402

VIEW = tool_call("view", path="calc.py")
RUN = tool_call("run_tests")
FIX_CALL = tool_call("edit", path="calc.py", old=BUG, new=FIX)
SUBMIT = tool_call("submit")


@pytest.fixture()
def params(tmp_path):
    path, repos = make_calc_instance(tmp_path)
    return SWEParams(instances=str(path), repo_root=str(repos), command_timeout=30.0)


def _play(env, actions, seed=0):
    obs, state = env.reset(seed)
    seen, infos, reward, done = [obs], [], 0.0, False
    for a in actions:
        obs, state, reward, done, info = env.step(0, state, a)
        seen.append(obs)
        infos.append(info)
        if done:
            break
    return seen, state, reward, done, infos


def test_an_agent_that_views_edits_and_submits_the_fix_gets_reward_1(params):
    env = SWEBenchEnv(params)
    obs, state = env.reset(0)
    info = env.reset_info(state)
    assert state.goal == "add() subtracts" and state.task_type == "local/calc"
    assert info["budget"] == SWE_TURN_BUDGET == 50 and "add() subtracts" in obs
    assert VIEW in info["admissible_actions"] and SUBMIT in info["admissible_actions"]
    seen, state, reward, done, infos = _play(env, [VIEW, RUN, FIX_CALL, SUBMIT])
    assert "   2     return a - b" in seen[1]
    assert "1 passed" in seen[2] and "[pytest exit code 0]" in seen[2]
    assert seen[3] == "edited calc.py" and "+    return a + b" in seen[4]
    assert reward == 1.0 and done and state.won and infos[-1]["won"]
    assert not infos[-1]["truncated"] and all(i["valid"] for i in infos)
    ev = {e["requirement"]: e["passed"] for e in infos[-1]["evaluation"]}
    assert ev == {"resolved (swebench get_eval_report)": True,
                  "FAIL_TO_PASS test_calc.py::test_add": True,
                  "PASS_TO_PASS test_calc.py::test_sub": True}
    env.close()


def test_submitting_without_the_fix_gets_0_and_names_the_failing_test(params):
    env = SWEBenchEnv(params)
    seen, state, reward, done, infos = _play(env, [VIEW, SUBMIT])
    assert reward == 0.0 and done and not state.won and state.steps == 2
    failed = [e["requirement"] for e in infos[-1]["evaluation"] if not e["passed"]]
    assert failed == ["resolved (swebench get_eval_report)",
                      "FAIL_TO_PASS test_calc.py::test_add"]
    env.close()


def test_bad_tool_calls_are_refused_and_change_nothing(params):
    env = SWEBenchEnv(params)
    bad = ["view calc.py", '{"name": "rm", "arguments": {}}',
           '{"name": "edit", "arguments": {"path": "calc.py"}}',
           tool_call("edit", path="calc.py", old="not in the file", new="x"),
           tool_call("view", path="../../etc/passwd")]
    seen, state, reward, done, infos = _play(env, bad + [SUBMIT])
    assert [i["valid"] for i in infos] == [False] * 5 + [True]
    assert seen[1].startswith("Invalid tool call: not JSON")
    assert "unknown tool 'rm'" in seen[2]
    assert "missing argument(s) ['old', 'new']" in seen[3]
    assert "occurs 0 times" in seen[4] and "outside the sandbox" in seen[5]
    assert state.took_effect == (False, False, False, True, True, True)
    assert reward == 0.0 and seen[-1] == "Submitted. Your patch:\n"   # nothing was edited
    with pytest.raises(ToolCallError, match="'args' must be a list of strings"):
        parse_tool_call('{"name": "run_tests", "arguments": {"args": "-x"}}')
    assert parse_tool_call(tool_call("view", path=".")) == ("view", {"path": "."})
    obs, st = env.reset(0)
    obs, st, *_ = env.step(0, st, tool_call("view", path="."))
    assert obs.split() == ["calc.py", "test_base.py"]
    env.close()


def test_turn_budget_ends_the_episode_and_grades_the_patch(params):
    env = make_swebench_env(instances=params.instances, repo_root=params.repo_root,
                            max_turns=2)
    seen, state, reward, done, infos = _play(env, [VIEW, FIX_CALL])
    assert done and infos[-1]["truncated"] and reward == 1.0   # graded at the budget
    env.close()


def test_a_state_continues_in_a_fresh_env_by_replaying_its_transcript(params):
    first = SWEBenchEnv(params)
    _, state, *_ = _play(first, [VIEW, FIX_CALL])
    first.close()
    other = SWEBenchEnv(params)                    # holds no live sandbox of that state
    obs, new, reward, done, info = other.step(0, state, SUBMIT)
    assert other.num_replays == 1 and reward == 1.0 and done
    assert not info["replay_diverged"]
    other.close()


def test_vector_env_workers_play_the_instance_and_record_trajectories(params):
    factory = EnvFactory("jaxdm.envs.swebench.env:make_swebench_env",
                         {"instances": params.instances, "repo_root": params.repo_root})
    scripts = [[VIEW, FIX_CALL, SUBMIT], [VIEW, SUBMIT, None]]
    with VectorEnv(factory, num_envs=2, num_workers=1, step_timeout=120.0,
                   env_name="swebench") as venv:
        venv.reset(0)
        for t in range(3):
            venv.step([s[t] if t < len(s) else None for s in scripts])
        trajs = sorted(venv.pop_trajectories(), key=lambda tr: len(tr.steps))
    assert [tr.reward for tr in trajs] == [0.0, 1.0]
    assert [len(tr.steps) for tr in trajs] == [2, 3]
    assert trajs[1].success and trajs[1].env == "swebench" and trajs[1].budget == 50
    assert json.loads(trajs[1].steps[1].action)["name"] == "edit"
