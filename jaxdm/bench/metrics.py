"""Bench metrics: accuracy by group, expected calibration error, cost.

ECE (equal-width bins): the confidence of an answer is the probability of its chosen option;
answers fall into ``bins`` equal-width bins over [0, 1] (bin b holds b/B <= c < (b+1)/B, the
last bin also holds c = 1), and

    ECE = Σ_b (n_b / N) · | accuracy_b − mean confidence_b |

A *failed* answer (no answer came back: a server's outage, a malformed response) is not an
answer: it is left out of accuracy and ECE and counted (``failed``), and a resumed bench asks it
again. A *refused* question (the backend cannot take it, e.g. more options than a constrained
readout has labels) counts as wrong, as the backend cannot do it, and is left out of ECE
(``refused``).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

ECE_BINS = 10


def ece(confidence: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS) -> float:
    """Expected calibration error over equal-width bins (module docstring)."""
    c = np.asarray(confidence, float)
    y = np.asarray(correct, float)
    if c.shape != y.shape or c.ndim != 1:
        raise ValueError(f"confidence {c.shape} and correct {y.shape} must be equal 1-D shapes")
    if c.size == 0:
        return float("nan")
    if np.any(~np.isfinite(c)) or np.any((c < 0) | (c > 1)):
        raise ValueError("confidences must be finite numbers in [0, 1]")
    idx = np.minimum((c * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum() / c.size * abs(y[m].mean() - c[m].mean())
    return float(total)


def records(questions: Sequence[Any], results: Sequence[Any], level: str,
            refused: Iterable[int] = ()) -> list[dict]:
    """One record per question: level, kind, correct, confidence (None if failed), flags;
    ``refused``: positions of questions the backend refused (module docstring)."""
    if len(questions) != len(results):
        raise ValueError(f"{len(questions)} questions but {len(results)} results")
    refused = set(refused)
    out = []
    for k, (q, r) in enumerate(zip(questions, results)):
        ok = bool(r.ok and r.probs is not None and r.choice is not None)
        m = q.meta
        out.append({"level": level, "kind": m["kind"], "category": m.get("category"),
                    "correct": bool(ok and r.choice in m["answer"]),
                    "confidence": float(np.max(r.probs)) if ok else None, "failed": not ok,
                    "refused": not ok and k in refused, "error": None if ok else r.error,
                    "after_error": m.get("after_error"), "must_ask": m.get("must_ask"),
                    "n_options": len(q.options),
                    # the model's pick (index and text) beside the key: majority-class checks
                    "choice": int(r.choice) if ok else None,
                    "chosen": q.options[r.choice] if ok else None,
                    "answer": [int(i) for i in m["answer"]],
                    "tokens_in": r.cost.tokens_in, "usd": r.cost.usd})
    return out


def is_lost(rec: Mapping[str, Any]) -> bool:
    """A failed answer that is not a refusal: no answer came back (asked again on resume)."""
    return bool(rec["failed"]) and not rec.get("refused")


def summarize(recs: Iterable[Mapping[str, Any]], bins: int = ECE_BINS) -> dict[str, Any]:
    """n (questions), accuracy (over the questions with an answer or a refusal), ece (over the
    answers), failed (no answer came back: left out) and refused (counted wrong)."""
    recs = list(recs)
    answered = [r for r in recs if not r["failed"]]
    counted = [r for r in recs if not is_lost(r)]
    return {"n": len(recs), "accuracy": (sum(r["correct"] for r in counted) / len(counted)
                                         if counted else None),
            "ece": (ece([r["confidence"] for r in answered], [r["correct"] for r in answered],
                        bins) if answered else None),
            "failed": len(recs) - len(counted), "refused": len(counted) - len(answered)}


def breakdown(recs: Sequence[Mapping[str, Any]], bins: int = ECE_BINS) -> dict[str, Any]:
    """Accuracy / ECE overall, per level and kind (decision point), L2 after an error vs not,
    and L2 must-ask tool states separately."""
    out: dict[str, Any] = {"all": summarize(recs, bins)}
    for level in sorted({r["level"] for r in recs}):
        lv = [r for r in recs if r["level"] == level]
        out[level] = summarize(lv, bins)
        for kind in sorted({r["kind"] for r in lv}):
            out[f"{level}/{kind}"] = summarize([r for r in lv if r["kind"] == kind], bins)
        if level == "l2":
            out["l2/after_error"] = summarize([r for r in lv if r["after_error"]], bins)
            out["l2/no_error"] = summarize([r for r in lv if not r["after_error"]], bins)
            out["l2/tool/must_ask"] = summarize(
                [r for r in lv if r["kind"] == "tool" and r["must_ask"]], bins)
            out["l2/tool/not_must_ask"] = summarize(
                [r for r in lv if r["kind"] == "tool" and not r["must_ask"]], bins)
    return out


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """Kendall's τ-b between two equal-length sequences (``scipy.stats.kendalltau``) and its
    two-sided p-value; τ is None with fewer than two pairs or when either side is constant
    (τ undefined). Non-finite values are an error naming their position."""
    from scipy.stats import kendalltau  # why: scipy.stats ~0.7 s

    a, b = np.asarray(x, float), np.asarray(y, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"kendall_tau needs equal 1-D shapes, got {a.shape} and {b.shape}")
    bad = np.flatnonzero(~np.isfinite(a) | ~np.isfinite(b))
    if bad.size:
        raise ValueError(f"kendall_tau: non-finite value at position {int(bad[0])}")
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return {"tau": None, "p": None, "n": int(a.size)}
    res = kendalltau(a, b)
    return {"tau": float(res.statistic), "p": float(res.pvalue), "n": int(a.size)}


STEP_ACCURACY_LEVELS = ("l1", "l2", "l3")


def level_agreement(backends: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Kendall τ across backends between each level's step-level accuracy (L1, L2 question
    accuracy; L3 the model's own takeover choices) and L3 task success (the seed's point:
    isolated accuracy need not predict takeover success). Only backends with both numbers
    count; the backends used are listed."""
    out: dict[str, Any] = {}
    for level in STEP_ACCURACY_LEVELS:
        names, xs, ys = [], [], []
        for name, b in backends.items():
            acc = (b.get(level) or {}).get("accuracy")
            success = ((b.get("l3_tasks") or {}).get("all") or {}).get("success")
            if acc is None or success is None:
                continue
            names.append(name)
            xs.append(acc)
            ys.append(success)
        if names:
            out[f"{level}_accuracy_vs_l3_success"] = kendall_tau(xs, ys) | {"backends": names}
    return out
