"""`jaxdm screen` reliability (issue 15 items 1, 7, 9, 10): incremental fsync'd outputs, Ctrl-C
then --resume equals an uninterrupted run, output folders never overwritten by accident, one
failing judge does not sink the others, a dead server is marked down, lists in YAML/CLI."""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxdm.cli import main
from jaxdm.decision import make_backend
from jaxdm.screen import ScreenError, screen
from jaxdm.trajectory import Step, Trajectory, write_jsonl
from tests.http_fixtures import JSONHandler, serve

M = {"milestone": True, "no_op": False}
Z = {"milestone": False, "no_op": True}
O = {"milestone": False, "no_op": False}
ROOT = Path(__file__).resolve().parents[2]


def _trajs():
    a = Trajectory(goal="put a pen in drawer.", steps=(
        Step("You are in the middle of a room.", "go to desk 1", True, O),
        Step("On the desk 1, you see a pen 1.", "examine desk 1", True, Z),
        Step("On the desk 1, you see a pen 1.", "take pen 1 from desk 1", True, M),
        Step("You pick up the pen 1 from the desk 1.", "go to drawer 1", True, O),
        Step("The drawer 1 is open.", "move pen 1 to drawer 1", True, M),
    ), final_observation="You move the pen 1 to the drawer 1.", reward=1.0, success=True,
        budget=30, task_type="pick_and_place_simple", env="alfworld")
    b = Trajectory(goal="put a hot mug in cabinet.", steps=(
        Step("You are in the middle of a room.", "go to countertop 1", True, O),
        Step("On the countertop 1, you see a mug 1.", "take mug 1 from countertop 1", True, M),
        Step("You pick up the mug 1.", "look", True, Z),
        Step("You are facing the countertop 1.", "go to microwave 1", True, O),
        Step("The microwave 1 is closed.", "heat mug 1 with microwave 1", True, M),
    ), final_observation="You heat the mug 1 using the microwave 1.", reward=0.0, success=False,
        budget=30, task_type="pick_heat_then_place_in_recep", env="alfworld")
    return [a, b]


class _Judge(JSONHandler):
    """A deterministic OpenAI-compatible judge: P(Yes) from a hash of the messages; sleeps
    ``server.delay`` seconds per request so a run can be interrupted in the middle. Optional
    (set on the server): ``fail_if(body)`` -> True answers that request 503 (a partial
    outage), ``labels`` > 0 adds that many choice labels A, B, ... to the top log-probs (a
    multiple-choice judge), ``requests`` counts the POSTs."""

    def do_POST(self):
        body = self.request_json()
        time.sleep(self.server.delay)
        srv = self.server
        with _COUNT:
            srv.requests = getattr(srv, "requests", 0) + 1
        fail_if = getattr(srv, "fail_if", None)
        if srv.fail or (fail_if is not None and fail_if(body)):
            status, data = 503, b'{"error": "overloaded"}'
        elif self.path != "/v1/chat/completions":
            status, data = 404, b'{"error": "not found"}'
        else:
            h = int(hashlib.sha256(json.dumps(body["messages"]).encode()).hexdigest()[:8], 16)
            p = 0.02 + 0.96 * (h % 1000) / 999
            top = [{"token": "Yes", "logprob": math.log(p)}, {"token": "No", "logprob": math.log(1 - p)}]
            top += [{"token": chr(65 + k), "logprob": -0.25 * ((h >> k) % 11) - 0.01 * k}
                    for k in range(getattr(srv, "labels", 0))]
            data = json.dumps({"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": [
                {"token": "Yes", "logprob": math.log(p), "top_logprobs": top}]}}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 1}}).encode()
            status = 200
        self.reply(status, data)


_COUNT = threading.Lock()


@pytest.fixture()
def judge_server():
    with serve(_Judge, poll_interval=0.05) as srv:
        srv.delay, srv.fail = 0.0, False
        yield srv


