"""Shadow-mode threshold fitting: calibration per decision point, ``fit_threshold``, drift.

Calibration: the empirical accuracy of the decision model as a function of its confidence
(the top probability), per decision point, so confidence need not equal accuracy. We fit it
by **isotonic regression** (pool-adjacent-violators on the sorted confidences: the
non-decreasing step function closest in squared error to the 0/1 correctness) and also report
a **binned** reliability table (equal-width bins) for figures and ECE.

Threshold (seed 003): adopting the model's answer at a point is worthwhile when its accuracy
``c`` satisfies ``c ≥ τ* = max(0, q_L − ΔC / V)``; ``q_L`` is the LLM's accuracy at the point,
``ΔC`` the price saved per call, ``V`` the success lost per wrong choice, valued at
``value_per_task`` USD per solved task. The fitted threshold is the lowest confidence level
whose calibrated accuracy is ≥ τ* (isotonic: then every higher level is too; binned: the
lowest bin edge above which every non-empty bin is); with at least ``min_support`` shadow
answers at or above it. If no such level exists the LLM keeps the decision (threshold None).

Estimates from shadow records (``estimate_point``): q_L = share of the LLM's keyed answers
that are right; ΔC = the mean price of the LLM calls the point's decision can save (the step's
act call for tool / params; one answer's output tokens for loop points) minus the model's
price per question; V = value_per_task × (success rate of tasks without an LLM error at the
point − with one), at least ``min_value_share`` × value_per_task (a wrong choice is never free;
with no LLM errors observed V = value_per_task).

Drift (``DriftMonitor``): the share of answers above τ in a sliding window, against the share
at fit time; a refit is flagged when they differ by more than ``tolerance``.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np


def isotonic(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Pool-adjacent-violators: sorted ``x`` and the non-decreasing fit of ``y`` at each."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"isotonic: x and y must be 1-D of equal length, got {x.shape} and "
                         f"{y.shape}")
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    blocks: list[list[float]] = []  # [sum, count]
    for v in ys:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    fit = np.concatenate([np.full(int(c), s / c) for s, c in blocks]) if blocks else ys
    return xs, fit


def binned(x: Sequence[float], y: Sequence[float], n_bins: int = 10) -> list[dict[str, float]]:
    """Equal-width reliability bins over [0, 1]: lo, hi, n, mean confidence, accuracy."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.digitize(x, edges[1:-1], right=False), 0, n_bins - 1)
    out = []
    for b in range(n_bins):
        m = idx == b
        out.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "n": int(m.sum()),
                    "confidence": float(x[m].mean()) if m.any() else math.nan,
                    "accuracy": float(y[m].mean()) if m.any() else math.nan})
    return out


def ece(x: Sequence[float], y: Sequence[float], n_bins: int = 10) -> float:
    """Expected calibration error over equal-width bins."""
    n = len(x)
    if n == 0:
        return math.nan
    return float(sum(b["n"] / n * abs(b["accuracy"] - b["confidence"])
                     for b in binned(x, y, n_bins) if b["n"]))


class ThresholdFit(NamedTuple):
    """One decision point's fit (``fit_threshold``): τ*, the adopted threshold (None: the LLM keeps
    the point), the estimates q_L, ΔC and V, the support, the share of shadow answers above the
    threshold and the model's accuracy on them, and the calibration method."""

    point: str
    tau_star: float                 # max(0, q_L - ΔC / V)
    threshold: float | None         # lowest confidence adopted; None: the LLM keeps the point
    q_llm: float
    delta_cost: float
    value: float
    n: int
    share_above: float              # share of shadow answers with confidence >= threshold
    accuracy_above: float           # model accuracy on those answers (nan if none)
    method: str


CALIBRATIONS = ("isotonic", "binned")


