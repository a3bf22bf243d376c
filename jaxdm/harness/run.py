"""``jaxdm harness shadow|fit|run|compare``: configs, runs, statistics, reports and figures.

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

import dataclasses
import functools
import json
import math
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxdm.harness.agent import AgentConfig, Episode, Harness
from jaxdm.harness.dm import make_dm
from jaxdm.harness.fit import CALIBRATIONS, binned, ece, estimate_point, fit_threshold
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.llm import LLMProfile, make_llm
from jaxdm.harness.modes import Delegation
from jaxdm import jsonl
from jaxdm.jsonl import OutputError, read_records
from jaxdm.roles.harness import POINTS
from jaxdm.rundir import RunFolderError, lock_run_dir
from jaxdm.runlog import MAX_FAILED_SHARE, check_failed_share
from jaxdm.secrets import redact
from jaxdm.stats import check_settings


# ---- configs ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EnvConfig:
    variant: str = "base"
    strict: bool = True
    max_steps: int = 30


@dataclasses.dataclass(frozen=True)
class DelegationConfig:
    """One delegation; ``fitted: true`` takes the threshold from ``thresholds.json`` (a point
    the fit leaves to the LLM then gets no delegation)."""

    point: str
    mode: str
    threshold: float | None = None
    fitted: bool = False
    k: int = 3

    def __post_init__(self):
        if self.fitted and self.threshold is not None:
            raise ValueError(f"delegation {self.point}/{self.mode}: give either a threshold or "
                             f"fitted: true (the fit's threshold), not both")
        Delegation(self.point, self.mode, self.threshold, self.k)  # its own checks, by name


@dataclasses.dataclass(frozen=True)
class ArmConfig:
    """An arm: delegations, an optional decision model replacing the default one (e.g. the
    BM25 shortlist), ``candidate`` for Stage 1, and ``random_trigger_like`` = the name of a
    TRIGGER arm whose measured call rate a random trigger copies."""

    name: str
    delegations: tuple[DelegationConfig, ...] = ()
    dm: dict | None = None
    candidate: bool = False
    random_trigger_like: str | None = None


@dataclasses.dataclass(frozen=True)
class FitConfig:
    method: str = "isotonic"
    value_per_task: float = 1.0
    min_support: int = 5
    min_value_share: float = 0.05
    points: tuple[str, ...] = ("tool", "params", "stop", "memory", "reflect", "route", "notes")

    def __post_init__(self):
        if self.method not in CALIBRATIONS:
            raise ValueError(f"method must be one of {list(CALIBRATIONS)}, got {self.method!r}")
        if not (math.isfinite(self.value_per_task) and self.value_per_task > 0):
            raise ValueError(f"value_per_task must be a finite number > 0, got "
                             f"{self.value_per_task!r}")
        if self.min_support < 1:
            raise ValueError(f"min_support must be >= 1, got {self.min_support!r}")
        if not 0.0 <= self.min_value_share <= 1.0:
            raise ValueError(f"min_value_share must be in [0, 1], got {self.min_value_share!r}")
        for point in self.points:
            if point not in POINTS:
                raise ValueError(f"points: {point!r} is not a decision point {list(POINTS)}")


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    margin: float = 0.03
    alpha: float = 0.05
    ni_method: str = "tango"
    cost_method: str = "t"

    def __post_init__(self):
        check_settings(margin=self.margin, alpha=self.alpha, ni_method=self.ni_method,
                       cost_method=self.cost_method)


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
    env: EnvConfig = EnvConfig()
    llm: dict = dataclasses.field(default_factory=lambda: {"kind": "simulated",
                                                           "profile": "strong"})
    cheap_llm: dict | None = None
    dm: dict = dataclasses.field(default_factory=lambda: {"kind": "oracle_noisy"})
    agent: AgentConfig = AgentConfig()
    shadow_tasks: int = 150
    test_tasks: int = 200
    stage2_tasks: int = 200
    arms: tuple[ArmConfig, ...] = ()
    frontier_point: str = "tool"
    frontier_thresholds: tuple[float, ...] = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
    fit: FitConfig = FitConfig()
    stats: StatsConfig = StatsConfig()
    out_dir: str = "harness_out"
    seed: int = 0
    progress: bool = True
    # a pass in which a larger share of the agent LLM's calls, or of the decision model's
    # answers, got no answer (a server down) stops its command (the name `jaxdm screen` uses)
    max_failed_share: float = MAX_FAILED_SHARE

    def __post_init__(self):
        # Everything a command would otherwise find wrong only after the episodes before it.
        check_failed_share(self.max_failed_share)
        for key in ("shadow_tasks", "test_tasks", "stage2_tasks"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        if self.frontier_point not in POINTS:
            raise ValueError(f"frontier_point {self.frontier_point!r} is not a decision point "
                             f"{list(POINTS)}")
        for i, th in enumerate(self.frontier_thresholds):
            if not 0.0 <= th <= 1.0:
                raise ValueError(f"frontier_thresholds[{i}] must be in [0, 1], got {th!r}")
        names = [a.name for a in self.arms]
        if "llm_alone" in names or len(set(names)) != len(names):
            raise ValueError(f"arms: names must be unique and not 'llm_alone' (the reference), "
                             f"got {names}")
        for arm in self.arms:
            for i, d in enumerate(arm.delegations):
                if d.fitted and d.point not in self.fit.points:
                    raise ValueError(f"arm {arm.name!r} delegations[{i}]: fitted threshold for "
                                     f"{d.point!r}, which fit.points {list(self.fit.points)} "
                                     f"leaves out")


# ---- what a folder holds ---------------------------------------------------------------------
# Each command's results depend on its own config keys and on those of the commands before it;
# ``harness_config.json`` records, per finished command, the values its results were made with
# (its *end record*, written after its last result). A command never overwrites results
# without ``overwrite`` (which also removes the results of the commands after it: they were
# made from the old ones), and never builds on results made with other values of an earlier
# command's keys. Before it removes or writes anything a command writes its *start record*,
# ``journal/<command>/config.json`` (the config values it runs with); while it runs, every
# finished episode is appended to ``journal/<command>/<pass>.jsonl``. So the state of a
# command in a folder is one of (``_state``):
#
# - finished: an end record (a start record left beside it is from a kill right after the
#   end record, and is removed);
# - incomplete: an end record and ``journal/<command>/incomplete.json``: it finished, but some
#   episodes had a call that got no answer (a server down); they are flagged, never counted
#   as a success or failure, and ``resume`` runs them again (the finished ones are kept);
# - interrupted: a start record without an end record: whatever it wrote is partial; ``resume``
#   (same config) keeps its finished episodes and runs the rest, from any kill point;
# - foreign: results without either record (a folder from before the records): refused.
#
# Every command holds the folder's lock (``jaxdm.rundir.lock_run_dir``) for its whole life, so
# two jobs never write one folder.

COMMAND_ORDER = ("shadow", "fit", "run", "compare")
COMMAND_KEYS: Mapping[str, tuple[str, ...]] = {
    "shadow": ("env", "llm", "cheap_llm", "dm", "agent", "shadow_tasks", "seed"),
    "fit": ("fit",),
    "run": ("arms", "test_tasks", "frontier_point", "frontier_thresholds"),
    "compare": ("stats", "stage2_tasks"),
}
# where and how a job shows itself, and which passes it accepts, not what its results are
UNRECORDED_KEYS = ("out_dir", "progress", "max_failed_share")
COMMAND_OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "shadow": ("shadow_decisions.jsonl", "shadow_episodes.jsonl"),
    "fit": ("thresholds.json", "calibration.png"),
    "run": ("summary.json", "runs"),
    "compare": ("report.json", "report.md", "frontier.png", "savings_by_point.png",
                "runs/stage2_llm_alone", "runs/stage2_combined"),
}
RECORD_FILE = "harness_config.json"
JOURNAL_DIR = "journal"
START_FILE = "config.json"
INCOMPLETE_FILE = "incomplete.json"
# A pass stops before its end only once this many calls (or answers) failed: one failed
# call in the first episode is no evidence yet that the server is down.
EARLY_STOP_MIN_FAILED = 10


def _command_values(cfg: HarnessConfig) -> dict[str, dict[str, Any]]:
    from jaxdm.config import to_dict
    # as the record file holds them: JSON, URL credentials redacted (a base_url's password
    # never reaches the folder, and never makes two configs differ)
    values = json.loads(redact(json.dumps(to_dict(cfg))))
    return {a: {k: values[k] for k in keys} for a, keys in COMMAND_KEYS.items()}


def _read_record(out: Path) -> dict[str, Any]:
    path = out / RECORD_FILE
    return _read_json(path) if path.is_file() else {}


def _write_record(out: Path, record: Mapping[str, Any]) -> None:
    jsonl.write_json(out / RECORD_FILE, dict(record))


@dataclasses.dataclass(frozen=True)
class Journal:
    """Where a command's start record and its finished episodes go (one JSONL per pass, an
    episode appended as it ends), with the config values they are made with."""

    folder: Path
    values: Mapping[str, Any]

    def path(self, desc: str) -> Path:
        return self.folder / (re.sub(r"[^\w.-]+", "_", desc) + ".jsonl")

    def start(self) -> None:
        """The start record (kept when it is there: a resumed command's, checked equal)."""
        _mkdir(self.folder)
        if not (self.folder / START_FILE).is_file():
            jsonl.write_json(self.folder / START_FILE, dict(self.values))

    def append(self, desc: str, index: int, episode: Episode) -> None:
        if not (self.folder / START_FILE).is_file():
            self.start()
        jsonl.append_records(self.path(desc), [{"index": index, "episode": episode.to_dict()}])

    def episode_files(self) -> list[Path]:
        return sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []


def _journal(cfg: HarnessConfig, action: str) -> Journal:
    now = _command_values(cfg)
    return Journal(Path(cfg.out_dir) / JOURNAL_DIR / action,
                   {a: now[a] for a in COMMAND_ORDER[:COMMAND_ORDER.index(action) + 1]})


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create {path}: {e.strerror or e}") from e


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink(missing_ok=True)


def _drop_journal(journal: Journal) -> None:
    _remove(journal.folder)
    try:
        journal.folder.parent.rmdir()   # the journal folder itself once nothing is in it
    except OSError:
        pass


def _state(cfg: HarnessConfig, record: Mapping[str, Any], action: str) -> str:
    """finished | incomplete | interrupted | foreign | absent (see the block comment)."""
    out, folder = Path(cfg.out_dir), _journal(cfg, action).folder
    if action in record:
        return "incomplete" if (folder / INCOMPLETE_FILE).is_file() else "finished"
    if folder.is_dir():
        return "interrupted"
    if any((out / f).exists() for f in COMMAND_OUTPUTS[action]):
        return "foreign"
    return "absent"


def _lines(paths: Sequence[Path]) -> int:
    """Whole lines (a torn last one is not an episode)."""
    return sum(p.read_text(encoding="utf-8").count("\n") for p in paths)


def _claim(cfg: HarnessConfig, action: str, *, overwrite: bool, resume: bool) -> bool:
    """Check that ``action`` may write into ``cfg.out_dir`` (see the block comment above) and
    write its start record; True when ``resume`` finds it finished with this config (nothing
    to run)."""
    if overwrite and resume:
        raise HarnessError("--resume and --overwrite exclude each other")
    out = Path(cfg.out_dir)
    _mkdir(out)
    record, now = _read_record(out), _command_values(cfg)
    i = COMMAND_ORDER.index(action)
    for earlier in COMMAND_ORDER[:i]:
        state = _state(cfg, record, earlier)
        if state in ("finished", "incomplete"):
            diff = [k for k in COMMAND_KEYS[earlier] if record[earlier].get(k) != now[earlier][k]]
            if diff:
                raise HarnessError(
                    f"{out}: its `{earlier}` results were made with other values of {diff}; "
                    f"run `jaxdm harness {earlier} --overwrite` with this config first, or use "
                    f"another --out")
        elif state == "interrupted":
            raise HarnessError(f"{out}: `{earlier}` was interrupted there; run `jaxdm harness "
                               f"{earlier} --resume` first")
        elif state == "foreign":
            raise HarnessError(
                f"{out}: `{earlier}` results there were never recorded as finished (an "
                f"interrupted command, or a folder from before {RECORD_FILE}); run `jaxdm "
                f"harness {earlier} --resume` or `--overwrite`, or use another --out")
    journal = _journal(cfg, action)
    state = _state(cfg, record, action)
    same = record.get(action) == now[action]
    if resume and state == "finished" and same and all(
            (out / f).exists() for f in COMMAND_OUTPUTS[action] if not f.startswith("runs/")):
        if journal.folder.is_dir():      # killed between its end record and removing this
            _drop_journal(journal)
        print(f"harness {action}: finished in {out} with this config; kept", flush=True)
        return True
    present = sorted({f for a in COMMAND_ORDER[i:] for f in COMMAND_OUTPUTS[a]
                      if (out / f).exists()})
    # then `present` are its partial results (written again)
    interrupted = state == "interrupted" or (state == "incomplete" and resume and same)
    if present and not overwrite and not interrupted:
        hint = ""
        if state == "incomplete":
            flagged = _read_json(journal.folder / INCOMPLETE_FILE).get("episodes", "some")
            hint = (f"; its `{action}` has {flagged} incomplete episodes: --resume (same "
                    f"config) runs them again")
        raise HarnessError(f"{out} already holds results of `{action}` or a later command "
                           f"({', '.join(present)}); pass --overwrite to run {action} again "
                           f"(removing them), or use another --out{hint}")
    if interrupted and not overwrite:
        done = _lines(journal.episode_files())
        if not resume:
            raise HarnessError(f"{out} holds an interrupted `{action}` ({done} episodes "
                               f"finished, {journal.folder}); pass --resume to continue it or "
                               f"--overwrite to start it again")
        if (journal.folder / START_FILE).is_file():
            saved = _read_json(journal.folder / START_FILE)
        elif not journal.episode_files():
            saved = dict(journal.values)   # killed while writing its start record
        else:
            raise HarnessError(f"{journal.folder} has episodes but no {START_FILE}; use "
                               f"--overwrite")
        diff = sorted(k for a, now_a in journal.values.items() for k in COMMAND_KEYS[a]
                      if (saved.get(a) or {}).get(k) != now_a[k])
        if diff:
            raise HarnessError(f"--resume: the interrupted `{action}` in {out} ran with other "
                               f"values of {diff}; resume with its config, or --overwrite")
        if state == "incomplete":
            flagged = _read_json(journal.folder / INCOMPLETE_FILE).get("episodes", "its")
            print(f"harness {action}: resuming in {out} to run its {flagged} incomplete "
                  f"episodes again ({done} journaled)", flush=True)
        else:
            print(f"harness {action}: resuming in {out} ({done} episodes kept)", flush=True)
    # the order matters for a kill between any two steps: the start record comes before
    # anything is removed, and results go after the records that said they were finished
    if overwrite:
        _remove(journal.folder)
    journal.start()
    for a in COMMAND_ORDER[i + 1:]:
        _drop_journal(_journal(cfg, a))
    if any(a in record for a in COMMAND_ORDER[i:]):
        _write_record(out, {a: v for a, v in record.items() if a in COMMAND_ORDER[:i]})
    (journal.folder / INCOMPLETE_FILE).unlink(missing_ok=True)
    for f in present:
        _remove(out / f)   # runs/stage2_* go with runs/
    return False


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise HarnessError(f"{path}: unreadable ({e}); use another --out, or --overwrite "
                           f"from the first command") from None
    if not isinstance(value, dict):
        raise HarnessError(f"{path}: expected a JSON object; use another --out, or "
                           f"--overwrite from the first command")
    return value


# the passes of the command that runs now (``run_episodes`` adds each pass's tally)
_PASSES: list[list[dict[str, Any]]] = []


def _recorded(action: str):
    """A command that holds its folder's lock, claims the folder (its start record) first
    and writes its end record once finished."""
    def wrap(command):
        @functools.wraps(command)
        def run(cfg: HarnessConfig, *, overwrite: bool = False, resume: bool = False) -> Any:
            lock = lock_run_dir(cfg.out_dir)
            started_here = not _journal(cfg, action).folder.is_dir()
            try:
                if _claim(cfg, action, overwrite=overwrite, resume=resume):
                    lock.release()
                    return None
                _PASSES.append([])
                try:
                    result = command(cfg)
                finally:
                    passes = _PASSES.pop()
                _finish(cfg, action, passes)
            except BaseException:
                if started_here:
                    _forget_start(cfg, action)
                lock.abandon()
                raise
            lock.release()
            return result
        return run
    return wrap


def _forget_start(cfg: HarnessConfig, action: str) -> None:
    """A command that stopped before it wrote anything leaves nothing (no start record)."""
    journal, out = _journal(cfg, action), Path(cfg.out_dir)
    if not journal.folder.is_dir() or action in _read_record_quiet(out):
        return
    if journal.episode_files() or any((out / f).exists() for f in COMMAND_OUTPUTS[action]):
        return   # partial results: an interrupted command, for --resume
    if all(p.name in (START_FILE, INCOMPLETE_FILE) for p in journal.folder.iterdir()):
        _drop_journal(journal)


def _read_record_quiet(out: Path) -> dict[str, Any]:
    try:
        return _read_record(out)
    except HarnessError:
        return {}


def _finish(cfg: HarnessConfig, action: str, passes: Sequence[Mapping[str, Any]]) -> None:
    """The end record; with flagged episodes the journal stays (``--resume`` runs them)."""
    out, journal = Path(cfg.out_dir), _journal(cfg, action)
    flagged = {p["desc"]: p["incomplete"] for p in passes if p["incomplete"]}
    if flagged:
        journal.start()
        jsonl.write_json(journal.folder / INCOMPLETE_FILE,
                         {"episodes": sum(flagged.values()), "passes": flagged})
    else:
        (journal.folder / INCOMPLETE_FILE).unlink(missing_ok=True)
    _write_record(out, {**_read_record(out), action: _command_values(cfg)[action]})
    if flagged:
        print(f"harness {action}: finished with {sum(flagged.values())} incomplete episodes "
              f"({', '.join(f'{d}: {n}' for d, n in flagged.items())}): a call of theirs got "
              f"no answer, so they are not counted; run `jaxdm harness {action} --resume` "
              f"with this config once the servers answer to run them again", flush=True)
    else:
        _drop_journal(journal)   # its episodes are in the results now


# ---- building --------------------------------------------------------------------------------

def _delegations(arm: ArmConfig, thresholds: Mapping[str, Any] | None) -> list[Delegation]:
    out = []
    for i, d in enumerate(arm.delegations):
        where = f"arm {arm.name!r} delegations[{i}]"
        th = d.threshold
        if d.fitted:
            if thresholds is None:
                raise HarnessError(f"{where}: fitted threshold but no thresholds.json (run "
                                   "`jaxdm harness fit` first)")
            if d.point not in thresholds:
                raise HarnessError(f"{where}: thresholds.json has no point {d.point!r}")
            th = thresholds[d.point]["threshold"]
            if th is None:
                continue  # the fit leaves this point to the LLM
        try:
            out.append(Delegation(d.point, d.mode, th, d.k))
        except ValueError as e:
            raise HarnessError(f"{where}: {e}") from None
    return out


def _gym_params(cfg: HarnessConfig, split: str):
    from jaxdm.envs.decision_gym import GymParams
    try:
        return GymParams(variant=cfg.env.variant, strict=cfg.env.strict,
                         max_steps=cfg.env.max_steps, split=split)
    except ValueError as e:
        raise HarnessError(f"env: {e}") from None


def _progress(cfg: HarnessConfig, total: int, desc: str):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr)


