"""One call to the agent LLM: what the harness asks (``LLMRequest``), what comes back
(``LLMReply``), the text a model reads for a request and the parsing of a chat message's tool
calls. Every agent LLM (``jaxdm.harness.llm``, ``jaxdm.harness.local``) speaks it.

The harness asks its agent LLM once per step (``AgentLLM.act``) with an ``LLMRequest``: the
prompt text, the tools it may call (all of them, an ASSIST shortlist, or one forced tool), the
argument values already fixed by the decision model, the harness questions it holds this step
(loop-control points, ASSIST shortlists, GUARD returns) and whether to reflect first. The reply
(``LLMReply``) holds the tool call, one option index per question, any free text, and the
call's usage: tokens in / out, USD, seconds, ok / error.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Protocol, Sequence

from jaxdm.decision.types import MultipleChoice

ANSWER_TOOL = "answer_harness_questions"


@dataclasses.dataclass(frozen=True)
class HeldQuestion:
    """A harness question the LLM answers in this call: ``allowed`` option indices (ASSIST
    shortlist / GUARD return leave fewer), all when None."""

    point: str
    question: MultipleChoice
    allowed: tuple[int, ...] | None = None

    def options_allowed(self) -> tuple[int, ...]:
        """The option indices the LLM may pick (all when ``allowed`` is None)."""
        return tuple(range(len(self.question.options))) if self.allowed is None else self.allowed


@dataclasses.dataclass(frozen=True)
class LLMRequest:
    """One call to the agent LLM (see the module docstring).

    ``tools`` are OpenAI function schemas of the callable tools (empty: no tool call wanted);
    ``forced_tool`` pins the call to one of them; ``fixed_args`` are values decided by the
    decision model (the LLM fills the rest); ``hidden`` carries env state for the
    SimulatedLLM only and is never sent to a model.
    """

    prompt: str
    tools: tuple[Mapping[str, Any], ...] = ()
    forced_tool: str | None = None
    fixed_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    questions: tuple[HeldQuestion, ...] = ()
    reflect: bool = False
    call_id: str = ""
    hidden: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def wants_tool_call(self) -> bool:
        """Whether the request offers tools (else it only asks the held questions)."""
        return bool(self.tools)


@dataclasses.dataclass(frozen=True)
class LLMReply:
    """What one call returned and cost. ``answers[i]`` is the option index for
    ``request.questions[i]`` (None when the LLM gave no usable answer)."""

    tool: str | None = None
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    answers: tuple[int | None, ...] = ()
    text: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    usd: float = 0.0
    seconds: float = 0.0
    ok: bool = True
    error: str | None = None
    model: str = ""
    # no answer came back (a connection error, timeout, an HTTP error, a malformed body: the
    # server or its transport failed, not the LLM's choice): the episode is incomplete
    unanswered: bool = False


class AgentLLM(Protocol):
    """What the harness needs of an agent LLM: a ``name`` and ``act``."""

    name: str

    def act(self, request: LLMRequest) -> LLMReply:
        """Answers one request (tool call, one option per held question) with the call's usage; a
        failure is an ``ok=False`` reply, never an exception."""


def count_tokens(text: str) -> int:
    """Token estimate for priced simulation: ceil(characters / 4)."""
    return math.ceil(len(text) / 4)


_TOOL_JSON: dict[int, tuple[Mapping[str, Any], str]] = {}


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool list as the model would see it (JSON schemas, one per line); the JSON of a
    schema object is cached while that object lives (the harness reuses its schema objects)."""
    out = []
    for t in tools:
        hit = _TOOL_JSON.get(id(t))
        if hit is None or hit[0] is not t:
            hit = _TOOL_JSON[id(t)] = (t, json.dumps(t, sort_keys=True))
        out.append(hit[1])
    return "\n".join(out)


def questions_text(questions: Sequence[HeldQuestion]) -> str:
    """The held questions as the model reads them: ``Q<i> (<point>): <question>`` then its allowed
    options, numbered by their option index."""
    lines = []
    for i, hq in enumerate(questions):
        q = hq.question
        lines.append(f"Q{i + 1} ({hq.point}): {q.question}")
        lines += [f"  {j}. {q.options[j]}" for j in hq.options_allowed()]
    return "\n".join(lines)


def request_text(req: LLMRequest) -> str:
    """Everything a text model reads for ``req`` (what token counts are based on)."""
    parts = [req.prompt]
    if req.tools:
        parts.append("Tools:\n" + tools_text(req.tools))
    if req.forced_tool:
        parts.append(f"Call the tool {req.forced_tool}.")
    if req.fixed_args:
        parts.append("Fixed arguments: " + json.dumps(dict(req.fixed_args), sort_keys=True))
    if req.questions:
        parts.append("Answer the harness questions:\n" + questions_text(req.questions))
    if req.reflect:
        parts.append("First reflect on the last step: did it fail or leave the plan?")
    return "\n\n".join(parts)


def answer_tool_schema(questions: Sequence[HeldQuestion]) -> dict[str, Any]:
    """A function the model calls to answer the harness questions: one enum field per question
    (the allowed option indices as strings)."""
    props = {f"q{i + 1}": {"type": "string",
                           "enum": [str(j) for j in hq.options_allowed()],
                           "description": hq.question.question}
             for i, hq in enumerate(questions)}
    return {"type": "function", "function": {
        "name": ANSWER_TOOL, "description": "Answer the harness questions by option number.",
        "parameters": {"type": "object", "properties": props, "required": sorted(props)}}}


def parse_tool_calls(msg: Mapping[str, Any], req: LLMRequest, **base: Any) -> LLMReply:
    """An assistant message's ``tool_calls`` -> LLMReply (the env tool call and the answers)."""
    calls = msg.get("tool_calls") or []
    offered = {t["function"]["name"] for t in req.tools}
    tool, args, answers = None, {}, [None] * len(req.questions)
    for c in calls if isinstance(calls, list) else []:
        fn = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping):
            continue
        try:
            a = json.loads(fn.get("arguments") or "{}")
        except (json.JSONDecodeError, TypeError):
            return LLMReply(ok=False, error=f"tool call {fn.get('name')!r}: arguments are not "
                                            "JSON", **base)
        if not isinstance(a, dict):
            return LLMReply(ok=False, error=f"tool call {fn.get('name')!r}: arguments are not "
                                            "an object", **base)
        if fn.get("name") == ANSWER_TOOL:
            for i, hq in enumerate(req.questions):
                v = a.get(f"q{i + 1}")
                try:
                    j = int(v)
                except (TypeError, ValueError):
                    continue
                answers[i] = j if j in hq.options_allowed() else None
        elif fn.get("name") in offered and tool is None:
            tool, args = fn["name"], {**a, **req.fixed_args}
    if req.wants_tool_call and tool is None:
        names = [c.get("function", {}).get("name") for c in calls if isinstance(c, Mapping)]
        return LLMReply(ok=False, error=f"no call to an offered tool (got {names})",
                        answers=tuple(answers), **base)
    return LLMReply(tool=tool, args=args, answers=tuple(answers),
                    text=str(msg.get("content") or ""), **base)


__all__ = ["AgentLLM", "HeldQuestion", "LLMRequest", "LLMReply", "ANSWER_TOOL", "count_tokens",
           "tools_text", "questions_text", "request_text", "answer_tool_schema",
           "parse_tool_calls"]