def fit_threshold(confidence: Sequence[float], correct: Sequence[bool], *, q_llm: float,
                  delta_cost: float, value: float, method: str = "isotonic",
                  min_support: int = 1, n_bins: int = 10, point: str = "") -> ThresholdFit:
    """τ* = max(0, q_L − ΔC/V) and the lowest confidence whose calibrated accuracy ≥ τ*.

    Args:
      confidence: [n] the model's top probability on each shadow question of the point.
      correct: [n] whether its top option was in the answer key.
      q_llm: the LLM's accuracy at the point; delta_cost: price saved per call (USD);
      value: V, success lost per wrong choice in USD (> 0).
      method: "isotonic" or "binned" calibration; min_support: answers needed at or above
      the threshold.
    """
    conf = np.asarray(confidence, dtype=np.float64)
    corr = np.asarray(correct, dtype=np.float64)
    if conf.ndim != 1 or conf.shape != corr.shape:
        raise ValueError(f"fit_threshold: confidence {conf.shape} and correct {corr.shape} must "
                         "be 1-D of equal length")
    if conf.size and (not np.all(np.isfinite(conf)) or conf.min() < 0 or conf.max() > 1):
        raise ValueError(f"fit_threshold{' ' + point if point else ''}: confidences must be "
                         "finite and in [0, 1]")
    for name, v in (("q_llm", q_llm), ("delta_cost", delta_cost), ("value", value)):
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            raise ValueError(f"fit_threshold: {name} must be a finite number, got {v!r}")
    if not 0.0 <= q_llm <= 1.0:
        raise ValueError(f"fit_threshold: q_llm must be in [0, 1], got {q_llm}")
    if value <= 0:
        raise ValueError(f"fit_threshold: value (V) must be > 0, got {value}")
    if method not in CALIBRATIONS:
        raise ValueError(f"fit_threshold: method must be one of {CALIBRATIONS}, got {method!r}")
    tau_star = max(0.0, q_llm - delta_cost / value)
    threshold = None
    if conf.size:
        if method == "isotonic":
            xs, fit = isotonic(conf, corr)
            for i in range(xs.size):
                if fit[i] >= tau_star and (xs >= xs[i]).sum() >= min_support:
                    threshold = float(xs[i])
                    break
        else:
            bins = binned(conf, corr, n_bins)
            for b in range(n_bins):
                above = [c for c in bins[b:] if c["n"]]
                if above and all(c["accuracy"] >= tau_star for c in above) and \
                        sum(c["n"] for c in above) >= min_support and bins[b]["n"]:
                    threshold = float(bins[b]["lo"])
                    break
    if threshold is not None:
        m = conf >= threshold
        share, acc = float(m.mean()), float(corr[m].mean()) if m.any() else math.nan
    else:
        share, acc = 0.0, math.nan
    return ThresholdFit(point, float(tau_star), threshold, float(q_llm), float(delta_cost),
                        float(value), int(conf.size), share, acc, method)


# ---- estimates from shadow records -----------------------------------------------------------

ACT_POINTS = ("tool", "params", "next_action")


def estimate_point(records: Iterable[Mapping[str, Any]], episodes: Iterable[Mapping[str, Any]],
                   point: str, *, value_per_task: float = 1.0, llm_price_per_answer: float,
                   act_call_price: float, dm_price_per_question: float,
                   min_value_share: float = 0.05) -> dict[str, Any]:
    """q_L, ΔC, V and the model's (confidence, correct) pairs at ``point`` (module docstring).

    ``records``: shadow decision records (dicts as written to JSONL); ``episodes``: episode
    summaries (task_id, success)."""
    recs = [r for r in records if r["point"] == point and r.get("answer") is not None]
    llm = [bool(r["llm_correct"]) for r in recs if r.get("llm_correct") is not None]
    pairs = [(float(r["confidence"]), bool(r["dm_correct"])) for r in recs
             if r.get("confidence") is not None and r.get("dm_correct") is not None]
    q_llm = float(np.mean(llm)) if llm else 1.0
    saved = act_call_price if point in ACT_POINTS else llm_price_per_answer
    delta_cost = saved - dm_price_per_question
    success = {e["task_id"]: bool(e["success"]) for e in episodes}
    erred = {r["task_id"] for r in recs if r.get("llm_correct") is False}
    with_err = [success[t] for t in success if t in erred]
    without = [success[t] for t in success if t not in erred]
    if with_err and without:
        loss = float(np.mean(without)) - float(np.mean(with_err))
    else:
        loss = 1.0
    value = value_per_task * max(loss, min_value_share)
    return {"point": point, "q_llm": q_llm, "delta_cost": delta_cost, "value": value,
            "n_llm": len(llm), "confidence": [c for c, _ in pairs],
            "correct": [k for _, k in pairs]}


# ---- drift -----------------------------------------------------------------------------------

@dataclasses.dataclass
class DriftMonitor:
    """Share of answers with confidence ≥ ``threshold`` over a sliding ``window``, against
    ``reference_share`` (the share at fit time); ``needs_refit`` once the window is full and
    the two differ by more than ``tolerance``."""

    threshold: float
    reference_share: float
    window: int = 200
    tolerance: float = 0.15
    history: list[float] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if not 0.0 <= self.threshold <= 1.0 or not 0.0 <= self.reference_share <= 1.0:
            raise ValueError("DriftMonitor: threshold and reference_share must be in [0, 1]")
        if self.window < 1 or not self.tolerance > 0:
            raise ValueError("DriftMonitor: window >= 1 and tolerance > 0 are required")
        self._recent: collections.deque[bool] = collections.deque(maxlen=self.window)

    def update(self, confidence: float) -> float:
        """Add one answer's confidence; returns the current share above the threshold."""
        if not (isinstance(confidence, (int, float)) and math.isfinite(confidence)):
            raise ValueError(f"DriftMonitor.update: confidence must be finite, got {confidence!r}")
        self._recent.append(confidence >= self.threshold)
        share = sum(self._recent) / len(self._recent)
        self.history.append(share)
        return share

    @property
    def share(self) -> float:
        """Share of the window's answers at or above the threshold (nan before the first)."""
        return sum(self._recent) / len(self._recent) if self._recent else math.nan

    @property
    def needs_refit(self) -> bool:
        """Whether the window is full and its share is more than ``tolerance`` from the reference
        share."""
        return len(self._recent) == self.window and \
            abs(self.share - self.reference_share) > self.tolerance


__all__ = ["isotonic", "binned", "ece", "ThresholdFit", "fit_threshold", "CALIBRATIONS",
           "estimate_point", "DriftMonitor"]
