"""The agent loop for text envs without tools (ALFWorld, WebShop): one decision point,
``next_action``, the Actor question over the admissible actions (``jaxdm.roles.actor``).

The agent LLM picks every action unless the ``next_action`` delegation hands it to the
decision model (any of the five modes, ``jaxdm.harness.modes``). An env adapter (registry
``ADAPTERS``) gives the goal, the options and the answer key of a state:

- ``alfworld`` (native engine): the admissible commands; key = the expert's next command
  re-planned from the current state (``plan_from``), so every state is keyed;
- ``webshop``: the admissible actions; key = the next action of the expert's plan
  (``expert_actions``) while the agent has followed it, none after a deviation (WebShop has no
  re-planner). The search template ``search[<your query>]`` is filled with the goal's text
  (a value copied from the context, not free text).

The SimulatedLLM and the key-reading NoisyOracle work here too; the SimulatedLLM's wrong
actions are uniform over the other options (these envs have no error taxonomy in the gym's
sense; stated). Records, calls and failure handling are those of ``jaxdm.harness.agent``.
"""
from __future__ import annotations

import time
from typing import Any, Protocol, Sequence

from jaxdm.envs.alfworld import command_table, plan_from
from jaxdm.envs.webshop.agents import expert_actions, goal_query
from jaxdm.envs.webshop.env import SEARCH_PLACEHOLDER
from jaxdm.harness.agent import BACKEND_COST_ONLY, AgentConfig, Episode, EpisodeSteps, Harness
from jaxdm.harness.llm_call import AgentLLM, HeldQuestion, LLMRequest
from jaxdm.harness.modes import Delegation, Plan, plan_after, plan_before
from jaxdm.registry import Registry
from jaxdm.roles.actor import actor_request


class EnvAdapter(Protocol):
    """How ``TextEnvHarness`` reads one text env: the goal, the admissible actions as options, the
    expert's key and the env action of an option; ``data`` is the adapter's per-episode state."""

    name: str

    def start(self, env: Any, state: Any, params: Any) -> dict:
        """The per-episode ``data`` after ``env.reset``."""

    def goal(self, env: Any, state: Any, data: dict) -> str:
        """The task's goal text."""

    def options(self, env: Any, state: Any, params: Any) -> list[str]:
        """The admissible actions in ``state`` (the question's options)."""

    def key(self, env: Any, state: Any, data: dict, options: Sequence[str]) -> str | None:
        """The expert's next option (the answer key), None when it has none."""

    def action(self, option: str, env: Any, state: Any, data: dict) -> str:
        """The env action that ``option`` stands for."""

    def update(self, data: dict, option: str) -> None:
        """Updates ``data`` after ``option`` was taken."""


class AlfWorldAdapter:
    """ALFWorld (native engine): the admissible commands are the options; the key is the planner's
    next command."""

    name = "alfworld"

    def start(self, env, state, params):
        """No per-episode state."""
        return {}

    def goal(self, env, state, data):
        """The game's goal text."""
        return state.game.goal_text

    def options(self, env, state, params):
        """The admissible commands, sorted."""
        return sorted(command_table(state.game, state))

    def key(self, env, state, data, options):
        """The planner's next command when it is admissible, else None."""
        plan = plan_from(state.game, state)
        return plan[0] if plan and plan[0] in options else None

    def action(self, option, env, state, data):
        """The command itself."""
        return option

    def update(self, data, option):
        """Nothing to track."""
        pass


class WebShopAdapter:
    """WebShop: the admissible actions are the options (a search is one placeholder option, filled
    with the goal's query); the key follows the expert's plan while the episode stays on it."""

    name = "webshop"

    def start(self, env, state, params):
        """The goal, its search query, the expert's plan (empty when the target cannot be reached by
        search) and the position on it."""
        goal = env.goal(state)["instruction_text"]
        try:
            plan = expert_actions(env, state, params)
        except ValueError:  # the target is not reachable by search: no key
            plan = []
        return {"goal": goal, "query": goal_query(goal), "plan": plan, "pos": 0,
                "on_plan": bool(plan), "params": params}

    def goal(self, env, state, data):
        """The instruction text."""
        return data["goal"]

    def options(self, env, state, params):
        """The admissible actions in ``state``."""
        return list(env.admissible_actions(state, params))

    def _as_option(self, action: str) -> str:
        return SEARCH_PLACEHOLDER if action.startswith("search[") else action

    def key(self, env, state, data, options):
        """The plan's next action as an option while on the plan, else None."""
        if not data["on_plan"] or data["pos"] >= len(data["plan"]):
            return None
        want = self._as_option(data["plan"][data["pos"]])
        return want if want in options else None

    def action(self, option, env, state, data):
        """The search placeholder as ``search[<goal query>]``, any other option as it is."""
        return f"search[{data['query']}]" if option == SEARCH_PLACEHOLDER else option

    def update(self, data, option):
        """Moves along the plan when ``option`` was its next action, else leaves the plan."""
        if data["on_plan"] and data["pos"] < len(data["plan"]) and \
                option == self._as_option(data["plan"][data["pos"]]):
            data["pos"] += 1
        else:
            data["on_plan"] = False


