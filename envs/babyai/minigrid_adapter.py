"""minigrid's own BabyAI behind the jaxdm API, and BabyAIBot for reference trajectories.

* ``SixRoomPickupLevel``: a minigrid ``RoomGridLevel`` that reproduces one task of the JAX
  world cell for cell (grid, agent pose, "pick up the ..." instruction, 128 steps, reward 1),
  so minigrid itself, and its BabyAIBot, can play our tasks; the fidelity tests step both
  engines side by side.
* ``MiniGridTextEnv``: any minigrid BabyAI level (``"BabyAI-PickupDist-v0"``...) or a
  ``SixRoomPickupLevel`` as a text ``Environment`` with the same observations, action words
  and info keys as ``BabyAITextEnv``.
* ``bot_actions`` / ``bot_trajectory``: BabyAIBot plans as action ids or a ``Trajectory``.

minigrid environments are stateful, so the adapter's state is (seed, actions so far) plus a
small cache of live environments: stepping the newest state of an episode is O(1); stepping
an older state (a branch, a replay) rebuilds it by resetting and replaying its actions.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import numpy as np

from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.text import ACTION_WORDS, parse_action, render_text
from jaxdm.envs.core import Environment, seed_of, step_key
from jaxdm.trajectory import Step, Trajectory

try:  # minigrid is the optional "envs" extra
    import gymnasium
    from minigrid.core.grid import Grid
    from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
    from minigrid.envs.babyai.core.verifier import ObjDesc, PickupInstr
    from minigrid.utils.baby_ai_bot import BabyAIBot
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("the minigrid adapter needs `pip install minigrid==3.2.0` "
                      "(jaxdm's [envs] extra)") from err


class SixRoomPickupLevel(RoomGridLevel):
    """One JAX-world task inside minigrid: same grid, pose, instruction, budget and reward."""

    def __init__(self, grid: np.ndarray, agent_pos, agent_dir: int, target, *,
                 max_steps: int = 128, **kwargs):
        grid = np.asarray(grid, dtype=np.uint8)
        if grid.ndim != 3 or grid.shape[2] != 3:
            raise ValueError(f"grid must have shape [W, H, 3], got {grid.shape}")
        room_size = (grid.shape[0] - 1) // L.NUM_COLS + 1
        if grid.shape[:2] != ((room_size - 1) * L.NUM_COLS + 1, (room_size - 1) * L.NUM_ROWS + 1):
            raise ValueError(f"grid shape {grid.shape[:2]} is not a 2 x 3 room grid")
        self.set_task(grid, agent_pos, agent_dir, target)
        self._fixed_max_steps = int(max_steps)
        super().__init__(room_size=room_size, num_rows=L.NUM_ROWS, num_cols=L.NUM_COLS,
                         max_steps=int(max_steps), **kwargs)

    @classmethod
    def from_state(cls, state, max_steps: int = 128, **kwargs) -> "SixRoomPickupLevel":
        """From an unbatched ``BabyAIState`` (its current grid, pose and target)."""
        return cls(np.asarray(state.grid), np.asarray(state.agent_pos), int(state.agent_dir),
                   np.asarray(state.target), max_steps=max_steps, **kwargs)

    def set_task(self, grid, agent_pos, agent_dir, target) -> None:
        """The task the next ``reset`` builds."""
        target = (int(target[0]), int(target[1]))
        if target[0] not in L.OBJECT_TYPES:
            raise ValueError(f"target type {target[0]} is not a ball, box or key")
        self._task = (np.asarray(grid, np.uint8).copy(), (int(agent_pos[0]), int(agent_pos[1])),
                      int(agent_dir), target)

    def gen_mission(self):
        """Build the official MiniGrid grid of the task this level was given (the grid, the agent's
        pose and the target's type and colour) and its mission text."""
        grid, pos, direction, (ttype, tcolour) = self._task
        self.grid, _ = Grid.decode(grid)
        step = self.room_size - 1
        for x in range(self.grid.width):
            for y in range(self.grid.height):
                obj = self.grid.get(x, y)
                if obj is None or obj.type == "wall":
                    continue
                obj.init_pos = obj.cur_pos = (x, y)
                if obj.type != "door":
                    self.room_from_pos(x, y).objs.append(obj)
                    continue
                # Register the door with both rooms (slots: right, down, left, up).
                if x % step == 0:  # in a vertical wall: rooms to the left and right
                    pairs = ((self.room_from_pos(x - 1, y), 0), (self.room_from_pos(x + 1, y), 2))
                else:  # in a horizontal wall: rooms above and below
                    pairs = ((self.room_from_pos(x, y - 1), 1), (self.room_from_pos(x, y + 1), 3))
                for room, slot in pairs:
                    room.doors[slot] = obj
                    room.door_pos[slot] = (x, y)
        self.agent_pos = np.array(pos)
        self.agent_dir = direction
        self.instrs = PickupInstr(ObjDesc(L.IDX_TO_OBJECT[ttype], L.COLOR_NAMES[tcolour]))

    def reset(self, **kwargs):
        """Reset as MiniGrid does, then restore the fixed step budget (RoomGridLevel derives its
        own)."""
        out = super().reset(**kwargs)
        self.max_steps = self._fixed_max_steps  # RoomGridLevel derives its own budget
        return out

    def _reward(self) -> float:
        return 1.0  # the JAX world's sparse reward (minigrid decays it with time)


def bot_actions(level: Any, max_steps: int | None = None) -> list[int]:
    """Run BabyAIBot on a freshly reset minigrid level (stepping it) until done."""
    env = level.unwrapped
    bot = BabyAIBot(env)
    budget = env.max_steps if max_steps is None else max_steps
    actions = []
    for _ in range(budget):
        action = int(bot.replan())
        actions.append(action)
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    return actions


@dataclasses.dataclass(frozen=True)
class MiniGridTextState:
    """Episode of a minigrid level: its seed and the actions taken so far."""

    seed: int
    actions: tuple[int, ...]
    observation: str
    target_seen: bool = False
    done: bool = False
    won: bool = False


def _task_type(instrs: Any) -> str:
    name = type(instrs).__name__
    return {"PickupInstr": "pickup", "GoToInstr": "goto", "OpenInstr": "open",
            "PutNextInstr": "putnext"}.get(name, name.replace("Instr", "").lower())


class MiniGridTextEnv(Environment[MiniGridTextState, None]):
    """A minigrid BabyAI level as a text Environment (same text, actions and info keys as
    ``BabyAITextEnv``). ``level`` is a gymnasium id or a callable returning a minigrid env."""

    name = "babyai-minigrid"

    def __init__(self, level: str | Callable[[], Any] = "BabyAI-PickupDist-v0",
                 cache_size: int = 8):
        if isinstance(level, str):
            if level not in gymnasium.registry:
                raise ValueError(f"unknown minigrid level {level!r}")
            self._make = lambda: gymnasium.make(level).unwrapped
        elif callable(level):
            self._make = level
        else:
            raise TypeError(f"level must be a gymnasium id or a callable, got {type(level)}")
        self.level = level
        self._live: collections.OrderedDict = collections.OrderedDict()
        self._cache_size = cache_size

    @property
    def default_params(self):
        """None: the adapter takes no params."""
        return None

    # --- live env bookkeeping -----------------------------------------------------------
    def _env_for(self, state: MiniGridTextState):
        key = (state.seed, state.actions)
        env = self._live.pop(key, None)
        if env is None:  # rebuild by replay
            env = self._make()
            env.reset(seed=state.seed)
            for a in state.actions:
                env.step(a)
        return env

    def _keep(self, state: MiniGridTextState, env) -> None:
        self._live[(state.seed, state.actions)] = env
        while len(self._live) > self._cache_size:
            self._live.popitem(last=False)

    def live_env(self, state: MiniGridTextState):
        """The minigrid env in ``state`` (for bots); stepping it yourself desynchronises it."""
        env = self._env_for(state)
        self._keep(state, env)
        return env

    def _observe(self, env, image) -> str:
        carrying = None
        if env.carrying is not None:
            carrying = (L.OBJECT_TO_IDX[env.carrying.type], L.COLOR_TO_IDX[env.carrying.color])
        return render_text(image, carrying, env.mission)

    def _target_visible(self, env, image) -> bool:
        desc = getattr(env.instrs, "desc", None)
        if desc is None:
            return False
        view = np.array(image)
        view[3, 6] = 0
        hit = np.ones(view.shape[:2], bool)
        if desc.type is not None:
            hit &= view[:, :, 0] == L.OBJECT_TO_IDX[desc.type]
        else:
            hit &= view[:, :, 0] >= L.KEY
        if desc.color is not None:
            hit &= view[:, :, 1] == L.COLOR_TO_IDX[desc.color]
        return bool(hit.any())

    def reset_info(self, state: MiniGridTextState, params: None = None) -> dict:
        """Episode facts for VectorEnv's trajectory records."""
        env = self.live_env(state)
        return {"goal": env.mission, "task_type": _task_type(env.instrs),
                "budget": int(env.max_steps), "env": self.name}

    # --- Environment API ------------------------------------------------------------------
    def reset_env(self, key: Any, params: None = None):
        """A new episode of the official MiniGrid level from ``key``'s seed; (text observation,
        state)."""
        seed = seed_of(key)
        env = self._make()
        obs, _ = env.reset(seed=seed)
        text = self._observe(env, obs["image"])
        state = MiniGridTextState(seed=seed, actions=(), observation=text,
                                  target_seen=self._target_visible(env, obs["image"]))
        self._keep(state, env)
        return text, state

    def step_env(self, key: Any, state: MiniGridTextState, action: Any, params: None = None):
        """One text action in the official MiniGrid level: (text observation, state, reward, done,
        info); an unknown action is invalid (no step taken), a finished episode a ValueError."""
        if not isinstance(state, MiniGridTextState):
            raise TypeError(f"state must be a MiniGridTextState, got {type(state).__name__}")
        if state.done:
            raise ValueError("episode is over (done was returned); call reset")
        action_id = parse_action(action)
        valid = action_id is not None
        env = self._env_for(state)
        before = (tuple(env.agent_pos), env.agent_dir, env.grid.encode().tobytes(),
                  None if env.carrying is None else env.carrying.encode())
        taken = env.actions.done if action_id is None else action_id
        obs, reward, terminated, truncated, _ = env.step(taken)
        after = (tuple(env.agent_pos), env.agent_dir, env.grid.encode().tobytes(),
                 None if env.carrying is None else env.carrying.encode())
        text = self._observe(env, obs["image"])
        if not valid:
            text = f"Nothing happens: {action!r} is not an admissible action.\n{text}"
        seen = self._target_visible(env, obs["image"])
        won = bool(terminated) and reward > 0
        subgoal = "complete the mission" if won else (
            "see the target" if seen and not state.target_seen else "")
        done = bool(terminated or truncated)
        new_state = MiniGridTextState(seed=state.seed, actions=state.actions + (int(taken),),
                                      observation=text, target_seen=state.target_seen or seen,
                                      done=done, won=won)
        self._keep(new_state, env)
        info = {
            "admissible_actions": list(ACTION_WORDS), "valid": valid, "won": won,
            "milestone": bool(subgoal), "subgoal": subgoal, "no_op": before == after,
            "goal": env.mission, "task_type": _task_type(env.instrs),
            "terminated": bool(terminated), "truncated": bool(truncated),
        }
        return text, new_state, float(reward), done, info


def bot_trajectory(text_env: MiniGridTextEnv, key: Any) -> Trajectory:
    """BabyAIBot's episode on ``text_env``'s level for ``key``, recorded as a Trajectory."""
    obs, state = text_env.reset(key)
    bot = BabyAIBot(text_env.live_env(state))
    steps, reward, info, done = [], 0.0, {}, False
    while not done:
        word = ACTION_WORDS[int(bot.replan())]
        next_obs, state, reward, done, info = text_env.step(
            step_key(seed_of(key), len(steps)), state, word)
        steps.append(Step(observation=obs, action=word, valid=info["valid"],
                          annotations={"milestone": info["milestone"], "no_op": info["no_op"],
                                       "subgoal": info["subgoal"]}))
        obs = next_obs
    env = text_env.live_env(state)
    return Trajectory(goal=info["goal"], steps=tuple(steps), final_observation=obs,
                      reward=float(reward), success=bool(info["won"]), budget=int(env.max_steps),
                      task_type=info["task_type"], env=text_env.name,
                      truncated=bool(info["truncated"]),
                      metadata={"seed": state.seed, "level": str(text_env.level),
                                "solver": "BabyAIBot"})


def bot_reference_trajectory(text_env: Any, key: Any, params: Any = None) -> Trajectory:
    """BabyAIBot's plan for a JAX-world task (solved inside minigrid), played in the
    ``BabyAITextEnv`` ``text_env`` and recorded as a Trajectory."""
    from jaxdm.envs.babyai.solver import play_trajectory

    params = text_env.default_params if params is None else params
    _, state = text_env.reset(key, params)
    level = SixRoomPickupLevel.from_state(state.core, max_steps=int(params.max_steps))
    level.reset(seed=0)
    actions = bot_actions(level)
    return play_trajectory(text_env, key, actions, params, solver="BabyAIBot")
