"""The recorded-trajectory data type shared by environments, judges, screening and RL.

A trajectory is what an agent saw and did in one episode. Entry ``t`` of ``steps`` holds the
observation the agent saw *before* acting and the action it then took, so that a Prefix
judge context for target ``t`` is ``steps[:t + 1]`` (ending with the target action, without
the observation that followed it) and a Hindsight context is all of ``steps`` plus
``final_observation``. Environment annotations (milestone / no-op) and the outcome are
carried for judges and metrics, never shown to a judge (``jaxdm.roles`` masks them).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Iterator, Mapping

from jaxdm.jsonl import parse_lines, write_records

ACTION_TYPES = ("milestone", "other", "no_op")


@dataclasses.dataclass(frozen=True)
class Step:
    """One executed action: the observation before it, the action text, and annotations."""

    observation: str
    action: str
    valid: bool = True
    # Environment annotations, e.g. {"milestone": bool, "no_op": bool, "subgoal": str}.
    annotations: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def action_type(self) -> str:
        """'milestone', 'no_op' or 'other' (a milestone wins if both are set)."""
        if self.annotations.get("milestone"):
            return "milestone"
        if self.annotations.get("no_op"):
            return "no_op"
        return "other"


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One episode: goal, executed steps, final observation and outcome.

    ``reward`` is the episode's outcome reward (ALFWorld: 1.0 if won; WebShop: the score),
    ``success`` whether the task was fully achieved, ``budget`` the action budget the episode
    ran under (the Value question reports the remaining budget), ``task_type`` an env-specific
    label (ALFWorld: pick / look / clean / heat / cool / pick_two) and ``env`` the env name.
    ``final_observation_terminal`` marks a terminal observation that judges must not see
    verbatim (WebShop's purchase page: replaced by "Shopping process has ended.").
    """

    goal: str
    steps: tuple[Step, ...]
    final_observation: str
    reward: float = 0.0
    success: bool = False
    budget: int = 30
    task_type: str = ""
    env: str = ""
    final_observation_terminal: bool = False
    truncated: bool = False
    error: str | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(self.steps))
        for i, s in enumerate(self.steps):
            if not isinstance(s, Step):
                raise TypeError(f"Trajectory.steps[{i}] is {type(s).__name__}, expected Step")

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def action_types(self) -> tuple[str, ...]:
        """The action type of every step (milestone, other, no_op), in order."""
        return tuple(s.action_type for s in self.steps)

    def feedback(self, t: int) -> str:
        """The observation that immediately followed action ``t``."""
        if t + 1 < len(self.steps):
            return self.steps[t + 1].observation
        return self.final_observation

    # ---- JSON ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The trajectory as plain JSON data (what from_dict reads back and write_jsonl writes)."""
        d = dataclasses.asdict(self)
        d["steps"] = [dataclasses.asdict(s) | {"annotations": dict(s.annotations)} for s in self.steps]
        d["metadata"] = dict(self.metadata)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "trajectory") -> "Trajectory":
        """Build from a dict, checking every field's type (nothing is coerced: the string
        "false" is not a bool, "1.0" is not a reward); unknown, missing or mistyped keys raise
        a ValueError naming ``where`` and the field (e.g. ``steps[2].annotations.milestone``)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")
        for key in ("goal", "steps", "final_observation"):
            if key not in d:
                raise ValueError(f"{where}: missing key {key!r}")
        if not isinstance(d["steps"], list):
            raise ValueError(f"{where}: 'steps' must be a list")
        for key, value in d.items():
            if key != "steps":
                _check_field(_TRAJECTORY_FIELDS[key], value, key, where)
        step_fields = {f.name for f in dataclasses.fields(Step)}
        steps = []
        for i, s in enumerate(d["steps"]):
            if not isinstance(s, Mapping):
                raise ValueError(f"{where}: steps[{i}] must be an object")
            bad = set(s) - step_fields
            if bad:
                raise ValueError(f"{where}: steps[{i}] has unknown key(s) {sorted(bad)}")
            for key in ("observation", "action"):
                if key not in s:
                    raise ValueError(f"{where}: steps[{i}] is missing key {key!r}")
            for key, value in s.items():
                _check_field(_STEP_FIELDS[key], value, f"steps[{i}].{key}", where)
            for key, value in s.get("annotations", {}).items():
                if key in _ANNOTATION_FIELDS:
                    _check_field(_ANNOTATION_FIELDS[key], value,
                                 f"steps[{i}].annotations.{key}", where)
            steps.append(Step(**s))
        kw = dict(d)
        kw["steps"] = tuple(steps)
        return cls(**kw)


# Field kinds checked when reading (``_check_field``). Annotations are free-form apart from
# the ones judges and metrics read.
_TRAJECTORY_FIELDS = {
    "goal": "str", "final_observation": "str", "reward": "number", "success": "bool",
    "budget": "count", "task_type": "str", "env": "str", "final_observation_terminal": "bool",
    "truncated": "bool", "error": "str?", "metadata": "object",
}
_STEP_FIELDS = {"observation": "str", "action": "str", "valid": "bool", "annotations": "object"}
_ANNOTATION_FIELDS = {"milestone": "bool", "no_op": "bool", "subgoal": "str?"}
_KIND_TEXT = {"str": "a string", "str?": "a string or null", "bool": "true or false",
              "number": "a finite number", "count": "a non-negative integer",
              "object": "a JSON object"}


def _check_field(kind: str, value: Any, field: str, where: str) -> None:
    if kind == "str?" and value is None:
        return
    ok = {
        "str": isinstance(value, str), "str?": isinstance(value, str),
        "bool": isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        "count": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        "object": isinstance(value, Mapping),
    }[kind]
    if not ok:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ValueError(f"{where}: field {field} must be {_KIND_TEXT[kind]}, got "
                         f"{type(value).__name__} {shown}")


def write_jsonl(path, trajectories: Iterable[Trajectory]) -> int:
    """Write trajectories one JSON object per line (whole: ``jsonl.write_records``); returns
    the count."""
    return write_records(path, (traj.to_dict() for traj in trajectories))


def iter_jsonl(path) -> Iterator[Trajectory]:
    """Read trajectories; a malformed line raises ValueError with the file and line number."""
    with open(path, encoding="utf-8") as f:
        for where, d in parse_lines(f, path):
            yield Trajectory.from_dict(d, where=where)


def read_jsonl(path) -> list[Trajectory]:
    """Every trajectory of a JSONL file (iter_jsonl, as a list)."""
    return list(iter_jsonl(path))
