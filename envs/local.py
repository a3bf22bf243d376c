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

from jaxdm.envs.recorder import (BatchStep, EpisodeRecorder, RecordedPool, check_actions,
                                 reset_info_of)

__all__ = ["LocalVectorEnv"]


class LocalVectorEnv(RecordedPool):
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
        self._in_flight: BatchStep | None = None   # the finished step step_wait returns

    def step_async(self, actions: Sequence[Any]) -> None:
        """Step every slot whose action is not ``None`` (synchronously); ``step_wait`` returns
        the ``BatchStep``. The env key of a step depends only on the slot's task and step
        count, so skipping other slots never changes a slot's trajectory."""
        if self._in_flight is not None:
            raise RuntimeError("step_async called twice without step_wait")
        if not self.recorder.started:
            raise RuntimeError("LocalVectorEnv.step called before reset()")
        actions = check_actions(actions, self.num_envs)
        eps = self.recorder.episodes
        results = {i: ("ok", self.env.step(key, eps[i].state, actions[i], self.params))
                   for i, key in self.recorder.stepping(actions).items()}
        self._in_flight = self.recorder.collect(actions, results, self._run_resets)

    def step_wait(self) -> BatchStep:
        """The BatchStep of the step_async call before (stepped in-process); without one a
        RuntimeError."""
        if self._in_flight is None:
            raise RuntimeError("step_wait called without step_async")
        out, self._in_flight = self._in_flight, None
        return out

    def close(self) -> None:
        """Nothing to close: the envs run in this process."""
        pass

    def _run_resets(self, seeds: dict[int, int]) -> dict[int, tuple]:
        out = {}
        for i, s in seeds.items():
            obs, state = self.env.reset(s, self.params)
            out[i] = ("ok", (obs, state, reset_info_of(self.env, state, self.params)))
        return out
