"""GRPO on the harness (seed 003 App. D): a short recorded run through the RL trainer.

The trainer (``jaxdm.rl.trainer``) with ``policy.kind: harness`` (``jaxdm.train.harness_rollout``):
the decision model (an option-scoring policy) makes every DECISION GYM tool choice, the fixed
SimulatedLLM (strong profile) writes the parameters, G = 8 episodes per task, reward
r = success − 0.5·max(0, LLM calls − 10)/10 − 0.2·irreversible errors; grpo estimator + ppo
term; the trainer's checkpoints (``--resume`` continues exactly), metrics JSONL and NaN
guards. Before / after: greedy decisions on test-split tasks. Settings: the preset
``experiments/configs/teacher_grpo_harness.yaml`` (also ``experiments/teacher_grpo.py
--config harness``), the flags below and ``key=value`` overrides of any trainer key.

On 2 shared CPU cores SmolLM2-135M costs 1-2 minutes per 69-option tool question
(experiments/harness_decision_gym.py), so the recorded run uses the tiny random decoder;
``--model`` takes "smollm2" or an exported SFT folder on a real machine.

    python experiments/bench_harness_grpo.py --out experiments/results/harness_grpo
    python experiments/bench_harness_grpo.py --out /tmp/x --quick          # smoke
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from jaxdm import config as cfgmod  # noqa: E402
from jaxdm.jsonl import write_atomic, write_json  # noqa: E402
import jaxdm.train.harness_rollout  # noqa: E402,F401  registers policy.kind: harness
from jaxdm.rl.trainer import TrainConfig, Trainer  # noqa: E402
from jaxdm.rundir import RunFolderError  # noqa: E402

PRESET = ROOT / "experiments" / "configs" / "teacher_grpo_harness.yaml"
QUICK = ["iterations=1", "tasks_per_iter=1", "group_size=2", "eval_tasks=1", "max_actions=4"]
SUMMARY = ("success", "reward", "llm_calls", "irreversible_errors", "steps")


def eval_row(ev: dict, cfg) -> dict:
    """The harness means of a trainer evaluation record (``eval/All`` is success %), with
    the split and task count (the recorded ``summary.json``'s form)."""
    return {"split": dict(cfg.env.eval_kwargs).get("split", "test"), "tasks": cfg.eval_tasks,
            "success": ev["eval/All"] / 100.0,
            **{k: ev[f"eval/All_{k}"] for k in SUMMARY if k != "success"}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=None, help="model.path (default: the tiny decoder)")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--tasks", type=int, help="tasks per iteration")
    ap.add_argument("--group", type=int)
    ap.add_argument("--eval-tasks", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--quick", action="store_true")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    flags = {"iterations": args.iterations, "tasks_per_iter": args.tasks,
             "group_size": args.group, "eval_tasks": args.eval_tasks, "optim.lr": args.lr,
             "model.path": args.model}
    overrides = (QUICK if args.quick else []) + [f"{k}={v}" for k, v in flags.items()
                                                 if v is not None]
    try:
        cfg = cfgmod.load_config(TrainConfig, PRESET, [*overrides, f"out_dir={args.out}",
                                                       *args.overrides])
    except cfgmod.ConfigError as e:
        raise SystemExit(f"bench_harness_grpo: error: {e}") from None
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    try:
        # the initial policy (a resumed run restores its checkpoint inside run())
        before = eval_row(tr.evaluate(), cfg) if cfg.eval_tasks else None
        tr.run(resume=args.resume, overwrite=args.overwrite)
    except RunFolderError as e:
        raise SystemExit(f"bench_harness_grpo: error: {e}") from None
    finally:
        tr.close()
    recs = [json.loads(x) for x in (Path(args.out) / "metrics.jsonl").read_text().splitlines()]
    its = [r for r in recs if "train/success" in r]
    finals = [r for r in recs if "eval/All" in r and "train/success" not in r]
    after = eval_row(finals[-1], cfg) if finals else None
    lines = ["| | success | reward | LLM calls | irreversible errors | steps |",
             "|---|---|---|---|---|---|"]
    rows = [("before (greedy, test)", before), ("after (greedy, test)", after)]
    rows += [(f"iteration {r['iteration']} (sampled, train)",
              {k: r[f"train/{k}"] for k in SUMMARY}) for r in its]
    for name, s in rows:
        if s:
            lines.append(f"| {name} | {s['success']:.3f} | {s['reward']:.3f} | "
                         f"{s['llm_calls']:.2f} | {s['irreversible_errors']:.3f} | "
                         f"{s['steps']:.1f} |")
    seconds = time.perf_counter() - t0
    model = cfg.model.path or "tiny"
    text = (f"Harness GRPO, model {model}, {cfg.iterations} iterations x "
            f"{cfg.tasks_per_iter} tasks x G={cfg.group_size}, lr {cfg.optim.lr}, "
            f"{seconds:.0f} s this session (loaded CPU)\n\n" + "\n".join(lines) + "\n")
    out = {"config": cfgmod.to_dict(cfg), "before": before, "after": after,
           "iterations": its, "seconds": round(seconds, 1)}
    write_json(Path(args.out) / "summary.json", out)
    write_atomic(Path(args.out) / "report.md", text)
    print(text)
    print(json.dumps({"before": before, "after": after}))
    return out


if __name__ == "__main__":
    main()
