"""``LocalVectorEnv``: the in-process env pool with ``VectorEnv``'s contract (no workers).

Both pools record their episodes with ``jaxdm.envs.recorder.EpisodeRecorder``: the same task
schedule (group seeding, auto-reset), the same per-step key (``jaxdm.envs.core.step_key``),
the same info keys and the same trajectories, so an episode is the same whichever pool plays
it and whichever other slots are skipped or stepped with it. The only difference: an env
exception propagates here (in-process, it is a bug to see), where a worker pool turns it
into an errored, truncated episode.
"""
from __future__ import annotations

from typing import Any, Sequence

from jaxdm.envs.recorder import BatchStep, EpisodeRecorder, check_actions, reset_info_of
from jaxdm.trajectory import Trajectory

__all__ = ["LocalVectorEnv"]


class LocalVectorEnv:
    """In-process stand-in for ``VectorEnv`` (same reset/step contract, no workers).

    Slot ``i`` starts task ``seed + i // group_size``; finished slots are skipped and report
    ``inactive``; a ``None`` action skips a slot (``skipped``), as in ``VectorEnv``.
    ``max_steps``, ``auto_reset`` and ``env_name`` mean what they mean for ``VectorEnv``.
    ``step_async`` steps synchronously (there is nothing to overlap in-process) and
    ``step_wait`` returns the result, so rollout code has one path for both pools. Useful for
    tests, tiny environments and JAX-native ones.
    """

    steps_in_background = False  # step_async does the work; VectorEnv's workers do not

    def __init__(self, env: Any, num_envs: int, *, group_size: int = 1, params: Any = None,
                 max_steps: int | None = None, auto_reset: bool = False, env_name: str = ""):
        self.recorder = EpisodeRecorder(num_envs, group_size=group_size, env_name=env_name,
                                        max_steps=max_steps, auto_reset=auto_reset)
        self.env, self.num_envs, self.group_size = env, num_envs, group_size
        self.num_groups = num_envs // group_size
        self.params = params if params is not None else env.default_params
        self._pending: BatchStep | None = None

    @property
    def states(self) -> list[Any]:
        """The current env state of every slot (immutable: copy/replay freely)."""
        return self.recorder.states

    @property
    def trajectories(self) -> list[Trajectory]:
        return self.recorder.trajectories

    def pop_trajectories(self) -> list[Trajectory]:
        return self.recorder.pop_trajectories()

    def task_seed(self, slot: int, reset_count: int = 0) -> int:
        return self.recorder.task_seed(slot, reset_count)

    def reset(self, seed: int = 0):
        if self._pending is not None:
            raise RuntimeError("reset called while a step_async is in flight; call step_wait")
        seeds = self.recorder.begin(seed)
        results = self._resets(seeds)
        obs, infos = [None] * self.num_envs, [None] * self.num_envs
        for i, task_seed in seeds.items():
            obs[i], infos[i] = self.recorder.start(i, task_seed, results[i])
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
        if not self.recorder.started:
            raise RuntimeError("LocalVectorEnv.step called before reset()")
        actions = check_actions(actions, self.num_envs)
        eps = self.recorder.episodes
        results = {i: ("ok", self.env.step(key, eps[i].state, actions[i], self.params))
                   for i, key in self.recorder.stepping(actions).items()}
        self._pending = self.recorder.collect(actions, results, self._resets)

    def step_wait(self) -> BatchStep:
        if self._pending is None:
            raise RuntimeError("step_wait called without step_async")
        out, self._pending = self._pending, None
        return out

    def close(self) -> None:
        pass

    def _resets(self, seeds: dict[int, int]) -> dict[int, tuple]:
        out = {}
        for i, s in seeds.items():
            obs, state = self.env.reset(s, self.params)
            out[i] = ("ok", (obs, state, reset_info_of(self.env, state, self.params)))
        return out
