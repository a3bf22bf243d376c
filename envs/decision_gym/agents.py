"""Scripted agents for DECISION GYM and the episode / state recorder.

- ``ExpertAgent`` follows the answer key (the plan).
- ``NoisyAgent`` follows it too, but with probability ``error_rate`` per step makes one of the
  realistic errors: a near-duplicate tool, acting instead of asking, a wrong parameter value,
  a needless lookup, an irrelevant tool, or finishing early.

``run_episode`` plays one task and returns the ``Trajectory`` plus, for every state the agent
decided in, the decision questions with their keys (AGENT DECISION BENCH L2 data), so the same
run serves L2 (states scored without execution) and L3 (a decision model acting).
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Callable, Protocol

from jaxdm.decision.types import MultipleChoice
from jaxdm.envs.core import step_key
from jaxdm.envs.decision_gym import questions as q_lib
from jaxdm.envs.decision_gym.env import (DecisionGym, GymParams, GymState, format_action,
                                         render_context)
from jaxdm.envs.decision_gym.plan import ORDER_REQUESTS, AnswerKey
from jaxdm.envs.decision_gym.tools import (CONFUSIONS, IRRELEVANT, TOOL_BY_NAME, TOOLS, Tool,
                                           tool_named)
from jaxdm.envs.decision_gym.world import SHIFT
from jaxdm.trajectory import Step, Trajectory

# Which of several acceptable tools an expert picks first (asking, then identity, then data).
_PRIORITY = ("ask_customer", "find_customer", "get_order", "get_product")
_QUESTIONS = {"order_id": "Which order is this about? Could you give me the order number?",
              "item": "Which item of the order do you mean?",
              "new_address": "What is the new shipping address?",
              "new_email": "What is the new email address?",
              "replacement": "Which product would you like instead?",
              "product": "Which product do you mean?",
              "confirm_fee": "This cancellation carries a 10% fee. Shall I cancel anyway?"}
ERROR_KINDS = ("near_duplicate", "act_instead_of_ask", "wrong_parameter", "needless_lookup",
               "irrelevant_tool", "premature_finish")


class Agent(Protocol):
    """A scripted or model agent playing DECISION GYM: a name and act(env, state, params) -> the
    next action as a JSON tool call."""
    name: str

    def act(self, env: DecisionGym, state: GymState, params: GymParams) -> str:
        """The agent's next action in ``state``: a JSON tool call (format_action)."""


def _shift(state: GymState, params: GymParams) -> bool:
    return params.variant == SHIFT or state.task.variant == SHIFT


def _first(values, context: str) -> Any:
    """A deterministic pick from a key's value set: a real value over omission, and one the
    agent can read in the context over one it could only guess (a customer id before lookup)."""
    real = sorted((v for v in values if v is not None),
                  key=lambda v: (not (isinstance(v, str) and v in context), str(v)))
    return real[0] if real else None


def expert_call(state: GymState, key: AnswerKey, context: str | None = None
                ) -> tuple[str, dict[str, Any]]:
    """The expert's (canonical tool, args) for a keyed state."""
    context = render_context(state) if context is None else context
    tools = sorted(key.tools, key=lambda n: (_PRIORITY.index(n) if n in _PRIORITY else 99, n))
    return tools[0], expert_args(state, key, tools[0], context)


def expert_args(state: GymState, key: AnswerKey, tool: str, context: str) -> dict[str, Any]:
    """The plan's arguments for a keyed ``tool`` (canonical name)."""
    args: dict[str, Any] = {}
    for p, values in key.params(tool).items():
        v = _first(values, context)
        if v is not None:
            args[p] = v
    if tool == "ask_customer":
        args["question"] = _QUESTIONS.get(args["about"], "Could you tell me more?")
    elif tool == "cancel_order":
        args["reason"] = "customer request"
    elif tool == "finish":
        args["message"] = "Your request has been handled. Is there anything else?"
    return args


@dataclasses.dataclass
class ExpertAgent:
    """Follows the plan: picks a call from the answer key."""

    name: str = "expert"

    def act(self, env: DecisionGym, state: GymState, params: GymParams) -> str:
        """The next call of the task's correct plan (finish when the plan is done)."""
        key = env.answer_key(state)
        if key is None:
            return format_action(TOOL_BY_NAME["finish"].display_name(_shift(state, params)), {})
        tool, args = expert_call(state, key)
        return format_action(TOOL_BY_NAME[tool].display_name(_shift(state, params)), args)


