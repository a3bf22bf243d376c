"""Shortest-path solver for BabyAI pickup tasks and reference trajectories.

The planner is a Dijkstra search over agent poses (x, y, heading) on the current grid:
turning and stepping cost one action, stepping into a closed door costs two (toggle, then
forward); objects, walls and locked doors block. It plans from any state, including one in
the middle of an episode where the agent carries a wrong object (it first drops it on the
nearest free cell that keeps the target reachable), so it serves both reference trajectories
and Monte-Carlo continuations.
"""
from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.env import (
    DROP, FORWARD, LEFT, PICKUP, RIGHT, TOGGLE, BabyAIParams, BabyAIState,
)
from jaxdm.envs.recorder import play_episode, to_trajectory
from jaxdm.trajectory import Trajectory


def _find(grid: np.ndarray, target) -> tuple[int, int] | None:
    hits = np.argwhere((grid[:, :, 0] == target[0]) & (grid[:, :, 1] == target[1]))
    return (int(hits[0][0]), int(hits[0][1])) if len(hits) else None


def _search(grid: np.ndarray, pos, direction: int, goal_front) -> list[int] | None:
    """Fewest actions from (pos, direction) to a pose whose front cell satisfies goal_front."""
    width, height = grid.shape[:2]
    start = (int(pos[0]), int(pos[1]), int(direction))
    best = {start: 0}
    parent: dict[tuple, tuple[tuple, tuple[int, ...]]] = {}
    heap = [(0, start)]
    while heap:
        cost, node = heapq.heappop(heap)
        if cost > best.get(node, 1 << 30):
            continue
        x, y, d = node
        dx, dy = L.DIR_TO_VEC[d]
        fx, fy = x + dx, y + dy
        if goal_front(fx, fy):
            actions: list[int] = []
            while node in parent:
                node, acts = parent[node]
                actions[:0] = acts
            return actions
        moves = [((x, y, (d + 3) % 4), (LEFT,)), ((x, y, (d + 1) % 4), (RIGHT,))]
        if 0 <= fx < width and 0 <= fy < height:
            ctype, _, cstate = (int(v) for v in grid[fx, fy])
            if ctype == L.EMPTY or (ctype == L.DOOR and cstate == L.DOOR_OPEN):
                moves.append(((fx, fy, d), (FORWARD,)))
            elif ctype == L.DOOR and cstate == L.DOOR_CLOSED:
                moves.append(((fx, fy, d), (TOGGLE, FORWARD)))
        for nxt, acts in moves:
            c = cost + len(acts)
            if c < best.get(nxt, 1 << 30):
                best[nxt] = c
                parent[nxt] = (node, acts)
                heapq.heappush(heap, (c, nxt))
    return None


def _apply(grid: np.ndarray, pos, direction: int, actions) -> tuple[np.ndarray, tuple, int]:
    """Replay navigation actions (turns, forward, door toggles) on a copy of the grid."""
    grid = grid.copy()
    x, y, d = int(pos[0]), int(pos[1]), int(direction)
    for a in actions:
        dx, dy = L.DIR_TO_VEC[d]
        if a == LEFT:
            d = (d + 3) % 4
        elif a == RIGHT:
            d = (d + 1) % 4
        elif a == FORWARD:
            x, y = x + dx, y + dy
        elif a == TOGGLE:
            grid[x + dx, y + dy, 2] = L.DOOR_OPEN
    return grid, (x, y), d


def plan(grid, agent_pos, agent_dir, carrying, target) -> list[int] | None:
    """Primitive actions that pick up ``target`` from this state, or None if impossible.

    ``grid`` is the uint8 [W, H, 3] MiniGrid encoding; ``carrying`` and ``target`` are
    (type, colour) pairs (carrying type 0 = hands free). Locked doors are opened with their
    key when the direct route is blocked (fetch the key, unlock, drop it, go on).
    """
    grid = np.asarray(grid)
    if grid.ndim != 3 or grid.shape[2] != 3:
        raise ValueError(f"grid must have shape [W, H, 3], got {grid.shape}")
    target = (int(target[0]), int(target[1]))
    carrying = (int(carrying[0]), int(carrying[1]))
    return _plan(grid, (int(agent_pos[0]), int(agent_pos[1])), int(agent_dir), carrying,
                 target, unlocks_left=2)


