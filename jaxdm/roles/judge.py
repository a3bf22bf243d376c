"""Judge / Teacher requests: a yes/no question about one executed action of a trajectory.

Context: the judging instructions, the goal and the trajectory entries
``{"index", "observation", "action"}`` (v3: every entry carries its zero-based index). Prefix for
target ``t`` shows entries ``0..t`` and ends with the target action; Hindsight shows every entry
plus a final observation-only entry whose action is ``null``. The question (Progress, or Value
from ``jaxdm.roles.value``) names the zero-based target index followed by the quoted target
action text (v3: ``Target action index: 3 ("go to shelf 1").``) and is the same text under every
context. Up to v2 the entries carried no index and the question named the index only, so under
Hindsight a model had to count lines to find the target (README, "A trained judge").

Token-prefix property (what makes shared-prefix scoring cheap): the context text of Prefix(t)
is a character prefix of the Hindsight context of the same trajectory (entries are one JSON
object per line, nothing closes the list), so after tokenisation all judge requests of one
trajectory share their leading tokens, up to at most one boundary token. The fixed judging
instructions open the context (v2), so a Prefix request adds only its short question after the
prefix it sees.

Masking: no reward, success flag or hidden state enters a judge context (only observations and
actions are serialised); a terminal WebShop purchase page becomes the WebShop env's
``TERMINAL_MASK`` ("Shopping process has ended."). Everything a privileged judge (``Oracle``) or
an analysis needs travels in ``meta`` (see ``JUDGE_META_KEYS``), which no model ever sees.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from jaxdm.decision.types import YesNo
from jaxdm.envs.webshop.env import TERMINAL_MASK as WEBSHOP_TERMINAL_OBSERVATION
from jaxdm.registry import Registry
from jaxdm.roles.common import PROMPT_VERSION, check_trajectory, entry_line, quote_action
from jaxdm.roles.value import value_question
from jaxdm.trajectory import Trajectory

CONTEXTS = ("prefix", "hindsight")
# Context expansion for analysis: Prefix + immediate feedback, then a fraction of the rest.
EXPANSIONS = ("fb", 0.25, 0.5, 0.75, 1.0)

# Keys that judge_request puts into YesNo.meta (never shown to a model):
JUDGE_META_KEYS = (
    "role",            # "judge"
    "question",        # "progress" | "value"
    "context",         # "prefix" | "hindsight" | "fb" | "expand_0.25" | ... | "expand_1.0"
    "target",          # zero-based index of the judged action
    "action",          # the judged action text
    "action_type",     # "milestone" | "other" | "no_op" (from Step.annotations)
    "valid",           # Step.valid
    "annotations",     # dict(Step.annotations)
    "success",         # Trajectory.success
    "reward",          # Trajectory.reward
    "n_actions",       # len(trajectory)
    "budget",          # Trajectory.budget
    "task_type",       # Trajectory.task_type
    "env",             # Trajectory.env
    "traj_id",         # Trajectory.metadata["id"] when present, else the traj_id argument
    "prompt_version",  # PROMPT_VERSION
)

TRAJECTORY_HEADER = (
    "Trajectory (a JSON object per line; each entry is its zero-based index, an observation and "
    "the action the agent took after seeing it; an entry with \"action\": null is an "
    "observation with no action after it):"
)
JUDGE_INSTRUCTIONS = (
    "Judge one executed action (the target action) of the agent trajectory below. The "
    "question gives the target's entry index and quotes its action."
)
PROGRESS_QUESTION = "Did the target action help achieve the goal?"


def progress_question(target: int, action: str, remaining_budget: int | None) -> str:
    """The Progress question for action ``target`` (its text quoted after the index; the
    budget is not part of it)."""
    del remaining_budget
    return (f"[progress] {PROGRESS_QUESTION}"
            f"\nTarget action index: {target} ({quote_action(action)}).")


# Question name -> text builder (target, action, remaining_budget); the registry QUESTIONS reads.
QUESTION_BUILDERS: Registry[Callable[[int, str, int | None], str]] = Registry("question")
QUESTION_BUILDERS.register("progress", progress_question)
QUESTION_BUILDERS.register("value", value_question)
QUESTIONS = tuple(QUESTION_BUILDERS)


def _visible_final_observation(traj: Trajectory) -> str:
    if traj.final_observation_terminal:
        return WEBSHOP_TERMINAL_OBSERVATION
    return traj.final_observation


def _observation_after(traj: Trajectory, t: int) -> str:
    """The observation that followed action ``t``, masked when it is WebShop's terminal page."""
    if t + 1 < len(traj.steps):
        return traj.steps[t + 1].observation
    return _visible_final_observation(traj)


