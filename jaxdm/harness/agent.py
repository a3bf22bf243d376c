"""The agent loop: an agent LLM makes every decision of a DECISION GYM episode unless a
delegation hands it (partly) to a decision model.

Per step the harness lists the decision points as typed ``MultipleChoice`` questions
(``jaxdm.roles.harness``; the gym's own builders for tool / parameters / stop, which carry the
answer keys in ``meta``):

1. loop control before acting: ``memory`` (write a note about the last result? the note is the
   harness's copy of that result), ``reflect`` (reflect on the last step first?), ``notes``
   (which note to read back into the prompt), ``route`` (send this step's LLM call to the
   cheaper tier?), ``stop`` (finish now?); each only when its optional step is enabled
   (``AgentConfig``), ``stop`` always;
2. ``tool``: which of the 69 tools; then ``params``: one question per bounded or copyable,
   key-constrained parameter of the chosen tool (free text is only ever written by the LLM).

The decision model answers the delegated questions of a step in one batched call (two when
parameters follow a tool it chose); each delegation's mode (``jaxdm.harness.modes``) turns its
probabilities into "the model decides" or "the LLM decides (among these options)". Everything
the LLM holds in a step is asked in ONE call (its native tool call answers tool and
parameters; loop-control questions ride along), plus a second call only when GUARD returns a
proposal or TRIGGER runs a self-check. Stated choices where the seed is silent:

- the LLM does not route itself: held by the LLM, ``route`` keeps the step on the main LLM;
- ``stop`` held by the LLM is its tool choice (``finish`` = stop); a model that decides
  "continue" removes ``finish`` from the LLM's tools; "finish" calls it;
- a note read back by the model's decision enters this step's prompt; one picked by the LLM
  enters its next call's prompt; a reflection costs output tokens in the step's call and, for
  the SimulatedLLM, lowers its error rate in that call;
- when the model decides every question of a step, no LLM call is made: required arguments
  without a question are copied from the context and optional free text is left out; when the
  model chose the tool but the LLM is called anyway (it holds a parameter or a loop question),
  the call offers that one tool and the LLM writes the remaining arguments;
- a "(omit)" answer to an optional parameter removes it.

Any decision-model failure (an exception, ``ok`` False, a missing key for the keyed
NoisyOracle) gives the decision to the LLM and is counted; the agent never stops because of
the decision model. Shadow mode: the model answers every listed question but never acts.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Generator, Mapping, Sequence

from jaxdm.decision.types import ChoiceResult, MultipleChoice
from jaxdm.envs.decision_gym import (format_action, option_value, param_questions, render_context,
                                     stop_question, tool_question)
from jaxdm.envs.decision_gym import tools as gym_tools
from jaxdm.envs.decision_gym.plan import normalize
from jaxdm.envs.decision_gym.questions import OMIT
from jaxdm.envs.decision_gym.world import SHIFT
from jaxdm.harness.coupling import decision_key
from jaxdm.harness.llm import fill_args
from jaxdm.harness.llm_call import AgentLLM, HeldQuestion, LLMReply, LLMRequest
from jaxdm.harness.modes import Delegation, Plan, plan_after, plan_before
from jaxdm.roles import harness as hq

_SCHEMAS: dict[tuple[str, bool], dict] = {}
# An episode as a generator of its env transitions (``Harness.episode``): it yields
# ("reset", seed) and receives (obs, state), then per action ("step", key, state, action) and
# receives (obs, state, reward, done, info), and returns the Episode. The agent's logic lives
# in the generator; whoever drives it runs the env: ``play_locally`` in this process, or
# ``jaxdm.harness.pool`` on an env pool's workers (the LLM and the decision model stay here).
EpisodeSteps = Generator[tuple, Any, "Episode"]
READ_TOOLS = ("find_customer", "get_order", "get_product", "ask_customer")
EASY_TOOLS = frozenset({"find_customer", "get_order", "get_product", "finish"})
# task indices stay below the split ranges' first seed (envs/decision_gym/world.py): 1e9
MAX_TASK_OFFSET = 100_000_000


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """The agent's optional steps (each enables its decision point) and its accounting: the
    ``agent:`` section of a harness config, and the settings of a ``Harness``.

    ``window``: conversation turns kept in the LLM's prompt (None: all); read-back notes bring
    older results back. ``max_llm_retries``: further tries of a failed LLM call.
    ``dm_price_per_call`` (USD) / ``dm_latency_s`` are added per decision-model call (a served
    model's price and time; a backend's own reported cost is added too): the defaults price a
    served model, ``BACKEND_COST_ONLY`` adds nothing. ``note_chars``: characters of a result
    kept in a memory note. ``task_offset``: task index i of a pass plays the split's task
    i + task_offset (another harness seed's tasks, e.g. ``experiments/harness_sensitivity.py``;
    0: the tasks of every pass so far).
    """

    memory: bool = False
    reflection: bool = False
    cheap_tier: bool = False
    read_back: bool = False
    window: int | None = None
    max_llm_retries: int = 2
    dm_price_per_call: float = 0.00004
    dm_latency_s: float = 0.2
    note_chars: int = 300
    task_offset: int = 0

    def __post_init__(self):
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"AgentConfig.window must be a positive int or None, got "
                             f"{self.window!r}")
        if self.max_llm_retries < 0:
            raise ValueError("AgentConfig.max_llm_retries must be >= 0")
        for key in ("dm_price_per_call", "dm_latency_s"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"AgentConfig.{key} must be a finite number >= 0, got {v!r}")
        if not (isinstance(self.note_chars, int) and self.note_chars >= 1):
            raise ValueError(f"AgentConfig.note_chars must be a positive int, got "
                             f"{self.note_chars!r}")
        if isinstance(self.task_offset, bool) or not isinstance(self.task_offset, int) or \
                not 0 <= self.task_offset <= MAX_TASK_OFFSET:
            raise ValueError(f"AgentConfig.task_offset must be an int in [0, {MAX_TASK_OFFSET}], "
                             f"got {self.task_offset!r}")


# A harness built in code without settings: a decision-model call costs what its backend
# reports, nothing added (a config's ``agent:`` defaults price a served model instead).
BACKEND_COST_ONLY = AgentConfig(dm_price_per_call=0.0, dm_latency_s=0.0)


@dataclasses.dataclass
class DecisionRecord:
    """One decision: who made it, the model's answer and confidence, the LLM's, the key."""

    task_id: str
    step: int
    point: str
    mode: str                  # the delegation's name, "llm" or "shadow"
    who: str                   # "llm" | "dm" | "llm_fallback" (model failed) | "implied"
    choice: int | None
    n_options: int
    dm_choice: int | None = None
    confidence: float | None = None
    probs: tuple[float, ...] | None = None
    llm_choice: int | None = None
    answer: tuple[int, ...] | None = None
    cost_usd: float = 0.0      # the decision model's price attributed to this decision
    latency_s: float = 0.0
    param: str | None = None
    outcome: bool | None = None  # task success, filled in when the episode ends

    @property
    def correct(self) -> bool | None:
        """Whether the decision taken is keyed right (None: no key or no choice)."""
        return None if self.answer is None or self.choice is None else self.choice in self.answer

    @property
    def dm_correct(self) -> bool | None:
        """Whether the decision model's answer is keyed right (None: no key or no answer)."""
        return None if self.answer is None or self.dm_choice is None else \
            self.dm_choice in self.answer

    @property
    def llm_correct(self) -> bool | None:
        """Whether the LLM's choice is keyed right (None: no key or the LLM did not choose)."""
        return None if self.answer is None or self.llm_choice is None else \
            self.llm_choice in self.answer

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the full distribution only in shadow records (the fitting data)."""
        d = dataclasses.asdict(self)
        if self.mode != "shadow":
            d.pop("probs")
        d.update(correct=self.correct, dm_correct=self.dm_correct, llm_correct=self.llm_correct)
        return d


@dataclasses.dataclass
class CallRecord:
    """One model call of an episode (``kind`` "llm" or "dm"): tokens, USD, seconds, whether it
    succeeded and its error, and the answers that never came back."""

    kind: str          # "llm" | "dm"
    model: str
    step: int
    tokens_in: int = 0
    tokens_out: int = 0
    usd: float = 0.0
    seconds: float = 0.0
    ok: bool = True
    error: str | None = None
    # answers that never came back (an LLM call: 1 when its request failed; a decision-model
    # call: its answers lost to failed requests); any makes the episode incomplete
    unanswered: int = 0


@dataclasses.dataclass
class Episode:
    """One task's run. ``incomplete``: some agent-LLM call or decision-model answer got no
    answer (a server down or its transport failing, ``llm_unanswered`` / ``dm_unanswered``):
    the episode measured the outage, not the method, so it is never counted as a success or a
    failure (``jaxdm.harness.passes`` flags it and a resumed command runs it again). Failures the
    model itself produced (a reply without a tool call, a question it cannot take) are the
    method's: counted in ``llm_failures`` / ``dm_failures``, the LLM decides, the episode
    counts."""

    task_id: str
    seed: int
    success: bool
    steps: int
    decisions: list[DecisionRecord]
    calls: list[CallRecord]
    overhead_s: float = 0.0
    dm_failures: int = 0
    llm_failures: int = 0
    end: str = ""
    dm_questions: int = 0       # questions put to the decision model
    llm_unanswered: int = 0
    dm_unanswered: int = 0

    @property
    def incomplete(self) -> bool:
        """Whether some call got no answer (then the episode counts as neither success nor failure).
        """
        return bool(self.llm_unanswered or self.dm_unanswered)

    @property
    def cost(self) -> float:
        """USD of every call of the episode (agent LLM and decision model)."""
        return sum(c.usd for c in self.calls)

    @property
    def llm_calls(self) -> int:
        """Number of agent-LLM calls made."""
        return sum(c.kind == "llm" for c in self.calls)

    @property
    def dm_calls(self) -> int:
        """Number of decision-model calls made."""
        return sum(c.kind == "dm" for c in self.calls)

    @property
    def seconds(self) -> float:
        """Simulated / measured model time plus the harness's own measured overhead."""
        return sum(c.seconds for c in self.calls) + self.overhead_s

    def to_dict(self) -> dict[str, Any]:
        """Everything (every decision and call), JSON-ready; ``from_dict`` restores it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Episode":
        """The episode ``to_dict`` wrote (decisions and calls restored as records)."""
        tup = lambda v: None if v is None else tuple(v)  # noqa: E731
        decisions = [DecisionRecord(**{**r, "probs": tup(r.get("probs")),
                                       "answer": tup(r.get("answer"))}) for r in d["decisions"]]
        return cls(**{**d, "decisions": decisions,
                      "calls": [CallRecord(**c) for c in d["calls"]]})

    def summary(self) -> dict[str, Any]:
        """One flat row: task, seed, success, steps, cost, seconds, calls, failures, overhead and
        how it ended (decisions and calls left out)."""
        return {"task_id": self.task_id, "seed": self.seed, "success": self.success,
                "steps": self.steps, "cost": self.cost, "seconds": self.seconds,
                "llm_calls": self.llm_calls, "dm_calls": self.dm_calls,
                "dm_failures": self.dm_failures, "llm_failures": self.llm_failures,
                "overhead_s": self.overhead_s, "end": self.end}


def openai_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A DECISION GYM tool schema as an OpenAI ``tools`` entry (``{"type": "function", "function":
    schema}``)."""
    return {"type": "function", "function": dict(schema)}


