"""Decision models for the harness beyond ``jaxdm.decision.make_backend``'s backends.

- ``NoisyOracle`` ("oracle_noisy"): answers DECISION GYM / harness questions from their keys
  (``meta["answer"]``) with a set accuracy per decision point and an *informative but
  uncalibrated* confidence: a right answer's top probability is drawn from Beta(a_right,
  b_right), a wrong one's from Beta(a_wrong, b_wrong), seeded per question (named settings:
  ``CONFIDENCE_SETTINGS``; its errors can be coupled with the simulated LLM's,
  ``jaxdm.harness.coupling``). Confidence then
  separates right from wrong answers only partly, which is what threshold fitting needs to
  discover (the plain ``Oracle`` puts the same confidence on every answer).
- ``BM25Shortlist`` ("bm25"): the seed's retrieval control. It scores options (tool names and
  descriptions) by BM25 (bm25s) against the user's request and replies in the dialogue, so
  ASSIST gets a keyword shortlist instead of a decision model's.
- ``RandomTrigger`` ("random_trigger"): the random-trigger control (runs an optional step at
  a given rate, the fitted TRIGGER's measured call rate).
- ``PointsOnly`` ("points_only"): another decision model restricted to some decision
  points; questions of other points get a failed answer naming the restriction (the harness
  then leaves them to the LLM and counts the failure), so a slow model can shadow / decide the
  cheap points only (e.g. ``stop`` and ``params``, not the 69-option ``tool`` question).
- ``RandomConfidence`` ("random_confidence"): another decision model's answers with their
  confidence replaced by a seeded uniform draw (the answer stays the top option), so a
  CASCADE at τ delegates a share of decisions set by τ alone: RouteLLM's random router, the
  control a cost-quality curve (and its APGR) is compared with.
- ``make_dm(spec)``: these five kinds, else ``jaxdm.decision.make_backend``; a spec string
  (``"oracle_noisy:default_accuracy=0.8"``, ``"oracle"``, ``"local_likelihood:path=smollm2"``)
  is parsed by ``jaxdm.decision.parse_backend_spec``.
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxdm.decision import make_backend
from jaxdm.decision.specs import parse_backend_spec
from jaxdm.decision.types import ChoiceResult, Cost, MultipleChoice, choice_failed, choice_ok
from jaxdm.harness.coupling import check_correlation, coupled_uniform
from jaxdm.registry import Registry, UnknownNameError
from jaxdm.roles.harness import POINTS


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


# Named confidence settings of NoisyOracle: (right, wrong) Beta parameters of the top
# probability. "informative": the harness results' default (AUC of right vs wrong 0.913,
# ``confidence_auc``); "overlap": the two overlap (AUC 0.559), confidence says little.
CONFIDENCE_SETTINGS: Registry[tuple[tuple[float, float], tuple[float, float]]] = Registry(
    "oracle_noisy confidence setting")
CONFIDENCE_SETTINGS.register("informative", ((6.0, 1.5), (2.0, 2.5)))
CONFIDENCE_SETTINGS.register("overlap", ((3.0, 2.0), (2.5, 2.0)))


def confidence_auc(right: tuple[float, float], wrong: tuple[float, float]) -> float:
    """P(confidence of a right answer > that of a wrong one) for Beta(*right) vs Beta(*wrong):
    the AUC of confidence as a right-vs-wrong classifier (before the 1/n clip, which moves it
    by < 1e-3 for the harness's questions)."""
    from scipy import integrate, stats  # why: report and tests only

    r, w = stats.beta(*right), stats.beta(*wrong)
    value, _ = integrate.quad(lambda x: r.pdf(x) * w.cdf(x), 0.0, 1.0, limit=200)
    return float(value)


class NoisyOracle:
    """Key-reading decision model with per-point accuracy and an informative confidence.

    ``confidence``: a ``CONFIDENCE_SETTINGS`` name giving the (right, wrong) Beta parameters,
    or ``right`` / ``wrong`` given directly (not both). ``correlation`` ρ couples its right /
    wrong draw to the question's ``meta["decision_key"]`` latent (``jaxdm.harness.coupling``):
    with the simulated LLM at the same ρ the two err together at latent correlation ρ; at 0
    the draws are the independent ones of before."""

    def __init__(self, accuracy: Mapping[str, float] | None = None, default_accuracy: float = 0.9,
                 right: tuple[float, float] | None = None,
                 wrong: tuple[float, float] | None = None, seed: int = 0,
                 price_per_call: float = 0.0, latency_s: float = 0.0,
                 name: str | None = None, confidence: str | None = None,
                 correlation: float = 0.0):
        self.accuracy = dict(accuracy or {})
        for k, v in {**self.accuracy, "default_accuracy": default_accuracy}.items():
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"oracle_noisy: accuracy {k}={v!r} must be in [0, 1]")
        if confidence is not None and (right is not None or wrong is not None):
            raise ValueError(f"oracle_noisy: give confidence={confidence!r} or right / wrong "
                             f"Beta parameters, not both")
        setting = "informative" if confidence is None else confidence
        try:
            right_d, wrong_d = CONFIDENCE_SETTINGS.get(setting, field="oracle_noisy.confidence")
        except UnknownNameError as e:
            raise ValueError(str(e)) from None
        right = right_d if right is None else right
        wrong = wrong_d if wrong is None else wrong
        for k, ab in (("right", right), ("wrong", wrong)):
            if len(ab) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                       and math.isfinite(x) and x > 0 for x in ab):
                raise ValueError(f"oracle_noisy: {k} must be two positive Beta parameters, "
                                 f"got {ab!r}")
        self.default_accuracy = float(default_accuracy)
        self.right, self.wrong = tuple(right), tuple(wrong)
        self.correlation = check_correlation(correlation, "oracle_noisy")
        self.seed = int(seed)
        self.price_per_call = float(price_per_call)
        self.latency_s = float(latency_s)
        self.name = name or f"oracle_noisy(seed={self.seed})"

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """One answer per question: with the point's accuracy the keyed option is on top (its
        confidence drawn from Beta(*right)), else a wrong one (Beta(*wrong)); the other options
        share the rest; seeded per question (the right / wrong draw coupled to the decision's
        latent at ``correlation`` > 0); a question without a key fails by name."""
        out = []
        for i, q in enumerate(questions):
            if not isinstance(q, MultipleChoice):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected MultipleChoice")
            answer = tuple(q.meta.get("answer") or ())
            n = len(q.options)
            if not answer:
                out.append(choice_failed(f"questions[{i}] has no answer key in meta['answer']"))
                continue
            dkey = q.meta.get("decision_key")
            if self.correlation > 0 and not dkey:
                out.append(choice_failed(f"questions[{i}] has no meta['decision_key'], which "
                                         f"correlation={self.correlation} needs"))
                continue
            point = q.meta.get("point", q.meta.get("kind", ""))
            acc = float(self.accuracy.get(point, self.default_accuracy))
            rng = np.random.default_rng(_seed(self.seed, q.context, q.question, q.options))
            wrong = [j for j in range(n) if j not in answer]
            is_right = not wrong or coupled_uniform(rng.random(), dkey, self.correlation) < acc
            top = answer[0] if is_right else int(rng.choice(wrong))
            a, b = self.right if is_right else self.wrong
            conf = float(rng.beta(a, b))
            conf = min(max(conf, 1.0 / n + 1e-6), 1.0 - 1e-6) if n > 1 else 1.0
            rest = (1.0 - conf) / (n - 1) if n > 1 else 0.0
            probs = [conf if j == top else rest for j in range(n)]
            out.append(choice_ok(probs, cost=Cost(usd=self.price_per_call,
                                                  seconds=self.latency_s)))
        return out


