"""Oracle state values for BabyAI: the shortest-plan length to the target vs the steps left.

The LVRL ``Oracle`` value (an upper bound on what an LLM value model could say) needs the
value of every state of every rollout. Ours (the seed gives none for BabyAI):

    V(s) = clip(1 − n(s) / L(s), 0, 1),

where n(s) is the number of primitive actions of the shortest plan that picks up the target
from s (the solver's cost: turns and forward steps cost 1, a closed door 2 (toggle, forward),
the final pickup 1) and L(s) = max_steps − step_count the steps left. V is 0 when no plan
fits in the steps left, rises towards 1 as the plan shrinks relative to the time left, and
a step that shortens the plan by one raises V (by (L − n) / (L (L − 1))) while a step that
does not lowers it, so its differences are signed like progress.

A second form, ``value_from_length(..., q=...)``, V(s) = q ** n(s) (0 when n(s) > L(s)), is
the success chance of an agent that follows the plan with probability q per step. It is the
one the BabyAI experiment uses: when a weak policy's groups mostly fail (p̂_u ≈ 0), the linear
form puts V(s_1) near 1 − n/L ≈ 0.5 while LVRL anchors V(s_0) = p̂_u ≈ 0, so the first action
of every rollout gets a large, uninformative advantage that swamps the interior signal after
normalisation; q ** n is near 0 far from the target and rises as the plan shrinks.

Two implementations of n(s):

- ``plan_length`` (host, exact): ``solver.plan`` on one state, including a carried wrong
  object (it plans the drop) and locked doors (it fetches the key);
- ``plan_length_jax`` (jitted, vmappable, for the training loop): a fixed-point of the
  Dijkstra recursion over agent poses (x, y, heading) on the grid, D(pose) = min(turn + 1,
  enter the front cell + its cost), with goal poses those facing the target. It equals the
  solver's plan for hands-free agents without locked doors on their route (the tests check
  it on rollout states); a carried non-target object adds 2 (drop, then a turn on average:
  an approximation, documented), and a locked door counts as a wall. It is split into
  ``distance_field`` (per grid: the fixed point for every pose) and
  ``plan_length_from_field`` (a lookup), so a training loop can compute the field once per
  episode (its initial grid) and look poses up at every step: the plan length then ignores
  later grid changes (an opened door is credited on the step through it, as the field
  charges 2 for entering a closed door).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.env import BabyAIParams, BabyAIState
from jaxdm.envs.babyai.solver import solve

__all__ = ["oracle_value", "plan_length", "plan_length_jax", "oracle_value_jax",
           "distance_field", "plan_length_from_field", "value_from_length",
           "trajectory_oracle_values", "move_costs", "CARRY_PENALTY"]

_INF = np.int32(1 << 20)  # numpy: a device array at import would start the XLA backend
CARRY_PENALTY = 2  # plan_length_jax's allowance for dropping a carried non-target object


def oracle_value(plan_len, steps_left):
    """V = clip(1 − n / L, 0, 1); 0 when there is no plan (n None/inf) or no step left."""
    if plan_len is None or steps_left <= 0:
        return 0.0
    return float(np.clip(1.0 - plan_len / steps_left, 0.0, 1.0))


def plan_length(state: BabyAIState) -> int | None:
    """Exact shortest-plan length from one (unbatched) state (``solver.plan``)."""
    actions = solve(state)
    return None if actions is None else len(actions)


def _shift(a, dx: int, dy: int, fill):
    """out[x, y] = a[x + dx, y + dy] (``fill`` outside the grid)."""
    w, h = a.shape[:2]
    padded = jnp.pad(a, ((1, 1), (1, 1)) + ((0, 0),) * (a.ndim - 2), constant_values=fill)
    return jax.lax.dynamic_slice(padded, (1 + dx, 1 + dy) + (0,) * (a.ndim - 2), a.shape)


@jax.jit
def distance_field(state: BabyAIState) -> jax.Array:
    """Actions (without the pickup) from every pose to face the target: int32 [W, H, 4]
    (≥ 2**20 where there is no route), for ``state``'s grid. vmap it over a batch."""
    grid = state.grid.astype(jnp.int32)
    ctype, cstate = grid[..., 0], grid[..., 2]
    is_target = (ctype == state.target[0]) & (grid[..., 1] == state.target[1])
    open_cell = (ctype == L.EMPTY) | ((ctype == L.DOOR) & (cstate == L.DOOR_OPEN))
    closed_door = (ctype == L.DOOR) & (cstate == L.DOOR_CLOSED)
    enter_cost = jnp.where(open_cell, 1, jnp.where(closed_door, 2, _INF))       # [W, H]
    standable = open_cell | closed_door
    vec = L.DIR_TO_VEC
    # Goal poses: facing the target. front_*[d][x, y] = value at (x, y) + vec[d].
    goal = jnp.stack([_shift(is_target, int(vec[d][0]), int(vec[d][1]), False)
                      for d in range(4)], -1) & standable[..., None]            # [W, H, 4]
    front_cost = jnp.stack([_shift(enter_cost, int(vec[d][0]), int(vec[d][1]), _INF)
                            for d in range(4)], -1)                             # [W, H, 4]
    dist0 = jnp.where(goal, 0, _INF)

    def relax(dist):
        turn = jnp.minimum(jnp.roll(dist, 1, axis=-1), jnp.roll(dist, -1, axis=-1)) + 1
        ahead = jnp.stack([_shift(dist[..., d], int(vec[d][0]), int(vec[d][1]), _INF)
                           for d in range(4)], -1)
        new = jnp.minimum(dist, jnp.minimum(turn, front_cost + ahead))
        return jnp.where(standable[..., None], jnp.minimum(new, _INF), _INF)

    def body(carry):
        dist, _ = carry
        new = relax(dist)
        return new, jnp.any(new != dist)

    dist, _ = jax.lax.while_loop(lambda c: c[1], body, (dist0, jnp.bool_(True)))
    return dist


