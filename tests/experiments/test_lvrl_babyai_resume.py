"""``experiments/lvrl_babyai.py`` killed (a real SIGKILL, ``kill_after.py``) inside a training
run, at a run's end, between two runs and after its summary, then ``--resume``d: the same runs,
metrics, summary and table as an uninterrupted experiment (issue 43: resume from any kill
point). Tiny sizes: one method, two seeds, two iterations of 2 x 2 rollouts."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.experiments.resume_fixtures import NO_KILL, REPO, assert_same_results, run_killed

SCRIPT = REPO / "experiments" / "lvrl_babyai.py"
TINY = ["--quick", "--methods", "grpo", "--seeds", "0,1", "--noise", "0.02",
        *[x for kv in ("iterations=2", "eval_every=1", "eval_tasks=4", "tasks_per_iter=2",
                       "group_size=2", "max_actions=8") for x in ("--set", kv)]]

# (file the kill follows, its n-th write); the out folder gets "_quick" appended by --quick.
# Each point costs ~20 s on 2 loaded cores. Also run once (all passed): ("runs/grpo/seed_0/
# metrics.jsonl", 3): the first run's final evaluation recorded, no checkpoint yet;
# ("runs/grpo/seed_1/metrics.jsonl", 2): inside the second run.
KILL_POINTS = [
    ("runs/grpo/seed_0/metrics.jsonl", 1),   # inside the first run: one iteration recorded
    ("runs/grpo/seed_1/config.yaml", 1),     # first run finished, second started
    ("_quick/summary.json", 1),              # every run done, summary written, table not
]


def _run(out: Path, *extra: str, kill=NO_KILL) -> subprocess.CompletedProcess:
    return run_killed(SCRIPT, ["--out", str(out), *TINY, *extra], kill, timeout=240)


TIMED = ("time", "wall_seconds", "cpu_seconds", "seconds_per_iteration",
         "update_seconds_per_iteration", "value_seconds_per_iteration")


def _untimed(value):
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items()
                if k not in TIMED and not k.startswith("time/") and not k.endswith("_per_s")
                and k != "value/total_seconds"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _results(out: Path) -> dict:
    got = {"summary.json": _untimed(json.loads((out / "summary.json").read_text())),
           "table.md": [line.rsplit("|", 2)[0] for line in   # the last column is s / it.
                        (out / "table.md").read_text().splitlines()]}
    for f in sorted(out.rglob("metrics.jsonl")):
        got[f.relative_to(out).as_posix()] = [
            _untimed(json.loads(x)) for x in f.read_text().splitlines()]
    return got


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "x"
    p = _run(out)
    assert p.returncode == 0, p.stderr[-3000:]
    return _results(Path(f"{out}_quick"))


@pytest.mark.slow
@pytest.mark.parametrize("name,k", KILL_POINTS, ids=[f"{n}#{k}" for n, k in KILL_POINTS])
def test_a_kill_anywhere_resumes_to_the_uninterrupted_results(tmp_path, uninterrupted, name, k):
    out = tmp_path / "x"
    p = _run(out, kill=(name, k))
    assert p.returncode == -9, (p.returncode, p.stderr[-3000:])   # killed at that write
    if k == 1 and name.endswith("seed_0/metrics.jsonl"):   # never replaced unasked
        p = _run(out)
        assert p.returncode != 0 and "pass --resume" in p.stderr, p.stderr[-3000:]
    p = _run(out, "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    done = Path(f"{out}_quick")
    got = _results(done)
    assert_same_results(got, uninterrupted)
    assert not list(done.rglob("*.tmp"))


