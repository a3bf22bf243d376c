"""The agent LLMs (each reporting tokens, price, latency and failures per call) and
``make_llm``, which builds one from a config dict.

A call is an ``LLMRequest`` answered by an ``LLMReply`` (``jaxdm.harness.llm_call``).

- ``SimulatedLLM``: scripted from DECISION GYM's answer keys with a set accuracy per decision
  point; its wrong tool choices are drawn from the gym's realistic error kinds
  (``ERROR_KINDS``: near-duplicate tool, acting instead of asking, needless lookup,
  irrelevant tool, premature finish; wrong parameter values); latency and price per call;
  seeded per (task, step, call). It makes every experiment runnable in seconds on CPU.
- ``RemoteLLM``: an OpenAI-compatible chat server with native tool calling (``tools``,
  ``tool_calls``); its HTTP layer is ``jaxdm.decision.remote.Remote``'s (retries, backoff,
  Retry-After, timeouts, API key from an env var only).
- ``LocalLLM`` (``jaxdm.harness.local``): a jaxdm generative model (the KV-cache sampler) with
  the tools rendered in its chat template; the reply's JSON tool call is parsed like a remote
  one.

Tokens of the SimulatedLLM are counted as ceil(characters / 4) (stated, not measured).
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from typing import Any, Mapping, Sequence

from jaxdm.config import Kind, kind_and_options
from jaxdm.decision.remote import Remote, RequestFailed
from jaxdm.envs.decision_gym import (ERROR_KINDS, candidates, expert_args, expert_call,
                                     render_context)
from jaxdm.envs.decision_gym import tools as gym_tools
from jaxdm.harness.coupling import check_correlation, coupled_uniform, decision_key
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.llm_call import (ANSWER_TOOL, LLMReply, LLMRequest, answer_tool_schema,
                                    count_tokens, parse_tool_calls, questions_text, request_text)
from jaxdm.harness.local import LocalLLM
from jaxdm.registry import Registry, UnknownNameError

# ---------------------------------------------------------------------------------------------
# SimulatedLLM


@dataclasses.dataclass(frozen=True)
class LLMProfile:
    """A simulated agent LLM: accuracy per decision point, price and latency per call.

    ``accuracy`` maps decision points to the probability of a keyed answer (missing points use
    ``default_accuracy``); ``reflect_gain`` scales the error rate of the step after a
    reflection (0.5 halves it); ``fail_rate`` is the share of calls that fail (timeouts).
    """

    name: str = "sim-strong"
    accuracy: Mapping[str, float] = dataclasses.field(default_factory=dict)
    default_accuracy: float = 0.95
    price_per_1k_in: float = 0.0003
    price_per_1k_out: float = 0.0025
    latency_s: float = 0.8
    latency_per_1k_out_s: float = 4.0
    fail_rate: float = 0.0
    reflect_gain: float = 0.5

    def __post_init__(self):
        for k, v in {**self.accuracy, "default_accuracy": self.default_accuracy,
                     "fail_rate": self.fail_rate, "reflect_gain": self.reflect_gain}.items():
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"LLMProfile {self.name!r}: {k} must be in [0, 1], got {v!r}")
        for k in ("price_per_1k_in", "price_per_1k_out", "latency_s", "latency_per_1k_out_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"LLMProfile {self.name!r}: {k} must be a finite number >= 0, "
                                 f"got {v!r}")

    def acc(self, point: str) -> float:
        """The probability of a keyed answer at ``point``."""
        return float(self.accuracy.get(point, self.default_accuracy))


# Two profiles for experiments (our numbers, shaped like the seed's Flash / Flash-Lite prices).
STRONG = LLMProfile("sim-strong", {"tool": 0.97, "params": 0.98, "stop": 0.98},
                    default_accuracy=0.95, price_per_1k_in=0.0003, price_per_1k_out=0.0025,
                    latency_s=0.8)
WEAK = LLMProfile("sim-weak", {"tool": 0.86, "params": 0.92, "stop": 0.93},
                  default_accuracy=0.85, price_per_1k_in=0.0001, price_per_1k_out=0.0004,
                  latency_s=0.4)
PROFILES: Registry[LLMProfile] = Registry("llm profile")
PROFILES.register("strong", STRONG)
PROFILES.register("weak", WEAK)


class SimulatedLLM:
    """An agent LLM scripted from DECISION GYM's answer keys (see the module docstring).

    Reads ``request.hidden``: ``env`` (DecisionGym), ``state``, ``params`` and, for each held
    question, the key in ``question.meta["answer"]``. Decisions are seeded by
    (seed, request.call_id) so a rerun reproduces every call. ``correlation`` ρ couples each
    right / wrong draw to the decision's shared latent (``jaxdm.harness.coupling``; the keys:
    ``hidden["decision_step"]`` = (task id, step) for its tool and parameter choices, a held
    question's ``meta["decision_key"]``), so with a ``NoisyOracle`` at the same ρ the two err
    together; at 0 the draws are the independent ones of before.
    """

    def __init__(self, profile: LLMProfile = STRONG, seed: int = 0, correlation: float = 0.0):
        if not isinstance(profile, LLMProfile):
            raise TypeError(f"profile must be an LLMProfile, got {type(profile).__name__}")
        self.profile = profile
        self.seed = int(seed)
        self.correlation = check_correlation(correlation, f"simulated llm {profile.name!r}")
        self.name = profile.name

    # -- answering -------------------------------------------------------------------------
    def _pick(self, rng: random.Random, acc: float, allowed: Sequence[int],
              answer: Sequence[int], preferred: int | None = None,
              key: str | None = None) -> int:
        good = [i for i in allowed if i in answer]
        bad = [i for i in allowed if i not in answer]
        if good and (not bad or self._draw(rng, key) < acc):
            return preferred if preferred in good else good[0]
        return rng.choice(bad) if bad else allowed[0]

    def _draw(self, rng: random.Random, key: str | None) -> float:
        """The next uniform of ``rng``, coupled to decision ``key``'s latent at ρ > 0."""
        return coupled_uniform(rng.random(), key, self.correlation)

    def _step_key(self, req: LLMRequest, point: str, param: str | None = None) -> str | None:
        step = req.hidden.get("decision_step")
        if step is None:
            if self.correlation > 0:
                raise HarnessError(f"simulated llm: correlation {self.correlation} needs "
                                   f"request.hidden['decision_step'] (task id, step), which "
                                   f"call {req.call_id!r} lacks")
            return None
        return decision_key(step[0], step[1], point, param)

    def _tool_call(self, rng: random.Random, req: LLMRequest, acc_tool: float,
                   acc_params: float) -> tuple[str, dict[str, Any]]:
        env, state, params = req.hidden["env"], req.hidden["state"], req.hidden["params"]
        shift = bool(req.hidden.get("shift", False))
        offered = [t["function"]["name"] for t in req.tools]
        canon = {gym_tools.tool_named(n, shift).name: n for n in offered}
        key = env.answer_key(state)
        context = render_context(state)
        tool_key = self._step_key(req, "tool")  # first: a missing step fails every call
        if req.forced_tool is not None:
            tool = gym_tools.tool_named(req.forced_tool, shift).name
        else:
            right = [t for t in (key.tools if key else ()) if t in canon]
            tool = None
            if right and self._draw(rng, tool_key) < acc_tool:
                best, _ = expert_call(state, key, context)
                tool = best if best in right else right[0]
            if tool is None:  # a realistic error, drawn from the gym's error kinds
                tool = self._wrong_tool(rng, key, state, list(canon), ERROR_KINDS, gym_tools)
        if key is not None and key.accepts_tool(tool):
            args = expert_args(state, key, tool, context)
            for p, allowed in key.params(tool).items():
                param = gym_tools.TOOL_BY_NAME[tool].param(p)
                values = [str(v) for v in allowed if v is not None]
                # a value the LLM cannot see in its prompt it cannot copy (the window dropped
                # it and no note brought it back): it guesses among the values it sees
                blind = bool(values) and param.sem != "enum" and \
                    not any(v in req.prompt for v in values)
                if not blind and self._draw(rng, self._step_key(req, "params", p)) < acc_params:
                    continue
                wrong = [v for v in candidates(param, req.prompt if blind else context)
                         if not key.accepts_value(tool, p, v)]
                if wrong:
                    args[p] = rng.choice(wrong)
        else:
            args = fill_args(gym_tools.TOOL_BY_NAME[tool], context)
        args.update(req.fixed_args)
        return canon.get(tool, gym_tools.TOOL_BY_NAME[tool].display_name(shift)), args

    @staticmethod
    def _wrong_tool(rng, key, state, offered: list[str], kinds, gym_tools) -> str:
        expert = key.tools[0] if key else "finish"
        pool: list[str] = []
        kinds = list(kinds)
        rng.shuffle(kinds)
        for kind in kinds:
            if kind == "near_duplicate":
                pool = [t for t in gym_tools.CONFUSIONS.get(expert, ()) if t in offered]
            elif kind == "act_instead_of_ask" and expert == "ask_customer":
                # sorted: a frozenset's order changes with the hash seed (PYTHONHASHSEED)
                pool = [t for t in sorted(gym_tools.WRITE_TOOLS) if t in offered
                        and gym_tools.TOOL_BY_NAME[t].kind == gym_tools.CORE]
            elif kind == "needless_lookup":
                pool = [t for t in ("get_product", "find_customer", "get_order")
                        if t in offered and not (key and key.accepts_tool(t))]
            elif kind == "irrelevant_tool":
                pool = [t for t in offered if gym_tools.TOOL_BY_NAME[t].kind
                        == gym_tools.IRRELEVANT]
            elif kind == "premature_finish" and expert != "finish":
                pool = ["finish"] if "finish" in offered else []
            if pool:
                return rng.choice(pool)
        wrong = [t for t in offered if not (key and key.accepts_tool(t))]
        return rng.choice(wrong) if wrong else offered[0]

    def act(self, req: LLMRequest) -> LLMReply:
        """One simulated call: a timeout with probability ``fail_rate``, else the tool call and one
        answer per held question drawn at the profile's accuracies (seeded by the call id), with
        tokens counted from the request and the reply and the profile's price and latency."""
        t0 = time.perf_counter()
        p = self.profile
        rng = random.Random(f"{self.seed}/{p.name}/{req.call_id}")
        gain = p.reflect_gain if req.hidden.get("reflected") else 1.0
        text_in = request_text(req)
        if rng.random() < p.fail_rate:
            tin = count_tokens(text_in)
            return LLMReply(ok=False, error="timeout (simulated)", tokens_in=tin,
                            usd=tin / 1000 * p.price_per_1k_in, seconds=p.latency_s,
                            model=self.name, unanswered=True)
        answers = []
        for hq in req.questions:
            acc = 1.0 - (1.0 - p.acc(hq.point)) * gain
            answers.append(self._pick(rng, acc, hq.options_allowed(),
                                      hq.question.meta.get("answer", ()),
                                      key=hq.question.meta.get("decision_key")))
        tool, args = None, {}
        if req.wants_tool_call:
            tool, args = self._tool_call(rng, req, 1.0 - (1.0 - p.acc("tool")) * gain,
                                         1.0 - (1.0 - p.acc("params")) * gain)
        text = ""
        if req.reflect:
            text = "Reflection: the last step did not follow the plan; re-check the key facts."
        out = json.dumps({"tool": tool, "args": args, "answers": answers}) + text
        tin, tout = count_tokens(text_in), count_tokens(out)
        usd = tin / 1000 * p.price_per_1k_in + tout / 1000 * p.price_per_1k_out
        seconds = p.latency_s + tout / 1000 * p.latency_per_1k_out_s
        del t0
        return LLMReply(tool=tool, args=args, answers=tuple(answers), text=text, tokens_in=tin,
                        tokens_out=tout, usd=usd, seconds=seconds, model=self.name)


