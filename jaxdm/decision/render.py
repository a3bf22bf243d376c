"""How a backend shows a typed question to a model: system prompts, option labels, messages.

A backend *renders* a question for its interface (``render_messages``): a system prompt saying
how to answer plus one user message with a Context section, a Question section, the labelled
options (``MultipleChoice``, constrained / prompted interfaces; the likelihood interface lists
the actions unlabelled) and, for constrained readout, a final ``Answer:``. The structure follows
seed 000 (Appendix B); the wording is ours. The texts belong to the prompt version
``jaxdm.roles.PROMPT_VERSION`` and are pinned by golden tests.

This module depends only on ``jaxdm.decision.types``, so the backends (local, prompted,
remote) import it without importing the role question builders (``jaxdm.roles``), which in
turn build on the decision types: no import cycle.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from jaxdm.decision.types import MultipleChoice, YesNo

INTERFACES = ("constrained", "prompted", "likelihood")

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
    # Likelihood over option names (``MultipleChoice.option_names``): the list shows each
    # option in full, the reply scored is its leading name.
    ("choice", "likelihood_named"): (
        "You are a decision model. Read the context and the question, then reply with the "
        "name of the chosen action, as it starts the action's line among the candidates."),
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
    prompt = (SYSTEM_PROMPTS[(kind, "likelihood_named")]
              if interface == "likelihood" and kind == "choice" and q.option_names is not None
              else SYSTEM_PROMPTS[(kind, interface)])
    return [{"role": "system", "content": prompt},
            {"role": "user", "content": user_message(q, interface)}]


def likelihood_replies(q: MultipleChoice) -> tuple[str, ...]:
    """The reply the likelihood interface scores for each option: its name when the question
    has ``option_names``, else the option's whole text."""
    return q.option_names if q.option_names is not None else q.options


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """A plain-text prompt for completion endpoints without a chat template."""
    out = []
    for m in messages:
        out.append(f"### {m['role'].capitalize()}\n{m['content']}")
    out.append("### Assistant\n")
    return "\n\n".join(out)


__all__ = ["INTERFACES", "SYSTEM_PROMPTS", "LABELS", "YES_NO", "labels_for", "user_message",
           "render_messages", "likelihood_replies", "render_plain"]