ADAPTERS: Registry[EnvAdapter] = Registry("text-env adapter")
ADAPTERS.register("alfworld", AlfWorldAdapter())
ADAPTERS.register("webshop", WebShopAdapter())


class TextEnvHarness(Harness):
    """Runs ALFWorld / WebShop episodes (``adapter``: a key of ``ADAPTERS``); only
    ``next_action`` can be delegated."""

    def __init__(self, llm: AgentLLM, dm: Any = None, delegations: Sequence[Delegation] = (),
                 settings: AgentConfig = BACKEND_COST_ONLY, shadow: bool = False,
                 on_decision=None, adapter: str = "alfworld"):
        self.adapter = ADAPTERS.get(adapter, field="adapter")
        bad = [d.point for d in delegations if d.point != "next_action"]
        if bad:
            raise ValueError(f"text envs without tools have one decision point, 'next_action'; "
                             f"got delegations for {bad}")
        super().__init__(llm, dm, (), settings, shadow=shadow, on_decision=on_decision)
        self.deleg = {d.point: d for d in delegations}
        if self.deleg and dm is None:
            raise ValueError("delegations need a decision model (dm)")

    def episode(self, env: Any, seed: int, params: Any) -> EpisodeSteps:
        """One text-env task (``seed``, ``params``) to its end or its step limit, as a generator
        of its env transitions (``jaxdm.harness.agent.EpisodeSteps``; ``run_task`` plays it in
        this process): each step the ``next_action`` question goes to the decision model when
        delegated, else to the agent LLM; returns the Episode."""
        ad = self.adapter
        t_start, model_time = time.perf_counter(), 0.0
        obs, state = yield ("reset", seed)
        data = ad.start(env, state, params)
        goal = ad.goal(env, state, data)
        budget = getattr(params, "max_steps", None) or getattr(params, "budget")
        ep = Episode(f"{ad.name}-{seed}", int(seed), False, 0, [], [])
        self._last_dm_share = (0.0, 0.0)
        history: list[tuple[str, str]] = []
        done, won, t = False, False, 0
        while not done:
            options = ad.options(env, state, params)
            want = ad.key(env, state, data, options)
            key = [options.index(want)] if want is not None else None
            remaining = max(0, budget - t)
            q = actor_request(goal, history, obs, options, remaining,
                              meta={"point": "next_action", "answer": tuple(key or ()),
                                    "oracle_answer": want})
            d = self.deleg.get("next_action")
            r = None
            if d is not None or self.shadow:
                t0 = time.perf_counter()
                (r,) = self._ask_dm([q], t, ep)
                model_time += time.perf_counter() - t0
            rec = self._record(ep, t, "next_action", q, r, self._last_dm_share)
            if key is None:
                rec.answer = None
            pl = plan_before(d, r.probs, q.options) if (d and r is not None and
                                                        not self.shadow) else Plan("llm")
            hidden = {"reflected": False}
            prompt = q.context
            if pl.who == "dm":
                self._decide(rec, "dm", pl.choice)
            else:
                t0 = time.perf_counter()
                reply = self._ask_llm(LLMRequest(prompt, questions=(HeldQuestion(
                    "next_action", q, pl.allowed),), call_id=f"{ep.task_id}/{t}/a",
                    hidden=hidden), "main", t, ep)
                model_time += time.perf_counter() - t0
                a = reply.answers[0] if reply is not None else None
                if a is None:  # the LLM failed: the model's answer if any, else option 0
                    a = (max(range(len(r.probs)), key=lambda j: r.probs[j]) if r is not None
                         else 0)
                    self._decide(rec, "dm_fallback", a)
                else:
                    self._decide(rec, rec.who if rec.who == "llm_fallback" else "llm", a,
                                 llm_choice=a)
                    after = plan_after(d, r.probs, a, q.options) if (
                        d and r is not None and not self.shadow) else None
                    if after is not None:
                        reply = self._ask_llm(LLMRequest(
                            prompt, questions=(HeldQuestion("next_action", q, after.allowed),),
                            reflect=after.reflect, call_id=f"{ep.task_id}/{t}/g",
                            hidden={"reflected": after.reflect}), "main", t, ep)
                        if reply is not None and reply.answers[0] is not None:
                            self._decide(rec, "llm_after_" + d.mode, reply.answers[0])
            ad.update(data, options[rec.choice])
            action = ad.action(options[rec.choice], env, state, data)
            history.append((obs, action))
            obs, state, reward, done, info = yield ("step", seed, state, action)
            won = bool(info.get("won", False))
            t += 1
            ep.decisions.append(rec)
        ep.success, ep.steps = won, t
        ep.end = "won" if won else "done" if done and t < budget else "budget"
        for rec in ep.decisions:
            rec.outcome = ep.success
            if self.on_decision is not None:
                self.on_decision(rec)
        ep.overhead_s = max(0.0, time.perf_counter() - t_start - model_time)
        return ep


__all__ = ["TextEnvHarness", "ADAPTERS", "AlfWorldAdapter", "WebShopAdapter", "EnvAdapter"]