def judge_context(traj: Trajectory, last_action: int, *, with_final: bool) -> str:
    """Instructions, goal, entries ``0..last_action``; ``with_final`` adds the next observation
    (action null).

    Prefix(t) is ``judge_context(traj, t, with_final=False)``; Hindsight is
    ``judge_context(traj, T - 1, with_final=True)``. Every such string is a character prefix of
    the Hindsight string up to its last entry line.
    """
    check_trajectory(traj)
    if not 0 <= last_action < len(traj.steps):
        raise ValueError(f"last_action {last_action} out of range for {len(traj.steps)} steps")
    lines = [JUDGE_INSTRUCTIONS, f"Goal: {traj.goal}", TRAJECTORY_HEADER]
    lines += [entry_line(s.observation, s.action, i)
              for i, s in enumerate(traj.steps[:last_action + 1])]
    if with_final:
        lines.append(entry_line(_observation_after(traj, last_action), None, last_action + 1))
    return "\n".join(lines)


def judge_question(question: str, target: int, *, action: str,
                   remaining_budget: int | None) -> str:
    """The question text: identical under Prefix and Hindsight for the same target.

    The question first, the target-specific part (index, quoted action text, budget) last, so
    that requests for different targets of one trajectory share as many leading tokens as
    possible; the judging instructions are at the start of the context, shared by all of them.
    Seed 000 Appendix B.2 names the action by its index only; v3 also quotes its text, and the
    context's entries carry their indices, so the target is found by matching, not counting.
    """
    return QUESTION_BUILDERS.get(question, field="question")(target, action, remaining_budget)


def _expansion_last(traj: Trajectory, t: int, expansion: Any) -> tuple[int, str]:
    """Index of the last visible action and the context label for an expansion variant."""
    n = len(traj.steps)
    if expansion == "fb":
        return t, "fb"
    if isinstance(expansion, bool) or not isinstance(expansion, (int, float)) \
            or expansion not in EXPANSIONS:
        raise ValueError(f"expansion must be None or one of {EXPANSIONS}, got {expansion!r}")
    frac = float(expansion)
    rest = n - 1 - t
    # Round up so every fraction > 0 shows at least one more action when there is one.
    extra = min(rest, math.ceil(frac * rest - 1e-9))
    return t + extra, f"expand_{frac}"


def judge_request(traj: Trajectory, t: int, *, question: str = "progress",
                  context: str = "hindsight", expansion: Any = None,
                  traj_id: Any = None) -> YesNo:
    """One Judge/Teacher request for executed action ``t`` of ``traj``.

    ``context`` is "prefix" (entries 0..t) or "hindsight" (all entries + final observation).
    ``expansion`` (only with context="prefix") widens Prefix for the context-expansion
    analysis: "fb" adds the observation right after the target action; 0.25/0.5/0.75/1.0 add
    that fraction of the remaining actions (rounded up) followed by the observation after the
    last shown action (as an entry with action null). ``expansion=1.0`` equals Hindsight.
    """
    check_trajectory(traj)
    n = len(traj.steps)
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n:
        raise ValueError(f"target {t!r} out of range for a trajectory with {n} actions")
    QUESTION_BUILDERS.validate(question, field="question")
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
    if expansion is not None and context != "prefix":
        raise ValueError(f"expansion={expansion!r} widens the prefix context; use context='prefix'")
    if context == "hindsight":
        text, label = judge_context(traj, n - 1, with_final=True), "hindsight"
    elif expansion is None:
        text, label = judge_context(traj, t, with_final=False), "prefix"
    else:
        last, label = _expansion_last(traj, t, expansion)
        text = judge_context(traj, last, with_final=True)
    step = traj.steps[t]
    remaining = traj.budget - t if question == "value" else None
    meta = {
        "role": "judge", "question": question, "context": label, "target": t,
        "action": step.action, "action_type": step.action_type, "valid": step.valid,
        "annotations": dict(step.annotations), "success": bool(traj.success),
        "reward": float(traj.reward), "n_actions": n, "budget": traj.budget,
        "task_type": traj.task_type, "env": traj.env,
        "traj_id": traj.metadata.get("id", traj_id), "prompt_version": PROMPT_VERSION,
    }
    return YesNo(context=text, meta=meta,
                 question=judge_question(question, t, action=step.action,
                                         remaining_budget=remaining))


def judge_requests(traj: Trajectory, question: str = "progress", context: str = "hindsight", *,
                   expansion: Any = None, traj_id: Any = None) -> list[YesNo]:
    """One request per executed action of ``traj`` (targets 0..T-1, in order)."""
    check_trajectory(traj)
    return [judge_request(traj, t, question=question, context=context, expansion=expansion,
                          traj_id=traj_id) for t in range(len(traj.steps))]