def run_episodes(cfg: HarnessConfig, harness: Harness, split: str, indices: Sequence[int],
                 desc: str, journal: Journal | None = None) -> list[Episode]:
    """One episode per task index, in order. ``journal``: each finished episode is appended
    to its ``<desc>.jsonl`` as it ends, and episodes already there are kept instead of run
    again (a resumed command) — except incomplete ones (a call got no answer), which run
    again.

    Failure accounting: the pass stops with ``HarnessError`` (its finished episodes kept in
    the journal) when more than ``cfg.max_failed_share`` of the agent LLM's calls, or of the
    decision model's answers, got no answer (checked after every episode once
    ``EARLY_STOP_MIN_FAILED`` did, and at the end), or when every call failed (then nothing of
    the pass is kept). Its summary line gives calls, failures and the episodes run again."""
    from jaxdm.envs.decision_gym import DecisionGym
    env, params = DecisionGym(), _gym_params(cfg, split)
    path = None if journal is None else journal.path(desc)
    kept: dict[int, Episode] = {}
    if path is not None and path.is_file():
        rows: dict[int, Any] = {}
        try:
            for _, row in read_records(path, drop_torn_tail=True):
                rows[int(row["index"])] = row          # an episode run again: the last wins
                kept[int(row["index"])] = Episode.from_dict(row["episode"])
        except (ValueError, KeyError, TypeError) as e:
            raise HarnessError(f"{path}: not a harness journal ({e}); use --overwrite") from None
        # rewritten whole: a torn last line must not stay in front of the next append
        jsonl.write_records(path, list(rows.values()))
    bar = _progress(cfg, len(indices), desc)
    eps: list[Episode] = []
    rerun = 0
    for i in indices:
        ep = kept.get(i)
        if ep is not None and not ep.incomplete:
            eps.append(ep)
        else:
            rerun += ep is not None
            eps.append(harness.run_task(env, i, params))
            if journal is not None:
                journal.append(desc, i, eps[-1])
            _check_pass(cfg, eps, desc, path, early=True)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(success=f"{np.mean([e.success for e in eps]):.3f}")
    if bar is not None:
        bar.close()
    _check_pass(cfg, eps, desc, path, early=False)
    tally = _tally(desc, eps, rerun)
    if _PASSES:
        _PASSES[-1].append(tally)
    print(f"{desc}: {_accounting(tally)}", flush=True)
    return eps