@jax.jit
def move_costs(state: BabyAIState, field: jax.Array):
    """The solver's cost-to-go after each move from ``state`` on its ``distance_field``:
    ``(costs, cell, closed_front)`` with ``costs`` int32 [3] for turn left, turn right and
    forward (into a closed door: toggle + forward; ≥ 2**20 into anything else that blocks),
    ``cell`` the front cell's (type, colour, state) and ``closed_front`` whether it is a
    closed door. Pure; vmap it over a batch."""
    vec = jnp.asarray(L.DIR_TO_VEC)
    x, y, d = state.agent_pos[0], state.agent_pos[1], state.agent_dir
    fx, fy = x + vec[d][0], y + vec[d][1]
    cell = state.grid[fx, fy].astype(jnp.int32)
    open_front = (cell[0] == L.EMPTY) | ((cell[0] == L.DOOR) & (cell[2] == L.DOOR_OPEN))
    closed_front = (cell[0] == L.DOOR) & (cell[2] == L.DOOR_CLOSED)
    ahead = field[fx, fy, d]
    forward = jnp.where(open_front, 1 + ahead, jnp.where(closed_front, 2 + ahead, _INF))
    costs = jnp.stack([field[x, y, (d + 3) % 4] + 1, field[x, y, (d + 1) % 4] + 1, forward])
    return costs, cell, closed_front


def plan_length_from_field(field: jax.Array, state: BabyAIState) -> jax.Array:
    """Plan length of ``state``'s pose in a ``distance_field`` (+ pickup, + CARRY_PENALTY
    when holding a non-target object)."""
    x, y, d = state.agent_pos[0], state.agent_pos[1], state.agent_dir
    n = field[x, y, d] + 1  # + pickup
    carrying_other = (state.carrying[0] != 0) & ~(
        (state.carrying[0] == state.target[0]) & (state.carrying[1] == state.target[1]))
    n = n + jnp.where(carrying_other, CARRY_PENALTY, 0)
    return jnp.minimum(n, _INF)


@jax.jit
def plan_length_jax(state: BabyAIState) -> jax.Array:
    """Shortest-plan length (int32; ≥ 2**20 when there is none) from one state; vmap it.

    See the module docstring for what it counts and where it equals ``plan_length``.
    """
    return plan_length_from_field(distance_field(state), state)


def value_from_length(n, step_count, max_steps, q: float | None = None) -> jax.Array:
    """clip(1 − n / L, 0, 1) with L = max_steps − step_count (0 when no step is left), or
    with ``q`` the geometric form q ** n (0 when n > L; see the module docstring)."""
    n = jnp.asarray(n).astype(jnp.float32)
    left = (max_steps - step_count).astype(jnp.float32)
    if q is not None:
        return jnp.where((left > 0) & (n <= left), jnp.power(q, n), 0.0)
    return jnp.clip(jnp.where(left > 0, 1.0 - n / jnp.maximum(left, 1.0), 0.0), 0.0, 1.0)


@jax.jit
def oracle_value_jax(state: BabyAIState, max_steps) -> jax.Array:
    """``oracle_value`` of ``plan_length_jax`` (float32; vmap it over a batch of states)."""
    return value_from_length(plan_length_jax(state), state.step_count, max_steps)


def trajectory_oracle_values(text_env, key, actions, params: BabyAIParams | None = None,
                             *, exact: bool = True) -> np.ndarray:
    """Values V(s_0)..V(s_T) of the states an action sequence visits (host side).

    Replays ``actions`` (ids or words) from ``text_env.reset(key)`` (a ``BabyAITextEnv``),
    stopping when the episode ends; ``exact`` uses the solver, else ``plan_length_jax``.
    Returns float32 [T + 1] (the state after the last executed action included).
    """
    from jaxdm.envs.babyai.text import ACTION_WORDS

    params = text_env.default_params if params is None else params
    _, state = text_env.reset(key, params)

    def value(core):
        n = plan_length(core) if exact else int(plan_length_jax(core))
        n = None if n is None or n >= int(_INF) else n
        return oracle_value(n, int(params.max_steps) - int(core.step_count))

    out = [value(state.core)]
    for a in actions:
        word = ACTION_WORDS[int(a)] if not isinstance(a, str) else a
        _, state, reward, done, _ = text_env.step(key, state, word, params)
        out.append(1.0 if float(reward) > 0 else value(state.core))
        if done:
            break
    return np.asarray(out, np.float32)
