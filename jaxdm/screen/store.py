"""The output folder of a screening run: written pass by pass, resumable, never overwritten
by accident.

Layout (``out_dir``):

- ``screen.json``: what the run is (judge names, Progress expansion levels, the settings that
  change its results); written first. A folder holding one is a screening run.
- ``trajectories.jsonl``: the screened trajectories; written first.
- ``scores.jsonl``: one row per scored action, appended when a pass finishes.
- ``passes.jsonl``: one record per scored pass (its status and cost stats), appended after
  the pass's rows. Both appends are flushed and fsync'd, so a Ctrl-C, ``kill -9`` or power
  loss loses at most the pass in flight.
- ``summary.json``, ``report.md`` and the PNG figures: written at the end.

A pass's status is ``"ok"`` (every score came back), ``"incomplete"`` (some scores failed, a
share within ``max_failed_share``) or ``"failed"`` (more failed: its judge failed). A score
that failed is a row with ``"score": null``. Resuming keeps every pass whose record and rows
are all there: a *finished* pass (no failed score) as it is, an incomplete or failed one with
its good scores, so that only its failed questions are asked again (``replace`` then puts the
merged pass in place of the old one, both files rewritten atomically). Rows without a record
and a torn last line are dropped, with a message, and those passes run again.

The folder rules (refuse, resume, overwrite, the settings diff, the lock held for the job's
life) are ``jaxdm.rundir``'s; passes.jsonl is its ``UnitLog`` (a pass's done marker); ``close``
releases the lock.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jaxdm.jsonl import append_records, write_atomic, write_records
from jaxdm.rundir import Layout, RunDir, UnitLog, open_run, read_saved
from jaxdm.trajectory import Trajectory, read_jsonl, write_jsonl

__all__ = ["PassResult", "ScreenError", "ScreenStore", "OUTPUT_FILES"]


class ScreenError(ValueError):
    """Bad screening input (file, trajectory line, judge spec, output folder); the CLI exits
    non-zero."""

FIGURES = ("heatmap_hindsight.png", "heatmap_prefix.png", "recall_at_r.png", "rank_shift.png",
           "miss_rate_vs_cost.png")
OUTPUT_FILES = ("screen.json", "trajectories.jsonl", "scores.jsonl", "passes.jsonl",
                "summary.json", "report.md") + FIGURES


@dataclasses.dataclass
class PassResult:
    """One (judge, question, context) pass: per-trajectory scores (NaN = failed) and stats
    (``jaxdm.roles.jobs`` keys, plus ``retried``: questions asked again on resume).
    ``status``: "ok" (nothing failed), "incomplete" (some scores failed, within the run's
    ``max_failed_share``) or "failed" (more failed: the judge failed); ``reason`` says why."""

    judge: str
    question: str
    context: str
    per_traj: list[np.ndarray]
    stats: dict[str, Any]
    status: str = "ok"
    reason: str | None = None

    @property
    def key(self) -> str:
        """The pass's "question/context" name (e.g. "progress/hindsight")."""
        return f"{self.question}/{self.context}"

    @property
    def n_missing(self) -> int:
        """Scores that failed (NaN) in this pass."""
        return int(sum(int(np.sum(~np.isfinite(a))) for a in self.per_traj))

    @property
    def complete(self) -> bool:
        """Every score of the pass came back (nothing to ask again)."""
        return self.n_missing == 0

    def record(self) -> dict[str, Any]:
        """The pass as passes.jsonl stores it: judge, question, context, status, reason and its
        stats (tuples as lists)."""
        stats = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.stats.items()}
        return {"judge": self.judge, "question": self.question, "context": self.context,
                "status": self.status, "reason": self.reason, "stats": stats}


def _flat(identity: Mapping[str, Any]) -> dict[str, Any]:
    """{"settings": {"seed": 0}, "levels": [...]} -> {"seed": 0, "levels": [...]}: the view a
    resume compares."""
    out = {k: v for k, v in identity.items() if k != "settings"}
    out.update(identity.get("settings") or {})
    return out


LAYOUT = Layout("screen.json", OUTPUT_FILES, kind="a screening run", view=_flat)
PASS_FIELDS = ("judge", "question", "context")


