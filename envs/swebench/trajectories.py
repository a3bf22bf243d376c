"""SWE-agent trajectories (``<instance_id>.traj``) as ``jaxdm.trajectory.Trajectory``, so
``jaxdm screen`` can screen judges on coding trajectories.

A ``.traj`` file is SWE-agent's record of one instance: ``trajectory`` (one entry per step:
``action``, ``observation``, ``thought``, ``response``, ``state``, ...), ``history`` (the
messages the model saw), ``info`` (``exit_status``, ``submission`` = the patch, costs) and
``replay_config`` (the run's config as a JSON string, with the problem statement). The
converter reads the steps and the outcome, nothing else:

* goal: the problem statement (``replay_config``, else the first non-demonstration user
  message of ``history``); step 0's observation is empty (the issue is the goal), step
  ``t``'s is what step ``t - 1`` printed, and the final observation the last step's output;
* an empty action (a step SWE-agent recorded for a reply it could not parse) is invalid;
* outcome: SWE-agent does not know whether a patch resolves its instance; the SWE-bench
  harness's run report (``resolved_ids`` / ``unresolved_ids`` / ``error_ids``) does.
  Without one the outcome is unknown: ``success`` False, ``reward`` 0 and
  ``metadata["resolved"]`` None;
* no action carries a milestone or no-op annotation (nobody labelled them): every valid step
  is of type 'other' (see the README for what the screen then reports);
* ``truncated``: the run did not end with a plain ``submitted`` exit status.

``python -m jaxdm.envs.swebench.trajectories RUN_DIR_OR_FILES... --out trajs.jsonl
[--report REPORT.json]`` writes the JSONL ``jaxdm screen --trajectories`` reads.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxdm.envs.repl import truncate_output
from jaxdm.envs.swebench import SWE_TURN_BUDGET
from jaxdm.trajectory import Step, Trajectory, write_jsonl

__all__ = ["from_swe_agent", "read_run_report", "convert", "main"]


def _text(content: Any) -> str:
    """A history message's text (a string, or a list of {"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(c["text"] for c in content
                         if isinstance(c, Mapping) and isinstance(c.get("text"), str))
    return ""


def _problem_statement(data: Mapping[str, Any]) -> tuple[str, str]:
    """(problem statement, its id) from replay_config, else ('first user message', '')."""
    replay = data.get("replay_config")
    if isinstance(replay, str) and replay:
        try:
            replay = json.loads(replay)
        except json.JSONDecodeError:
            replay = None
    statement = replay.get("problem_statement") if isinstance(replay, Mapping) else None
    if isinstance(statement, Mapping) and isinstance(statement.get("text"), str):
        return statement["text"], str(statement.get("id") or "")
    for message in data.get("history") or []:
        if (isinstance(message, Mapping) and message.get("role") == "user"
                and not message.get("is_demo")):
            return _text(message.get("content")), ""
    return "", ""


def _repo_of(instance_id: str) -> str:
    """SWE-bench's ``owner__name-number`` id -> 'owner/name' ('' for another id)."""
    head, dash, number = instance_id.rpartition("-")
    if dash and number.isdigit() and "__" in head:
        owner, _, name = head.partition("__")
        return f"{owner}/{name}"
    return ""


