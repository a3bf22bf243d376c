"""The `jaxdm` console command: `jaxdm screen ...`, `jaxdm demo`, `jaxdm decide ...`,
`jaxdm harness ...`, `jaxdm train-dm ...` and `jaxdm bench ...`."""
from __future__ import annotations

import argparse
import json
import sys

from jaxdm.bench import cli as bench_cli
from jaxdm.config import ConfigError, command_overrides, load_config, to_dict
from jaxdm.jsonl import OutputError
from jaxdm.rundir import RunFolderError
from jaxdm.secrets import RedactingStream
from jaxdm.train import cli as train_cli

DEMO_HELP = ("the main job on the embedded default: screen SmolLM2-135M (constrained readout), "
             "the shipped trained judge and the Oracle on ALFWorld noisy-expert trajectories "
             "(a 2.5-minute CPU preset)")

# `make demo` must finish within 2.5 minutes on 2 CPU cores after the install: one trajectory per
# task type with a 20-action budget, all four question x context combinations, and the +FB / 50 %
# expansions, for the untrained SmolLM2, the shipped trained judge (alias 'smollm2-judge', the
# same model with its LoRA adapter: one pass each) and the Oracle. `jaxdm screen` runs the full set.
DEMO_CONFIG = dict(num_trajectories=6, budget=20, expansions=("FB", "50%"), out_dir="screen_out",
                   judges=("smollm2", "smollm2-judge", "oracle"))
# Judge sets earlier demos were run with: a folder holding one of them is a demo folder.
DEMO_JUDGE_SETS = ({"smollm2", "oracle"}, {"smollm2", "smollm2-judge", "oracle"})


def _screen_parser(sub):
    p = sub.add_parser("screen", help="screen judges on recorded trajectories",
                       description="Score every action of recorded trajectories with each judge under "
                                   "Prefix|Hindsight x Value|Progress and report judge quality.")
    p.add_argument("--config", help="YAML file of ScreenConfig keys")
    p.add_argument("--trajectories", help="JSONL of recorded trajectories (default: generate)")
    p.add_argument("--judge", action="append", dest="judges", metavar="SPEC",
                   help="judge: 'smollm2', 'oracle', or 'kind:key=value,...' (repeatable)")
    p.add_argument("--out", dest="out_dir", help="output folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _output_flags(p)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return p


def _output_flags(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the run in the output folder (finished passes are kept)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run in the output folder (without this or --resume a "
                        "folder holding files is refused)")


def main(argv=None) -> int:
    """The `jaxdm` console command: parse ``argv`` (None: sys.argv) into a subcommand, run it with
    stdout and stderr redacting credentials, and return its exit code (2 with the message for a
    run-folder or output error)."""
    parser = argparse.ArgumentParser(prog="jaxdm", description="jaxdm: decision models for LLM agents")
    sub = parser.add_subparsers(dest="command", required=True)
    _screen_parser(sub)
    _output_flags(sub.add_parser("demo", help=DEMO_HELP, description=DEMO_HELP))
    # why: these two import numpy and JAX; `import jaxdm.cli` stays light
    from jaxdm import decide
    from jaxdm.harness import cli as harness_cli
    decide.add_parser(sub)
    harness_cli.add_parser(sub)
    train_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    args = parser.parse_args(argv)
    # What the command prints quotes specs and URLs: their credentials never reach a terminal
    # or a log file (result files are redacted by their writers, jaxdm.jsonl).
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        return _dispatch(args, {"train-dm": train_cli.main, "bench": bench_cli.main,
                                "decide": decide.run, "harness": harness_cli.main})
    except (RunFolderError, OutputError) as e:   # every command: a named error, rc 2
        print(f"jaxdm {args.command}: error: {e}", file=sys.stderr)
        return 2
    finally:
        sys.stdout, sys.stderr = streams


def _dispatch(args, commands) -> int:
    """Run the parsed command: ``commands`` maps the subcommands other modules own to their
    runner; screen and demo are run here."""
    from jaxdm.models import compile_cache  # why: JAX
    compile_cache.enable()  # JAX's persistent compilation cache (JAXDM_COMPILATION_CACHE=0: off)
    if args.command in commands:
        return commands[args.command](args)

    from jaxdm.screen.run import RUN_SETTINGS, ScreenConfig, ScreenError, run  # why: numpy

    cfg = ScreenConfig(**DEMO_CONFIG)
    try:
        if args.command == "demo":
            cfg = ScreenConfig(**DEMO_CONFIG)
            if not args.resume and _holds_demo(cfg, RUN_SETTINGS):
                args.overwrite = True  # `make demo` is idempotent: it replaces its own run
        else:
            try:
                cfg = load_config(ScreenConfig, args.config,
                                  command_overrides(args, ("trajectories", "out_dir")))
            except ConfigError as e:
                raise ScreenError(str(e)) from e
            if args.judges:
                cfg = type(cfg)(**{**cfg.__dict__, "judges": tuple(args.judges)})
        result = run(cfg, resume=args.resume, overwrite=args.overwrite)
    except ScreenError as e:
        print(f"jaxdm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\njaxdm {args.command}: interrupted; finished passes are saved in "
              f"{cfg.out_dir}/ (scores.jsonl, passes.jsonl): run the same command with --resume "
              "to continue", file=sys.stderr)
        return 130
    if result["failed_judges"]:
        for j, why in result["failed_judges"].items():
            print(f"jaxdm {args.command}: error: judge {j!r} failed: {why}", file=sys.stderr)
        return 1
    return 0


def _holds_demo(cfg, run_settings) -> bool:
    """Whether the demo's folder holds an earlier demo run (the same ``run_settings``)."""
    from jaxdm.screen.store import OUTPUT_FILES, ScreenStore  # why: numpy

    store = ScreenStore(cfg.out_dir)
    saved = store.saved_identity()
    if saved is None:
        return _holds_legacy_demo(store.out, OUTPUT_FILES)
    want = {k: v for k, v in to_dict(cfg).items() if k in run_settings}
    got = saved.get("settings")
    if not isinstance(got, dict):
        return False
    # A demo run with another judge set the demo has used is one too.
    return got == want or (set(map(str, got.get("judges") or [])) in DEMO_JUDGE_SETS
                           and {**got, "judges": want["judges"]} == want)


def _holds_legacy_demo(out, output_files) -> bool:
    """A demo written before runs recorded screen.json: only screen output files
    (``output_files``), and a summary.json with the demo's trajectory count and expansion
    levels."""
    try:
        if not all(p.name in output_files for p in out.iterdir()):
            return False
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return (summary.get("n_trajectories") == DEMO_CONFIG["num_trajectories"]
            and summary.get("levels") == [*DEMO_CONFIG["expansions"], "100%"])


if __name__ == "__main__":
    sys.exit(main())