# Turns of a DECISION GYM context (envs/decision_gym/env.py render_context): after the
# "Conversation:" line, each turn starts with its speaker; a customer message may run on.
CONVERSATION_MARK = "Conversation:"
USER_TURN, AGENT_TURN, RESULT_TURN = "Customer:", "Agent:", "Result:"
BM25_QUERIES = ("request", "dialogue", "tail")


def dialogue_turns(context: str) -> list[tuple[str, str]]:
    """(speaker prefix, text) of each turn after the context's ``Conversation:`` line (lines
    that start no turn continue the one before); [] when the context has none."""
    lines = context.splitlines()
    if CONVERSATION_MARK not in lines:
        return []
    turns: list[tuple[str, str]] = []
    for line in lines[lines.index(CONVERSATION_MARK) + 1:]:
        who = next((t for t in (USER_TURN, AGENT_TURN, RESULT_TURN) if line.startswith(t)),
                   None)
        if who is not None:
            turns.append((who, line[len(who):].strip()))
        elif turns:
            turns[-1] = (turns[-1][0], f"{turns[-1][1]}\n{line}")
    return turns


class BM25Shortlist:
    """The retrieval baseline: scores options by BM25 (bm25s) over their whole text (a tool
    option is "name: description", the name's underscores read as spaces) against a query
    made from the context, then a softmax over the scores.

    ``query``: "request" (default) the user's turns of the dialogue (the request and every
    later reply of the customer); "dialogue" the user's and the agent's turns (the agent's
    calls, not the tools' results); "tail" the context's last ``tail_lines`` lines (the
    earlier control: mostly a tool result, so it rarely names the next tool). A context
    without a ``Conversation:`` section is the query whole. The question text is always
    added."""

    def __init__(self, query: str = "request", tail_lines: int = 4, name: str = "bm25"):
        if query not in BM25_QUERIES:
            raise ValueError(f"bm25 query must be one of {list(BM25_QUERIES)}, got {query!r}")
        if not (isinstance(tail_lines, int) and tail_lines >= 1):
            raise ValueError(f"bm25 tail_lines must be an int >= 1, got {tail_lines!r}")
        self.query, self.tail_lines, self.name = query, tail_lines, name

    def query_text(self, q: MultipleChoice) -> str:
        """What the options are scored against (see the class docstring)."""
        if self.query == "tail":
            text = "\n".join(q.context.splitlines()[-self.tail_lines:])
        else:
            keep = (USER_TURN,) if self.query == "request" else (USER_TURN, AGENT_TURN)
            turns = dialogue_turns(q.context)
            text = "\n".join(t for who, t in turns if who in keep) if turns else q.context
        return f"{text}\n{q.question}"

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """One answer per question: the softmax of the options' BM25 scores against ``query_text``
        (uniform when the query has no term); cost: the measured seconds."""
        import bm25s  # why: bm25s ~0.13 s, bm25 arm only
        out = []
        for q in questions:
            t0 = time.perf_counter()
            corpus = bm25s.tokenize([o.replace("_", " ") for o in q.options], stopwords="en",
                                    show_progress=False)
            retriever = bm25s.BM25()
            retriever.index(corpus, show_progress=False)
            qt = bm25s.tokenize([self.query_text(q).replace("_", " ")], stopwords="en",
                                show_progress=False, return_ids=False)[0]
            scores = np.asarray(retriever.get_scores(qt), dtype=np.float64) if qt else \
                np.zeros(len(q.options))
            z = np.exp(scores - scores.max()) if scores.size else scores
            probs = (z / z.sum()).tolist()
            out.append(choice_ok(probs, cost=Cost(seconds=time.perf_counter() - t0)))
        return out


