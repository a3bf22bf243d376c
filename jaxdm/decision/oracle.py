"""Oracle: a privileged judge that answers from environment annotations, not from text.

It reads ``YesNo.meta`` / ``MultipleChoice.meta`` as filled by ``jaxdm.roles``:

- Progress (meta["question"] == "progress"): ``levels["milestone"]`` for a milestone action,
  ``levels["no_op"]`` for a no-op (or an invalid action), ``levels["other"]`` otherwise. It
  separates milestones from no-ops within a trajectory.
- Value (meta["question"] == "value"): follows the trajectory outcome (meta["success"]):
  ``levels["success"]`` or ``levels["failure"]`` for every action of the trajectory, so
  within a trajectory Value does not separate milestones from no-ops (seed 000, Section 3.2.1).
- Actor (MultipleChoice with meta["oracle_answer"]): probability ``1 - noise`` style
  preference for that option (see ``choose``).

Noise: Gaussian with standard deviation ``noise`` added to each score (clipped to [0, 1]); the
draw for one question depends only on ``seed`` and the question's identity (traj_id, target,
question, context), not on batch order, so results are reproducible in any batching.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdm.decision.types import (ChoiceResult, Cost, MultipleChoice, ScoreResult, YesNo,
                                  choice_ok, score_ok)

DEFAULT_LEVELS = {"milestone": 0.9, "other": 0.5, "no_op": 0.1, "success": 0.8, "failure": 0.2}


def _stable_seed(*parts: Any) -> int:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class Oracle:
    """Answers Progress/Value from annotations; optional seeded noise. See module docstring."""

    def __init__(self, noise: float = 0.0, seed: int = 0,
                 levels: Mapping[str, float] | None = None):
        if not (isinstance(noise, (int, float)) and np.isfinite(noise) and noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
        self.noise = float(noise)
        self.seed = int(seed)
        self.levels = dict(DEFAULT_LEVELS)
        for k, v in (levels or {}).items():
            if k not in DEFAULT_LEVELS:
                raise ValueError(f"unknown Oracle level {k!r}; known: {sorted(DEFAULT_LEVELS)}")
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"Oracle level {k}={v} is outside [0, 1]")
            self.levels[k] = float(v)
        self.name = f"oracle(noise={self.noise:g},seed={self.seed})"

    def _noise(self, *identity: Any) -> float:
        if self.noise == 0.0:
            return 0.0
        rng = np.random.default_rng(_stable_seed(self.seed, *identity))
        return float(rng.normal(0.0, self.noise))

    def _clean_score(self, meta: Mapping[str, Any], where: str) -> float:
        question = meta.get("question")
        if question == "progress":
            ann = meta.get("annotations")
            if ann is None and "action_type" not in meta:
                raise ValueError(f"{where}: Oracle progress needs meta['annotations'] or "
                                 "meta['action_type'] (build requests with jaxdm.roles)")
            ann = ann or {}
            kind = meta.get("action_type") or (
                "milestone" if ann.get("milestone") else "no_op" if ann.get("no_op") else "other")
            if kind == "other" and meta.get("valid") is False:
                kind = "no_op"
            if kind not in ("milestone", "other", "no_op"):
                raise ValueError(f"{where}: unknown action_type {kind!r}")
            return self.levels[kind]
        if question == "value":
            if "success" not in meta:
                raise ValueError(f"{where}: Oracle value needs meta['success']")
            return self.levels["success" if meta["success"] else "failure"]
        raise ValueError(f"{where}: Oracle answers meta['question'] in ('progress', 'value'), "
                         f"got {question!r}")

    def score(self, questions: Sequence[YesNo]) -> list[ScoreResult]:
        """Score each YesNo question from its annotations (meta['question'] 'progress': the action
        type's level; 'value': the trajectory's success), plus Gaussian noise seeded by the
        question's identity, clipped to [0, 1]; a question that is not a YesNo is a TypeError,
        missing annotations a ValueError."""
        out = []
        for i, q in enumerate(questions):
            if not isinstance(q, YesNo):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected YesNo")
            t0 = time.perf_counter()
            base = self._clean_score(q.meta, f"questions[{i}]")
            ident = (q.meta.get("traj_id"), q.meta.get("target"), q.meta.get("question"),
                     q.meta.get("context"), q.context, q.question)
            s = float(np.clip(base + self._noise(*ident), 0.0, 1.0))
            out.append(score_ok(s, cost=Cost(seconds=time.perf_counter() - t0)))
        return out

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """Puts ``1 - noise`` (at least 1/n) on meta['oracle_answer'], the rest spread evenly.

        With noise > 0 the preferred option is swapped for a uniformly drawn one with
        probability ``noise`` (seeded per question), which is what a noisy expert looks like.
        """
        out = []
        for i, q in enumerate(questions):
            if not isinstance(q, MultipleChoice):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected MultipleChoice")
            answer = q.meta.get("oracle_answer")
            if answer is None:
                raise ValueError(f"questions[{i}]: Oracle.choose needs meta['oracle_answer']")
            if answer not in q.options:
                raise ValueError(f"questions[{i}]: oracle_answer {answer!r} not among options")
            n = len(q.options)
            best = q.options.index(answer)
            if self.noise > 0:
                rng = np.random.default_rng(_stable_seed(self.seed, q.context, q.question,
                                                         q.options))
                if rng.random() < min(self.noise, 1.0):
                    best = int(rng.integers(n))
            top = max(1.0 - min(self.noise, 1.0), 1.0 / n) if n > 1 else 1.0
            probs = [(1.0 - top) / (n - 1) if j != best else top for j in range(n)] if n > 1 \
                else [1.0]
            out.append(choice_ok(probs))
        return out
