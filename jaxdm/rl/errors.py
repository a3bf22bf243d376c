"""The exceptions that stop a training run on purpose (``jaxdm.rl.trainer`` records the reason
in the metrics file and checkpoints the last finished iteration before raising them)."""
from __future__ import annotations

from typing import Any

__all__ = ["TrainingStopped", "NonFiniteLossError", "TeacherFailureError"]


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (reason in the message and in ``metrics``)."""

    def __init__(self, message: str, metrics: dict[str, Any] | None = None):
        super().__init__(message)
        self.metrics = dict(metrics or {})


class NonFiniteLossError(TrainingStopped, FloatingPointError):
    """A loss term or gradient became NaN/inf."""


class TeacherFailureError(TrainingStopped):
    """Too many teacher requests of one iteration failed (teacher.max_failed_share)."""
