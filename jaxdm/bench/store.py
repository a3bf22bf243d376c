"""A bench run's output folder: written unit by unit (one backend on one level, or on one L3
env), resumable.

``bench_run.json`` holds the settings that shape the answers (the config without where and how
the job shows itself; URL credentials redacted); ``units.jsonl`` one line per unit run (its
records, L3 episode rows, seconds and ``complete``), appended and fsync'd as each finishes. A
folder that holds files is never written into without ``resume`` (same settings: finished
units are kept, the rest run) or ``overwrite`` (our own files removed, then a fresh run).

A unit with any failed answer (no answer came back, or an L3 episode with a failed agent-LLM
call or decision-model answer) is saved with ``"complete": false`` and its good answers: a
resumed run asks only the failed questions (re-runs only the flagged episodes) again, and
``put`` then replaces the unit's line (the file rewritten atomically), so the file never holds
a unit twice. The folder is locked for the job's life (``jaxdm.rundir.lock_run_dir``): a
second job on it fails at once naming the folder and the other process; ``close`` releases it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from jaxdm.jsonl import append_records, read_records, write_atomic, write_records
from jaxdm.rundir import listed_files, lock_run_dir
from jaxdm.secrets import redact

IDENTITY_FILE = "bench_run.json"
UNITS_FILE = "units.jsonl"
OUTPUT_FILES = (IDENTITY_FILE, UNITS_FILE, "bench.json", "records.jsonl", "l3_episodes.jsonl",
                "report.md", "accuracy.png", "levels.png")


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 80 else s[:77] + "..."


class BenchStore:
    """Opens (fresh, overwrite or resume) and appends to one bench run's folder. Errors are
    ValueError naming the folder and what to pass."""

    def __init__(self, out_dir: str | Path):
        self.out = Path(out_dir)
        self.identity = self.out / IDENTITY_FILE
        self.units = self.out / UNITS_FILE

    def open(self, identity: Mapping[str, Any], *, resume: bool, overwrite: bool
             ) -> dict[tuple[str, str], dict[str, Any]]:
        """Prepare the folder; returns the finished units (resume) keyed (backend, level)."""
        if resume and overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        # the folder is this job's until it ends (a second job on it fails here, at once)
        self.lock = lock_run_dir(self.out)
        try:
            return self._open(identity, resume=resume, overwrite=overwrite)
        except BaseException:
            self.lock.abandon()
            raise

    def close(self) -> None:
        """Releases the folder's lock (idempotent)."""
        lock = getattr(self, "lock", None)
        if lock is not None:
            lock.release()

    def _open(self, identity, *, resume: bool, overwrite: bool):
        # compare in its saved form: JSON, with URL credentials redacted as the writer does
        identity = json.loads(redact(json.dumps(dict(identity))))
        self._saved: dict[tuple[str, str], dict[str, Any]] = {}
        if resume and self.identity.is_file():
            return self._resume(identity)
        existing = listed_files(self.out)
        if existing and not overwrite:
            listed = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
            if resume:
                raise ValueError(f"--resume: {self.out} holds no bench run (no {IDENTITY_FILE}) "
                                 f"but is not empty ({listed}); choose another --out")
            what = "a bench run" if self.identity.is_file() else "files"
            raise ValueError(f"output folder {self.out} already holds {what} ({listed}); pass "
                             f"--resume to continue it or --overwrite to replace it")
        for name in OUTPUT_FILES if overwrite else ():   # only our files, never a whole folder
            (self.out / name).unlink(missing_ok=True)
        write_atomic(self.identity, json.dumps(identity, indent=1))
        write_atomic(self.units, "")
        return {}

    def _resume(self, identity: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        try:
            saved = json.loads(self.identity.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.identity}: invalid JSON ({e.msg}); use --overwrite to start "
                             f"again") from None
        changed = [k for k in sorted(set(saved) | set(identity)) if saved.get(k) != identity.get(k)]
        if changed:
            parts = [f"{k} (saved {_short(saved.get(k))}, now {_short(identity.get(k))})"
                     for k in changed]
            raise ValueError(f"--resume: {self.out} holds a run with different settings: "
                             f"{'; '.join(parts)}; resume with the same settings, or use "
                             f"--overwrite / another --out")
        done: dict[tuple[str, str], dict[str, Any]] = {}
        if self.units.is_file():
            try:
                lines = read_records(self.units, drop_torn_tail=True)
            except ValueError as e:
                raise ValueError(f"{e}; use --overwrite to start again") from None
            for where, unit in lines:
                if not (isinstance(unit, dict) and {"backend", "level", "records"} <= set(unit)):
                    raise ValueError(f"{where}: not a bench unit; use --overwrite to start "
                                     f"again")
                done[(unit["backend"], unit["level"])] = unit   # a later line holds
        # rewritten whole: a torn last line must not stay in front of the next append
        write_records(self.units, done.values())
        self._saved = dict(done)
        return done

    def append(self, unit: Mapping[str, Any]) -> None:
        """Record one finished backend x level ``unit`` (a dict with 'backend' and 'level'):
        appended to units.jsonl with an fsync, and kept as that unit's saved result."""
        append_records(self.units, [dict(unit)])
        self._saved[(unit["backend"], unit["level"])] = dict(unit)

    def put(self, unit: Mapping[str, Any]) -> None:
        """Saves ``unit``: appended when new, else in place of its saved line (the file
        rewritten whole, atomically)."""
        key = (unit["backend"], unit["level"])
        if key not in self._saved:
            return self.append(unit)
        self._saved[key] = dict(unit)
        write_records(self.units, self._saved.values())


__all__ = ["BenchStore", "OUTPUT_FILES", "IDENTITY_FILE", "UNITS_FILE"]