def _tally(desc: str, eps: Sequence[Episode], rerun: int = 0) -> dict[str, Any]:
    return {"desc": desc, "episodes": len(eps),
            "incomplete": sum(e.incomplete for e in eps), "rerun": rerun,
            "llm_calls": sum(e.llm_calls for e in eps),
            "llm_failures": sum(e.llm_failures for e in eps),
            "llm_unanswered": sum(e.llm_unanswered for e in eps),
            "dm_questions": sum(e.dm_questions for e in eps),
            "dm_failures": sum(e.dm_failures for e in eps),
            "dm_unanswered": sum(e.dm_unanswered for e in eps)}


def _accounting(t: Mapping[str, Any]) -> str:
    return (f"{t['episodes']} episodes ({t['incomplete']} incomplete, not counted; "
            f"{t['rerun']} run again); agent LLM {t['llm_calls']} calls ({t['llm_failures']} "
            f"failed, {t['llm_unanswered']} unanswered); decision model {t['dm_questions']} "
            f"questions ({t['dm_failures']} failed, {t['dm_unanswered']} unanswered)")


def _check_pass(cfg: HarnessConfig, eps: Sequence[Episode], desc: str, journal: Path | None,
                *, early: bool) -> None:
    """Stops a pass that measures an outage, not the method (``run_episodes``). A pass in
    which every call of the agent LLM, or every answer of the decision model, failed (the
    harness fell back at every decision) is not kept at all (a resumed command runs it
    again); a pass over ``max_failed_share`` keeps its finished episodes (``--resume`` runs
    the incomplete and the missing ones). Failures below the bound are counted, and the
    episodes they hit flagged incomplete."""
    least = EARLY_STOP_MIN_FAILED if early else 1
    bound = cfg.max_failed_share
    llm = [c for e in eps for c in e.calls if c.kind == "llm"]
    llm_lost = sum(e.llm_unanswered for e in eps)
    dm_failed = sum(e.dm_failures for e in eps)
    dm_lost = sum(e.dm_unanswered for e in eps)
    dm_asked = sum(e.dm_questions for e in eps)
    dm_answered = sum(r.dm_choice is not None for e in eps for r in e.decisions)
    failed = None
    if len(llm) >= least and not any(c.ok for c in llm):
        first = next((c.error for c in llm if c.error), "no error given")
        failed = ("agent LLM", f"every agent LLM call failed ({len(llm)} calls over {len(eps)} "
                               f"tasks; first error: {first})")
    elif dm_failed >= least and not dm_answered:
        # calls that went through carry the backend's own reason for its failed answers;
        # those that raised (then asked one question at a time) come after
        errors = [c.error for c in sorted((c for e in eps for c in e.calls
                                           if c.kind == "dm" and c.error), key=lambda c: not c.ok)]
        first = f"; first error: {errors[0]}" if errors else ""
        failed = ("decision model", f"every decision model answer failed ({dm_failed} over "
                                    f"{len(eps)} tasks{first})")
    if failed is not None:
        if journal is not None:
            journal.unlink(missing_ok=True)
        raise HarnessError(f"{desc}: {failed[1]}; this pass is not kept: fix the {failed[0]} "
                           f"and run the command again with --resume")
    over = []
    if llm_lost >= least and llm_lost > bound * len(llm):
        first = next(c.error for c in llm if c.unanswered)
        over.append(("agent LLM", f"{llm_lost} of {len(llm)} agent LLM calls got no answer "
                                  f"({llm_lost / len(llm):.1%}; first error: {first})"))
    if dm_lost >= least and dm_lost > bound * dm_asked:
        first = next(c.error for e in eps for c in e.calls if c.kind == "dm" and c.unanswered)
        over.append(("decision model", f"{dm_lost} of {dm_asked} decision model answers got no "
                                       f"answer ({dm_lost / dm_asked:.1%}; first error: "
                                       f"{first})"))
    if over:
        flagged = sum(e.incomplete for e in eps)
        raise HarnessError(
            f"{desc}: {'; '.join(w for _, w in over)}: over max_failed_share {bound:g}, so the "
            f"pass stops after {len(eps)} tasks; {len(eps) - flagged} finished episodes are "
            f"kept and {flagged} incomplete ones flagged: once the "
            f"{' and the '.join(who for who, _ in over)} answers, run the command again with "
            f"--resume (it runs the flagged and the missing episodes)")


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    _mkdir(path.parent)
    jsonl.write_records(path, rows)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise HarnessError(f"{path} does not exist (run the earlier harness command first)")
    try:
        return [row for _, row in read_records(path)]
    except ValueError as e:
        raise HarnessError(str(e)) from None


