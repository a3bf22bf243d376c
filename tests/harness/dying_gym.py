"""A DECISION GYM whose env worker SIGKILLs itself on chosen steps (the env-worker death
tests of tests/harness/test_harness_env_backend.py). Its own light module: process and Ray
workers import it to build the env."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from jaxdm.envs.core import step_key
from jaxdm.envs.decision_gym import DecisionGym

STEP_KEY_STRIDE = step_key(1, 0)   # a pool's step key is task * stride + step


class DyingGym(DecisionGym):
    """Kills its worker at step ``at_step`` of each task in ``tasks``, once per task (a marker
    file in ``marker_dir`` remembers it) or every time (``always``); never in ``parent``, the
    test's own process (the harness asks its local env pure questions only)."""

    def __init__(self, marker_dir: str, tasks: tuple[int, ...], parent: int, at_step: int = 1,
                 always: bool = False):
        self.marker_dir, self.tasks, self.parent = Path(marker_dir), tuple(tasks), parent
        self.at_step, self.always = at_step, always

    def step_env(self, key, state, action, params):
        task, t = divmod(int(key), STEP_KEY_STRIDE)
        if task in self.tasks and t == self.at_step and os.getpid() != self.parent:
            marker = self.marker_dir / f"killed-{task}"
            if self.always or not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return super().step_env(key, state, action, params)
