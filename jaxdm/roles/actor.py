"""Actor requests: choose the next action among the admissible commands.

Context: goal, past (observation, action) pairs, current observation and remaining budget;
options: the admissible commands; question key ``next_action``. Analysis variants: the goal
without its placement subgoal ("goal_masked", ALFWorld's ``mask_placement_subgoal``), the
dependency hint, and hint + an ordering example.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxdm.decision.types import MultipleChoice
from jaxdm.envs.alfworld.goals import mask_placement_subgoal
from jaxdm.roles.common import PROMPT_VERSION, check_trajectory, entry_line
from jaxdm.trajectory import Step, Trajectory

ACTOR_VARIANTS = ("original", "goal_masked", "hint", "hint_example")
ACTOR_META_KEYS = ("role", "question", "variant", "goal", "remaining_budget", "oracle_answer",
                   "prompt_version")

ACTOR_QUESTION = "Which of the available actions should the agent take next to achieve the goal?"
DEPENDENCY_HINT = "Consider possible dependencies among task requirements."
ORDERING_EXAMPLE = (
    "For example, suppose the goal is to put a hot mug on the table, and the mug is neither "
    "hot nor on the table. The mug has to be heated first (say, in the microwave) and only "
    "then put on the table: putting it on the table first does not complete the goal, "
    "because it still has to be taken back and heated.")
HISTORY_HEADER = ("History (a JSON object per line, oldest first; each entry is an observation "
                  "and the action the agent took after seeing it):")


def actor_context(goal: str, history: Sequence[Any], observation: str,
                  remaining_budget: int) -> str:
    """Goal, past (observation, action) pairs, current observation, remaining budget."""
    lines = [f"Goal: {goal}", HISTORY_HEADER]
    for i, h in enumerate(history):
        if isinstance(h, Step):
            obs, act = h.observation, h.action
        elif isinstance(h, (tuple, list)) and len(h) == 2:
            obs, act = h
        else:
            raise TypeError(f"history[{i}] must be a Step or an (observation, action) pair, "
                            f"got {type(h).__name__}")
        if not isinstance(obs, str) or not isinstance(act, str):
            raise TypeError(f"history[{i}]: observation and action must be strings")
        lines.append(entry_line(obs, act))
    if not history:
        lines.append("(no actions taken yet)")
    lines.append(f"Current observation: {observation}")
    lines.append(f"Remaining action budget: {remaining_budget}")
    return "\n".join(lines)


def actor_question(variant: str = "original") -> str:
    """The actor's next-action question for a prompt ``variant``: the plain question ("original",
    "goal_masked"), with the dependency hint ("hint"), or with the hint and the ordering example
    ("hint_example"); another variant is a ValueError."""
    if variant not in ACTOR_VARIANTS:
        raise ValueError(f"variant must be one of {ACTOR_VARIANTS}, got {variant!r}")
    text = f"[next_action] {ACTOR_QUESTION}"
    if variant in ("hint", "hint_example"):
        text += " " + DEPENDENCY_HINT
    if variant == "hint_example":
        text += " " + ORDERING_EXAMPLE
    return text


def actor_request(goal: str, history: Sequence[Any], observation: str,
                  options: Sequence[str], remaining_budget: int, *, variant: str = "original",
                  masked_goal: str | None = None, oracle_answer: str | None = None,
                  meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """An Actor question: choose the next action among ``options`` (the admissible commands).

    ``variant``: "original"; "goal_masked" (the goal without its placement subgoal, from
    ``masked_goal`` or ``mask_placement_subgoal``); "hint" (appends the dependency hint);
    "hint_example" (hint + an ordering example). History, observation, options and budget are
    identical across variants. ``oracle_answer`` (e.g. an expert's action) goes to meta only.
    """
    if variant not in ACTOR_VARIANTS:
        raise ValueError(f"variant must be one of {ACTOR_VARIANTS}, got {variant!r}")
    if isinstance(remaining_budget, bool) or not isinstance(remaining_budget, int) \
            or remaining_budget < 0:
        raise ValueError(f"remaining_budget must be a non-negative int, got {remaining_budget!r}")
    shown_goal = goal
    if variant == "goal_masked":
        shown_goal = masked_goal if masked_goal is not None else mask_placement_subgoal(goal)
    if oracle_answer is not None and oracle_answer not in options:
        raise ValueError(f"oracle_answer {oracle_answer!r} is not among the options")
    info = {"role": "actor", "question": "next_action", "variant": variant, "goal": goal,
            "remaining_budget": remaining_budget, "oracle_answer": oracle_answer,
            "prompt_version": PROMPT_VERSION}
    info.update(meta or {})
    return MultipleChoice(context=actor_context(shown_goal, history, observation,
                                                remaining_budget),
                          question=actor_question(variant), options=tuple(options), meta=info)


def actor_request_at(traj: Trajectory, t: int, options: Sequence[str], **kwargs) -> MultipleChoice:
    """The Actor question at step ``t`` of a recorded trajectory (history = steps before t)."""
    check_trajectory(traj)
    if not 0 <= t < len(traj.steps):
        raise ValueError(f"t={t} out of range for {len(traj.steps)} steps")
    return actor_request(traj.goal, traj.steps[:t], traj.steps[t].observation, options,
                         traj.budget - t, **kwargs)