def _harness(cfg: HarnessConfig, delegations: Sequence[Delegation], dm_spec: Mapping | None,
             shadow: bool = False, dm: Any = None) -> Harness:
    settings = cfg.agent
    llm = make_llm(cfg.llm)
    cheap = make_llm(cfg.cheap_llm) if cfg.cheap_llm is not None else None
    if dm is None and (delegations or shadow):
        try:
            dm = make_dm(dm_spec if dm_spec is not None else cfg.dm)
        except (TypeError, ValueError) as e:
            raise HarnessError(f"dm: {e}") from None
    try:
        return Harness(llm, dm, delegations, settings, cheap_llm=cheap, shadow=shadow)
    except ValueError as e:
        raise HarnessError(str(e)) from None


def _decision_rows(eps: Sequence[Episode], arm: str) -> list[dict]:
    """Every decision; those of an incomplete episode flagged (``"incomplete": true``)."""
    return [{"arm": arm, **r.to_dict(), **({"incomplete": True} if e.incomplete else {})}
            for e in eps for r in e.decisions]


def _episode_rows(eps: Sequence[Episode]) -> list[dict]:
    """One row per episode: its summary and its failure accounting (``incomplete``: a call
    got no answer; not counted as a success or a failure)."""
    return [{**e.summary(), "dm_questions": e.dm_questions, "llm_unanswered": e.llm_unanswered,
             "dm_unanswered": e.dm_unanswered, "incomplete": e.incomplete} for e in eps]