def make_dm(spec: Mapping[str, Any] | str) -> Any:
    """A decision model from a dict: {"kind": "oracle_noisy", ...}, {"kind": "bm25"} (a
    ``DM_KINDS`` kind), or any ``jaxdm.decision.make_backend`` spec (oracle, local_readout,
    local_likelihood, remote...); or the same as a spec string
    (``jaxdm.decision.parse_backend_spec``)."""
    if isinstance(spec, str):
        spec = parse_backend_spec(spec, what="decision model", with_name=False)
        if spec.get("kind") == "oracle":
            spec.pop("name", None)  # the alias's display name is not an Oracle option
    if not isinstance(spec, Mapping):
        raise TypeError(f"decision model spec must be a mapping or a string, got "
                        f"{type(spec).__name__}")
    kind = spec.get("kind")
    if kind in DM_KINDS:
        return DM_KINDS.get(kind)({k: v for k, v in spec.items() if k != "kind"})
    return make_backend(spec)


class PointsOnly:
    """``dm`` answering only questions whose ``meta["point"]`` is in ``points`` (see module
    docstring); the others fail without reaching ``dm``."""

    def __init__(self, dm: Any, points: Sequence[str]):
        if isinstance(points, str) or not points:
            raise ValueError(f"points_only: points must be a non-empty list, got {points!r}")
        bad = sorted(set(points) - set(POINTS))
        if bad:
            raise ValueError(f"points_only: unknown decision point(s) {bad}; known: "
                             f"{list(POINTS)}")
        self.dm, self.points = dm, tuple(points)
        self.name = f"{getattr(dm, 'name', 'dm')}[{','.join(self.points)}]"

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """The wrapped model's answers for the questions at ``points`` (asked in one call), a named
        failure for every other question."""
        mine = [i for i, q in enumerate(questions) if q.meta.get("point") in self.points]
        out: list[ChoiceResult] = [choice_failed(
            f"point {q.meta.get('point')!r} not delegated to this model (points_only "
            f"{list(self.points)})") for q in questions]
        if mine:
            for i, r in zip(mine, self.dm.choose([questions[i] for i in mine])):
                out[i] = r
        return out


