"""The `/decide` request format: strict JSON in and out, request limits, named field errors.

Strict JSON: NaN, Infinity and -Infinity (which Python's json reads and writes by default),
a number that overflows to infinity (1e400), an integer of more than ``MAX_INT_DIGITS`` digits
and nesting deeper than ``MAX_DEPTH`` are each refused with a ``RequestError`` naming the body,
never a dropped connection or a dead reader; answers are written with ``allow_nan=False``.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from jaxdm.decision.types import MultipleChoice

REQUEST_KEYS = ("context", "question", "options", "option_names", "id", "meta")
MAX_DEPTH = 32          # JSON nesting: a request needs 4 ({"requests": [{"meta": {...}}]})
MAX_INT_DIGITS = 64     # Python refuses over 4,300 digits with a ValueError json does not name


class RequestError(ValueError):
    """A bad request; ``field`` names the offending JSON field (dotted / indexed path),
    ``status`` the HTTP status it gets (400 unless a limit says otherwise)."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status

    def to_json(self) -> dict:
        """The error as the decision service answers it: {"error": {"field": the offending field or
        None, "message": ...}}."""
        return {"error": {"field": self.field, "message": self.message}}


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask (each over-limit request is a named 400 / 413).

    max_body_bytes: an HTTP body or a stdio line. max_questions: questions in one request
    (a ``{"requests": [...]}`` batch, /v1/score items, /v1/completions prompts).
    max_options: options of one question. max_context_tokens: tokens of one question's
    context under the backend's tokenizer (None: only the model's own context length).
    """

    max_body_bytes: int = 16 * 1024 * 1024
    max_questions: int = 256
    max_options: int = 256
    max_context_tokens: int | None = None

    def __post_init__(self):
        for name in ("max_body_bytes", "max_questions", "max_options", "max_context_tokens"):
            value = getattr(self, name)
            if value is None and name == "max_context_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Request:
    """One parsed question with its optional ``id`` (echoed back when given)."""

    question: MultipleChoice
    id: Any = None
    has_id: bool = False


# ------------------------------------------------------------------------ strict JSON


def _refuse_constant(name: str) -> Any:
    raise RequestError("body", f"{name} is not JSON (strict JSON: numbers are finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestError("body", f"number {text[:40]} overflows to infinity")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise RequestError("body", f"integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise RequestError("body", f"JSON nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def decode_body(raw: bytes | str) -> Any:
    """JSON text -> value, strictly (module docstring); anything else is
    ``RequestError('body', ...)``."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                           parse_int=_bounded_int)
    except UnicodeDecodeError as e:
        raise RequestError("body", f"not UTF-8 ({e})") from None
    except json.JSONDecodeError as e:
        raise RequestError("body", f"invalid JSON: {e}") from None
    except RecursionError:
        raise RequestError("body", f"JSON nested deeper than {MAX_DEPTH} levels") from None
    _check_depth(value)
    return value


def encode_json(obj: Any) -> bytes:
    """Strict JSON bytes of an answer (a non-finite number is a bug here, never sent)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()


# ------------------------------------------------------------------------ requests


def _parse_one(obj: Any, where: str, limits: Limits) -> Request:
    def field(name: str) -> str:
        return f"{where}.{name}" if where else name

    if not isinstance(obj, dict):
        raise RequestError(where or "body", f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(field(unknown[0]), f"unknown key (allowed: {list(REQUEST_KEYS)})")
    for name in ("context", "question"):
        if name not in obj:
            raise RequestError(field(name), "missing")
        if not isinstance(obj[name], str):
            raise RequestError(field(name), f"must be a string, got {type(obj[name]).__name__}")
    if "options" not in obj:
        raise RequestError(field("options"), "missing")
    options = obj["options"]
    if not isinstance(options, list):
        raise RequestError(field("options"), f"must be a list of strings, got "
                                             f"{type(options).__name__}")
    if not options:
        raise RequestError(field("options"), "is empty; give at least one option")
    if len(options) > limits.max_options:
        raise RequestError(field("options"), f"{len(options)} options, more than the server's "
                                             f"limit of {limits.max_options} (--max-options)")
    seen: set[str] = set()
    for i, o in enumerate(options):
        if not isinstance(o, str):
            raise RequestError(f"{field('options')}[{i}]", f"must be a string, got "
                                                           f"{type(o).__name__}")
        if o in seen:
            raise RequestError(f"{field('options')}[{i}]", f"duplicate option {o!r}")
        seen.add(o)
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise RequestError(field("meta"), f"must be an object, got {type(meta).__name__}")
    names = obj.get("option_names")
    try:  # MultipleChoice checks the names (the options passed the checks above)
        mc = MultipleChoice(context=obj["context"], question=obj["question"],
                            options=tuple(options), meta=meta, option_names=names)
    except (TypeError, ValueError) as e:
        raise RequestError(field("option_names"), str(e)) from None
    return Request(mc, obj.get("id"), "id" in obj)


def parse_payload(payload: Any, limits: Limits = Limits()) -> tuple[list[Request], bool]:
    """A decoded JSON payload -> (requests, is_batch); RequestError names the bad field."""
    if isinstance(payload, dict) and "requests" in payload:
        extra = sorted(set(payload) - {"requests"})
        if extra:
            raise RequestError(extra[0], "unknown key next to 'requests' (a batch is "
                                         "{\"requests\": [...]} only)")
        reqs = payload["requests"]
        if not isinstance(reqs, list):
            raise RequestError("requests", f"must be a list, got {type(reqs).__name__}")
        if not reqs:
            raise RequestError("requests", "is empty")
        if len(reqs) > limits.max_questions:
            raise RequestError("requests", f"{len(reqs)} questions, more than the server's "
                                           f"limit of {limits.max_questions} per request "
                                           "(--max-questions); send several requests")
        return [_parse_one(r, f"requests[{i}]", limits) for i, r in enumerate(reqs)], True
    if not isinstance(payload, dict):
        raise RequestError("body", "expected a JSON object: one request or "
                                   "{\"requests\": [...]}, got " + type(payload).__name__)
    return [_parse_one(payload, "", limits)], False


def check_context_tokens(reqs: list[Request], is_batch: bool, tokenizer: Any,
                         limit: int | None) -> None:
    """RequestError for the first question whose context has more than ``limit`` tokens
    (untrusted text: ``jaxdm.models.tokenizer.text_ids``); nothing when ``limit`` is None."""
    if limit is None or not reqs:
        return
    from jaxdm.models.tokenizer import text_ids  # why: JAX, local model only

    for i, ids in enumerate(text_ids(tokenizer, [r.question.context for r in reqs])):
        if len(ids) > limit:
            where = f"requests[{i}].context" if is_batch else "context"
            raise RequestError(where, f"{len(ids)} tokens, more than the server's limit of "
                                      f"{limit} (--max-context-tokens)")