class _Step:
    """Mutable bookkeeping of one step (questions, plans, DM answers, records)."""

    def __init__(self):
        self.q: dict[str, MultipleChoice] = {}
        self.dm: dict[str, ChoiceResult] = {}
        self.plan: dict[str, Plan] = {}
        self.rec: dict[str, DecisionRecord] = {}


class Harness:
    """Runs DECISION GYM tasks with an agent LLM, an optional decision model and delegations.

    ``delegations``: at most one per decision point. ``cheap_llm``: the cheaper tier for
    ``route`` (needed when ``settings.cheap_tier``). ``shadow``: the decision model answers
    every question but does not act (for threshold fitting). ``on_decision`` is called with
    every finished ``DecisionRecord`` (the JSONL writer).
    """

    def __init__(self, llm: AgentLLM, dm: Any = None, delegations: Sequence[Delegation] = (),
                 settings: AgentConfig = BACKEND_COST_ONLY, cheap_llm: AgentLLM | None = None,
                 shadow: bool = False,
                 on_decision: Callable[[DecisionRecord], None] | None = None):
        self.llm, self.dm, self.cheap_llm = llm, dm, cheap_llm
        self.settings = settings
        self.shadow = bool(shadow)
        self.on_decision = on_decision
        self.deleg: dict[str, Delegation] = {}
        for d in delegations:
            if not isinstance(d, Delegation):
                raise TypeError(f"delegations must be Delegation objects, got {type(d).__name__}")
            if d.point in self.deleg:
                raise ValueError(f"two delegations for decision point {d.point!r}")
            self.deleg[d.point] = d
        if (self.deleg or shadow) and dm is None:
            raise ValueError("delegations and shadow mode need a decision model (dm)")
        if settings.cheap_tier and cheap_llm is None:
            raise ValueError("AgentConfig.cheap_tier needs a cheap_llm")
        if "next_action" in self.deleg:
            raise ValueError("decision point 'next_action' belongs to envs without tools "
                             "(ALFWorld / WebShop: jaxdm.harness.textenv); DECISION GYM has tools")
        for point, flag in (("memory", "memory"), ("reflect", "reflection"),
                            ("route", "cheap_tier"), ("notes", "read_back")):
            if point in self.deleg and not getattr(settings, flag):
                raise ValueError(f"a delegation for {point!r} needs its optional step: set "
                                 f"AgentConfig.{flag}=True")

    # ---- decision model --------------------------------------------------------------------
    def _ask_dm(self, questions: Sequence[MultipleChoice], step: int, ep: Episode,
                alone: bool = False) -> list[ChoiceResult | None]:
        """One batched model call; failed answers are None (counted). When the batch call
        raises, each question is asked alone once (``alone``), so one question the model
        cannot take (say, more options than its labels) does not fail its neighbours. Failed
        answers whose request failed (the backend's ``stats["failures"]``, e.g. ``Remote``:
        connection errors, timeouts, HTTP errors, malformed bodies) are ``unanswered``."""
        if not questions:
            return []
        if not alone:
            ep.dm_questions += len(questions)
        t0 = time.perf_counter()
        lost = _RequestFailures(self.dm)
        try:
            results = list(self.dm.choose(list(questions)))
            if len(results) != len(questions):
                raise ValueError(f"decision model returned {len(results)} answers for "
                                 f"{len(questions)} questions")
        except Exception as e:  # noqa: BLE001 - any model/adapter failure: the LLM decides
            if len(questions) > 1:
                ep.calls.append(CallRecord("dm", getattr(self.dm, "name", "dm"), step,
                                           usd=self.settings.dm_price_per_call,
                                           seconds=self.settings.dm_latency_s
                                           + time.perf_counter() - t0, ok=False,
                                           error=f"{type(e).__name__}: {e}"))
                out = [self._ask_dm([q], step, ep, alone=True)[0] for q in questions]
                self._last_dm_share = (self.settings.dm_price_per_call,
                                       self.settings.dm_latency_s)
                return out
            ep.dm_failures += len(questions)
            ep.calls.append(CallRecord("dm", getattr(self.dm, "name", "dm"), step,
                                       usd=self.settings.dm_price_per_call,
                                       seconds=self.settings.dm_latency_s
                                       + time.perf_counter() - t0, ok=False,
                                       error=f"{type(e).__name__}: {e}"))
            return [None] * len(questions)
        usd = self.settings.dm_price_per_call + sum((r.cost.usd or 0.0) for r in results
                                                    if r is not None)
        secs = self.settings.dm_latency_s + sum(r.cost.seconds for r in results if r is not None)
        out: list[ChoiceResult | None] = []
        reasons = []
        for q, r in zip(questions, results):
            if r is None or not r.ok or r.probs is None or len(r.probs) != len(q.options):
                ep.dm_failures += 1
                out.append(None)
                reasons.append(getattr(r, "error", None) or "no usable distribution")
            else:
                out.append(r)
        # the call went through; what failed were answers (counted above): their first reason
        unanswered = min(len(reasons), lost.since())
        ep.dm_unanswered += unanswered
        ep.calls.append(CallRecord("dm", getattr(self.dm, "name", "dm"), step, usd=usd,
                                   seconds=secs, error=(f"{len(reasons)} of {len(questions)} "
                                                        f"answers failed: {reasons[0]}"
                                                        if reasons else None),
                                   unanswered=unanswered))
        self._last_dm_share = (usd / len(questions), secs / len(questions))
        return out

    # ---- LLM -------------------------------------------------------------------------------
    def _ask_llm(self, req: LLMRequest, tier: str, step: int, ep: Episode) -> LLMReply | None:
        llm = self.cheap_llm if tier == "cheap" else self.llm
        for attempt in range(self.settings.max_llm_retries + 1):
            r = llm.act(dataclasses.replace(req, call_id=f"{req.call_id}/{attempt}"))
            unanswered = int(not r.ok and getattr(r, "unanswered", False))
            ep.calls.append(CallRecord("llm", getattr(llm, "name", tier), step, r.tokens_in,
                                       r.tokens_out, r.usd, r.seconds, r.ok, r.error,
                                       unanswered))
            if r.ok:
                return r
            ep.llm_failures += 1
            ep.llm_unanswered += unanswered
        return None

    # ---- one episode -----------------------------------------------------------------------
    def run_task(self, env: Any, seed: int, params: Any) -> Episode:
        """Runs one task (``seed``, ``params``) to its end in this process, its env transitions
        on ``env`` itself (``play_locally`` over ``episode``); returns the Episode."""
        return play_locally(self.episode(env, seed, params), env, params)

    def for_episode(self) -> "Harness":
        """A copy of this harness for one more episode played at the same time (an env pool's
        slots, ``jaxdm.harness.pool``): the LLMs, the decision model, the delegations and the
        settings are shared; the per-episode scratch an episode keeps on its harness is not."""
        return copy.copy(self)

    def episode(self, env: Any, seed: int, params: Any) -> EpisodeSteps:
        """One DECISION GYM task (``seed``, ``params``: ``GymParams``) to its end or
        ``max_steps`` as a generator of its env transitions (``EpisodeSteps``): each step asks
        the decision points, lets the delegated ones go to the decision model and the rest to
        the agent LLM, and acts; returns the Episode with every decision and call. ``env``
        answers the pure questions about a state (answer keys); whoever drives the generator
        runs the transitions (``play_locally``, or an env pool's workers)."""
        t_start = time.perf_counter()
        model_time = 0.0
        self._extra: list[DecisionRecord] = []
        self._last_dm_share = (0.0, 0.0)
        seed = int(seed) + self.settings.task_offset
        obs, state = yield ("reset", seed)
        shift = params.variant == SHIFT or state.task.variant == SHIFT
        ep = Episode(state.task.task_id, int(seed), False, 0, [], [])
        notes: list[str] = []
        pending_notes: list[str] = []       # picked by the LLM: enter its next prompt
        last_info: dict[str, Any] | None = None
        last_tool: str | None = None
        last_obs = obs
        reflected_pending = False
        done = False
        s = self.settings
        while not done:
            st = _Step()
            ctx = render_context(state)
            key = env.answer_key(state)
            t = state.t
            # ---- the questions of this step ----------------------------------------------
            if s.memory and last_info is not None:
                info_step = bool(last_info["milestone"]) and last_tool in READ_TOOLS
                st.q["memory"] = hq.memory_question(ctx, answer=[hq.RUN if info_step else 1])
            if s.reflection and last_info is not None:
                failed = not last_info["milestone"]
                st.q["reflect"] = hq.reflect_question(ctx, answer=[hq.RUN if failed else 1])
            if s.read_back and notes:
                st.q["notes"] = hq.notes_question(ctx, notes,
                                                  answer=self._notes_key(notes, key))
            if s.cheap_tier:
                easy = key is not None and set(key.tools) <= EASY_TOOLS
                st.q["route"] = hq.route_question(
                    ctx, answer=None if key is None else [hq.RUN if easy else 1])
            st.q["stop"] = self._with_point(
                stop_question(state, params, ctx) if key is not None else
                hq.stop_question(ctx), "stop")
            st.q["tool"] = self._with_point(
                tool_question(state, params, ctx, require_key=False), "tool")
            # the key both simulated parties read to couple their errors (harness.coupling)
            st.q = {p: self._with_decision_key(q, decision_key(ep.task_id, t, p))
                    for p, q in st.q.items()}
            # ---- the decision model's first batch -----------------------------------------
            asked = [p for p in st.q if self.shadow or p in self.deleg]
            t_dm = time.perf_counter()
            answers = self._ask_dm([st.q[p] for p in asked], t, ep) if asked else []
            model_time += time.perf_counter() - t_dm
            dm_share = getattr(self, "_last_dm_share", (0.0, 0.0)) if asked else (0.0, 0.0)
            for p, r in zip(asked, answers):
                st.dm[p] = r
            for p, q in st.q.items():
                st.plan[p] = self._plan(p, q, st.dm.get(p), ep)
                st.rec[p] = self._record(ep, t, p, q, st.dm.get(p), dm_share)
            # ---- resolve loop control ---------------------------------------------------------
            held: list[tuple[str, HeldQuestion]] = []
            tier = "main"
            if "route" in st.q:
                pl = st.plan["route"]
                if pl.who == "dm":
                    tier = "cheap" if pl.choice == hq.RUN else "main"
                    self._decide(st.rec["route"], "dm", pl.choice)
                else:  # the LLM does not route itself: the main LLM keeps the step
                    self._decide(st.rec["route"], "llm", 1, llm_choice=1)
            prompt_notes = list(pending_notes)
            pending_notes = []
            reflect_now = reflected_pending
            reflected_pending = False
            for p in ("memory", "reflect", "notes"):
                if p not in st.q:
                    continue
                pl = st.plan[p]
                if pl.who == "dm":
                    self._decide(st.rec[p], "dm", pl.choice)
                    self._apply_loop(p, pl.choice, st.q[p], notes, prompt_notes, last_obs)
                    if p == "reflect" and pl.choice == hq.RUN:
                        reflect_now = True
                else:
                    held.append((p, HeldQuestion(p, st.q[p], pl.allowed)))
            # ---- stop and tool --------------------------------------------------------------
            tool_opts = st.q["tool"].meta["tools"]
            finish_name = gym_tools.TOOL_BY_NAME["finish"].display_name(shift)
            finish_idx = tool_opts.index(finish_name)
            forced_tool: str | None = None
            tool_allowed: tuple[int, ...] | None = None
            stop_pl = st.plan["stop"]
            if stop_pl.who == "dm":
                self._decide(st.rec["stop"], "dm", stop_pl.choice)
                if stop_pl.choice == 0:
                    forced_tool = finish_name
                    self._decide(st.rec["tool"], "implied", finish_idx)
                else:
                    tool_allowed = tuple(j for j in range(len(tool_opts)) if j != finish_idx)
            tool_pl = st.plan["tool"]
            if forced_tool is None:
                if tool_pl.who == "dm":
                    if tool_pl.choice == finish_idx and stop_pl.who == "dm":
                        tool_pl = Plan("llm")  # the model said "continue" but chose finish
                    else:
                        forced_tool = tool_opts[tool_pl.choice]
                        self._decide(st.rec["tool"], "dm", tool_pl.choice)
                        if stop_pl.who != "dm":
                            stop_choice = 0 if tool_pl.choice == finish_idx else 1
                            self._decide(st.rec["stop"], "implied", stop_choice)
                if tool_pl.who == "llm" and tool_pl.allowed is not None:
                    both = tuple(j for j in tool_pl.allowed
                                 if tool_allowed is None or j in tool_allowed)
                    tool_allowed = both or tool_pl.allowed
            # parameters after a tool the model chose (before any LLM call)
            pq: list[MultipleChoice] = []
            p_plans: list[Plan] = []
            p_recs: list[DecisionRecord] = []
            fixed: dict[str, Any] = {}
            if forced_tool is not None:
                pq, p_plans, p_recs = self._params(ep, state, params, forced_tool, ctx, key,
                                                   shift, None)
                for q, pl, rec in zip(pq, p_plans, p_recs):
                    if pl.who == "dm":
                        _set_arg(fixed, q, pl.choice)
                        self._decide(rec, "dm", pl.choice)
                    else:
                        held.append(("params", HeldQuestion("params", q, pl.allowed)))
            # ---- the LLM call, if the LLM holds anything ------------------------------------
            needs_tool_call = forced_tool is None
            reply: LLMReply | None = None
            prompt = self._prompt(state, render_context, notes_in=prompt_notes,
                                  reflect=reflect_now)
            hidden = {"env": env, "state": state, "params": params, "shift": shift,
                      "reflected": reflect_now, "decision_step": (ep.task_id, t)}
            if needs_tool_call or held:
                if needs_tool_call:
                    tools = self._tool_schemas(tool_opts, tool_allowed, shift, gym_tools)
                else:  # the model chose the tool; the LLM, called anyway, writes the rest
                    tools = self._tool_schemas(tool_opts, [tool_opts.index(forced_tool)],
                                               shift, gym_tools)
                req = LLMRequest(prompt=prompt, tools=tools,
                                 forced_tool=None if needs_tool_call else forced_tool,
                                 fixed_args=fixed, questions=tuple(h for _, h in held),
                                 reflect=reflect_now, call_id=f"{ep.task_id}/{t}/a",
                                 hidden=hidden)
                t_llm = time.perf_counter()
                reply = self._ask_llm(req, tier, t, ep)
                model_time += time.perf_counter() - t_llm
            # the LLM's answers to held loop questions
            for (p, h), a in zip(held, reply.answers if reply else [None] * len(held)):
                if p == "params":
                    continue
                choice = a if a is not None else h.options_allowed()[-1]  # "don't run"
                self._decide(st.rec[p], "llm" if a is not None else "llm_failed", choice,
                             llm_choice=a)
                if p == "notes" and choice is not None:
                    picked = h.question.options[choice]
                    if picked != hq.NO_NOTE:
                        pending_notes.append(picked)
                elif p == "reflect" and choice == hq.RUN:
                    reflect_now = True
                elif p == "memory":
                    self._apply_loop(p, choice, h.question, notes, prompt_notes, last_obs)
            # ---- the tool call ---------------------------------------------------------------
            if needs_tool_call:
                if reply is None or reply.tool is None:
                    # the LLM failed for good: the model's answer if it has one, else stop
                    dm_tool = st.dm.get("tool")
                    if dm_tool is None:
                        ep.end = "llm_failed"
                        break
                    choice = max(range(len(dm_tool.probs)), key=lambda j: dm_tool.probs[j])
                    tool_name, args = tool_opts[choice], {}
                    self._decide(st.rec["tool"], "dm_fallback", choice)
                else:
                    tool_name, args = reply.tool, dict(reply.args)
                    tidx = tool_opts.index(tool_name) if tool_name in tool_opts else None
                    self._decide(st.rec["tool"], "llm", tidx, llm_choice=tidx)
                    if stop_pl.who != "dm":
                        self._decide(st.rec["stop"], "llm", 0 if tidx == finish_idx else 1,
                                     llm_choice=0 if tidx == finish_idx else 1)
            else:
                tool_name = forced_tool
                args = dict(fixed)
                if reply is not None and reply.tool == forced_tool:
                    args = {**reply.args, **fixed}  # the LLM's arguments, model values first
                if reply is not None:
                    for (p, h), a in zip(held, reply.answers):
                        if p == "params":
                            rec = next(r for q, r in zip(pq, p_recs) if q is h.question)
                            choice = a if a is not None else h.options_allowed()[0]
                            self._decide(rec, "llm" if a is not None else "llm_failed", choice,
                                         llm_choice=a)
                            _set_arg(args, h.question, choice)
            # ---- second round: GUARD returns, TRIGGER self-checks, params after an LLM tool --
            tool_canon = gym_tools.tool_named(tool_name, shift)
            if needs_tool_call and reply is not None and reply.tool is not None:
                args, tool_name = self._after_llm_tool(
                    ep, st, state, params, ctx, key, shift, tool_name, args, tool_opts,
                    finish_idx, prompt, hidden, tier, gym_tools, render_context)
                tool_canon = gym_tools.tool_named(tool_name, shift)
            # required arguments nobody decided: copied from the context
            if tool_canon is not None:
                for k, v in fill_args(tool_canon, ctx).items():
                    args.setdefault(k, v)
                args = {k: v for k, v in args.items() if tool_canon.param(k) is not None}
            action = format_action(tool_name, args)
            obs, state, reward, done, info = yield ("step", seed, state, action)
            last_info, last_tool, last_obs = info, (tool_canon.name if tool_canon else None), obs
            for rec in st.rec.values():
                self._finish(rec)
            for rec in self._extra:
                self._finish(rec)
            ep.decisions.extend(st.rec.values())
            ep.decisions.extend(self._extra)
            self._extra = []
        ep.success = bool(state.won)
        ep.steps = state.t
        if not ep.end:
            ep.end = ("won" if state.won else "irreversible_error" if state.irreversible_error
                      else "truncated" if state.truncated else "finished")
        for rec in ep.decisions:
            rec.outcome = ep.success
            if self.on_decision is not None:
                self.on_decision(rec)
        ep.overhead_s = max(0.0, time.perf_counter() - t_start - model_time)
        return ep

    # ---- pieces ----------------------------------------------------------------------------
    @staticmethod
    def _with_point(q: MultipleChoice, point: str) -> MultipleChoice:
        if isinstance(q.meta, dict):  # a fresh question of the gym's builders: tag in place
            q.meta["point"] = point   # (re-validating 69 options would cost ~0.2 ms)
            return q
        return dataclasses.replace(q, meta={**q.meta, "point": point})

    @staticmethod
    def _with_decision_key(q: MultipleChoice, key: str) -> MultipleChoice:
        if isinstance(q.meta, dict):  # fresh from the builders, as in _with_point
            q.meta["decision_key"] = key
            return q
        return dataclasses.replace(q, meta={**q.meta, "decision_key": key})

    @staticmethod
    def _notes_key(notes: Sequence[str], key: Any) -> list[int]:
        if key is None:
            return [len(notes)]
        wanted = {str(v) for name, ps in key.calls for _, vs in ps for v in vs if v is not None}
        hits = [i for i, n in enumerate(notes) if any(w in n for w in wanted)]
        return hits or [len(notes)]

    def _plan(self, point: str, q: MultipleChoice, r: ChoiceResult | None, ep: Episode) -> Plan:
        d = self.deleg.get(point)
        if d is None or self.shadow:
            return Plan("llm")
        if r is None:
            return Plan("llm")
        return plan_before(d, r.probs, q.options)

    def _record(self, ep: Episode, t: int, point: str, q: MultipleChoice,
                r: ChoiceResult | None, share: tuple[float, float], param: str | None = None
                ) -> DecisionRecord:
        d = self.deleg.get(point)
        mode = "shadow" if self.shadow else (d.name if d else "llm")
        rec = DecisionRecord(ep.task_id, t, point, mode, "llm", None, len(q.options),
                             answer=tuple(q.meta["answer"]) if "answer" in q.meta else None,
                             param=param)
        if (self.shadow or d is not None):
            rec.cost_usd, rec.latency_s = share
            if r is not None:
                rec.dm_choice = max(range(len(r.probs)), key=lambda j: r.probs[j])
                rec.confidence = float(r.probs[rec.dm_choice])
                rec.probs = tuple(float(x) for x in r.probs)
            elif d is not None and not self.shadow:
                rec.who = "llm_fallback"
        return rec

    @staticmethod
    def _decide(rec: DecisionRecord, who: str, choice: int | None,
                llm_choice: int | None = None) -> None:
        if rec.who == "llm_fallback" and who in ("llm", "llm_failed"):
            who = "llm_fallback"
        rec.who, rec.choice = who, choice
        if llm_choice is not None:
            rec.llm_choice = llm_choice

    @staticmethod
    def _finish(rec: DecisionRecord) -> None:
        if rec.choice is None and rec.llm_choice is not None:
            rec.choice = rec.llm_choice

    def _apply_loop(self, point: str, choice: int | None, q: MultipleChoice, notes: list[str],
                    prompt_notes: list[str], last_obs: str) -> None:
        if choice is None:
            return
        if point == "memory" and choice == hq.RUN:
            notes.append(last_obs[:self.settings.note_chars].replace("\n", " "))
        elif point == "notes" and q.options[choice] != hq.NO_NOTE:
            prompt_notes.append(q.options[choice])

    def _prompt(self, state: Any, render_context: Callable, *, notes_in: Sequence[str],
                reflect: bool) -> str:
        w = self.settings.window
        shown = state if w is None else dataclasses.replace(state, history=state.history[-w:])
        text = render_context(shown)
        if notes_in:
            text += "\nNotes read back:\n" + "\n".join(notes_in)
        return text

    @staticmethod
    def _tool_schemas(tool_opts: Sequence[str], allowed: Sequence[int] | None, shift: bool,
                      gym_tools: Any) -> tuple[dict, ...]:
        idx = range(len(tool_opts)) if allowed is None else allowed
        out = []
        for j in idx:
            k = (tool_opts[j], shift)
            schema = _SCHEMAS.get(k)
            if schema is None:  # built once per tool and variant (read-only afterwards)
                schema = _SCHEMAS[k] = openai_tool(
                    gym_tools.tool_named(tool_opts[j], shift).json_schema(shift))
            out.append(schema)
        return tuple(out)

    def _params(self, ep: Episode, state: Any, params: Any, tool_name: str, ctx: str, key: Any,
                shift: bool, llm_args: Mapping[str, Any] | None
                ) -> tuple[list[MultipleChoice], list[Plan], list[DecisionRecord]]:
        """Parameter questions of a keyed tool, the model's plans for them and their records."""
        tool = gym_tools.tool_named(tool_name, shift)
        if key is None or tool is None or not key.accepts_tool(tool.name):
            return [], [], []
        qs = [self._with_decision_key(self._with_point(q, "params"), decision_key(
                  ep.task_id, state.t, "params", q.meta["param"]))
              for q in param_questions(state, params, tool.name, ctx)]
        if not qs:
            return [], [], []
        use_dm = self.shadow or "params" in self.deleg
        answers = self._ask_dm(qs, state.t, ep) if use_dm else [None] * len(qs)
        share = getattr(self, "_last_dm_share", (0.0, 0.0)) if use_dm else (0.0, 0.0)
        plans, recs = [], []
        for q, r in zip(qs, answers):
            plans.append(self._plan("params", q, r, ep))
            recs.append(self._record(ep, state.t, "params", q, r, share,
                                     param=q.meta["param"]))
        self._extra = list(self._extra) + recs
        return qs, plans, recs

    def _after_llm_tool(self, ep, st, state, params, ctx, key, shift, tool_name, args,
                        tool_opts, finish_idx, prompt, hidden, tier, gym_tools, render_context):
        """After the LLM's tool call: GUARD / TRIGGER on tool and stop, then the parameter
        questions of its tool (model plans applied to its values), one re-ask call if needed."""
        tidx = tool_opts.index(tool_name) if tool_name in tool_opts else None
        re_tool: Plan | None = None
        for p in ("tool", "stop"):
            d, r = self.deleg.get(p), st.dm.get(p)
            if d is None or r is None or self.shadow or tidx is None:
                continue
            proposal = tidx if p == "tool" else (0 if tidx == finish_idx else 1)
            after = plan_after(d, r.probs, proposal, st.q[p].options)
            if after is None:
                continue
            if p == "tool":
                re_tool = after
            elif after.allowed is not None:  # stop returned: flip finish / continue
                if proposal == 0:
                    re_tool = Plan("llm", allowed=tuple(j for j in range(len(tool_opts))
                                                        if j != finish_idx))
                else:
                    tool_name, args = tool_opts[finish_idx], {}
                    self._decide(st.rec["stop"], "dm", 0)
                    self._decide(st.rec["tool"], "implied", finish_idx)
                    return args, tool_name
        if re_tool is not None:
            tools = self._tool_schemas(tool_opts, re_tool.allowed, shift, gym_tools)
            req = LLMRequest(prompt=prompt, tools=tools, reflect=re_tool.reflect,
                             call_id=f"{ep.task_id}/{state.t}/g",
                             hidden={**hidden, "reflected": hidden["reflected"]
                                     or re_tool.reflect})
            reply = self._ask_llm(req, tier, state.t, ep)
            if reply is not None and reply.tool is not None:
                tool_name, args = reply.tool, dict(reply.args)
                tidx = tool_opts.index(tool_name) if tool_name in tool_opts else None
                self._decide(st.rec["tool"], "llm_after_" + self.deleg["tool"].mode
                             if "tool" in self.deleg else "llm", tidx, llm_choice=tidx)
                if "stop" in st.rec and st.plan["stop"].who != "dm":
                    self._decide(st.rec["stop"], st.rec["stop"].who,
                                 0 if tidx == finish_idx else 1)
        # parameters of the LLM's tool
        qs, plans, recs = self._params(ep, state, params, tool_name, ctx, key, shift, args)
        re_ask: list[tuple[MultipleChoice, DecisionRecord, Plan]] = []
        for q, pl, rec in zip(qs, plans, recs):
            name = q.meta["param"]
            value = args.get(name)
            prop = _option_of(q, value)
            rec.llm_choice = prop
            d, r = self.deleg.get("params"), None
            if pl.who == "dm":
                _set_arg(args, q, pl.choice)
                self._decide(rec, "dm", pl.choice, llm_choice=prop)
                continue
            self._decide(rec, rec.who if rec.who == "llm_fallback" else "llm", prop,
                         llm_choice=prop)
            if d is None or self.shadow or rec.dm_choice is None or prop is None:
                continue
            probs = rec.probs
            if pl.allowed is not None and prop not in pl.allowed:  # ASSIST: outside shortlist
                re_ask.append((q, rec, pl))
                continue
            after = plan_after(d, probs, prop, q.options)
            if after is not None:
                re_ask.append((q, rec, after))
        if re_ask:
            held = tuple(HeldQuestion("params", q, pl.allowed) for q, _, pl in re_ask)
            req = LLMRequest(prompt=prompt, fixed_args={}, questions=held,
                             reflect=any(pl.reflect for _, _, pl in re_ask),
                             call_id=f"{ep.task_id}/{state.t}/p", hidden=hidden)
            reply = self._ask_llm(req, tier, state.t, ep)
            for (q, rec, pl), a in zip(re_ask, reply.answers if reply else [None] * len(held)):
                if a is not None:
                    _set_arg(args, q, a)
                    self._decide(rec, "llm_after_" + self.deleg["params"].mode, a)
        return args, tool_name


