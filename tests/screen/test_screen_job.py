"""The `jaxdm screen` job: Oracle pattern, end-to-end outputs, bad input."""
import json
from pathlib import Path

import numpy as np
import pytest

from jaxdm.cli import main
from jaxdm.decision import make_backend
from jaxdm.screen import ScreenError, screen
from jaxdm.screen.run import normalize_judge_spec, task_group
from jaxdm.trajectory import Step, Trajectory, write_jsonl

M = {"milestone": True, "no_op": False}
Z = {"milestone": False, "no_op": True}
O = {"milestone": False, "no_op": False}


def _heat_traj(success=True):
    """A heat task with the paper's dependency error: the mug is placed before heating."""
    steps = [
        Step("You are in the middle of a room.", "go to countertop 1", True, O),
        Step("On the countertop 1, you see a mug 1.", "take mug 1 from countertop 1", True, M),
        Step("You pick up the mug 1 from the countertop 1.", "look", True, O),
        Step("You are facing the countertop 1.", "look", True, Z),
        Step("You are facing the countertop 1.", "go to cabinet 1", True, O),
        Step("The cabinet 1 is open.", "move mug 1 to cabinet 1", True, O),
        Step("You move the mug 1 to the cabinet 1.", "take mug 1 from cabinet 1", True, O),
        Step("You pick up the mug 1 from the cabinet 1.", "go to microwave 1", True, O),
        Step("The microwave 1 is closed.", "heat mug 1 with microwave 1", True, M),
        Step("You heat the mug 1 using the microwave 1.", "go to cabinet 1", True, O),
        Step("The cabinet 1 is open.", "move mug 1 to cabinet 1", True, M),
    ]
    return Trajectory(goal="put a hot mug in cabinet.", steps=steps if success else steps[:-1],
                      final_observation="You move the mug 1 to the cabinet 1.", reward=float(success),
                      success=success, budget=30, task_type="pick_heat_then_place_in_recep", env="alfworld")


def _pick_traj():
    steps = [
        Step("You are in the middle of a room.", "go to desk 1", True, O),
        Step("On the desk 1, you see a pen 1.", "examine desk 1", True, Z),
        Step("On the desk 1, you see a pen 1.", "take pen 1 from desk 1", True, M),
        Step("You pick up the pen 1 from the desk 1.", "go to drawer 1", True, O),
        Step("The drawer 1 is open.", "move pen 1 to drawer 1", True, M),
    ]
    return Trajectory(goal="put a pen in drawer.", steps=steps, final_observation="You move the pen 1 to the drawer 1.",
                      reward=1.0, success=True, budget=30, task_type="pick_and_place_simple", env="alfworld")


def test_oracle_shows_the_papers_pattern():
    trajs = [_heat_traj(True), _heat_traj(False), _pick_traj()]
    res = screen(trajs, [("oracle", make_backend({"kind": "oracle"}))], progress=False)
    s = res["summary"]["oracle"]
    for ctx in ("prefix", "hindsight"):
        prog, val = s[f"progress/{ctx}"]["overall"], s[f"value/{ctx}"]["overall"]
        # Progress separates milestones from no-ops: perfect recall, positive gap, no misses.
        assert prog["recall_at_r"] == pytest.approx(1.0)
        assert prog["gap"] == pytest.approx(0.9 - 0.1)
        assert prog["milestone_miss"] == pytest.approx(0.0) and prog["noop_miss"] == pytest.approx(0.0)
        # Value follows the outcome: within a trajectory milestones and no-ops score the same.
        assert val["gap"] == pytest.approx(0.0)
        # ... so Recall@R is chance level: R milestones among T tied actions -> R/T in expectation.
        expected = np.mean([sum(t == "milestone" for t in tr.action_types) / len(tr) for tr in trajs])
        assert val["recall_at_r"] == pytest.approx(expected)
    # The Oracle's Progress score does not depend on context: no rank shift at any expansion.
    for lv in ("FB", "25%", "50%", "75%", "100%"):
        assert res["shifts"]["oracle"][lv]["mean"] == pytest.approx(0.0)
    by_group = s["progress/hindsight"]["by_group"]
    assert set(by_group) == {"dependency", "single"}
    assert by_group["dependency"]["n_traj"] == 2


def test_task_groups():
    assert task_group("pick_heat_then_place_in_recep") == "dependency"
    assert task_group("pick_two_obj_and_place") == "independent"
    assert task_group("look_at_obj_in_light") == "single"
    assert task_group("pick_and_place_simple") == "single"


