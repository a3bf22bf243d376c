"""Training lines for a judge: recorded trajectories -> Yes/No questions with annotation labels.

Each trajectory gives one line (its shared context) whose questions are the judge questions of
``jaxdm.roles.judge_requests`` (e.g. Hindsight + Progress) about its actions, labelled from the
environment's annotations: a milestone -> "yes" (the action made progress), a no-op -> "no".
Actions that are neither carry no label we can trust (a move toward the goal, a needless but
state-changing look, ...): they are left out of training and counted in the stats. The line
format is ``jaxdm.train.data``'s, so ``jaxdm train-dm`` trains on it directly.
"""
from __future__ import annotations

from typing import Any, Sequence

from jaxdm.trajectory import Trajectory


def judge_lines(trajectories: Sequence[Trajectory], *, question: str = "progress",
                context: str = "hindsight", split: str = "train"
                ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(lines, stats): one line per trajectory with at least one labelled action."""
    from jaxdm.roles import judge_requests
    lines, stats = [], {"milestone": 0, "no_op": 0, "unlabelled": 0, "trajectories": 0}
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
