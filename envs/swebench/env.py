"""``SWEBenchEnv``: SWE-bench instances as a tool-call environment (R2E-Gym style, seed 001).

A ``jaxdm.envs.repl.ReplSessionEnv`` whose session is a per-episode ``RepoSandbox`` (a copy of
the instance's checkout): the state is the transcript of tool calls (pure, copyable; a
replaced worker or a Monte-Carlo continuation replays it into a fresh sandbox), the action is
one tool call, the observation the tool's output, and the reward the official grading
(``grading.grade``: the instance's eval script in the sandbox, its log graded by
``swebench.harness.grading.get_eval_report``; 1.0 when resolved) once the agent submits or
the turn budget (50, as seed 001's R2E-Gym / SWE-bench Verified runs) is spent.

An action is a JSON object ``{"name": TOOL, "arguments": {...}}`` (the shape of an OpenAI tool
call, with the arguments as an object; ``tool_call`` writes one). JSON keeps an edit's
newlines inside one line, so a generated action survives whitespace joining. Tools:

* ``view`` ``{"path"}``: a file with line numbers, or the files under a folder;
* ``edit`` ``{"path", "old", "new"}``: replace the one occurrence of ``old``;
* ``run_tests`` ``{"args": [...]}`` (optional): ``python -m pytest -q`` in the sandbox;
* ``submit`` ``{}``: end the episode and grade the patch.

A call that is not one of these is refused (``valid`` False, nothing runs). Instances come
from ``params.instances`` (the package's dataset format, read by its loader) and task seed
``s`` plays instance ``s % n``; its checkout is ``<params.repo_root>/<instance_id>``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from typing import Any

from jaxdm.envs.repl import Evaluation, ExecResult, ReplSessionEnv
from jaxdm.envs.swebench import SWE_TURN_BUDGET
from jaxdm.envs.swebench.grading import RepoSandbox, grade, load_instances

__all__ = ["SWE_TURN_BUDGET", "TOOLS", "SWEParams", "SWESession", "SWEBenchEnv",
           "ToolCallError", "make_swebench_env", "parse_tool_call", "tool_call"]

# tool -> (required string arguments, optional arguments)
TOOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "view": (("path",), ()),
    "edit": (("path", "old", "new"), ()),
    "run_tests": ((), ("args",)),
    "submit": ((), ()),
}


class ToolCallError(ValueError):
    """An action that is not a well-formed call of one of ``TOOLS``."""


def tool_call(name: str, **arguments: Any) -> str:
    """The action text of a call of tool ``name`` (checked by ``parse_tool_call``)."""
    text = json.dumps({"name": name, "arguments": arguments})
    parse_tool_call(text)
    return text


def parse_tool_call(action: str) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of an action; ``ToolCallError`` naming what is wrong."""
    usage = ('one JSON object {"name": TOOL, "arguments": {...}} with TOOL one of '
             + ", ".join(f"{t}({', '.join(req + tuple(o + '?' for o in opt))})"
                         for t, (req, opt) in TOOLS.items()))
    try:
        call = json.loads(action)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"not JSON ({e.msg} at character {e.pos}); expected {usage}") from None
    if not isinstance(call, dict) or "name" not in call or set(call) - {"name", "arguments"}:
        raise ToolCallError(f"expected {usage}")
    name, args = call["name"], call.get("arguments", {})
    if name not in TOOLS:
        raise ToolCallError(f"unknown tool {name!r}; expected {usage}")
    if not isinstance(args, dict):
        raise ToolCallError(f"{name}: 'arguments' must be an object, got {type(args).__name__}")
    required, optional = TOOLS[name]
    missing = [k for k in required if k not in args]
    unknown = sorted(set(args) - set(required) - set(optional))
    if missing or unknown:
        raise ToolCallError(f"{name}: missing argument(s) {missing}, unknown {unknown}; "
                            f"expected {usage}")
    for k in required:
        if not isinstance(args[k], str):
            raise ToolCallError(f"{name}: argument {k!r} must be a string, got "
                                f"{type(args[k]).__name__}")
    if "args" in args and not (isinstance(args["args"], list)
                               and all(isinstance(a, str) for a in args["args"])):
        raise ToolCallError(f"{name}: 'args' must be a list of strings")
    return name, dict(args)


@dataclasses.dataclass(frozen=True)
class SWEParams:
    """A SWE-bench run: the instances file (swebench's format), the root of the per-instance
    checkouts, the turn budget, output cut, live-session cap, and the timeouts of a test run and of
    grading."""
    instances: str                 # .json / .jsonl / .parquet in swebench's dataset format
    repo_root: str                 # <repo_root>/<instance_id>: a git checkout at base_commit
    max_turns: int = SWE_TURN_BUDGET
    max_output_chars: int = 4000
    max_live_sessions: int = 8
    command_timeout: float = 60.0  # seconds one run_tests may take
    grade_timeout: float = 300.0   # seconds the eval script may take
    python: str = ""               # interpreter of run_tests ("" = this one)
    menu_files: int = 20           # files offered as view calls in admissible_actions

    def __post_init__(self):
        if not isinstance(self.instances, str) or not self.instances:
            raise ValueError("SWEParams.instances must name an instances file")
        if not isinstance(self.repo_root, str) or not os.path.isdir(self.repo_root):
            raise ValueError(f"SWEParams.repo_root {self.repo_root!r} is not a folder")
        if min(self.max_turns, self.max_output_chars, self.max_live_sessions) < 1:
            raise ValueError("max_turns, max_output_chars and max_live_sessions must be >= 1")
        if not (self.command_timeout > 0 and self.grade_timeout > 0) or self.menu_files < 0:
            raise ValueError("command_timeout and grade_timeout must be > 0, menu_files >= 0")


