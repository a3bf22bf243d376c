"""Tiny environments for the rollout-pipeline and subset-stepping tests (no JAX import, so
``VectorEnv`` workers start fast). Importable by spawned workers through ``sys.path``."""
from __future__ import annotations

import dataclasses
import time

from jaxdm.envs.core import Environment, seed_of


@dataclasses.dataclass(frozen=True)
class KeyedState:
    task: int
    count: int = 0
    keys: tuple = ()  # the per-step env keys seen so far

    @property
    def target(self) -> int:
        return self.task % 3 + 2  # tasks need 2, 3 or 4 steps


class KeyedEnv(Environment):
    """Task k ends after k % 3 + 2 steps; each observation shows the step's env key, so a
    test can check that keys (hence trajectories) do not depend on which other slots stepped.
    Admissible actions "a" and "b"; "b" pays 0.5 at the end instead of 1."""

    name = "keyed"

    @property
    def default_params(self):
        return None

    def reset_info(self, state, params=None):
        return {"goal": f"reach {state.target}", "task_type": f"t{state.target}",
                "budget": 6, "admissible_actions": ["a", "b"]}

    def reset_env(self, key, params):
        state = KeyedState(task=seed_of(key))
        return f"task {state.task} start", state

    def step_env(self, key, state, action, params):
        k = seed_of(key)
        new = dataclasses.replace(state, count=state.count + 1, keys=state.keys + (k,))
        done = new.count >= new.target
        reward = (1.0 if action == "a" else 0.5) if done else 0.0
        info = {"valid": action in ("a", "b"), "won": done and action == "a",
                "admissible_actions": ["a", "b"], "milestone": done, "no_op": False}
        return f"task {new.task} step {new.count} key {k} did {action}", new, reward, done, info


class SleepyEnv(KeyedEnv):
    """``KeyedEnv`` whose every step sleeps ``step_s`` seconds (a slow host env)."""

    name = "sleepy"

    def __init__(self, step_s: float = 0.1):
        self.step_s = step_s

    def step_env(self, key, state, action, params):
        time.sleep(self.step_s)
        return super().step_env(key, state, action, params)
