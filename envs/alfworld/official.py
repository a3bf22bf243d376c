"""The official ALFWorld engine (TextWorld's PDDL environment) behind the jaxdm API.

``OfficialAlfWorldEnv`` plays a ``game.tw-pddl`` file (or the same JSON content) in
``textworld.envs.PddlEnv`` with ALFWorld's entity naming (``alfworld``'s ``Demangler``, the
``AlfredDemangler`` wrapper's logic) — what ``alfworld``'s ``AlfredTWEnv`` runs. It gives the
same ``reset`` / ``step`` signatures and info keys as the native ``AlfWorldEnv`` (annotations
come from the native engine replayed alongside, since TextWorld does not compute them).

The official engine is stateful; to keep the jaxdm contract (states are immutable values that
can be copied and continued), a state records the game and its action history, and the
adapter keeps one live TextWorld environment per game: stepping a state whose history is the
live one's is one TextWorld step, stepping any other state (an older copy, a branch) first
replays its history.

Needs ``alfworld`` and ``textworld`` with ``fast-downward-textworld`` (the ``envs`` extra).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.alfworld.engine import AlfWorldParams, initial_state, step_state
from jaxdm.envs.alfworld.gamefile import load_game_data, read_game_data
from jaxdm.envs.alfworld.world import HAS_DEPENDENCY, TASK_LABELS, Game


def official_available() -> bool:
    """Whether the official engine can run here (textworld + fast_downward importable)."""
    try:
        import fast_downward  # noqa: F401
        import textworld  # noqa: F401
        from textworld.envs import PddlEnv  # noqa: F401
    except Exception:
        return False
    return True


class OfficialGame:
    """A live official engine for one game (TextWorld PddlEnv + ALFWorld's entity names)."""

    def __init__(self, data: Mapping, *, where: str = "game"):
        import textworld
        from textworld.envs import PddlEnv
        from alfworld.agents.utils.misc import Demangler

        self.where = where
        self.data = dict(data)
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        self.env = PddlEnv(infos)
        self.env.load(self.data)
        demangler = Demangler(game_infos=self.env._entity_infos, shuffle=False)
        for info in self.env._entity_infos.values():
            info.name = demangler.demangle_alfred_name(info.id)
        self.history: tuple[str, ...] | None = None
        self.last: Any = None

    def reset(self):
        """Reset the official TextWorld game; its first game state (kept as ``last``), the command
        history emptied."""
        self.last = self.env.reset()
        self.history = ()
        return self.last

    def step(self, command: str):
        """Send ``command`` to the official game; (game state, score, done), the command appended to
        the history."""
        self.last, score, done = self.env.step(command)
        self.history = self.history + (command,)
        return self.last, score, done

    def goto(self, history: tuple[str, ...]):
        """Bring the live environment to the end of ``history`` (replaying if needed)."""
        if self.history == history:
            return self.last
        if self.history is not None and history[:len(self.history)] == self.history:
            todo = history[len(self.history):]
        else:
            self.reset()
            todo = history
        for c in todo:
            self.step(c)
        return self.last


@dataclasses.dataclass(frozen=True)
class OfficialState:
    """An official-engine episode as a value: the game key and the commands issued so far."""

    key: str
    history: tuple[str, ...]
    observation: str
    admissible: tuple[str, ...]
    won: bool
    native: Any = dataclasses.field(compare=False, repr=False, default=None)
    t: int = 0


class OfficialAlfWorldEnv(Environment):
    """The official TextWorld engine behind ``reset`` / ``step`` (same info keys as native).

    Games come from ``game_files=`` (``game.tw-pddl`` paths, played as they are), else from
    ``params.games`` (native ``Game`` objects: their file, or their problem with the shipped
    domain and grammar), else are generated from the seed like the native engine's.
    """

    name = "alfworld-official"

    def __init__(self, params: AlfWorldParams | None = None, *, game_files: tuple[str, ...] = ()):
        if not official_available():
            raise ImportError("the official ALFWorld engine needs textworld with fast-downward: "
                              "pip install 'jaxdm[envs]' (alfworld==0.4.2)")
        self._params = params or AlfWorldParams()
        self._files = tuple(game_files)
        self._live: dict[str, OfficialGame] = {}
        self._data: dict[str, dict] = {}
        self._native: dict[str, Game] = {}

    def __getstate__(self):  # live TextWorld objects stay in the process that made them
        d = dict(self.__dict__)
        d["_live"] = {}
        return d

    @property
    def default_params(self) -> AlfWorldParams:
        """The params this env was built with."""
        return self._params

    # ---- game registry ------------------------------------------------------------------
    def register(self, data: Mapping, *, key: str | None = None, traj_data: Mapping | None = None,
                 where: str = "game") -> str:
        """Register game content (a ``game.tw-pddl`` dict); returns its key."""
        key = key or f"game{len(self._data)}"
        self._data[key] = dict(data)
        self._native[key] = load_game_data(dict(data), where=where,
                                           traj_data=dict(traj_data) if traj_data else None)
        return key

    def register_file(self, path: str) -> str:
        """Register the game file at ``path`` (its traj_data.json beside it, if any) under its path
        as key, once; returns the key."""
        if path not in self._data:
            import os

            traj = None
            tp = os.path.join(os.path.dirname(path), "traj_data.json")
            if os.path.exists(tp):
                with open(tp, encoding="utf-8") as f:
                    traj = json.load(f)
            self.register(read_game_data(path), key=path, traj_data=traj, where=path)
        return path

    def register_game(self, game: Game) -> str:
        """Register a native ``Game``: its file when it came from one, else its problem played
        with the shipped domain and grammar (what ``alfworld-generate`` would write)."""
        if game.ref is not None and game.ref[0] == "file":
            return self.register_file(game.ref[1])
        key = f"game@{id(game)}" if game.ref is None else "/".join(map(str, game.ref))
        if key not in self._data:
            from jaxdm.envs.alfworld.generator import grammar_with_task, logic_files
            from jaxdm.envs.alfworld.pddl import write_problem

            if game.variant.put_template != "move {o} to {r}" or game.variant.arrive_at_location:
                raise ValueError(f"{game.where}: a game of the older grammar must be given as "
                                 "its game.tw-pddl file (game_files=...)")
            domain, _ = logic_files()
            data = {"pddl_domain": domain, "grammar": grammar_with_task(game.goal_description),
                    "pddl_problem": write_problem(game.problem)}
            self._data[key] = data
            self._native[key] = game
        return key

    def _key_for_seed(self, seed: int, params: AlfWorldParams) -> str:
        if self._files:
            return self.register_file(self._files[seed % len(self._files)])
        if params.games:
            return self.register_game(params.games[seed % len(params.games)])
        from jaxdm.envs.alfworld.generator import game_file_data, generate_task

        key = f"{params.split}/{seed}/{','.join(params.task_types)}"
        if key not in self._data:
            task = generate_task(seed, split=params.split, task_types=params.task_types)
            self.register(game_file_data(task, walkthrough=None), key=key,
                          traj_data=task.traj_data, where=key)
        return key

    def _live_game(self, key: str) -> OfficialGame:
        if key not in self._live:
            self._live[key] = OfficialGame(self._data[key], where=key)
        return self._live[key]

    # ---- API ----------------------------------------------------------------------------
    def reset_env(self, key: Any, params: AlfWorldParams):
        """Reset the game the seed of ``key`` picks among the registered ones (reset_key)."""
        return self.reset_key(self._key_for_seed(seed_of(key), params))

    def reset_key(self, key: str):
        """Reset the registered game ``key`` in the official engine, with the native engine's state
        alongside; (its first feedback, an OfficialState with the admissible commands)."""
        live = self._live_game(key)
        gs = live.reset()
        native = initial_state(self._native[key])
        state = OfficialState(key=key, history=(), observation=gs.feedback,
                              admissible=tuple(gs["admissible_commands"]), won=bool(gs["won"]),
                              native=native)
        return gs.feedback, state

    def step_env(self, key: Any, state: OfficialState, action: Any, params: AlfWorldParams):
        """One command in the official engine (replaying the history when the live game is not this
        state's), the native engine stepped alongside for its milestone / no-op annotations; (obs,
        state, reward, done, info)."""
        if not isinstance(action, str):
            raise TypeError(f"action must be a command string, got {type(action).__name__}")
        live = self._live_game(state.key)
        live.goto(state.history)
        gs, score, done = live.step(action)
        game = self._native[state.key]
        native, _, notes = step_state(game, state.native, action)
        valid = action.strip() in state.admissible
        new = OfficialState(key=state.key, history=state.history + (action,),
                            observation=gs.feedback, admissible=tuple(gs["admissible_commands"]),
                            won=bool(gs["won"]), native=native, t=state.t + 1)
        truncated = (not new.won) and new.t >= params.max_steps
        info = {
            "admissible_actions": list(new.admissible), "valid": valid, "won": new.won,
            "milestone": notes["milestone"], "no_op": notes["no_op"], "subgoal": notes["subgoal"],
            "goal": game.goal_description, "task_type": TASK_LABELS[game.task_type],
            "task_type_full": game.task_type,
            "has_dependency": HAS_DEPENDENCY[game.task_type], "step": new.t,
            "truncated": truncated,
        }
        return gs.feedback, new, float(score), bool(done or truncated), info


__all__ = ["OfficialAlfWorldEnv", "OfficialGame", "OfficialState", "official_available"]
