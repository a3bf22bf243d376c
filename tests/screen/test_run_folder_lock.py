"""Two resumes of one folder at once (issue 43 item 3): two real `jaxdm bench ... --resume` and
two real `jaxdm screen ... --resume` processes on one folder each: the second fails at once
(rc 2) naming the folder and the first one's process id, and the first finishes alone (no
unit, pass or score row twice; before, units.jsonl ended with 34 rows for 18 units)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from jaxdm.cli import main
from jaxdm.trajectory import write_jsonl
from tests.screen.test_screen_reliability import _trajs, judge_server  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]


def _start(args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-m", "jaxdm.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for_lock(folder: Path, proc, timeout=60):
    lock = folder / ".jaxdm.lock"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if lock.is_file() and lock.read_text().strip() == str(proc.pid):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"{proc.args} never took the lock of {folder}")


def test_a_second_job_on_a_folder_fails_at_once(tmp_path, capsys, judge_server):
    srv = judge_server
    srv.labels = 26
    spec = (f"remote:base_url=http://127.0.0.1:{srv.server_address[1]}/v1,model=j,"
            "concurrency=1,backoff=0.01,max_retries=0,name=remote")
    path = tmp_path / "trajs.jsonl"
    write_jsonl(path, _trajs())
    screen = ["screen", "--trajectories", str(path), "--judge", "oracle", "--judge", spec,
              "--no-progress", "--out", str(tmp_path / "screen"), "expansions=[]"]
    bench = ["bench", "--judge", "oracle", "--judge", spec, "--level", "l1", "--no-progress",
             "--out", str(tmp_path / "bench"), "l1_tool=4", "l1_param=4"]
    # interrupted runs: the remote judge was down, the oracle's part is finished
    srv.fail = True
    assert main(screen) == 1 and main(bench) == 2
    capsys.readouterr()
    # back, but slow: the first resumes hold their folders for seconds after taking the lock
    # (2 s a request: a second job starting on a loaded 2-core machine takes ~5 s to import;
    # at 0.25 s the first bench had finished by then, and the second resumed after it)
    srv.fail, srv.delay = False, 2.0
    first = {"screen": _start(screen + ["--resume"]), "bench": _start(bench + ["--resume"])}
    for name, proc in first.items():
        _wait_for_lock(tmp_path / name, proc)
    second = {"screen": _start(screen + ["--resume"]), "bench": _start(bench + ["--resume"])}
    t0 = time.time()
    for name, proc in second.items():
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        assert "in use by another job" in err and str(first[name].pid) in err, err
        assert str((tmp_path / name).resolve()) in err and "Traceback" not in err, err
        assert first[name].poll() is None   # it failed while the first was still running
    assert time.time() - t0 < 30
    srv.delay = 0.0
    for name, proc in first.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    units = [json.loads(x) for x in (tmp_path / "bench" / "units.jsonl").read_text().splitlines()]
    assert sorted((u["backend"], u["level"]) for u in units) == [("oracle", "l1"),
                                                                  ("remote", "l1")]
    assert all(u["complete"] for u in units)
    recs = [json.loads(x) for x in (tmp_path / "screen" / "passes.jsonl").read_text().splitlines()]
    assert len(recs) == len({(r["judge"], r["question"], r["context"]) for r in recs}) == 8
    rows = [json.loads(x) for x in (tmp_path / "screen" / "scores.jsonl").read_text().splitlines()]
    assert len(rows) == len({(r["judge"], r["question"], r["context"], r["traj"], r["t"])
                             for r in rows}) == 80
