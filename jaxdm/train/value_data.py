"""Training lines for a value model (seed 001 §4.2): recorded rollouts -> one graded Yes/No
question per interior state, labelled with a value from the environment (the Oracle's
``1 - n/L``, or Monte-Carlo returns of continuations).

``ValueLabeller`` wraps the labelling value model (e.g. ``OracleValueModel``) and keeps every
``ValueQuery`` it is asked, so a caller runs the trainer's own path
(``jaxdm.rl.values.values_signal``: the group summaries, the target rollout left out of its
context) and gets exactly the questions a readout value model is asked at training time,
with their labels. ``value_lines`` turns them into ``jaxdm.train.data`` lines: one line per
rollout, each state's question over its own prefix context (prefixes of one another, so a
line packs into one shared row) with the graded answer V(s_t) in [0, 1].
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from jaxdm.rl.values.models import ValueQuery, ValueResult, value_requests, wrapped_name

__all__ = ["ValueLabeller", "value_lines"]


class ValueLabeller:
    """A value model that answers through ``labeller`` and records what it was asked."""

    def __init__(self, labeller: Any):
        self.name = wrapped_name("labels", labeller, "labeller", "values", "a value model")
        self.labeller = labeller
        self.asked: list[tuple[ValueQuery, ValueResult]] = []

    def values(self, queries: Sequence[ValueQuery]) -> list[ValueResult]:
        """The labeller's values for ``queries`` (one result each, failures included), each
        pair appended to ``asked``."""
        results = self.labeller.values(queries)
        self.asked += list(zip(queries, results))
        return results


def value_lines(asked: Sequence[tuple[ValueQuery, ValueResult]], *, split: str = "train"
                ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(lines, stats) from a ``ValueLabeller``'s record: one line per rollout with at least
    one interior state; a failed label leaves its rollout out (counted), a label outside
    [0, 1] or non-finite is an error."""
    lines, stats = [], {"rollouts": 0, "states": 0, "failed_rollouts": 0}
    for q, res in asked:
        reqs = value_requests(q)
        if not reqs:
            continue
        if not res.ok or res.values is None:
            stats["failed_rollouts"] += 1
            continue
        if len(res.values) != len(reqs):
            raise ValueError(f"rollout {q.ident}: {len(res.values)} labels for "
                             f"{len(reqs)} interior states")
        questions = []
        for r, v in zip(reqs, res.values):
            v = float(v)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"rollout {q.ident}, state {r.meta['state']}: label {v!r} "
                                 "is not a finite value in [0, 1]")
            questions.append({"context": r.context, "question": r.question, "answer": v,
                              "state": r.meta["state"]})
        lines.append({"context": reqs[0].context, "split": split, "questions": questions})
        stats["rollouts"] += 1
        stats["states"] += len(questions)
    return lines, stats
