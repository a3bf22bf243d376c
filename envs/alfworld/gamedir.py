"""Official ALFWorld game folders from generated tasks: ``game.tw-pddl``, ``traj_data.json`` and
``initial_state.pddl`` per game (``write_game_dir``), a whole split in the official layout
(``write_split``). Above the generator and the expert (a game written without a walkthrough
stores the expert's plan), so neither imports the other."""
from __future__ import annotations

import json
import os
from typing import Sequence

from jaxdm.envs.alfworld.experts import expert_plan
from jaxdm.envs.alfworld.generator import GeneratedTask, game_file_data, generate_task
from jaxdm.envs.alfworld.world import TASK_TYPES


def write_game_dir(out_dir: str, task: GeneratedTask, *,
                   walkthrough: list[str] | None = None) -> str:
    """Write ``game.tw-pddl``, ``traj_data.json`` and ``initial_state.pddl``; returns the game path.

    Without a walkthrough, the expert's plan is computed and stored (``solvable`` true)."""
    if walkthrough is None:
        walkthrough = expert_plan(task.game())
    os.makedirs(out_dir, exist_ok=True)
    data = game_file_data(task, walkthrough=walkthrough)
    path = os.path.join(out_dir, "game.tw-pddl")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    with open(os.path.join(out_dir, "traj_data.json"), "w", encoding="utf-8") as f:
        json.dump(task.traj_data, f, indent=1)
    with open(os.path.join(out_dir, "initial_state.pddl"), "w", encoding="utf-8") as f:
        f.write(data["pddl_problem"])
    return path


def write_split(root: str, split: str, n: int, *, start: int = 0,
                task_types: Sequence[str] = TASK_TYPES) -> list[str]:
    """Write ``n`` generated games of ``split`` in the official folder layout
    ``root/<split>/<task_type>-<target>-...-<scene>/trial_<seed>/``; returns the game paths."""
    paths = []
    for seed in range(start, start + n):
        task = generate_task(seed, split=split, task_types=task_types)
        p = task.traj_data["pddl_params"]
        folder = "-".join([task.task.task_type, p["object_target"], p["mrecep_target"] or "None",
                           p["parent_target"] or p["toggle_target"] or "None",
                           str(task.traj_data["scene"]["scene_num"])])
        paths.append(write_game_dir(os.path.join(root, split, folder, f"trial_{seed:06d}"), task))
    return paths
