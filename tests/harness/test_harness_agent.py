"""The agent loop: decision-model failures fall back to the LLM (counted), LLM retries, shadow
records, JSONL rows, the BM25 shortlist and the random trigger."""
from __future__ import annotations

import dataclasses
import json

from jaxdm.decision.types import choice_failed
from jaxdm.envs.decision_gym import DecisionGym, GymParams
from jaxdm.harness import BACKEND_COST_ONLY, Delegation, Harness, NoisyOracle, SimulatedLLM
from jaxdm.harness.dm import BM25Shortlist, RandomTrigger
from jaxdm.harness.llm import STRONG, LLMProfile
from jaxdm.roles.harness import memory_question
from tests.decision.dm_fixtures import RaisingBackend

GYM, PARAMS = DecisionGym(), GymParams(split="test")


class Failing:
    name = "failing"

    def choose(self, questions):
        return [choice_failed("unparseable") for _ in questions]


def test_decision_model_failures_fall_back_to_the_llm():
    alone = [Harness(SimulatedLLM(STRONG, 0)).run_task(GYM, i, PARAMS) for i in range(3)]
    for dm in (RaisingBackend("raising", RuntimeError("model server down")), Failing()):
        h = Harness(SimulatedLLM(STRONG, 0), dm, [Delegation("tool", "replace"),
                                                  Delegation("params", "cascade", 0.5)])
        eps = [h.run_task(GYM, i, PARAMS) for i in range(3)]
        # the agent runs exactly as the LLM alone would, and every failure is counted
        assert [e.success for e in eps] == [e.success for e in alone]
        assert [e.steps for e in eps] == [e.steps for e in alone]
        tool = [r for e in eps for r in e.decisions if r.point == "tool"]
        assert {r.who for r in tool} == {"llm_fallback"}
        assert sum(e.dm_failures for e in eps) >= len(tool)
        if isinstance(dm, RaisingBackend):
            assert any(not c.ok and "model server down" in c.error
                       for e in eps for c in e.calls if c.kind == "dm")


def test_llm_failures_are_retried_paid_and_counted():
    flaky = SimulatedLLM(LLMProfile("flaky", fail_rate=0.4), seed=2)
    h = Harness(flaky, settings=dataclasses.replace(BACKEND_COST_ONLY, max_llm_retries=5))
    eps = [h.run_task(GYM, i, PARAMS) for i in range(4)]
    fails = sum(e.llm_failures for e in eps)
    assert fails > 0
    assert sum(1 for e in eps for c in e.calls if c.kind == "llm" and not c.ok) == fails
    assert all(e.end != "llm_failed" for e in eps)


def test_shadow_records_hold_probs_llm_choice_key_and_outcome():
    settings = dataclasses.replace(BACKEND_COST_ONLY, memory=True, reflection=True, read_back=True)
    rows = []
    h = Harness(SimulatedLLM(STRONG, 0), NoisyOracle(seed=4), shadow=True, settings=settings,
                on_decision=lambda r: rows.append(r.to_dict()))
    ep = h.run_task(GYM, 3, PARAMS)
    assert ep.decisions and len(rows) == len(ep.decisions)
    points = {r["point"] for r in rows}
    assert {"tool", "stop", "params", "memory", "reflect"} <= points
    for r in rows:
        assert r["mode"] == "shadow" and r["who"] == "llm"  # the model never acts
        assert len(r["probs"]) == r["n_options"] and abs(sum(r["probs"]) - 1) < 1e-6
        assert r["confidence"] == max(r["probs"])
        assert r["outcome"] == ep.success and r["answer"] is not None
        json.dumps(r)
    # the model's answers did not change the run: same as the LLM alone
    alone = Harness(SimulatedLLM(STRONG, 0), settings=settings).run_task(GYM, 3, PARAMS)
    assert (alone.success, alone.steps) == (ep.success, ep.steps)


def test_non_shadow_rows_leave_out_the_distribution():
    h = Harness(SimulatedLLM(STRONG, 0), NoisyOracle(seed=4), [Delegation("tool", "cascade",
                                                                          0.8)])
    row = h.run_task(GYM, 1, PARAMS).decisions[0].to_dict()
    assert "probs" not in row and {"point", "mode", "who", "confidence", "correct",
                                   "cost_usd", "latency_s"} <= set(row)


