"""Run folders of every job (bench, screen, harness, train-dm, the trainer, experiments): the
output path checked before any work, and one lock per folder for the job's whole life.

``prepare_out_dir(path)``: the folder exists afterwards and can be written, or
``RunFolderError`` says why (a file where the folder should be, a folder that cannot be
created, a read-only place) — a named error, never a traceback.

``lock_run_dir(path)``: an exclusive ``fcntl`` lock on ``path/.jaxdm.lock``, held until
``release()`` or the process ends (the kernel releases it when a job dies, even by SIGKILL, so
there is never a stale lock to clean up). A second job on the same folder fails at once with
``RunFolderBusy`` naming the folder and the other job's process id. Within one process the
lock is counted (a command that runs other commands, ``harness all``, takes it once per
command without blocking itself). The lock file stays in a folder a job has worked in (stores
ignore it: ``listed_files``); ``abandon`` (a job refused before its work) removes what the lock
created, and a job that opened a lock file removed under it takes the new one instead.
"""
from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path

__all__ = ["RunFolderError", "RunFolderBusy", "RUN_LOCK_FILE", "prepare_out_dir",
           "lock_run_dir", "RunLock", "listed_files"]

RUN_LOCK_FILE = ".jaxdm.lock"


class RunFolderError(ValueError):
    """An output folder that cannot be used (the message names it and why)."""


class RunFolderBusy(RunFolderError):
    """Another job holds the folder's lock."""


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
