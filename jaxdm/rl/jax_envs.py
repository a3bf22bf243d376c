"""Pure-JAX environments the trainer plays with the jitted rollout (``jaxdm.rl.jax_rollout``).

``JAX_ENVS`` maps an ``env.name`` to a builder ``make(**env.kwargs) -> JaxEnvSpec``; the
config's ``env.kwargs`` are the training split's settings and ``env.eval_kwargs`` override
them for the held-out evaluation ("All"); ``JaxEnvSpec.extra_eval`` names more evaluation
splits reported beside it (BabyAI: ``ood``, door distance 4-5).

A ``JaxEnvSpec`` carries the env (``reset_env(key, params)``/``step_env(key, state, action,
params)``, vmappable, no auto-reset), its params, and what the symbolic policy and the
rollout need:

- ``obs_row(obs, state) -> int32 [R]``: the policy's observation row (one env, vmap it);
- ``features(rows [.., R]) -> float [.., F]``: the policy's input (a module-level function:
  it is part of the compiled step's cache key);
- ``static_key``: what the compiled rollout depends on besides the traced ``params``;
- ``num_actions``: the policy's action set, ids ``0..num_actions - 1`` passed to the env;
- ``oracle``: ``(init(state) -> aux, value(aux, state) -> V)``, the env's own state value
  for the LVRL ``oracle`` value model (computed inside the rollout, recorded per trajectory
  as ``metadata["oracle_values"]``), or None.

Registered: ``babyai_jax`` (``envs.babyai.BabyAIEnv``, six rooms, one pickup instruction).
Its kwargs: ``room_size`` (7, 8 or 9), ``split`` ("train", "id_test", "ood_test"),
``min_door_distance`` / ``max_door_distance`` (override the split's range), ``lock_prob``,
``compass`` (add the target's position relative to the agent, in the agent's frame, to the
observation row: it makes the task learnable by a memoryless MLP) and ``oracle_q`` (the
Oracle's geometric form V = q ** plan length, ``envs.babyai.value``; 0 = the linear form).
The episode budget is the trainer's ``max_actions``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
from jaxdm.envs.babyai import env as E
from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.value import distance_field, plan_length_from_field, value_from_length
from jaxdm.registry import Registry

__all__ = ["JaxEnvSpec", "JAX_ENVS", "register_jax_env", "make_jax_env",
           "babyai_features", "babyai_features_compass"]


@dataclasses.dataclass(frozen=True)
class JaxEnvSpec:
    """A JAX-native env as the jax rollout plays it: the env and its params, how one observation
    becomes a token row (obs_row, row_width) and policy features (features, feature_dim), the action
    set, the goal's text, an optional oracle (distance field, value) and extra evaluation splits."""
    env: Any
    params: Any
    obs_row: Callable[[Any, Any], jax.Array]
    row_width: int
    features: Callable[[jax.Array], jax.Array]
    feature_dim: int
    num_actions: int
    action_names: tuple[str, ...]
    goal_text: Callable[[Any], str] = staticmethod(lambda row: "")  # first obs row -> goal
    oracle: tuple[Callable, Callable] | None = None
    extra_eval: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    static_key: tuple = ()  # what the compiled rollout depends on (params are traced)


JAX_ENVS: Registry[Callable[..., JaxEnvSpec]] = Registry("JAX env")


def register_jax_env(name: str, make: Callable[..., JaxEnvSpec]) -> Callable[..., JaxEnvSpec]:
    """Register ``make(**env.kwargs) -> JaxEnvSpec`` under env.name ``name``; a name registered
    twice is a ``jaxdm.registry.DuplicateNameError``."""
    return JAX_ENVS.register(name, make)


def make_jax_env(name: str, kwargs: Mapping[str, Any], max_steps: int) -> JaxEnvSpec:
    """The spec of ``name`` built from ``kwargs`` (errors name ``env.name``/``env.kwargs``)."""
    make = JAX_ENVS.get(name, field="env.name")
    try:
        return make(max_steps=max_steps, **dict(kwargs))
    except TypeError as e:
        raise ValueError(f"env.kwargs: bad settings for {name!r}: {e}") from None


# ---- BabyAI ------------------------------------------------------------------------------
_VIEW = 7 * 7 * 3


