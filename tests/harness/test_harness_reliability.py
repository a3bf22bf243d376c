"""Harness jobs that fail loudly and resume from anywhere (issue 43): a dead agent LLM stops
its pass by name and its incomplete episodes run again on --resume; a SIGKILL at any write
resumes to an uninterrupted run's results; one job per run folder; bad output paths are named
errors; no credential of a spec reaches any output."""
from __future__ import annotations

import errno
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxdm.jsonl import without_keys
from jaxdm.cli import main
from test_harness_remote import _Handler, server  # noqa: F401  (the real test server)

HERE = Path(__file__).resolve().parent
SMALL = ["shadow_tasks=4", "test_tasks=6", "stage2_tasks=3", "dm.default_accuracy=1.0",
         "stats.margin=0.4", "frontier_thresholds=[0.5]"]
TIMING = {"seconds", "overhead_s", "wall_s", "latency_s"}   # measured, not results


def _harness(out, action, *extra):
    return main(["harness", action, "--config", "smoke", "--out", str(out), "--no-progress",
                 *extra])
_timeless = functools.partial(without_keys, keys=TIMING)


def _results(out: Path) -> dict[str, object]:
    """Every result file of a folder, timing fields dropped (figures: present or not)."""
    got = {}
    for p in sorted(out.rglob("*")):
        rel = str(p.relative_to(out))
        if p.is_dir() or p.name == ".jaxdm.lock":
            continue
        if p.suffix == ".jsonl":
            got[rel] = [_timeless(json.loads(x)) for x in p.read_text().splitlines()]
        elif p.suffix == ".json":
            got[rel] = _timeless(json.loads(p.read_text()))
        else:
            got[rel] = "present"
    return got


# ---- a dead agent LLM (item 1) -------------------------------------------------------------

class _DiesAfter(_Handler):
    """The test server's handler, until ``server.limit`` answers: then the server closes its
    socket (connections are refused), as a server process that exits."""

    def do_POST(self):
        srv = self.server
        with srv.lock:
            srv.answered = getattr(srv, "answered", 0) + 1
            dead = srv.answered > srv.limit
            last = srv.answered == srv.limit
        if dead:
            self.close_connection = True   # between the last answer and the socket closing
            return
        super().do_POST()
        if last:
            threading.Thread(target=lambda: (srv.shutdown(), srv.server_close()),
                             daemon=True).start()


def _dying(srv, limit):
    srv.RequestHandlerClass, srv.limit = _DiesAfter, limit
    return srv.server_address[1]


def _live(port):
    """A live server on ``port`` again (the same base_url: the same config)."""
    for _ in range(50):
        try:
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
            break
        except OSError:
            time.sleep(0.1)
    srv.lock, srv.log, srv.calls = threading.Lock(), [], {}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _remote(port, *extra):
    return ["shadow_tasks=6", "env.max_steps=4",
            f"llm={{kind: remote, base_url: 'http://127.0.0.1:{port}/v1', model: toolcaller, "
            f"timeout: 5, max_retries: 1, backoff: 0.01}}", *extra]


