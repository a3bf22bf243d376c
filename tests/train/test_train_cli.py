"""`jaxdm train-dm` and `jaxdm bench` wiring: errors name file and line; a bench run writes."""
import json

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
