"""The agent loop for text envs without tools (ALFWorld's native engine): one decision point,
``next_action``, the Actor question over the admissible commands (``jaxdm.roles.actor``).

The agent LLM picks every action unless the ``next_action`` delegation hands it to the
decision model (any of the five modes, ``jaxdm.harness.modes``). The answer key of a state is
the expert's next command (``plan_from``: the plan from the current state), so the
SimulatedLLM and the key-reading NoisyOracle work here too; the SimulatedLLM's wrong actions
are uniform over the other admissible commands (ALFWorld has no error taxonomy in the gym's
sense; stated). Records, calls and failure handling are those of ``jaxdm.harness.agent``.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from jaxdm.harness.agent import AgentSettings, CallRecord, DecisionRecord, Episode, Harness
from jaxdm.harness.llm import AgentLLM, HeldQuestion, LLMRequest
from jaxdm.harness.modes import Delegation, Plan, plan_after, plan_before
from jaxdm.roles.actor import actor_request


class TextEnvHarness(Harness):
    """Runs ALFWorld (native engine) episodes; only ``next_action`` can be delegated."""

    def __init__(self, llm: AgentLLM, dm: Any = None, delegations: Sequence[Delegation] = (),
                 settings: AgentSettings = AgentSettings(), shadow: bool = False,
                 on_decision=None):
        bad = [d.point for d in delegations if d.point != "next_action"]
        if bad:
            raise ValueError(f"text envs without tools have one decision point, 'next_action'; "
                             f"got delegations for {bad}")
        super().__init__(llm, dm, (), settings, shadow=shadow, on_decision=on_decision)
        self.deleg = {d.point: d for d in delegations}
        if self.deleg and dm is None:
            raise ValueError("delegations need a decision model (dm)")

    def run_task(self, env: Any, seed: int, params: Any) -> Episode:
        from jaxdm.envs.alfworld import command_table, plan_from
        t_start, model_time = time.perf_counter(), 0.0
        obs, state = env.reset(seed, params)
        game = state.game
        goal = game.goal_text
        ep = Episode(f"alfworld-{seed}", int(seed), False, 0, [], [])
        self._last_dm_share = (0.0, 0.0)
        history: list[tuple[str, str]] = []
        done, won, t = False, False, 0
        while not done:
            options = sorted(command_table(game, state))
            plan = plan_from(game, state)
            key = [options.index(plan[0])] if plan and plan[0] in options else None
            remaining = params.max_steps - t
            q = actor_request(goal, history, obs, options, remaining,
                              meta={"point": "next_action", "answer": tuple(key or ()),
                                    "oracle_answer": plan[0] if key else None})
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
                if a is None:  # the LLM failed: the model's answer if any, else "look"
                    a = (max(range(len(r.probs)), key=lambda j: r.probs[j]) if r is not None
                         else options.index("look") if "look" in options else 0)
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
            action = options[rec.choice]
            history.append((obs, action))
            obs, state, reward, done, info = env.step(seed, state, action, params)
            won = bool(info.get("won", False))
            t += 1
            ep.decisions.append(rec)
        ep.success, ep.steps = won, t
        ep.end = "won" if won else "budget"
        for rec in ep.decisions:
            rec.outcome = ep.success
            if self.on_decision is not None:
                self.on_decision(rec)
        ep.overhead_s = max(0.0, time.perf_counter() - t_start - model_time)
        return ep


__all__ = ["TextEnvHarness"]
