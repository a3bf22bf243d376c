"""Training lines for a judge: recorded trajectories -> Yes/No questions with annotation labels.

Each trajectory gives one line (its shared context) whose questions are the judge questions of
``jaxdm.roles.judge_requests`` (e.g. Hindsight + Progress) about its actions, labelled from the
environment's annotations: a milestone -> "yes" (the action made progress), a no-op -> "no".
Actions that are neither (a move toward the goal, taking an object the task does not need, ...)
have no Yes/No answer we can trust, but they do sit between the two in the ranking a judge is
screened on (milestones highest, no-ops lowest). ``other="skip"`` leaves them out (counted in
the stats); ``other="either"`` labels them ``["yes", "no"]`` (a 0.5 target), so the judge
learns the whole ranking and not only milestone-vs-no-op, and a no-op must score below every
state-changing action. The line format is ``jaxdm.train.data``'s, so ``jaxdm train-dm`` trains
on it directly.

``class_weights`` gives each label kind ("milestone", "no_op", "other") a loss weight (the
question's ``weight``): ``"balanced"`` weighs each kind by n / (kinds · n_kind) over the
labelled questions of the batch, so a rare kind (no-ops: about 1 in 9 actions of the noisy
expert's trajectories) counts as much as a common one, and the weights average 1.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from jaxdm.roles import judge_requests
from jaxdm.trajectory import Trajectory

# How actions that are neither milestone nor no-op are labelled (module docstring).
OTHER_LABELS = ("skip", "either")


LABEL_KINDS = ("milestone", "no_op", "other")


def judge_lines(trajectories: Sequence[Trajectory], *, question: str = "progress",
                context: str = "hindsight", split: str = "train", other: str = "skip",
                class_weights: str | Mapping[str, float] | None = None
                ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(lines, stats): one line per trajectory with at least one labelled action.
    ``class_weights``: None (every question weight 1), "balanced" or {kind: weight} (module
    docstring); the weights used are in ``stats["weights"]``."""
    if other not in OTHER_LABELS:
        raise ValueError(f"other must be one of {sorted(OTHER_LABELS)}, got {other!r}")
    if class_weights is not None and class_weights != "balanced":
        if not isinstance(class_weights, Mapping):
            raise ValueError(f"class_weights must be None, 'balanced' or a mapping of "
                             f"{list(LABEL_KINDS)} to weights, got {class_weights!r}")
        unknown = sorted(set(class_weights) - set(LABEL_KINDS))
        if unknown:
            raise ValueError(f"class_weights: unknown label kind(s) {unknown}; known: "
                             f"{list(LABEL_KINDS)}")
        for k, w in class_weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or \
                    not math.isfinite(w) or w <= 0:
                raise ValueError(f"class_weights[{k!r}] must be a finite number > 0, got {w!r}")
    lines = []
    stats = {"milestone": 0, "no_op": 0, "other": 0, "unlabelled": 0, "trajectories": 0}
    for traj in trajectories:
        qs = judge_requests(traj, question=question, context=context)
        items = []
        ctx = None
        for q in qs:
            ann = q.meta.get("annotations") or {}
            if ann.get("milestone"):
                label, kind = "yes", "milestone"
            elif ann.get("no_op"):
                label, kind = "no", "no_op"
            elif other == "either":
                label, kind = ["yes", "no"], "other"
            else:
                stats["unlabelled"] += 1
                continue
            stats[kind] += 1
            entry = {"question": q.question, "answer": label, "target": q.meta.get("target"),
                     "kind": kind}
            if ctx is not None and q.context != ctx:
                # Prefix contexts differ per action: one line per question then.
                lines.append({"context": q.context, "split": split, "questions": [entry]})
                continue
            ctx = q.context
            items.append(entry)
        if items:
            lines.append({"context": ctx, "split": split, "questions": items})
            stats["trajectories"] += 1
    weights = _class_weights(class_weights, stats)
    for line in lines:
        for entry in line["questions"]:
            kind = entry.pop("kind")
            if weights is not None:
                entry["weight"] = weights[kind]
    if weights is not None:
        stats["weights"] = weights
    return lines, stats


def _class_weights(class_weights, counts: Mapping[str, int]) -> dict[str, float] | None:
    """{kind: weight} for the labelled kinds (module docstring), or None for unweighted."""
    if class_weights is None:
        return None
    if class_weights == "balanced":
        present = [k for k in LABEL_KINDS if counts[k]]
        total = sum(counts[k] for k in present)
        return {k: (total / (len(present) * counts[k]) if counts[k] else 1.0)
                for k in LABEL_KINDS}
    return {k: float(class_weights.get(k, 1.0)) for k in LABEL_KINDS}
