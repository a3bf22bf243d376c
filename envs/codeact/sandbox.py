"""The CodeAct REPL: a persistent Python session in a sandboxed child process.

Parent side, ``Sandbox`` (a ``jaxdm.envs.repl.ReplSession``) starts
``python -I envs/codeact/child.py`` in an empty temporary folder with a bare
environment and speaks JSON lines over its stdin/stdout. Child side (``child.serve``), after
importing what it needs and before running any agent code:

* **limits** (``resource.setrlimit``): address space (``memory_mb``), CPU seconds for the
  whole session (``cpu_seconds``), no file may be written (``RLIMIT_FSIZE`` 0); each cell has
  a wall-clock limit (``cell_timeout``, ``SIGALRM`` in the child; the parent kills a child
  that does not answer ``cell_timeout + grace`` seconds later);
* **no file, process or network access**: cells run with a whitelist of builtins (no
  ``open``, ``eval``, ``exec``, ``getattr``, ...), ``import`` only of pure modules
  (``child.ALLOWED_IMPORTS``), and a syntax check that refuses any name or attribute starting with
  an underscore (the usual way out of a restricted namespace: ``().__class__...``);
* the task world lives in the child (``jaxdm.envs.codeact.apps``); cells see only ``apis``.

A killed child (timeout, memory, CPU) loses the REPL: ``Sandbox`` starts a new child and
replays the cells that took effect, so the episode goes on from the state before the failed
cell (which reports ``took_effect=False``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile

from jaxdm.envs.jsonl_child import ChildLost, JsonLineChild
from jaxdm.envs.repl import Evaluation, ExecResult

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")

__all__ = ["SandboxLimits", "Sandbox", "SandboxLost"]


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of a CodeAct sandbox: wall seconds per cell, CPU seconds of the whole session, the
    child's address space, and the grace before a silent child is killed."""
    cell_timeout: float = 2.0     # wall seconds per cell
    cpu_seconds: int = 60         # CPU seconds of the whole session
    memory_mb: int = 512          # address space of the child
    grace: float = 3.0            # extra seconds before the parent kills a silent child

    def __post_init__(self):
        if not (self.cell_timeout > 0 and self.cpu_seconds >= 1 and self.memory_mb >= 64
                and self.grace > 0):
            raise ValueError(f"bad sandbox limits {self}: need cell_timeout > 0, "
                             "cpu_seconds >= 1, memory_mb >= 64, grace > 0")


# The child died or stopped answering; the session is gone (the shared transport's error).
SandboxLost = ChildLost


# ---- parent -------------------------------------------------------------------------------
class Sandbox:
    """One task's REPL in a sandboxed child (see module docstring); a ``ReplSession``."""

    def __init__(self, seed: int, split: str, task_types: tuple[str, ...],
                 limits: SandboxLimits = SandboxLimits()):
        self.seed, self.split, self.task_types, self.limits = seed, split, task_types, limits
        self._cells: list[str] = []  # cells that took effect, replayed into a new child
        self.restarts = 0
        self._tmp = tempfile.TemporaryDirectory(prefix="jaxdm-codeact-")
        self._child: JsonLineChild | None = None
        self.facts = self._start()

    def _start(self) -> dict:
        self._child = JsonLineChild(
            [sys.executable, "-I", _CHILD, json.dumps(dataclasses.asdict(self.limits))],
            cwd=self._tmp.name, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        facts = self._call({"op": "open", "seed": self.seed, "split": self.split,
                            "task_types": list(self.task_types)}, timeout=60.0)
        for code in self._cells:
            self._call({"op": "exec", "code": code}, self._cell_deadline())
        return facts

    def _cell_deadline(self) -> float:
        return self.limits.cell_timeout + self.limits.grace

    def _call(self, msg: dict, timeout: float) -> dict:
        return self._child.call(msg, timeout)

    # ---- ReplSession --------------------------------------------------------------------------
    def execute(self, code: str) -> ExecResult:
        """Run one code cell in the child process; a cell that times out or kills the child restarts
        it from the cells before (counted in ``restarts``) and took no effect."""
        try:
            reply = self._call({"op": "exec", "code": code}, self._cell_deadline())
        except SandboxLost as e:
            self.restarts += 1
            self._start()
            return ExecResult(f"Execution failed. {e}; the REPL was restarted from the "
                              "state before this cell.", ok=False, took_effect=False)
        self._cells.append(code)
        return ExecResult(reply["output"], bool(reply["ok"]))

    def completed(self) -> bool:
        """Whether the agent called apis.supervisor.complete_task."""
        return bool(self._call({"op": "completed"}, 10.0)["completed"])

    def evaluate(self) -> Evaluation:
        """The task's requirements checked against the child's world now."""
        reqs = self._call({"op": "evaluate"}, 10.0)["requirements"]
        return Evaluation(tuple((str(r), bool(p)) for r, p in reqs))

    def close(self) -> None:
        """Stop the child process and remove its temporary folder."""
        if self._child is not None:
            self._child.close()
            self._child = None
        self._tmp.cleanup()

