"""The run folder of every job that writes results as it goes (the trainer, train-dm, screen,
bench, the harness, experiments): one lock, one rule for refusing, resuming and overwriting,
one settings record and its diff, whole-file writes, appends and done markers.

``open_run(path, layout, settings, resume=, overwrite=)`` (``check_folder`` /
``clear_outputs`` / ``write_settings`` are its steps, for a job that runs them on several
processes) takes the folder's lock, then:

- a fresh run (neither flag) into a folder that holds a run, or any file when
  ``layout.foreign_files`` is False, is ``RunExistsError`` naming what is there and the two
  flags; ``overwrite`` removes the job's own ``layout.outputs`` (never a folder wholesale)
  and starts fresh; the two flags together are ``RunFolderError``;
- ``resume`` compares the saved settings record (``layout.record``) with ``settings``: every
  differing key but ``layout.free`` (the settings that may change, e.g. thread counts) is
  named in one ``ResumeMismatchError`` with its saved and new value; the same settings
  continue the run (``RunDir.resumed``), a folder holding no run starts fresh (or is refused
  when it holds other files and ``foreign_files`` is False).

Settings are compared in their saved form (JSON with URL credentials redacted, as
``jaxdm.jsonl`` writes them), and through ``layout.view`` (a flat view of nested settings).

Writes go through ``jaxdm.jsonl`` (the one writer): ``RunDir.write`` / ``write_json`` replace a
file whole (temporary file, fsync, rename), ``RunDir.append`` appends fsync'd JSON lines.
``UnitLog`` is the done marker of a job's units: one line per finished unit (its record),
appended as the unit finishes, so a kill loses at most the unit in flight. A job that writes a
few named files rather than a folder refuses to replace them with ``refuse_overwrite``.

``lock_run_dir(path)``: an exclusive ``fcntl`` lock on ``path/.jaxdm.lock``, held until
``release()`` or the process ends (the kernel releases it when a job dies, even by SIGKILL, so
there is never a stale lock to clean up). A second job on the same folder fails at once with
``RunFolderBusy`` naming the folder and the other job's process id. Within one process the
lock is counted (a command that runs other commands, ``harness all``, takes it once per
command without blocking itself). The lock file stays in a folder a job has worked in (stores
ignore it: ``listed_files``); ``abandon`` (a job refused before its work) removes what the lock
created, and a job that opened a lock file removed under it takes the new one instead.
``prepare_out_dir(path)``: the folder exists afterwards and can be written, or
``RunFolderError`` says why (a file where the folder should be, a folder that cannot be
created, a read-only place).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from jaxdm.config import shown
from jaxdm.jsonl import append_records, read_records, write_atomic, write_json, write_records
from jaxdm.secrets import redact

__all__ = ["RunFolderError", "RunFolderBusy", "RunExistsError", "ResumeMismatchError",
           "RUN_LOCK_FILE", "prepare_out_dir", "lock_run_dir", "RunLock", "listed_files",
           "Layout", "RunDir", "open_run", "check_flags", "check_folder", "clear_outputs",
           "write_settings", "saved_form", "settings_diff", "describe_diff", "read_saved",
           "UnitLog", "refuse_overwrite"]

RUN_LOCK_FILE = ".jaxdm.lock"


class RunFolderError(ValueError):
    """An output folder that cannot be used (the message names it and why)."""


class RunFolderBusy(RunFolderError):
    """Another job holds the folder's lock."""


class RunExistsError(RunFolderError):
    """A fresh run was pointed at a folder that holds a run (or files that are not the job's)."""


class ResumeMismatchError(RunFolderError):
    """``resume`` with settings that differ from the saved ones (each key named)."""


