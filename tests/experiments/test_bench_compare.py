"""experiments/bench_compare.py: paired accuracy of two backends on the same bench questions."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import bench_compare  # noqa: E402


def _rec(backend, kind, correct, answer, n_options, failed=False):
    return {"backend": backend, "kind": kind, "correct": correct, "answer": [answer],
            "n_options": n_options, "failed": failed}


def test_paired_counts_mcnemar_and_majority(tmp_path):
    stop_keys = [1] * 8 + [0] * 2
    base = [_rec("a", "stop", k == 0, k, 2) for k in stop_keys]        # right on the 2 zeros
    sft = [_rec("b", "stop", k == 1, k, 2) for k in stop_keys]         # always "1"
    base += [_rec("a", "tool", False, i, 69) for i in range(6)]
    sft += [_rec("b", "tool", i < 3, i, 69, failed=(i == 5)) for i in range(6)]
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in base + sft))
    rows = bench_compare.main([str(path), "--a", "a", "--b", "b",
                               "--json", str(tmp_path / "out.json")])
    assert rows["stop"]["n"] == 10 and rows["stop"]["a"] == 0.2 and rows["stop"]["b"] == 0.8
    assert (rows["stop"]["only_b"], rows["stop"]["only_a"]) == (8, 2)
    assert rows["stop"]["majority"] == 0.8           # b is the majority answer, no more
    assert rows["stop"]["mcnemar_p"] == pytest.approx(0.109375)  # 2 * P(X <= 2), X~B(10, .5)
    assert rows["tool"]["n"] == 5 and rows["tool"]["majority"] is None  # failed pair left out
    assert rows["all"]["n"] == 15 and rows["all"]["only_b"] == 11
    lo, hi = rows["stop"]["b_ci"]
    assert 0.49 < lo < 0.8 < hi < 0.95
    assert json.loads((tmp_path / "out.json").read_text())["tool"]["only_b"] == 3


def test_mismatched_runs_are_refused(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [_rec("a", "stop", True, 1, 2),
                                                      _rec("b", "tool", True, 1, 69)]))
    with pytest.raises(SystemExit, match="questions differ"):
        bench_compare.main([str(path), "--a", "a", "--b", "b"])
    with pytest.raises(SystemExit, match="backend 'c' not in the records"):
        bench_compare.main([str(path), "--a", "a", "--b", "c"])
