"""Credentials in a judge's URL (issue 43 item 7): `base_url=http://bob:sk-test-SECRET@host/v1`
(userinfo) and a `?api_key=SECRET2` query reach no file of a screen or bench run folder
(screen.json, summary.json, report.md, passes.jsonl, scores.jsonl, bench.json,
bench_run.json, records.jsonl, units.jsonl, ...) and not stderr / stdout; the saved settings
are redacted, and a resume with the same spec still matches them."""
from __future__ import annotations

import socket
from pathlib import Path

from jaxdm.cli import main
from jaxdm.trajectory import write_jsonl
from tests.screen.test_screen_reliability import _trajs, judge_server  # noqa: F401 (fixture)


def _dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _grep(folder: Path, *secrets):
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files
    for p in files:
        data = p.read_bytes()
        for s in secrets:
            assert s.encode() not in data, f"{s} in {p}"
    return sorted(p.name for p in files)


def test_no_credential_reaches_any_output(tmp_path, capsys, judge_server):
    srv = judge_server
    srv.labels = 26
    port = srv.server_address[1]
    good = (f"remote:base_url=http://bob:sk-test-SECRET@127.0.0.1:{port}/v1,model=j,"
            "concurrency=1,backoff=0.01,max_retries=0")
    # a dead server: its reasons ("server http://...@host marked down") are written too
    dead = (f"remote:base_url=http://bob:sk-test-SECRET@127.0.0.1:{_dead_port()}/v1,model=m,"
            "down_after=1,max_retries=0,backoff=0.01,name=dead")
    query = (f"remote:base_url=http://127.0.0.1:{port}/v1?api_key=SECRET2,model=j,"
             "name=query")
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    screen = ["screen", "--trajectories", str(path), "--judge", good, "--judge", dead,
              "--no-progress", "--out", str(tmp_path / "screen"), "expansions=[]"]
    bench = ["bench", "--judge", good, "--judge", dead, "--level", "l1", "--no-progress",
             "--out", str(tmp_path / "bench"), "l1_tool=3", "l1_param=3"]
    assert main(screen) == 1            # the dead judge failed; the good one is ranked
    assert main(bench) == 2             # the dead backend failed every answer
    # a resume with the same (secret) specs matches the saved, redacted settings
    assert main(screen + ["--resume"]) == 1
    assert main(bench + ["--resume"]) == 2
    cap = capsys.readouterr()
    assert "different settings" not in cap.err
    assert "marked down" in cap.err and "***@127.0.0.1" in cap.err
    names = _grep(tmp_path / "screen", "SECRET", "bob:")
    assert {"screen.json", "summary.json", "report.md", "passes.jsonl", "scores.jsonl"} <= set(
        names)
    assert "marked down" in (tmp_path / "screen" / "summary.json").read_text()
    names = _grep(tmp_path / "bench", "SECRET", "bob:")
    assert {"bench.json", "bench_run.json", "records.jsonl", "units.jsonl", "report.md"} <= set(
        names)
    assert "***@127.0.0.1" in (tmp_path / "bench" / "bench_run.json").read_text()
    for text in (cap.out, cap.err):
        assert "SECRET" not in text and "bob:" not in text
    # the query form is refused at start (no query in a base_url), without echoing it
    assert main(screen[:3] + ["--judge", query, "--out", str(tmp_path / "q1")]) == 2
    assert main(["bench", "--judge", query, "--level", "l1", "--out", str(tmp_path / "q2")]) == 2
    cap = capsys.readouterr()
    assert "must not have a query" in cap.err
    assert "SECRET2" not in cap.err + cap.out
    for q in ("q1", "q2"):
        if (tmp_path / q).exists():
            _grep(tmp_path / q, "SECRET2")