def _rows(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_a_dead_agent_llm_stops_the_pass_and_resume_runs_its_episodes_again(
        tmp_path, capsys, server):  # noqa: F811
    port = _dying(server, 9)            # two 4-step episodes and one answer of the third
    assert _harness(tmp_path / "cut", "shadow", *_remote(port)) == 2
    err = capsys.readouterr().err
    assert "shadow: " in err and "agent LLM calls got no answer" in err
    assert "over max_failed_share 0.05" in err and "--resume" in err
    assert not (tmp_path / "cut/harness_config.json").exists()     # not a finished pass
    assert not (tmp_path / "cut/shadow_decisions.jsonl").exists()
    journal = [r["episode"] for r in _rows(tmp_path / "cut/journal/shadow/shadow.jsonl")]
    done = [e for e in journal if not e["llm_unanswered"]]
    flagged = [e for e in journal if e["llm_unanswered"]]
    assert len(done) == 2 and flagged and len(journal) < 6     # stopped early, kept the two
    revived = _live(port)
    try:
        assert _harness(tmp_path / "cut", "shadow", "--resume", *_remote(port)) == 0
        out = capsys.readouterr().out
        assert f"shadow: 6 episodes (0 incomplete, not counted; {len(flagged)} run again)" in out
        assert len(revived.log) == 4 * (6 - len(done))           # the two were not asked again
        assert _harness(tmp_path / "whole", "shadow", *_remote(port)) == 0
    finally:
        revived.shutdown()
        revived.server_close()
    for f in ("shadow_episodes.jsonl", "shadow_decisions.jsonl"):
        cut, whole = _rows(tmp_path / "cut" / f), _rows(tmp_path / "whole" / f)
        assert _timeless(cut) == _timeless(whole), f
    assert not any(r["incomplete"] for r in _rows(tmp_path / "cut/shadow_episodes.jsonl"))
    assert not (tmp_path / "cut/journal").exists()


def test_a_pass_within_the_bound_is_kept_flagged_and_finished_by_resume(
        tmp_path, capsys, server):  # noqa: F811
    port = _dying(server, 9)
    cfg = _remote(port, "max_failed_share=1")
    assert _harness(tmp_path, "shadow", *cfg) == 0
    out = capsys.readouterr().out
    assert "finished with" in out and "incomplete episodes" in out and "--resume" in out
    eps = _rows(tmp_path / "shadow_episodes.jsonl")
    flagged = [e["task_id"] for e in eps if e["incomplete"]]
    assert len(eps) == 6 and len(flagged) == 4
    decisions = _rows(tmp_path / "shadow_decisions.jsonl")
    assert {d["task_id"] for d in decisions if d.get("incomplete")} <= set(flagged)
    marker = json.loads((tmp_path / "journal/shadow/incomplete.json").read_text())
    assert marker["episodes"] == 4
    # later commands may build on the complete episodes (flagged ones are left out)
    assert _harness(tmp_path, "fit", *cfg) == 0
    assert "fit: 4 incomplete shadow episodes left out (2 fitted on)" in capsys.readouterr().out
    # the same command without --resume: refused, pointing at --resume
    assert _harness(tmp_path, "shadow", *cfg) == 2
    assert "4 incomplete episodes: --resume" in capsys.readouterr().err
    revived = _live(port)
    try:
        assert _harness(tmp_path, "shadow", "--resume", *cfg) == 0
    finally:
        revived.shutdown()
        revived.server_close()
    out = capsys.readouterr().out
    assert "to run its 4 incomplete episodes again" in out
    assert "(0 incomplete, not counted; 4 run again)" in out
    assert len(revived.log) == 4 * 4
    assert not any(e["incomplete"] for e in _rows(tmp_path / "shadow_episodes.jsonl"))
    assert not (tmp_path / "journal").exists()                  # finished: no flagged episode
    # the fit made from the incomplete pass went with it
    assert list(json.loads((tmp_path / "harness_config.json").read_text())) == ["shadow"]
    assert not (tmp_path / "thresholds.json").exists()


def test_unanswered_decision_model_answers_flag_the_episode_refusals_do_not():
    from jaxdm.decision.types import choice_failed
    from jaxdm.envs.decision_gym import DecisionGym, GymParams
    from jaxdm.harness import Harness, NoisyOracle, SimulatedLLM
    from jaxdm.harness.dm import PointsOnly
    from jaxdm.harness.llm import STRONG

    class Flaky(NoisyOracle):
        """Loses every third request (as ``Remote`` counts them: ``stats["failures"]``)."""

        def __init__(self):
            super().__init__(seed=1)
            self.stats, self.n = {"failures": 0}, 0

        def choose(self, questions):
            out = []
            for r in super().choose(questions):
                self.n += 1
                if self.n % 3 == 0:
                    self.stats["failures"] += 1
                    r = choice_failed("connection error")
                out.append(r)
            return out

    env, params = DecisionGym(), GymParams(split="fit")
    ep = Harness(SimulatedLLM(STRONG, 0), Flaky(), shadow=True).run_task(env, 0, params)
    assert ep.dm_unanswered == ep.dm_failures > 0 and ep.incomplete
    assert ep.dm_questions == sum(r.dm_choice is not None for r in ep.decisions) + ep.dm_failures
    # a question the model is not asked (points_only) is the method's, not an outage
    only = PointsOnly(NoisyOracle(seed=1), ["stop"])
    ep = Harness(SimulatedLLM(STRONG, 0), only, shadow=True).run_task(env, 0, params)
    assert ep.dm_failures > 0 and ep.dm_unanswered == 0 and not ep.incomplete


def test_max_failed_share_is_checked_before_any_episode(tmp_path, capsys):
    assert _harness(tmp_path / "x", "shadow", "max_failed_share=1.5") == 2
    assert "max_failed_share must be in [0, 1], got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ---- a kill at any write (item 2) ------------------------------------------------------------

KILL_POINTS = [
    ("shadow.jsonl", 2),          # inside shadow: two episodes journaled
    ("harness_config.json", 1),   # shadow's end record written, its journal not yet removed
    ("thresholds.json", 1),       # inside fit: thresholds written, fit not recorded
    ("config.json", 3),           # run's start record (shadow, fit, run), before any episode
    ("tool_replace.jsonl", 3),    # inside run, in its third arm
    ("summary.json", 1),          # run's results written, run not recorded
    ("stage2_combined.jsonl", 2),  # inside compare's Stage 2
    ("report.json", 1),           # compare's report written, not its figures or record
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    assert _harness(out, "all", *SMALL) == 0
    return _results(out)


@pytest.mark.parametrize("name,k", KILL_POINTS, ids=[f"{n}#{k}" for n, k in KILL_POINTS])
def test_a_kill_at_any_write_resumes_to_the_uninterrupted_results(tmp_path, uninterrupted,
                                                                  name, k):
    cmd = [sys.executable, str(HERE / "harness_kill_after.py"), name, str(k), "harness", "all",
           "--config", "smoke", "--out", str(tmp_path), "--no-progress", *SMALL]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, (p.returncode, p.stderr[-2000:])     # killed at that write
    assert _harness(tmp_path, "all", "--resume", *SMALL) == 0
    got = _results(tmp_path)
    assert sorted(got) == sorted(uninterrupted)
    for f, value in uninterrupted.items():
        assert got[f] == value, f
    assert not list(tmp_path.rglob("*.tmp"))
    # and finished now: a second resume runs nothing
    assert _harness(tmp_path, "all", "--resume", *SMALL) == 0
    assert _results(tmp_path) == got


# ---- one job per folder (item 3) ------------------------------------------------------------

def test_a_second_job_on_a_folder_fails_at_once_naming_it_and_the_other_pid(tmp_path, capsys):
    out = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "-m", "jaxdm.cli", "harness", "shadow", "--config",
                              "smoke", "--out", str(out), "--no-progress",
                              "shadow_tasks=100000"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        lock = out / ".jaxdm.lock"
        deadline = time.monotonic() + 60
        while not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for action in ("shadow", "all", "fit"):
            t0 = time.monotonic()
            assert _harness(out, action, "--resume") == 2
            err = capsys.readouterr().err
            assert time.monotonic() - t0 < 5
            assert str(out.resolve()) in err and f"process {first.pid}" in err, err
    finally:
        first.kill()
        first.wait()
    # killed: the kernel dropped its lock; the folder can be used (here: resumed) again
    from jaxdm.rundir import lock_run_dir
    lock_run_dir(out).release()


# ---- output paths (item 4) -------------------------------------------------------------------

def test_an_output_that_is_a_file_or_cannot_be_created_is_a_named_error(tmp_path, capsys):
    f = tmp_path / "a_file"
    f.write_text("x")
    assert _harness(f, "shadow") == 2
    assert f"output folder {f} is a file" in capsys.readouterr().err
    assert f.read_text() == "x"
    assert _harness("/proc/jaxdm-nope/out", "all") == 2
    assert "cannot create output folder /proc/jaxdm-nope/out" in capsys.readouterr().err


def test_no_space_left_is_a_named_error_and_the_pass_resumes(tmp_path, capsys, monkeypatch):
    import jaxdm.jsonl
    real, n = os.fsync, [0]

    def full(fd):
        n[0] += 1
        if n[0] > 3:    # the start record and two episodes fit, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(jaxdm.jsonl.os, "fsync", full)
    assert _harness(tmp_path, "shadow", "shadow_tasks=4") == 2
    assert "no space left on device" in capsys.readouterr().err
    monkeypatch.setattr(jaxdm.jsonl.os, "fsync", real)
    lines = (tmp_path / "journal/shadow/shadow.jsonl").read_text()
    assert lines.endswith("\n") and lines.count("\n") == 2       # nothing half-written
    assert _harness(tmp_path, "shadow", "--resume", "shadow_tasks=4") == 0
    assert "(2 episodes kept)" in capsys.readouterr().out


# ---- credentials (issue item 7) --------------------------------------------------------------

def test_no_credential_of_a_spec_reaches_any_output(tmp_path, capsys, server):  # noqa: F811
    port = server.server_address[1]
    llm = (f"llm={{kind: remote, base_url: 'http://bob:sk-test-SECRET@127.0.0.1:{port}/v1', "
           f"model: toolcaller, timeout: 5, max_retries: 0}}")
    tiny = ["shadow_tasks=2", "test_tasks=2", "stage2_tasks=2", "env.max_steps=3", "arms=[]",
            "frontier_thresholds=[0.5]"]
    assert _harness(tmp_path / "ok", "all", llm, *tiny) == 0
    assert server.log                                      # it did talk to the server
    # the credentials are no config difference: a resume recognises the finished folder
    assert _harness(tmp_path / "ok", "all", "--resume", llm, *tiny) == 0
    # the decision model's spec, userinfo and query forms (a dead port: errors quote them)
    dm_user = ("dm={kind: remote, base_url: 'http://bob:sk-test-SECRET@127.0.0.1:9/v1', "
               "model: m, max_retries: 0, timeout: 2}")
    assert _harness(tmp_path / "dm", "shadow", dm_user, *tiny) == 2
    dm_query = ("dm={kind: remote, base_url: 'http://127.0.0.1:9/v1?api_key=SECRET2', "
                "model: m, max_retries: 0, timeout: 2}")
    assert _harness(tmp_path / "dmq", "shadow", dm_query, *tiny) == 2
    llm_query = (f"llm={{kind: remote, base_url: 'http://127.0.0.1:{port}/v1?api_key=SECRET2',"
                 f" model: toolcaller}}")
    assert _harness(tmp_path / "q", "shadow", llm_query, *tiny) == 2
    seen = capsys.readouterr()
    assert "SECRET" not in seen.out + seen.err
    assert "***" in seen.err
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "report.md" for p in files)
    for p in files:
        assert b"SECRET" not in p.read_bytes(), p


def test_random_confidence_keeps_the_answers_and_randomises_the_confidence():
    from jaxdm.decision.types import MultipleChoice, choice_failed
    from jaxdm.harness.dm import NoisyOracle, make_dm

    class Half(NoisyOracle):  # fails every second question: failures pass through unchanged
        def choose(self, questions):
            return [choice_failed("down") if i % 2 else r
                    for i, r in enumerate(super().choose(questions))]

    qs = [MultipleChoice(f"ctx {i}", "stop?", ("continue", "finish", "ask"),
                         meta={"answer": [i % 3], "point": "stop"}) for i in range(200)]
    inner = NoisyOracle(seed=2, default_accuracy=0.8)
    rc = make_dm({"kind": "random_confidence", "dm": {"kind": "oracle_noisy", "seed": 2,
                                                      "default_accuracy": 0.8}, "seed": 5})
    base, rand = inner.choose(qs), rc.choose(qs)
    assert [r.choice for r in rand] == [r.choice for r in base]       # same answers
    conf = [max(r.probs) for r in rand]
    assert all(1 / 3 < c <= 1 for c in conf) and abs(sum(p for p in rand[0].probs) - 1) < 1e-9
    # independent of correctness: right and wrong answers get the same confidence on average
    right = [c for c, q, r in zip(conf, qs, rand) if r.choice == q.meta["answer"][0]]
    wrong = [c for c, q, r in zip(conf, qs, rand) if r.choice != q.meta["answer"][0]]
    assert wrong and abs(sum(right) / len(right) - sum(wrong) / len(wrong)) < 0.12
    assert [max(r.probs) for r in rc.choose(qs)] == conf              # seeded per question
    from jaxdm.harness.dm import RandomConfidence
    half = RandomConfidence(Half(seed=2)).choose(qs[:4])
    assert [r.ok for r in half] == [True, False, True, False]
    with pytest.raises(ValueError, match="'random_confidence' takes 'dm'"):
        make_dm({"kind": "random_confidence", "seed": 1})