def _complete(eps: Sequence[Episode]) -> list[Episode]:
    """The episodes that count (an incomplete one measured an outage, not the method)."""
    return [e for e in eps if not e.incomplete]


# ---- shadow / fit ----------------------------------------------------------------------------

@_recorded("shadow")
def cmd_shadow(cfg: HarnessConfig) -> dict[str, Any]:
    out = Path(cfg.out_dir)
    h = _harness(cfg, (), None, shadow=True)
    eps = run_episodes(cfg, h, "fit", range(cfg.shadow_tasks), "shadow",
                       _journal(cfg, "shadow"))
    _write_jsonl(out / "shadow_decisions.jsonl", _decision_rows(eps, "shadow"))
    _write_jsonl(out / "shadow_episodes.jsonl", _episode_rows(eps))
    summary = _arm_summary("shadow", eps)
    print(f"shadow: {len(eps)} fit tasks ({summary['incomplete']} incomplete, not counted), "
          f"LLM success {summary['success']:.3f}, {sum(len(e.decisions) for e in eps)} "
          f"decisions -> {out}/shadow_decisions.jsonl")
    return summary


def _prices(cfg: HarnessConfig, eps_rows: Sequence[Mapping], dec_rows: Sequence[Mapping]
            ) -> tuple[float, float]:
    """Mean LLM act-call price and the price of one answer's output tokens (from the
    simulated profile, or 20 output tokens at the remote price)."""
    llm = make_llm(cfg.llm)
    p = getattr(llm, "profile", None)
    calls = sum(r["llm_calls"] for r in eps_rows)
    cost = sum(r["cost"] for r in eps_rows) - sum(d.get("cost_usd", 0.0) for d in dec_rows)
    act = cost / calls if calls else 0.0
    out_price = p.price_per_1k_out if isinstance(p, LLMProfile) else \
        getattr(llm, "price_out", 0.0)
    return act, 20 / 1000 * out_price


@_recorded("fit")
def cmd_fit(cfg: HarnessConfig) -> dict[str, Any]:
    out = Path(cfg.out_dir)
    dec = _read_jsonl(out / "shadow_decisions.jsonl")
    eps = _read_jsonl(out / "shadow_episodes.jsonl")
    # incomplete shadow episodes (a call got no answer) are not fitted on
    flagged = {r["task_id"] for r in eps if r.get("incomplete")}
    if flagged:
        eps = [r for r in eps if not r.get("incomplete")]
        dec = [d for d in dec if d["task_id"] not in flagged and not d.get("incomplete")]
        print(f"fit: {len(flagged)} incomplete shadow episodes left out ({len(eps)} fitted on)")
    act_price, answer_price = _prices(cfg, eps, dec)
    dm_q = cfg.agent.dm_price_per_call
    fits: dict[str, Any] = {}
    for point in cfg.fit.points:
        est = estimate_point(dec, eps, point, value_per_task=cfg.fit.value_per_task,
                             llm_price_per_answer=answer_price, act_call_price=act_price,
                             dm_price_per_question=dm_q, min_value_share=cfg.fit.min_value_share)
        if not est["confidence"]:
            continue
        f = fit_threshold(est["confidence"], est["correct"], q_llm=est["q_llm"],
                          delta_cost=est["delta_cost"], value=est["value"],
                          method=cfg.fit.method, min_support=cfg.fit.min_support, point=point)
        fits[point] = {**f._asdict(), "ece": ece(est["confidence"], est["correct"]),
                       "dm_accuracy": float(np.mean(est["correct"])),
                       "bins": binned(est["confidence"], est["correct"])}
        th = "LLM keeps" if f.threshold is None else f"{f.threshold:.3f}"
        print(f"fit {point:7s}: n={f.n:5d} q_L={f.q_llm:.3f} dC={f.delta_cost:.5f} "
              f"V={f.value:.3f} tau*={f.tau_star:.3f} threshold={th} share_above="
              f"{f.share_above:.3f}")
    jsonl.write_json(out / "thresholds.json", fits, default=_nan_none)
    _calibration_figure(dec, fits, out / "calibration.png")
    return fits


