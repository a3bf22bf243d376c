"""What a harness run folder holds and how a command claims it: the end records of finished
commands (``harness_config.json``), each command's start record and journaled episodes
(``journal/<command>/``), ``--overwrite`` / ``--resume``, and the ``recorded`` wrapper that
holds the folder's lock (``jaxdm.rundir``) around a command. A command is the harness's unit of
work: its end record is its done marker, and the settings diffs and flag rules are
``jaxdm.rundir``'s.

A command writes its start record before it removes or writes anything, so output without an
end record is an interrupted command: ``overwrite`` is needed to run a command again (see
``COMMAND_KEYS``), and ``resume`` continues an interrupted one from any kill point (its
finished episodes kept). A command whose passes flagged episodes (a call got no answer) is
finished *incomplete* until a ``resume`` has run them again. Every file is written whole and
redacted (``jaxdm.jsonl``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxdm import jsonl
from jaxdm.config import to_dict
from jaxdm.harness.agent import Episode
from jaxdm.harness.config import HarnessConfig
from jaxdm.harness.errors import HarnessError
from jaxdm.jsonl import OutputError
from jaxdm.rundir import check_flags, lock_run_dir, settings_diff
from jaxdm.secrets import redact


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


def _command_values(cfg: HarnessConfig) -> dict[str, dict[str, Any]]:
    # as the record file holds them: JSON, URL credentials redacted (a base_url's password
    # never reaches the folder, and never makes two configs differ)
    values = json.loads(redact(json.dumps(to_dict(cfg))))
    return {a: {k: values[k] for k in keys} for a, keys in COMMAND_KEYS.items()}


def _read_record(out: Path) -> dict[str, Any]:
    path = out / RECORD_FILE
    return read_json(path) if path.is_file() else {}


def _write_record(out: Path, record: Mapping[str, Any]) -> None:
    jsonl.write_json(out / RECORD_FILE, dict(record))


@dataclasses.dataclass(frozen=True)
class Journal:
    """Where a command's start record and its finished episodes go (one JSONL per pass, an
    episode appended as it ends), with the config values they are made with."""

    folder: Path
    values: Mapping[str, Any]

    def path(self, desc: str) -> Path:
        """The journal file of pass ``desc`` (its name made file-safe)."""
        return self.folder / (re.sub(r"[^\w.-]+", "_", desc) + ".jsonl")

    def start(self) -> None:
        """The start record (kept when it is there: a resumed command's, checked equal)."""
        make_dir(self.folder)
        if not (self.folder / START_FILE).is_file():
            jsonl.write_json(self.folder / START_FILE, dict(self.values))

    def append(self, desc: str, index: int, episode: Episode) -> None:
        """Appends one finished episode (its task ``index`` and the whole episode) to pass
        ``desc``'s journal, fsync'd, writing the start record first if it is missing."""
        if not (self.folder / START_FILE).is_file():
            self.start()
        jsonl.append_records(self.path(desc), [{"index": index, "episode": episode.to_dict()}])

    def episode_files(self) -> list[Path]:
        """The pass journals in the folder, sorted (none when the folder is absent)."""
        return sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []


def command_journal(cfg: HarnessConfig, action: str) -> Journal:
    """The journal of command ``action`` in ``cfg.out_dir``, holding the config values of that
    command and of the commands before it."""
    now = _command_values(cfg)
    return Journal(Path(cfg.out_dir) / JOURNAL_DIR / action,
                   {a: now[a] for a in COMMAND_ORDER[:COMMAND_ORDER.index(action) + 1]})


def make_dir(path: Path) -> None:
    """Creates ``path`` and its parents, or ``OutputError`` naming it."""
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
    out, folder = Path(cfg.out_dir), command_journal(cfg, action).folder
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
    check_flags(resume, overwrite)
    out = Path(cfg.out_dir)   # made and locked by ``recorded`` (``jaxdm.rundir``)
    record, now = _read_record(out), _command_values(cfg)
    i = COMMAND_ORDER.index(action)
    for earlier in COMMAND_ORDER[:i]:
        state = _state(cfg, record, earlier)
        if state in ("finished", "incomplete"):
            diff = settings_diff(record[earlier], now[earlier])
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
    journal = command_journal(cfg, action)
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
            flagged = read_json(journal.folder / INCOMPLETE_FILE).get("episodes", "some")
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
            saved = read_json(journal.folder / START_FILE)
        elif not journal.episode_files():
            saved = dict(journal.values)   # killed while writing its start record
        else:
            raise HarnessError(f"{journal.folder} has episodes but no {START_FILE}; use "
                               f"--overwrite")
        diff = sorted(k for a, now_a in journal.values.items()
                      for k in settings_diff(saved.get(a) or {}, now_a))
        if diff:
            raise HarnessError(f"--resume: the interrupted `{action}` in {out} ran with other "
                               f"values of {diff}; resume with its config, or --overwrite")
        if state == "incomplete":
            flagged = read_json(journal.folder / INCOMPLETE_FILE).get("episodes", "its")
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
        _drop_journal(command_journal(cfg, a))
    if any(a in record for a in COMMAND_ORDER[i:]):
        _write_record(out, {a: v for a, v in record.items() if a in COMMAND_ORDER[:i]})
    (journal.folder / INCOMPLETE_FILE).unlink(missing_ok=True)
    for f in present:
        _remove(out / f)   # runs/stage2_* go with runs/
    return False


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or ``HarnessError`` naming the file when it is unreadable or not
    an object."""
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


def note_pass(tally: Mapping[str, Any]) -> None:
    """Adds a finished pass's tally (episodes, calls, failures) to the command that runs now,
    whose end record counts its incomplete episodes; nothing outside a command."""
    if _PASSES:
        _PASSES[-1].append(dict(tally))


def recorded(action: str):
    """A command that holds its folder's lock, claims the folder (its start record) first
    and writes its end record once finished."""
    def wrap(command):
        @functools.wraps(command)
        def run(cfg: HarnessConfig, *, overwrite: bool = False, resume: bool = False) -> Any:
            lock = lock_run_dir(cfg.out_dir)
            started_here = not command_journal(cfg, action).folder.is_dir()
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
    journal, out = command_journal(cfg, action), Path(cfg.out_dir)
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
    out, journal = Path(cfg.out_dir), command_journal(cfg, action)
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


__all__ = ["COMMAND_ORDER", "COMMAND_KEYS", "UNRECORDED_KEYS", "COMMAND_OUTPUTS",
           "RECORD_FILE", "JOURNAL_DIR", "START_FILE", "INCOMPLETE_FILE", "Journal",
           "command_journal", "make_dir", "read_json", "note_pass", "recorded"]
