"""The harness's decision points as typed questions (seed 003): the options are listed by the
harness, the decision model (or the agent LLM) picks one.

Eight decision points (``POINTS``); three decide actions, five control the loop:

- ``tool``: which tool next (DECISION GYM builds it with its answer key:
  ``jaxdm.envs.decision_gym.tool_question``; ``tool_question`` here is the generic form);
- ``params``: one question per bounded (enum) or copyable parameter of the chosen tool
  (``param_question``; free text is never asked, the LLM writes it);
- ``next_action``: the next action when the env has no tools (ALFWorld, WebShop): the Actor
  question (``jaxdm.roles.actor``);
- ``memory``: write a note about the last result? (``memory_question``)
- ``reflect``: reflect on the last step before acting? (``reflect_question``)
- ``stop``: finish now or continue? (``stop_question``)
- ``route``: send this step to the cheaper LLM tier? (``route_question``)
- ``notes``: which note to read back into the prompt? (``notes_question``)

Binary questions put the option that runs the optional step first (``RUN`` = index 0), so a
TRIGGER delegation reads P(run) as ``probs[0]``. Every question carries
``meta["point"]`` and ``meta["prompt_version"]``; answer keys, where the env has them, travel in
``meta["answer"]`` (acceptable option indices) and ``meta["oracle_answer"]`` and are never in
the text.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from jaxdm.decision.types import MultipleChoice
from jaxdm.roles.common import PROMPT_VERSION

POINTS = ("tool", "params", "next_action", "memory", "reflect", "stop", "route", "notes")
ACTION_POINTS = ("tool", "params", "next_action")
LOOP_POINTS = ("memory", "reflect", "stop", "route", "notes")
RUN = 0  # index of the option that runs the optional step in binary loop-control questions

MEMORY_OPTIONS = ("Write a note about the last result", "Do not write a note")
REFLECT_OPTIONS = ("Reflect on the last step before acting", "Act without reflecting")
STOP_OPTIONS = ("Finish the conversation now", "Continue working on the request")
ROUTE_OPTIONS = ("Route this step to the cheaper LLM", "Keep this step on the main LLM")
NO_NOTE = "(no note)"

QUESTION_TEXT: Mapping[str, str] = {
    "tool": "Which tool should the agent call next?",
    "params": "The agent calls {tool}. Which value should its parameter '{param}' take?",
    "memory": "[memory] Should the agent write a note about the result of its last step, to "
              "read back later?",
    "reflect": "[reflect] Should the agent reflect on its last step (did it fail or go off "
               "the plan?) before choosing the next one?",
    "stop": "Should the agent finish the conversation now?",
    "route": "[route] Is the next step routine enough to hand to a cheaper, less capable "
             "LLM?",
    "notes": "[notes] Which of the agent's notes should be read back into its prompt for the "
             "next step?",
}


def _meta(point: str, answer: Sequence[int] | None, options: Sequence[str],
          extra: Mapping[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"point": point, "prompt_version": PROMPT_VERSION}
    if answer is not None:
        answer = tuple(int(i) for i in answer)
        bad = [i for i in answer if not 0 <= i < len(options)]
        if bad:
            raise ValueError(f"{point} question: answer index(es) {bad} out of range for "
                             f"{len(options)} options")
        meta["answer"] = answer
        meta["oracle_answer"] = options[answer[0]] if answer else None
    meta.update(extra or {})
    return meta


def tool_question(context: str, tools: Sequence[tuple[str, str]], *,
                  answer: Sequence[int] | None = None,
                  meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """Which tool next, over ``tools`` = (name, description) pairs in the harness's order; a model
    replies with the tool's name (``MultipleChoice.option_names``)."""
    options = tuple(f"{name}: {desc}" for name, desc in tools)
    names = tuple(n for n, _ in tools)
    return MultipleChoice(context, QUESTION_TEXT["tool"], options,
                          _meta("tool", answer, options, {"tools": names, **(meta or {})}),
                          option_names=names)


def param_question(context: str, tool: str, param: str, values: Sequence[str], *,
                   answer: Sequence[int] | None = None,
                   meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """Which value for ``param`` of ``tool``, over bounded / copyable ``values``."""
    options = tuple(values)
    return MultipleChoice(context, QUESTION_TEXT["params"].format(tool=tool, param=param),
                          options, _meta("params", answer, options,
                                         {"tool": tool, "param": param, **(meta or {})}))


def _binary(point: str, options: tuple[str, str], context: str,
            answer: Sequence[int] | None, meta: Mapping[str, Any] | None) -> MultipleChoice:
    return MultipleChoice(context, QUESTION_TEXT[point], options,
                          _meta(point, answer, options, meta))


def memory_question(context: str, *, answer: Sequence[int] | None = None,
                    meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """The harness's memory decision point as a two-option MultipleChoice over ``context``: write a
    note about the last result, or not (``answer``: the labelled option indices, for training data).
    """
    return _binary("memory", MEMORY_OPTIONS, context, answer, meta)


def reflect_question(context: str, *, answer: Sequence[int] | None = None,
                     meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """The reflect decision point: reflect on the last step before acting, or act at once (a
    two-option MultipleChoice over ``context``)."""
    return _binary("reflect", REFLECT_OPTIONS, context, answer, meta)


def stop_question(context: str, *, answer: Sequence[int] | None = None,
                  meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """The stop decision point: finish the conversation now, or keep working on the request (a
    two-option MultipleChoice over ``context``)."""
    return _binary("stop", STOP_OPTIONS, context, answer, meta)


def route_question(context: str, *, answer: Sequence[int] | None = None,
                   meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """The route decision point: send this step to the cheaper LLM, or keep it on the main one (a
    two-option MultipleChoice over ``context``)."""
    return _binary("route", ROUTE_OPTIONS, context, answer, meta)


def notes_question(context: str, notes: Sequence[str], *, answer: Sequence[int] | None = None,
                   meta: Mapping[str, Any] | None = None) -> MultipleChoice:
    """Which note to read back: the notes (numbered) plus ``NO_NOTE`` last."""
    if not notes:
        raise ValueError("notes_question needs at least one note")
    options = tuple(f"Note {i + 1}: {n}" for i, n in enumerate(notes)) + (NO_NOTE,)
    return MultipleChoice(context, QUESTION_TEXT["notes"], options,
                          _meta("notes", answer, options, meta))


__all__ = ["POINTS", "ACTION_POINTS", "LOOP_POINTS", "RUN", "MEMORY_OPTIONS", "REFLECT_OPTIONS",
           "STOP_OPTIONS", "ROUTE_OPTIONS", "NO_NOTE", "QUESTION_TEXT", "tool_question",
           "param_question", "memory_question", "reflect_question", "stop_question",
           "route_question", "notes_question"]
