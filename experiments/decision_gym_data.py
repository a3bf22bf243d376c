"""Write DECISION GYM decision states (context, question, options, answer key) to JSONL.

Each line is one state an agent acted in: the shared context, the questions of that state
(tool choice over the 69 shuffled tools, one per bounded/copyable parameter of each keyed
tool, and stop) with the acceptable option indices, the agent's action and the expert's.
That is the benchmark's L2 data; ``--episodes`` also writes the full episodes as
``jaxdm.trajectory`` JSONL (L3 reference runs).

    python experiments/decision_gym_data.py --n 200 --split test --variant shift \
        --agent noisy --error-rate 0.3 --out states.jsonl --episodes episodes.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from jaxdm.envs.decision_gym import (SPLITS, VARIANTS, DecisionGym, ExpertAgent, GymParams,
                                     NoisyAgent, run_episode, split_seed)
from jaxdm.trajectory import write_jsonl


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, required=True, help="number of tasks")
    ap.add_argument("--out", required=True, help="output JSONL of decision states")
    ap.add_argument("--split", choices=SPLITS, default="train")
    ap.add_argument("--variant", choices=VARIANTS, default="base")
    ap.add_argument("--start", type=int, default=0, help="first task index within the split")
    ap.add_argument("--agent", choices=("expert", "noisy"), default="noisy")
    ap.add_argument("--error-rate", type=float, default=0.2, help="noisy agent's error rate")
    ap.add_argument("--agent-seed", type=int, default=0)
    ap.add_argument("--lenient", action="store_true", help="non-strict mode (errors continue)")
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--episodes", default=None, help="also write the episodes (trajectories)")
    ap.add_argument("--overwrite", action="store_true", help="replace existing output files")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"--n must be >= 1, got {args.n}")
    if not 0.0 <= args.error_rate <= 1.0:
        ap.error(f"--error-rate must be in [0, 1], got {args.error_rate}")
    from jaxdm.rundir import refuse_overwrite
    try:
        refuse_overwrite([p for p in (args.out, args.episodes) if p], overwrite=args.overwrite)
    except FileExistsError as e:
        ap.error(str(e))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    env = DecisionGym()
    params = GymParams(variant=args.variant, strict=not args.lenient, max_steps=args.max_steps,
                       split=args.split)
    agent = (ExpertAgent() if args.agent == "expert"
             else NoisyAgent(error_rate=args.error_rate, seed=args.agent_seed))
    t0 = time.perf_counter()
    n_states = n_success = 0
    trajectories = []
    with open(args.out, "w", encoding="utf-8") as f:
        for i in range(args.start, args.start + args.n):
            seed = split_seed(args.split, i)
            traj, records = run_episode(env, agent, seed, params)
            n_success += traj.success
            for r in records:
                row = r.to_dict() | {"seed": seed, "split": args.split,
                                     "variant": args.variant, "request": traj.task_type}
                f.write(json.dumps(row) + "\n")
                n_states += 1
            if args.episodes:
                trajectories.append(traj)
    if args.episodes:
        write_jsonl(args.episodes, trajectories)
    summary = {"tasks": args.n, "states": n_states, "success_rate": n_success / args.n,
               "seconds": round(time.perf_counter() - t0, 3), "out": args.out}
    print(json.dumps(summary), file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
