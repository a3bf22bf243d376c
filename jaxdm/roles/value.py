"""The Value question: will the task still succeed from here, within the remaining budget?

Asked by a Judge / Teacher about an executed action (``jaxdm.roles.judge``, question "value")
and, with the Prefix context at every action, it gives the state values of a trajectory that
LVRL's value-difference advantages use. The remaining budget counts the target action itself.
"""
from __future__ import annotations

from jaxdm.roles.common import quote_action

VALUE_QUESTION = "Will the task be completed successfully within the remaining action budget?"


def value_question(target: int, action: str, remaining_budget: int | None) -> str:
    """The Value question for action ``target`` (zero-based, its text quoted after the index)
    with ``remaining_budget`` left."""
    if remaining_budget is None:
        raise ValueError("the value question needs remaining_budget")
    return (f"[value] {VALUE_QUESTION}"
            f"\nTarget action index: {target} ({quote_action(action)}). Remaining action "
            f"budget, counting the target action: {remaining_budget}.")
