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
a unit twice. The folder rules (refuse, resume, overwrite, the settings diff, the lock held for
the job's life) are ``jaxdm.rundir``'s; ``close`` releases the lock.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from jaxdm.rundir import Layout, RunDir, UnitLog, open_run

IDENTITY_FILE = "bench_run.json"
UNITS_FILE = "units.jsonl"
OUTPUT_FILES = (IDENTITY_FILE, UNITS_FILE, "bench.json", "records.jsonl", "l3_episodes.jsonl",
                "report.md", "accuracy.png", "levels.png")
LAYOUT = Layout(IDENTITY_FILE, OUTPUT_FILES, kind="a bench run")


class BenchStore:
    """Opens (fresh, overwrite or resume) and appends to one bench run's folder. Errors are
    ``jaxdm.rundir.RunFolderError`` (a ValueError) naming the folder and what to pass."""

    def __init__(self, out_dir: str | Path):
        self.out = Path(out_dir)
        self.identity = self.out / IDENTITY_FILE
        self.units = UnitLog(self.out / UNITS_FILE, ("backend", "level"), what="bench unit")
        self.run: RunDir | None = None

    def open(self, identity: Mapping[str, Any], *, resume: bool, overwrite: bool
             ) -> dict[tuple[str, str], dict[str, Any]]:
        """Prepare the folder; returns the saved units (resume) keyed (backend, level)."""
        self.run = open_run(self.out, LAYOUT, identity, resume=resume, overwrite=overwrite)
        with self.run.abandoned_on_error():
            if not self.run.resumed:
                self.units.start()
                return {}
            done = self.units.load(required=("records",))
            self.units.keep(done.values())   # a torn last line must not stay before an append
            return done

    def close(self) -> None:
        """Releases the folder's lock (idempotent)."""
        if self.run is not None:
            self.run.release()

    def put(self, unit: Mapping[str, Any]) -> None:
        """Saves ``unit`` (a dict with 'backend' and 'level'): appended to units.jsonl with an
        fsync when new, else in place of its saved line (the file rewritten whole)."""
        self.units.put(unit)


__all__ = ["BenchStore", "OUTPUT_FILES", "IDENTITY_FILE", "UNITS_FILE", "LAYOUT"]