class RandomTrigger:
    """The seed's random-trigger control: for a binary loop-control question it puts
    probability ~1 on "run" (option 0) with probability ``rate``, else ~0, seeded per question,
    so TRIGGER at τ = 0.5 runs the optional step at ``rate`` (the fitted TRIGGER's call rate)."""

    def __init__(self, rate: float, seed: int = 0, name: str | None = None):
        if not (isinstance(rate, (int, float)) and 0.0 <= rate <= 1.0):
            raise ValueError(f"random_trigger: rate must be in [0, 1], got {rate!r}")
        self.rate, self.seed = float(rate), int(seed)
        self.name = name or f"random_trigger(rate={self.rate:.3f})"

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """One answer per question: probability 0.99 on option 0 (run the step) with probability
        ``rate``, else on the last option; seeded per question."""
        out = []
        for q in questions:
            rng = np.random.default_rng(_seed("rt", self.seed, q.context, q.question, q.options))
            n = len(q.options)
            run = rng.random() < self.rate
            top = 0 if run else n - 1
            probs = [0.99 if j == top else 0.01 / (n - 1) for j in range(n)] if n > 1 else [1.0]
            out.append(choice_ok(probs))
        return out


class RandomConfidence:
    """``dm``'s answers, each with a confidence drawn uniformly from [1/n, 1] (n options),
    seeded per question, independent of whether the answer is right: the rest of the
    probability is spread evenly over the other options, so the answer stays the top one."""

    def __init__(self, dm: Any, seed: int = 0):
        self.dm, self.seed = dm, int(seed)
        self.name = f"random_confidence({getattr(dm, 'name', 'dm')})"

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """The wrapped model's answers (its failures kept) with random confidences."""
        out = []
        for q, r in zip(questions, self.dm.choose(questions)):
            n = len(q.options)
            if not r.ok or n < 2:
                out.append(r)
                continue
            rng = np.random.default_rng(_seed("rc", self.seed, q.context, q.question, q.options))
            top = 1.0 / n + (1.0 - 1.0 / n) * rng.random()
            # ties at top = 1/n would let max() pick another option: nudge the chosen one up
            top = max(top, 1.0 / n + 1e-6)
            rest = (1.0 - top) / (n - 1)
            out.append(choice_ok([top if j == r.choice else rest for j in range(n)],
                                 cost=r.cost, raw=r.raw))
        return out


def _random_confidence(opts: dict[str, Any]) -> RandomConfidence:
    if "dm" not in opts or set(opts) - {"dm", "seed"}:
        raise ValueError(f"decision model kind 'random_confidence' takes 'dm' and optionally "
                         f"'seed', got {sorted(opts)}")
    return RandomConfidence(make_dm(opts["dm"]), opts.get("seed", 0))


def _construct(kind: str, cls: type, opts: dict[str, Any]) -> Any:
    try:
        return cls(**opts)
    except TypeError as e:
        raise ValueError(f"decision model kind {kind!r}: {e}") from None


def _oracle_noisy(opts: dict[str, Any]) -> NoisyOracle:
    for key in ("right", "wrong"):
        if opts.get(key) is not None:
            opts[key] = tuple(opts[key])
    return _construct("oracle_noisy", NoisyOracle, opts)


def _points_only(opts: dict[str, Any]) -> PointsOnly:
    if set(opts) != {"points", "dm"}:
        raise ValueError(f"decision model kind 'points_only' takes exactly 'points' and "
                         f"'dm', got {sorted(opts)}")
    return PointsOnly(make_dm(opts["dm"]), opts["points"])


# make_dm's own kinds -> build(options); any other kind is a jaxdm.decision.make_backend kind.
DM_KINDS: Registry[Callable[[dict[str, Any]], Any]] = Registry("decision model kind")
DM_KINDS.register("oracle_noisy", _oracle_noisy)
DM_KINDS.register("bm25", lambda opts: _construct("bm25", BM25Shortlist, opts))
DM_KINDS.register("random_trigger", lambda opts: _construct("random_trigger", RandomTrigger, opts))
DM_KINDS.register("points_only", _points_only)
DM_KINDS.register("random_confidence", _random_confidence)


__all__ = ["NoisyOracle", "CONFIDENCE_SETTINGS", "confidence_auc", "BM25Shortlist", "dialogue_turns", "RandomTrigger", "PointsOnly",
           "RandomConfidence", "make_dm", "DM_KINDS"]
