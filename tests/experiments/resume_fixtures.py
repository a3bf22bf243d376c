"""Shared pieces of the kill-and-resume tests of the experiment scripts: run a script under
``kill_after.py`` (a real SIGKILL after the K-th write of a file) and compare a resumed run's
results with an uninterrupted one's, naming the first difference."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NO_KILL = ("(none)", 1)   # a suffix no file has: the script runs to its end


def run_killed(script: Path, args: list[str], kill=NO_KILL,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """``python SCRIPT args`` under ``kill_after.py``, killed after the ``kill[1]``-th write of
    a file whose path ends with ``kill[0]``; from the repository root, output captured."""
    cmd = [sys.executable, str(HERE / "kill_after.py"), kill[0], str(kill[1]), str(script),
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def assert_same_results(got: dict, expected: dict) -> None:
    """The same files with the same contents; a difference names the file and the first
    differing key path."""
    assert sorted(got) == sorted(expected)
    for f, value in expected.items():
        assert got[f] == value, (f, first_difference(got[f], value))


def first_difference(a, b, where: str = "") -> str:
    """The key path (``.key[index]...``) and values of the first place ``a`` and ``b``
    differ, descending into dicts and equal-length lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{where}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{where}[{i}]")
    return f"{where}: {a!r} != {b!r}"
