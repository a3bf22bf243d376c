"""``jaxdm harness shadow|fit|run|compare|all``: the command line over the four commands.

- ``shadow``: the decision model answers every question of ``shadow.n_tasks`` fit-split tasks
  without acting; writes ``shadow_decisions.jsonl`` (point, options count, the model's
  probabilities and confidence, the LLM's choice, the key, the task outcome) and
  ``shadow_episodes.jsonl``.
- ``fit``: per decision point q_L, ΔC, V, the isotonic calibration and ``fit_threshold``;
  writes ``thresholds.json`` and ``calibration.png``.
- ``run``: every arm (the LLM alone first: the reference) on ``test.n_tasks`` test-split tasks,
  plus a CASCADE threshold sweep for the cost-vs-success frontier; writes per arm
  ``runs/<arm>/decisions.jsonl`` (every decision: point, mode, who decided, confidence,
  correct, cost, latency) and ``episodes.jsonl``, and ``summary.json``.
- ``compare``: Stage 1 (each candidate arm alone vs the reference: non-inferior and cheaper,
  Holm; ``jaxdm.stats``), the registered Stage 2 selection run combined on NEW test tasks
  (indices after Stage 1's), ``report.md`` and the figures ``frontier.png`` and
  ``savings_by_point.png``.

Splits: shadow/fit on DECISION GYM's fit seeds, arms on test seeds; Stage 2 on test tasks
Stage 1 never saw. Unknown config keys and bad values are errors before any episode runs
(``jaxdm.config``). ``harness_config.json`` records what each finished command's results were
made with (its end record); a command writes its start record (``journal/<command>/``) before
it removes or writes anything, so output without an end record is an interrupted command:
``overwrite`` is needed to run a command again (see ``COMMAND_KEYS``), and ``resume`` continues
an interrupted one from any kill point (its finished episodes kept). Every command holds the
folder's lock (``jaxdm.rundir``) while it runs; every file is written whole and redacted
(``jaxdm.jsonl``).

Failure accounting (per pass: the shadow pass, each arm, each Stage 2 run): an episode in which
an agent-LLM call or a decision-model answer got no answer (a server down, its transport
failing) is flagged ``incomplete`` in its records and never counted as a success or failure
(left out of success rates, the fit and the tests, with the count reported); a pass in which
more than ``max_failed_share`` of the LLM's calls or of the model's answers got no answer
stops its command with ``HarnessError`` after journaling what finished, and ``resume`` runs
the flagged and the missing episodes again. A command whose passes flagged episodes within the
bound is finished *incomplete* (later commands may build on its complete episodes) until a
``resume`` has run them again. Every pass prints its episodes, calls, failures and the episodes
run again.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Mapping

from jaxdm.harness.arms import cmd_run
from jaxdm.harness.compare import cmd_compare
from jaxdm.harness.config import load
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.shadow import cmd_shadow
from jaxdm.harness.thresholds import cmd_fit
from jaxdm.jsonl import OutputError
from jaxdm.rundir import RunFolderError, lock_run_dir
from jaxdm.secrets import redact


COMMANDS: Mapping[str, Callable[..., Any]] = {
    "shadow": cmd_shadow, "fit": cmd_fit, "run": cmd_run, "compare": cmd_compare}


def _options_parser(prog: str = "jaxdm harness ACTION", positional: bool = True):
    p = argparse.ArgumentParser(prog=prog, add_help=False)
    p.add_argument("--config", help="YAML of HarnessConfig keys (or a preset name from "
                                    "experiments/configs/harness_<name>.yaml)")
    p.add_argument("--out", dest="out_dir", help="output folder")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true",
                   help="run the command again where its results exist (removing them and "
                        "the later commands' results)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted command (its finished episodes are kept); "
                        "a finished one is skipped")
    p.add_argument("--set", action="append", default=[], metavar="key=value",
                   help="a config override (repeatable; same as a bare key=value)")
    if positional:
        p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return p


def add_parser(sub) -> None:
    """Adds ``jaxdm harness ACTION`` (shadow | fit | run | compare | all, options and key=value
    overrides in any order) to the ``jaxdm`` subparsers ``sub``."""
    p = sub.add_parser("harness", help="agent LLM + decision model harness (seed 003)",
                       parents=[_options_parser(positional=False)],
                       description="Shadow-mode fitting, arms and registered statistics on "
                                   "DECISION GYM with a delegating harness. Options and "
                                   "key=value overrides may come in any order.")
    p.add_argument("action", choices=list(COMMANDS) + ["all"],
                   help="shadow | fit | run | compare | all (the four in order)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def main(args) -> int:
    """Runs the parsed ``jaxdm harness`` command (``all``: the four in order under one folder lock);
    0 when done, 2 with the named error on stderr (redacted)."""
    if getattr(args, "rest", None):  # options / overrides after the action, in any order
        extra = _options_parser().parse_intermixed_args(args.rest)
        for k in ("config", "out_dir"):
            if getattr(extra, k) is not None:
                setattr(args, k, getattr(extra, k))
        args.no_progress = args.no_progress or extra.no_progress
        args.overwrite = args.overwrite or extra.overwrite
        args.resume = args.resume or extra.resume
        args.set = list(args.set) + list(extra.set)
        args.overrides = list(extra.overrides)
    args.overrides = list(getattr(args, "overrides", []) or [])
    bad = [o for o in list(args.overrides) + list(args.set) if "=" not in o]
    if bad:
        print(f"jaxdm harness {args.action}: error: {bad[0]!r} is not a key=value override",
              file=sys.stderr)
        return 2
    overrides = list(args.overrides) + list(args.set)
    if args.out_dir:
        overrides.append(f"out_dir={args.out_dir}")
    if args.no_progress:
        overrides.append("progress=false")
    try:
        cfg = load(args.config, overrides)
        actions = list(COMMANDS) if args.action == "all" else [args.action]
        # held across `all`'s commands (each takes it again, counted): no other job writes
        # the folder between two of them
        lock = lock_run_dir(cfg.out_dir)
        try:
            for a in actions:
                COMMANDS[a](cfg, overwrite=args.overwrite, resume=args.resume)
        except BaseException:
            lock.abandon()
            raise
        lock.release()
    except (HarnessError, RunFolderError, OutputError) as e:
        print(redact(f"jaxdm harness {args.action}: error: {e}"), file=sys.stderr)
        return 2
    return 0


__all__ = ["COMMANDS", "add_parser", "main"]