def _plan(grid, pos, direction, carrying, target, unlocks_left):
    goal = _find(grid, target)
    if goal is None:
        return None
    candidates = []
    if carrying[0] == 0:
        route = _search(grid, pos, direction, lambda fx, fy: (fx, fy) == goal)
        if route is not None:
            return route + [PICKUP]
    else:
        dropped = _drop_then_route(grid, pos, direction, carrying, goal)
        if dropped is not None:
            candidates.append(dropped)
    if unlocks_left > 0:  # the target may lie behind a locked door: use its key
        for door in map(tuple, np.argwhere((grid[:, :, 0] == L.DOOR)
                                           & (grid[:, :, 2] == L.DOOR_LOCKED))):
            key = (L.KEY, int(grid[door][1]))
            prefix, g, p, d = [], grid.copy(), pos, direction
            if carrying != key:
                if carrying[0] != 0:
                    continue  # keep it simple: no juggling of two carried objects
                key_pos = _find(grid, key)
                if key_pos is None:
                    continue
                to_key = _search(g, p, d, lambda fx, fy, k=key_pos: (fx, fy) == k)
                if to_key is None:
                    continue
                g, p, d = _apply(g, p, d, to_key)
                g[key_pos] = (L.EMPTY, 0, 0)
                prefix = to_key + [PICKUP]
            to_door = _search(g, p, d, lambda fx, fy, k=door: (fx, fy) == k)
            if to_door is None:
                continue
            g, p, d = _apply(g, p, d, to_door)
            g[door[0], door[1], 2] = L.DOOR_OPEN
            rest = _plan(g, p, d, key, target, unlocks_left - 1)
            if rest is not None:
                candidates.append(prefix + to_door + [TOGGLE] + rest)
    return min(candidates, key=len) if candidates else None


def _drop_then_route(grid, pos, direction, carrying, goal):
    """Hands full: drop on the nearest free cell that keeps the target reachable, then go."""
    width, height = grid.shape[:2]
    tried: set[tuple[int, int]] = set()
    for _ in range(12):
        def droppable(fx, fy):
            return (0 <= fx < width and 0 <= fy < height and grid[fx, fy, 0] == L.EMPTY
                    and (fx, fy) not in tried)
        to_drop = _search(grid, pos, direction, droppable)
        if to_drop is None:
            return None
        g2, pos2, d2 = _apply(grid, pos, direction, to_drop)
        dx, dy = L.DIR_TO_VEC[d2]
        spot = (pos2[0] + dx, pos2[1] + dy)
        tried.add(spot)
        g2[spot[0], spot[1]] = (carrying[0], carrying[1], 0)
        route = _search(g2, pos2, d2, lambda fx, fy: (fx, fy) == goal)
        if route is not None:
            return to_drop + [DROP] + route + [PICKUP]
    return None


def solve(state: BabyAIState) -> list[int] | None:
    """Plan from a (single, unbatched) BabyAIState."""
    return plan(np.asarray(state.grid), np.asarray(state.agent_pos), int(state.agent_dir),
                np.asarray(state.carrying), np.asarray(state.target))


def play_trajectory(text_env: Any, key: Any, actions, params: BabyAIParams | None = None,
                    **metadata: Any) -> Trajectory:
    """Reset ``text_env`` (a ``BabyAITextEnv``) with ``key``, play action ids until the
    episode ends or they run out, and record a Trajectory (``metadata`` is added to it)."""
    from jaxdm.envs.babyai.text import ACTION_WORDS

    params = text_env.default_params if params is None else params
    todo = iter(actions)

    def act(state, obs):
        a = next(todo, None)
        return None if a is None else ACTION_WORDS[int(a)]

    ep = play_episode(text_env, key, act, params=params)
    facts = ep.reset_info
    return to_trajectory(
        ep, env="babyai", budget=int(params.max_steps),
        metadata={"door_distance": facts["door_distance"], "split": facts["split"],
                  "key": key if isinstance(key, int) else None, **metadata})


def reference_trajectory(text_env: Any, key: Any, params: BabyAIParams | None = None
                         ) -> Trajectory:
    """The solver's shortest plan for the task of ``key``, played in a ``BabyAITextEnv``."""
    params = text_env.default_params if params is None else params
    _, state = text_env.reset(key, params)
    actions = solve(state.core)
    if actions is None:
        raise ValueError(f"no plan exists for the task of key {key!r}")
    return play_trajectory(text_env, key, actions, params, solver="dijkstra")
