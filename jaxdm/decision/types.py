"""Typed decision questions and results: the one interface every backend implements."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class MultipleChoice:
    """Choose one of ``options`` given ``context``; answered with a probability per option.

    ``option_names`` (optional): each option's leading name (``options[j]`` starts with
    ``option_names[j]``, e.g. a tool's name before ": description"). The likelihood interface
    then lists the full options in the prompt and scores only the names as the reply, so a
    69-tool question reads each description once instead of again in every option's
    continuation (~1,230 of its ~3,050 tokens); the other interfaces ignore it.
    """

    context: str
    question: str
    options: tuple[str, ...]
    # Out-of-band data (answer keys, ids); never shown to a model.
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    option_names: tuple[str, ...] | None = None

    def __post_init__(self):
        if isinstance(self.options, (str, bytes)) or not isinstance(self.options, Sequence):
            raise TypeError(f"MultipleChoice.options must be a sequence of strings, got {type(self.options).__name__}")
        object.__setattr__(self, "options", tuple(self.options))
        if not self.options:
            raise ValueError("MultipleChoice.options is empty")
        for i, o in enumerate(self.options):
            if not isinstance(o, str):
                raise TypeError(f"MultipleChoice.options[{i}] is {type(o).__name__}, expected str")
        if len(set(self.options)) != len(self.options):
            dup = sorted({o for o in self.options if self.options.count(o) > 1})
            raise ValueError(f"MultipleChoice.options has duplicates: {dup}")
        if self.option_names is not None:
            names = self.option_names
            if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
                raise TypeError("MultipleChoice.option_names must be a sequence of strings, got "
                                f"{type(names).__name__}")
            names = tuple(names)
            object.__setattr__(self, "option_names", names)
            if len(names) != len(self.options):
                raise ValueError(f"MultipleChoice.option_names has {len(names)} names for "
                                 f"{len(self.options)} options")
            for i, (n, o) in enumerate(zip(names, self.options)):
                if not isinstance(n, str) or not n.strip():
                    raise ValueError(f"MultipleChoice.option_names[{i}] must be a non-empty "
                                     f"string, got {n!r}")
                if not o.startswith(n):
                    raise ValueError(f"MultipleChoice.option_names[{i}] ({n!r}) is not the start "
                                     f"of options[{i}] ({o[:60]!r})")
            if len(set(names)) != len(names):
                dup = sorted({n for n in names if names.count(n) > 1})
                raise ValueError(f"MultipleChoice.option_names has duplicates: {dup}")


@dataclasses.dataclass(frozen=True)
class YesNo:
    """A yes/no question about ``context``; answered with a score in [0, 1] (P(yes))."""

    context: str
    question: str
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one answer cost: tokens in/out, money (None when unpriced) and wall seconds."""

    tokens_in: int = 0
    tokens_out: int = 0
    usd: float | None = None
    seconds: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        usd = None if self.usd is None and other.usd is None else (self.usd or 0.0) + (other.usd or 0.0)
        return Cost(self.tokens_in + other.tokens_in, self.tokens_out + other.tokens_out, usd,
                    self.seconds + other.seconds)


@dataclasses.dataclass(frozen=True)
class ChoiceResult:
    """Answer to a MultipleChoice. ``ok`` False means no answer (``error``, ``raw`` say why)."""

    probs: tuple[float, ...] | None
    choice: int | None
    ok: bool = True
    error: str | None = None
    raw: str | None = None
    cost: Cost = Cost()

    @property
    def confidence(self) -> float | None:
        """The largest option probability (that of the choice), None for a failed answer."""
        return None if self.probs is None else max(self.probs)


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    """Answer to a YesNo: ``score`` in [0, 1], or ``ok`` False with ``error``/``raw``."""

    score: float | None
    ok: bool = True
    error: str | None = None
    raw: str | None = None
    cost: Cost = Cost()


def choice_ok(probs: Sequence[float], cost: Cost = Cost(), raw: str | None = None) -> ChoiceResult:
    """A successful ChoiceResult over ``probs`` (one per option), the choice being the most probable
    option; a non-finite probability is a FloatingPointError."""
    probs = tuple(float(p) for p in probs)
    if not all(math.isfinite(p) for p in probs):
        raise FloatingPointError(f"non-finite option probabilities {probs}")
    best = max(range(len(probs)), key=probs.__getitem__)
    return ChoiceResult(probs=probs, choice=best, cost=cost, raw=raw)


def choice_failed(error: str, raw: str | None = None, cost: Cost = Cost()) -> ChoiceResult:
    """A ChoiceResult for a question that got no usable answer: no probabilities or choice, ok
    False, ``error`` saying why."""
    return ChoiceResult(probs=None, choice=None, ok=False, error=error, raw=raw, cost=cost)


def score_ok(score: float, cost: Cost = Cost(), raw: str | None = None) -> ScoreResult:
    """A successful ScoreResult; a score that is not finite or outside [0, 1] is a
    FloatingPointError."""
    score = float(score)
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise FloatingPointError(f"score {score} is not a finite number in [0, 1]")
    return ScoreResult(score=score, cost=cost, raw=raw)


def score_failed(error: str, raw: str | None = None, cost: Cost = Cost()) -> ScoreResult:
    """A ScoreResult for a question that got no usable answer: no score, ok False, ``error`` saying
    why."""
    return ScoreResult(score=None, ok=False, error=error, raw=raw, cost=cost)


class DecisionModel(Protocol):
    """What every backend implements (batched)."""

    name: str

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """One ChoiceResult per question, in order (a failed result, never an exception, for
        a question the backend could not answer)."""

    def score(self, questions: Sequence[YesNo]) -> list[ScoreResult]:
        """One ScoreResult per question, in order: the probability of yes (a failed result
        for a question the backend could not answer)."""
