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
"""
from __future__ import annotations

from typing import Any, Sequence

from jaxdm.trajectory import Trajectory

# How actions that are neither milestone nor no-op are labelled (module docstring).
OTHER_LABELS = ("skip", "either")


def judge_lines(trajectories: Sequence[Trajectory], *, question: str = "progress",
                context: str = "hindsight", split: str = "train", other: str = "skip"
                ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(lines, stats): one line per trajectory with at least one labelled action."""
    from jaxdm.roles import judge_requests
    if other not in OTHER_LABELS:
        raise ValueError(f"other must be one of {sorted(OTHER_LABELS)}, got {other!r}")
    lines = []
    stats = {"milestone": 0, "no_op": 0, "other": 0, "unlabelled": 0, "trajectories": 0}
    for traj in trajectories:
        qs = judge_requests(traj, question=question, context=context)
        items = []
        ctx = None
        for q in qs:
            ann = q.meta.get("annotations") or {}
            if ann.get("milestone"):
                label = "yes"
                stats["milestone"] += 1
            elif ann.get("no_op"):
                label = "no"
                stats["no_op"] += 1
            elif other == "either":
                label = ["yes", "no"]
                stats["other"] += 1
            else:
                stats["unlabelled"] += 1
                continue
            if ctx is not None and q.context != ctx:
                # Prefix contexts differ per action: one line per question then.
                lines.append({"context": q.context, "split": split, "questions": [
                    {"question": q.question, "answer": label, "target": q.meta.get("target")}]})
                continue
            ctx = q.context
            items.append({"question": q.question, "answer": label,
                          "target": q.meta.get("target")})
        if items:
            lines.append({"context": ctx, "split": split, "questions": items})
            stats["trajectories"] += 1
    return lines, stats
