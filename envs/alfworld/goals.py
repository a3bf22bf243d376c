"""ALFWorld goal text: masking the placement subgoal (the Actor's goal-masking analysis).

"put a hot mug in cabinet" -> "heat a mug": the goal keeps only its state-change prerequisite
(clean / heat / cool), so an Actor that fails the dependency can be told apart from one that
fails the placement. Used by ``jaxdm.roles.actor`` (variant "goal_masked").
"""
from __future__ import annotations

import re

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
