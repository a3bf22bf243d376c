"""A wrapper that makes any environment's steps slow, to study env-worker backends.

``DelayedEnv(inner, step_delay_s)`` waits ``step_delay_s`` before every step of ``inner``:
sleeping by default (an env that waits on something else: a browser, a simulator in another
process, a remote service), or keeping one core busy with ``busy=True`` (a compute-bound
env). Everything else (reset, ``reset_info``, ``warm_up``, ``name``, params) is the inner
env's. ``make_delayed_env`` is the picklable factory ``VectorEnv`` workers call.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

from jaxdm.envs.core import Environment
from jaxdm.envs.vector import EnvFactory


class DelayedEnv(Environment):
    """``inner`` with ``step_delay_s`` seconds (slept, or spun with ``busy``) before each step."""

    def __init__(self, inner: Environment, step_delay_s: float, *, busy: bool = False):
        if isinstance(step_delay_s, bool) or not isinstance(step_delay_s, (int, float)) \
                or not step_delay_s >= 0:
            raise ValueError(f"step_delay_s must be a number of seconds >= 0, got {step_delay_s!r}")
        self.inner = inner
        self.step_delay_s = float(step_delay_s)
        self.busy = bool(busy)
        self.name = getattr(inner, "name", "env")

    def __getattr__(self, attr: str) -> Any:
        # Optional hooks (reset_info, warm_up) exist exactly when the inner env has them.
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def default_params(self):
        """The wrapped env's default params."""
        return self.inner.default_params

    def reset_env(self, key, params):
        """The wrapped env's reset, undelayed."""
        return self.inner.reset(key, params)

    def step_env(self, key, state, action, params):
        """The wrapped env's step after step_delay_s seconds (spent spinning the CPU when ``busy``,
        else sleeping), to test pipelined rollouts."""
        if self.busy:
            end = time.perf_counter() + self.step_delay_s
            while time.perf_counter() < end:
                pass
        elif self.step_delay_s:
            time.sleep(self.step_delay_s)
        return self.inner.step(key, state, action, params)


def make_delayed_env(target: str, kwargs: Mapping[str, Any] | None = None, *,
                     step_delay_s: float, busy: bool = False) -> DelayedEnv:
    """Build ``EnvFactory(target, kwargs)()`` and wrap it in ``DelayedEnv``."""
    return DelayedEnv(EnvFactory(target, kwargs or {})(), step_delay_s, busy=busy)
