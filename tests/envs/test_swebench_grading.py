"""SWE-bench grading through the official package on a tiny repository built here."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("swebench", reason="needs the swebench extra: pip install 'jaxdm[swebench]'")

from jaxdm.envs.swebench.grading import RepoSandbox, grade, load_instances  # noqa: E402

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
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture()
def instance(tmp_path):
    repo = tmp_path / "calc"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\n"
                                  "def sub(a, b):\n    return a - b\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", "calc.py")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "base")
    eval_script = "\n".join([
        "#!/bin/bash", "set -uxo pipefail",
        f"git apply -v - <<'EOF_PATCH'\n{TEST_PATCH}EOF_PATCH",
        ": '>>>>> Start Test Output'", "echo '>>>>> Start Test Output'",
        f"{sys.executable} -m pytest -rA -p no:cacheprovider test_calc.py",
        "echo '>>>>> End Test Output'", "rm -f test_calc.py"])
    inst = {"repo": "local/calc", "instance_id": "local__calc-1", "base_commit": "HEAD",
            "patch": "", "test_patch": TEST_PATCH, "problem_statement": "add() subtracts",
            "hints_text": "", "created_at": "2026-01-01", "version": "0.1",
            "FAIL_TO_PASS": json.dumps(["test_calc.py::test_add"]),
            "PASS_TO_PASS": json.dumps(["test_calc.py::test_sub"]),
            "environment_setup_commit": "", "image": "none", "eval_script": eval_script,
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(inst) + "\n")
    return load_instances(str(path))[0], str(repo)


def test_failing_instance_is_unresolved_and_the_fix_resolves_it(instance):
    inst, repo = instance
    box = RepoSandbox(repo)
    try:
        assert "return a - b" in box.view("calc.py")
        before = grade(inst, box)
        assert before.reward == 0.0 and not before.resolved
        assert before.report["patch_successfully_applied"]
        status = before.report["tests_status"]
        assert status["FAIL_TO_PASS"]["failure"] == ["test_calc.py::test_add"]
        assert status["PASS_TO_PASS"]["success"] == ["test_calc.py::test_sub"]
        box.edit("calc.py", "def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b")
        after = grade(inst, box)
        assert after.reward == 1.0 and after.resolved
        assert after.report["tests_status"]["FAIL_TO_PASS"]["success"] == ["test_calc.py::test_add"]
        assert "+    return a + b" in box.patch()
    finally:
        box.close()
    with open(f"{repo}/calc.py") as f:
        assert "return a - b" in f.read().split("sub")[0]   # the original checkout is untouched


def test_sandbox_refuses_paths_outside_and_times_out(instance):
    inst, repo = instance
    box = RepoSandbox(repo, command_timeout=0.5)
    try:
        with pytest.raises(ValueError, match="outside the sandbox"):
            box.view("../../etc/passwd")
        with pytest.raises(ValueError, match="occurs 0 times"):
            box.edit("calc.py", "nothing like this", "x")
        assert box.run("sleep 5")[0] == 124
    finally:
        box.close()
