"""Training data for decision models: JSONL, one shared context per line.

Line format (DECISION GYM states from ``experiments/decision_gym_data.py`` fit it as is)::

    {"context": "...",
     "questions": [
        {"question": "Which tool ...?", "options": ["a", "b", ...], "answer": [0],
         "teacher": [0.7, 0.3, ...]},              # optional teacher probabilities
        {"question": "Did action 3 make progress?", "answer": "yes"},  # Yes/No: no options
        {"context": "...", "question": "...", "answer": 0.62},  # its own context, graded label
        {"question": "Did action 5 make progress?", "answer": "no", "weight": 3.0}  # loss weight
     ],
     "split": "train", ...}                          # other keys are kept in meta

``answer`` lists the acceptable option indices (a Yes/No question: "yes", "no", or
``["yes", "no"]`` when either is acceptable, so the target is 0.5 each: a judge's label for an
action that is neither progress nor a no-op, ``jaxdm.train.judge_data``; or a number in [0, 1],
a graded label that is the target P(Yes) itself: a value model's label from returns,
``jaxdm.train.value_data``). A question may carry its own ``context`` (the states of one
trajectory, each asked about over its own prefix: they still pack into one shared row, as
prefixes of one another). ``weight`` (optional, a finite number > 0, default 1) is the
question's weight in the batch loss. ``option_names`` (optional, one per option, each the start
of its option: DECISION GYM's tool names) makes option likelihood score the names as the reply
(``MultipleChoice.option_names``). A malformed line raises ``ValueError`` naming the file and line (and the question index).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from jaxdm.decision.types import MultipleChoice, YesNo
from jaxdm.jsonl import parse_lines, write_records
from jaxdm.train.packing import SFTItem

ANSWERS_YES_NO = {"yes": 0, "no": 1}


def _item(q: Any, context: str, where: str, extra: dict[str, Any]) -> SFTItem:
    if not isinstance(q, dict):
        raise ValueError(f"{where}: expected an object, got {type(q).__name__}")
    text = q.get("question")
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where}: 'question' must be a non-empty string")
    if "context" in q:
        context = q["context"]
        if not isinstance(context, str) or not context:
            raise ValueError(f"{where}: a question's own 'context' must be a non-empty string")
    meta = dict(extra) | {k: v for k, v in q.items() if k not in (
        "question", "options", "option_names", "teacher", "context", "weight")}
    weight = q.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or \
            not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"{where}: 'weight' must be a finite number > 0, got {weight!r}")
    weight = float(weight)
    teacher = q.get("teacher")
    if teacher is not None:
        if not isinstance(teacher, list) or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) for t in teacher):
            raise ValueError(f"{where}: 'teacher' must be a list of numbers")
        if not all(math.isfinite(t) for t in teacher):
            raise ValueError(f"{where}: 'teacher' has a non-finite number")
        teacher = tuple(float(t) for t in teacher)
    answer = q.get("answer")
    if "options" not in q and isinstance(answer, (int, float)) and not isinstance(answer, bool):
        # A graded Yes/No label: the target P(Yes) itself (a value in [0, 1]).
        if not (math.isfinite(answer) and 0.0 <= answer <= 1.0):
            raise ValueError(f"{where}: a graded Yes/No 'answer' must be a number in [0, 1] "
                             f"(the target P(Yes)), got {answer!r}")
        if teacher is not None:
            raise ValueError(f"{where}: a graded 'answer' and a 'teacher' on one question; "
                             "give one")
        p = float(answer)
        return SFTItem(YesNo(context=context, question=text, meta=meta),
                       (0,) if p >= 0.5 else (1,), None, where, target=(p, 1.0 - p),
                       weight=weight)
    if "options" not in q:
        labels = answer if isinstance(answer, list) else [answer]
        if not labels or not all(isinstance(a, str) and a in ANSWERS_YES_NO for a in labels) \
                or len(set(labels)) != len(labels):
            raise ValueError(f"{where}: a question without 'options' is Yes/No and needs "
                             f"'answer' \"yes\", \"no\" or a list of both (either is "
                             f"acceptable: a 0.5 target), got {answer!r}")
        return SFTItem(YesNo(context=context, question=text, meta=meta),
                       tuple(sorted(ANSWERS_YES_NO[a] for a in labels)), teacher, where,
                       weight=weight)
    options = q["options"]
    if not isinstance(options, list) or len(options) < 2 or not all(
            isinstance(o, str) for o in options):
        raise ValueError(f"{where}: 'options' must be a list of at least 2 strings")
    if len(set(options)) != len(options):
        raise ValueError(f"{where}: 'options' has duplicates "
                         f"{sorted({o for o in options if options.count(o) > 1})}")
    if not isinstance(answer, list) or not answer or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in answer):
        raise ValueError(f"{where}: 'answer' must be a non-empty list of option indices, "
                         f"got {answer!r}")
    meta["answer"] = tuple(answer)
    if all(0 <= a < len(options) for a in answer):
        # For a privileged teacher (jaxdm.decision.Oracle); meta is never shown to a model.
        meta["oracle_answer"] = options[answer[0]]
    try:  # MultipleChoice checks the names
        mc = MultipleChoice(context=context, question=text, options=tuple(options), meta=meta,
                            option_names=q.get("option_names"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    return SFTItem(mc, tuple(answer), teacher, where, weight=weight)


def read_states(path: str | Path, *, require_split: str | None = None
                ) -> list[list[SFTItem]]:
    """Every line's questions as SFT items (one inner list per shared context).

    ``require_split``: a line with a ``split`` field other than this is an error (training
    on test seeds is never silent)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training data {path} does not exist")
    states: list[list[SFTItem]] = []
    with open(path, encoding="utf-8") as f:
        for where, row in parse_lines(f, path):
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            context, qs = row.get("context"), row.get("questions")
            if not isinstance(context, str) or not context:
                raise ValueError(f"{where}: 'context' must be a non-empty string")
            if not isinstance(qs, list) or not qs:
                raise ValueError(f"{where}: 'questions' must be a non-empty list")
            if require_split is not None and row.get("split", require_split) != require_split:
                raise ValueError(f"{where}: split {row.get('split')!r}, but training uses only "
                                 f"{require_split!r} data")
            extra = {k: row[k] for k in ("task_id", "step", "after_error", "must_ask", "seed",
                                        "split", "variant") if k in row}
            items = []
            for i, q in enumerate(qs):
                try:
                    items.append(_item(q, context, f"{where}: questions[{i}]", extra))
                except (TypeError, ValueError) as e:
                    msg = str(e)
                    raise ValueError(msg if msg.startswith(where) else
                                     f"{where}: questions[{i}]: {msg}") from None
            states.append(items)
    if not states:
        raise ValueError(f"{path}: no training lines")
    return states


def write_states(path: str | Path, states: Sequence[dict[str, Any]]) -> Path:
    """Writes state dicts (the line format above) as JSONL."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_records(path, states)
    return path