def from_swe_agent(source: str | Path | Mapping[str, Any], *, instance_id: str = "",
                   resolved: bool | None | Mapping[str, bool] = None,
                   budget: int = SWE_TURN_BUDGET,
                   max_observation_chars: int | None = None) -> Trajectory:
    """One SWE-agent ``.traj`` (a path or its parsed JSON) as a ``Trajectory`` (see the module
    docstring). ``instance_id``: default from the problem statement, else the file name;
    ``resolved``: the harness's verdict, None (unknown) or a run report's verdicts
    (``read_run_report``: an instance missing from it is unknown); ``budget``: the turn
    budget the run had (a trajectory with more steps is refused, so the Value question's
    remaining budget stays true); ``max_observation_chars``: keep only each output's tail
    (None: all)."""
    where = str(source) if isinstance(source, (str, Path)) else "SWE-agent trajectory"
    if isinstance(source, (str, Path)):
        try:
            data = json.loads(Path(source).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}: not a readable SWE-agent .traj JSON file ({e})") from None
    else:
        data = source
    if not isinstance(data, Mapping) or not isinstance(data.get("trajectory"), list):
        keys = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise ValueError(f"{where}: a SWE-agent .traj needs a 'trajectory' list (got {keys}; "
                         "a retry run's file has one once an attempt was chosen)")
    if not (resolved is None or isinstance(resolved, (bool, Mapping))):
        raise ValueError(f"resolved must be True, False, None or a mapping, got {resolved!r}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive int, got {budget!r}")
    if max_observation_chars is not None and (isinstance(max_observation_chars, bool) or not
                                              isinstance(max_observation_chars, int)
                                              or max_observation_chars < 1):
        raise ValueError(f"max_observation_chars must be a positive int or None, got "
                         f"{max_observation_chars!r}")
    entries = data["trajectory"]
    if not entries:
        raise ValueError(f"{where}: the trajectory has no steps")
    if len(entries) > budget:
        raise ValueError(f"{where}: {len(entries)} steps exceed the turn budget {budget}; "
                         "pass the budget the run had (--budget)")
    for i, e in enumerate(entries):
        for key in ("action", "observation"):
            if not isinstance(e, Mapping) or not isinstance(e.get(key), str):
                raise ValueError(f"{where}: trajectory[{i}].{key} must be a string")
    info = data.get("info") or {}
    if not isinstance(info, Mapping):
        raise ValueError(f"{where}: 'info' must be an object")
    goal, statement_id = _problem_statement(data)
    if not goal:
        raise ValueError(f"{where}: no problem statement (neither replay_config nor history)")
    if not instance_id:
        instance_id = statement_id or (Path(source).stem if isinstance(source, (str, Path))
                                       else "")
    if not instance_id:
        raise ValueError(f"{where}: no instance id; pass instance_id=")
    if isinstance(resolved, Mapping):
        resolved = resolved.get(instance_id)
    if not (resolved is None or isinstance(resolved, bool)):
        raise ValueError(f"{where}: the verdict of {instance_id} must be true or false, got "
                         f"{resolved!r}")

    def shown(text: str) -> str:
        return text if max_observation_chars is None else truncate_output(
            text, max_observation_chars)

    outputs = [""] + [shown(e["observation"]) for e in entries]
    steps = tuple(Step(observation=outputs[t], action=e["action"],
                       valid=bool(e["action"].strip()))
                  for t, e in enumerate(entries))
    exit_status = info.get("exit_status")
    submission = info.get("submission")
    return Trajectory(
        goal=goal, steps=steps, final_observation=outputs[-1],
        reward=1.0 if resolved else 0.0, success=bool(resolved), budget=budget,
        task_type=_repo_of(instance_id), env="swebench",
        truncated=exit_status != "submitted",
        metadata={"id": instance_id, "source": "swe-agent", "resolved": resolved,
                  "exit_status": exit_status if isinstance(exit_status, str) else None,
                  "model_patch": submission if isinstance(submission, str) else None})


def read_run_report(path: str | Path) -> dict[str, bool]:
    """instance id -> resolved, from the SWE-bench harness's run report JSON
    (``swebench.harness.run_evaluation``: ``resolved_ids``, ``unresolved_ids``, ``error_ids``)."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable SWE-bench run report ({e})") from None
    if not isinstance(report, Mapping) or not isinstance(report.get("resolved_ids"), list):
        raise ValueError(f"{path}: a SWE-bench run report needs a 'resolved_ids' list")
    verdict = {}
    for key, value in (("unresolved_ids", False), ("error_ids", False), ("resolved_ids", True)):
        ids = report.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"{path}: {key!r} must be a list of instance ids")
        verdict.update({i: value for i in ids})
    return verdict


def convert(paths: Sequence[str | Path], *, report: str | Path | None = None,
            budget: int = SWE_TURN_BUDGET,
            max_observation_chars: int | None = None) -> list[Trajectory]:
    """Every ``.traj`` under ``paths`` (files, or folders searched recursively), in path
    order, with outcomes from ``report`` when given."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.traj"))
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"{p}: no such file or folder")
    if not files:
        raise ValueError(f"no .traj files under {[str(p) for p in paths]}")
    verdicts = read_run_report(report) if report is not None else None
    return [from_swe_agent(f, resolved=verdicts, budget=budget,
                           max_observation_chars=max_observation_chars) for f in files]


def main(argv: Sequence[str] | None = None) -> int:
    """The converter command (module docstring); rc 2 with a named error on bad input."""
    p = argparse.ArgumentParser(
        prog="python -m jaxdm.envs.swebench.trajectories",
        description="Convert SWE-agent .traj files into the JSONL `jaxdm screen` reads.")
    p.add_argument("paths", nargs="+", help=".traj files or run folders (searched recursively)")
    p.add_argument("--out", required=True, help="output JSONL of trajectories")
    p.add_argument("--report", help="SWE-bench harness run report (resolved_ids ...)")
    p.add_argument("--budget", type=int, default=SWE_TURN_BUDGET,
                   help=f"the runs' turn budget (default {SWE_TURN_BUDGET})")
    p.add_argument("--max-observation-chars", type=int, default=None,
                   help="keep only the tail of longer tool outputs (default: all)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        if out.exists() and not args.overwrite:
            raise ValueError(f"{out} exists; pass --overwrite to replace it")
        trajs = convert(args.paths, report=args.report, budget=args.budget,
                        max_observation_chars=args.max_observation_chars)
        n = write_jsonl(out, trajs)
    except (ValueError, OSError) as e:
        print(f"swe-agent trajectories: error: {e}", file=sys.stderr)
        return 2
    known = sum(t.metadata["resolved"] is not None for t in trajs)
    print(f"wrote {n} trajectories to {out} ({known} with a known outcome, "
          f"{sum(t.success for t in trajs)} resolved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