def test_bm25_shortlist_and_random_trigger():
    q = memory_question("Customer: my order O-12345 has not arrived", answer=[0])
    (r,) = BM25Shortlist().choose([q])
    assert r.ok and abs(sum(r.probs) - 1) < 1e-9
    rt = RandomTrigger(0.3, seed=0)
    qs = [memory_question(f"context {i}") for i in range(400)]
    rate = sum(res.probs[0] > 0.5 for res in rt.choose(qs)) / 400
    assert 0.22 < rate < 0.38
    h = Harness(SimulatedLLM(STRONG, 0), BM25Shortlist(), [Delegation("tool", "assist")])
    ep = h.run_task(GYM, 0, PARAMS)
    assert {r.who for r in ep.decisions if r.point == "tool"} <= {"llm"}


class NoToolQuestions:
    """A model that cannot take the 69-option tool question (like constrained readout with
    26 labels): a batch containing it raises; alone, the other questions are answered."""

    name = "no-tool"

    def __init__(self):
        self.inner = NoisyOracle(seed=0)

    def choose(self, questions):
        if any(len(q.options) > 26 for q in questions):
            raise ValueError("69 options but only 26 single-letter labels")
        return self.inner.choose(questions)


def test_one_question_the_model_cannot_take_does_not_fail_its_batch():
    h = Harness(SimulatedLLM(STRONG, 0), NoToolQuestions(), shadow=True)
    ep = h.run_task(GYM, 1, PARAMS)
    tool = [r for r in ep.decisions if r.point == "tool"]
    stop = [r for r in ep.decisions if r.point == "stop"]
    assert all(r.confidence is None for r in tool)          # failed, counted, LLM decided
    assert all(r.confidence is not None for r in stop)      # answered alone
    assert ep.dm_failures == len(tool)
    assert any(not c.ok and "26 single-letter" in c.error for c in ep.calls if c.kind == "dm")


def test_simulated_llm_cannot_copy_what_its_window_dropped():
    """A keyed value that only a dropped turn showed is guessed (wrong); with the full
    context, or a note carrying it, it is copied."""
    from jaxdm.envs.decision_gym import ExpertAgent, render_context, tool_schemas
    from jaxdm.harness.agent import openai_tool
    from jaxdm.harness.llm import LLMProfile
    from jaxdm.harness.llm_call import LLMRequest
    llm = SimulatedLLM(LLMProfile("exact", default_accuracy=1.0, accuracy={"params": 1.0,
                                                                            "tool": 1.0}))
    tools = tuple(openai_tool(s) for s in tool_schemas())
    for seed in range(40):
        obs, state = GYM.reset(seed, PARAMS)
        while not state.done:
            key = GYM.answer_key(state)
            writes = [t for t in key.tools if t in ("update_address", "update_email")]
            if writes:
                vals = [str(v) for _, vs in key.params(writes[0]).items() for v in vs
                        if v is not None]
                short = render_context(dataclasses.replace(state, history=state.history[-1:]))
                if any(v not in short for v in vals):
                    break
            obs, state, *_ = GYM.step(seed, state, ExpertAgent().act(GYM, state, PARAMS),
                                      PARAMS)
        else:
            continue
        hidden = {"env": GYM, "state": state, "params": PARAMS}
        full = llm.act(LLMRequest(render_context(state), tools, hidden=hidden, call_id="a"))
        blind = llm.act(LLMRequest(short, tools, hidden=hidden, call_id="a"))
        note = llm.act(LLMRequest(short + "\nNotes read back:\n" + " ".join(vals), tools,
                                  hidden=hidden, call_id="a"))
        assert GYM.answer_key(state).accepts(full.tool, full.args)
        assert GYM.answer_key(state).accepts(note.tool, note.args)
        assert full.tool == blind.tool and not GYM.answer_key(state).accepts(blind.tool,
                                                                             blind.args)
        return
    raise AssertionError("no state with a value outside a one-turn window among 40 tasks")
