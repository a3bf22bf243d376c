"""``jaxdm bench``: AGENT DECISION BENCH L1 / L2 / L3 (``jaxdm.bench.run``)."""
from __future__ import annotations

import sys

from jaxdm.config import ConfigError, command_overrides, load_config


def add_parser(sub) -> None:
    """Add the `jaxdm bench` subcommand and its flags (--config, --judge, --level, --out, --resume /
    --overwrite, key=value overrides) to the subparsers ``sub``."""
    p = sub.add_parser(
        "bench", help="AGENT DECISION BENCH: L1 (BFCL v4 items), L2 (DECISION GYM states), "
             "L3 (taking over a running agent)",
        description="Score decision-model backends on L1 isolated items from bfcl-eval's BFCL "
                    "v4 files and L2 recorded DECISION GYM states (noisy scripted agent, test "
                    "split) and L3 takeover of a running agent (DECISION GYM base / Shift / Hard, "
                    "ALFWorld): accuracy, ECE, task success, cost, time, calls, Kendall tau "
                    "across backends; bench.json, report.md, accuracy.png, levels.png. L3's "
                    "env steps run where env.backend says (inline, or env.num_workers worker "
                    "processes / Ray actors: env.backend=ray env.ray.address=HEAD:PORT).")
    p.add_argument("--config", help="YAML file of BenchConfig keys")
    p.add_argument("--judge", action="append", dest="judges", metavar="SPEC",
                   help="backend: 'smollm2', 'oracle', or 'kind:key=value,...' (repeatable)")
    p.add_argument("--level", action="append", dest="levels", metavar="LEVEL",
                   help="a bench level to run: l1, l2 or l3 (repeatable; default: the "
                        "config's levels; checked against jaxdm.bench.run.LEVELS)")
    p.add_argument("--out", dest="out_dir", help="output folder")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out (same settings): finished backend x level "
                        "units are kept")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def main(args) -> int:
    """Run `jaxdm bench` from parsed ``args``: the config file, then the overrides and flags over
    it, then the bench; 0 when it finished, 2 with the error printed on a bad config or a
    BenchError."""
    from jaxdm.bench.run import BenchConfig, BenchError, run  # why: envs, JAX

    try:
        cfg = load_config(BenchConfig, args.config, command_overrides(args, ("out_dir",)))
        if args.judges:
            cfg = type(cfg)(**{**cfg.__dict__, "judges": tuple(args.judges)})
        if args.levels:
            cfg = type(cfg)(**{**cfg.__dict__, "levels": tuple(dict.fromkeys(args.levels))})
        run(cfg, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, BenchError) as e:
        print(f"jaxdm bench: error: {e}", file=sys.stderr)
        return 2
    return 0