def test_cli_end_to_end_writes_every_output(tmp_path, capsys):
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, [_heat_traj(), _pick_traj()])
    out = tmp_path / "out"
    rc = main(["screen", "--trajectories", str(path), "--judge", "oracle",
               "--judge", "oracle:noise=0.2,seed=3,name=noisy-oracle", "--out", str(out), "--no-progress"])
    assert rc == 0
    for name in ("report.md", "scores.jsonl", "summary.json", "trajectories.jsonl", "heatmap_hindsight.png",
                 "heatmap_prefix.png", "recall_at_r.png", "rank_shift.png", "miss_rate_vs_cost.png"):
        assert (out / name).stat().st_size > 0, name
    lines = [json.loads(l) for l in (out / "scores.jsonl").read_text().splitlines()]
    # 2 judges x (4 combos + 4 expansions) x 16 actions
    assert len(lines) == 2 * 8 * 16
    summary = json.loads((out / "summary.json").read_text())
    assert [r[0] for r in summary["ranking"]][0] == "oracle"
    printed = capsys.readouterr().out
    assert "Ranking (Hindsight + Progress; mean of Recall@R and 1 - no-op miss): 1. oracle" in printed


def test_bad_input(tmp_path, capsys):
    assert main(["screen", "--trajectories", str(tmp_path / "missing.jsonl"), "--judge", "oracle"]) == 2
    assert "trajectory file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    good = json.dumps(_pick_traj().to_dict())
    bad.write_text(good + "\n" + '{"goal": "x", "steps": [{"observation": "o"}], "final_observation": ""}\n')
    assert main(["screen", "--trajectories", str(bad), "--judge", "oracle", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err and "action" in err
    bad.write_text(good + "\n{not json\n")
    assert main(["screen", "--trajectories", str(bad), "--judge", "oracle"]) == 2
    assert "bad.jsonl:2: invalid JSON" in capsys.readouterr().err
    assert main(["screen", "--trajectories", str(bad), "--judge", "gpt-17"]) == 2
    assert "unknown judge 'gpt-17'" in capsys.readouterr().err
    assert main(["screen", "--judge", "telepathy:x=1"]) == 2
    assert "unknown backend kind 'telepathy'" in capsys.readouterr().err
    assert main(["screen", "--judge", "oracle", "num_trajectoriez=3"]) == 2
    assert "num_trajectoriez" in capsys.readouterr().err
    with pytest.raises(ScreenError, match="key=value"):
        normalize_judge_spec("oracle:noise")
    assert main(["screen", "--judge", "oracle", "expansions=[FB,10%]"]) == 2
    assert ("expansions: unknown context expansion '10%'; known: ['100%', '25%', '50%', "
            "'75%', 'FB']") in capsys.readouterr().err


def test_expansions_are_a_registry_in_report_order():
    from jaxdm.screen.run import EXPANSIONS, _expansion_plan

    assert list(EXPANSIONS) == ["FB", "25%", "50%", "75%", "100%"]
    assert _expansion_plan(True) == [("FB", "fb"), ("25%", 0.25), ("50%", 0.5), ("75%", 0.75),
                                     ("100%", None)]
    # chosen once each, in report order; 100 % (Hindsight) is always scored, never chosen
    assert _expansion_plan(["75%", "FB", "FB", "100%"]) == [("FB", "fb"), ("75%", 0.75),
                                                           ("100%", None)]
    assert _expansion_plan([]) == []


def test_outputs_when_no_trajectory_has_a_no_op(tmp_path):
    """Missing action types give NaN metrics and annotated figures, never a crash."""
    tr = _pick_traj()
    steps = tuple(s if s.action_type != "no_op" else type(s)(s.observation, s.action, True, O) for s in tr.steps)
    tr = Trajectory(goal=tr.goal, steps=steps, final_observation=tr.final_observation, success=True,
                    task_type=tr.task_type)
    res = screen([tr], [("oracle", make_backend({"kind": "oracle"}))], progress=False, out_dir=tmp_path)
    o = res["summary"]["oracle"]["progress/hindsight"]["overall"]
    assert np.isnan(o["noop_miss"]) and np.isnan(o["mean_no_op"]) and o["recall_at_r"] == 1.0
    assert (tmp_path / "miss_rate_vs_cost.png").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["summary"]["oracle"]["progress/hindsight"][
        "overall"]["noop_miss"] is None