def babyai_features(rows: jax.Array) -> jax.Array:
    """BabyAI observation rows [.., 150] -> one-hot features [.., 7*7*20 + 4 + 17]:
    per view cell (type 11, colour 6, state 3), the heading (4), the mission (type, colour)."""
    rows = rows.astype(jnp.int32)
    img = rows[..., :_VIEW].reshape(rows.shape[:-1] + (7, 7, 3))
    parts = [jax.nn.one_hot(img[..., 0], 11), jax.nn.one_hot(img[..., 1], 6),
             jax.nn.one_hot(img[..., 2], 3)]
    view = jnp.concatenate(parts, -1).reshape(rows.shape[:-1] + (-1,))
    return jnp.concatenate([view, jax.nn.one_hot(rows[..., _VIEW], 4),
                            jax.nn.one_hot(rows[..., _VIEW + 1], 11),
                            jax.nn.one_hot(rows[..., _VIEW + 2], 6)], -1)


def babyai_features_compass(rows: jax.Array) -> jax.Array:
    """``babyai_features`` + the compass (rows [.., 152]): the target's forward and rightward
    offsets (scaled by 1/10) and their signs (one-hot of −, 0, +)."""
    off = rows[..., _VIEW + 3:_VIEW + 5].astype(jnp.int32)
    return jnp.concatenate([babyai_features(rows[..., :_VIEW + 3]),
                            off.astype(jnp.float32) / 10.0,
                            jax.nn.one_hot(jnp.sign(off) + 1, 3).reshape(
                                off.shape[:-1] + (6,))], -1)


_BABYAI_FEATURES = 7 * 7 * 20 + 4 + 17


def _babyai_compass(state) -> jax.Array:
    """(forward, right) offset of the target from the agent, in the agent's frame; (0, 0)
    when the target is not on the grid (picked up)."""
    g = state.grid.astype(jnp.int32)
    match = (g[..., 0] == state.target[0]) & (g[..., 1] == state.target[1])
    idx = jnp.argmax(match.ravel())
    pos = jnp.stack([idx // g.shape[1], idx % g.shape[1]])
    d = jnp.where(match.any(), pos - state.agent_pos, 0)
    vec = jnp.asarray(L.DIR_TO_VEC)
    fwd, right = vec[state.agent_dir], vec[(state.agent_dir + 1) % 4]
    return jnp.stack([jnp.sum(d * fwd), jnp.sum(d * right)]).astype(jnp.int32)


def make_babyai_jax(*, max_steps: int, room_size: int = 8, split: str = "train",
                    min_door_distance: int | None = None, max_door_distance: int | None = None,
                    lock_prob: float = 0.0, compass: bool = False,
                    oracle_q: float = 0.9) -> JaxEnvSpec:
    """The JaxEnvSpec of BabyAI GoTo-door in JAX (env.name babyai_jax): a room of ``room_size``, the
    split's task params with ``max_steps`` and the door-distance / lock options, the compass in the
    features if asked, and the oracle value q ** plan length (``oracle_q``) from the distance field.
    """
    env = BabyAIEnv(int(room_size))
    params = BabyAIParams.for_split(split, max_steps=int(max_steps), lock_prob=float(lock_prob))
    if min_door_distance is not None or max_door_distance is not None:
        params = params.replace(
            min_door_distance=int(params.min_door_distance if min_door_distance is None
                                  else min_door_distance),
            max_door_distance=int(params.max_door_distance if max_door_distance is None
                                  else max_door_distance))
    q = float(oracle_q) or None

    def obs_row(obs, state):
        parts = [obs.image.reshape(-1).astype(jnp.int32), obs.direction[None].astype(jnp.int32),
                 obs.mission.astype(jnp.int32)]
        if compass:
            parts.append(_babyai_compass(state))
        return jnp.concatenate(parts)

    def value(field, state):
        return value_from_length(plan_length_from_field(field, state), state.step_count,
                                 int(max_steps), q)

    def goal_text(row) -> str:
        t, c = int(row[_VIEW + 1]), int(row[_VIEW + 2])
        return f"pick up the {L.COLOR_NAMES[c]} {L.IDX_TO_OBJECT[t]}"

    return JaxEnvSpec(
        env=env, params=params, obs_row=obs_row, row_width=_VIEW + 3 + 2 * bool(compass),
        features=babyai_features_compass if compass else babyai_features,
        feature_dim=_BABYAI_FEATURES + 8 * bool(compass), num_actions=E.DONE,
        action_names=tuple(E.ACTION_NAMES[:E.DONE]), goal_text=goal_text,
        oracle=(distance_field, value), extra_eval={"ood": {"split": "ood_test"}},
        static_key=("babyai_jax", int(room_size), bool(compass), q, int(max_steps)))


register_jax_env("babyai_jax", make_babyai_jax)
