"""``AppWorldEnv``: the official AppWorld as a ``jaxdm.envs.repl.ReplSessionEnv``.

Each episode's session is an ``AppWorld(task_id=...)`` living in a worker process started
with the appworld venv's python (``child.py``: standard library + ``appworld``; the package
pins pydantic<2 and cannot share jaxdm's venv), spoken to in JSON lines
(``jaxdm.envs.jsonl_child``). The observation is what the REPL printed (``world.execute``),
the action is code, and the reward the official evaluation (``world.evaluate()``: 1.0 when
it reports success) once the agent called ``apis.supervisor.complete_task`` (checked with
``world.task_completed()``) or the turn budget is spent. A worker that dies or misses its
deadline is replaced and the cells that took effect are replayed into it; the state is the
transcript, so a replaced ``VectorEnv`` worker or a Monte-Carlo continuation replays into a
fresh world (seed 001, App. F.1).

Tasks: ``params.task_ids``, else the ids of ``params.dataset`` (``appworld.load_task_ids``:
``<root>/data/datasets/<dataset>.txt``); task seed ``s`` plays task ``s % n``. ``root`` is the
``APPWORLD_ROOT`` holding ``data/`` (``appworld download data`` on a machine with internet;
here the tests build tasks in the package's formats). The interpreter: ``params.python``, else
``$JAXDM_APPWORLD_PYTHON``, else ``.venv-appworld/bin/python`` of this checkout
(``make appworld``).
"""
from __future__ import annotations

import dataclasses
import os
import uuid

from jaxdm.envs.jsonl_child import ChildLost, JsonLineChild
from jaxdm.envs.repl import Evaluation, ExecResult, ReplSessionEnv

__all__ = ["AppWorldParams", "AppWorldSession", "AppWorldEnv", "AppWorldError",
           "appworld_python", "make_appworld_env"]

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The first cells of most AppWorld solutions (offered as admissible actions; any code goes).
MENU = ("print(apis.api_docs.show_app_descriptions())",
        "print(apis.supervisor.show_account_passwords())",
        "print(apis.supervisor.show_profile())")


class AppWorldError(RuntimeError):
    """The AppWorld worker could not be started or refused a request (message names why)."""


def appworld_python(python: str = "") -> str:
    """The appworld venv's interpreter (see module docstring); AppWorldError if missing."""
    path = (python or os.environ.get("JAXDM_APPWORLD_PYTHON")
            or os.path.join(_CHECKOUT, ".venv-appworld", "bin", "python"))
    if not os.access(path, os.X_OK):
        raise AppWorldError(f"no appworld interpreter at {path}: run `make appworld` (its own "
                            "venv) or set JAXDM_APPWORLD_PYTHON / params.python")
    return path


@dataclasses.dataclass(frozen=True)
class AppWorldParams:
    """Where AppWorld is (root: data/tasks, data/api_docs) and which tasks (task_ids, else the
    dataset's), the Python that runs it, the turn budget, output cut, live-session cap and the
    per-cell timeout with its grace."""
    root: str                          # APPWORLD_ROOT (holds data/tasks, data/api_docs)
    task_ids: tuple[str, ...] = ()     # empty: the ids of `dataset`
    dataset: str = "train"
    python: str = ""                   # see appworld_python
    max_turns: int = 50                # seed 001 names no AppWorld number; as its SWE-bench
    max_output_chars: int = 2000
    max_live_sessions: int = 8
    cell_timeout: int = 30             # AppWorld's own per-execution limit (timeout_seconds)
    grace: float = 30.0                # extra seconds before a silent worker is killed
    start_timeout: float = 180.0       # seconds a worker may take to load its task

    def __post_init__(self):
        if not isinstance(self.root, str) or not os.path.isdir(self.root):
            raise ValueError(f"AppWorldParams.root {self.root!r} is not a folder")
        if not all(isinstance(t, str) and t for t in self.task_ids):
            raise ValueError(f"task_ids must be non-empty strings, got {self.task_ids!r}")
        if min(self.max_turns, self.max_output_chars, self.max_live_sessions,
               self.cell_timeout) < 1 or not (self.grace > 0 and self.start_timeout > 0):
            raise ValueError("max_turns, max_output_chars, max_live_sessions, cell_timeout "
                             "must be >= 1 and grace, start_timeout > 0")


def _worker(params: AppWorldParams) -> JsonLineChild:
    env = {"APPWORLD_ROOT": os.path.abspath(params.root), "PATH": "/usr/bin:/bin",
           "LANG": "C.UTF-8", "HOME": os.path.expanduser("~")}
    return JsonLineChild([appworld_python(params.python), "-I", _CHILD],
                         cwd=os.path.abspath(params.root), env=env)


def _checked(reply: dict, what: str) -> dict:
    if "error" in reply:
        raise AppWorldError(f"AppWorld {what} failed:\n{reply['error']}")
    return reply


