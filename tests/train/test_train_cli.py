"""`jaxdm train-dm` and `jaxdm bench` wiring: errors name file and line; a bench run writes."""
import json

import pytest

from jaxdm.cli import main


def test_train_dm_malformed_line(tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text('{"context": "c", "questions": [{"question": "q", "answer": "yes"}]}\n{oops\n')
    assert main(["train-dm", "--data", str(p), "--out", str(tmp_path / "run")]) == 2
    assert f"{p}:2: invalid JSON" in capsys.readouterr().err
    assert main(["train-dm", "--data", str(p), "lr=.nan"]) == 2
    assert "lr" in capsys.readouterr().err


def test_bench_cli_oracle(tmp_path):
    out = tmp_path / "b"
    assert main(["bench", "--judge", "oracle", "--out", str(out), "--no-progress",
                 "l1_tool=4", "l1_param=4", "l2_tasks=2"]) == 0
    res = json.loads((out / "bench.json").read_text())
    assert res["backends"]["oracle"]["l1"]["n"] == 8
    assert main(["bench", "levels=[l7]"]) == 2


def test_teacher_probabilities_from_a_backend(tmp_path):
    from jaxdm.train.data import read_states
    from jaxdm.train.sft import with_teacher

    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"context": "c", "questions": [
        {"question": "q1", "options": ["a", "b", "c"], "answer": [2]},
        {"question": "q2", "options": ["a", "b"], "answer": [0], "teacher": [0.6, 0.4]}]}) + "\n")
    states, report = with_teacher(read_states(p), {"kind": "oracle", "noise": 0.2})
    t1, t2 = states[0][0].teacher, states[0][1].teacher
    assert len(t1) == 3 and abs(sum(t1) - 1) < 1e-9 and max(t1) >= 0.8 - 1e-9
    assert t2 == (0.6, 0.4)                       # a line's own teacher is kept
    assert report == {"asked": 1, "failed": 0, "first_error": None}
    # a teacher that answers nothing (its server down) stops the run instead of training
    # silently without it
    from jaxdm.train.sft import TrainingError
    down = {"kind": "remote", "base_url": "http://127.0.0.1:9/v1", "model": "m",
            "max_retries": 0, "timeout": 2}
    with pytest.raises(TrainingError, match=r"every teacher answer failed \(1 questions; "
                                            r"first error: .*connection"):
        with_teacher(read_states(p), down)