class SWESession:
    """One episode's sandbox and tools (a ``jaxdm.envs.repl.ReplSession``)."""

    def __init__(self, instance: dict, repo_dir: str, params: SWEParams):
        self.instance, self.params = instance, params
        self.box = RepoSandbox(repo_dir, command_timeout=params.command_timeout)
        self.submitted = False

    def execute(self, action: str) -> ExecResult:
        """Run one JSON tool call (view, edit, run_tests, or the submit that ends it) in the instance's sandbox
        checkout; its output, or an invalid-call result that took no effect."""
        try:
            name, args = parse_tool_call(action)
        except ToolCallError as e:
            return ExecResult(f"Invalid tool call: {e}", ok=False, took_effect=False)
        try:
            if name == "view":
                return ExecResult(self.box.view(args["path"]), ok=True)
            if name == "edit":
                return ExecResult(self.box.edit(args["path"], args["old"], args["new"]), ok=True)
            if name == "run_tests":
                python = self.params.python or sys.executable
                command = shlex.join([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      *args.get("args", [])])
                code, out = self.box.run(command)
                return ExecResult(f"{out}\n[pytest exit code {code}]", ok=True)
            self.submitted = True
            return ExecResult("Submitted. Your patch:\n" + self.box.patch(), ok=True)
        except (ValueError, OSError, UnicodeDecodeError) as e:  # a bad path, an edit not found
            return ExecResult(f"{name} failed: {e}", ok=False)

    def completed(self) -> bool:
        """Whether the agent submitted its patch."""
        return self.submitted

    def evaluate(self) -> Evaluation:
        """The official grading: requirement 1 is swebench's ``resolved``, then each listed
        FAIL_TO_PASS / PASS_TO_PASS test (so the reward is ``grade``'s reward exactly)."""
        result = grade(self.instance, self.box, timeout=self.params.grade_timeout)
        reqs = [("resolved (swebench get_eval_report)", result.resolved)]
        status = result.report.get("tests_status", {})
        for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            for outcome in ("success", "failure"):
                reqs += [(f"{group} {t}", outcome == "success")
                         for t in status.get(group, {}).get(outcome, [])]
        return Evaluation(tuple(reqs), report=json.dumps(result.report, sort_keys=True))

    def close(self) -> None:
        """Remove the session's sandbox."""
        self.box.close()


class SWEBenchEnv(ReplSessionEnv):
    """SWE-bench instances as a tool-call environment (see module docstring)."""

    name = "swebench"

    def __init__(self, params: SWEParams):
        super().__init__()
        self._params = params
        self._instances: dict[str, list[dict]] = {}   # instances file -> its instances

    @property
    def default_params(self) -> SWEParams:
        """The params this env was built with."""
        return self._params

    def instances(self, params: SWEParams | None = None) -> list[dict]:
        """The instances of ``params.instances`` (read once per file)."""
        path = (params or self._params).instances
        if path not in self._instances:
            found = load_instances(path)
            if not found:
                raise ValueError(f"{path}: no SWE-bench instances")
            self._instances[path] = found
        return self._instances[path]

    def open_session(self, seed: int, params: SWEParams) -> SWESession:
        """A fresh session (a sandbox copy of the checkout at base_commit) of the instance ``seed``
        picks (modulo the instance count); a missing checkout is a named error."""
        found = self.instances(params)
        instance = found[seed % len(found)]
        repo_dir = os.path.join(params.repo_root, instance["instance_id"])
        if not os.path.isdir(os.path.join(repo_dir, ".git")):
            raise ValueError(f"instance {instance['instance_id']}: no git checkout at "
                             f"{repo_dir} (check out {instance['repo']} at its base_commit)")
        return SWESession(instance, repo_dir, params)

    def intro(self, session: SWESession, params: SWEParams):
        """(goal: the issue text, task type: the repository, first observation, menu: views of the
        first files) of a fresh session."""
        inst = session.instance
        menu = [tool_call("view", path=f) for f in session.box.files()[:params.menu_files]]
        menu += [tool_call("run_tests"), tool_call("submit")]
        obs = (f"Repository {inst['repo']} (instance {inst['instance_id']}). Resolve this "
               f"issue:\n{inst['problem_statement']}\n\nOne tool call per turn, as JSON "
               '{"name": TOOL, "arguments": {...}}: view(path), edit(path, old, new), '
               f"run_tests(args=[]), submit(). {params.max_turns} turns.")
        return inst["problem_statement"], inst["repo"], obs, menu


def make_swebench_env(**kwargs) -> SWEBenchEnv:
    """``SWEBenchEnv(SWEParams(**kwargs))`` (an ``EnvFactory`` target)."""
    return SWEBenchEnv(SWEParams(**kwargs))
