"""`jaxdm bench` after a remote backend's partial outage (issue 43 item 6): a unit that lost some
answers is kept as incomplete with its good answers, failed answers are not wrong answers
(accuracy over the answered ones), `--resume` against the healthy server asks only the failed
questions again and the result equals an uninterrupted healthy run; over `max_failed_share`
the job fails (rc 2) after keeping what finished. Output paths (item 4): rc 2, no traceback,
nothing half-written."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from jaxdm.bench.run import BenchConfig, BenchError, run
from jaxdm.cli import main
from tests.output_faults import (
    assert_bad_output_refused,
    assert_named_error,
    bad_output_path,
    fill_disk_at,
)
from tests.screen.test_screen_reliability import judge_server  # noqa: F401 (fixture)


def _cfg(srv, out, **kw):
    spec = (f"remote:base_url=http://127.0.0.1:{srv.server_address[1]}/v1,model=j,"
            "concurrency=1,backoff=0.01,max_retries=0,name=remote")
    base = dict(levels=("l1",), judges=(spec,), out_dir=str(out), l1_tool=10, l1_param=10,
                progress=False)
    return BenchConfig(**{**base, **kw})


def _fail_some(seen):
    def fail_if(body):
        h = hashlib.sha256(json.dumps(body["messages"]).encode()).digest()
        if h[0] % 4 == 0:
            seen.append(h)
            return True
        return False
    return fail_if


def _untimed(res):
    res = json.loads(json.dumps(res))
    res["data"].pop("build_seconds")
    res["config"].pop("out_dir")
    res["config"].pop("max_failed_share")
    for b in res["backends"].values():
        b["cost"].pop("seconds"), b["cost"].pop("seconds_per_call")
    return res


def _lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_a_partial_outage_is_retried_not_kept(tmp_path, judge_server):
    srv = judge_server
    srv.labels = 26   # a multiple-choice judge (labels A..Z in the top log-probs)
    srv.requests = 0
    healthy = run(_cfg(srv, tmp_path / "healthy"))
    asked_healthy = srv.requests
    acc = healthy["backends"]["remote"]["l1"]["accuracy"]
    assert healthy["n_failed_answers"] == 0 and 0 < acc < 1

    seen: list = []
    srv.fail_if, srv.requests = _fail_some(seen), 0
    out = tmp_path / "out"
    res = run(_cfg(srv, out, max_failed_share=0.5))   # under the bound: rc 0
    n_failed = len(seen)
    assert 0 < n_failed < 10 and srv.requests == asked_healthy
    s = res["backends"]["remote"]["l1"]
    assert s["failed"] == n_failed and res["n_failed_answers"] == n_failed
    recs = _lines(out / "records.jsonl")
    lost = [r for r in recs if r["failed"] and not r["refused"]]
    assert len(lost) == n_failed and not any(r["correct"] for r in lost)
    # failed answers are left out of accuracy, never counted as wrong
    counted = [r for r in recs if r not in lost]
    assert s["accuracy"] == pytest.approx(sum(r["correct"] for r in counted) / len(counted))
    assert f"{n_failed} answer(s) failed for good" in (out / "report.md").read_text()
    (unit,) = _lines(out / "units.jsonl")
    assert unit["complete"] is False

    srv.fail_if, srv.requests = None, 0
    resumed = run(_cfg(srv, out, max_failed_share=0.5), resume=True)
    assert srv.requests == n_failed               # only the failed questions again
    assert _untimed(resumed) == _untimed(healthy)
    assert resumed["backends"]["remote"]["l1"]["accuracy"] == acc
    assert _lines(out / "records.jsonl") == _lines(tmp_path / "healthy" / "records.jsonl")
    (unit,) = _lines(out / "units.jsonl")         # one line per unit, never two
    assert unit["complete"] is True
    srv.requests = 0
    run(_cfg(srv, out), resume=True)
    assert srv.requests == 0

    # over max_failed_share (the default, 0.05): the job fails after writing; a resume asks
    # only the failed ones
    seen.clear()
    srv.fail_if, srv.requests = _fail_some(seen), 0
    bad = tmp_path / "bad"
    with pytest.raises(BenchError, match=r"too many failed answers: remote on l1 \(\d+ of 20 "
                                         r"answers failed \(\d+% > max_failed_share 0.05\)"):
        run(_cfg(srv, bad))
    assert json.loads((bad / "bench.json").read_text())["failed_units"][0]["level"] == "l1"
    srv.fail_if, srv.requests = None, 0
    again = run(_cfg(srv, bad), resume=True)
    assert srv.requests == len(seen)
    assert _untimed(again) == _untimed(healthy)


@pytest.mark.parametrize("where", ["proc", "file"])
def test_bad_output_paths_are_named_errors(tmp_path, capsys, where):
    out = bad_output_path(tmp_path, where)
    rc = main(["bench", "--judge", "oracle", "--level", "l1", "--out", str(out),
               "--no-progress", "l1_tool=2", "l1_param=2"])
    assert_bad_output_refused(rc, capsys.readouterr().err, out)


def test_no_space_left_is_a_named_error_and_nothing_is_half_written(tmp_path, capsys,
                                                                    monkeypatch):
    out = tmp_path / "out"
    args = ["bench", "--judge", "oracle", "--judge", "oracle:noise=0.3,name=noisy", "--level",
            "l1", "--out", str(out), "--no-progress", "l1_tool=3", "l1_param=3"]
    fill_disk_at(monkeypatch, "units.jsonl", 2)   # the disk is full when the second unit is appended
    rc = main(args)
    monkeypatch.undo()
    assert_named_error(rc, capsys.readouterr().err, "no space left on device", "units.jsonl")
    text = (out / "units.jsonl").read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 1   # the first unit, whole
    assert not (out / "bench.json").exists()
    assert main(args + ["--resume"]) == 0
    assert len((out / "units.jsonl").read_text().splitlines()) == 2
