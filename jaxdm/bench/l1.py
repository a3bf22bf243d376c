"""AGENT DECISION BENCH L1: isolated multiple-choice items built from BFCL v4 (``bfcl-eval``).

Read with ``importlib.resources`` from the ``bfcl_eval`` wheel (installed ``--no-deps``):
``data/BFCL_v4_<category>.json`` (questions + function docs) and
``data/possible_answer/BFCL_v4_<category>.json`` (ground truth), one JSON object per line.

- **Tool selection** (categories ``multiple``, ``live_multiple``: several functions, one
  call): context = the conversation; options = ``name: description`` of every listed
  function, in a seeded order per item; answer = the ground-truth function. Items whose
  ground truth is not exactly one call, names a function not listed, or lists duplicate
  names are left out (counted in ``stats``).
- **Parameters** (categories ``simple_python``, ``multiple``, ``live_simple``,
  ``live_multiple``), one item per ground-truth parameter that is
  * bounded: an ``enum`` (options = the enum values) or a boolean (options true / false);
  * copyable: a string or integer value written verbatim in the user's words (options = that
    value and the other values of the same kind in the request: other ground-truth strings of
    the call that appear in the request; other integers written in the request).
  An item is kept only if exactly one option is acceptable (BFCL lists several acceptable
  values and "" for "may be omitted"; an omitted optional parameter with a default that is
  also an option would make two options right) and it has at least two options.

When2Call (the seed's third L1 source) has no offline copy: it is not included.

Deterministic: the same package files give the same items (options are shuffled with a seed
derived from the item id, never from global state).
"""
from __future__ import annotations

import hashlib
import importlib.resources as resources
import random
import re
from typing import Any, Iterable

from jaxdm.decision.types import MultipleChoice
from jaxdm.jsonl import parse_lines

TOOL_CATEGORIES = ("multiple", "live_multiple")
PARAM_CATEGORIES = ("simple_python", "multiple", "live_simple", "live_multiple")
_INT = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
WHEN2CALL_NOTE = ("When2Call is not available offline (no PyPI package ships it); L1 uses "
                  "BFCL v4 only.")


def _read_lines(rel: str) -> list[dict[str, Any]]:
    path = resources.files("bfcl_eval").joinpath("data", *rel.split("/"))
    return [row for _, row in parse_lines(path.read_text(encoding="utf-8").splitlines(),
                                          f"bfcl_eval data/{rel}")]


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big")


def _conversation(question: Any) -> str:
    turns = question[0] if question and isinstance(question[0], list) else question
    return "\n".join(f"{t['role']}: {t['content']}" for t in turns)


def _user_text(question: Any) -> str:
    turns = question[0] if question and isinstance(question[0], list) else question
    return "\n".join(t["content"] for t in turns if t.get("role") == "user")


def load_category(category: str) -> list[tuple[dict, dict]]:
    """(question row, answer row) pairs of one BFCL v4 category, matched by id."""
    qs = _read_lines(f"BFCL_v4_{category}.json")
    answers = {a["id"]: a for a in _read_lines(f"possible_answer/BFCL_v4_{category}.json")}
    return [(q, answers[q["id"]]) for q in qs if q["id"] in answers]


def tool_items(categories: Iterable[str] = TOOL_CATEGORIES,
               stats: dict | None = None) -> list[MultipleChoice]:
    """Tool-selection items (module docstring); ``stats`` gets kept / left-out counts."""
    out = []
    for cat in categories:
        kept = dropped = 0
        for q, a in load_category(cat):
            names = [f["name"] for f in q["function"]]
            gt = a["ground_truth"]
            if len(gt) != 1 or len(names) < 2 or len(set(names)) != len(names):
                dropped += 1
                continue
            (target,) = gt[0].keys()
            if target not in names:
                dropped += 1
                continue
            funcs = list(q["function"])
            random.Random(_seed("tool", q["id"])).shuffle(funcs)
            options = tuple(f"{f['name']}: {' '.join(f.get('description', '').split())}"
                            for f in funcs)
            if len(set(options)) != len(options):
                dropped += 1
                continue
            answer = [i for i, f in enumerate(funcs) if f["name"] == target]
            out.append(MultipleChoice(
                context=_conversation(q["question"]),
                question="Which function should the assistant call to answer the user?",
                options=options,
                meta={"kind": "l1_tool", "category": cat, "id": q["id"], "answer": tuple(answer),
                      "oracle_answer": options[answer[0]]},
                # the reply option likelihood scores: the function's name
                option_names=tuple(f["name"] for f in funcs)))
            kept += 1
        if stats is not None:
            stats[f"tool/{cat}"] = kept
            stats[f"tool/{cat}/left_out"] = dropped
    return out


