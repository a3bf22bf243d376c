"""Two tiny text environments for RL tests and CPU-sized experiments.

- ``OrderingEnv``: an ALFWorld-like dependency task in miniature. The goal "put a clean mug
  in the cabinet" needs a prerequisite step ("clean the mug") before an easy final step
  ("put the mug in the cabinet"). Putting the object away before the prerequisite ends the
  episode as a failure, so an agent that rushes to the easy step fails; distractor commands
  waste the small action budget. Outcome reward only (1 if won). Annotations: milestone for
  the first prerequisite and the winning put, no-op for look/examine/repeats/invalid.
- ``PickTargetEnv``: one decision: choose the command "open the door" among shuffled
  distractors (success 1/num_options by chance). The trivial task of the learning test.

Both follow ``jaxdm.envs.core.Environment``: frozen state/params, ``reset(key, params)`` and
``step(key, state, action, params)`` are pure, ``key`` is an int seed or a JAX key, and
``reset_info`` gives what ``VectorEnv`` records (goal, task type, budget, admissible actions).
``OrderingParams.split`` picks the objects: "train" uses the first seven, "test" the three
held-out ones (evaluation on unseen objects).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxdm.envs.core import Environment, seed_of
from jaxdm.registry import Registry

__all__ = ["OrderingParams", "OrderingState", "OrderingEnv", "PickTargetParams",
           "PickTargetState", "PickTargetEnv", "TASK_TYPES"]

# task type -> (prerequisite verb, goal adjective, state word after it)
TASK_TYPES: Registry[tuple[str, str, str]] = Registry("task type")
TASK_TYPES.register("clean", ("clean", "clean", "clean"))
TASK_TYPES.register("heat", ("heat", "hot", "hot"))
TASK_TYPES.register("cool", ("cool", "cool", "cold"))
_OBJECTS = ("mug", "apple", "plate", "cup", "potato", "bowl", "egg", "pan", "tomato", "fork")
_RECEPTACLES = ("cabinet", "fridge", "drawer", "shelf", "countertop", "table")
_PLACES = ("sinkbasin", "microwave", "fridge", "countertop", "stoveburner")
_HELD_OUT_OBJECTS = 3  # the last 3 objects are test-only


def _split_objects(split: str) -> tuple[str, ...]:
    if split == "train":
        return _OBJECTS[:-_HELD_OUT_OBJECTS]
    if split == "test":
        return _OBJECTS[-_HELD_OUT_OBJECTS:]
    if split == "all":
        return _OBJECTS
    raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")


@dataclasses.dataclass(frozen=True)
class OrderingParams:
    """Task distribution: action budget, distractor count, task types and object split."""

    budget: int = 5
    num_distractors: int = 3
    task_types: tuple[str, ...] = ("clean", "heat", "cool")
    split: str = "train"

    def __post_init__(self):
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if not 0 <= self.num_distractors <= 6:
            raise ValueError(f"num_distractors must be in [0, 6], got {self.num_distractors}")
        for t in self.task_types:
            TASK_TYPES.validate(t, field="OrderingParams.task_types")
        _split_objects(self.split)


@dataclasses.dataclass(frozen=True)
class OrderingState:
    """One ordering episode's state: the task type, object and receptacle, the task seed, whether
    the prerequisite was done, the distractor commands, steps taken, done and won."""
    task_type: str
    obj: str
    receptacle: str
    seed: int
    prepared: bool = False
    steps: int = 0
    done: bool = False
    won: bool = False
    last_action: str = ""
    distractors: tuple[str, ...] = ()

    @property
    def goal(self) -> str:
        """The goal text (e.g. put a hot mug in the cabinet)."""
        adj = TASK_TYPES[self.task_type][1]
        return f"put a {adj} {self.obj} in the {self.receptacle}."

    @property
    def prerequisite(self) -> str:
        """The command that must come first (e.g. "heat the mug")."""
        return f"{TASK_TYPES[self.task_type][0]} the {self.obj}"

    @property
    def final(self) -> str:
        """The command that wins once the prerequisite is done ("put the mug in the cabinet")."""
        return f"put the {self.obj} in the {self.receptacle}"


class OrderingEnv(Environment[OrderingState, OrderingParams]):
    """Prerequisite-then-final ordering task (see module docstring)."""

    name = "toy_ordering"

    def __init__(self, params: OrderingParams | None = None):
        self._params = params or OrderingParams()

    @property
    def default_params(self) -> OrderingParams:
        """The params this env was built with (OrderingParams() by default)."""
        return self._params

    # ---- helpers ------------------------------------------------------------------------
    def admissible_actions(self, state: OrderingState) -> tuple[str, ...]:
        """The commands offered in ``state``, in a per-step shuffled (seeded) order."""
        acts = [state.prerequisite, state.final, *state.distractors]
        rng = np.random.default_rng([state.seed, state.steps, 17])
        return tuple(acts[i] for i in rng.permutation(len(acts)))

    def reset_info(self, state: OrderingState, params: OrderingParams | None = None
                   ) -> dict[str, Any]:
        """The reset info of ``state``: goal, task type, step budget, admissible actions and env
        name."""
        params = params or self._params
        return {"goal": state.goal, "task_type": state.task_type, "budget": params.budget,
                "admissible_actions": list(self.admissible_actions(state)), "env": self.name}

    def _observation(self, state: OrderingState, text: str) -> str:
        where = f"You are in the kitchen. You hold the {state.obj}"
        status = f" (it is {TASK_TYPES[state.task_type][2]})" if state.prepared else ""
        return f"{text} {where}{status}."

    # ---- contract -----------------------------------------------------------------------
    def reset_env(self, key: Any, params: OrderingParams):
        """A new episode from ``key`` (an int seed or PRNG key): task type, object (of the params'
        split) and receptacle drawn from it; (first observation, state)."""
        seed = seed_of(key)
        rng = np.random.default_rng([seed, 1])
        task_type = params.task_types[rng.integers(len(params.task_types))]
        objs = _split_objects(params.split)
        obj = objs[rng.integers(len(objs))]
        receptacle = _RECEPTACLES[rng.integers(len(_RECEPTACLES))]
        other_verbs = [TASK_TYPES[t][0] for t in TASK_TYPES if t != task_type]
        pool = ["look around", f"examine the {obj}",
                *[f"{v} the {obj}" for v in other_verbs],
                *[f"go to the {p}" for p in _PLACES]]
        pick = rng.choice(len(pool), size=params.num_distractors, replace=False)
        distractors = tuple(pool[i] for i in sorted(pick))
        state = OrderingState(task_type=task_type, obj=obj, receptacle=receptacle, seed=seed,
                              distractors=distractors)
        return self._observation(state, "You arrive in the kitchen."), state

    def step_env(self, key: Any, state: OrderingState, action: Any, params: OrderingParams):
        """One command: the prerequisite marks it done, the final command wins after it (reward 1)
        and ends the episode before it; a command not offered is invalid; the budget truncates.
        (obs, state, reward, done, info); stepping a finished episode is a ValueError, a non-string
        action a TypeError."""
        if state.done:
            raise ValueError("step called on a finished OrderingEnv episode; reset first")
        if not isinstance(action, str):
            raise TypeError(f"action must be a command string, got {type(action).__name__}")
        action = action.strip()
        admissible = self.admissible_actions(state)
        milestone = no_op = False
        valid = action in admissible
        prepared, done, won, reward = state.prepared, False, False, 0.0
        if not valid:
            text, no_op = "Nothing happens.", True
        elif action == state.prerequisite:
            if state.prepared:
                text, no_op = f"The {state.obj} is already {TASK_TYPES[state.task_type][2]}.", True
            else:
                text, prepared, milestone = f"You {action}.", True, True
        elif action == state.final:
            done = True
            if state.prepared:
                text, won, reward, milestone = f"You {action}. Task complete.", True, 1.0, True
            else:
                text = (f"You {action}, but it is not {TASK_TYPES[state.task_type][1]}. "
                        "The task has failed.")
        elif action in ("look around",) or action.startswith("examine"):
            text, no_op = "Nothing new.", True
        elif action == state.last_action:
            text, no_op = f"You {action} again. Nothing changes.", True
        else:
            text = f"You {action}."
        steps = state.steps + 1
        truncated = not done and steps >= params.budget
        new = dataclasses.replace(state, prepared=prepared, steps=steps,
                                  done=done or truncated, won=won, last_action=action)
        obs = self._observation(new, text)
        info = {"admissible_actions": [] if new.done else list(self.admissible_actions(new)),
                "valid": valid, "won": won, "milestone": milestone, "no_op": no_op,
                "truncated": truncated}
        return obs, new, reward, new.done, info


@dataclasses.dataclass(frozen=True)
class PickTargetParams:
    """Params of the one-step pick task: how many options (2 to the distractor count + 1) and the
    target command."""
    num_options: int = 8
    target: str = "open the door"

    def __post_init__(self):
        if not 2 <= self.num_options <= len(_PICK_DISTRACTORS) + 1:
            raise ValueError(f"num_options must be in [2, {len(_PICK_DISTRACTORS) + 1}], "
                             f"got {self.num_options}")


_PICK_DISTRACTORS = ("look around", "sing a song", "wait", "jump", "go to the garden",
                     "read the book", "close the window", "take the key", "inventory",
                     "examine the lamp", "sit down")


@dataclasses.dataclass(frozen=True)
class PickTargetState:
    """A pick episode: the shuffled options, the target, done and won."""
    options: tuple[str, ...]
    target: str
    done: bool = False
    won: bool = False

    @property
    def goal(self) -> str:
        """The goal text: the target command."""
        return f"{self.target}."


class PickTargetEnv(Environment[PickTargetState, PickTargetParams]):
    """One-step task: the command ``params.target`` wins, every other command loses."""

    name = "toy_pick"

    def __init__(self, params: PickTargetParams | None = None):
        self._params = params or PickTargetParams()

    @property
    def default_params(self) -> PickTargetParams:
        """The params this env was built with."""
        return self._params

    def reset_info(self, state: PickTargetState, params: PickTargetParams | None = None
                   ) -> dict[str, Any]:
        """The reset info: goal, task type "pick", budget 1, the options as admissible actions, env
        name."""
        return {"goal": state.goal, "task_type": "pick", "budget": 1,
                "admissible_actions": list(state.options), "env": self.name}

    def reset_env(self, key: Any, params: PickTargetParams):
        """A new episode from ``key``: the target among num_options - 1 distinct distractors, in a
        seeded random order."""
        rng = np.random.default_rng([seed_of(key), 2])
        others = [d for d in _PICK_DISTRACTORS if d != params.target]
        pick = rng.choice(len(others), size=params.num_options - 1, replace=False)
        opts = [params.target, *[others[i] for i in pick]]
        opts = tuple(opts[i] for i in rng.permutation(len(opts)))
        return "You are in a small room.", PickTargetState(options=opts, target=params.target)

    def step_env(self, key: Any, state: PickTargetState, action: Any, params: PickTargetParams):
        """The one step: reward 1 and won for the target, 0 otherwise (a command not offered is
        invalid); the episode ends either way."""
        if state.done:
            raise ValueError("step called on a finished PickTargetEnv episode; reset first")
        if not isinstance(action, str):
            raise TypeError(f"action must be a command string, got {type(action).__name__}")
        action = action.strip()
        valid = action in state.options
        won = action == state.target
        text = "You did it." if won else ("Nothing happens." if not valid else "That was not it.")
        new = dataclasses.replace(state, done=True, won=won)
        info = {"admissible_actions": [], "valid": valid, "won": won, "milestone": won,
                "no_op": not won, "truncated": False}
        return text, new, float(won), True, info
