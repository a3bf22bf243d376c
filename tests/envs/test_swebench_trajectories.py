"""SWE-agent .traj files (written here in SWE-agent's format) -> Trajectory -> `jaxdm screen`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jaxdm.cli import main as jaxdm_main
from jaxdm.envs.swebench.trajectories import convert, from_swe_agent, read_run_report
from jaxdm.trajectory import read_jsonl

PATCH = "diff --git a/calc.py b/calc.py\n-    return a - b\n+    return a + b\n"


def _step(action: str, observation: str, thought: str = "") -> dict:
    """One entry of a .traj's "trajectory" list (SWE-agent's TrajectoryStep keys)."""
    return {"action": action, "observation": observation, "response": f"{thought}\n{action}",
            "thought": thought, "state": {"working_dir": "/repo"}, "execution_time": 0.1,
            "query": [{"role": "system", "content": "You are a helpful assistant"}],
            "extra_info": {}}


def _traj_file(steps, *, exit_status, submission, statement=None, history_issue=None) -> dict:
    """A .traj as SWE-agent's DefaultAgent.get_trajectory_data writes it."""
    history = [{"role": "system", "content": "You are a helpful assistant", "agent": "main",
                "message_type": "system_prompt"},
               {"role": "user", "content": [{"type": "text", "text": "a demonstration"}],
                "agent": "main", "is_demo": True, "message_type": "demonstration"}]
    if history_issue is not None:
        history.append({"role": "user", "content": [{"type": "text", "text": history_issue}],
                        "agent": "main", "message_type": "observation"})
    replay = None
    if statement is not None:
        replay = json.dumps({"problem_statement": {"text": statement[1], "id": statement[0],
                                                   "type": "text", "extra_fields": {}},
                             "agent": {"model": {"name": "some-model"}}})
    return {"trajectory": steps, "history": history,
            "info": {"exit_status": exit_status, "submission": submission,
                     "model_stats": {"instance_cost": 0.12, "api_calls": len(steps)},
                     "swe_agent_version": "1.1.0"},
            "replay_config": replay, "environment": "main"}


@pytest.fixture()
def run_dir(tmp_path):
    run = tmp_path / "trajectories" / "me" / "run1"
    fixed = _traj_file(
        [_step("find_file calc.py", 'Found 1 matches for "calc.py":\n/repo/calc.py', "Find it."),
         _step("open calc.py", "[File: /repo/calc.py (5 lines total)]\n1:def add(a, b):\n"
                               "2:    return a - b"),
         _step("edit 2:2\n    return a + b\nend_of_edit", "File updated."),
         _step("submit", PATCH)],
        exit_status="submitted", submission=PATCH,
        statement=("local__calc-1", "add() subtracts"))
    stuck = _traj_file(
        [_step("ls", "astropy/\nsetup.py"), _step("", "", "I am thinking out loud"),
         _step("python -c 'import astropy'", "x" * 300)],
        exit_status="exit_cost", submission=None,
        history_issue="Modeling's separability_matrix does not compute nested models")
    for iid, data in (("local__calc-1", fixed), ("astropy__astropy-12907", stuck)):
        (run / iid).mkdir(parents=True)
        (run / iid / f"{iid}.traj").write_text(json.dumps(data, indent=2))
    (run / "local__calc-1" / "local__calc-1.debug.log").write_text("not a trajectory")
    report = tmp_path / "some-model.run1.json"
    report.write_text(json.dumps({"resolved_ids": ["local__calc-1"],
                                  "unresolved_ids": ["astropy__astropy-12907"],
                                  "error_ids": [], "completed_ids": ["local__calc-1",
                                                                     "astropy__astropy-12907"]}))
    return run, report


def test_a_traj_becomes_a_trajectory_with_the_steps_and_the_harness_outcome(run_dir):
    run, report = run_dir
    stuck, fixed = convert([run], report=report, max_observation_chars=100)
    assert fixed.goal == "add() subtracts" and fixed.env == "swebench"
    assert [s.action for s in fixed.steps] == ["find_file calc.py", "open calc.py",
                                              "edit 2:2\n    return a + b\nend_of_edit",
                                              "submit"]
    assert fixed.steps[0].observation == "" and fixed.steps[2].observation.endswith(
        "2:    return a - b")
    assert fixed.final_observation == PATCH and fixed.success and fixed.reward == 1.0
    assert not fixed.truncated and fixed.budget == 50 and fixed.task_type == "local/calc"
    assert fixed.metadata == {"id": "local__calc-1", "source": "swe-agent", "resolved": True,
                              "exit_status": "submitted", "model_patch": PATCH}
    assert fixed.action_types == ("other",) * 4          # nobody annotated milestones
    assert stuck.goal.startswith("Modeling's separability_matrix")   # from the history
    assert stuck.task_type == "astropy/astropy" and stuck.truncated and not stuck.success
    assert [s.valid for s in stuck.steps] == [True, False, True]
    assert stuck.final_observation.startswith("[... 200 characters cut ...]\n")
    assert stuck.metadata["resolved"] is False
    unknown = from_swe_agent(run / "local__calc-1" / "local__calc-1.traj")
    assert unknown.metadata["resolved"] is None and unknown.reward == 0.0
    assert read_run_report(report) == {"local__calc-1": True, "astropy__astropy-12907": False}


def test_bad_traj_files_are_named_errors(run_dir, tmp_path):
    run, _ = run_dir
    path = run / "local__calc-1" / "local__calc-1.traj"
    with pytest.raises(ValueError, match="4 steps exceed the turn budget 3"):
        from_swe_agent(path, budget=3)
    with pytest.raises(ValueError, match="needs a 'trajectory' list"):
        from_swe_agent({"attempts": []})
    data = json.loads(path.read_text())
    data["trajectory"][1]["observation"] = None
    with pytest.raises(ValueError, match=r"trajectory\[1\]\.observation must be a string"):
        from_swe_agent(data)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .traj files"):
        convert([empty])
    with pytest.raises(ValueError, match="no such file or folder"):
        convert([tmp_path / "missing"])


def test_converter_command_then_jaxdm_screen_with_the_oracle(run_dir, tmp_path, capsys):
    run, report = run_dir
    out = tmp_path / "swe.jsonl"
    cmd = [sys.executable, "-m", "jaxdm.envs.swebench.trajectories", str(run),
           "--report", str(report), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote 2 trajectories" in done.stdout and "1 resolved" in done.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
    assert [t.metadata["id"] for t in read_jsonl(out)] == ["astropy__astropy-12907",
                                                           "local__calc-1"]
    screen_out = tmp_path / "screen"
    rc = jaxdm_main(["screen", "--trajectories", str(out), "--judge", "oracle",
                     "--out", str(screen_out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((screen_out / "summary.json").read_text())
    block = summary["summary"]["oracle"]["progress/hindsight"]["overall"]
    # Unannotated actions are all 'other' (a mean per trajectory, then over trajectories): the
    # Oracle gives valid ones 0.5 and the invalid (empty) one its no-op level 0.1; the
    # milestone / no-op measures have nothing to measure and are reported as null.
    assert block["mean_other"] == pytest.approx(((0.5 + 0.1 + 0.5) / 3 + 0.5) / 2)
    for key in ("mean_milestone", "mean_no_op", "gap", "recall_at_r", "noop_miss"):
        assert block[key] is None, key
    value = summary["summary"]["oracle"]["value/hindsight"]["overall"]
    assert value["mean_other"] == pytest.approx((0.2 + 0.8) / 2)   # unresolved, resolved
    assert (screen_out / "report.md").is_file()