def _remote_spec(srv, name="remote-judge"):
    # The OpenAI client form of the URL (ending in /v1) must work (issue 15 item 1).
    return (f"remote:base_url=http://127.0.0.1:{srv.server_address[1]}/v1,model=j,concurrency=1,"
            f"backoff=0.01,name={name}")


def _untimed(x):
    """summary.json without wall-clock fields."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not k.startswith("seconds")}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _rows(out):
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["judge"], r["question"], r["context"], r["traj"], r["t"]))


def test_sigint_then_resume_equals_an_uninterrupted_run(tmp_path, judge_server):
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    args = ["screen", "--trajectories", str(path), "--judge", _remote_spec(judge_server),
            "--judge", "oracle:noise=0.2,seed=3,name=noisy-oracle", "--no-progress",
            "expansions=[FB]"]
    full = tmp_path / "full"
    assert main(args + ["--out", str(full)]) == 0

    # 2 judges x 5 passes; the remote judge's passes take 10 x 0.06 s each.
    judge_server.delay = 0.06
    out = tmp_path / "interrupted"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "jaxdm.cli"] + args + ["--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    passes = out / "passes.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if passes.is_file() and len(passes.read_text().splitlines()) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err
    finished = len(passes.read_text().splitlines())
    assert 2 <= finished < 10
    assert not (out / "summary.json").exists()
    # Finished passes are on disk: every row of each recorded pass.
    assert len(_rows(out)) >= finished * 10
    # A write cut short by a crash: a torn last line must not block the resume.
    with open(out / "scores.jsonl", "a") as f:
        f.write('{"judge": "remote-judge", "question": "value", "cont')

    # Without --resume the folder is refused, and nothing in it is touched.
    before = (out / "scores.jsonl").read_bytes()
    assert main(args + ["--out", str(out)]) == 2
    assert (out / "scores.jsonl").read_bytes() == before

    judge_server.delay = 0.0
    assert main(args + ["--out", str(out), "--resume"]) == 0
    assert _rows(out) == _rows(full)
    assert len(_rows(out)) == 2 * 5 * 10
    got = _untimed(json.loads((out / "summary.json").read_text()))
    want = _untimed(json.loads((full / "summary.json").read_text()))
    assert got == want
    recs = [json.loads(line) for line in (out / "passes.jsonl").read_text().splitlines()]
    assert len(recs) == 10 and all(r["status"] == "ok" for r in recs)
    # Resuming a finished run scores nothing again and gives the same result.
    assert main(args + ["--out", str(out), "--resume"]) == 0
    assert _rows(out) == _rows(full)


def test_resume_refuses_changed_settings(tmp_path, capsys):
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    out = tmp_path / "out"
    base = ["screen", "--trajectories", str(path), "--judge", "oracle", "--no-progress",
            "--out", str(out), "expansions=[]"]
    assert main(base) == 0
    capsys.readouterr()
    assert main(base[:-1] + ["expansions=[FB]", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "different settings" in err and "expansions" in err
    write_jsonl(path, _trajs()[:1])
    assert main(base + ["--resume"]) == 2
    assert "trajectories differ" in capsys.readouterr().err
    # --overwrite replaces the run (and only our files).
    (out / "my_notes.txt").write_text("keep me")
    assert main(base + ["--overwrite"]) == 0
    assert (out / "my_notes.txt").read_text() == "keep me"
    assert len(_rows(out)) == 4 * 5
    with pytest.raises(SystemExit):
        main(base + ["--overwrite", "--resume"])


def test_existing_folder_is_refused_without_resume_or_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "something.txt").write_text("x")
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    rc = main(["screen", "--trajectories", str(path), "--judge", "oracle", "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "already holds files" in err and "--resume" in err and "--overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == ["something.txt"]


class _Raises:
    """A judge whose model produces NaN (as a NaN checkpoint does)."""

    name = "nan-model"

    def __init__(self):
        self.calls = 0

    def score(self, questions):
        self.calls += 1
        raise FloatingPointError("the model produced non-finite log-probabilities")


def test_one_failing_judge_does_not_sink_the_others(tmp_path, capsys):
    bad = _Raises()
    judges = [("nan-model", bad), ("oracle", make_backend({"kind": "oracle"}))]
    res = screen(_trajs(), judges, expansions=("FB",), progress=False, out_dir=tmp_path / "o")
    assert list(res["failed_judges"]) == ["nan-model"]
    why = res["failed_judges"]["nan-model"]
    assert "FloatingPointError" in why and "10 of 10 scores failed" in why
    assert bad.calls == 1  # its remaining passes were skipped
    assert [j for j, _ in res["ranking"]] == ["oracle"]
    assert res["summary"]["oracle"]["progress/hindsight"]["overall"]["recall_at_r"] == 1.0
    block = res["summary"]["nan-model"]["progress/prefix"]
    assert block["status"] == "failed" and block["n_failed"] == 10 and block["n_errors"] == 10
    assert "JUDGE FAILED: nan-model" in capsys.readouterr().err
    report = (tmp_path / "o" / "report.md").read_text()
    assert "## FAILED judges" in report and "FloatingPointError" in report
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "nan-model" in summary["failed_judges"]
    recs = [json.loads(line) for line in (tmp_path / "o" / "passes.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recs if r["judge"] == "nan-model"] == ["failed"]
    assert sum(r["judge"] == "oracle" for r in recs) == 5


def _dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_server_fails_its_judge_loudly_and_the_job(tmp_path, capsys):
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    dead = (f"remote:base_url=http://127.0.0.1:{_dead_port()}/v1,model=m,down_after=2,"
            "backoff=0.01,concurrency=1,name=dead")
    rc = main(["screen", "--trajectories", str(path), "--judge", dead, "--judge", "oracle",
               "--no-progress", "--out", str(tmp_path / "o")])
    assert rc == 1
    cap = capsys.readouterr()
    assert "judge 'dead' failed" in cap.err and "marked down after 2 consecutive" in cap.err
    assert "1. oracle" in cap.out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "marked down" in summary["failed_judges"]["dead"]
    # A wrong path (e.g. a base_url that the server does not serve) is the same: every
    # request fails with HTTP 404, the judge fails and the job exits non-zero.


def test_all_requests_failing_fails_the_job(tmp_path, capsys, judge_server):
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    url = f"http://127.0.0.1:{judge_server.server_address[1]}/api"
    rc = main(["screen", "--trajectories", str(path), "--judge",
               f"remote:base_url={url},model=j,backoff=0.01,name=wrong-path", "--no-progress",
               "--out", str(tmp_path / "o"), "expansions=[]"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "judge 'wrong-path' failed" in err and "HTTP 404" in err and "10 of 10" in err


def test_resume_retries_a_failed_judge(tmp_path, capsys, judge_server):
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    args = ["screen", "--trajectories", str(path), "--judge", _remote_spec(judge_server),
            "--judge", "oracle", "--no-progress", "--out", str(tmp_path / "o"), "expansions=[]"]
    judge_server.fail = True
    assert main(args) == 1
    assert "HTTP 503" in capsys.readouterr().err
    judge_server.fail = False
    assert main(args + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "resume: 4 of 8 passes already finished" in err  # the oracle's
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["failed_judges"] == {} and len(summary["ranking"]) == 2
    assert len(_rows(tmp_path / "o")) == 2 * 4 * 10


def test_failed_share_threshold(tmp_path):
    class Half:
        name = "half"

        def score(self, questions):
            from jaxdm.decision.types import score_failed, score_ok
            return [score_ok(0.5) if i % 2 else score_failed("flaky") for i in range(len(questions))]

    res = screen(_trajs(), [("half", Half())], expansions=(), progress=False,
                 max_failed_share=0.5)
    assert res["failed_judges"] == {}  # 50 % is not more than 50 %
    res = screen(_trajs(), [("half", Half())], expansions=(), progress=False,
                 max_failed_share=0.4)
    assert "5 of 10 scores failed (50% > max_failed_share 0.4): flaky" in res["failed_judges"]["half"]
    assert main(["screen", "--judge", "oracle", "max_failed_share=1.5"]) == 2


def test_yaml_and_cli_lists(tmp_path, capsys):
    """judges: and expansions: as YAML lists and CLI overrides (issue 15 item 9)."""
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    cfg = tmp_path / "screen.yaml"
    cfg.write_text(f"trajectories: {path}\njudges: [oracle, {{kind: oracle, noise: 0.2, seed: 1, "
                   f"name: noisy}}]\nexpansions: [FB, 50%]\nprogress: false\n"
                   f"out_dir: {tmp_path / 'o'}\n")
    assert main(["screen", "--config", str(cfg)]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["levels"] == ["FB", "50%", "100%"]
    assert sorted(summary["summary"]) == ["noisy", "oracle"]
    assert main(["screen", "--config", str(cfg), "judges=[oracle]", "expansions=[75%]",
                 f"out_dir={tmp_path / 'o2'}"]) == 0
    summary = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert summary["levels"] == ["75%", "100%"] and list(summary["summary"]) == ["oracle"]
    assert main(["screen", "--config", str(cfg), "expansions=[10%]"]) == 2
    assert "unknown context expansion '10%'" in capsys.readouterr().err


def test_judge_specs_never_echo_secrets_and_reject_nan(capsys):
    secret = "sk-live-abcdef0123456789"
    assert main(["screen", "--judge",
                 f"remote:base_url=http://127.0.0.1:1,model=m,api_key={secret}"]) == 2
    err = capsys.readouterr().err
    assert secret not in err and "api_key_env" in err
    assert main(["screen", "--judge", f"remote:base_url=http://127.0.0.1:1,token{secret}"]) == 2
    assert secret not in capsys.readouterr().err
    assert main(["screen", "--judge", "oracle:noise=nan"]) == 2
    assert "non-finite number 'nan'" in capsys.readouterr().err
    assert main(["screen", "--judge", "remote:base_url=127.0.0.1:8000/v1,model=m"]) == 2
    assert "must start with http:// or https://" in capsys.readouterr().err
    with pytest.raises(ScreenError, match=r"max_failed_share must be in \[0, 1\], got nan"):
        screen(_trajs(), [], max_failed_share=float("nan"))


def test_demo_replaces_only_its_own_earlier_run(tmp_path, monkeypatch):
    """`make demo` stays idempotent without ever replacing a different run in screen_out/."""
    from jaxdm.cli import DEMO_CONFIG
    from jaxdm.config import to_dict
    from jaxdm.screen.run import RUN_SETTINGS, ScreenConfig

    screen_run = sys.modules["jaxdm.screen.run"]  # (jaxdm.screen.run is also a function)
    calls = []
    monkeypatch.setattr(screen_run, "run", lambda cfg, **kw: calls.append(kw) or
                        {"failed_judges": {}})
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": False}
    out = tmp_path / DEMO_CONFIG["out_dir"]
    out.mkdir()
    demo = {k: v for k, v in to_dict(ScreenConfig(**DEMO_CONFIG)).items() if k in RUN_SETTINGS}
    (out / "screen.json").write_text(json.dumps({"judges": [], "levels": [], "settings": demo}))
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": True}
    # a demo run with the judge set an earlier version used (the trained judge left out)
    other = {**demo, "judges": ["smollm2", "oracle"]}
    (out / "screen.json").write_text(json.dumps({"settings": other}))
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": True}
    (out / "screen.json").write_text(json.dumps({"settings": {**demo, "judges": ["x"]}}))
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": False}
    (out / "screen.json").write_text(json.dumps({"settings": {**demo, "seed": 5}}))
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": False}
    assert main(["demo", "--resume"]) == 0 and calls[-1] == {"resume": True, "overwrite": False}
    # A demo written by an earlier version (no screen.json) is recognised by its summary.
    (out / "screen.json").unlink()
    (out / "summary.json").write_text(json.dumps({"n_trajectories": 6, "levels": ["FB", "50%", "100%"]}))
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": True}
    (out / "notes.txt").write_text("mine")
    assert main(["demo"]) == 0 and calls[-1] == {"resume": False, "overwrite": False}
