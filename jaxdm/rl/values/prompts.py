"""LVRL prompt text (our wording; the seed's Appendix C gives only the structure).

Versioned like ``jaxdm.roles``' templates. Kept here, next to the code that fills them, so the
LVRL value queries can change without touching the judge prompts.

Token-prefix property: the value-query context of interior state t (``state_context``) is a
character prefix of the context of any later state of the same trajectory (states and actions
are one line each and nothing closes the list), so the YesNo requests of one trajectory share
their leading tokens (group context + trajectory so far) and a ``LocalReadout`` scores all of
them in one packed pass (``jaxdm.decision.shared_prefix``).
"""
from __future__ import annotations

import json
import re

LVRL_PROMPT_VERSION = "jaxdm-lvrl-prompts-v1"

VALUE_INSTRUCTIONS = (
    "Estimate how likely an agent is to complete its task from a given state of its current "
    "attempt. Summaries of the agent's other attempts at the same task, with their outcomes, "
    "show what tends to work.")
GROUP_HEADER = ("Other attempts at this task by the same agent (each step: index. action -> "
                "result), with their outcomes:")
NO_OTHER_ATTEMPTS = "Other attempts at this task: none."
ATTEMPT_HEADER = "Attempt {name} ({outcome} after {n} actions):"
OMITTED = "  ... ({n} steps omitted)"
CURRENT_HEADER = ("Current attempt (state k is what the agent observed before action k; the "
                  "last state has no action yet):")
VALUE_QUESTION = ("[value] Will the task be completed successfully from state {t} within the "
                  "remaining action budget? Remaining action budget: {left}.")
LIST_QUESTION = (
    "For each state 1 to {last} of the current attempt, give the probability that the task "
    "will be completed successfully from that state within the remaining budget (the budget "
    "was {budget} actions). Reply with a JSON list of exactly {n} numbers between 0 and 1, in "
    "state order, and nothing else.")
LIST_SYSTEM = ("You are a value model for agent trajectories. Reply with exactly what the "
               "question asks for and nothing else.")
SUMMARY_SYSTEM = ("You summarise agent trajectories. Reply with exactly what is asked for and "
                  "nothing else.")
SUMMARY_QUESTION = (
    "Goal: {goal}\nTrajectory (one line per step: index, observation before the action, "
    "action, observation after it):\n{lines}\n\nFor every step, write a short description of "
    "the action and its result (at most 15 words). Reply with a JSON list of exactly {n} "
    "strings, in step order, and nothing else.")


def load_json_list(text: str, n: int, what: str = "entries") -> list:
    """The JSON list of exactly ``n`` items a reply to these prompts must be (a ```json fence
    allowed); anything else raises ValueError saying what is wrong. Item types are the
    caller's to check."""
    body = text.strip()
    m = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    body = m.group(1) if m else body
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(data, list):
        raise ValueError(f"expected a JSON list, got {type(data).__name__}")
    if len(data) != n:
        raise ValueError(f"expected {n} {what}, got {len(data)}")
    return data