class ScreenStore:
    """Opens (fresh, overwrite or resume) and appends to one run's output folder."""

    def __init__(self, out_dir: str | Path):
        self.out = Path(out_dir)
        self.scores = self.out / "scores.jsonl"
        self.pass_log = UnitLog(self.out / "passes.jsonl", PASS_FIELDS, what="screen pass")
        self.passes = self.pass_log.path
        self.identity = self.out / LAYOUT.record
        self.trajectories = self.out / "trajectories.jsonl"
        self.run: RunDir | None = None

    # ---- opening ---------------------------------------------------------------------
    def holds_run(self) -> bool:
        """Whether the folder holds a screen run (its screen.json identity)."""
        return LAYOUT.holds_run(self.out)

    def saved_identity(self) -> dict | None:
        """The saved run identity (screen.json: settings and trajectories' digest), None when there
        is none; an unreadable file is the store's named error."""
        if not self.identity.is_file():
            return None
        try:
            return json.loads(self.identity.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ScreenError(f"{self.identity}: unreadable ({e}); use --overwrite to start "
                              f"again") from None

    def open(self, identity: Mapping[str, Any], trajs: Sequence[Trajectory], *,
             resume: bool, overwrite: bool) -> dict[tuple[str, str], PassResult]:
        """Prepare the folder (``jaxdm.rundir.open_run``: the lock is this job's until
        ``close``); returns the saved passes (resume) keyed (judge, "q/c"): finished ones
        (``complete``) and incomplete / failed ones with their good scores."""
        self.run = open_run(self.out, LAYOUT, dict(identity), resume=resume,
                            overwrite=overwrite)
        with self.run.abandoned_on_error():
            if self.run.resumed:
                return self._resume(trajs)
            write_jsonl(self.trajectories, trajs)
            write_atomic(self.scores, "")
            self.pass_log.start()
            return {}

    def close(self) -> None:
        """Releases the folder's lock (idempotent)."""
        if self.run is not None:
            self.run.release()

    def _resume(self, trajs) -> dict[tuple[str, str], PassResult]:
        if self.trajectories.is_file():
            saved_trajs = read_jsonl(self.trajectories)
            if [t.to_dict() for t in saved_trajs] != [t.to_dict() for t in trajs]:
                raise ScreenError(f"--resume: the trajectories differ from those in "
                                  f"{self.trajectories}")
        else:   # killed between its identity and its trajectories
            write_jsonl(self.trajectories, trajs)
        lengths = [len(t.steps) for t in trajs]
        rows = [r for _, r in read_saved(self.scores)]
        by_pass: dict[tuple, list[dict]] = {}
        for r in rows:
            by_pass.setdefault(tuple(r.get(f) for f in PASS_FIELDS), []).append(r)
        done: dict[tuple, PassResult] = {}
        for key, rec in self.pass_log.load().items():
            got = _restore(rec, by_pass.get(key, []), lengths)
            if got is not None:
                done[key] = got
        dropped = self.pass_log.lines - len(done)   # unfinished, or a record written twice
        n_rows = sum(len(v) for k, v in by_pass.items() if k in done)
        if dropped or n_rows != len(rows):
            _say(f"resume: keeping {len(done)} passes; dropping {dropped} pass record(s) "
                 f"without all their rows and {len(rows) - n_rows} score row(s) of unfinished "
                 "passes (they run again)")
        self.pass_log.keep(p.record() for p in done.values())
        write_records(self.scores, (r for k in done for r in by_pass[k]))
        return {(p.judge, p.key): p for p in done.values()}

    # ---- appending -------------------------------------------------------------------
    def append(self, p: PassResult, trajs: Sequence[Trajectory]) -> None:
        """The pass's rows, then its record (its done marker); each file flushed and fsync'd."""
        append_records(self.scores, pass_rows(p, trajs))
        self.pass_log.mark(p.record())

    def replace(self, p: PassResult, trajs: Sequence[Trajectory]) -> None:
        """Puts pass ``p`` (a saved pass whose failed questions were asked again) in place of
        its saved rows and record: both files rewritten whole (atomically), rows first, so a
        crash in between leaves the merged rows, which a resume reads as they are."""
        key = (p.judge, p.question, p.context)
        rows = [r for _, r in read_saved(self.scores)
                if tuple(r.get(f) for f in PASS_FIELDS) != key]
        write_records(self.scores, rows + list(pass_rows(p, trajs)))
        self.pass_log.put(p.record())


def pass_rows(p: PassResult, trajs: Sequence[Trajectory]) -> Iterable[dict]:
    """scores.jsonl's rows of pass ``p``: one per scored action (judge, question, context,
    trajectory and step index, score or None, action type, task type, action)."""
    for i, arr in enumerate(p.per_traj):
        for t, s in enumerate(arr):
            step = trajs[i].steps[t]
            yield {"judge": p.judge, "question": p.question, "context": p.context, "traj": i,
                   "t": t, "score": None if not math.isfinite(s) else float(s),
                   "action_type": step.action_type, "task_type": trajs[i].task_type,
                   "action": step.action}


def _restore(rec: dict, rows: list[dict], lengths: list[int]) -> PassResult | None:
    """A saved pass from its record and rows (failed scores NaN; its status from the rows:
    "ok" when none failed); None when rows are missing, duplicated or out of range."""
    if rec.get("status") not in ("ok", "incomplete", "failed") or sum(lengths) != len(rows):
        return None
    per_traj = [np.full((n,), np.nan) for n in lengths]
    seen = set()
    for r in rows:
        i, t = r.get("traj"), r.get("t")
        if not (isinstance(i, int) and isinstance(t, int) and 0 <= i < len(lengths)
                and 0 <= t < lengths[i]) or (i, t) in seen:
            return None
        seen.add((i, t))
        if r.get("score") is not None:
            per_traj[i][t] = float(r["score"])
    stats = dict(rec.get("stats") or {})
    if isinstance(stats.get("error_examples"), list):
        stats["error_examples"] = tuple(stats["error_examples"])
    p = PassResult(rec["judge"], rec["question"], rec["context"], per_traj, stats)
    missing = p.n_missing
    stats["requests"] = float(sum(lengths))
    stats["missing"] = float(missing)   # the rows are what was kept
    if missing:
        p.status = "failed" if rec.get("status") == "failed" else "incomplete"
        p.reason = rec.get("reason")
    return p


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
