"""SWE-bench grading through the official package on a tiny repository built here."""
from __future__ import annotations

import pytest

pytest.importorskip("swebench", reason="needs the swebench extra: pip install 'jaxdm[swebench]'")

from jaxdm.envs.swebench.grading import RepoSandbox, grade, load_instances  # noqa: E402
from tests.envs.swebench_fixtures import BUG, FIX, INSTANCE_ID, make_calc_instance  # noqa: E402


@pytest.fixture()
def instance(tmp_path):
    path, repos = make_calc_instance(tmp_path)
    return load_instances(str(path))[0], str(repos / INSTANCE_ID)


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
        box.edit("calc.py", BUG, FIX)
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
