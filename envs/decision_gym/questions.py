"""Decision questions from any DECISION GYM state, each with its answer key out of band.

- tool choice: a ``MultipleChoice`` over the variant's 69 tools (``name: description``),
  shuffled per question with the episode's seed;
- parameter values: one ``MultipleChoice`` per bounded (enum / bool) or copyable parameter
  (ids, emails, addresses) of a keyed tool, over the values of that type found in the context
  (plus ``(omit)`` for optional parameters);
- stop: finish now or continue.

``meta`` holds ``kind``, ``answer`` (the acceptable option indices), ``task_id``, ``step`` and
what the question is about; nothing of the key appears in ``context``, ``question`` or
``options``.
"""
from __future__ import annotations

import random
import re
from typing import Any, Sequence

from jaxdm.decision.types import ChoiceResult, MultipleChoice
from jaxdm.envs.decision_gym.env import (DecisionGym, GymParams, GymState, stable_digest,
                                         render_context)
from jaxdm.envs.decision_gym.plan import AnswerKey, normalize
from jaxdm.envs.decision_gym.tools import TOOL_BY_NAME, Param, tool_named
from jaxdm.envs.decision_gym.world import SHIFT

OMIT = "(omit)"
STOP_OPTIONS = ("Finish the conversation now", "Continue working on the request")
_PATTERNS = {
    "order_id": re.compile(r"\bO-\d{5}\b"),
    "customer_id": re.compile(r"\bC-\d{4}\b"),
    "product_id": re.compile(r"\bP-\d{3}\b"),
    "email": re.compile(r"[A-Za-z0-9_.+-]+@[A-Za-z0-9-]+\.[A-Za-z.]+[A-Za-z]"),
    "address": re.compile(r"\b\d+ [A-Z][a-z]+ (?:Street|Avenue|Lane|Road|Court|Way|Drive|Place"
                          r"|Crescent), [A-Z][A-Za-z ]*, [A-Z]{2} \d{5}\b"),
}
_ENV = DecisionGym()


def _shift(state: GymState, params: GymParams) -> bool:
    return params.variant == SHIFT or state.task.variant == SHIFT


def _question(context: str, question: str, options: tuple[str, ...], meta: dict[str, Any],
              option_names: tuple[str, ...] | None = None) -> MultipleChoice:
    if meta["answer"]:
        meta["oracle_answer"] = options[meta["answer"][0]]
    return MultipleChoice(context=context, question=question, options=options, meta=meta,
                          option_names=option_names)


def _meta(state: GymState, kind: str, answer: list[int], **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "answer": tuple(answer), "task_id": state.task.task_id,
            # For jaxdm.decision.Oracle (privileged judge): the first acceptable option.
            "oracle_answer": None,
            "seed": state.task.seed, "variant": state.task.variant, "step": state.t,
            "request": state.task.request} | extra


def key_of(state: GymState, required: bool = True) -> AnswerKey | None:
    """The state's answer key; a finished / unsolvable state raises (or gives None)."""
    key = _ENV.answer_key(state)
    if key is None and required:
        raise ValueError(f"state of task {state.task.task_id} at step {state.t} is finished or "
                         "no longer solvable: it has no answer key")
    return key


def tool_question(state: GymState, params: GymParams, context: str | None = None,
                  require_key: bool = True) -> MultipleChoice:
    """Which tool next? Options are all 69 tools, shuffled per (task, step). With
    ``require_key=False`` a state without a key (lenient mode after an unplanned write) gets
    the question with an empty ``answer``, so an agent can still be asked."""
    key = key_of(state, require_key)
    shift = _shift(state, params)
    names = _ENV.tool_names(state, params, shuffled=True, salt="tool-question")
    tools = [tool_named(n, shift) for n in names]
    shown = tuple(t.display_name(shift) for t in tools)
    options = tuple(f"{n}: {t.display_description(shift)}" for n, t in zip(shown, tools))
    answer = [] if key is None else [i for i, t in enumerate(tools) if key.accepts_tool(t.name)]
    return _question(
        render_context(state) if context is None else context,
        "Which tool should the agent call next?", options,
        _meta(state, "tool", answer, tools=names, answer_tools=tuple(names[i] for i in answer),
              # The paper's hard case: the only right move is to ask the customer.
              must_ask=key is not None and key.tools == ("ask_customer",)),
        # A model answers with the tool's name: the likelihood interface reads each
        # description once, in the list, not again in every option's continuation.
        option_names=shown)