class _RequestFailures:
    """How many requests a decision model's backend has failed since this was made: its
    ``stats["failures"]`` counter (``jaxdm.decision.Remote``), looked up through wrappers
    (``PointsOnly.dm``); 0 for a backend without one (nothing it does is a lost request)."""

    def __init__(self, dm: Any):
        self.stats = None
        for _ in range(4):
            stats = getattr(dm, "stats", None)
            if isinstance(stats, dict) and isinstance(stats.get("failures"), int):
                self.stats = stats
                break
            dm = getattr(dm, "dm", None)
            if dm is None:
                break
        self.start = self.stats["failures"] if self.stats is not None else 0

    def since(self) -> int:
        return 0 if self.stats is None else max(0, int(self.stats["failures"]) - self.start)


def play_locally(steps: EpisodeSteps, env: Any, params: Any) -> "Episode":
    """Drive an episode generator (``Harness.episode``) with ``env``'s own ``reset`` / ``step``
    under ``params`` in this process; returns its Episode."""
    try:
        request = next(steps)
        while True:
            if request[0] == "reset":
                result = env.reset(request[1], params)
            else:
                _, key, state, action = request
                result = env.step(key, state, action, params)
            request = steps.send(result)
    except StopIteration as stop:
        return stop.value


def _set_arg(args: dict[str, Any], q: MultipleChoice, index: int) -> None:
    """Set the parameter a parameter question is about to option ``index`` ("(omit)" removes
    it)."""
    value = option_value(q, index)
    if value is None:
        args.pop(q.meta["param"], None)
    else:
        args[q.meta["param"]] = value


def _option_of(q: MultipleChoice, value: Any) -> int | None:
    if value is None:
        return q.options.index(OMIT) if OMIT in q.options else None
    for j, o in enumerate(q.options):
        if normalize(o) == normalize(value):
            return j
    return None


__all__ = ["AgentConfig", "BACKEND_COST_ONLY", "DecisionRecord", "CallRecord", "Episode", "Harness",
           "EpisodeSteps", "play_locally", "openai_tool", "READ_TOOLS", "EASY_TOOLS"]