# ---- the layout of a job's folder --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """What one job's run folder holds, declared once by its store.

    ``record``: the settings record's file name; ``outputs``: the job's own files and folders,
    names or glob patterns (``overwrite`` removes these only); ``kind``: the run in messages ("a bench run");
    ``free``: keys of the compared view that may differ on resume; ``foreign_files``: other
    files in the folder are allowed (else a fresh run refuses any file); ``holds``: whether
    the folder holds a run (default: the record is there); ``view``: the flat mapping compared
    on resume (default: the settings' top-level keys); ``load`` / ``dump``: read / write the
    record (default: a JSON object)."""

    record: str
    outputs: tuple[str, ...]
    kind: str = "a run"
    free: tuple[str, ...] = ()
    foreign_files: bool = False
    holds: Callable[[Path], bool] | None = None
    view: Callable[[Mapping[str, Any]], Mapping[str, Any]] = dict
    load: Callable[[Path], Mapping[str, Any]] | None = None
    dump: Callable[[Path, Mapping[str, Any]], None] | None = None

    def holds_run(self, out: Path) -> bool:
        """Whether ``out`` holds a run of this job."""
        return self.holds(out) if self.holds is not None else (out / self.record).is_file()


def saved_form(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` as a record file holds them: JSON values (tuples as lists), URL
    credentials redacted (so a password never makes two settings differ)."""
    return json.loads(redact(json.dumps(dict(settings), default=str)))


_ABSENT = object()


def settings_diff(saved: Mapping[str, Any], now: Mapping[str, Any],
                  free: Iterable[str] = ()) -> list[str]:
    """The keys of two flat settings mappings whose values differ (a key on one side only
    counts), sorted, without the ``free`` keys."""
    free = set(free)
    return sorted(k for k in set(saved) | set(now)
                  if k not in free and saved.get(k, _ABSENT) != now.get(k, _ABSENT))


def _value(key: str, value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    s = shown(key, value)
    return s if len(s) <= 80 else s[:77] + "..."


def describe_diff(keys: Sequence[str], saved: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """``"key: saved -> now, ..."`` for ``keys`` (secret keys' values hidden, long values
    shortened, a missing key shown as ``(absent)``)."""
    return ", ".join(f"{k}: {_value(k, saved.get(k, _ABSENT))} -> {_value(k, now.get(k, _ABSENT))}"
                     for k in keys)


def check_flags(resume: bool, overwrite: bool) -> None:
    """``RunFolderError`` when both ``resume`` and ``overwrite`` are asked for."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")


def _read_record(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{path}: unreadable ({e}); use --overwrite to start again"
                             ) from None
    if not isinstance(value, dict):
        raise RunFolderError(f"{path}: expected a JSON object, got {type(value).__name__}; "
                             f"use --overwrite to start again")
    return value


def _listing(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def check_folder(out: str | Path, layout: Layout, settings: Mapping[str, Any], *,
                 resume: bool, overwrite: bool, what: str = "output folder") -> bool:
    """Whether the job resumes the run in ``out`` (True) or starts fresh (False); raises
    ``RunExistsError`` / ``ResumeMismatchError`` / ``RunFolderError`` as the module docstring
    says. Reads only: nothing in the folder changes."""
    check_flags(resume, overwrite)
    out = Path(out)
    record = out / layout.record
    if resume and record.is_file():
        saved = layout.load(record) if layout.load is not None else _read_record(record)
        was, now = layout.view(saved_form(saved)), layout.view(saved_form(settings))
        changed = settings_diff(was, now, layout.free)
        if changed:
            free = f"; free to change: {list(layout.free)}" if layout.free else ""
            raise ResumeMismatchError(
                f"--resume: {out} holds {layout.kind} with different settings: "
                f"{describe_diff(changed, was, now)}; resume with the saved settings ({record}), "
                f"or use --overwrite / another --out{free}")
    held = layout.holds_run(out)
    if resume and held:
        return True
    files = listed_files(out)
    refused = held or (files and not layout.foreign_files)
    if refused and not overwrite:
        if resume:
            raise RunExistsError(f"--resume: {out} holds no {layout.kind.split(' ', 1)[-1]} "
                                 f"(no {layout.record}) but is not empty ({_listing(files)}); "
                                 f"choose another --out")
        raise RunExistsError(f"{what} {out} already holds {layout.kind if held else 'files'} "
                             f"({_listing(files)}); pass --resume to continue it or "
                             f"--overwrite to replace it")
    return False


def clear_outputs(out: str | Path, layout: Layout) -> None:
    """Removes the job's own files and folders (``layout.outputs`` and its record) from
    ``out``: ``overwrite``, never a user's folder wholesale."""
    out = Path(out)
    for name in (*layout.outputs, layout.record):
        for path in out.glob(name):   # a name, or a pattern ("harness_*")
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def write_settings(out: str | Path, layout: Layout, settings: Mapping[str, Any]) -> None:
    """Writes the settings record of a fresh run, whole."""
    path = Path(out) / layout.record
    if layout.dump is not None:
        layout.dump(path, settings)
    else:
        write_json(path, dict(settings))


class RunDir:
    """One job's opened run folder (``open_run``): its lock held, its settings recorded.
    ``resumed``: the job continues a run there (else it starts fresh)."""

    def __init__(self, folder: Path, layout: Layout, lock: "RunLock", resumed: bool):
        self.folder, self.layout, self.lock, self.resumed = folder, layout, lock, resumed

    def path(self, name: str) -> Path:
        """The path of ``name`` in the folder."""
        return self.folder / name

    def write(self, name: str, text: str) -> None:
        """Replaces file ``name`` with ``text``, whole (``jaxdm.jsonl.write_atomic``)."""
        write_atomic(self.folder / name, text)

    def write_json(self, name: str, value: Any, **kw) -> None:
        """Replaces file ``name`` with ``value`` as JSON, whole (``jaxdm.jsonl.write_json``)."""
        write_json(self.folder / name, value, **kw)

    def append(self, name: str, records: Iterable[Any]) -> None:
        """Appends one JSON line per record to ``name``, fsync'd
        (``jaxdm.jsonl.append_records``)."""
        append_records(self.folder / name, records)

    def release(self) -> None:
        """Releases the folder's lock (idempotent)."""
        self.lock.release()

    def abandon(self) -> None:
        """Releases the lock, removing what it created (a job refused before its work)."""
        self.lock.abandon()

    @contextlib.contextmanager
    def abandoned_on_error(self):
        """A block of the job's own opening work (reading its saved units, writing its first
        files): an error in it ``abandon``s the folder and propagates."""
        try:
            yield self
        except BaseException:
            self.abandon()
            raise

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def open_run(path: str | Path, layout: Layout, settings: Mapping[str, Any], *, resume: bool,
             overwrite: bool, what: str = "output folder") -> RunDir:
    """Locks the folder, checks it (``check_folder``) and, for a fresh run, removes the job's
    outputs (``overwrite``) and writes the settings record. A refusal releases the lock and
    leaves the folder as it was (a folder the lock created is removed)."""
    check_flags(resume, overwrite)
    lock = lock_run_dir(path, what)
    try:
        resumed = check_folder(path, layout, settings, resume=resume, overwrite=overwrite,
                               what=what)
        if not resumed:
            if overwrite:
                clear_outputs(path, layout)
            write_settings(path, layout, settings)
    except BaseException:
        lock.abandon()
        raise
    return RunDir(Path(path), layout, lock, resumed)


def refuse_overwrite(paths: Sequence[str | Path], *, overwrite: bool) -> None:
    """The rule of a job that writes a few named files rather than a run folder (an
    experiment's summary and report): they are never replaced unasked. Raises FileExistsError
    naming those of ``paths`` that exist, unless ``overwrite``; a job calls it before its
    work, not after."""
    held = [str(p) for p in paths if Path(p).exists()]
    if held and not overwrite:
        raise FileExistsError(f"results already there: {', '.join(held)}; pass --overwrite to "
                              f"replace them or choose another output")


# ---- saved records and done markers ------------------------------------------------------

def read_saved(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) of each line of a job's saved JSONL file (none when it is absent); a
    torn last line (a kill while writing it) is dropped with a message; a bad line elsewhere,
    or one that is not an object, is ``RunFolderError`` naming it."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        lines = read_records(path, drop_torn_tail=True)
    except ValueError as e:
        raise RunFolderError(f"{e}; use --overwrite to start again") from None
    for where, value in lines:
        if not isinstance(value, dict):
            raise RunFolderError(f"{where}: expected a JSON object, got {type(value).__name__}; "
                                 f"use --overwrite to start again")
    return lines


class UnitLog:
    """The done markers of a job's units: one JSON line per finished unit (its record, keyed
    by the values of ``fields``) in one JSONL file, appended and fsync'd as the unit finishes.
    A later line of a unit holds over an earlier one; ``put`` of a saved unit rewrites the
    file whole, so it never holds a unit twice."""

    def __init__(self, path: str | Path, fields: Sequence[str], what: str = "unit"):
        self.path, self.fields, self.what = Path(path), tuple(fields), what
        self.saved: dict[tuple, dict[str, Any]] = {}
        self.lines = 0   # lines read by ``load``

    def key(self, record: Mapping[str, Any]) -> tuple:
        """The unit a record marks: its values of ``fields``."""
        return tuple(record[f] for f in self.fields)

    def start(self) -> None:
        """A fresh run: an empty log."""
        write_atomic(self.path, "")
        self.saved = {}

    def load(self, required: Sequence[str] = ()) -> dict[tuple, dict[str, Any]]:
        """The saved units, keyed (a torn last line dropped); a line lacking a field or one of
        ``required`` is ``RunFolderError`` naming it."""
        lines = read_saved(self.path)
        saved: dict[tuple, dict[str, Any]] = {}
        for where, record in lines:
            missing = [k for k in (*self.fields, *required) if k not in record]
            if missing:
                raise RunFolderError(f"{where}: not a {self.what} (no {missing}); use "
                                     f"--overwrite to start again")
            saved[self.key(record)] = record
        self.saved, self.lines = saved, len(lines)
        return dict(saved)

    def keep(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Rewrites the log whole with ``records`` (a resume's kept units: a torn last line
        must not stay in front of the next append)."""
        self.saved = {self.key(r): dict(r) for r in records}
        write_records(self.path, self.saved.values())

    def mark(self, record: Mapping[str, Any]) -> None:
        """Marks a finished unit: its record appended, fsync'd."""
        append_records(self.path, [dict(record)])
        self.saved[self.key(record)] = dict(record)

    def put(self, record: Mapping[str, Any]) -> None:
        """``mark`` for a new unit; a saved one's line is replaced (the file rewritten whole)."""
        if self.key(record) not in self.saved:
            return self.mark(record)
        self.saved[self.key(record)] = dict(record)
        write_records(self.path, self.saved.values())

    def done(self, key: tuple) -> bool:
        """Whether unit ``key`` is marked."""
        return key in self.saved


# ---- the folder and its lock -------------------------------------------------------------
def prepare_out_dir(path: str | Path, what: str = "output folder") -> Path:
    """Creates ``path`` (and its parents) if needed and checks it is a writable folder."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"{what} {out} is a file, not a folder; choose another output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError(f"cannot create {what} {out}: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise RunFolderError(f"{what} {out} is not writable; choose another output")
    return out


def listed_files(out: str | Path) -> list[str]:
    """The names in a run folder, without the lock file (what a 'folder holds files' check
    reads)."""
    out = Path(out)
    return sorted(p.name for p in out.iterdir() if p.name != RUN_LOCK_FILE) if out.is_dir() else []


_held: dict[Path, list] = {}   # folder -> [open lock file, count] of this process
_held_guard = threading.Lock()


class RunLock:
    """The lock of one run folder held by this process (``lock_run_dir``)."""

    def __init__(self, folder: Path, created: bool = False, fresh: bool = False):
        self.folder = folder
        self.created = created   # this lock created the folder
        self.fresh = fresh       # ... or at least the lock file
        self._released = False

    def abandon(self) -> None:
        """``release``, first removing what this lock created (the lock file, and the folder
        if it holds nothing else): a job refused before its work leaves no trace."""
        if not self._released and self.fresh:
            with _held_guard:
                last = _held.get(self.folder, [None, 0])[1] <= 1
            if last:   # unlinked while held: a job that opened it re-checks (lock_run_dir)
                (self.folder / RUN_LOCK_FILE).unlink(missing_ok=True)
        self.release()
        if self.created and self.folder.is_dir() and not any(self.folder.iterdir()):
            try:
                self.folder.rmdir()
            except OSError:
                pass

    def release(self) -> None:
        """Idempotent; the last release of this process unlocks the folder."""
        if self._released:
            return
        self._released = True
        with _held_guard:
            entry = _held.get(self.folder)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del _held[self.folder]
                entry[0].close()   # closing the descriptor drops the flock

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run_dir(path: str | Path, what: str = "output folder") -> RunLock:
    """Takes the folder's lock (``prepare_out_dir`` first); raises ``RunFolderBusy`` when
    another process holds it."""
    created = not Path(path).is_dir()
    folder = prepare_out_dir(path, what).resolve()
    with _held_guard:
        entry = _held.get(folder)
        if entry is not None:
            entry[1] += 1
            return RunLock(folder)
        lock_path = folder / RUN_LOCK_FILE
        fresh = not lock_path.exists()
        while True:
            f = _open_locked(lock_path, folder, what)
            try:   # a lock file removed by ``abandon`` after we opened it: take the new one
                if os.stat(lock_path).st_ino == os.fstat(f.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            f.close()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        _held[folder] = [f, 1]
        return RunLock(folder, created, fresh)


def _open_locked(lock_path: Path, folder: Path, what: str):
    try:
        f = open(lock_path, "a+", encoding="utf-8")
    except OSError as e:
        raise RunFolderError(f"cannot create the lock file {lock_path}: {e.strerror or e}"
                             ) from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.seek(0)
        other = f.read().strip() or "unknown"
        f.close()
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise RunFolderBusy(f"{what} {folder} is in use by another job (process {other}); "
                                f"wait for it to finish or choose another output") from None
        raise RunFolderError(f"cannot lock {what} {folder}: {e.strerror or e}") from None
    return f
