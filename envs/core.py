"""The environment contract (gymnax style) shared by every jaxdm environment.

An ``Environment`` holds no episode state. ``reset(key, params) -> (obs, state)`` and
``step(key, state, action, params) -> (obs, state, reward, done, info)`` are pure: ``state``
and ``params`` are immutable dataclasses, so an episode can be copied, replayed from its
actions and continued. JAX-native environments (BabyAI) keep fixed-shape arrays in a
``flax.struct`` state and are jitted/vmapped; host-side text environments (ALFWorld, WebShop,
DECISION GYM) keep frozen symbolic state (tuples, frozensets) and run in ``VectorEnv`` workers.

For text environments ``key`` may be a JAX PRNG key or a plain int seed (``seed_of`` turns
either into an int), ``action`` is a command string, ``obs`` is text, and ``info`` is a
``StepInfo`` mapping with at least the keys below.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Generic, Mapping, TypeVar

import numpy as np

S = TypeVar("S")
P = TypeVar("P")

# Keys every text environment's step info carries.
INFO_KEYS = ("admissible_actions", "valid", "won", "milestone", "no_op")


def step_key(task_seed: int, t: int) -> int:
    """The env key of step ``t`` of an episode of task ``task_seed``: the one per-step key
    schedule of every env loop (``jaxdm.envs.recorder.EpisodeRecorder``, hence ``VectorEnv``
    and ``LocalVectorEnv``; ``replay``; the expert agents; the JAX rollouts), so an episode does not
    depend on which pool plays it or on the other slots."""
    return int(task_seed) * 1_000_003 + int(t)


def seed_of(key: Any) -> int:
    """An int seed from an int or a JAX PRNG key (typed or raw uint32 array)."""
    if isinstance(key, (int, np.integer)):
        if isinstance(key, bool):
            raise TypeError("seed must be an int or a JAX PRNG key, got bool")
        return int(key)
    import jax

    arr = key
    if jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
        arr = jax.random.key_data(key)
    arr = np.asarray(arr).astype(np.uint64).ravel()
    if arr.size == 0:
        raise ValueError("empty PRNG key")
    return int((arr[0] << np.uint64(32)) | arr[-1]) & 0x7FFFFFFF


class Environment(abc.ABC, Generic[S, P]):
    """Stateless environment: subclasses implement ``reset_env`` and ``step_env``."""

    name: str = "env"

    @property
    def default_params(self) -> P:
        """The params reset and step use when none are given."""
        raise NotImplementedError

    def reset(self, key: Any, params: P | None = None) -> tuple[Any, S]:
        """(first observation, state) of a new episode from ``key`` (default params when None)."""
        params = self.default_params if params is None else params
        return self.reset_env(key, params)

    def step(self, key: Any, state: S, action: Any, params: P | None = None):
        """(obs, state, reward, done, info) after ``action`` in ``state`` (default params when
        None)."""
        params = self.default_params if params is None else params
        return self.step_env(key, state, action, params)

    @abc.abstractmethod
    def reset_env(self, key: Any, params: P) -> tuple[Any, S]:
        """The subclass's reset: (first observation, state) from ``key`` under ``params``."""

    @abc.abstractmethod
    def step_env(self, key: Any, state: S, action: Any, params: P):
        """The subclass's raw transition: (obs, state, reward, done, info) of ``action`` in
        ``state``."""

    def replay(self, key: Any, actions, params: P | None = None):
        """Reset with ``key`` and apply ``actions`` (step ``t`` keyed ``step_key(seed_of(key),
        t)``, as in every env loop); returns (obs, state) after the last one."""
        obs, state = self.reset(key, params)
        for t, a in enumerate(actions):
            obs, state, _, done, _ = self.step(step_key(seed_of(key), t), state, a, params)
        return obs, state
