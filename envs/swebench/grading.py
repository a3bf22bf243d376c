"""Per-episode repository sandboxes and SWE-bench grading through the official package.

``RepoSandbox(repo_dir)`` copies a git checkout into a temporary folder: the agent's tools
(``view``, ``edit``, ``files``, ``run``: a subprocess with a timeout, cwd the sandbox) act
there only (paths outside it are refused; a command's code is not confined: see the README),
and ``patch()`` is the ``git diff`` of its edits (the prediction's ``model_patch``).
``grade(instance, sandbox)`` runs the instance's ``eval_script`` (``swebench``'s
``make_test_spec``: test-exit-code recording included) in the sandbox with ``bash``, writes
the log, and returns the package's report (``get_eval_report``) and the reward (1.0 when
``resolved``). Nothing here re-implements the package's parsing or resolution rules.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from typing import Any

try:
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import load_swebench_dataset, make_test_spec
except ImportError as e:  # the optional extra
    raise ImportError("SWE-bench grading needs the official package: "
                      "pip install 'jaxdm[swebench]'") from e

__all__ = ["RepoSandbox", "GradeResult", "grade", "load_instances"]


def load_instances(path: str, instance_ids=None) -> list[dict]:
    """Instances from a local ``.json``/``.jsonl``/``.parquet`` file or a dataset name, read by
    the package's own loader (``load_swebench_dataset``)."""
    return [dict(i) for i in load_swebench_dataset(path, "test", instance_ids)]


class RepoSandbox:
    """A temporary copy of a git checkout that an episode's tools act in."""

    def __init__(self, repo_dir: str, *, command_timeout: float = 60.0):
        if not os.path.isdir(os.path.join(repo_dir, ".git")):
            raise ValueError(f"repo_dir {repo_dir!r} is not a git checkout")
        self._tmp = tempfile.TemporaryDirectory(prefix="jaxdm-swe-")
        self.root = os.path.join(self._tmp.name, "repo")
        shutil.copytree(repo_dir, self.root, symlinks=True)
        self.command_timeout = command_timeout

    def _path(self, rel: str) -> str:
        full = os.path.realpath(os.path.join(self.root, rel))
        if os.path.commonpath([full, os.path.realpath(self.root)]) != os.path.realpath(self.root):
            raise ValueError(f"path {rel!r} is outside the sandbox")
        return full

    def view(self, rel: str) -> str:
        """The file's text with line numbers; for a folder, the files under it."""
        path = self._path(rel)
        if os.path.isdir(path):
            prefix = os.path.relpath(path, os.path.realpath(self.root))
            inside = [f for f in self.files()
                      if prefix == "." or f.startswith(prefix.rstrip("/") + "/")]
            return "\n".join(inside) + "\n"
        with open(path) as f:
            return "".join(f"{i + 1:4d} {line}" for i, line in enumerate(f))

    def edit(self, rel: str, old: str, new: str) -> str:
        """Replace the one occurrence of ``old`` in the file by ``new``."""
        path = self._path(rel)
        with open(path) as f:
            text = f.read()
        if text.count(old) != 1:
            raise ValueError(f"{rel}: the text to replace occurs {text.count(old)} times, "
                             "need exactly once")
        with open(path, "w") as f:
            f.write(text.replace(old, new))
        return f"edited {rel}"

    def files(self) -> list[str]:
        """The sandbox's files (tracked and new, ignored ones left out), sorted."""
        code, out = self.run("git ls-files --cached --others --exclude-standard")
        if code != 0:
            raise RuntimeError(f"git ls-files failed in the sandbox: {out}")
        return sorted(set(line for line in out.splitlines() if line))

    def run(self, command: str, timeout: float | None = None) -> tuple[int, str]:
        """(exit code, output) of a shell command in the sandbox; 124 on timeout."""
        try:
            p = subprocess.run(["bash", "-c", command], cwd=self.root, capture_output=True,
                               text=True, timeout=timeout or self.command_timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout if isinstance(e.stdout, str) else ""
            return 124, out + f"[timed out after {e.timeout:g} s]"
        return p.returncode, p.stdout + p.stderr

    def patch(self) -> str:
        """``git diff`` of the edits (the prediction's ``model_patch``)."""
        code, out = self.run("git diff")
        if code != 0:
            raise RuntimeError(f"git diff failed in the sandbox: {out}")
        return out

    def close(self) -> None:
        """Remove the sandbox's temporary copy of the repository."""
        self._tmp.cleanup()


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """The grade of a patch: reward (1.0 resolved, else 0.0), whether the instance is resolved,
    swebench's report and the eval log."""
    reward: float
    resolved: bool
    report: dict
    log: str


def grade(instance: dict, sandbox: RepoSandbox, *, timeout: float = 300.0,
          model_name: str = "jaxdm") -> GradeResult:
    """Run the instance's eval script in ``sandbox`` and grade its log with the package."""
    spec = make_test_spec(instance)
    patch = sandbox.patch()
    code, log = sandbox.run(spec.eval_script, timeout=timeout)
    log_path = os.path.join(os.path.dirname(sandbox.root), "test_output.txt")
    with open(log_path, "w") as f:
        f.write(log)
    prediction: dict[str, Any] = {"instance_id": spec.instance_id,
                                  "model_name_or_path": model_name, "model_patch": patch}
    report = get_eval_report(spec, prediction, log_path, include_tests_status=True)
    entry = report[spec.instance_id]
    return GradeResult(1.0 if entry["resolved"] else 0.0, bool(entry["resolved"]), entry, log)
