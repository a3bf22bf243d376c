"""Text observations and a string-action ``Environment`` over the JAX BabyAI world.

Rendering is host-side and works from what the agent sees (MiniGrid's 7 x 7 view encoding,
the carried object and the mission), so the same renderer serves the JAX env and minigrid's
own levels (``minigrid_adapter``). Positions are egocentric, e.g. "a red ball 2 steps forward
and 1 step left"; walls are reported along the three straight lines (ahead, left, right).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.env import (
    DONE, SPLIT_CODES, VIEW_SIZE, BabyAIEnv, BabyAIParams, BabyAIState, _check_params,
)
from jaxdm.envs.core import Environment, seed_of

# Action words, index = MiniGrid action id.
ACTION_WORDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
WORD_TO_ACTION = {w: i for i, w in enumerate(ACTION_WORDS)}
TASK_TYPE = "pickup"
_OBJECT_WORDS = {L.KEY: "key", L.BALL: "ball", L.BOX: "box", L.DOOR: "door"}
_SPLIT_NAMES = {v: k for k, v in SPLIT_CODES.items()}


def object_phrase(type_idx: int, colour_idx: int, state: int = 0) -> str:
    """"a red ball", "a closed blue door", "an open grey door"."""
    if type_idx not in _OBJECT_WORDS:
        raise ValueError(f"no phrase for object type {type_idx} "
                         f"({L.IDX_TO_OBJECT.get(type_idx, '?')})")
    colour = L.COLOR_NAMES[colour_idx]
    if type_idx == L.DOOR:
        adj = L.STATE_NAMES[state]
        return f"{'an' if adj[0] in 'aeiou' else 'a'} {adj} {colour} door"
    return f"a {colour} {_OBJECT_WORDS[type_idx]}"


def mission_text(target: Sequence[int]) -> str:
    """"pick up the red ball" for a (type, colour) target."""
    t, c = int(target[0]), int(target[1])
    return f"pick up the {L.COLOR_NAMES[c]} {_OBJECT_WORDS[t]}"


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def relative_position(forward: int, lateral: int) -> str:
    """"2 steps forward and 1 step left" (lateral > 0 is right)."""
    parts = []
    if forward:
        parts.append(_steps(forward, "forward"))
    if lateral:
        parts.append(_steps(abs(lateral), "right" if lateral > 0 else "left"))
    return " and ".join(parts)


def describe_view(image: np.ndarray) -> list[str]:
    """Phrases for everything visible in a [7, 7, 3] MiniGrid view encoding."""
    image = np.asarray(image)
    v = VIEW_SIZE
    if image.shape != (v, v, 3):
        raise ValueError(f"image must have shape ({v}, {v}, 3), got {image.shape}")
    ax, ay = v // 2, v - 1
    types = image[:, :, 0]
    items = []
    xs, ys = np.nonzero((types == L.DOOR) | (types == L.KEY) | (types == L.BALL)
                        | (types == L.BOX))
    for i, j in zip(xs.tolist(), ys.tolist()):
        if (i, j) == (ax, ay):
            continue  # the agent's own cell shows what it carries
        fwd, lat = ay - j, i - ax
        phrase = object_phrase(int(types[i, j]), int(image[i, j, 1]), int(image[i, j, 2]))
        items.append((fwd + abs(lat), fwd, lat, f"{phrase} {relative_position(fwd, lat)}"))
    items.sort()
    walls = []
    for j in range(ay - 1, -1, -1):  # straight ahead
        if types[ax, j] == L.WALL:
            walls.append(f"a wall {_steps(ay - j, 'forward')}")
            break
        if types[ax, j] != L.EMPTY:
            break
    for side, cols in (("left", range(ax - 1, -1, -1)), ("right", range(ax + 1, v))):
        for i in cols:
            if types[i, ay] == L.WALL:
                walls.append(f"a wall {_steps(abs(i - ax), side)}")
                break
            if types[i, ay] != L.EMPTY:
                break
    return walls + [text for *_, text in items]


def render_text(image: np.ndarray, carrying: Sequence[int] | None, mission: str,
                admissible: Sequence[str] = ACTION_WORDS) -> str:
    """The full text observation: mission, what is visible, what is carried, actions."""
    seen = describe_view(image)
    if carrying is not None and int(carrying[0]) > 0:
        held = f"You are carrying {object_phrase(int(carrying[0]), int(carrying[1]))}."
    else:
        held = "You are carrying nothing."
    sees = f"You see {', '.join(seen)}." if seen else "You see nothing."
    return (f"Mission: {mission}\n{sees}\n{held}\n"
            f"Admissible actions: {', '.join(admissible)}")


def parse_action(action: Any) -> int | None:
    """MiniGrid action id of an action string, None if it is not one of ACTION_WORDS."""
    if not isinstance(action, str):
        raise TypeError(f"action must be a string, got {type(action).__name__}")
    return WORD_TO_ACTION.get(" ".join(action.strip().lower().split()))


@functools.lru_cache(maxsize=None)
def _compiled(room_size: int):
    """Shared env and jitted single-env functions per room size (compiled once per process)."""
    env = BabyAIEnv(room_size)
    return env, jax.jit(env.reset_env), jax.jit(env.step_env)


def _host(core: BabyAIState) -> BabyAIState:
    """The state as read-only numpy arrays: cheap to pickle to and from VectorEnv workers."""

    def freeze(x):
        arr = np.array(x)
        arr.setflags(write=False)
        return arr

    return jax.tree_util.tree_map(freeze, core)


@dataclasses.dataclass(frozen=True, eq=False)
class BabyAITextState:
    """Text-env episode: the world state (read-only numpy arrays) plus milestone trackers."""

    core: BabyAIState
    observation: str
    best_room_distance: int  # fewest doors left to the target room reached so far
    target_seen: bool
    done: bool = False
    won: bool = False


class BabyAITextEnv(Environment[BabyAITextState, BabyAIParams]):
    """BabyAI with string actions and text observations, for LLM policies and VectorEnv.

    ``reset(key)`` takes an int seed or a JAX key (an int ``s`` means ``jax.random.key(s)``).
    ``step`` takes one of ``ACTION_WORDS``; an unknown string is an invalid action that still
    uses a step (nothing else changes). Info keys: ``admissible_actions``, ``valid``, ``won``,
    ``milestone`` (entering a room closer to the target than any before, first sight of the
    target, picking up the key of a locked door, unlocking a door, picking up the target;
    ``subgoal`` names which), ``no_op`` (state unchanged), ``goal``,
    ``task_type``, plus ``terminated``, ``truncated``, ``door_distance``, ``split``.
    """

    name = "babyai"

    def __init__(self, room_size: int = 8, params: BabyAIParams | None = None):
        self.core_env, self._reset_fn, self._step_fn = _compiled(room_size)
        self.room_size = room_size
        self._params = BabyAIParams() if params is None else params

    @property
    def default_params(self) -> BabyAIParams:
        """The params this env was built with."""
        return self._params

    @staticmethod
    def _key(key: Any) -> jax.Array:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return jax.random.key(int(key))
        if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype,
                                                                 jax.dtypes.prng_key):
            return key
        return jax.random.key(seed_of(key))

    def observe(self, core: BabyAIState, image: np.ndarray | None = None) -> str:
        """The text observation of ``core``: what the agent sees (its egocentric view, rendered if
        not given), what it carries, and the mission."""
        if image is None:
            image = np.asarray(self.core_env.egocentric_view(core))
        return render_text(image, np.asarray(core.carrying), mission_text(np.asarray(core.target)))

    def reset_env(self, key: Any, params: BabyAIParams):
        """A new BabyAI episode from ``key`` through the jitted JAX env; (text observation,
        BabyAITextState)."""
        _check_params(params)
        obs, core = self._reset_fn(self._key(key), params)
        core = _host(core)
        image = np.asarray(obs.image)
        text = self.observe(core, image)
        state = BabyAITextState(core=core, observation=text,
                                best_room_distance=self._room_distance(core),
                                target_seen=_target_visible(image, core))
        return text, state

    def step_env(self, key: Any, state: BabyAITextState, action: Any, params: BabyAIParams):
        """One text action (an action name) through the jitted JAX env: (text observation, state,
        reward, done, info); an unknown action is invalid, a finished episode a ValueError."""
        if not isinstance(state, BabyAITextState):
            raise TypeError(f"state must be a BabyAITextState, got {type(state).__name__}")
        if state.done:
            raise ValueError("episode is over (done was returned); call reset")
        action_id = parse_action(action)
        valid = action_id is not None
        obs, core, reward, terminated, truncated, extra = self._step_fn(
            jax.random.key(0), state.core, jnp.int32(DONE if action_id is None else action_id),
            params)
        core = _host(core)
        image = np.asarray(obs.image)
        text = self.observe(core, image)
        if not valid:
            text = f"Nothing happens: {action!r} is not an admissible action.\n{text}"
        won = bool(terminated)
        room_dist = self._room_distance(core)
        seen = _target_visible(image, core)
        subgoal = ""
        if won:
            subgoal = "pick up the target"
        elif room_dist < state.best_room_distance:
            subgoal = "enter a room on the route"
        elif seen and not state.target_seen:
            subgoal = "see the target"
        elif _locked_count(core.grid) < _locked_count(state.core.grid):
            subgoal = "unlock a door"
        elif bool(extra["picked_wrong"]) and _opens_a_lock(core):
            subgoal = "pick up the key"
        done = bool(terminated) or bool(truncated)
        new_state = BabyAITextState(
            core=core, observation=text,
            best_room_distance=min(room_dist, state.best_room_distance),
            target_seen=state.target_seen or seen, done=done, won=won)
        info = {
            "admissible_actions": list(ACTION_WORDS),
            "valid": valid,
            "won": won,
            "milestone": bool(subgoal),
            "subgoal": subgoal,
            "no_op": bool(extra["no_op"]),
            "goal": mission_text(np.asarray(core.target)),
            "task_type": TASK_TYPE,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "door_distance": int(core.door_distance),
            "split": _SPLIT_NAMES[int(core.split)],
            "picked_wrong": bool(extra["picked_wrong"]),
        }
        return text, new_state, float(reward), done, info

    def reset_info(self, state: BabyAITextState, params: BabyAIParams | None = None) -> dict:
        """Episode facts for VectorEnv's trajectory records (the admissible actions too, so an
        option-scoring policy can act from the first step)."""
        params = self.default_params if params is None else params
        return {"goal": mission_text(state.core.target), "task_type": TASK_TYPE,
                "admissible_actions": list(ACTION_WORDS),
                "budget": int(params.max_steps), "env": self.name,
                "door_distance": int(state.core.door_distance),
                "split": _SPLIT_NAMES[int(state.core.split)]}

    def warm_up(self) -> None:
        """Compile the jitted reset and step (VectorEnv calls this in each worker)."""
        _, state = self.reset(0)
        self.step(0, state, ACTION_WORDS[0])

    def _room_distance(self, core: BabyAIState) -> int:
        """Doors between the agent's room and the target's (in a doorway the agent has not
        yet entered the room beyond, so the doorway counts as the farther of its rooms)."""
        dist = _distances(int(core.door_mask))
        x, y = (int(v) for v in np.asarray(core.agent_pos))
        target = int(core.target_room)
        room = L.room_of_cell(x, y, self.room_size)
        if room >= 0:
            return int(dist[room, target])
        step = self.room_size - 1
        rooms = [L.room_of_cell(x + dx, y + dy, self.room_size)
                 for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))
                 if 0 < x + dx < 3 * step and 0 < y + dy < 2 * step]
        return max(int(dist[r, target]) for r in rooms if r >= 0)


def _locked_count(grid: np.ndarray) -> int:
    return int(np.sum((grid[:, :, 0] == L.DOOR) & (grid[:, :, 2] == L.DOOR_LOCKED)))


def _opens_a_lock(core: BabyAIState) -> bool:
    """The agent holds a key whose colour matches a locked door."""
    if int(core.carrying[0]) != L.KEY:
        return False
    g = core.grid
    return bool(np.any((g[:, :, 0] == L.DOOR) & (g[:, :, 2] == L.DOOR_LOCKED)
                       & (g[:, :, 1] == int(core.carrying[1]))))


@functools.lru_cache(maxsize=256)
def _distances(mask: int) -> np.ndarray:
    return L._room_distances(mask)


def _target_visible(image: np.ndarray, core: BabyAIState) -> bool:
    t, c = (int(v) for v in np.asarray(core.target))
    view = image.copy()
    view[VIEW_SIZE // 2, VIEW_SIZE - 1] = 0  # the carried object is not "seen"
    return bool(np.any((view[:, :, 0] == t) & (view[:, :, 1] == c)))


def make_text_env(split: str = "train", room_size: int = 8,
                  max_steps: int = 128) -> BabyAITextEnv:
    """A text env on one split, e.g. for ``EnvFactory("jaxdm.envs.babyai:make_text_env",
    {"split": "ood_test"})`` in a ``VectorEnv``."""
    return BabyAITextEnv(room_size, BabyAIParams.for_split(split, max_steps=max_steps))