def fill_args(tool: Any, context: str) -> dict[str, Any]:
    """Required arguments of an off-plan DECISION GYM tool as a careless agent writes them:
    the first value of the right type in the context, else a plain default."""
    out: dict[str, Any] = {}
    for p in tool.params:
        if not p.required:
            continue
        cands = candidates(p, context)
        if cands:
            out[p.name] = cands[0]
        elif p.sem in ("number", "integer"):
            out[p.name] = 1
        elif p.sem == "bool":
            out[p.name] = False
        else:
            out[p.name] = "unknown"
    return out


# ---------------------------------------------------------------------------------------------
# RemoteLLM


# ---------------------------------------------------------------------------------------------
# RemoteLLM


class RemoteLLM:
    """An agent LLM on an OpenAI-compatible chat server with native tool calling.

    The HTTP layer (retries with backoff on 429/5xx and connection errors, Retry-After,
    timeout, marking a dead server down, the API key read from ``api_key_env`` at send time)
    is ``jaxdm.decision.remote.Remote``'s, reused through ``Remote.post_json``. Prices per 1k
    tokens turn the server's ``usage`` into USD. Any failure gives ``ok=False`` with the reason;
    a request that got no answer (the transport's failure: connection, timeout, HTTP error,
    malformed body) also ``unanswered=True``.
    """

    SYSTEM = ("You are a customer-service agent for a small shop. Use the tools to resolve the "
              "customer's request following the shop policy. Call exactly one tool per turn.")

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None,
                 price_per_1k_in: float = 0.0, price_per_1k_out: float = 0.0,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.5,
                 max_backoff: float = 30.0, max_tokens: int = 512, name: str | None = None):
        self.transport = Remote(base_url, model, interface="prompted", api_key_env=api_key_env,
                                price_per_1k_in=price_per_1k_in,
                                price_per_1k_out=price_per_1k_out, timeout=timeout,
                                max_retries=max_retries, backoff=backoff,
                                max_backoff=max_backoff, max_tokens=max_tokens)
        self.model = model
        self.price_in = float(price_per_1k_in)
        self.price_out = float(price_per_1k_out)
        self.max_tokens = int(max_tokens)
        self.name = name or f"remote:{model}"

    def __repr__(self) -> str:
        return f"RemoteLLM(model={self.model!r}, transport={self.transport!r})"

    def body(self, req: LLMRequest) -> dict[str, Any]:
        """The chat/completions body for ``req`` (tools native; questions via ANSWER_TOOL)."""
        user = req.prompt
        if req.fixed_args:
            user += "\n\nUse these argument values: " + json.dumps(dict(req.fixed_args),
                                                                   sort_keys=True)
        if req.questions:
            user += ("\n\nAlso call " + ANSWER_TOOL + " to answer:\n"
                     + questions_text(req.questions))
        if req.reflect:
            user += "\n\nFirst reflect briefly on your last step: did it fail or leave the plan?"
        tools = [dict(t) for t in req.tools
                 if req.forced_tool is None or t["function"]["name"] == req.forced_tool]
        if req.forced_tool is not None and not tools:
            raise ValueError(f"forced_tool {req.forced_tool!r} is not among the request's tools")
        if req.questions:
            tools.append(answer_tool_schema(req.questions))
        body: dict[str, Any] = {"model": self.model, "temperature": 0.0,
                                "max_tokens": self.max_tokens,
                                "messages": [{"role": "system", "content": self.SYSTEM},
                                             {"role": "user", "content": user}]}
        if tools:
            body["tools"] = tools
            if req.forced_tool and not req.questions:
                body["tool_choice"] = {"type": "function", "function": {"name": req.forced_tool}}
            elif not req.tools:
                body["tool_choice"] = {"type": "function", "function": {"name": ANSWER_TOOL}}
            else:
                body["tool_choice"] = "required"
        return body

    def act(self, req: LLMRequest) -> LLMReply:
        """One chat/completions request for ``req``; the reply's tool calls as an LLMReply with the
        server's token usage priced; a transport failure is ``ok=False, unanswered=True``."""
        t0 = time.perf_counter()
        try:
            data = self.transport.post_json("/v1/chat/completions", self.body(req))
        except RequestFailed as e:
            return LLMReply(ok=False, error=str(e), seconds=time.perf_counter() - t0,
                            model=self.name, unanswered=True)
        seconds = time.perf_counter() - t0
        usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        usd = tin / 1000 * self.price_in + tout / 1000 * self.price_out
        base = dict(tokens_in=tin, tokens_out=tout, usd=usd, seconds=seconds, model=self.name)
        try:
            msg = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            return LLMReply(ok=False, error="response has no choices[0].message", **base)
        return parse_tool_calls(msg, req, **base)


