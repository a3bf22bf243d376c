"""Oracle state values for ALFWorld: the expert's remaining plan length vs the budget left.

The LVRL ``Oracle`` value of a state (our choice; the seed gives none for ALFWorld) is

    V(s) = clip(1 − n(s) / L(s), 0, 1),

n(s) = the number of commands the expert (``experts.plan_from``) still needs from s, L(s) =
the action budget left; a won state has value 1. Same form as the BabyAI oracle
(``jaxdm.envs.babyai.value``): a step that shortens the remaining plan raises V, a wasted step
(a detour, a no-op, an invalid command) lowers it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxdm.envs.alfworld.engine import initial_state, step_state
from jaxdm.envs.alfworld.experts import plan_from
from jaxdm.envs.alfworld.world import TASK_TYPES, Game
from jaxdm.trajectory import Trajectory

__all__ = ["oracle_values", "trajectory_oracle_values"]


def _value(game: Game, state, steps_left: int) -> float:
    if state.won:
        return 1.0
    if steps_left <= 0:
        return 0.0
    try:
        n = len(plan_from(game, state))
    except RuntimeError:  # the expert finds no way to finish from here
        return 0.0
    return float(np.clip(1.0 - n / steps_left, 0.0, 1.0))


def oracle_values(game: Game, commands: Sequence[str], budget: int) -> np.ndarray:
    """V(s_0)..V(s_T) (float32 [T + 1]) of the states ``commands`` visit from the start."""
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")
    if len(commands) > budget:
        raise ValueError(f"{len(commands)} commands exceed the budget of {budget}")
    state = initial_state(game)
    out = [_value(game, state, budget)]
    for t, cmd in enumerate(commands):
        state, _, _ = step_state(game, state, cmd)
        out.append(_value(game, state, budget - t - 1))
    return np.asarray(out, np.float32)


def trajectory_oracle_values(traj: Trajectory) -> np.ndarray:
    """``oracle_values`` of a generated-problem trajectory (e.g. ``noisy_expert_trajectories``).

    The game is rebuilt from ``traj.metadata``: "seed", "split" and "task_type_full" (what
    ``run_noisy_expert`` records); a trajectory without them raises ValueError naming the key.
    """
    from jaxdm.envs.alfworld.generator import generate_game

    meta = traj.metadata
    for key in ("seed", "split", "task_type_full"):
        if key not in meta:
            raise ValueError(f"trajectory metadata lacks {key!r}: cannot rebuild its ALFWorld "
                             f"game for the oracle value")
    if meta["task_type_full"] not in TASK_TYPES:
        raise ValueError(f"trajectory metadata task_type_full={meta['task_type_full']!r} is not "
                         f"one of {list(TASK_TYPES)}")
    game = generate_game(int(meta["seed"]), split=str(meta["split"]),
                         task_types=(meta["task_type_full"],))
    return oracle_values(game, [s.action for s in traj.steps], traj.budget)
