"""Five modes of sharing a decision between the agent LLM and a decision model (seed 003).

A delegation is (decision point, mode, threshold). Confidence = the probability of the top
option. Each mode is two pure rules over the decision model's probabilities (registry
``MODE_RULES``; config validation reads ``MODES`` from it):

- ``before(probs)``: who decides before the LLM is asked: ``Plan("dm", choice)`` or
  ``Plan("llm", allowed)`` (``allowed`` None = every option);
- ``after(probs, proposal)``: given the LLM's proposal, ``None`` (keep it) or a new plan for a
  second LLM call (GUARD returns the proposal; TRIGGER on an action point runs a self-check).

Modes:

- REPLACE: the decision model always decides (no threshold).
- CASCADE(τ): adopt its answer when confidence ≥ τ, else the LLM decides; the decision-model
  call is always paid.
- ASSIST(k): it shortlists its top-k options (default 3), the LLM picks among them.
- GUARD(τ): the LLM proposes; the decision model returns the proposal when it prefers another
  option with confidence ≥ τ (the LLM then picks again without the returned option).
- TRIGGER(τ): it decides whether an optional step runs. Loop-control points: run iff
  P(run) ≥ τ (binary questions put "run" at index 0; for ``notes`` P(run) = 1 − P(no note)
  and the note read back is its top note). Action points (tool, params, next_action): the
  optional step is a self-check by the LLM (a second call with reflection), run iff the model
  gives the LLM's proposal a probability < τ.

Binary questions under ASSIST (k ≥ 2) shortlist both options: the LLM decides (stated).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, NamedTuple, Sequence

from jaxdm.registry import Registry
from jaxdm.roles.harness import ACTION_POINTS, NO_NOTE, POINTS, RUN


class Plan(NamedTuple):
    """What a mode decides for one question: ``who`` decides ("dm" or "llm"), the model's
    ``choice``, the options the LLM may pick and whether it reflects first."""

    who: str                              # "dm" or "llm"
    choice: int | None = None             # the decision model's option (who == "dm")
    allowed: tuple[int, ...] | None = None  # options the LLM may pick (None: all)
    reflect: bool = False                 # the LLM reflects first (TRIGGER self-check)


@dataclasses.dataclass(frozen=True)
class Delegation:
    """A decision point handed (partly) to the decision model: ``mode`` with ``threshold``
    (CASCADE / GUARD / TRIGGER; None = the mode's default) and shortlist size ``k`` (ASSIST)."""

    point: str
    mode: str
    threshold: float | None = None
    k: int = 3

    def __post_init__(self):
        if self.point not in POINTS:
            raise ValueError(f"delegation point {self.point!r} not in {list(POINTS)}")
        MODE_RULES.validate(self.mode, field="Delegation.mode")
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not 0.0 <= t <= 1.0):
            raise ValueError(f"delegation {self.point}/{self.mode}: threshold must be in [0, 1] "
                             f"or None, got {t!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"delegation {self.point}/{self.mode}: k must be a positive int, "
                             f"got {self.k!r}")

    @property
    def tau(self) -> float:
        """The threshold in effect: ``threshold``, or the mode's default."""
        return DEFAULT_THRESHOLD[self.mode] if self.threshold is None else float(self.threshold)

    @property
    def name(self) -> str:
        """Short label, e.g. ``tool/cascade@0.7`` or ``tool/assistk3``."""
        extra = f"@{self.tau:g}" if self.mode in ("cascade", "guard", "trigger") else (
            f"k{self.k}" if self.mode == "assist" else "")
        return f"{self.point}/{self.mode}{extra}"


def _top(probs: Sequence[float]) -> tuple[int, float]:
    i = max(range(len(probs)), key=lambda j: probs[j])
    return i, float(probs[i])


def _replace(d: Delegation, probs: Sequence[float], options: Sequence[str]) -> Plan:
    return Plan("dm", _top(probs)[0])


