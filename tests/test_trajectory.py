"""Trajectory files: strict types when reading, errors name file, line and field (issue 15 item 8)."""
import json

import pytest

from jaxdm.trajectory import Step, Trajectory, read_jsonl, write_jsonl

GOOD = Trajectory(goal="put a mug in cabinet.", steps=(
    Step("You are in a room.", "go to countertop 1", True, {"milestone": False, "no_op": False}),
    Step("You see a mug 1.", "take mug 1 from countertop 1", True,
         {"milestone": True, "subgoal": "take", "extra": [1, 2]}),
), final_observation="You pick up the mug 1.", reward=1.0, success=True, budget=8,
    task_type="pick_and_place_simple", env="alfworld", metadata={"seed": 3})


def _write(tmp_path, edit):
    d = GOOD.to_dict()
    edit(d)
    path = tmp_path / "trajs.jsonl"
    path.write_text(json.dumps(GOOD.to_dict()) + "\n" + json.dumps(d) + "\n")
    return path


def test_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [GOOD, GOOD])
    assert read_jsonl(path) == [GOOD, GOOD]
    # ints are numbers: a reward of 1 is read (JSON writers often drop the ".0")
    p2 = _write(tmp_path, lambda d: d.update(reward=1))
    assert read_jsonl(p2)[1].reward == 1


def _set(field, value):
    def edit(d):
        if field.startswith("steps[1].annotations."):
            d["steps"][1]["annotations"][field.rsplit(".", 1)[1]] = value
        elif field.startswith("steps[1]."):
            d["steps"][1][field.split(".", 1)[1]] = value
        else:
            d[field] = value
    return edit


@pytest.mark.parametrize("field,value,expect", [
    ("steps[1].annotations.milestone", "false", "must be true or false, got str 'false'"),
    ("steps[1].annotations.no_op", 1, "must be true or false, got int 1"),
    ("steps[1].annotations.subgoal", 3, "must be a string or null"),
    ("success", "false", "must be true or false, got str 'false'"),
    ("reward", "1.0", "must be a finite number, got str '1.0'"),
    ("reward", True, "must be a finite number, got bool True"),
    ("budget", "8", "must be a non-negative integer, got str '8'"),
    ("budget", 8.0, "must be a non-negative integer, got float 8.0"),
    ("budget", -1, "must be a non-negative integer"),
    ("goal", None, "must be a string"),
    ("final_observation", 5, "must be a string"),
    ("truncated", "no", "must be true or false"),
    ("final_observation_terminal", 0, "must be true or false"),
    ("error", 5, "must be a string or null"),
    ("metadata", [1], "must be a JSON object"),
    ("task_type", None, "must be a string"),
    ("steps[1].valid", "true", "must be true or false, got str 'true'"),
    ("steps[1].action", 7, "must be a string, got int 7"),
    ("steps[1].annotations", "milestone", "must be a JSON object"),
])
def test_mistyped_fields_name_file_line_and_field(tmp_path, field, value, expect):
    path = _write(tmp_path, _set(field, value))
    with pytest.raises(ValueError) as e:
        read_jsonl(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:2: field {field} ") and expect in msg, msg


def test_non_finite_reward(tmp_path):
    path = tmp_path / "t.jsonl"
    d = GOOD.to_dict()
    d["reward"] = float("nan")
    path.write_text(json.dumps(d) + "\n")  # json writes NaN, json reads it back
    with pytest.raises(ValueError, match=r"t.jsonl:1: field reward must be a finite number"):
        read_jsonl(path)


def test_missing_step_key(tmp_path):
    path = _write(tmp_path, lambda d: d["steps"][1].pop("observation"))
    with pytest.raises(ValueError, match=r"trajs.jsonl:2: steps\[1\] is missing key 'observation'"):
        read_jsonl(path)


def test_string_milestone_no_longer_scores_as_a_milestone(tmp_path):
    """The reported case: "milestone": "false" was read as a milestone and the Oracle gave 0.9."""
    path = _write(tmp_path, _set("steps[1].annotations.milestone", "false"))
    with pytest.raises(ValueError, match="annotations.milestone"):
        read_jsonl(path)
