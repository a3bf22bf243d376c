"""``LocalVectorEnv``: the in-process env pool with ``VectorEnv``'s contract (no workers).

Both pools key every env step with ``jaxdm.envs.core.step_key(task_seed, t)`` (the one
per-step key schedule), so an episode is the same whichever pool plays it and whichever
other slots are skipped or stepped with it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxdm.envs.core import step_key
from jaxdm.envs.vector import BatchStep

__all__ = ["LocalVectorEnv"]


class LocalVectorEnv:
    """In-process stand-in for ``VectorEnv`` (same reset/step contract, no workers).

    Slot ``i`` starts task ``seed + i // group_size``; finished slots are skipped and report
    ``inactive``; a ``None`` action skips a slot (``skipped``), as in ``VectorEnv``.
    ``step_async`` steps synchronously (there is nothing to overlap in-process) and
    ``step_wait`` returns the result, so rollout code has one path for both pools. Useful for
    tests, tiny environments and JAX-native ones.
    """

    steps_in_background = False  # step_async does the work; VectorEnv's workers do not

    def __init__(self, env: Any, num_envs: int, *, group_size: int = 1, params: Any = None):
        if num_envs < 1 or group_size < 1 or num_envs % group_size:
            raise ValueError(f"group_size={group_size} must divide num_envs={num_envs}")
        self.env, self.num_envs, self.group_size = env, num_envs, group_size
        self.num_groups = num_envs // group_size
        self.params = params if params is not None else env.default_params
        self._states: list[Any] = [None] * num_envs
        self._obs: list[Any] = [""] * num_envs
        self._done = np.zeros(num_envs, bool)
        self._steps = np.zeros(num_envs, int)
        self._seeds = [0] * num_envs
        self._seed = 0
        self._was_reset = False
        self._pending: BatchStep | None = None

    @property
    def states(self) -> list[Any]:
        """The current env state of every slot (immutable: copy/replay freely)."""
        return list(self._states)

    def task_seed(self, slot: int) -> int:
        return self._seed + slot // self.group_size

    def reset(self, seed: int = 0):
        if self._pending is not None:
            raise RuntimeError("reset called while a step_async is in flight; call step_wait")
        self._seed = int(seed)
        obs, infos = [], []
        for i in range(self.num_envs):
            s = self.task_seed(i)
            o, st = self.env.reset(s, self.params)
            hook = getattr(self.env, "reset_info", None)
            info = dict(hook(st, self.params)) if callable(hook) else {}
            info.update(error=None, task_seed=s)
            self._states[i], self._seeds[i], self._obs[i] = st, s, o
            obs.append(o)
            infos.append(info)
        self._done[:] = False
        self._steps[:] = 0
        self._was_reset = True
        return obs, infos

    def step(self, actions: Sequence[Any]) -> BatchStep:
        """One action per slot (``None``: leave that slot as it is); see ``step_async``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Any]) -> None:
        """Step every slot whose action is not ``None`` (synchronously); ``step_wait`` returns
        the ``BatchStep``. The env key of a step depends only on the slot's task and step
        count, so skipping other slots never changes a slot's trajectory."""
        if self._pending is not None:
            raise RuntimeError("step_async called twice without step_wait")
        if not self._was_reset:
            raise RuntimeError("LocalVectorEnv.step called before reset()")
        if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__"):
            raise TypeError(f"actions must be a sequence of num_envs={self.num_envs} actions "
                            f"(None: skip the slot), got {type(actions).__name__}")
        if len(actions) != self.num_envs:
            raise ValueError(f"actions has length {len(actions)}, expected num_envs="
                             f"{self.num_envs}")
        obs, infos = [None] * self.num_envs, [None] * self.num_envs
        rewards = np.zeros(self.num_envs, np.float32)
        dones = np.zeros(self.num_envs, bool)
        for i, a in enumerate(actions):
            if self._done[i] or a is None:
                obs[i], dones[i] = self._obs[i], bool(self._done[i])
                infos[i] = {"error": None, "task_seed": self._seeds[i]}
                if a is None:
                    infos[i]["skipped"] = True
                if self._done[i]:
                    infos[i]["inactive"] = True
                continue
            key = step_key(self._seeds[i], int(self._steps[i]))
            o, st, r, d, info = self.env.step(key, self._states[i], a, self.params)
            self._states[i], self._obs[i] = st, o
            self._steps[i] += 1
            self._done[i] = bool(d)
            obs[i], rewards[i], dones[i] = o, float(r), bool(d)
            infos[i] = dict(info, error=None, task_seed=self._seeds[i])
        self._pending = BatchStep(obs, rewards, dones, infos, list(self._states))

    def step_wait(self) -> BatchStep:
        if self._pending is None:
            raise RuntimeError("step_wait called without step_async")
        out, self._pending = self._pending, None
        return out

    def close(self) -> None:
        pass