def _cascade(d: Delegation, probs: Sequence[float], options: Sequence[str]) -> Plan:
    i, c = _top(probs)
    return Plan("dm", i) if c >= d.tau else Plan("llm")


def _assist(d: Delegation, probs: Sequence[float], options: Sequence[str]) -> Plan:
    order = sorted(range(len(probs)), key=lambda j: (-probs[j], j))
    return Plan("llm", allowed=tuple(sorted(order[:d.k])))


def _llm_first(d: Delegation, probs: Sequence[float], options: Sequence[str]) -> Plan:
    return Plan("llm")


def _trigger(d: Delegation, probs: Sequence[float], options: Sequence[str]) -> Plan:
    if d.point in ACTION_POINTS:
        return Plan("llm")
    if d.point == "notes":  # read back the top note iff P(some note) >= tau
        none = options.index(NO_NOTE)
        if 1.0 - probs[none] >= d.tau:
            notes = [j for j in range(len(probs)) if j != none]
            return Plan("dm", max(notes, key=lambda j: probs[j]))
        return Plan("dm", none)
    return Plan("dm", RUN if probs[RUN] >= d.tau else 1 - RUN)


def _keep(d: Delegation, probs: Sequence[float], proposal: int, options: Sequence[str]
          ) -> Plan | None:
    return None


def _guard_after(d: Delegation, probs: Sequence[float], proposal: int, options: Sequence[str]
                 ) -> Plan | None:
    i, c = _top(probs)
    if i != proposal and c >= d.tau:
        return Plan("llm", allowed=tuple(j for j in range(len(probs)) if j != proposal))
    return None


def _trigger_after(d: Delegation, probs: Sequence[float], proposal: int,
                   options: Sequence[str]) -> Plan | None:
    if d.point in ACTION_POINTS and probs[proposal] < d.tau:
        return Plan("llm", reflect=True)
    return None


class ModeRule(NamedTuple):
    """A mode's two rules: ``before`` the LLM acts (probabilities -> Plan) and ``after`` it proposed
    an option (Plan, or None to keep the proposal)."""

    before: Callable[[Delegation, Sequence[float], Sequence[str]], Plan]
    after: Callable[[Delegation, Sequence[float], int, Sequence[str]], Plan | None]


MODE_RULES: Registry[ModeRule] = Registry("delegation mode")
MODE_RULES.register("replace", ModeRule(_replace, _keep))
MODE_RULES.register("cascade", ModeRule(_cascade, _keep))
MODE_RULES.register("assist", ModeRule(_assist, _keep))
MODE_RULES.register("guard", ModeRule(_llm_first, _guard_after))
MODE_RULES.register("trigger", ModeRule(_trigger, _trigger_after))
MODES = tuple(MODE_RULES)
DEFAULT_THRESHOLD: Mapping[str, float] = {"replace": 0.0, "cascade": 0.5, "assist": 0.0,
                                          "guard": 0.5, "trigger": 0.5}


def plan_before(d: Delegation, probs: Sequence[float], options: Sequence[str]) -> Plan:
    """The Plan of delegation ``d`` before the LLM acts, from the model's ``probs`` over
    ``options``."""
    return MODE_RULES[d.mode].before(d, probs, options)


def plan_after(d: Delegation, probs: Sequence[float], proposal: int, options: Sequence[str]
               ) -> Plan | None:
    """The Plan of delegation ``d`` once the LLM proposed option ``proposal`` (GUARD's return,
    TRIGGER's self-check), or None to keep the proposal."""
    return MODE_RULES[d.mode].after(d, probs, proposal, options)


def all_delegations(threshold: float = 0.5) -> list[Delegation]:
    """Every point x mode combination (40)."""
    return [Delegation(p, m, None if m in ("replace", "assist") else threshold)
            for p in POINTS for m in MODES]


__all__ = ["MODES", "MODE_RULES", "DEFAULT_THRESHOLD", "Delegation", "Plan", "plan_before",
           "plan_after", "all_delegations"]