def candidates(param: Param, context: str) -> list[str]:
    """Values for ``param`` that can be copied from ``context`` (or its enum values)."""
    if param.sem == "enum":
        return list(param.values)
    if param.sem == "bool":
        return ["true", "false"]
    sems = ("customer_id", "email") if param.sem == "customer_query" else (param.sem,)
    if not all(s in _PATTERNS for s in sems):
        return []
    found: list[str] = []
    for s in sems:
        for m in _PATTERNS[s].finditer(context):
            if m.group(0) not in found:
                found.append(m.group(0))
    return found


def param_questions(state: GymState, params: GymParams, tool: str | None = None,
                    context: str | None = None) -> list[MultipleChoice]:
    """One question per bounded or copyable, key-constrained parameter of ``tool`` (canonical or
    variant name; default: every tool in the key)."""
    key = key_of(state)
    shift = _shift(state, params)
    if tool is None:
        wanted = list(key.tools)
    else:
        t = tool_named(tool, shift) or TOOL_BY_NAME.get(tool)
        if t is None:
            raise ValueError(f"unknown tool {tool!r}")
        if not key.accepts_tool(t.name):
            raise ValueError(f"tool {tool!r} is not an acceptable next call here; parameter "
                             "questions exist only for keyed tools")
        wanted = [t.name]
    context = render_context(state) if context is None else context
    out = []
    for name in wanted:
        t = TOOL_BY_NAME[name]
        constrained = key.params(name)
        for p in t.params:
            if p.name not in constrained:
                continue
            values = candidates(p, context)
            if not values:
                continue
            random.Random(stable_digest(state.task.task_id, state.t, name, p.name)).shuffle(values)
            if not p.required:
                values.append(OMIT)
            allowed = {normalize(v) for v in constrained[p.name] if v is not None}
            answer = [i for i, v in enumerate(values)
                      if (v == OMIT and None in constrained[p.name]) or normalize(v) in allowed]
            if len(values) < 2 or not answer:
                continue
            display = t.display_name(shift)
            out.append(_question(
                context,
                f"The agent calls {display}. Which value should its parameter '{p.name}' take?",
                tuple(values),
                _meta(state, "param", answer, tool=display, canonical_tool=name,
                      param=p.name, answer_values=tuple(values[i] for i in answer))))
    return out


def stop_question(state: GymState, params: GymParams, context: str | None = None
                  ) -> MultipleChoice:
    """Should the agent finish now? Option 0 finish, option 1 continue."""
    key = key_of(state)
    finish = key.accepts_tool("finish")
    return _question(
        render_context(state) if context is None else context,
        "Should the agent finish the conversation now?", STOP_OPTIONS,
        _meta(state, "stop", [0 if finish else 1]))


def state_questions(state: GymState, params: GymParams) -> list[MultipleChoice]:
    """Every question of a state: tool choice, parameter values, stop (one shared context)."""
    context = render_context(state)
    return ([tool_question(state, params, context)] + param_questions(state, params,
                                                                      context=context)
            + [stop_question(state, params, context)])


def score_answers(questions: Sequence[MultipleChoice], results: Sequence[ChoiceResult]
                  ) -> dict[str, Any]:
    """Accuracy of a decision model's answers against the keys, per question kind (L2).

    A failed answer (``ok`` False) counts as wrong and is counted in ``failed/<kind>``.
    Returns ``{"accuracy/<kind>": float, "n/<kind>": int, "failed/<kind>": int}`` plus the
    same over all kinds (``accuracy/all`` ...).
    """
    if len(questions) != len(results):
        raise ValueError(f"{len(questions)} questions but {len(results)} results")
    tally: dict[str, list[int]] = {}
    for i, (q, r) in enumerate(zip(questions, results)):
        if "answer" not in q.meta or "kind" not in q.meta:
            raise ValueError(f"questions[{i}] has no DECISION GYM key in meta")
        right = bool(r.ok and r.choice is not None and r.choice in q.meta["answer"])
        for kind in (q.meta["kind"], "all"):
            t = tally.setdefault(kind, [0, 0, 0])
            t[0] += right
            t[1] += 1
            t[2] += not r.ok
    out: dict[str, Any] = {}
    for kind, (right, n, failed) in sorted(tally.items()):
        out[f"accuracy/{kind}"] = right / n
        out[f"n/{kind}"] = n
        out[f"failed/{kind}"] = failed
    return out


def option_value(question: MultipleChoice, index: int) -> Any:
    """The parameter value an option of a parameter question stands for (None for omit)."""
    v = question.options[index]
    return None if v == OMIT else v


__all__ = ["tool_question", "param_questions", "stop_question", "state_questions",
           "candidates", "key_of", "option_value", "score_answers", "OMIT", "STOP_OPTIONS"]