def _nan_none(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def load_thresholds(out_dir: str | Path) -> dict | None:
    p = Path(out_dir) / "thresholds.json"
    return json.loads(p.read_text()) if p.is_file() else None


# ---- run / compare ---------------------------------------------------------------------------

def _arm_summary(name: str, eps: Sequence[Episode]) -> dict[str, Any]:
    """Success, cost and decisions over the complete episodes (``n``); calls and failures
    over all (they were paid), with the count of incomplete episodes left out."""
    every, eps = eps, _complete(eps)
    n = len(eps)
    per_point: dict[str, dict[str, int]] = {}
    for e in eps:
        for r in e.decisions:
            c = per_point.setdefault(r.point, {"n": 0, "dm": 0, "correct": 0, "keyed": 0})
            c["n"] += 1
            c["dm"] += r.who in ("dm", "dm_fallback")
            if r.correct is not None:
                c["keyed"] += 1
                c["correct"] += bool(r.correct)
    return {"arm": name, "n": n, "success": float(np.mean([e.success for e in eps])) if n else 0.0,
            "cost": float(np.mean([e.cost for e in eps])) if n else 0.0,
            "seconds": float(np.sum([e.seconds for e in eps])),
            "overhead_s": float(np.sum([e.overhead_s for e in eps])),
            "llm_calls": int(sum(e.llm_calls for e in every)),
            "dm_calls": int(sum(e.dm_calls for e in every)),
            "dm_failures": int(sum(e.dm_failures for e in every)),
            "llm_failures": int(sum(e.llm_failures for e in every)),
            "llm_unanswered": int(sum(e.llm_unanswered for e in every)),
            "dm_unanswered": int(sum(e.dm_unanswered for e in every)),
            "incomplete": len(every) - n,
            "points": per_point}


def _run_arm(cfg: HarnessConfig, arm: ArmConfig, thresholds, indices, desc, rates,
             journal: Journal | None = None) -> tuple:
    dels = _delegations(arm, thresholds)
    dm = None
    if arm.random_trigger_like is not None:
        if arm.random_trigger_like not in rates:
            raise HarnessError(f"arm {arm.name!r}: random_trigger_like "
                               f"{arm.random_trigger_like!r} must name an earlier TRIGGER arm")
        if len(dels) != 1 or dels[0].mode != "trigger":
            raise HarnessError(f"arm {arm.name!r}: a random trigger needs exactly one TRIGGER "
                               "delegation")
        from jaxdm.harness.dm import RandomTrigger
        dm = RandomTrigger(rates[arm.random_trigger_like].get(dels[0].point, 0.0), cfg.seed)
    h = _harness(cfg, dels, arm.dm, dm=dm)
    eps = run_episodes(cfg, h, "test", indices, desc, journal)
    return eps, dels


def _run_rates(eps: Sequence[Episode]) -> dict[str, float]:
    """Share of decisions at each loop point where the optional step ran (option 0)."""
    out: dict[str, list[int]] = {}
    for e in _complete(eps):
        for r in e.decisions:
            if r.choice is not None:
                out.setdefault(r.point, []).append(int(r.choice == 0))
    return {p: float(np.mean(v)) for p, v in out.items()}


@_recorded("run")
def cmd_run(cfg: HarnessConfig) -> dict[str, Any]:
    out = Path(cfg.out_dir)
    thresholds = load_thresholds(out)
    idx = range(cfg.test_tasks)
    summary: dict[str, Any] = {"arms": {}, "frontier": []}
    t0 = time.perf_counter()
    journal = _journal(cfg, "run")
    ref = run_episodes(cfg, _harness(cfg, (), None), "test", idx, "llm_alone", journal)
    _save_arm(out, "llm_alone", ref, summary, [])
    rates: dict[str, dict[str, float]] = {}
    for arm in cfg.arms:
        eps, dels = _run_arm(cfg, arm, thresholds, idx, arm.name, rates, journal)
        rates[arm.name] = _run_rates(eps)
        _save_arm(out, arm.name, eps, summary, dels, arm)
        drift = _drift(arm, dels, eps, thresholds)
        if drift is not None:
            summary["arms"][arm.name]["drift"] = drift
    # the frontier: CASCADE on one point across thresholds (+ the fitted one)
    ths = list(cfg.frontier_thresholds)
    if thresholds and cfg.frontier_point in thresholds and \
            thresholds[cfg.frontier_point]["threshold"] is not None:
        ths.append(float(thresholds[cfg.frontier_point]["threshold"]))
    for th in sorted(set(ths)):
        arm = ArmConfig(f"frontier_{cfg.frontier_point}_{th:g}",
                        (DelegationConfig(cfg.frontier_point, "cascade", th),))
        eps, _ = _run_arm(cfg, arm, thresholds, idx, arm.name, rates, journal)
        s = _arm_summary(arm.name, eps)
        summary["frontier"].append({"threshold": th, "success": s["success"], "cost": s["cost"]})
    summary["wall_s"] = time.perf_counter() - t0
    jsonl.write_json(out / "summary.json", summary)
    for name, s in summary["arms"].items():
        print(f"{name:28s} success {s['success']:.3f}  cost/task ${s['cost']:.5f}  "
              f"LLM calls {s['llm_calls']:5d} ({s['llm_failures']} failed)  DM calls "
              f"{s['dm_calls']:5d} ({s['dm_failures']} failed)  incomplete {s['incomplete']}")
    return summary


def _drift(arm: ArmConfig, dels: Sequence[Delegation], eps: Sequence[Episode],
           thresholds: Mapping | None, window: int = 100, tolerance: float = 0.15
           ) -> dict | None:
    """The drift monitor over a fitted CASCADE arm's answers at its point, in task order:
    share above τ in a sliding window vs the shadow-mode share at fit time."""
    from jaxdm.harness.fit import DriftMonitor
    fitted = [d for d in arm.delegations if d.fitted]
    if len(dels) != 1 or not fitted or thresholds is None:
        return None
    d = dels[0]
    ref = thresholds[d.point]["share_above"]
    confs = [r.confidence for e in _complete(eps) for r in e.decisions
             if r.point == d.point and r.confidence is not None]
    if not confs:
        return None
    m = DriftMonitor(d.tau, ref, window=min(window, len(confs)), tolerance=tolerance)
    flagged_at = None
    for i, c in enumerate(confs):
        m.update(c)
        if flagged_at is None and m.needs_refit:
            flagged_at = i
    return {"point": d.point, "threshold": d.tau, "reference_share": ref,
            "final_share": m.share, "window": m.window, "tolerance": tolerance,
            "needs_refit": m.needs_refit, "first_flag_at": flagged_at,
            "shares": m.history[::max(1, len(m.history) // 50)]}


def _save_arm(out: Path, name: str, eps: Sequence[Episode], summary: dict, dels, arm=None):
    d = out / "runs" / name
    _write_jsonl(d / "decisions.jsonl", _decision_rows(eps, name))
    _write_jsonl(d / "episodes.jsonl", _episode_rows(eps))
    s = _arm_summary(name, eps)
    s["delegations"] = [x.name for x in dels]
    s["candidate"] = bool(arm.candidate) if arm is not None else False
    s["point"] = dels[0].point if len(dels) == 1 else None
    summary["arms"][name] = s


def _arms_from_files(out: Path, names: Sequence[str]) -> tuple[dict[str, Any], int]:
    """The arms' per-task outcomes on the tasks complete in every one of them (the tests are
    paired; an incomplete episode counts for no arm), and how many tasks that leaves out."""
    from jaxdm.stats import Arm
    rows = {n: _read_jsonl(out / "runs" / n / "episodes.jsonl") for n in names}
    flagged = {r["task_id"] for rs in rows.values() for r in rs if r.get("incomplete")}
    arms = {}
    for n, rs in rows.items():
        rs = [r for r in rs if r["task_id"] not in flagged]
        if not rs:
            raise HarnessError(f"{out / 'runs' / n / 'episodes.jsonl'}: no task is complete in "
                               f"every arm ({len(flagged)} incomplete); run the command again "
                               f"with --resume once the servers answer")
        arms[n] = Arm(np.array([r["success"] for r in rs], dtype=float),
                      np.array([r["cost"] for r in rs], dtype=float),
                      tuple(r["task_id"] for r in rs))
    return arms, len(flagged)


@_recorded("compare")
def cmd_compare(cfg: HarnessConfig) -> dict[str, Any]:
    from jaxdm import stats
    out = Path(cfg.out_dir)
    sp = out / "summary.json"
    if not sp.is_file():
        raise HarnessError(f"{sp} does not exist (run `jaxdm harness run` first)")
    summary = _read_json(sp)
    cands = [(n, s["point"]) for n, s in summary["arms"].items() if s.get("candidate")]
    if any(p is None for _, p in cands):
        raise HarnessError("candidate arms must have exactly one delegation (their point)")
    report: dict[str, Any] = {"summary": summary}
    if cands:
        reg = stats.register(cands, margin=cfg.stats.margin, alpha=cfg.stats.alpha,
                             ni_method=cfg.stats.ni_method, cost_method=cfg.stats.cost_method)
        arms1, report["excluded_tasks_stage1"] = _arms_from_files(
            out, ["llm_alone"] + [n for n, _ in cands])
        ref = arms1.pop("llm_alone")
        r1 = stats.stage1(reg, ref, arms1)
        sel = stats.stage2_selection(r1)
        report["stage1"] = r1.table()
        report["stage2_selection"] = sel
        report["registration"] = reg.digest
        chosen = [n for n in sel.values() if n is not None]
        report["stage2_delegations"] = list(chosen)
        if chosen:  # nothing passed: the LLM keeps every point and there is no Stage 2 test
            idx2 = range(cfg.test_tasks, cfg.test_tasks + cfg.stage2_tasks)
            thresholds = load_thresholds(out)
            journal = _journal(cfg, "compare")
            ref2 = run_episodes(cfg, _harness(cfg, (), None), "test", idx2, "stage2 llm_alone",
                                journal)
            arms_by_name = {a.name: a for a in cfg.arms}
            arm = ArmConfig("combined", tuple(d for n in chosen
                                              for d in arms_by_name[n].delegations))
            eps2, dels2 = _run_arm(cfg, arm, thresholds, idx2, "stage2 combined", {}, journal)
            s2: dict[str, Any] = {"arms": {}}
            _save_arm(out, "stage2_llm_alone", ref2, s2, [])
            _save_arm(out, "stage2_combined", eps2, s2, dels2)
            report["stage2_arms"] = s2["arms"]
            arms2, report["excluded_tasks_stage2"] = _arms_from_files(
                out, ["stage2_llm_alone", "stage2_combined"])
            r2 = stats.stage2(r1, arms2["stage2_llm_alone"], {"combined": arms2["stage2_combined"]})
            report["stage2"] = r2.table()
    jsonl.write_json(out / "report.json", report, default=_nan_none)
    text = _report_md(cfg, report, load_thresholds(out))
    jsonl.write_atomic(out / "report.md", text)
    _frontier_figure(summary, out / "frontier.png")
    _savings_figure(summary, out / "savings_by_point.png")
    print(text)
    return report


# ---- report and figures ----------------------------------------------------------------------

def _report_md(cfg: HarnessConfig, report: Mapping, thresholds: Mapping | None) -> str:
    s = report["summary"]
    ref = s["arms"]["llm_alone"]
    lines = [f"# Harness report ({cfg.env.variant}, LLM {cfg.llm.get('profile', cfg.llm['kind'])}"
             f", decision model {cfg.dm.get('kind')})", "",
             f"Test tasks per arm: {ref['n']}; Stage 2: {cfg.stage2_tasks} new tasks; margin "
             f"{cfg.stats.margin:g}, alpha {cfg.stats.alpha:g} ({cfg.stats.ni_method} "
             f"non-inferiority, {cfg.stats.cost_method} cost test, Holm).", "",
             "| arm | success | cost/task (USD) | saving | wall (s, simulated) | LLM calls | "
             "DM calls | DM failures | incomplete |", "|---|---|---|---|---|---|---|---|---|"]
    for name, a in s["arms"].items():
        saving = 1 - a["cost"] / ref["cost"] if ref["cost"] else 0.0
        lines.append(f"| {name} | {a['success']:.3f} | {a['cost']:.5f} | {saving:+.1%} | "
                     f"{a['seconds']:.0f} | {a['llm_calls']} | {a['dm_calls']} | "
                     f"{a['dm_failures']} | {a.get('incomplete', 0)} |")
    incomplete = sum(a.get("incomplete", 0) for a in s["arms"].values())
    if incomplete or report.get("excluded_tasks_stage1") or report.get("excluded_tasks_stage2"):
        lines += ["", f"Incomplete episodes (a call got no answer: not counted as a success or "
                      f"a failure): {incomplete} over the arms; tasks left out of the paired "
                      f"tests: Stage 1 {report.get('excluded_tasks_stage1', 0)}, Stage 2 "
                      f"{report.get('excluded_tasks_stage2', 0)}."]
    if thresholds:
        lines += ["", "## Fitted thresholds (shadow mode, fit split)", "",
                  "| point | n | DM accuracy | ECE | q_L | ΔC (USD) | V (USD) | τ* | threshold | "
                  "share above |", "|---|---|---|---|---|---|---|---|---|---|"]
        for p, f in thresholds.items():
            th = "LLM keeps" if f["threshold"] is None else f"{f['threshold']:.3f}"
            lines.append(f"| {p} | {f['n']} | {f['dm_accuracy']:.3f} | {f['ece']:.3f} | "
                         f"{f['q_llm']:.3f} | {f['delta_cost']:.5f} | {f['value']:.3f} | "
                         f"{f['tau_star']:.3f} | {th} | {f['share_above']:.3f} |")
    for stage in ("stage1", "stage2"):
        if stage not in report:
            continue
        lines += ["", f"## {'Stage 1: each delegation alone' if stage == 'stage1' else 'Stage 2: the registered combination on new tasks'}", "",
                  "| candidate | point | success ref | success | diff | lower bound | p (NI) | "
                  "saving | p (cost) | p Holm | passed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in report[stage]:
            saving = r["saving"]
            lines.append(f"| {r['name']} | {r['point']} | {r['success_ref']:.3f} | "
                         f"{r['success']:.3f} | {r['diff']:+.3f} | {r['lower_bound']:+.3f} | "
                         f"{r['p_noninferiority']:.4f} | {saving:+.1%} | {r['p_cost']:.4f} | "
                         f"{r['p_holm']:.4f} | {'yes' if r['passed'] else 'no'} |")
    if "stage2_delegations" in report:
        lines += ["", f"Stage 2 combination (registered rule: per point the passing delegation "
                      f"with the largest saving): {report['stage2_delegations'] or 'none (the LLM keeps every point)'}"]
    drifts = [(n, a["drift"]) for n, a in s["arms"].items() if a.get("drift")]
    if drifts:
        lines += ["", "## Drift monitor (share of answers above τ, sliding window, test tasks)",
                  "", "| arm | point | τ | share at fit | share now | refit flagged |",
                  "|---|---|---|---|---|---|"]
        for n, d in drifts:
            lines.append(f"| {n} | {d['point']} | {d['threshold']:.3f} | "
                         f"{d['reference_share']:.3f} | {d['final_share']:.3f} | "
                         f"{'yes' if d['needs_refit'] else 'no'} |")
    lines += ["", "## Savings by point (single-delegation arms vs the LLM alone)", "",
              "| arm | point | saving per task (USD) | success diff |", "|---|---|---|---|"]
    for name, a in s["arms"].items():
        if a.get("point"):
            lines.append(f"| {name} | {a['point']} | {ref['cost'] - a['cost']:+.5f} | "
                         f"{a['success'] - ref['success']:+.3f} |")
    return "\n".join(lines) + "\n"


def _save_figure(fig, path: Path) -> None:
    """``fig`` as a PNG at ``path``, whole (a temporary file renamed over it) or
    ``OutputError``."""
    import os
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from e


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _calibration_figure(dec: Sequence[Mapping], fits: Mapping, path: Path) -> None:
    from jaxdm.harness.fit import isotonic
    plt = _plt()
    pts = list(fits)
    if not pts:
        return
    cols = min(4, len(pts))
    rows = math.ceil(len(pts) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, p in zip(axes.flat, pts):
        rs = [r for r in dec if r["point"] == p and r.get("confidence") is not None
              and r.get("dm_correct") is not None]
        x = [r["confidence"] for r in rs]
        y = [float(r["dm_correct"]) for r in rs]
        bins = [b for b in binned(x, y) if b["n"]]
        ax.plot([0, 1], [0, 1], ":", color="grey")
        ax.scatter([b["confidence"] for b in bins], [b["accuracy"] for b in bins],
                   s=[10 + b["n"] / 2 for b in bins], label="binned")
        xs, fit = isotonic(x, y)
        ax.step(xs, fit, where="post", label="isotonic")
        f = fits[p]
        ax.axhline(f["tau_star"], color="red", lw=0.8, label="τ*")
        if f["threshold"] is not None:
            ax.axvline(f["threshold"], color="green", lw=0.8, label="threshold")
        ax.set_title(p)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[len(pts):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


def _frontier_figure(summary: Mapping, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    fr = sorted(summary.get("frontier", []), key=lambda f: f["cost"])
    if fr:
        ax.plot([f["cost"] for f in fr], [f["success"] for f in fr], "o-", color="black",
                label="CASCADE threshold sweep", zorder=3)
        for f in fr:
            ax.annotate(f"τ={f['threshold']:.2g}", (f["cost"], f["success"]), fontsize=7,
                        xytext=(3, -10), textcoords="offset points")
    markers = "sD^v<>pP*Xhd"
    for i, (name, a) in enumerate(summary["arms"].items()):
        ax.scatter([a["cost"]], [a["success"]], marker=markers[i % len(markers)], s=36,
                   label=name, zorder=4)
    ax.set_xlabel("cost per task (USD)")
    ax.set_ylabel("task success")
    ax.set_title("cost vs success (same test tasks)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


def _savings_figure(summary: Mapping, path: Path) -> None:
    plt = _plt()
    ref = summary["arms"]["llm_alone"]
    rows = [(n, a) for n, a in summary["arms"].items() if a.get("point")]
    fig, ax = plt.subplots(figsize=(6, 0.35 * max(3, len(rows)) + 1))
    if rows and ref["cost"]:
        ax.barh([n for n, _ in rows], [1 - a["cost"] / ref["cost"] for _, a in rows])
        ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("cost saving vs the LLM alone")
    ax.set_title("savings by delegation")
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


COMMANDS: Mapping[str, Callable[..., Any]] = {
    "shadow": cmd_shadow, "fit": cmd_fit, "run": cmd_run, "compare": cmd_compare}


def _options_parser(prog: str = "jaxdm harness ACTION", positional: bool = True):
    import argparse
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
    import argparse
    p = sub.add_parser("harness", help="agent LLM + decision model harness (seed 003)",
                       parents=[_options_parser(positional=False)],
                       description="Shadow-mode fitting, arms and registered statistics on "
                                   "DECISION GYM with a delegating harness. Options and "
                                   "key=value overrides may come in any order.")
    p.add_argument("action", choices=list(COMMANDS) + ["all"],
                   help="shadow | fit | run | compare | all (the four in order)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def load(config: str | None, overrides: Sequence[str]) -> HarnessConfig:
    from jaxdm.config import ConfigError, load_config
    path = config
    if path is not None and not Path(path).is_file():
        preset = Path(__file__).resolve().parents[2] / "experiments" / "configs" / \
            f"harness_{path}.yaml"
        if preset.is_file():
            path = str(preset)
    try:
        return load_config(HarnessConfig, path, list(overrides))
    except ConfigError as e:
        raise HarnessError(str(e)) from None


def main(args) -> int:
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


__all__ = ["HarnessConfig", "ArmConfig", "DelegationConfig", "AgentConfig", "FitConfig",
           "StatsConfig", "EnvConfig", "cmd_shadow",
           "cmd_fit", "cmd_run", "cmd_compare", "COMMANDS", "add_parser", "main", "load"]
