"""A tiny SWE-bench instance built by the tests: a git repository whose ``add`` subtracts, a
hidden test patch (``test_calc.py``), and the instance in the package's dataset format."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

INSTANCE_ID = "local__calc-1"
BUG = "def add(a, b):\n    return a - b"
FIX = "def add(a, b):\n    return a + b"

TEST_PATCH = """diff --git a/test_calc.py b/test_calc.py
new file mode 100644
--- /dev/null
+++ b/test_calc.py
@@ -0,0 +1,8 @@
+from calc import add, sub
+
+
+def test_add():
+    assert add(2, 3) == 5
+
+def test_sub():
+    assert sub(5, 3) == 2
"""


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)


def make_calc_instance(root: Path) -> tuple[Path, Path]:
    """(instances JSONL, repo root): ``<repo root>/local__calc-1`` is the checkout."""
    repo = root / "repos" / INSTANCE_ID
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text(f"{BUG}\n\n\ndef sub(a, b):\n    return a - b\n")
    (repo / "test_base.py").write_text("from calc import sub\n\n\n"
                                       "def test_sub_base():\n    assert sub(1, 1) == 0\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "calc.py", "test_base.py")
    _git(repo, "commit", "-q", "-m", "base")
    eval_script = "\n".join([
        "#!/bin/bash", "set -uxo pipefail",
        f"git apply -v - <<'EOF_PATCH'\n{TEST_PATCH}EOF_PATCH",
        ": '>>>>> Start Test Output'", "echo '>>>>> Start Test Output'",
        f"{sys.executable} -m pytest -rA -p no:cacheprovider test_calc.py",
        "echo '>>>>> End Test Output'", "rm -f test_calc.py"])
    inst = {"repo": "local/calc", "instance_id": INSTANCE_ID, "base_commit": "HEAD",
            "patch": "", "test_patch": TEST_PATCH, "problem_statement": "add() subtracts",
            "hints_text": "", "created_at": "2026-01-01", "version": "0.1",
            "FAIL_TO_PASS": json.dumps(["test_calc.py::test_add"]),
            "PASS_TO_PASS": json.dumps(["test_calc.py::test_sub"]),
            "environment_setup_commit": "", "image": "none", "eval_script": eval_script,
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    path = root / "instances.jsonl"
    path.write_text(json.dumps(inst) + "\n")
    return path, root / "repos"
