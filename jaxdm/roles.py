"""Roles and prompts: every prompt text jaxdm shows a decision model, as versioned templates.

A role turns environment data into typed questions (``jaxdm.decision.types``):

- **Actor** (``actor_request``): goal, past (observation, action) pairs, current observation and
  remaining budget; options are the admissible commands; question key ``next_action``.
- **Judge / Teacher** (``judge_request`` / ``judge_requests``): the judging instructions, the
  goal and the trajectory entries ``{"observation", "action"}``. Prefix for target ``t`` shows
  entries ``0..t`` and ends with the target action; Hindsight shows every entry plus a final
  observation-only entry whose action is ``null``. The question (Value or Progress) names the
  zero-based target index and is the same text under every context.

A backend then *renders* a question for its interface (``render_messages``): a system prompt
saying how to answer plus one user message with a Context section, a Question section, the
labelled options (Actor, constrained interface only) and, for constrained readout, a final
``Answer:``. The structure follows seed 000 (Appendix B); the wording is ours.

Token-prefix property (what makes shared-prefix scoring cheap): the user message starts with
the context, and the context text of Prefix(t) is a character prefix of the Hindsight context
of the same trajectory (entries are one JSON object per line, nothing closes the list). So
after tokenisation all judge requests of one trajectory share their leading tokens, up to at
most one boundary token, and ``jaxdm.decision.shared_prefix`` finds and reuses that prefix.
What follows the shared part is kept short: the fixed judging instructions open the context
(v2; v1 repeated them in every question), so a Prefix request adds only its ~30-50-token
question (with the chat template's tail) after the prefix it sees, and a Hindsight request
only the target index and budget.

Masking: no reward, success flag or hidden state enters a judge context (only observations
and actions are serialised); a terminal WebShop purchase page becomes
``"Shopping process has ended."``. Everything a privileged judge (``Oracle``) or an analysis
needs travels in ``meta`` (see ``JUDGE_META_KEYS``), which no model ever sees.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Sequence

from jaxdm.decision.types import MultipleChoice, YesNo
from jaxdm.trajectory import Step, Trajectory

PROMPT_VERSION = "jaxdm-prompts-v2"

QUESTIONS = ("progress", "value")
CONTEXTS = ("prefix", "hindsight")
# Context expansion for analysis: Prefix + immediate feedback, then a fraction of the rest.
EXPANSIONS = ("fb", 0.25, 0.5, 0.75, 1.0)
ACTOR_VARIANTS = ("original", "goal_masked", "hint", "hint_example")
INTERFACES = ("constrained", "prompted", "likelihood")

WEBSHOP_TERMINAL_OBSERVATION = "Shopping process has ended."

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
ACTOR_META_KEYS = ("role", "question", "variant", "goal", "remaining_budget", "oracle_answer",
                   "prompt_version")

# ---- templates (our wording) ----------------------------------------------------------------

_TRAJECTORY_HEADER = (
    "Trajectory (a JSON object per line, indexed from 0; each entry is an observation and the "
    "action the agent took after seeing it; an entry with \"action\": null is an observation "
    "with no action after it):"
)
_JUDGE_INSTRUCTIONS = (
    "Judge one executed action (the target action) of the agent trajectory below. The "
    "target index is zero-based and refers to the trajectory entries shown."
)
_PROGRESS_QUESTION = "Did the target action help achieve the goal?"
_VALUE_QUESTION = "Will the task be completed successfully within the remaining action budget?"
_ACTOR_QUESTION = "Which of the available actions should the agent take next to achieve the goal?"
DEPENDENCY_HINT = "Consider possible dependencies among task requirements."
ORDERING_EXAMPLE = (
    "For example, suppose the goal is to put a hot mug on the table, and the mug is neither "
    "hot nor on the table. The mug has to be heated first (say, in the microwave) and only "
    "then put on the table: putting it on the table first does not complete the goal, "
    "because it still has to be taken back and heated.")

SYSTEM_PROMPTS: Mapping[tuple[str, str], str] = {
    ("choice", "constrained"): (
        "You are a decision model. Read the context and the question, then answer with the "
        "single letter of the best option and nothing else."),
    ("choice", "prompted"): (
        "You are a decision model. Read the context and the question, then reply with one "
        "JSON object and nothing else, of the form {\"choice\": \"<letter>\", "
        "\"probabilities\": {\"<letter>\": <probability>, ...}}, giving a probability to "
        "every option letter; the probabilities sum to 1."),
    ("choice", "likelihood"): (
        "You are a decision model. Read the context and the question, then reply with the "
        "chosen action exactly as written among the candidates."),
    ("yesno", "constrained"): (
        "You are a decision model. Read the context and the question, then answer with a "
        "single word, Yes or No."),
    ("yesno", "prompted"): (
        "You are a decision model. Read the context and the question, then reply with one "
        "JSON object and nothing else, of the form {\"score\": <number between 0 and 1>}, "
        "where the score is your probability that the answer is yes."),
}

LABELS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
YES_NO = ("Yes", "No")


# ---- serialisation --------------------------------------------------------------------------

def _entry(observation: str, action: str | None) -> str:
    return json.dumps({"observation": observation, "action": action}, ensure_ascii=False)


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
    _check_traj(traj)
    if not 0 <= last_action < len(traj.steps):
        raise ValueError(f"last_action {last_action} out of range for {len(traj.steps)} steps")
    lines = [_JUDGE_INSTRUCTIONS, f"Goal: {traj.goal}", _TRAJECTORY_HEADER]
    lines += [_entry(s.observation, s.action) for s in traj.steps[:last_action + 1]]
    if with_final:
        lines.append(_entry(_observation_after(traj, last_action), None))
    return "\n".join(lines)


def judge_question(question: str, target: int, *, remaining_budget: int | None) -> str:
    """The question text: identical under Prefix and Hindsight for the same target.

    The question first, the target-specific part (index, budget) last, so that requests for
    different targets of one trajectory share as many leading tokens as possible (the action
    is named by its index only, as in seed 000 Appendix B.2); the judging instructions are at
    the start of the context, shared by all of them.
    """
    if question == "progress":
        return (f"[progress] {_PROGRESS_QUESTION}"
                f"\nTarget action index: {target}.")
    if question == "value":
        if remaining_budget is None:
            raise ValueError("the value question needs remaining_budget")
        return (f"[value] {_VALUE_QUESTION}"
                f"\nTarget action index: {target}. Remaining action budget, counting the "
                f"target action: {remaining_budget}.")
    raise ValueError(f"question must be one of {QUESTIONS}, got {question!r}")


def _check_traj(traj: Any) -> None:
    if not isinstance(traj, Trajectory):
        raise TypeError(f"expected a jaxdm.trajectory.Trajectory, got {type(traj).__name__}")
    if not traj.steps:
        raise ValueError("trajectory has no executed actions to judge")


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
    _check_traj(traj)
    n = len(traj.steps)
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n:
        raise ValueError(f"target {t!r} out of range for a trajectory with {n} actions")
    if question not in QUESTIONS:
        raise ValueError(f"question must be one of {QUESTIONS}, got {question!r}")
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
                 question=judge_question(question, t, remaining_budget=remaining))


def judge_requests(traj: Trajectory, question: str = "progress", context: str = "hindsight", *,
                   expansion: Any = None, traj_id: Any = None) -> list[YesNo]:
    """One request per executed action of ``traj`` (targets 0..T-1, in order)."""
    _check_traj(traj)
    return [judge_request(traj, t, question=question, context=context, expansion=expansion,
                          traj_id=traj_id) for t in range(len(traj.steps))]


# ---- Actor ----------------------------------------------------------------------------------

_MASK_PATTERNS = (
    # "put a hot mug in cabinet" / "put a heated mug on the side table" -> "heat a mug"
    (re.compile(r"^\s*put (?P<det>an?|some) (?P<adj>hot|heated|clean|cleaned|cool|cooled|cold) "
                r"(?P<obj>.+?) (?:in|on|into|onto|in/on) .+$", re.I), None),
    # "heat some mug and put it in cabinet" -> "heat some mug"
    (re.compile(r"^\s*(?P<verb>heat|clean|cool) (?P<rest>.+?) and put (?:it|them) "
                r"(?:in|on|into|onto|in/on) .+$", re.I), "verb"),
)
_ADJ_TO_VERB = {"hot": "heat", "heated": "heat", "clean": "clean", "cleaned": "clean",
                "cool": "cool", "cooled": "cool", "cold": "cool"}


def mask_placement_subgoal(goal: str) -> str:
    """Drop the placement subgoal of an ALFWorld clean/heat/cool goal.

    "put a hot mug in cabinet" -> "heat a mug"; "clean some cloth and put it in drawer" ->
    "clean some cloth". Goals without a state-change prerequisite raise a ValueError.
    """
    text = goal.strip().rstrip(".")
    lead = ""
    if text.lower().startswith("your task is to:"):
        lead, text = text[:len("your task is to:")] + " ", text[len("your task is to:"):].strip()
    m = _MASK_PATTERNS[0][0].match(text)
    if m:
        return f"{lead}{_ADJ_TO_VERB[m['adj'].lower()]} {m['det']} {m['obj']}"
    m = _MASK_PATTERNS[1][0].match(text)
    if m:
        return f"{lead}{m['verb']} {m['rest']}"
    raise ValueError(f"goal {goal!r} has no clean/heat/cool prerequisite to keep; goal masking "
                     "applies to ALFWorld tasks with a dependency")


def actor_context(goal: str, history: Sequence[Any], observation: str,
                  remaining_budget: int) -> str:
    """Goal, past (observation, action) pairs, current observation, remaining budget."""
    lines = [f"Goal: {goal}",
             "History (a JSON object per line, oldest first; each entry is an observation and "
             "the action the agent took after seeing it):"]
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
        lines.append(_entry(obs, act))
    if not history:
        lines.append("(no actions taken yet)")
    lines.append(f"Current observation: {observation}")
    lines.append(f"Remaining action budget: {remaining_budget}")
    return "\n".join(lines)


def actor_question(variant: str = "original") -> str:
    if variant not in ACTOR_VARIANTS:
        raise ValueError(f"variant must be one of {ACTOR_VARIANTS}, got {variant!r}")
    text = f"[next_action] {_ACTOR_QUESTION}"
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
    _check_traj(traj)
    if not 0 <= t < len(traj.steps):
        raise ValueError(f"t={t} out of range for {len(traj.steps)} steps")
    return actor_request(traj.goal, traj.steps[:t], traj.steps[t].observation, options,
                         traj.budget - t, **kwargs)


# ---- rendering for an interface ---------------------------------------------------------

def labels_for(n_options: int) -> tuple[str, ...]:
    """Option labels A, B, C, ...; more options than labels is an error (see LocalReadout)."""
    if n_options > len(LABELS):
        raise ValueError(f"{n_options} options but only {len(LABELS)} single-letter labels; "
                         "use the likelihood interface or split the options")
    return LABELS[:n_options]


def user_message(q: MultipleChoice | YesNo, interface: str) -> str:
    """The user message: Context, Question, labelled options (constrained/prompted choice)."""
    if interface not in INTERFACES:
        raise ValueError(f"interface must be one of {INTERFACES}, got {interface!r}")
    parts = [f"Context:\n{q.context}", f"Question:\n{q.question}"]
    if isinstance(q, MultipleChoice):
        if interface == "likelihood":
            parts.append("Available actions:\n" + "\n".join(f"- {o}" for o in q.options))
        else:
            labels = labels_for(len(q.options))
            parts.append("Available options:\n" + "\n".join(
                f"{lab}. {opt}" for lab, opt in zip(labels, q.options)))
    elif not isinstance(q, YesNo):
        raise TypeError(f"expected MultipleChoice or YesNo, got {type(q).__name__}")
    elif interface == "likelihood":
        raise ValueError("the likelihood interface scores MultipleChoice options, not YesNo")
    text = "\n\n".join(parts)
    if interface == "constrained":
        text += "\n\nAnswer:"
    return text


def render_messages(q: MultipleChoice | YesNo, interface: str = "constrained") -> list[dict]:
    """Chat messages [system, user] for ``q`` under ``interface``."""
    kind = "choice" if isinstance(q, MultipleChoice) else "yesno"
    return [{"role": "system", "content": SYSTEM_PROMPTS[(kind, interface)]},
            {"role": "user", "content": user_message(q, interface)}]


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """A plain-text prompt for completion endpoints without a chat template."""
    out = []
    for m in messages:
        out.append(f"### {m['role'].capitalize()}\n{m['content']}")
    out.append("### Assistant\n")
    return "\n\n".join(out)