@dataclasses.dataclass
class NoisyAgent:
    """The expert with realistic errors at rate ``error_rate`` (drawn from ``seed`` per task and
    step, so runs are reproducible). ``kinds`` restricts which errors it makes."""

    error_rate: float = 0.2
    seed: int = 0
    kinds: tuple[str, ...] = ERROR_KINDS
    name: str = "noisy"

    def __post_init__(self):
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {self.error_rate}")
        bad = set(self.kinds) - set(ERROR_KINDS)
        if bad:
            raise ValueError(f"unknown error kind(s) {sorted(bad)}; expected {ERROR_KINDS}")

    def act(self, env: DecisionGym, state: GymState, params: GymParams) -> str:
        """The expert's next call, replaced with error_rate probability by a plausible wrong one of
        the agent's error kinds (ERROR_KINDS), seeded by the agent seed, task and step.
        """
        shift = _shift(state, params)
        key = env.answer_key(state)
        rng = random.Random(f"{self.seed}/{state.task.task_id}/{state.t}")
        if key is None:
            return format_action(TOOL_BY_NAME["finish"].display_name(shift), {})
        tool, args = expert_call(state, key)
        if rng.random() < self.error_rate:
            made = self._error(rng, state, key, tool, args)
            if made is not None:
                tool, args = made
        return format_action(TOOL_BY_NAME[tool].display_name(shift), args)

    def _error(self, rng: random.Random, state: GymState, key: AnswerKey, tool: str,
               args: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        kinds = list(self.kinds)
        rng.shuffle(kinds)
        context = render_context(state)
        for kind in kinds:
            if kind == "near_duplicate" and CONFUSIONS.get(tool):
                alt = TOOL_BY_NAME[rng.choice(CONFUSIONS[tool])]
                return alt.name, _fill(rng, alt, args, context)
            if kind == "act_instead_of_ask" and tool == "ask_customer":
                made = _act_without_asking(rng, state, context)
                if made is not None:
                    return made
            if kind == "wrong_parameter":
                for p, values in key.params(tool).items():
                    param = TOOL_BY_NAME[tool].param(p)
                    wrong = [v for v in q_lib.candidates(param, context)
                             if not key.accepts_value(tool, p, v)]
                    if wrong:
                        return tool, dict(args, **{p: rng.choice(wrong)})
            if kind == "needless_lookup":
                pid = rng.choice(state.task.products).product_id
                return "get_product", {"product_id": pid}
            if kind == "irrelevant_tool":
                t = rng.choice([t for t in TOOLS if t.kind == IRRELEVANT])
                return t.name, _fill(rng, t, {}, context)
            if kind == "premature_finish" and tool != "finish":
                return "finish", {"message": "Done."}
        return None


_PHONE = re.compile(r"\+1-555-\d{4}")
_CUSTOMER_LINE = re.compile(r"^Customer: (.+)$", re.MULTILINE)
_TIME_LINE = re.compile(r"^Current time: (\d{4}-\d{2}-\d{2})", re.MULTILINE)


def _fill(rng: random.Random, tool: Tool, args: dict[str, Any], context: str,
          first: bool = False) -> dict[str, Any]:
    """Arguments for a tool off the plan, as a careless agent would write them: the intended
    values where names match, else a value of the right type from the context (a random one,
    or the ``first``), the customer's words for free text."""
    out: dict[str, Any] = {}
    for p in tool.params:
        if p.name in args:
            out[p.name] = args[p.name]
        elif p.required:
            cands = q_lib.candidates(p, context)
            if not cands and p.name == "phone":
                cands = _PHONE.findall(context)
            said = _CUSTOMER_LINE.search(context)
            today = _TIME_LINE.search(context)
            if cands:
                out[p.name] = cands[0] if first else rng.choice(cands)
            elif p.sem in ("number", "integer"):
                out[p.name] = 10
            elif p.sem == "date":
                out[p.name] = today.group(1) if today else "2026-06-01"
            elif p.sem == "text" and said:
                out[p.name] = "Customer says: " + said.group(1)
            else:
                out[p.name] = "Portland"
    return out


def _act_without_asking(rng: random.Random, state: GymState, context: str
                        ) -> tuple[str, dict[str, Any]] | None:
    """The classic failure: do the request's data change with a guessed value."""
    task = state.task
    orders = [o.order_id for o in state.orders if o.customer_id == task.customer_id]
    guess = rng.choice(orders)
    r = task.request
    if r in ("cancel_order", "split_shipment"):
        return "cancel_order", {"order_id": guess, "reason": "customer request"}
    if r == "change_address":
        return "update_address", {"order_id": guess, "address": task.requester.address}
    if r in ("return_item", "exchange"):
        o = state.order(guess)
        return "create_return", {"order_id": guess, "item_id": o.items[0].product_id,
                                 "resolution": "refund"}
    if r == "update_email":
        return "update_email", {"customer_id": task.customer_id,
                                "email": task.requester.email}
    if r in ORDER_REQUESTS:
        return "get_order", {"order_id": guess}
    return None


@dataclasses.dataclass
class DecisionModelAgent:
    """AGENT DECISION BENCH L3: a decision model makes every tool choice of a running agent.

    The model answers the tool question (69 shuffled tools) of each state. Parameters come
    from ``params_from``: ``"expert"`` (the paper's L3: the LLM writes parameters; here the
    plan's values when the chosen tool is keyed) or ``"model"`` (the model also answers each
    parameter question). Arguments the key does not constrain, and arguments of tools outside
    the key, are filled by a fixed heuristic: the first value of the right type in the context.
    If the model fails to answer, the expert decides (the harness runs as before); such
    fallbacks are counted in ``fallbacks``.
    """

    model: Any  # jaxdm.decision.DecisionModel
    params_from: str = "expert"
    name: str = "decision_model"
    fallbacks: int = 0

    def __post_init__(self):
        if self.params_from not in ("expert", "model"):
            raise ValueError(f"params_from must be 'expert' or 'model', got {self.params_from!r}")
        if not callable(getattr(self.model, "choose", None)):
            raise TypeError(f"model {self.model!r} has no choose(questions) method")

    def act(self, env: DecisionGym, state: GymState, params: GymParams) -> str:
        """The tool the decision model chooses for the state's tool question (the expert's when its
        answer failed, counted as a fallback), with arguments from the expert or the model
        (params_from)."""
        shift = _shift(state, params)
        context = render_context(state)
        question = q_lib.tool_question(state, params, context, require_key=False)
        (result,) = self.model.choose([question])
        if not result.ok or result.choice is None:
            self.fallbacks += 1
            return ExpertAgent().act(env, state, params)
        tool = tool_named(question.meta["tools"][result.choice], shift)
        key = env.answer_key(state)
        args: dict[str, Any] = {}
        if key is not None and key.accepts_tool(tool.name):
            args = expert_args(state, key, tool.name, context)
            if self.params_from == "model":
                qs = q_lib.param_questions(state, params, tool.name, context)
                for q, r in zip(qs, self.model.choose(qs) if qs else []):
                    if r.ok and r.choice is not None:
                        value = q_lib.option_value(q, r.choice)
                        if value is None:
                            args.pop(q.meta["param"], None)
                        else:
                            args[q.meta["param"]] = value
        else:
            args = _fill(random.Random(0), tool, {}, context, first=True)
        return format_action(tool.display_name(shift), args)


@dataclasses.dataclass(frozen=True)
class RecordedState:
    """One decision state of an episode: its questions (with keys in meta) and what was done."""

    task_id: str
    step: int
    after_error: bool  # an off-plan action happened earlier in the episode
    questions: tuple[MultipleChoice, ...]
    action: str
    expert_action: str

    def to_dict(self) -> dict[str, Any]:
        """The state as a JSON record: task, step, whether an error came before, the questions with
        their answer keys, the action taken and the expert's."""
        qs = self.questions
        return {
            "task_id": self.task_id, "step": self.step, "after_error": self.after_error,
            "must_ask": bool(qs and qs[0].meta.get("must_ask")),
            "context": qs[0].context if qs else "",
            "questions": [{"kind": q.meta["kind"], "question": q.question,
                           "options": list(q.options), "answer": list(q.meta["answer"]),
                           **({"option_names": list(q.option_names)}
                              if q.option_names is not None else {}),
                           **{k: q.meta[k] for k in ("tool", "param") if k in q.meta}}
                          for q in qs],
            "action": self.action, "expert_action": self.expert_action,
        }


def run_episode(env: DecisionGym, agent: Agent, seed: int, params: GymParams | None = None,
                record: bool = True,
                on_state: Callable[[GymState], None] | None = None
                ) -> tuple[Trajectory, list[RecordedState]]:
    """Play task ``seed`` with ``agent``; returns the trajectory and the recorded states (the
    questions of every still-solvable state the agent acted in, keys in their meta)."""
    params = env.default_params if params is None else params
    obs, state = env.reset(seed, params)
    steps: list[Step] = []
    records: list[RecordedState] = []
    after_error = False
    expert = ExpertAgent()
    done = False
    while not done:
        if on_state is not None:
            on_state(state)
        action = agent.act(env, state, params)
        key = env.answer_key(state)
        if record and key is not None:
            records.append(RecordedState(
                state.task.task_id, state.t, after_error,
                tuple(q_lib.state_questions(state, params)), action,
                expert.act(env, state, params)))
        obs_next, state_next, _, done, info = env.step(step_key(seed, len(steps)), state,
                                                       action, params)
        if not info["milestone"]:
            after_error = True
        steps.append(Step(observation=obs, action=action, valid=info["valid"],
                          annotations={"milestone": info["milestone"], "no_op": info["no_op"],
                                       "irreversible_error": info["irreversible_error"]}))
        obs, state = obs_next, state_next
    traj = Trajectory(
        goal=state.task.message, steps=tuple(steps), final_observation=obs,
        reward=1.0 if state.won else 0.0, success=state.won, budget=params.max_steps,
        task_type=state.task.request, env="decision_gym", truncated=state.truncated,
        error=state.irreversible_error,
        metadata={"task_id": state.task.task_id, "seed": state.task.seed,
                  "variant": state.task.variant, "strict": params.strict, "agent": agent.name})
    return traj, records