class AppWorldSession:
    """One task world in its worker (a ``jaxdm.envs.repl.ReplSession``)."""

    def __init__(self, task_id: str, params: AppWorldParams):
        self.task_id, self.params = task_id, params
        self._cells: list[str] = []   # cells that took effect, replayed into a new worker
        self.restarts = 0
        self.facts = self._start()

    def _start(self) -> dict:
        p = self.params
        self._child = _worker(p)
        try:
            facts = _checked(self._child.call(
                {"op": "open", "task_id": self.task_id,
                 "experiment_name": f"jaxdm-{uuid.uuid4().hex[:12]}",
                 "timeout_seconds": p.cell_timeout, "max_interactions": 10 * p.max_turns + 10},
                p.start_timeout), f"task {self.task_id!r}")
            for code in self._cells:
                self._child.call({"op": "exec", "code": code}, p.cell_timeout + p.grace)
        except (ChildLost, AppWorldError):
            self._child.kill()
            raise
        return facts

    def execute(self, code: str) -> ExecResult:
        """Run one code cell in the task's AppWorld (a worker process): its output and whether it
        took effect (a cell that timed out or killed the worker did not)."""
        try:
            reply = _checked(self._child.call({"op": "exec", "code": code},
                                              self.params.cell_timeout + self.params.grace),
                             "execute")
        except ChildLost as e:
            self.restarts += 1
            self._start()
            return ExecResult(f"Execution failed. {e}; the REPL was restarted from the state "
                              "before this cell.", ok=False, took_effect=False)
        self._cells.append(code)
        out = reply["output"]
        return ExecResult(out, ok=not out.startswith("Execution failed"))

    def completed(self) -> bool:
        """Whether the agent marked the task complete (apis.supervisor.complete_task)."""
        return bool(_checked(self._child.call({"op": "completed"}, 60.0),
                             "task_completed")["completed"])

    def evaluate(self) -> Evaluation:
        """The official evaluation: requirement 1 is AppWorld's ``success`` (so the reward is
        exactly it), then each test of the task's suite."""
        r = _checked(self._child.call({"op": "evaluate"}, 120.0), "evaluate")
        reqs = [("success (appworld evaluate)", bool(r["success"]))]
        reqs += [(t, True) for t in r["passes"]] + [(t, False) for t in r["failures"]]
        return Evaluation(tuple(reqs))

    def close(self) -> None:
        """Stop the session's worker process."""
        self._child.close(timeout=10.0)


class AppWorldEnv(ReplSessionEnv):
    """The official AppWorld tasks as a code-as-action environment (see module docstring)."""

    name = "appworld"

    def __init__(self, params: AppWorldParams):
        super().__init__()
        self._params = params
        self._task_ids: dict[tuple, tuple[str, ...]] = {}

    @property
    def default_params(self) -> AppWorldParams:
        """The params this env was built with."""
        return self._params

    def task_ids(self, params: AppWorldParams | None = None) -> tuple[str, ...]:
        """The tasks episodes play (read once per root and dataset)."""
        p = params or self._params
        if p.task_ids:
            return p.task_ids
        key = (p.root, p.dataset)
        if key not in self._task_ids:
            child = _worker(p)
            try:
                ids = _checked(child.call({"op": "task_ids", "dataset": p.dataset},
                                          p.start_timeout), f"dataset {p.dataset!r}")["task_ids"]
            finally:
                child.close()
            if not ids:
                raise AppWorldError(f"dataset {p.dataset!r} under {p.root} has no tasks")
            self._task_ids[key] = tuple(ids)
        return self._task_ids[key]

    def open_session(self, seed: int, params: AppWorldParams) -> AppWorldSession:
        """A fresh AppWorld session of the task ``seed`` picks (modulo the task count)."""
        ids = self.task_ids(params)
        return AppWorldSession(ids[seed % len(ids)], params)

    def intro(self, session: AppWorldSession, params: AppWorldParams):
        """(goal, task type, first observation: the task and its supervisor, code menu) of a fresh
        session."""
        f, sup = session.facts, session.facts["supervisor"]
        obs = (f"Task: {f['instruction']}\nSupervisor: {sup.get('first_name', '')} "
               f"{sup.get('last_name', '')} ({sup.get('email', '')}, "
               f"{sup.get('phone_number', '')}); now {f['datetime']}.\nWrite Python in the "
               "persistent REPL; `apis.<app>.<api>(...)` reaches the apps "
               "(apis.api_docs.show_app_descriptions() lists them; credentials from "
               "apis.supervisor.show_account_passwords()). Finish with "
               "apis.supervisor.complete_task(answer=...).")
        scenario = session.task_id.rpartition("_")[0] or session.task_id
        return f["instruction"], scenario, obs, MENU


def make_appworld_env(**kwargs) -> AppWorldEnv:
    """``AppWorldEnv(AppWorldParams(**kwargs))`` (``task_ids`` as a list; an ``EnvFactory``
    target)."""
    if "task_ids" in kwargs:
        kwargs["task_ids"] = tuple(kwargs["task_ids"])
    return AppWorldEnv(AppWorldParams(**kwargs))
