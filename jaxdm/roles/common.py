"""What every role shares: the prompt version and the trajectory-entry serialisation."""
from __future__ import annotations

import json
from typing import Any

from jaxdm.trajectory import Trajectory

PROMPT_VERSION = "jaxdm-prompts-v3"


def entry_line(observation: str, action: str | None, index: int | None = None) -> str:
    """One trajectory entry as a JSON line ``{"observation": ..., "action": ...}``.

    With ``index`` (judge contexts, v3) the zero-based entry index comes first:
    ``{"index": 3, "observation": ..., "action": ...}``, so a question that names a target
    index can be matched to its line without counting lines. The Actor's history omits it.
    """
    entry: dict[str, Any] = {} if index is None else {"index": index}
    entry.update(observation=observation, action=action)
    return json.dumps(entry, ensure_ascii=False)


def quote_action(action: str) -> str:
    """An action text quoted as a JSON string (``"go to shelf 1"``), as questions cite it."""
    return json.dumps(action, ensure_ascii=False)


def check_trajectory(traj: Any) -> None:
    """A ``Trajectory`` with at least one executed action, else TypeError / ValueError."""
    if not isinstance(traj, Trajectory):
        raise TypeError(f"expected a jaxdm.trajectory.Trajectory, got {type(traj).__name__}")
    if not traj.steps:
        raise ValueError("trajectory has no executed actions to judge")
