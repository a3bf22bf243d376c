"""``jaxdm train-dm``: packed SFT of a decision model (``jaxdm.train.sft``)."""
from __future__ import annotations

import json
import sys

from jaxdm.config import ConfigError, command_overrides, load_config
from jaxdm.rundir import lock_run_dir


def add_parser(sub) -> None:
    """Add the `jaxdm train-dm` subcommand and its flags (--config, --data, --model, --out,
    --no-progress, key=value overrides) to the subparsers ``sub``."""
    p = sub.add_parser(
        "train-dm", help="packed SFT of a decision model (LoRA, orbax resume, HF export)",
        description="Train a decision model on JSONL states (context + questions with answer "
                    "keys): one packed forward per context trains all its questions; loss CE "
                    "+ 0.5 SE against the mixed target; LoRA rank 32, 2 epochs, lr 1e-4 "
                    "(AdamW); resumes from the run folder's latest checkpoint; exports the "
                    "merged model as an HF folder (out_dir/model).")
    p.add_argument("--config", help="YAML file of TrainDMConfig keys")
    p.add_argument("--data", help="training JSONL (e.g. experiments/decision_gym_data.py output)")
    p.add_argument("--model", help="'smollm2' or an HF folder")
    p.add_argument("--out", dest="out_dir", help="run folder")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def main(args) -> int:
    """Run `jaxdm train-dm` from parsed ``args``: load the config, lock the run folder for the run's
    life (released when done, given up on failure), train, print the summary as JSON; 2 with the
    error printed on a bad config or data."""
    from jaxdm.train.packing import IndistinctOptions  # why: JAX, with the command
    from jaxdm.train.sft import TrainDMConfig, TrainingError, train  # why: JAX

    try:
        cfg = load_config(TrainDMConfig, args.config,
                          command_overrides(args, ("data", "model", "out_dir")))
        # the run folder is this job's for its whole life; a run that fails before writing
        # anything leaves no folder behind
        lock = lock_run_dir(cfg.out_dir, "run folder")
        try:
            summary = train(cfg)
        except BaseException:
            lock.abandon()
            raise
        lock.release()
    except (ConfigError, TrainingError, IndistinctOptions, ValueError, FileNotFoundError) as e:
        print(f"jaxdm train-dm: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in summary.items() if k != "skipped_indistinct"}, indent=2))
    return 0