def _norm(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v).strip().lower()


def _param_item(q: dict, fn: dict, pname: str, schema: dict, acceptable: list,
                user: str, call: dict) -> tuple[tuple[str, ...], list[int], str] | None:
    """(options, answer, sem) for one parameter, or None when not bounded/copyable or when
    not exactly one option is right."""
    default = schema.get("default")
    omit_ok = "" in acceptable
    values = [v for v in acceptable if v != ""]
    ptype = schema.get("type")
    if "enum" in schema and all(isinstance(e, (str, int)) and not isinstance(e, bool)
                                for e in schema["enum"]):
        options = [str(e) for e in schema["enum"]]
        sem = "enum"
    elif ptype == "boolean":
        options = ["true", "false"]
        sem = "bool"
    elif ptype == "string" and values and all(isinstance(v, str) for v in values):
        hits = [v for v in values if v and v in user]
        if not hits:
            return None
        others = []
        for other, vals in call.items():
            if other == pname:
                continue
            for v in vals:
                if isinstance(v, str) and v and v in user and _norm(v) not in {
                        _norm(x) for x in values} and v not in others:
                    others.append(v)
        options = [hits[0]] + others
        sem = "copy_string"
    elif ptype == "integer" and values and all(isinstance(v, int) and not isinstance(v, bool)
                                               for v in values):
        nums = list(dict.fromkeys(_INT.findall(user)))
        if not any(str(v) in nums for v in values):
            return None
        options = nums[:12]
        if not any(str(v) in options for v in values):
            return None
        sem = "copy_integer"
    else:
        return None
    if len(set(options)) != len(options) or len(options) < 2:
        return None
    ok = {_norm(v) for v in values}
    if omit_ok and default is not None:
        ok.add(_norm(default))
    answer = [i for i, o in enumerate(options) if _norm(o) in ok]
    if len(answer) != 1:
        return None
    return tuple(options), answer, sem


def param_items(categories: Iterable[str] = PARAM_CATEGORIES,
                stats: dict | None = None) -> list[MultipleChoice]:
    """Parameter items (module docstring); ``stats`` gets counts per category and kind."""
    out = []
    for cat in categories:
        counts: dict[str, int] = {}
        for q, a in load_category(cat):
            if len(a["ground_truth"]) != 1:
                continue
            (fname, call), = a["ground_truth"][0].items()
            fn = next((f for f in q["function"] if f["name"] == fname), None)
            if fn is None:
                continue
            props = fn.get("parameters", {}).get("properties", {})
            user = _user_text(q["question"])
            for pname in sorted(call):
                schema = props.get(pname)
                if not isinstance(schema, dict) or not isinstance(call[pname], list):
                    continue
                made = _param_item(q, fn, pname, schema, call[pname], user, call)
                if made is None:
                    continue
                options, answer, sem = made
                order = list(range(len(options)))
                random.Random(_seed("param", q["id"], pname)).shuffle(order)
                options = tuple(options[i] for i in order)
                answer = [order.index(answer[0])]
                desc = " ".join(str(schema.get("description", "")).split())
                out.append(MultipleChoice(
                    context=(f"{_conversation(q['question'])}\n\nThe assistant calls "
                             f"{fname}: {' '.join(fn.get('description', '').split())}\n"
                             f"Parameter '{pname}': {desc}"),
                    question=(f"The assistant calls {fname}. Which value should its parameter "
                              f"'{pname}' take?"),
                    options=options,
                    meta={"kind": "l1_param", "category": cat, "id": q["id"], "param": pname,
                          "sem": sem, "answer": tuple(answer),
                          "oracle_answer": options[answer[0]]}))
                counts[sem] = counts.get(sem, 0) + 1
        if stats is not None:
            for sem, c in sorted(counts.items()):
                stats[f"param/{cat}/{sem}"] = c
    return out


def build_l1(limit_tool: int | None = None, limit_param: int | None = None,
             seed: int = 0) -> tuple[list[MultipleChoice], dict[str, Any]]:
    """All L1 items (or seeded subsets of ``limit_*`` items each) and their counts."""
    stats: dict[str, Any] = {}
    tools = tool_items(stats=stats)
    params = param_items(stats=stats)
    stats["tool/total"], stats["param/total"] = len(tools), len(params)
    if limit_tool is not None and limit_tool < len(tools):
        tools = random.Random(_seed("subset-tool", seed)).sample(tools, limit_tool)
    if limit_param is not None and limit_param < len(params):
        params = random.Random(_seed("subset-param", seed)).sample(params, limit_param)
    stats["used/tool"], stats["used/param"] = len(tools), len(params)
    stats["when2call"] = WHEN2CALL_NOTE
    return tools + params, stats
