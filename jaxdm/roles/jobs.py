"""Decision jobs shared by the screen and the trainer: score every action of a batch.

``score_trajectories`` asks one decision backend (built by ``jaxdm.decision.make_backend``)
the judge question of every executed action of every trajectory (``jaxdm.roles.
judge_requests``), in **one** ``backend.score`` call, and returns the scores as a padded
[B, T] array with a validity mask. Failures never raise: a backend that raises, returns the
wrong number of results, an ``ok=False`` result or a score that is not a finite number in
[0, 1] leaves that score *missing* (mask False); the stats count them and keep the last error
message, so callers decide what a failure rate means (the trainer's
``teacher.max_failed_share``, the screen's report). ``retries``: questions that failed are asked
again (only those, in one call per round) up to that many times before they count as missing.

Stats keys (floats unless noted): ``requests`` (questions asked), ``missing`` (questions
without a usable score), ``errors`` (missing ones that came with an error: an exception
counts every question of the call), ``tokens_in``, ``tokens_out``, ``usd`` (0.0 when no
result is priced; ``priced`` says how many were), ``seconds`` (wall time of the backend call),
``last_error`` (str or None), ``error_examples`` (up to 5 distinct messages, a tuple) and
``retried`` (questions asked again).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import numpy as np

from jaxdm.roles.judge import judge_requests

__all__ = ["TrajectoryScores", "score_trajectories", "judge_request_batch"]

_MAX_EXAMPLES = 5


@dataclasses.dataclass(frozen=True)
class TrajectoryScores:
    """Per-action scores of a batch of trajectories.

    ``scores`` [B, T] float32 (0 where missing or past the end), ``ok`` [B, T] bool (a usable
    score), ``lengths`` [B] int32 (actions asked about per trajectory, ≤ T), ``stats`` (see
    the module docstring).
    """

    scores: np.ndarray
    ok: np.ndarray
    lengths: np.ndarray
    stats: dict[str, Any]

    def per_trajectory(self) -> list[np.ndarray]:
        """Each trajectory's scores as float64 with NaN for a missing one (the screen's form)."""
        out = []
        for i, n in enumerate(self.lengths):
            row = self.scores[i, :n].astype(np.float64)
            row[~self.ok[i, :n]] = np.nan
            out.append(row)
        return out

    @property
    def failure_frac(self) -> float:
        """Share of requests without a usable score (0.0 when nothing was asked)."""
        n = self.stats["requests"]
        return self.stats["missing"] / n if n else 0.0


def judge_request_batch(trajectories: Sequence[Any], *, question: str, context: str,
                        expansion: Any = None, max_actions: int | None = None
                        ) -> tuple[list[Any], list[tuple[int, int]], np.ndarray]:
    """The judge questions of a batch: (requests, (trajectory, action) owner of each, lengths).

    A trajectory without an ``id`` in its metadata is identified by its batch position (the
    Oracle's noise draw depends on it).
    """
    requests, owners = [], []
    lengths = np.zeros((len(trajectories),), np.int32)
    for i, traj in enumerate(trajectories):
        if not traj.steps:
            continue
        kw = {} if expansion is None else {"expansion": expansion}
        reqs = judge_requests(traj, question=question, context=context,
                                    traj_id=traj.metadata.get("id", i), **kw)
        if max_actions is not None:
            reqs = reqs[:max_actions]
        lengths[i] = len(reqs)
        for t, r in enumerate(reqs):
            requests.append(r)
            owners.append((i, t))
    return requests, owners, lengths


def score_trajectories(backend: Any, trajectories: Sequence[Any], *, question: str,
                       context: str, expansion: Any = None, max_actions: int | None = None,
                       retries: int = 0) -> TrajectoryScores:
    """Score every executed action of ``trajectories`` with ``backend`` (one ``score`` call,
    plus one per retry round over the questions that failed).

    ``T`` is ``max_actions`` when given (longer trajectories are cut there), else the longest
    trajectory. ``backend=None`` asks nothing and reports every request missing.
    """
    if max_actions is not None and max_actions < 1:
        raise ValueError(f"max_actions must be >= 1 or None, got {max_actions}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    requests, owners, lengths = judge_request_batch(
        trajectories, question=question, context=context, expansion=expansion,
        max_actions=max_actions)
    b = len(trajectories)
    t_max = max_actions if max_actions is not None else int(lengths.max(initial=0))
    scores = np.zeros((b, t_max), np.float32)
    ok = np.zeros((b, t_max), bool)
    stats: dict[str, Any] = {"requests": float(len(requests)), "missing": 0.0, "errors": 0.0,
                             "tokens_in": 0.0, "tokens_out": 0.0, "usd": 0.0, "priced": 0.0,
                             "seconds": 0.0, "last_error": None, "error_examples": (),
                             "retried": 0.0}
    if not requests:
        return TrajectoryScores(scores, ok, lengths, stats)
    if backend is None:
        stats["missing"] = float(len(requests))
        return TrajectoryScores(scores, ok, lengths, stats)
    examples: list[str] = []

    def note(msg: str) -> None:
        stats["last_error"] = msg[:300]
        if msg[:300] not in examples and len(examples) < _MAX_EXAMPLES:
            examples.append(msg[:300])

    pending = list(range(len(requests)))
    for round_ in range(retries + 1):
        if round_:
            stats["retried"] += len(pending)
        pending, errors = _score_round(backend, requests, owners, pending, scores, ok, stats,
                                       note)
        if not pending:
            break
    stats["missing"] = float(len(pending))
    stats["errors"] = float(errors)
    stats["error_examples"] = tuple(examples)
    return TrajectoryScores(scores, ok, lengths, stats)


def _score_round(backend, requests, owners, pending, scores, ok, stats, note
                 ) -> tuple[list[int], int]:
    """Asks the ``pending`` questions in one call; fills the usable scores; returns the ones
    still without a score and how many of those came with an error."""
    asked = [requests[k] for k in pending]
    t0 = time.perf_counter()
    try:
        results = backend.score(asked)
        if len(results) != len(asked):
            raise RuntimeError(f"backend {getattr(backend, 'name', backend)!r} returned "
                               f"{len(results)} results for {len(asked)} questions")
    except Exception as e:  # noqa: BLE001 - a scoring failure is counted, never fatal
        stats["seconds"] += time.perf_counter() - t0
        note(f"{type(e).__name__}: {e}")
        return pending, len(pending)
    stats["seconds"] += time.perf_counter() - t0
    still, errors = [], 0
    for k, r in zip(pending, results):
        i, t = owners[k]
        cost = getattr(r, "cost", None)
        if cost is not None:
            stats["tokens_in"] += cost.tokens_in
            stats["tokens_out"] += cost.tokens_out
            if cost.usd is not None:
                stats["usd"] += cost.usd
                stats["priced"] += 1
        s = getattr(r, "score", None)
        if getattr(r, "ok", False) and s is not None and math.isfinite(s) and 0.0 <= s <= 1.0:
            scores[i, t], ok[i, t] = s, True
            continue
        still.append(k)
        err = getattr(r, "error", None)
        if not getattr(r, "ok", False) and err:
            errors += 1
            note(str(err))
        elif getattr(r, "ok", False):
            note(f"score {s!r} is not a finite number in [0, 1]")
    return still, errors