# ---------------------------------------------------------------------------------------------
# make_llm

def _simulated(opts: dict[str, Any]) -> SimulatedLLM:
    name = opts.pop("profile", "strong")
    try:
        base = PROFILES.get(name, field="llm.profile")
    except UnknownNameError as e:
        raise HarnessError(str(e)) from None
    seed = opts.pop("seed", 0)
    correlation = opts.pop("correlation", 0.0)
    try:
        profile = dataclasses.replace(base, **opts)
        return SimulatedLLM(profile, seed, correlation)
    except (TypeError, ValueError) as e:
        raise HarnessError(f"llm (simulated): {e}") from None


def _remote(opts: dict[str, Any]) -> RemoteLLM:
    for key in ("base_url", "model"):
        if key not in opts:
            raise HarnessError(f"llm kind 'remote' needs {key!r}")
    try:
        return RemoteLLM(**opts)
    except (TypeError, ValueError) as e:
        raise HarnessError(f"llm (remote): {e}") from None


# make_llm's kinds: the spec keys each takes besides "kind", and build(options).
LLM_KINDS: Registry[Kind] = Registry("llm kind")
LLM_KINDS.register("simulated", Kind(frozenset(
    {"profile", "seed", "correlation", "accuracy", "default_accuracy", "price_per_1k_in", "price_per_1k_out",
     "latency_s", "latency_per_1k_out_s", "fail_rate", "reflect_gain", "name"}), _simulated))
LLM_KINDS.register("remote", Kind(frozenset(
    {"base_url", "model", "api_key_env", "price_per_1k_in", "price_per_1k_out", "timeout",
     "max_retries", "backoff", "max_backoff", "max_tokens", "name"}), _remote))
LLM_KINDS.register("local", Kind(frozenset({"path", "dtype", "max_new_tokens", "name"}),
                                 LocalLLM.from_spec))


def make_llm(spec: Mapping[str, Any]):
    """An agent LLM from a dict: {"kind": "simulated", "profile": "strong" | "weak", overrides
    of LLMProfile fields...}, {"kind": "remote", "base_url", "model", "api_key_env", ...} or
    {"kind": "local", "path": "smollm2"} (``LLM_KINDS``). Unknown kinds / keys raise
    ``HarnessError`` naming them."""
    try:
        kind, opts = kind_and_options(spec, LLM_KINDS, "llm")
    except (TypeError, ValueError) as e:
        raise HarnessError(str(e)) from None
    return LLM_KINDS.get(kind).build(opts)

__all__ = ["LLMProfile", "STRONG", "WEAK", "PROFILES", "SimulatedLLM", "RemoteLLM", "fill_args",
           "make_llm", "LLM_KINDS"]
