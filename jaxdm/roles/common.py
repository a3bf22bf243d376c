"""What every role shares: the prompt version and the trajectory-entry serialisation."""
from __future__ import annotations

import json
from typing import Any

from jaxdm.trajectory import Trajectory

PROMPT_VERSION = "jaxdm-prompts-v2"


def entry_line(observation: str, action: str | None) -> str:
    """One trajectory entry as a JSON line ``{"observation": ..., "action": ...}``."""
    return json.dumps({"observation": observation, "action": action}, ensure_ascii=False)


def check_trajectory(traj: Any) -> None:
    """A ``Trajectory`` with at least one executed action, else TypeError / ValueError."""
    if not isinstance(traj, Trajectory):
        raise TypeError(f"expected a jaxdm.trajectory.Trajectory, got {type(traj).__name__}")
    if not traj.steps:
        raise ValueError("trajectory has no executed actions to judge")
