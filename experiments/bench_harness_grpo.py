"""GRPO on the harness (seed 003 App. D, ``jaxdm.train.harness_grpo``): a short recorded run.

The decision model (an option-scoring policy) makes every DECISION GYM tool choice, the fixed
SimulatedLLM (strong profile) writes the parameters, G = 8 episodes per task, reward
r = success − 0.5·max(0, LLM calls − 10)/10 − 0.2·irreversible errors; grpo estimator + ppo
term of jaxdm.rl. Before / after: greedy decisions on test-split tasks.

On 2 shared CPU cores SmolLM2-135M costs 1-2 minutes per 69-option tool question
(experiments/harness_decision_gym.py), so the recorded run uses the tiny random decoder
(``model=tiny``); ``--model`` takes "smollm2" or an exported SFT folder on a real machine.

    python experiments/bench_harness_grpo.py --out experiments/results/harness_grpo
    python experiments/bench_harness_grpo.py --out /tmp/x --quick          # smoke
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from jaxdm.jsonl import write_atomic  # noqa: E402


def main(argv=None) -> dict:
    from jaxdm.train.harness_grpo import HarnessGRPOConfig, train

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2, help="tasks per iteration")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--eval-tasks", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    args = ap.parse_args(argv)
    sizes = dict(iterations=args.iterations, tasks_per_iter=args.tasks, group_size=args.group,
                 eval_tasks=args.eval_tasks)
    if args.quick:
        sizes = dict(iterations=1, tasks_per_iter=1, group_size=2, eval_tasks=1, max_steps=4)
    cfg = HarnessGRPOConfig(model=args.model, out_dir=args.out, lr=args.lr,
                            max_context_tokens=256, max_option_tokens=6, mini_batch=32,
                            **sizes)
    try:
        out = train(cfg, overwrite=args.overwrite)
    except FileExistsError as e:
        raise SystemExit(f"bench_harness_grpo: error: {e}") from None
    b, a = out["before"] or {}, out["after"] or {}
    lines = ["| | success | reward | LLM calls | irreversible errors | steps |",
             "|---|---|---|---|---|---|"]
    for name, s in (("before (greedy, test)", b), ("after (greedy, test)", a)):
        if s:
            lines.append(f"| {name} | {s['success']:.3f} | {s['reward']:.3f} | "
                         f"{s['llm_calls']:.2f} | {s['irreversible_errors']:.3f} | "
                         f"{s['steps']:.1f} |")
    for it in out["iterations"]:
        lines.append(f"| iteration {it['iteration']} (sampled, train) | {it['success']:.3f} | "
                     f"{it['reward']:.3f} | {it['llm_calls']:.2f} | "
                     f"{it['irreversible_errors']:.3f} | {it['steps']:.1f} |")
    text = (f"Harness GRPO, model {cfg.model}, {cfg.iterations} iterations x "
            f"{cfg.tasks_per_iter} tasks x G={cfg.group_size}, lr {cfg.lr}, "
            f"{out['seconds']:.0f} s (loaded CPU)\n\n" + "\n".join(lines) + "\n")
    write_atomic(Path(args.out) / "report.md", text)
    print(text)
    print(json.dumps({"before": b, "after": a}))
    return out


if __name__ == "__main__":
    main()
