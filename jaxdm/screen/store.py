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

The folder is locked for the job's life (``jaxdm.rundir.lock_run_dir``): a second job on it
fails at once naming the folder and the other process; ``close`` releases it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jaxdm.jsonl import append_records, read_records, write_atomic, write_records
from jaxdm.rundir import listed_files, lock_run_dir
from jaxdm.secrets import redact
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


class ScreenStore:
    """Opens (fresh, overwrite or resume) and appends to one run's output folder."""

    def __init__(self, out_dir: str | Path):
        self.out = Path(out_dir)
        self.scores = self.out / "scores.jsonl"
        self.passes = self.out / "passes.jsonl"
        self.identity = self.out / "screen.json"
        self.trajectories = self.out / "trajectories.jsonl"

    # ---- opening ---------------------------------------------------------------------
    def holds_run(self) -> bool:
        """Whether the folder holds a screen run (its screen.json identity)."""
        return self.identity.is_file()

    def saved_identity(self) -> dict | None:
        """The saved run identity (screen.json: settings and trajectories' digest), None when there
        is none; an unreadable file is the store's named error."""
        if not self.identity.is_file():
            return None
        try:
            return json.loads(self.identity.read_text(encoding="utf-8"))
        except ValueError as e:
            raise _error(f"{self.identity}: unreadable ({e}); use --overwrite to start again")

    def open(self, identity: Mapping[str, Any], trajs: Sequence[Trajectory], *,
             resume: bool, overwrite: bool) -> dict[tuple[str, str], PassResult]:
        """Prepare the folder; returns the saved passes (resume) keyed (judge, "q/c"):
        finished ones (``complete``) and incomplete / failed ones with their good scores."""
        if resume and overwrite:
            raise _error("--resume and --overwrite exclude each other")
        if self.out.exists() and not self.out.is_dir():
            raise _error(f"output folder {self.out} is a file")
        # the folder is this job's until it ends (a second job on it fails here, at once)
        self.lock = lock_run_dir(self.out)
        try:
            return self._open(identity, trajs, resume=resume, overwrite=overwrite)
        except BaseException:
            self.lock.abandon()
            raise

    def close(self) -> None:
        """Releases the folder's lock (idempotent)."""
        lock = getattr(self, "lock", None)
        if lock is not None:
            lock.release()

    def _open(self, identity, trajs, *, resume: bool, overwrite: bool):
        # compare in its saved form: JSON, with URL credentials redacted as the writer does
        identity = json.loads(redact(json.dumps(dict(identity))))
        existing = listed_files(self.out)
        if resume and self.holds_run():
            return self._resume(identity, trajs)
        if existing and not overwrite:
            if resume:
                raise _error(f"--resume: {self.out} holds no screening run (no screen.json) but "
                             f"is not empty ({', '.join(existing[:5])}); choose another --out")
            what = "a screening run" if self.holds_run() else "files"
            raise _error(f"output folder {self.out} already holds {what} "
                         f"({', '.join(existing[:5])}{', ...' if len(existing) > 5 else ''}); "
                         "pass --resume to continue it or --overwrite to replace it")
        if overwrite:
            for name in OUTPUT_FILES:  # only our own files: never a user's folder wholesale
                (self.out / name).unlink(missing_ok=True)
        write_jsonl(self.trajectories, trajs)
        write_atomic(self.identity, json.dumps(dict(identity), indent=1))
        write_atomic(self.scores, "")
        write_atomic(self.passes, "")
        return {}

    def _resume(self, identity, trajs) -> dict[tuple[str, str], PassResult]:
        saved = self.saved_identity()
        flat_saved, flat_now = _flat(saved), _flat(identity)
        changed = [k for k in sorted(set(flat_saved) | set(flat_now))
                   if flat_saved.get(k) != flat_now.get(k)]
        if changed:
            parts = [f"{k} (saved {_short(flat_saved.get(k))}, now {_short(flat_now.get(k))})"
                     for k in changed]
            raise _error(f"--resume: {self.out} holds a run with different settings: "
                         f"{'; '.join(parts)}; resume with the same settings, or use "
                         "--overwrite / another --out")
        if self.trajectories.is_file():
            saved_trajs = read_jsonl(self.trajectories)
            if [t.to_dict() for t in saved_trajs] != [t.to_dict() for t in trajs]:
                raise _error(f"--resume: the trajectories differ from those in {self.trajectories}")
        else:
            write_jsonl(self.trajectories, trajs)
        lengths = [len(t.steps) for t in trajs]
        records = _read_lines(self.passes)
        rows = _read_lines(self.scores)
        by_pass: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            by_pass.setdefault((r.get("judge"), f"{r.get('question')}/{r.get('context')}"),
                               []).append(r)
        done: dict[tuple[str, str], PassResult] = {}
        dropped = 0
        for rec in records:
            key = (rec.get("judge"), f"{rec.get('question')}/{rec.get('context')}")
            got = _restore(rec, by_pass.get(key, []), lengths)
            if got is None:
                dropped += 1
                continue
            if key in done:   # a record written twice: the later one holds
                dropped += 1
            done[key] = got
        n_rows = sum(len(v) for k, v in by_pass.items() if k in done)
        if dropped or n_rows != len(rows):
            _say(f"resume: keeping {len(done)} passes; dropping {dropped} pass record(s) "
                 f"without all their rows and {len(rows) - n_rows} score row(s) of unfinished "
                 "passes (they run again)")
        write_records(self.passes, (done[k].record() for k in done))
        write_records(self.scores, (r for k in done for r in by_pass[k]))
        return done

    # ---- appending -------------------------------------------------------------------
    def append(self, p: PassResult, trajs: Sequence[Trajectory]) -> None:
        """The pass's rows, then its record; each file flushed and fsync'd."""
        append_records(self.scores, pass_rows(p, trajs))
        append_records(self.passes, [p.record()])

    def replace(self, p: PassResult, trajs: Sequence[Trajectory]) -> None:
        """Puts pass ``p`` (a saved pass whose failed questions were asked again) in place of
        its saved rows and record: both files rewritten whole (atomically), rows first, so a
        crash in between leaves the merged rows, which a resume reads as they are."""
        def other(r):
            return (r.get("judge"), r.get("question"), r.get("context")) != (
                p.judge, p.question, p.context)
        rows = [r for r in _read_lines(self.scores) if other(r)]
        write_records(self.scores, rows + list(pass_rows(p, trajs)))
        recs = [r for r in _read_lines(self.passes) if other(r)]
        write_records(self.passes, recs + [p.record()])


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


def _read_lines(path: Path) -> list[dict]:
    """JSON objects of ``path``'s lines; a torn last line (a write cut short) is dropped with a
    message, a bad line elsewhere is an error naming it."""
    if not path.is_file():
        return []
    try:
        records = read_records(path, drop_torn_tail=True)
    except ValueError as e:
        raise _error(f"{e}; use --overwrite to start again") from None
    for where, rec in records:
        if not isinstance(rec, dict):
            raise _error(f"{where}: expected a JSON object, got {type(rec).__name__}; use "
                         f"--overwrite to start again")
    return [rec for _, rec in records]


def _flat(identity: Mapping[str, Any]) -> dict[str, Any]:
    """{"settings": {"seed": 0}, "levels": [...]} -> {"seed": 0, "levels": [...]}."""
    out = {k: v for k, v in identity.items() if k != "settings"}
    out.update(identity.get("settings") or {})
    return out


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _error(msg: str) -> ScreenError:
    return ScreenError(msg)
