"""Parse and validate prompted JSON answers; anything invalid is a failure with the raw text.

Accepted answers (after stripping whitespace and an optional ```json fence):
- choice: ``{"choice": "B", "probabilities": {"A": 0.2, "B": 0.8}}``; every label of the
  question must have a finite probability in [0, 1], no unknown labels, sum within
  ``SUM_TOLERANCE`` of 1 (then renormalised exactly); ``choice`` must be one of the labels.
- score: ``{"score": 0.7}`` with a finite number in [0, 1] (bools are rejected).
Nothing is guessed: a missing key, a string number, extra prose around two objects and the
like all fail, and the caller counts the failure.
"""
from __future__ import annotations

import json
import math
import re
from typing import Sequence

from jaxdm.decision.types import (ChoiceResult, Cost, ScoreResult, choice_failed, score_failed,
                                  score_ok)

SUM_TOLERANCE = 0.02
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _load_object(raw: str) -> dict | str:
    """The one JSON object in ``raw``, or an error message."""
    if not isinstance(raw, str):
        return f"output is {type(raw).__name__}, not text"
    text = raw.strip()
    m = _FENCE.match(text)
    if m:
        text = m.group(1)
    # Models often stop right after the object or add an end-of-turn marker; take the first
    # complete object and require that nothing but whitespace follows it.
    start = text.find("{")
    if start < 0:
        return "no JSON object in output"
    if text[:start].strip():
        return "text before the JSON object"
    try:
        obj, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg})"
    if text[end:].strip():
        return "text after the JSON object"
    if not isinstance(obj, dict):
        return "JSON value is not an object"
    return obj


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def parse_score(raw: str, cost: Cost = Cost()) -> ScoreResult:
    """Parse a model's JSON reply ``{"score": s}`` into a ScoreResult; anything else (not an object,
    other keys, s not a number in [0, 1]) is a failed result saying why, with the raw text."""
    obj = _load_object(raw)
    if isinstance(obj, str):
        return score_failed(obj, raw=raw, cost=cost)
    if set(obj) != {"score"}:
        return score_failed(f"expected exactly the key 'score', got {sorted(obj)}", raw=raw,
                            cost=cost)
    s = _number(obj["score"])
    if s is None or not 0.0 <= s <= 1.0:
        return score_failed(f"score {obj['score']!r} is not a number in [0, 1]", raw=raw,
                            cost=cost)
    return score_ok(s, cost=cost, raw=raw)


def parse_choice(raw: str, labels: Sequence[str], cost: Cost = Cost()) -> ChoiceResult:
    """Parse a model's JSON reply ``{"choice": label, "probabilities": {label: p}}`` over ``labels``
    into a ChoiceResult; a choice that is no label, missing or unknown labels, or probabilities that
    are not finite, non-negative and summing to about 1 give a failed result saying why."""
    obj = _load_object(raw)
    if isinstance(obj, str):
        return choice_failed(obj, raw=raw, cost=cost)
    if set(obj) != {"choice", "probabilities"}:
        return choice_failed(f"expected keys 'choice' and 'probabilities', got {sorted(obj)}",
                             raw=raw, cost=cost)
    choice, probs = obj["choice"], obj["probabilities"]
    if not isinstance(choice, str) or choice.strip() not in labels:
        return choice_failed(f"choice {choice!r} is not one of the labels {list(labels)}",
                             raw=raw, cost=cost)
    if not isinstance(probs, dict):
        return choice_failed("probabilities is not an object", raw=raw, cost=cost)
    keys = {k.strip(): v for k, v in probs.items()}
    missing = [lab for lab in labels if lab not in keys]
    unknown = sorted(set(keys) - set(labels))
    if missing or unknown:
        return choice_failed(f"probabilities: missing labels {missing}, unknown {unknown}",
                             raw=raw, cost=cost)
    values = [_number(keys[lab]) for lab in labels]
    if any(v is None or not 0.0 <= v <= 1.0 for v in values):
        return choice_failed("probabilities must be finite numbers in [0, 1]", raw=raw,
                             cost=cost)
    total = sum(values)
    if abs(total - 1.0) > SUM_TOLERANCE:
        return choice_failed(f"probabilities sum to {total:.4f}, not 1", raw=raw, cost=cost)
    values = [v / total for v in values]
    return ChoiceResult(probs=tuple(values), choice=list(labels).index(choice.strip()),
                        cost=cost, raw=raw)
