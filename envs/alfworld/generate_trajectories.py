"""Write N noisy-expert ALFWorld trajectories to JSONL (and optionally the games they played).

    python -m jaxdm.envs.alfworld.generate_trajectories --n 20 --out x.jsonl
    python -m jaxdm.envs.alfworld.generate_trajectories --n 60 --seed 3 --budget 30 \\
        --task-types pick_heat_then_place_in_recep pick_two_obj_and_place \\
        --dependency-error-prob 0.8 --recover-prob 0.3 --games-dir games/

Each line is a ``jaxdm.trajectory.Trajectory`` (goal, steps with observation / action /
validity / milestone & no-op annotations, final observation, outcome). A summary (successes,
milestones, no-ops per task type) is printed at the end.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from jaxdm.envs.alfworld.experts import NoisyExpertConfig, noisy_expert_trajectories
from jaxdm.envs.alfworld.generator import SPLITS
from jaxdm.envs.alfworld.world import TASK_TYPES
from jaxdm.trajectory import write_jsonl


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxdm.envs.alfworld.generate_trajectories --n N --out FILE``: write N
    noisy-expert trajectories (seed, action budget, split, ...) as Trajectory JSONL; returns the
    exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, required=True, help="number of trajectories")
    ap.add_argument("--out", required=True, help="output JSONL path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=30, help="action budget per episode")
    ap.add_argument("--split", default="train", choices=SPLITS)
    ap.add_argument("--task-types", nargs="+", default=None, choices=TASK_TYPES)
    defaults = NoisyExpertConfig()
    for name in ("detour_prob", "look_prob", "invalid_prob", "dependency_error_prob",
                 "recover_prob", "give_up_prob", "search_prob"):
        ap.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name))
    ap.add_argument("--games-dir", default=None,
                    help="also write each played game in the official file format here")
    args = ap.parse_args(argv)
    if args.n < 0:
        ap.error("--n must be >= 0")
    config = NoisyExpertConfig(**{k: getattr(args, k) for k in (
        "detour_prob", "look_prob", "invalid_prob", "dependency_error_prob", "recover_prob",
        "give_up_prob", "search_prob")})
    trajs = noisy_expert_trajectories(args.n, args.seed, task_types=args.task_types,
                                      budget=args.budget, split=args.split, config=config)
    count = write_jsonl(args.out, trajs)
    if args.games_dir:
        import os

        from jaxdm.envs.alfworld.gamedir import write_game_dir
        from jaxdm.envs.alfworld.generator import generate_task

        for i, t in enumerate(trajs):
            task = generate_task(t.metadata["seed"], split=args.split,
                                 task_types=(t.metadata["task_type_full"],))
            write_game_dir(os.path.join(args.games_dir, f"{i:05d}"), task)
    by_type = Counter(t.task_type for t in trajs)
    wins = Counter(t.task_type for t in trajs if t.success)
    kinds = Counter(k for t in trajs for k in t.action_types)
    print(f"wrote {count} trajectories to {args.out}")
    for tt in sorted(by_type):
        print(f"  {tt:9s} {by_type[tt]:4d} episodes, {wins[tt]:4d} successes")
    print(f"  steps: {sum(kinds.values())} ({kinds['milestone']} milestone, "
          f"{kinds['no_op']} no-op, {kinds['other']} other)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
