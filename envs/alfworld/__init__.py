"""ALFWorld: a native engine faithful to the official TextWorld one, game files, generator,
annotations, experts and an adapter to the official engine (imported as ``jaxdm.envs.alfworld``).

Quick tour::

    from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams, noisy_expert_trajectories

    env = AlfWorldEnv(AlfWorldParams(split="valid_unseen", max_steps=30))
    obs, state = env.reset(3)                  # generated problem for seed 3 (a heat task)
    obs, state, reward, done, info = env.step(0, state, "look")
    info["admissible_actions"], info["milestone"], info["no_op"], info["won"]

    env = AlfWorldEnv.from_split("~/.cache/alfworld/json_2.1.1", "valid_seen")  # official files
    trajs = noisy_expert_trajectories(60, seed=0, budget=30)   # Trajectory objects for judges

Modules: ``pddl`` (PDDL problems, goal checking), ``world`` (a compiled game: names, facts,
grammar variant, task), ``engine`` (states, transitions, texts, annotations, the env),
``gamefile`` (official ``game.tw-pddl`` / ``traj_data.json``), ``generator`` (new problems of
the six task types, official file writer, splits), ``experts`` (expert and noisy expert),
``official`` (TextWorld behind the same API), ``fidelity`` (step-by-step comparison),
``generate_trajectories`` (CLI writing JSONL).
"""
from jaxdm.envs.alfworld.engine import (NOTHING_HAPPENS, AlfWorldEnv, AlfWorldParams,
                                        AlfWorldState, command_table, initial_state, step_state,
                                        subgoals_reached, task_subgoals)
from jaxdm.envs.alfworld.experts import (NoisyExpertConfig, expert_plan, expert_trajectory,
                                         noisy_expert_trajectories, plan_from, run_noisy_expert)
from jaxdm.envs.alfworld.gamefile import find_games, load_game, load_game_data, load_split
from jaxdm.envs.alfworld.gamedir import write_game_dir, write_split
from jaxdm.envs.alfworld.generator import SPLITS, GeneratedTask, generate_game, generate_task
from jaxdm.envs.alfworld.official import OfficialAlfWorldEnv, official_available
from jaxdm.envs.alfworld.pddl import GameFileError, Problem, parse_problem, write_problem
from jaxdm.envs.alfworld.world import (HAS_DEPENDENCY, TASK_LABELS, TASK_TYPES, Game,
                                       GrammarVariant, TaskInfo, display_names)

__all__ = [
    "AlfWorldEnv", "AlfWorldParams", "AlfWorldState", "Game", "GameFileError", "GeneratedTask",
    "GrammarVariant", "HAS_DEPENDENCY", "NOTHING_HAPPENS", "NoisyExpertConfig",
    "OfficialAlfWorldEnv", "Problem", "official_available",
    "SPLITS", "TASK_LABELS", "TASK_TYPES", "TaskInfo", "command_table", "display_names",
    "expert_plan", "expert_trajectory", "find_games", "generate_game", "generate_task",
    "initial_state", "load_game", "load_game_data", "load_split", "noisy_expert_trajectories",
    "parse_problem", "plan_from", "run_noisy_expert", "step_state", "subgoals_reached",
    "task_subgoals", "write_game_dir", "write_problem", "write_split",
]
