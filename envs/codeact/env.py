"""``CodeActEnv``: the CodeAct tasks (``tasks``) as a ``jaxdm.envs.repl.ReplSessionEnv``.

One sandboxed REPL per episode (``sandbox.Sandbox``), observation = what the cell printed,
action = code, reward = the task's validation suite (1.0 when all requirements pass) once
``apis.supervisor.complete_task`` was called or the turn budget is spent. ``admissible_actions``
is the task's code menu (its reference cells plus plausible wrong ones), which an
option-scoring policy chooses from; any other code is accepted as well.
"""
from __future__ import annotations

import dataclasses

from jaxdm.envs.codeact.sandbox import Sandbox, SandboxLimits
from jaxdm.envs.codeact.tasks import SPLITS, TASK_TYPES
from jaxdm.envs.repl import ReplSessionEnv

__all__ = ["CodeActParams", "CodeActEnv", "make_codeact_env"]


@dataclasses.dataclass(frozen=True)
class CodeActParams:
    """Params of the CodeAct env: split and task types, the turn budget, output cut, live-session
    cap and the sandbox limits; bad values are ValueErrors."""
    split: str = "train"
    task_types: tuple[str, ...] = TASK_TYPES
    max_turns: int = 8
    max_output_chars: int = 600
    max_live_sessions: int = 64
    limits: SandboxLimits = SandboxLimits()

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        bad = [t for t in self.task_types if t not in TASK_TYPES]
        if bad or not self.task_types:
            raise ValueError(f"task_types must be a non-empty subset of {list(TASK_TYPES)}, "
                             f"got {list(self.task_types)}")
        if self.max_turns < 1 or self.max_output_chars < 1 or self.max_live_sessions < 1:
            raise ValueError("max_turns, max_output_chars and max_live_sessions must be >= 1")


class CodeActEnv(ReplSessionEnv):
    """Code-as-action tasks over small simulated apps (clock, notes, wallet, ...), each episode a
    sandboxed Python REPL (ReplSessionEnv)."""
    name = "codeact"

    def __init__(self, params: CodeActParams | None = None):
        super().__init__()
        self._params = params or CodeActParams()

    @property
    def default_params(self) -> CodeActParams:
        """The params this env was built with."""
        return self._params

    def open_session(self, seed: int, params: CodeActParams) -> Sandbox:
        """A fresh sandbox of task ``seed`` in the params' split and task types."""
        return Sandbox(seed, params.split, tuple(params.task_types), params.limits)

    def intro(self, session: Sandbox, params: CodeActParams):
        """(goal: the instruction, task type, first observation: the task and how to reach the apps,
        code menu) of a fresh session."""
        f = session.facts
        obs = (f"Task: {f['instruction']}\nWrite Python; `apis` reaches the apps "
               f"(apis.api_docs.show_app_descriptions() lists them). Finish with "
               f"apis.supervisor.complete_task(answer=...).")
        return f["instruction"], f["task_type"], obs, f["menu"]


def make_codeact_env(**kwargs) -> CodeActEnv:
    """``CodeActEnv(CodeActParams(**kwargs))`` (``task_types`` as a list; ``limits`` a dict)."""
    if "task_types" in kwargs:
        kwargs["task_types"] = tuple(kwargs["task_types"])
    if isinstance(kwargs.get("limits"), dict):
        kwargs["limits"] = SandboxLimits(**kwargs["limits"])
    return CodeActEnv(CodeActParams(**kwargs))
